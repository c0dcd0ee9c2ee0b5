package probe

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestFirstReadaheadOfAFileWakesTheReader: a file's first readahead (a
// read from its head) reaches the handler at once, not at the next poll:
// the daemon pins a prior on a fresh open from that event. The poll is set
// to 3 s here, so an event that waited for it would arrive seconds late.
func TestFirstReadaheadOfAFileWakesTheReader(t *testing.T) {
	needRoot(t, "loads BPF programs and creates a loop device")
	l := newLab(t, 64)
	var paths []string
	var keys []FileKey
	for _, n := range []string{"a", "b", "c"} {
		p, k := l.writeFile(t, n, mb(4))
		paths, keys = append(paths, p), append(keys, k)
	}
	for _, p := range paths {
		evict(t, p)
	}

	p, err := Load(Config{Devices: []Dev{l.Dev}, Poll: 3 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	var (
		mu      sync.Mutex
		arrived = map[FileKey]time.Duration{} // first head event: CLOCK_MONOTONIC at the handler
		emitted = map[FileKey]time.Duration{} // and the kernel's time of it
	)
	h := HandlerFuncs{Readahead: func(e ReadaheadEvent) {
		if e.Async || e.Index != 0 {
			return
		}
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		mu.Lock()
		defer mu.Unlock()
		if _, ok := arrived[e.File]; !ok {
			arrived[e.File], emitted[e.File] = time.Duration(ts.Nano()), e.Time
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, h) }()
	t.Cleanup(func() { cancel(); <-done })
	time.Sleep(100 * time.Millisecond) // Run is waiting on its poll

	// One file at a time, 20 ms apart (more than the wake-up gap).
	buf := make([]byte, 64<<10)
	for _, path := range paths {
		f, err := os.Open(path)
		require.NoError(t, err)
		_, err = f.Read(buf)
		require.NoError(t, err)
		f.Close()
		time.Sleep(20 * time.Millisecond)
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(arrived) == len(keys)
	}, time.Second, 5*time.Millisecond, "head readahead events of every file within a second, the poll being 3 s")
	mu.Lock()
	defer mu.Unlock()
	for i, k := range keys {
		lag := arrived[k] - emitted[k]
		t.Logf("%s: first readahead event handled %v after the kernel emitted it", paths[i], lag)
		assert.Less(t, lag, 50*time.Millisecond, "delivered at once, not at the poll")
	}
}

// TestRunEndsAtOnceOnCancelAndClose: Run sleeps in the runtime's poller
// between polls; a cancelled context or a Close ends that sleep at once,
// not at the poll's end (3 s here), and a Run after Close says so.
func TestRunEndsAtOnceOnCancelAndClose(t *testing.T) {
	needRoot(t, "loads BPF programs")
	l := newLab(t, 16)
	for _, end := range []string{"cancel", "close"} {
		t.Run(end, func(t *testing.T) {
			p, err := Load(Config{Devices: []Dev{l.Dev}, Poll: 3 * time.Second, PollerWait: true})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, p.Close()) })
			require.NotNil(t, p.wake, "the ring buffer should be waited on in the runtime's poller")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx, HandlerFuncs{}) }()
			time.Sleep(200 * time.Millisecond) // Run is asleep in its poll
			start := time.Now()
			if end == "cancel" {
				cancel()
			} else {
				require.NoError(t, p.Close())
			}
			select {
			case err := <-done:
				took := time.Since(start)
				t.Logf("Run returned %v after %s", err, took)
				assert.Less(t, took, 500*time.Millisecond)
				if end == "cancel" {
					assert.NoError(t, err)
				} else {
					assert.ErrorIs(t, err, ErrClosed)
					assert.ErrorIs(t, p.Run(context.Background(), HandlerFuncs{}), ErrClosed)
				}
			case <-time.After(2 * time.Second):
				t.Fatalf("Run did not return within 2 s of %s (poll 3 s)", end)
			}
		})
	}
}

// TestFlushDeliversWhatTheKernelSubmitted: with a poll of 3 s, the records
// of reads done now reach the handler when Flush returns, not at the next
// poll: the daemon collects the records only when an evaluation is due.
func TestFlushDeliversWhatTheKernelSubmitted(t *testing.T) {
	needRoot(t, "loads BPF programs and creates a loop device")
	l := newLab(t, 64)
	path, key := l.writeFile(t, "f", mb(8))
	evict(t, path)
	p, err := Load(Config{Devices: []Dev{l.Dev}, Poll: 3 * time.Second, PollerWait: true})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	var mu sync.Mutex
	var bytes uint64
	h := HandlerFuncs{Record: func(r Record) {
		if r.File == key {
			mu.Lock()
			bytes += uint64(r.Bytes)
			mu.Unlock()
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, h) }()
	t.Cleanup(func() { cancel(); <-done })
	time.Sleep(200 * time.Millisecond) // Run is asleep in its poll

	// A read from the middle of the file: no head readahead wakes Run.
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 1<<20)
	_, err = f.ReadAt(buf, 4<<20)
	require.NoError(t, err)
	start := time.Now()
	fctx, fcancel := context.WithTimeout(context.Background(), time.Second)
	defer fcancel()
	require.NoError(t, p.Flush(fctx))
	took := time.Since(start)
	mu.Lock()
	got := bytes
	mu.Unlock()
	t.Logf("flush returned after %v with %d bytes of the file's records delivered", took, got)
	assert.GreaterOrEqual(t, got, uint64(1<<20), "the read's records are delivered when Flush returns")
	assert.Less(t, took, 500*time.Millisecond, "at once, not at the poll")
}
