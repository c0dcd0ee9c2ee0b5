package probe

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ringWaiter waits for the ring buffer's wake-ups in the Go runtime's
// network poller instead of in a blocking epoll_wait.
//
// Why: a thread blocked in a system call for the whole poll interval has its
// processor retaken by the runtime's monitor thread, which then polls at its
// fastest (every 20 µs, backing off to 10 ms) until it is idle again. Once per
// poll that cost about 700 wake-ups a second, most of the daemon's CPU and of
// its cost to a device at 300k IOPS. A wait in the network poller blocks no
// thread: the daemon sleeps between polls.
type ringWaiter struct {
	f      *os.File
	rc     syscall.RawConn
	closed atomic.Bool
}

// newRingWaiter registers a duplicate of the ring buffer's descriptor with
// the runtime's poller.
func newRingWaiter(ringFD int) (*ringWaiter, error) {
	fd, err := unix.FcntlInt(uintptr(ringFD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicate the ring buffer's descriptor: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("make the ring buffer's descriptor non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(fd), "bpf-ringbuf")
	// A descriptor the poller did not take has no deadlines.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("the runtime cannot poll the ring buffer: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("the ring buffer's descriptor: %w", err)
	}
	return &ringWaiter{f: f, rc: rc}, nil
}

// wait returns at the kernel's next wake-up of the ring's readers (a record
// submitted with a forced wake-up), at one pending since the last wait, at
// an interrupt, when pending reports a flush asked for, or at deadline,
// whichever comes first. It reads nothing: the caller drains the
// ring. It returns os.ErrClosed once close was called.
func (w *ringWaiter) wait(deadline time.Time, pending func() bool) error {
	if err := w.f.SetReadDeadline(deadline); err != nil {
		if w.closed.Load() {
			return os.ErrClosed
		}
		return fmt.Errorf("wait for the BPF ring buffer: %w", err)
	}
	// A flush asked for before the deadline was set interrupted nothing:
	// it is seen here (one asked for after it interrupts the wait).
	if pending != nil && pending() {
		return nil
	}
	woken := false
	// RawConn.Read calls the function, and while it returns false waits for
	// the descriptor to be readable: the first call only starts the wait.
	err := w.rc.Read(func(uintptr) bool {
		if woken {
			return true
		}
		woken = true
		return false
	})
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	if w.closed.Load() {
		// The runtime reports a descriptor closed under a wait as its own
		// error, not os.ErrClosed.
		return os.ErrClosed
	}
	return fmt.Errorf("wait for the BPF ring buffer: %w", err)
}

// interrupt makes a wait in progress return now.
func (w *ringWaiter) interrupt() { w.f.SetReadDeadline(time.Now()) }

func (w *ringWaiter) close() error {
	w.closed.Store(true)
	return w.f.Close()
}
