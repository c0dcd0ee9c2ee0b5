package lab_test

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/test/lab"
)

// directReader issues single O_DIRECT reads of one file (one request to
// the device each, no page cache), opened and with its buffer ready
// beforehand so that a read is issued when asked.
type directReader struct {
	f   *os.File
	buf []byte
}

func newDirectReader(t *testing.T, path string, n int) *directReader {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	require.NoError(t, err)
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(buf); f.Close() })
	return &directReader{f, buf}
}

func (d *directReader) read(t *testing.T, off int64) {
	_, err := d.f.ReadAt(d.buf, off)
	assert.NoError(t, err)
}

// within reports whether device byte off lies in one of path's extents.
func within(exts []lab.Extent, off uint64) bool {
	for _, e := range exts {
		if off >= e.Physical && off < e.Physical+e.Length {
			return true
		}
	}
	return false
}

// The matrix's device model against labfs's own request log (ground
// truth): a slowed file's requests carry the extra latency and another
// file's do not; a fast read issued just after a slow one completes first
// (transfers queue in the order reads become ready, not in arrival order);
// the whole-device slowdown slows every file. Root; about 5 s.
func TestLabModelGroundTruth(t *testing.T) {
	l := lab.New(t, lab.Options{SizeBytes: 256 << 20, RequestLog: true})
	slow, err := l.WriteFile("slow.dat", 16)
	require.NoError(t, err)
	fast, err := l.WriteFile("fast.dat", 16)
	require.NoError(t, err)
	se, err := lab.Extents(slow)
	require.NoError(t, err)
	fe, err := lab.Extents(fast)
	require.NoError(t, err)
	const extra = 20 * time.Millisecond
	setup, err := l.RequestLog() // mkfs's and the writes' reads
	require.NoError(t, err)
	require.NoError(t, l.SetPermanent(extra, slow))

	// A slow read (+20 ms), and about 1 ms later a fast one, ten times. labfs's
	// log says when each arrived and how long it took: a fast read that
	// arrived while the slow one was still in its extra latency must
	// finish first and take far less than that latency. A channel booked
	// at arrival would make it wait the slow read's 20 ms, every time.
	sr, fr := newDirectReader(t, slow, 128<<10), newDirectReader(t, fast, 128<<10)
	for i := 0; i < 10; i++ {
		off := int64(i) << 20
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); sr.read(t, off) }()
		time.Sleep(time.Millisecond)
		fr.read(t, off)
		wg.Wait()
	}
	reqs, err := l.RequestLog()
	require.NoError(t, err)
	reqs = reqs[len(setup):]
	// The log is in completion order: find for each fast read the slow
	// one that arrived last before it.
	slowBefore := func(t time.Duration) *lab.Request {
		var best *lab.Request
		for i, r := range reqs {
			if within(se, r.Off) && r.Start <= t && (best == nil || r.Start > best.Start) {
				best = &reqs[i]
			}
		}
		return best
	}
	var nSlow, nFast, overlapped, firsts int
	for _, r := range reqs {
		switch {
		case within(se, r.Off):
			nSlow++
			assert.Equal(t, extra, r.Extra, "slowed file's request at %d", r.Off)
			assert.Contains(t, r.Why, "p")
			assert.GreaterOrEqual(t, r.Latency, extra)
		case within(fe, r.Off):
			nFast++
			assert.Zero(t, r.Extra, "unslowed file's request at %d carries extra latency", r.Off)
			lastSlow := slowBefore(r.Start)
			if lastSlow == nil || r.Start > lastSlow.Start+extra-2*time.Millisecond {
				continue // not issued during the slow read's latency
			}
			overlapped++
			if r.Start+r.Latency < lastSlow.Start+lastSlow.Latency && r.Latency < extra/2 {
				firsts++
			}
		}
	}
	require.Positive(t, nSlow, "no request of the slowed file in labfs's log")
	require.Positive(t, nFast, "no request of the other file in labfs's log")
	require.GreaterOrEqual(t, overlapped, 5, "fewer than 5 of 10 fast reads arrived during a slow read's latency: the host is too busy to tell")
	// A busy host delays a labfs thread now and then: two thirds, where a
	// channel booked at arrival would give none.
	assert.GreaterOrEqual(t, 3*firsts, 2*overlapped, "of %d fast reads issued behind a slow one, only %d finished first and quickly", overlapped, firsts)
	t.Logf("%d fast reads issued during a slow read's %v: %d finished first", overlapped, extra, firsts)

	// The whole device slowed: both files' requests carry it (the
	// slowed file's on top of its own).
	require.NoError(t, l.Clear())
	const dev = 2 * time.Millisecond
	require.NoError(t, l.SetDevice(dev))
	reqs, err = l.RequestLog()
	require.NoError(t, err)
	before := len(reqs)
	sr.read(t, 12<<20)
	fr.read(t, 12<<20)
	reqs, err = l.RequestLog()
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, r := range reqs[before:] {
		if within(se, r.Off) || within(fe, r.Off) {
			assert.Equal(t, dev, r.Extra, "request at %d under the whole-device slowdown", r.Off)
			assert.Contains(t, r.Why, "d")
			assert.GreaterOrEqual(t, r.Latency, dev)
			seen[map[bool]string{true: "slow", false: "fast"}[within(se, r.Off)]] = true
		}
	}
	assert.True(t, seen["slow"] && seen["fast"], "both files read under the whole-device slowdown: %v", seen)
	st, err := l.Stats()
	require.NoError(t, err)
	assert.Positive(t, st.HitsDevice)
	assert.Equal(t, float64(dev/time.Microsecond), st.DeviceExtraUS)

	// Cleared, nothing is added.
	require.NoError(t, l.Clear("device"))
	before = len(reqs)
	fr.read(t, 13<<20)
	reqs, err = l.RequestLog()
	require.NoError(t, err)
	for _, r := range reqs[before:] {
		assert.Zero(t, r.Extra, "request at %d after clear", r.Off)
	}
	truth, err := l.GroundTruth()
	require.NoError(t, err)
	var evs []string
	for _, e := range truth {
		evs = append(evs, e.Event)
	}
	assert.Contains(t, evs, "device", "the whole-device slowdown in the ground truth")
}
