package tuner

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
)

// streams adds to fakeFiles the part of the kernel a lowering is about:
// each file's stream window (f_ra.size) only grows with its ra_pages,
// unless ra_pages went through 0 (a break, which the reader here always
// outruns at once), after which it starts afresh at the new ra_pages.
type streams struct {
	*fakeFiles
	size   map[probe.FileKey]int // KB
	broken map[probe.FileKey]bool
	// dropped: the window ahead of an idle reader was dropped from the
	// page cache; the next read misses and starts afresh at ra_pages.
	dropped map[probe.FileKey]bool
	noDrop  bool // DONTNEED drops nothing (pages mapped)
	// idle: the readers do not move (a break waits for them until
	// IdleHold); onBreak runs at each poll of a break.
	idle    bool
	onBreak func()
}

func (s *streams) Dup(ref actuate.FileRef) (actuate.Handle, error) {
	h, err := s.fakeFiles.Dup(ref)
	if err != nil {
		return nil, err
	}
	return &streamHandle{s: s, ref: ref, h: h}, nil
}

func (s *streams) Own(fds []int) (map[int]actuate.RAState, error) {
	out := map[int]actuate.RAState{}
	for _, refs := range s.fds {
		for _, r := range refs {
			for _, fd := range fds {
				if r.FD == fd {
					st := actuate.RAState{ID: r.Key.Ino, RAPages: uint32(s.window[r.Key] / 4), Size: uint32(s.sizeOf(r.Key) / 4), PrevPos: 1 << 40}
					if s.idle {
						st.PrevPos = 0
					}
					if st.RAPages == 0 && s.onBreak != nil {
						s.onBreak()
					}
					out[fd] = st
				}
			}
		}
	}
	return out, nil
}

func (s *streams) WatchOpens([]probe.Dev) (func() []actuate.OpenFile, error) {
	return func() []actuate.OpenFile { return nil }, nil
}

func (s *streams) sizeOf(k probe.FileKey) int {
	if _, ok := s.size[k]; !ok {
		s.size[k] = s.window[k]
	}
	return s.size[k]
}

type streamHandle struct {
	s   *streams
	ref actuate.FileRef
	h   actuate.Handle
}

func (h *streamHandle) FD() int { return h.ref.FD }

func (h *streamHandle) CachedBytes(_, n int64) (int64, error) {
	if h.s.dropped[h.ref.Key] {
		return 0, nil
	}
	return n, nil
}

func (h *streamHandle) ReadPage(int64) (int, error) {
	k := h.ref.Key
	if w := h.s.window[k]; h.s.dropped[k] && w > 0 {
		h.s.size[k], h.s.broken[k], h.s.dropped[k] = min(w, 16), false, false
	}
	return 4096, nil
}

func (h *streamHandle) Close() error { return h.h.Close() }
func (h *streamHandle) Fadvise(off, n int64, a actuate.Advice) error {
	k := h.ref.Key
	if a == actuate.AdviceDontNeed {
		h.s.dropped[k] = !h.s.noDrop
		return nil
	}
	size := h.s.sizeOf(k)
	if err := h.h.Fadvise(off, n, a); err != nil {
		return err
	}
	w := h.s.window[k]
	switch {
	case w == 0:
		h.s.broken[k] = true
	case h.s.broken[k] && !h.s.idle: // an idle reader does not outrun its break
		h.s.size[k], h.s.broken[k] = w, false
	default:
		h.s.size[k] = max(size, w)
	}
	return nil
}

func newStreamRig(t *testing.T, cfg Config) (*rig, *streams) {
	t.Helper()
	r := &rig{t: t, clk: clock.NewFake(time.Hour), sys: newFakeSys(128), dir: t.TempDir()}
	r.files = newFakeFiles(r.sys)
	s := &streams{fakeFiles: r.files, size: map[probe.FileKey]int{}, broken: map[probe.FileKey]bool{}, dropped: map[probe.FileKey]bool{}}
	cfg.AllowPaths = []string{filepath.Join(r.dir, "data")}
	require.NoError(t, os.MkdirAll(cfg.AllowPaths[0], 0o755))
	st, err := state.Open(filepath.Join(r.dir, "state"), state.Options{BootID: "b"})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	r.store = st
	r.tn, err = New(cfg, Deps{Sysfs: r.sys, Files: s, States: s, Clock: r.clk, Store: st, Logger: quiet()})
	require.NoError(t, err)
	return r, s
}

func TestBackOffLowersTheRunningStream(t *testing.T) {
	r, s := newStreamRig(t, Config{BackoffBase: 2 * time.Second, BackoffMax: time.Minute, Grace: time.Hour, DisablePrefetch: true})
	r.tput = func(int) float64 { return 60e6 } // no step pays
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	acts := r.run(3, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	require.Len(t, filter(acts, KindFileWindow, ResultTrial), 1)
	require.Len(t, filter(acts, KindFileWindowUndo, ResultUndone), 1)
	assert.Equal(t, 128, r.files.window[key])
	assert.Equal(t, 128, s.size[key], "the stream's window is back at the device's, not only its ra_pages")
	assert.Contains(t, r.sys.writes, write{"sdb", 0}, "the lowering went through a break")
	assert.Equal(t, 128, r.sys.get("sdb"))
	assert.Empty(t, r.store.Pins(), "nothing left to reset after a crash")
}

func TestRegimeEndAndShutdownLowerTheRunningStream(t *testing.T) {
	for _, end := range []string{"regime end", "shutdown"} {
		t.Run(end, func(t *testing.T) {
			r, s, key := raisedStreamRig(t)
			if end == "shutdown" {
				require.NoError(t, r.tn.RestoreAll())
			} else {
				r.run(7, func() detector.Snapshot { return r.snap("", key) })
			}
			assert.Equal(t, 128, r.files.window[key])
			assert.Equal(t, 128, s.size[key], "the stream's window is back at the device's")
			assert.Equal(t, 128, r.sys.get("sdb"))
		})
	}
}

// The same undos, their reader idle through them (a DataNode waiting on a
// slow client): its stream restarted where it stands, nothing left above
// the device's window.
func TestUndosLowerAnIdleReader(t *testing.T) {
	for _, end := range []string{"back-off", "regime end", "shutdown"} {
		t.Run(end, func(t *testing.T) {
			r, s := newStreamRig(t, Config{Grace: 5 * time.Second, DisablePrefetch: true})
			r.tput = kneeModel
			if end == "back-off" {
				r.tput = func(int) float64 { return 60e6 }
			}
			p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
			r.reader(100, 7, p, key)
			r.run(1, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
			if end != "back-off" {
				r.run(5, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
			}
			require.Greater(t, s.size[key], 128, "the stream runs on a raised window")
			s.idle = true
			switch end {
			case "back-off":
				r.run(2, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
			case "regime end":
				r.run(7, func() detector.Snapshot { return r.snap("", key) })
			default:
				require.NoError(t, r.tn.RestoreAll())
			}
			assert.Equal(t, 128, r.files.window[key])
			assert.LessOrEqual(t, s.size[key], 128, "the idle reader's stream starts afresh at the device's window")
			assert.Empty(t, r.store.Pins())
		})
	}
}

// raisedStreamRig: a reader whose stream the tuner raised (Grace 5 s).
func raisedStreamRig(t *testing.T) (*rig, *streams, probe.FileKey) {
	t.Helper()
	r, s := newStreamRig(t, Config{Grace: 5 * time.Second, DisablePrefetch: true})
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	r.run(6, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	require.Greater(t, s.size[key], 128, "the stream runs on a raised window")
	return r, s, key
}

// An idle reader whose window cannot be dropped: the shutdown names it in
// its error and keeps its record for readaheadd restore.
func TestShutdownReportsAFileItCouldNotLower(t *testing.T) {
	r, s, key := raisedStreamRig(t)
	s.idle = true
	s.noDrop = true
	err := r.tn.RestoreAll()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1 open file(s) not confirmed at their device's window")
	assert.Contains(t, err.Error(), "pid 100 fd 7")
	assert.NotEmpty(t, r.store.Pins(), "its record is kept for readaheadd restore")
	assert.Equal(t, 128, r.files.window[key], "never left at 0")
}

func TestRestorePinsLowersTheRunningStream(t *testing.T) {
	r, s := newStreamRig(t, Config{DisablePrefetch: true})
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	s.size[key], r.files.window[key] = 1024, 1024 // left by a killed run
	require.NoError(t, r.store.UpdatePins([]state.Pin{{PID: 100, FD: 7, Dev: uint32(key.Dev), Ino: key.Ino, Device: "sdb", WindowKB: 1024, Path: p}}, nil))
	res, err := actuate.RestorePins(r.store, s, r.tn.scope, nil, &actuate.Lowerer{Sysfs: r.sys, Files: s, States: s})
	require.NoError(t, err)
	assert.Equal(t, actuate.PinsRestored{Reset: 1}, res)
	assert.Equal(t, 128, s.size[key])
	assert.Empty(t, r.store.Pins())
}

// restore after a crash: an idle reader is restarted; one whose window
// cannot be dropped is reported and its record kept.
func TestRestorePinsLowersAnIdleReader(t *testing.T) {
	for _, drops := range []bool{true, false} {
		r, s := newStreamRig(t, Config{DisablePrefetch: true})
		p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
		r.files.open(100, 7, p, key)
		s.size[key], r.files.window[key] = 1024, 1024 // left by a killed run
		s.idle, s.noDrop = true, !drops
		require.NoError(t, r.store.UpdatePins([]state.Pin{{PID: 100, FD: 7, Dev: uint32(key.Dev), Ino: key.Ino, Device: "sdb", WindowKB: 1024, Path: p}}, nil))
		res, err := actuate.RestorePins(r.store, s, r.tn.scope, nil, &actuate.Lowerer{Sysfs: r.sys, Files: s, States: s})
		require.NoError(t, err)
		assert.Equal(t, 128, r.files.window[key])
		if drops {
			assert.Equal(t, actuate.PinsRestored{Reset: 1}, res)
			assert.LessOrEqual(t, s.size[key], 128)
			assert.Empty(t, r.store.Pins())
			continue
		}
		assert.Zero(t, res.Reset)
		require.Len(t, res.Unconfirmed, 1)
		assert.Contains(t, res.Unconfirmed[0].String(), "pid 100 fd 7")
		assert.Len(t, r.store.Pins(), 1, "its record is kept for another restore")
	}
}

// A break waits for its reader with the tuner's lock released: the event
// path and status are served meanwhile, not after the break (an idle
// reader holds a break for IdleHold, 200 ms).
func TestBreakReleasesTheTunersLock(t *testing.T) {
	r, s, key := raisedStreamRig(t)
	s.idle = true
	served := make(chan struct{})
	var started, duringBreak bool
	s.onBreak = func() {
		if started {
			select {
			case <-served:
				duringBreak = true // a later poll of the same break
			default:
			}
			return
		}
		started = true
		go func() {
			// Another reader's event, then the status: both need the lock.
			r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 300, File: probe.FileKey{Dev: key.Dev, Ino: key.Ino + 7}, Device: sdb, RaPages: 32})
			r.tn.Status()
			close(served)
		}()
	}
	r.run(7, func() detector.Snapshot { return r.snap("", key) }) // the regime ends: undone at Grace, through a break
	require.True(t, started, "the undo went through a break")
	assert.True(t, duringBreak, "the event path was served during the break, not after it: the lock was released")
	assert.Equal(t, 128, r.files.window[key])
}
