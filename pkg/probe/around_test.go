package probe

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// touchMapped maps path and reads one byte of n random pages (each a
// fault that reads around its page), then unmaps and closes it.
func touchMapped(t *testing.T, path string, n int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(m)
	touchPages(m, n)
}

// touched keeps the loads of touchPages from being optimised away.
var touched byte

// touchPages reads one byte of n random pages of m.
func touchPages(m []byte, n int) {
	pages := len(m) / PageSize
	for range n {
		touched += m[rand.IntN(pages)*PageSize]
	}
}

// aroundEvents returns the read-around events the collector holds.
func (c *collector) aroundEvents() []ReadaheadEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []ReadaheadEvent
	for _, e := range c.ras {
		if e.ReadAround {
			out = append(out, e)
		}
	}
	return out
}

// A watched file's mmap read-arounds are reported with the reader, the
// file and its open file's window, only while that window is above the
// one watched for, at most one per 10 ms, and not once unwatched.
func TestProbeReportsReadAroundOfWatchedFiles(t *testing.T) {
	needRoot(t, "loads BPF programs and creates a loop device")
	if !hasTracepoint(ProgPageCacheRaOrder) {
		t.Skipf("this kernel has no %s tracepoint (Linux 6.10 or later)", ProgPageCacheRaOrder)
	}
	l := newLab(t, 256)
	path, key := l.writeFile(t, "index", mb(64))
	other, _ := l.writeFile(t, "other", mb(64))
	ra := run(t, "blockdev", "--getra", l.Loop) // 512-byte sectors
	t.Logf("%s: read_ahead %s sectors", l.Loop, ra)

	p, c := startProbe(t, Config{Devices: []Dev{l.Dev}, Poll: 50 * time.Millisecond})
	require.True(t, p.around, "the read-around program must be attached on a kernel with its tracepoint")

	// Not watched: nothing, however much is read around.
	dropCaches(t)
	touchMapped(t, path, 200)
	require.NoError(t, p.Flush(t.Context()))
	assert.Empty(t, c.aroundEvents(), "a file nobody watches is not reported")

	// Watched below the device's window: reported.
	require.NoError(t, p.WatchReadAround(key, 16))
	dropCaches(t)
	start := time.Now()
	touchMapped(t, path, 200)
	touchMapped(t, other, 200)
	took := time.Since(start)
	require.NoError(t, p.Flush(t.Context()))
	evs := c.aroundEvents()
	require.NotEmpty(t, evs, "read-arounds of a watched file with a window above the trim")
	for _, e := range evs {
		assert.Equal(t, key, e.File, "only the watched file")
		assert.Equal(t, uint32(os.Getpid()), e.Tgid, "the faulting process")
		assert.Equal(t, l.Dev, e.Device)
		assert.Greater(t, e.RaPages, uint32(16*1024/PageSize), "the open file's window, above the trim")
		assert.False(t, e.Async)
	}
	// One per file per 10 ms at most (racy across CPUs: a little slack).
	maxEvents := int(took/(10*time.Millisecond)) + 3
	assert.LessOrEqual(t, len(evs), maxEvents, "reports are bounded per file (%d faults over %v)", 200, took)
	t.Logf("%d read-around events over %v of faults", len(evs), took.Round(time.Millisecond))

	// Watched at the device's window: an open file with that window is
	// what the caller asked for, so nothing is reported.
	devKB := int(evs[0].RaPages) * PageSize / 1024
	require.NoError(t, p.WatchReadAround(key, devKB))
	n := len(evs)
	dropCaches(t)
	touchMapped(t, path, 200)
	require.NoError(t, p.Flush(t.Context()))
	assert.Len(t, c.aroundEvents(), n, "no report for an open file already at the watched window")

	// An open file given the trim's window itself (FADV_NORMAL copies the
	// device's read_ahead_kb) is not reported either.
	require.NoError(t, p.WatchReadAround(key, 16))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	setRA := func(kb int) {
		require.NoError(t, os.WriteFile("/sys/block/"+filepath.Base(l.Loop)+"/queue/read_ahead_kb", []byte(strconv.Itoa(kb)), 0))
	}
	setRA(16)
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_NORMAL))
	setRA(devKB)
	m, err := unix.Mmap(int(f.Fd()), 0, int(mb(64)), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	dropCaches(t)
	touchPages(m, 200)
	require.NoError(t, unix.Munmap(m))
	require.NoError(t, p.Flush(t.Context()))
	assert.Len(t, c.aroundEvents(), n, "a descriptor already trimmed is not reported")

	// Unwatched: nothing more; unwatching again is no error.
	require.NoError(t, p.UnwatchReadAround(key))
	require.NoError(t, p.UnwatchReadAround(key))
	dropCaches(t)
	touchMapped(t, path, 200)
	require.NoError(t, p.Flush(t.Context()))
	assert.Len(t, c.aroundEvents(), n, "an unwatched file is not reported")
	p.stop(t)

	st, err := p.Stats()
	require.NoError(t, err)
	assert.Contains(t, st.Programs, ProgPageCacheRaOrder, "its run-time statistics are read with the others'")
}
