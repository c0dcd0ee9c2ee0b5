// Package clock gives readaheadd one time base: CLOCK_MONOTONIC, the clock
// the kernel stamps BPF events with (bpf_ktime_get_ns), so that record
// timestamps and the daemon's own timers can be compared directly.
package clock

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Clock reports the current CLOCK_MONOTONIC time since boot.
type Clock interface {
	Now() time.Duration
}

// Monotonic reads CLOCK_MONOTONIC.
type Monotonic struct{}

// Now implements Clock.
func (Monotonic) Now() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC cannot fail on Linux; keep the zero time if it ever does.
		return 0
	}
	return time.Duration(ts.Nano())
}

// Fake is a manually advanced clock for tests.
type Fake struct {
	mu  sync.Mutex
	now time.Duration
}

// NewFake returns a Fake clock that starts at start.
func NewFake(start time.Duration) *Fake { return &Fake{now: start} }

// Now implements Clock.
func (f *Fake) Now() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the clock forward by d.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now += d
	f.mu.Unlock()
}

// Set moves the clock to t.
func (f *Fake) Set(t time.Duration) {
	f.mu.Lock()
	f.now = t
	f.mu.Unlock()
}
