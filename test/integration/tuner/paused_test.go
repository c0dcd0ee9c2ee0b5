package tuner

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/fileras"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
	rt "github.com/readaheadd/readaheadd/pkg/tuner"
	"github.com/readaheadd/readaheadd/test/lab"
)

// pauseFor is how long each reader pauses across its undo.
const pauseFor = 1500 * time.Millisecond

// labTuner is the daemon's tuner on the lab's device, its decisions fed
// with made-up detector snapshots (a fake clock: an interval per Step) but
// acting on the real kernel: the readers' open files, read_ahead_kb, the
// kernel's per-file state.
type labTuner struct {
	t     *testing.T
	tn    *rt.Tuner
	clk   *clock.Fake
	it    *fileras.Iter
	dev   probe.Dev
	store *state.Store
	dir   string
}

func newLabTuner(t *testing.T, l *lab.Lab, it *fileras.Iter, cfg rt.Config) *labTuner {
	t.Helper()
	var st unixStat
	require.NoError(t, statPath(l.Mount, &st))
	h := &labTuner{t: t, clk: clock.NewFake(time.Hour), it: it, dev: probe.DevFromUnix(st.Dev), dir: filepath.Join(t.TempDir(), "state")}
	sys := blockdev.SysFS{Root: "/sys"}
	store, err := state.Open(h.dir, state.Options{DiskSeq: sys.DiskSeq, DevOf: state.DevOfSysfs(sys),
		Tunable: func(n string) bool { return n == l.Name }})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	h.store = store
	cfg.AllowPaths = []string{l.Mount}
	cfg.Devices = []string{l.Name}
	cfg.DisablePrefetch = true
	h.tn, err = rt.New(cfg, rt.Deps{Sysfs: sys, Files: actuate.NewProcFileOps(), States: fileras.States{It: it},
		Clock: h.clk, Store: store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return h
}

// step runs one interval of the reader c of key: a readahead event at its
// kernel window, and a snapshot in which it reads at tput(window), in
// regime kind (none if "").
func (h *labTuner) step(c *child, key probe.FileKey, kind detector.RegimeKind, tput func(int) float64) []rt.Action {
	h.clk.Advance(time.Second)
	now := h.clk.Now()
	w := kernelFile(h.t, h.it, c.Pid, key).WindowKB()
	h.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: uint32(c.Pid), File: key, Device: h.dev, RaPages: uint32(w / 4)})
	s := detector.Snapshot{Now: now, Devices: []detector.DeviceStats{{Device: h.dev, BusyThroughput: 100e6}},
		Files: []detector.FileStats{{Key: key, Device: h.dev, BusyThroughput: tput(w), Sequentiality: 1, NextOffset: 64 << 20, LastSeen: now, P50: time.Millisecond}}}
	if kind != "" {
		s.Regimes = []detector.Regime{{Kind: kind, Device: h.dev, File: key, Evidence: "lab test"}}
	}
	return h.tn.Step(s)
}

// pausedRun is one reader of a +3 ms file that runs on a raised window,
// pauses across the undo, and reads on. It opens its file at once and
// reads from goRead: the tuner's steps take real time on a loaded host,
// and a reader that wrapped around its file would start a fresh window.
type pausedRun struct {
	c       *child
	path    string
	resume  time.Duration // when the reader reads again (CLOCK_MONOTONIC)
	key     probe.FileKey
	raised  float64 // MB/s on the raised window
	raisedF fileras.File
}

func startPaused(t *testing.T, l *lab.Lab, it *fileras.Iter, name string, mb int) (*pausedRun, string) {
	t.Helper()
	return startPausedMode(t, l, "seq", name, mb)
}

func startPausedMode(t *testing.T, l *lab.Lab, mode, name string, mb int) (*pausedRun, string) {
	t.Helper()
	path, err := l.WriteFile(name, mb)
	require.NoError(t, err)
	require.NoError(t, l.SetPermanent(streamSlowdown, path))
	require.NoError(t, lab.DropFileCache(path))
	c := startChild(t, mode, path) // its file open; reads from goRead
	return &pausedRun{c: c, path: path, key: fileKey(t, path)}, path
}

// fd is the reader's descriptor on its file.
func (p *pausedRun) fd(t *testing.T) int {
	t.Helper()
	refs, err := actuate.NewProcFileOps().Find(uint32(p.c.Pid), p.key)
	require.NoError(t, err)
	require.Len(t, refs, 1)
	return refs[0].FD
}

// ramped lets the reader run on its raised window, then measures it.
func (p *pausedRun) ramped(t *testing.T, it *fileras.Iter) {
	t.Helper()
	time.Sleep(600 * time.Millisecond)
	p.raised = rateOver(p.c, 800*time.Millisecond)
	p.raisedF = kernelFile(t, it, p.c.Pid, p.key)
	require.Greater(t, p.raisedF.SizeKB(), 128, "the reader streams on a raised window (kernel f_ra)")
	p.resume = p.c.pause(t, pauseFor)
	time.Sleep(50 * time.Millisecond) // its last read done: idle from now
}

// after checks, once the reader resumed, its kernel window at its next
// reads and its rate side by side with a fresh reader of control (the
// device's window).
func (p *pausedRun) after(t *testing.T, l *lab.Lab, it *fileras.Iter, undoneAt time.Duration, control string, mb int) {
	t.Helper()
	took := monoNow() - undoneAt
	kf := kernelFile(t, it, p.c.Pid, p.key)
	require.Less(t, monoNow(), p.resume-50*time.Millisecond, "the undo ended while the reader was paused")
	t.Logf("undone in %v; the reader still paused: f_ra ra_pages %d KB, window %d KB", took.Round(time.Millisecond), kf.WindowKB(), kf.SizeKB())
	assert.Equal(t, 128, kf.WindowKB(), "ra_pages back at the device's")
	assert.LessOrEqual(t, kf.SizeKB(), 128, "the window the paused reader will resume on is the device's (kernel f_ra)")
	require.NoError(t, lab.DropFileCache(control))
	ctl := startChild(t, "seq", control)
	ctl.goRead(t)
	// Its first reads after the pause.
	for monoNow() < p.resume+100*time.Millisecond {
		time.Sleep(10 * time.Millisecond)
	}
	kf = kernelFile(t, it, p.c.Pid, p.key)
	assert.LessOrEqual(t, kf.SizeKB(), 128, "f_ra at the reader's first reads after its pause")
	time.Sleep(300 * time.Millisecond)
	from := monoNow()
	time.Sleep(1200 * time.Millisecond)
	to := monoNow()
	require.Eventually(t, func() bool {
		a, b := p.c.points(), ctl.points()
		return len(a) > 0 && len(b) > 0 && a[len(a)-1].At >= to && b[len(b)-1].At >= to
	}, 3*time.Second, 20*time.Millisecond)
	rs := windows(p.c.points(), from, to, 1100*time.Millisecond)
	rc := windows(ctl.points(), from, to, 1100*time.Millisecond)
	require.NotEmpty(t, rs)
	require.NotEmpty(t, rc)
	kf = kernelFile(t, it, p.c.Pid, p.key)
	ratio := rs[0].Rate / rc[0].Rate
	t.Logf("raised %.0f MB/s (f_ra %d/%d KB); after the pause %.0f MB/s (f_ra %d/%d KB), fresh reader at the default %.0f MB/s: %.2fx",
		p.raised, p.raisedF.WindowKB(), p.raisedF.SizeKB(), rs[0].Rate/1e6, kf.WindowKB(), kf.SizeKB(), rc[0].Rate/1e6, ratio)
	assert.LessOrEqual(t, kf.SizeKB(), 128)
	assert.GreaterOrEqual(t, ratio, 0.8, "the reader has readahead again: not below the default window's rate")
	assert.LessOrEqual(t, ratio, 1.25, "the reader is no longer on the raised window")
	ctl.stop()
	p.c.stop()
	noWrap(t, p.c, mb)
	require.NoError(t, os.Remove(p.path)) // room on the lab for the next reader's file
}

// knee is the +3 ms file's rate by window on the lab (60 MB/s at 128 KB,
// 100 at 256, 150 from 512).
func knee(kb int) float64 {
	switch {
	case kb >= 512:
		return 150e6
	case kb >= 256:
		return 100e6
	}
	return 60e6
}

// TestUndoReachesPausedReader: a reader on a window the tuner raised
// pauses (as a DataNode's sender waits on a slow client) while the window
// is undone, by a back-off, the end of a regime, the shutdown (what
// SIGTERM runs) or `readaheadd restore` after a SIGKILL. When it reads on,
// its kernel window (f_ra) is the device's and it reads at the default
// window's rate (0.8-1.25x a fresh reader's, side by side): not on the
// raised window, and not left without readahead. A reader whose window
// cannot be lowered is named by restore, which exits 1.
func TestUndoReachesPausedReader(t *testing.T) {
	needRoot(t)
	it, err := fileras.Open()
	require.NoError(t, err)
	t.Cleanup(func() { it.Close() })
	daemonBin(t) // built before any reader runs
	l := newLab(t)
	const mb = 400
	control, err := l.WriteFile("blk_control", 200)
	require.NoError(t, err)
	require.NoError(t, l.SetPermanent(streamSlowdown, control))
	require.NoError(t, it.Watch(fileKey(t, control).Dev))
	undone := func(acts []rt.Action) bool {
		for _, a := range acts {
			if a.Kind == rt.KindFileWindowUndo && a.Result == rt.ResultUndone && a.ToKB == 128 {
				return true
			}
		}
		return false
	}

	// The case as reported: 2048 KB, a DataNode's sender (sendfile, no
	// file position), through the Lowerer every undo calls, with what it
	// costs.
	t.Run("2048 KB, its cost", func(t *testing.T) {
		p, _ := startPausedMode(t, l, "sendfile", "blk_2048", mb)
		low := &actuate.Lowerer{Sysfs: blockdev.SysFS{Root: "/sys"}, Files: actuate.NewProcFileOps(), States: fileras.States{It: it}}
		set := lowerOne(t, l, low, p.c.Pid, p.key)
		set(2048)
		p.c.goRead(t)
		p.ramped(t, it)
		fdinfo, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", p.c.Pid, p.fd(t)))
		require.NoError(t, err)
		require.Contains(t, string(fdinfo), "pos:\t0\n", "a sendfile reader's file position stays 0")
		at := monoNow()
		st := set(128)
		t.Logf("Lower to 128 KB: held %v (IdleHold 200ms), %d restarted, %d unconfirmed, %.1f MB to read again, read_ahead_kb at 0 for %v",
			st.Hold.Round(time.Millisecond), st.Rearmed, st.Unconfirmed, float64(st.Reread)/1e6, st.DeviceOff)
		assert.Equal(t, 1, st.Rearmed)
		assert.Zero(t, st.Unconfirmed)
		assert.LessOrEqual(t, st.Reread, int64(2*p.raisedF.SizeKB())<<10, "at most the rest of its window and the next one")
		p.after(t, l, it, at, control, mb)
	})

	t.Run("back-off", func(t *testing.T) {
		h := newLabTuner(t, l, it, rt.Config{})
		p, _ := startPaused(t, l, it, "blk_backoff", mb)
		flat := func(int) float64 { return 60e6 } // no larger window pays
		var acts []rt.Action
		for i := 0; i < 3 && kernelFile(t, it, p.c.Pid, p.key).WindowKB() <= 128; i++ {
			acts = append(acts, h.step(p.c, p.key, detector.FileLatencyShift, flat)...)
		}
		p.c.goRead(t)
		p.ramped(t, it)
		at := monoNow()
		for i := 0; i < 5 && !undone(acts); i++ {
			acts = append(acts, h.step(p.c, p.key, detector.FileLatencyShift, flat)...)
		}
		require.True(t, undone(acts), "the trial was undone: %v", acts)
		p.after(t, l, it, at, control, mb)
	})

	t.Run("regime end", func(t *testing.T) {
		h := newLabTuner(t, l, it, rt.Config{Grace: 3 * time.Second})
		p, _ := startPaused(t, l, it, "blk_regime", mb)
		var acts []rt.Action
		for i := 0; i < 8; i++ {
			acts = append(acts, h.step(p.c, p.key, detector.FileLatencyShift, knee)...)
		}
		p.c.goRead(t)
		p.ramped(t, it)
		at := monoNow()
		acts = nil // the knee's own steps down are not the undo
		for i := 0; i < 6 && !undone(acts); i++ {
			acts = append(acts, h.step(p.c, p.key, "", knee)...)
		}
		require.True(t, undone(acts), "the window was taken back when the regime ended: %v", acts)
		p.after(t, l, it, at, control, mb)
	})

	raise := func(t *testing.T, name string) (*labTuner, *pausedRun) {
		h := newLabTuner(t, l, it, rt.Config{})
		p, _ := startPaused(t, l, it, name, mb)
		for i := 0; i < 8; i++ {
			h.step(p.c, p.key, detector.FileLatencyShift, knee)
		}
		p.c.goRead(t)
		p.ramped(t, it)
		return h, p
	}

	t.Run("shutdown", func(t *testing.T) {
		h, p := raise(t, "blk_shutdown")
		at := monoNow()
		require.NoError(t, h.tn.RestoreAll(), "the shutdown confirms every file")
		p.after(t, l, it, at, control, mb)
	})

	t.Run("SIGKILL then restore", func(t *testing.T) {
		h, p := raise(t, "blk_killed")
		require.NotEmpty(t, h.store.Pins(), "the raised window is recorded for a crash")
		// Killed: nothing undone, the state directory left as it is.
		require.NoError(t, h.store.Close())
		at := monoNow()
		code, out := runCLI(t, "restore", "--state-dir", h.dir, "--device", l.Name, "--allow-path", l.Mount)
		t.Logf("readaheadd restore: exit %d\n%s", code, out)
		require.Equal(t, 0, code)
		assert.Contains(t, out, "0 not confirmed")
		p.after(t, l, it, at, control, mb)
	})

	// When the window ahead of the paused reader cannot be dropped
	// (another process maps those pages), restore names the file, keeps
	// its record and exits 1.
	t.Run("restore, window ahead mapped", func(t *testing.T) {
		h, p := raise(t, "blk_mapped")
		kf := kernelFile(t, it, p.c.Pid, p.key)
		f, err := os.Open(p.path)
		require.NoError(t, err)
		defer f.Close()
		end := int64(kf.Start+uint64(kf.Size)) << 12
		m, err := unix.Mmap(int(f.Fd()), 0, int(end), unix.PROT_READ, unix.MAP_SHARED)
		require.NoError(t, err)
		defer unix.Munmap(m)
		var sink byte
		for off := kf.PrevPos &^ 4095; off < end; off += 4096 {
			sink ^= m[off]
		}
		touchSink.Store(uint32(sink))
		require.NoError(t, h.store.Close())
		code, out := runCLI(t, "restore", "--state-dir", h.dir, "--device", l.Name, "--allow-path", l.Mount)
		t.Logf("readaheadd restore: exit %d\n%s", code, out)
		assert.Equal(t, 1, code)
		assert.Contains(t, out, "1 not confirmed")
		assert.Contains(t, out, fmt.Sprintf("NOT confirmed: pid %d fd %d (%s)", p.c.Pid, p.fd(t), p.path))
		st, err := state.Open(h.dir, state.Options{})
		require.NoError(t, err)
		defer st.Close()
		assert.Len(t, st.Pins(), 1, "its record is kept for another restore")
		p.c.stop()
		require.NoError(t, os.Remove(p.path))
	})
}

type unixStat = syscallStat
