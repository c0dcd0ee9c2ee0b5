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
