package tuner

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/scope"
	"github.com/readaheadd/readaheadd/pkg/state"
)

var sdb = probe.MkDev(8, 16)

type write struct {
	name string
	kb   int
}

// fakeSys is one disk, sdb, in a fake sysfs that logs every write.
type fakeSys struct {
	mu     sync.Mutex
	kb     map[string]int
	writes []write
}

func newFakeSys(kb int) *fakeSys { return &fakeSys{kb: map[string]int{"sdb": kb}} }

func (f *fakeSys) ReadAheadKB(name string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.kb[name]
	if !ok {
		return 0, blockdev.ErrNoDevice
	}
	return v, nil
}

func (f *fakeSys) SetReadAheadKB(name string, kb int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.kb[name]; !ok {
		return blockdev.ErrNoDevice
	}
	f.kb[name] = kb
	f.writes = append(f.writes, write{name, kb})
	return nil
}

func (f *fakeSys) ByDev(dev probe.Dev) (blockdev.Disk, error) {
	if dev == sdb {
		return blockdev.Disk{Name: "sdb", Dev: sdb}, nil
	}
	return blockdev.Disk{}, blockdev.ErrNoDevice
}

func (f *fakeSys) get(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.kb[name]
}

type advCall struct {
	ref    actuate.FileRef
	advice actuate.Advice
	devKB  int // read_ahead_kb at the time of the call
	off, n int64
}

// fakeFiles models readers' open files: each key's open files get the
// window a real kernel would give them on fadvise.
type fakeFiles struct {
	sys    *fakeSys
	fds    map[uint32][]actuate.FileRef
	window map[probe.FileKey]int // window of the open files per key
	calls  []advCall
	gone   map[uint32]bool // exits between Find and Dup
	dups   int
	closed int
	scans  int

	// closedFDs: Dup fails on a descriptor no longer open (closeFD); off,
	// every descriptor once found stays reachable.
	closedFDs bool
}

func newFakeFiles(sys *fakeSys) *fakeFiles {
	return &fakeFiles{sys: sys, fds: map[uint32][]actuate.FileRef{}, window: map[probe.FileKey]int{}, gone: map[uint32]bool{}}
}

func (f *fakeFiles) open(tgid uint32, fd int, path string, key probe.FileKey) {
	f.fds[tgid] = append(f.fds[tgid], actuate.FileRef{Tgid: tgid, FD: fd, Key: key, Path: path})
	if _, ok := f.window[key]; !ok {
		f.window[key] = f.sys.get("sdb") // copied at open
	}
}

func (f *fakeFiles) Find(tgid uint32, key probe.FileKey) ([]actuate.FileRef, error) {
	var out []actuate.FileRef
	for _, r := range f.fds[tgid] {
		if r.Key == key {
			out = append(out, r)
		}
	}
	return out, nil
}

func (f *fakeFiles) FindAll(key probe.FileKey) ([]actuate.FileRef, error) {
	f.scans++
	var out []actuate.FileRef
	for tgid := range f.fds {
		found, _ := f.Find(tgid, key)
		out = append(out, found...)
	}
	return out, nil
}

// closeFD closes a reader's descriptor.
func (f *fakeFiles) closeFD(tgid uint32, fd int) {
	f.fds[tgid] = slices.DeleteFunc(f.fds[tgid], func(r actuate.FileRef) bool { return r.FD == fd })
}

func (f *fakeFiles) Dup(ref actuate.FileRef) (actuate.Handle, error) {
	if f.gone[ref.Tgid] {
		return nil, actuate.ErrProcessGone
	}
	if f.closedFDs && !slices.ContainsFunc(f.fds[ref.Tgid], func(r actuate.FileRef) bool { return r.FD == ref.FD && r.Key == ref.Key }) {
		return nil, actuate.ErrFDGone
	}
	f.dups++
	return &fakeHandle{f: f, ref: ref}, nil
}

func (f *fakeFiles) Holds(ref actuate.FileRef) bool {
	return !f.gone[ref.Tgid] && (!f.closedFDs || slices.ContainsFunc(f.fds[ref.Tgid], func(r actuate.FileRef) bool { return r.FD == ref.FD && r.Key == ref.Key }))
}

type fakeHandle struct {
	f   *fakeFiles
	ref actuate.FileRef
}

func (h *fakeHandle) Fadvise(off, n int64, a actuate.Advice) error {
	dev := h.f.sys.get("sdb")
	h.f.calls = append(h.f.calls, advCall{ref: h.ref, advice: a, devKB: dev, off: off, n: n})
	switch a {
	case actuate.AdviceNormal:
		h.f.window[h.ref.Key] = dev
	case actuate.AdviceSequential:
		h.f.window[h.ref.Key] = 2 * dev
	}
	return nil
}

func (h *fakeHandle) Close() error { h.f.closed++; return nil }

// realFile creates a file and returns its path and key (scope checks stat it).
func realFile(t *testing.T, dir, name string) (string, probe.FileKey) {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
	var st unix.Stat_t
	require.NoError(t, unix.Stat(p, &st))
	return p, probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}
}

type rig struct {
	t     *testing.T
	clk   *clock.Fake
	sys   *fakeSys
	files *fakeFiles
	store *state.Store
	tn    *Tuner
	dir   string
	// tput maps a file's window to its busy throughput; p99, if set, to
	// its p99 latency in outcomeSnap (P50 is 3 ms there).
	tput func(kb int) float64
	p99  func(kb int) time.Duration
	// capBPS, if set, is the device's capacity in outcomeSnap (else what
	// the device read).
	capBPS float64
	// queue: outcomeSnap reports the device's bytes in flight (its
	// streams' windows times their fill), which the capacity is learned by.
	queue bool
	// unqueued, if set, is the device's unqueued cells in outcomeSnap.
	unqueued []detector.LatencyCell
	// around, if set before New (mutate), is the tuner's ReadAroundWatch.
	around *fakeAround
}

func quiet() *slog.Logger {
	if os.Getenv("TUNER_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newRig(t *testing.T, cfg Config, mutate func(*rig)) *rig {
	t.Helper()
	r := &rig{t: t, clk: clock.NewFake(time.Hour), sys: newFakeSys(128), dir: t.TempDir()}
	r.files = newFakeFiles(r.sys)
	require.NoError(t, os.MkdirAll(filepath.Join(r.dir, "data"), 0o755))
	if cfg.AllowPaths == nil {
		cfg.AllowPaths = []string{filepath.Join(r.dir, "data")}
	}
	if mutate != nil {
		mutate(r)
	}
	st, err := state.Open(filepath.Join(r.dir, "state"), state.Options{BootID: "b"})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	r.store = st
	deps := Deps{Sysfs: r.sys, Files: r.files, Clock: r.clk, Store: st, Logger: quiet()}
	if r.around != nil {
		deps.Around = r.around
	}
	r.tn, err = New(cfg, deps)
	require.NoError(t, err)
	return r
}

// snap builds a snapshot in which the given files are in regime kind and
// read at the throughput their current window gives.
func (r *rig) snap(kind detector.RegimeKind, keys ...probe.FileKey) detector.Snapshot {
	now := r.clk.Now()
	s := detector.Snapshot{Now: now, Devices: []detector.DeviceStats{{Device: sdb, BusyThroughput: 100e6}}}
	for _, k := range keys {
		s.Files = append(s.Files, detector.FileStats{Key: k, Device: sdb, BusyThroughput: r.tput(r.files.window[k]),
			Sequentiality: 1, NextOffset: 64 << 20, LastSeen: now, P50: time.Millisecond})
		if kind != "" {
			s.Regimes = append(s.Regimes, detector.Regime{Kind: kind, Device: sdb, File: k, Evidence: "test"})
		}
	}
	return s
}

// run steps n intervals of one second, returning every action.
func (r *rig) run(n int, mk func() detector.Snapshot) []Action {
	var all []Action
	for i := 0; i < n; i++ {
		r.clk.Advance(time.Second)
		all = append(all, r.tn.Step(mk())...)
	}
	return all
}

// deviceOnlyRig is a rig with no allow-paths (device-wide actions only),
// DeviceMinFiles 2, its files on kneeModel.
func deviceOnlyRig(t *testing.T) *rig {
	r := newRig(t, Config{DeviceMinFiles: 2}, nil)
	var err error
	r.tn, err = New(Config{AllowPaths: []string{}, DeviceMinFiles: 2}, Deps{Sysfs: r.sys, Files: r.files, Clock: r.clk, Store: r.store, Logger: quiet()})
	require.NoError(t, err)
	r.tput = kneeModel
	return r
}

func (r *rig) reader(tgid uint32, fd int, path string, key probe.FileKey) {
	r.files.open(tgid, fd, path, key)
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: tgid, File: key, Device: sdb, RaPages: uint32(r.files.window[key] / 4)})
}

func filter(as []Action, kind ActionKind, res Result) []Action {
	var out []Action
	for _, a := range as {
		if a.Kind == kind && a.Result == res {
			out = append(out, a)
		}
	}
	return out
}

// rateSteps is a stream's rate at each window: the rate of the largest
// window in kbs not above the window in force (rates[i] for kbs[i], kbs
// ascending; below kbs[0] the first rate).
func rateSteps(kbs []int, rates []float64) func(int) float64 {
	return func(kb int) float64 {
		r := rates[0]
		for i, k := range kbs {
			if kb >= k {
				r = rates[i]
			}
		}
		return r
	}
}

// kneeModel: 60 MB/s at 128 KB, 100 at 256, 150 at 512, 155 from 1024.
var kneeModel = rateSteps([]int{128, 256, 512, 1024}, []float64{60e6, 100e6, 150e6, 155e6})

func TestEscalatesGeometricallyAndStopsAtTheKnee(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	acts := r.run(10, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	for _, a := range acts {
		t.Logf("%v %s %d->%d %s %s", a.Time, a.Kind, a.FromKB, a.ToKB, a.Result, a.Evidence)
	}

	// The knee is confirmed once, BackoffBase later, then left for
	// BackoffMax.
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 4)
	var steps [][2]int
	for _, a := range trials {
		steps = append(steps, [2]int{a.FromKB, a.ToKB})
	}
	assert.Equal(t, [][2]int{{128, 256}, {256, 512}, {512, 1024}, {512, 1024}}, steps)
	assert.Equal(t, 2*time.Second+time.Second, trials[3].Time-trials[2].Time, "judged after 1 s, retried 2 s later")
	kept := filter(acts, KindFileWindow, ResultKept)
	require.Len(t, kept, 2)
	undone := filter(acts, KindFileWindowUndo, ResultUndone)
	require.Len(t, undone, 2)
	for _, u := range undone {
		assert.Equal(t, 1024, u.FromKB)
		assert.Equal(t, 512, u.ToKB, "the knee keeps the previous step")
		assert.Contains(t, u.Evidence, "knee")
	}
	assert.Contains(t, undone[1].Evidence, "probing further in 5m0s", "a confirmed knee waits BackoffMax")
	assert.Equal(t, 512, r.files.window[key])
	assert.Equal(t, 128, r.sys.get("sdb"), "the device is back at its value after every pin")

	// 256 = 2 x 128 needs no sysfs write (SEQUENTIAL); 512 and 1024 are
	// raise-pin-restore: fadvise(NORMAL) while the device holds the window.
	assert.Equal(t, actuate.AdviceSequential, r.files.calls[0].advice)
	for _, c := range r.files.calls[1:] {
		assert.Equal(t, actuate.AdviceNormal, c.advice)
	}
	assert.Equal(t, 512, r.files.calls[1].devKB)
	assert.Equal(t, []write{{"sdb", 512}, {"sdb", 128}, {"sdb", 1024}, {"sdb", 128}, {"sdb", 512}, {"sdb", 128},
		{"sdb", 1024}, {"sdb", 128}, {"sdb", 512}, {"sdb", 128}}, r.sys.writes)
	assert.Equal(t, r.files.dups, r.files.closed, "every taken descriptor is closed")

	// The original was recorded before the first write.
	kb, ok := r.store.Original("sdb")
	require.True(t, ok)
	assert.Equal(t, 128, kb)
	st := r.tn.Status()
	require.Len(t, st.Files, 1)
	assert.Equal(t, "knee", st.Files[0].State)
	assert.Equal(t, 1, st.Devices[0].FilesAdjusted)
}

func TestBacksOffExponentiallyWhenNothingPays(t *testing.T) {
	r := newRig(t, Config{BackoffBase: 2 * time.Second, BackoffMax: time.Minute, Grace: time.Hour, DisablePrefetch: true}, nil)
	r.tput = func(int) float64 { return 60e6 }
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	var trialsAt []time.Duration
	r.reader(100, 7, p, key)
	for i := 0; i < 40; i++ {
		r.clk.Advance(time.Second)
		r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 100, File: key, Device: sdb, RaPages: 32})
		for _, a := range r.tn.Step(r.snap(detector.FileLatencyShift, key)) {
			if a.Result == ResultTrial {
				trialsAt = append(trialsAt, a.Time)
			}
			if a.Kind == KindFileWindowUndo {
				assert.Equal(t, ResultUndone, a.Result)
			}
		}
	}
	require.GreaterOrEqual(t, len(trialsAt), 4)
	var gaps []time.Duration
	for i := 1; i < len(trialsAt); i++ {
		gaps = append(gaps, trialsAt[i]-trialsAt[i-1])
	}
	// Each attempt takes 1s to judge, then waits 2s, 4s, 8s, 16s.
	assert.Equal(t, []time.Duration{3 * time.Second, 5 * time.Second, 9 * time.Second, 17 * time.Second}, gaps[:4])
	assert.Equal(t, 128, r.files.window[key], "no step that did not pay stays")
	assert.Equal(t, 128, r.sys.get("sdb"))
}

func TestUndoWhenRegimeEndsAfterGrace(t *testing.T) {
	r := newRig(t, Config{Grace: 5 * time.Second}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	r.run(6, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	require.Equal(t, 512, r.files.window[key])

	// The regime ends but the file is still read: undo only after the grace period.
	acts := r.run(4, func() detector.Snapshot { return r.snap("", key) })
	assert.Empty(t, filter(acts, KindFileWindowUndo, ResultUndone))
	acts = r.run(2, func() detector.Snapshot { return r.snap("", key) })
	u := filter(acts, KindFileWindowUndo, ResultUndone)
	require.Len(t, u, 1)
	assert.Equal(t, 128, u[0].ToKB)
	assert.Equal(t, 128, r.files.window[key])
	assert.Empty(t, r.tn.Status().Files)
}

func TestStarvedStreamClearingIsSuccessNotUndo(t *testing.T) {
	r := newRig(t, Config{Grace: 3 * time.Second}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	// Two intervals: 256 kept, 512 under trial (it pays once judged).
	r.run(2, func() detector.Snapshot { return r.snap(detector.StarvedStream, key) })
	require.Greater(t, r.files.window[key], 128)
	// No longer starved, still read: kept.
	acts := r.run(10, func() detector.Snapshot { return r.snap("", key) })
	assert.Empty(t, filter(acts, KindFileWindowUndo, ResultUndone))
	assert.Greater(t, r.files.window[key], 128)
	// The reader stops: undone after the grace period.
	acts = r.run(4, func() detector.Snapshot { return detector.Snapshot{Now: r.clk.Now()} })
	assert.Len(t, filter(acts, KindFileWindowUndo, ResultUndone), 1)
}

func TestBoundsMaxAndNeverBelowStart(t *testing.T) {
	r := newRig(t, Config{MaxKB: 1024, DeviceMinFiles: 1, DeviceFileFraction: 0.1}, func(r *rig) { r.sys.kb["sdb"] = 256 })
	r.tput = func(kb int) float64 { return float64(kb) * 1e5 } // always pays
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	r.run(12, func() detector.Snapshot {
		s := r.snap(detector.FileLatencyShift, key)
		s.Devices[0].BusyThroughput = float64(r.sys.get("sdb")) * 1e5
		return s
	})
	for _, w := range r.sys.writes {
		assert.LessOrEqual(t, w.kb, 1024)
		assert.GreaterOrEqual(t, w.kb, 256)
	}
	for _, c := range r.files.calls {
		assert.LessOrEqual(t, c.devKB, 1024)
	}
	assert.Equal(t, 1024, r.sys.get("sdb"), "one file is enough with DeviceMinFiles 1: device-wide window at the maximum")
	require.NoError(t, r.tn.RestoreAll())
	assert.Equal(t, 256, r.sys.get("sdb"))
	assert.Empty(t, r.store.Entries())
}

func TestDryRunWritesNothing(t *testing.T) {
	r := newRig(t, Config{DryRun: true, Grace: 2 * time.Second}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	acts := r.run(5, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	dr := filter(acts, KindFileWindow, ResultDryRun)
	require.Len(t, dr, 1, "reported once, not every interval")
	assert.Equal(t, 128, dr[0].FromKB)
	assert.Equal(t, 256, dr[0].ToKB)
	acts = r.run(3, func() detector.Snapshot { return detector.Snapshot{Now: r.clk.Now()} })
	assert.Len(t, filter(acts, KindFileWindowUndo, ResultDryRun), 1)
	assert.Empty(t, r.sys.writes)
	assert.Zero(t, r.files.dups)
	assert.Empty(t, r.store.Entries())
	assert.True(t, r.tn.Status().DryRun)
}

func TestOriginalsFromACrashAreRestoredFirst(t *testing.T) {
	dir := t.TempDir()
	st, err := state.Open(dir, state.Options{BootID: "b"})
	require.NoError(t, err)
	require.NoError(t, st.Record("sdb", "8:16", 128))
	sys := newFakeSys(2048) // the crashed daemon left the device raised
	_, err = New(Config{}, Deps{Sysfs: sys, Files: newFakeFiles(sys), Clock: clock.NewFake(0), Store: st, Logger: quiet()})
	require.NoError(t, err)
	assert.Equal(t, []write{{"sdb", 128}}, sys.writes)
	assert.Empty(t, st.Entries())
	st.Close()
}

func TestCorruptStateIsReportedAndNothingWritten(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, state.FileName), []byte(`{"version":1,"dev`), 0o600))
	// The daemon opens its state before building a tuner: nothing is
	// written when that fails.
	_, err := state.Open(dir, state.Options{})
	var ce *state.CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), filepath.Join(dir, state.FileName))
}

func TestScopeRules(t *testing.T) {
	r := newRig(t, Config{}, nil)
	r.tput = kneeModel
	data := filepath.Join(r.dir, "data")
	// A file outside, reached through a symlink inside the allow-path.
	outPath, outKey := realFile(t, filepath.Join(r.dir, "outside"), "secret")
	require.NoError(t, os.Symlink(outPath, filepath.Join(data, "link")))
	r.reader(200, 3, filepath.Join(data, "link"), outKey)
	// A file inside.
	inPath, inKey := realFile(t, data, "sub/blk_2")
	r.reader(201, 4, inPath, inKey)

	acts := r.run(3, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, outKey, inKey) })
	for _, a := range acts {
		assert.NotEqual(t, outKey, a.File, "no action on a file outside the allow-paths")
	}
	assert.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial))
	for _, c := range r.files.calls {
		assert.Equal(t, inKey, c.ref.Key)
	}
	st := r.tn.Status()
	assert.Positive(t, st.OutOfScope)

	// The scope itself: prefix, symlinked prefix, sibling with a common prefix.
	sc, err := scope.New([]string{data})
	require.NoError(t, err)
	_, err = sc.Check(0, -1, inPath, inKey)
	assert.NoError(t, err)
	_, err = sc.Check(0, -1, filepath.Join(data, "link"), outKey)
	assert.Error(t, err)
	sib, sibKey := realFile(t, r.dir, "data2/x")
	_, err = sc.Check(0, -1, sib, sibKey)
	assert.Error(t, err, "data2 is not under data")
	_, err = sc.Check(0, -1, inPath, outKey)
	assert.Error(t, err, "the path must name the open file")
	require.NoError(t, os.Symlink(data, filepath.Join(r.dir, "datalink")))
	sc2, err := scope.New([]string{filepath.Join(r.dir, "datalink")})
	require.NoError(t, err)
	_, err = sc2.Check(0, -1, inPath, inKey)
	assert.NoError(t, err, "an allow-path given through a symlink is resolved")
}

func TestNoAllowPathsMeansDeviceLevelOnly(t *testing.T) {
	r := deviceOnlyRig(t)
	_, k1 := realFile(t, r.dir, "a")
	_, k2 := realFile(t, r.dir, "b")
	acts := r.run(1, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, k1) })
	assert.Empty(t, acts, "one file is not many: nothing")
	acts = r.run(1, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, k1, k2) })
	require.Len(t, acts, 1)
	assert.Equal(t, KindDeviceWindow, acts[0].Kind)
	assert.Equal(t, 256, r.sys.get("sdb"))
	assert.Zero(t, r.files.dups)
}

func TestNewReadersOfAnActiveFileGetTheWindow(t *testing.T) {
	r := newRig(t, Config{}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	r.run(6, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	require.Equal(t, 512, r.files.window[key])

	// The DataNode opens the block again for a new read: the new open file
	// starts at the device's 128 KB, which its readahead event shows.
	r.files.calls = nil
	r.files.fds[100] = append(r.files.fds[100], actuate.FileRef{Tgid: 100, FD: 9, Key: key, Path: p})
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 100, File: key, Device: sdb, RaPages: 32})
	// Pinned from the event path, before any tick.
	require.NotEmpty(t, r.files.calls, "the new descriptor is pinned on its first readahead event")
	// And another process reads it too.
	r.files.fds[300] = []actuate.FileRef{{Tgid: 300, FD: 5, Key: key, Path: p}}
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 300, File: key, Device: sdb, RaPages: 32})
	acts := r.tn.applyPending() // returns what the event path did
	require.Len(t, acts, 2)
	for _, a := range acts {
		assert.Equal(t, ResultApplied, a.Result)
		assert.Equal(t, 512, a.ToKB)
	}
	fds := map[[2]int]bool{}
	for _, c := range r.files.calls {
		assert.Equal(t, 512, c.devKB)
		fds[[2]int{int(c.ref.Tgid), c.ref.FD}] = true
	}
	assert.True(t, fds[[2]int{100, 9}] && fds[[2]int{300, 5}], "both new readers pinned: %v", fds)
	assert.Equal(t, 128, r.sys.get("sdb"))
	// Once pinned, their events show the window: nothing more to do.
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 300, File: key, Device: sdb, RaPages: 128})
	assert.Empty(t, r.tn.applyPending())
}

func TestProcessGoneIsACountedFailure(t *testing.T) {
	r := newRig(t, Config{}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	r.files.gone[100] = true
	acts := r.run(1, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	f := filter(acts, KindFileWindow, ResultFailed)
	require.Len(t, f, 1)
	assert.Contains(t, f[0].Evidence, "process exited")
	assert.Positive(t, r.tn.Status().FileOpFailures)
	assert.Empty(t, r.sys.writes)
}

func TestSysfsWritesAreRateLimited(t *testing.T) {
	r := newRig(t, Config{SysfsWritesPerSec: 0.5, SysfsBurst: 2, Settle: time.Second}, nil)
	r.tput = func(kb int) float64 { return float64(kb) * 1e5 }
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	r.run(8, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	// 8 s at 0.5 writes/s plus a burst of 2: at most 6 writes.
	assert.LessOrEqual(t, len(r.sys.writes), 6)
	assert.Positive(t, r.tn.Status().RateLimited)
	assert.Equal(t, 128, r.sys.get("sdb"))
}

func TestDeviceWideRegimeIsJudgedOnTheDevice(t *testing.T) {
	r := newRig(t, Config{Grace: 2 * time.Second}, nil)
	mk := func() detector.Snapshot {
		kb := r.sys.get("sdb")
		tput := 100e6
		if kb >= 256 {
			tput = 130e6 // pays once, then nothing more
		}
		return detector.Snapshot{Now: r.clk.Now(),
			Devices: []detector.DeviceStats{{Device: sdb, BusyThroughput: tput}},
			Regimes: []detector.Regime{{Kind: detector.TailInflation, Device: sdb, Evidence: "p99 up"}}}
	}
	// 256 kept, 512 undone at the knee (confirmed only after BackoffBase).
	acts := r.run(4, mk)
	assert.Len(t, filter(acts, KindDeviceWindow, ResultKept), 1)
	assert.Len(t, filter(acts, KindDeviceWindowUndo, ResultUndone), 1)
	assert.Equal(t, 256, r.sys.get("sdb"))
	acts = r.run(3, func() detector.Snapshot { return detector.Snapshot{Now: r.clk.Now()} })
	assert.Len(t, filter(acts, KindDeviceWindowUndo, ResultUndone), 1)
	assert.Equal(t, 128, r.sys.get("sdb"))
}

// prefetchPays: a stream a window of 256 KB helps and a prefetch helps more
// (150 MB/s while *on).
func prefetchPays(on *bool) func(int) float64 {
	return func(kb int) float64 {
		switch {
		case *on:
			return 150e6
		case kb >= 256:
			return 90e6
		}
		return 60e6
	}
}

func TestPrefetchWhenTheWindowIsNotEnough(t *testing.T) {
	r := newRig(t, Config{MaxKB: 256}, nil)
	prefetching := false
	r.tput = prefetchPays(&prefetching)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	var acts []Action
	for i := 0; i < 6; i++ {
		r.clk.Advance(time.Second)
		acts = append(acts, r.tn.Step(r.snap(detector.FileLatencyShift, key))...)
		for _, c := range r.files.calls {
			if c.advice == actuate.AdviceWillNeed {
				prefetching = true
			}
		}
	}
	tr := filter(acts, KindPrefetch, ResultTrial)
	require.NotEmpty(t, tr)
	assert.Equal(t, 0, tr[0].FromKB)
	assert.Equal(t, 2048, tr[0].ToKB)
	assert.NotEmpty(t, filter(acts, KindPrefetch, ResultKept))
	var wn []advCall
	for _, c := range r.files.calls {
		if c.advice == actuate.AdviceWillNeed {
			wn = append(wn, c)
		}
	}
	require.NotEmpty(t, wn)
	assert.Equal(t, int64(64<<20), wn[0].off, "prefetch starts at the reader's next offset")
	assert.LessOrEqual(t, wn[0].n, int64(2048<<10))
}

func TestFirstStepSizedByLittlesLaw(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	// 3 ms p95 at a 150 MB/s capacity: about 440 KB must be in flight,
	// so 256 KB cannot be enough and the first step is 512 KB.
	capBPS := 150e6
	mk := func() detector.Snapshot {
		s := r.snap(detector.FileLatencyShift, key)
		s.Devices[0].CapacityBPS = capBPS
		s.Files[0].P50 = 2 * time.Millisecond
		s.Files[0].P95 = 3 * time.Millisecond
		return s
	}
	acts := r.run(1, mk)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1)
	assert.Equal(t, [2]int{128, 512}, [2]int{trials[0].FromKB, trials[0].ToKB})
	// Later steps grow by the factor again (while the file is below the
	// device's capacity: 150 MB/s at 512 KB is a third of 450 MB/s).
	capBPS = 450e6
	acts = r.run(1, mk)
	trials = filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1)
	assert.Equal(t, [2]int{512, 1024}, [2]int{trials[0].FromKB, trials[0].ToKB})
}

func TestNoLittlesLawJumpBesideARandomReader(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = slowedModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	rkey := probe.FileKey{Dev: key.Dev, Ino: key.Ino + 1}
	mk := func() detector.Snapshot {
		s := r.snap(detector.FileLatencyShift, key)
		s.Devices[0].CapacityBPS = 150e6
		s.Files[0].P95 = 3 * time.Millisecond
		// A random reader of another file on the device: every window of
		// the stream's queued transfers is waiting time for its faults.
		s.Files = append(s.Files, randomStats(rkey, s.Now, 200, time.Millisecond, 2*time.Millisecond, 16<<10))
		return s
	}
	var steps [][2]int
	for _, a := range filter(r.run(5, mk), KindFileWindow, ResultTrial) {
		steps = append(steps, [2]int{a.FromKB, a.ToKB})
	}
	require.GreaterOrEqual(t, len(steps), 2)
	assert.Equal(t, [2]int{128, 160}, steps[0], "a small step, not the 512 KB Little's law asks for")
	assert.Equal(t, [2]int{160, 240}, steps[1], "then at most randGrowth a step")
}

func TestKeptStepIsFollowedAtTheNextTickEvenIfItReadsTheClockEarly(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	mk := func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) }
	r.clk.Advance(time.Second)
	acts := r.tn.Step(mk())
	require.Len(t, filter(acts, KindFileWindow, ResultTrial), 1)
	// The next tick comes 2 ms early (scheduling): the step is judged, kept,
	// and the next one taken in the same interval.
	r.clk.Advance(998 * time.Millisecond)
	acts = r.tn.Step(mk())
	kept := filter(acts, KindFileWindow, ResultKept)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, kept, 1)
	require.Len(t, trials, 1)
	assert.Equal(t, 256, kept[0].ToKB)
	assert.Equal(t, [2]int{256, 512}, [2]int{trials[0].FromKB, trials[0].ToKB})
	assert.Equal(t, 512, r.files.window[key])
}

func TestJudgingAfterTheRegimeEndedTakesNoNewStep(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true, Grace: time.Hour}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	r.run(1, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	require.Equal(t, 256, r.files.window[key])
	acts := r.run(3, func() detector.Snapshot { return r.snap("", key) })
	assert.Len(t, filter(acts, KindFileWindow, ResultKept), 1, "the step under trial is judged")
	assert.Empty(t, filter(acts, KindFileWindow, ResultTrial), "no new step without a regime")
	assert.Equal(t, 256, r.files.window[key])
}

func TestReprobeEndsAWindowWhoseRegimeIsOver(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true, Grace: time.Hour, ReprobeAfter: 20 * time.Second}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	// The detector holds the shift as long as the window is raised (a
	// saturated device), and clears it once the window is back at 128.
	held := func() detector.Snapshot {
		if r.files.window[key] > 128 {
			return r.snap(detector.FileLatencyShift, key)
		}
		return r.snap("", key)
	}
	acts := r.run(5, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	require.Equal(t, 512, r.files.window[key], "knee at 512")
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultKept))

	acts = r.run(30, held)
	probes := filter(acts, KindFileWindowUndo, ResultTrial)
	require.Len(t, probes, 1, "one re-probe once the window was kept for ReprobeAfter")
	assert.Contains(t, probes[0].Evidence, "re-probe")
	var undone []Action
	for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
		if strings.Contains(a.Evidence, "re-probe") {
			undone = append(undone, a)
		}
	}
	require.Len(t, undone, 1)
	assert.Equal(t, 512, undone[0].FromKB)
	assert.Equal(t, 128, undone[0].ToKB)
	assert.Equal(t, 128, r.files.window[key])
	assert.Empty(t, r.tn.Status().Files, "the decision ended")
	assert.Equal(t, 128, r.sys.get("sdb"))
}

func TestReprobePutsTheWindowBackWhileTheRegimeLasts(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true, Grace: time.Hour, ReprobeAfter: 20 * time.Second, BackoffMax: time.Minute}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	slowed := func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) }
	r.run(5, slowed)
	require.Equal(t, 512, r.files.window[key])

	var probesAt []time.Duration
	var atBase int
	for i := 0; i < 150; i++ {
		r.clk.Advance(time.Second)
		for _, a := range r.tn.Step(slowed()) {
			if a.Kind == KindFileWindowUndo && a.Result == ResultTrial {
				probesAt = append(probesAt, a.Time)
			}
			if a.Kind == KindFileWindow && a.Result == ResultTrial && a.FromKB == 128 {
				t.Fatalf("no escalation from the probe's base window: %+v", a)
			}
		}
		if r.files.window[key] == 128 {
			atBase++
		}
	}
	require.GreaterOrEqual(t, len(probesAt), 3)
	// Each probe holds 5 s; the period doubles after each: 40 s, then 60 s
	// (capped at BackoffMax). The second probe falls due while the knee's
	// own probe (one step up, once a minute) is on trial and waits for its
	// verdict: one interval later.
	assert.Equal(t, []time.Duration{46 * time.Second, 65 * time.Second}, []time.Duration{probesAt[1] - probesAt[0], probesAt[2] - probesAt[1]})
	assert.Equal(t, 512, r.files.window[key], "the kept window is back after each probe")
	assert.LessOrEqual(t, atBase, 5*len(probesAt), "only the probes' intervals ran at the base window")
	assert.NotEmpty(t, r.tn.Status().Files)
}

func TestEventsQueuedBeforeAPinDoNotRepinTheSameReader(t *testing.T) {
	r, p, key := shiftedReader(t, 1)
	require.Equal(t, 256, r.files.window[key])
	pinnedAt := r.clk.Now()
	dups := r.files.dups
	// An event the reader emitted just before the pin, read afterwards.
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Time: pinnedAt - time.Millisecond, Tgid: 100, File: key, Device: sdb, RaPages: 32})
	assert.Empty(t, r.tn.applyPending(), "no second pin for the same descriptor")
	assert.Equal(t, dups, r.files.dups)
	// A descriptor opened after the pin (HDFS opens a block file per read).
	r.clk.Advance(10 * time.Millisecond)
	r.files.open(100, 8, p, key)
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Time: r.clk.Now(), Tgid: 100, File: key, Device: sdb, RaPages: 32})
	acts := r.tn.applyPending()
	require.Len(t, filter(acts, KindFileWindow, ResultApplied), 1)
}

func TestNoWindowForARandomReader(t *testing.T) {
	r := newRig(t, Config{}, nil)
	// A bigger window makes a random mmap reader's faults read more, so its
	// busy throughput rises: the loop must not get to see that.
	r.tput = func(kb int) float64 { return float64(kb) * 1e5 }
	p, key := realFile(t, filepath.Join(r.dir, "data"), "index")
	r.reader(100, 7, p, key)
	acts := r.run(10, func() detector.Snapshot {
		s := r.snap(detector.ExtentStart, key)
		s.Files[0].Sequentiality = 0.05
		return s
	})
	assert.Empty(t, acts)
	assert.Equal(t, 128, r.files.window[key])
	assert.Empty(t, r.sys.writes)
}

func TestNoFurtherStepOrPrefetchOnceAtTheDevicesCapacity(t *testing.T) {
	r := newRig(t, Config{}, nil)
	r.tput = kneeModel // 150 MB/s at 512 KB, 155 at 1024
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	mk := func() detector.Snapshot {
		s := r.snap(detector.FileLatencyShift, key)
		s.Devices[0].CapacityBPS = 155e6
		s.Files[0].P95 = 3 * time.Millisecond
		return s
	}
	acts := r.run(10, mk)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "one step to 512 KB; 150 MB/s is over 95%% of 155 MB/s (half the margin short of it): no 1024 KB trial")
	assert.Equal(t, 512, trials[0].ToKB)
	assert.Len(t, filter(acts, KindFileWindow, ResultKept), 1)
	assert.Empty(t, filter(acts, KindPrefetch, ResultTrial), "no prefetch trial at capacity")
	assert.Equal(t, 512, r.files.window[key])
}

// fastPathRegime is a rig with one open file (kneeModel) and what
// detector.FastPath returns between Steps for it freshly slowed: busy
// throughput busy, median p50 and p95 p95, on a 150 MB/s device.
func fastPathRegime(t *testing.T, busy float64, p50, p95 time.Duration) (*rig, probe.FileKey, detector.Snapshot) {
	t.Helper()
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_7")
	r.reader(100, 7, p, key)
	r.clk.Advance(300 * time.Millisecond)
	fast := detector.Snapshot{Now: r.clk.Now(),
		Devices: []detector.DeviceStats{{Device: sdb, CapacityBPS: 150e6}},
		Files: []detector.FileStats{{Key: key, Device: sdb, BusyThroughput: busy, Sequentiality: 1, LastSeen: r.clk.Now(),
			P50: p50, P95: p95}},
		Regimes: []detector.Regime{{Kind: detector.FileLatencyShift, Device: sdb, File: key, Evidence: "fast path: test"}}}
	return r, key, fast
}

func TestFastPathRegimeGetsItsLittlesLawStepAtOnce(t *testing.T) {
	r, key, fast := fastPathRegime(t, 45e6, 4200*time.Microsecond, 5900*time.Microsecond)
	acts := r.tn.fastOn(fast, detector.Snapshot{}, 0)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1)
	// 5.9 ms x 150 MB/s = 864 KB in flight: straight to 1024 KB.
	assert.Equal(t, [2]int{128, 1024}, [2]int{trials[0].FromKB, trials[0].ToKB})
	assert.Equal(t, 1024, r.files.window[key])
	// A second fast report of the same file does nothing more.
	assert.Empty(t, r.tn.fastOn(fast, detector.Snapshot{}, 0))
	// The next Steps judge it as any trial (kept: 155 MB/s against 45).
	acts = r.run(2, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	kept := filter(acts, KindFileWindow, ResultKept)
	require.Len(t, kept, 1)
	assert.Equal(t, 1024, kept[0].ToKB)
}

// The fast path enters a regime on a file's last requests, a moment after
// the onset: measured over a span mostly before it, the file still reads
// at the device's capacity. Its step is taken all the same.
func TestFastPathRegimeRightAfterTheOnsetIsNotHeldAtCapacity(t *testing.T) {
	r, _, fast := fastPathRegime(t, 146e6, 1700*time.Microsecond, 4400*time.Microsecond)
	trials := filter(r.tn.fastOn(fast, detector.Snapshot{}, 0), KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "the step, not held at capacity")
	assert.Greater(t, trials[0].ToKB, 128)
}

func TestDeviceWideStepNeedsTheLargerMargin(t *testing.T) {
	r := newRig(t, Config{}, nil)
	mk := func() detector.Snapshot {
		tput := 100e6
		if r.sys.get("sdb") >= 256 {
			tput = 115e6 // +15%: enough for a file, not for the whole device
		}
		return detector.Snapshot{Now: r.clk.Now(),
			Devices: []detector.DeviceStats{{Device: sdb, BusyThroughput: tput}},
			Regimes: []detector.Regime{{Kind: detector.TailInflation, Device: sdb, Evidence: "p99 up"}}}
	}
	acts := r.run(2, mk)
	assert.Len(t, filter(acts, KindDeviceWindow, ResultTrial), 1)
	assert.Empty(t, filter(acts, KindDeviceWindow, ResultKept))
	undone := filter(acts, KindDeviceWindowUndo, ResultUndone)
	require.Len(t, undone, 1)
	assert.Contains(t, undone[0].Evidence, "keep margin +20%")
	assert.Equal(t, 128, r.sys.get("sdb"))
}

func TestContentionGivesSequentialFilesTheClosedLoop(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = func(kb int) float64 { return 17e6 * float64(kb) / 128 } // more queued, more share
	pSeq, seq := realFile(t, filepath.Join(r.dir, "data"), "fg.dat")
	pRnd, rnd := realFile(t, filepath.Join(r.dir, "data"), "random.dat")
	r.reader(100, 7, pSeq, seq)
	r.reader(101, 8, pRnd, rnd)
	mk := func() detector.Snapshot {
		s := r.snap("", seq, rnd)
		s.Files[1].Sequentiality = 0.05
		s.Regimes = []detector.Regime{{Kind: detector.Contention, Device: sdb, Evidence: "3 readers"}}
		return s
	}
	acts := r.run(3, mk)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.NotEmpty(t, trials)
	for _, a := range trials {
		assert.Equal(t, seq, a.File, "only the sequential file")
	}
	assert.NotEmpty(t, filter(acts, KindFileWindow, ResultKept))
	assert.Greater(t, r.files.window[seq], 128)
	assert.Equal(t, 128, r.files.window[rnd])
	assert.Equal(t, 128, r.sys.get("sdb"), "no device-wide change")
}

func TestActionsAreLoggedAtInfoWithEvidenceAndReapplicationsNotListed(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tn.log = slog.New(slog.NewJSONHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	mk := func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) }
	r.run(2, mk)
	// The same process opens the file again: the kept window reaches it.
	r.files.open(100, 9, p, key)
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 100, File: key, Device: sdb, RaPages: 32})
	applied := filter(r.tn.applyPending(), KindFileWindow, ResultApplied)
	require.Len(t, applied, 1)
	st := r.tn.Status()
	assert.Equal(t, uint64(1), st.Counts["file_window/applied"])
	for _, a := range st.Recent {
		assert.NotEqual(t, ResultApplied, a.Result, "re-applications are counted, not listed")
	}
	assert.NotEmpty(t, filter(st.Recent, KindFileWindow, ResultKept))
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	assert.Contains(t, out, `"level":"INFO","msg":"tuner: action"`)
	assert.Contains(t, out, `"result":"trial"`)
	assert.Contains(t, out, `"result":"kept"`)
	assert.Contains(t, out, `"evidence":"regimes [file_latency_shift]`)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// readOnlySys refuses every write, as a read-only /sys does.
type readOnlySys struct{ *fakeSys }

func (r readOnlySys) SetReadAheadKB(name string, kb int) error {
	return &os.PathError{Op: "open", Path: "/sys/block/" + name + "/queue/read_ahead_kb", Err: unix.EROFS}
}

func TestRestoreWritesNothingWhenNothingChanged(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	ro := readOnlySys{r.sys}
	var err error
	r.tn, err = New(Config{DisablePrefetch: true, AllowPaths: []string{filepath.Join(r.dir, "data")}},
		Deps{Sysfs: ro, Files: r.files, Clock: r.clk, Store: r.store, Logger: quiet()})
	require.NoError(t, err)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	acts := r.run(2, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultFailed), "the raise is refused")
	require.NotEmpty(t, r.store.Entries(), "the original was recorded before the write was tried")
	assert.NoError(t, r.tn.RestoreAll(), "read_ahead_kb is still the original: nothing to restore")
	assert.Empty(t, r.store.Entries())
	assert.Equal(t, 128, r.sys.get("sdb"))
}

// shiftedReader is a rig with one reader (pid 100, fd 7) of a file under
// a FileLatencyShift, stepped n intervals on the knee model.
func shiftedReader(t *testing.T, n int) (*rig, string, probe.FileKey) {
	t.Helper()
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	r.run(n, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	return r, p, key
}

func TestPinnedWindowsAreRecordedAndResetAfterACrash(t *testing.T) {
	r, p, key := shiftedReader(t, 4)
	require.Equal(t, 512, r.files.window[key])
	pins := r.store.Pins()
	require.Len(t, pins, 1, "the open file's window outlives a SIGKILL: recorded")
	assert.Equal(t, state.Pin{PID: 100, FD: 7, Dev: uint32(key.Dev), Ino: key.Ino, Device: "sdb", WindowKB: 512, Path: p, PinnedAt: pins[0].PinnedAt}, pins[0])

	// The daemon dies here. The next one (same state directory) resets the
	// open file to the device's window before anything else.
	calls := len(r.files.calls)
	_, err := New(Config{AllowPaths: []string{filepath.Join(r.dir, "data")}}, Deps{Sysfs: r.sys, Files: r.files, Clock: r.clk, Store: r.store, Logger: quiet()})
	require.NoError(t, err)
	require.Len(t, r.files.calls, calls+1)
	assert.Equal(t, actuate.AdviceNormal, r.files.calls[calls].advice)
	assert.Equal(t, 7, r.files.calls[calls].ref.FD)
	assert.Equal(t, 128, r.files.window[key])
	assert.Empty(t, r.store.Pins())
}

func TestUndoClearsPinsAndGoneReadersAreForgotten(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	r.reader(101, 4, p, key)
	r.run(3, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	require.Len(t, r.store.Pins(), 2)
	// One reader exits; the other's window is undone on shutdown.
	r.files.gone[101] = true
	require.NoError(t, r.tn.RestoreAll())
	assert.Empty(t, r.store.Pins(), "undone and gone readers leave no record")
	assert.Equal(t, 128, r.files.window[key])

	// A record whose reader is gone is dropped by RestorePins.
	require.NoError(t, r.store.UpdatePins([]state.Pin{{PID: 101, FD: 4, Dev: uint32(key.Dev), Ino: key.Ino, Device: "sdb", WindowKB: 512}}, nil))
	res, err := actuate.RestorePins(r.store, r.files, r.tn.scope, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, actuate.PinsRestored{Gone: 1}, res)
	assert.Empty(t, r.store.Pins())
}

func TestShutdownWithoutPerFileStateResetsPinsWithoutABreak(t *testing.T) {
	// A record the undos did not reach (its reader not in the tuner's
	// table) is reset at shutdown; without the kernel's per-file state
	// (no Deps.States) with POSIX_FADV_NORMAL alone: a break could not be
	// checked, and would leave the file unconfirmed.
	r := newRig(t, Config{}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	r.files.window[key] = 512
	require.NoError(t, r.store.UpdatePins([]state.Pin{{PID: 100, FD: 7, Dev: uint32(key.Dev), Ino: key.Ino, Device: "sdb", WindowKB: 512, Path: p}}, nil))
	require.NoError(t, r.tn.RestoreAll())
	assert.Empty(t, r.store.Pins())
	assert.Equal(t, 128, r.files.window[key])
	for _, c := range r.files.calls {
		assert.Equal(t, 128, c.devKB, "read_ahead_kb untouched: no break")
	}
}

func TestDeviceWideWindowReachesFilesAlreadyOpen(t *testing.T) {
	// A reader holds its file open while the device slows down for
	// everyone (tail inflation): the device's new window would only reach
	// files opened later, so it is given to the open file too, and taken
	// back with the device's.
	r := newRig(t, Config{Grace: 2 * time.Second}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	var rnd probe.FileKey
	_, rnd = realFile(t, filepath.Join(r.dir, "data"), "index")
	r.reader(101, 5, p, rnd)
	regime := true
	mk := func() detector.Snapshot {
		s := detector.Snapshot{Now: r.clk.Now(),
			Devices: []detector.DeviceStats{{Device: sdb, BusyThroughput: map[bool]float64{false: 100e6, true: 130e6}[r.files.window[key] >= 256]}},
			Files: []detector.FileStats{
				{Key: key, Device: sdb, Sequentiality: 1, LastSeen: r.clk.Now(), BusyThroughput: 100e6, P50: time.Millisecond},
				{Key: rnd, Device: sdb, Sequentiality: 0.01, LastSeen: r.clk.Now(), BusyThroughput: 1e6, P50: time.Millisecond}}}
		if regime {
			s.Regimes = []detector.Regime{{Kind: detector.TailInflation, Device: sdb, Evidence: "p99 up"}}
		}
		return s
	}
	acts := r.run(2, mk)
	reached := filter(acts, KindFileWindow, ResultApplied)
	require.NotEmpty(t, reached, "the open file gets the device's window")
	assert.Equal(t, key, reached[0].File)
	assert.Greater(t, r.sys.get("sdb"), 128)
	assert.Equal(t, r.sys.get("sdb"), r.files.window[key], "the open file follows the device's window")
	assert.Equal(t, 128, r.files.window[rnd], "a random reader's open file is left alone")
	assert.Len(t, filter(acts, KindDeviceWindow, ResultKept), 1, "judged on the device, with the open file reading faster")
	require.Len(t, r.store.Pins(), 1, "recorded: it outlives a crash")

	regime = false
	r.run(4, mk)
	assert.Equal(t, 128, r.sys.get("sdb"))
	assert.Equal(t, 128, r.files.window[key], "the open file is back at the device's original")
	assert.Empty(t, r.store.Pins())
}

func TestContentionAmongSequentialReadersIsLeftAlone(t *testing.T) {
	// Four clients of one server read four files and saturate the device
	// between them: a larger window would only take one's share from
	// another. With an outside reader (unattributed O_DIRECT traffic)
	// taking most of the device, the same files do get the closed loop.
	for _, c := range []struct {
		name       string
		outsideMB  uint64
		wantAction bool
	}{{"among the streams", 0, false}, {"an outside reader", 400, true}} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, Config{DisablePrefetch: true}, nil)
			r.tput = func(kb int) float64 { return 37e6 * float64(kb) / 128 }
			var keys []probe.FileKey
			for i := range 4 {
				p, k := realFile(t, filepath.Join(r.dir, "data"), fmt.Sprintf("blk_%d", i))
				r.reader(uint32(100), 7+i, p, k)
				keys = append(keys, k)
			}
			mk := func() detector.Snapshot {
				s := r.snap("", keys...)
				var sum uint64
				for i := range s.Files {
					s.Files[i].Bytes = 37 << 20
					sum += s.Files[i].Bytes
				}
				s.Devices[0].Bytes = sum + c.outsideMB<<20
				s.Regimes = []detector.Regime{{Kind: detector.Contention, Device: sdb, Evidence: "4 readers"}}
				return s
			}
			acts := r.run(3, mk)
			assert.Equal(t, c.wantAction, len(filter(acts, KindFileWindow, ResultTrial)) > 0, "%v", acts)
		})
	}
}

func TestTailInflationFirstDeviceStepHidesTheP99(t *testing.T) {
	// 20 ms stalls at 150 MB/s: a window under 3 MB leaves the reader
	// waiting; the first device step goes there at once.
	r := newRig(t, Config{}, nil)
	mk := func() detector.Snapshot {
		return detector.Snapshot{Now: r.clk.Now(),
			Devices: []detector.DeviceStats{{Device: sdb, BusyThroughput: 110e6, P99: 20 * time.Millisecond, CapacityBPS: 150e6}},
			Regimes: []detector.Regime{{Kind: detector.TailInflation, Device: sdb, Evidence: "p99 up"}}}
	}
	acts := r.run(1, mk)
	trials := filter(acts, KindDeviceWindow, ResultTrial)
	require.Len(t, trials, 1)
	assert.Equal(t, 4096, trials[0].ToKB, "p99 x capacity is about 2930 KB")
}

// Beside a pread reader (which no trim reaches) the same device step is
// sized by the reader's budget: each KB queued ahead delays its reads, and
// a 4 MB window cost s1-17's reader 12x its p99 in a 1 s trial.
func TestTailInflationBesideAPreadReaderStepsWithinItsBudget(t *testing.T) {
	r := newRig(t, Config{}, nil)
	_, rk := realFile(t, r.dir, "index")
	mk := func() detector.Snapshot {
		return detector.Snapshot{Now: r.clk.Now(),
			Devices: []detector.DeviceStats{{Device: sdb, BusyThroughput: 110e6, P99: 20 * time.Millisecond, CapacityBPS: 150e6}},
			Files:   []detector.FileStats{randomStats(rk, r.clk.Now(), 400, 2*time.Millisecond, 3*time.Millisecond, 32<<10)},
			Regimes: []detector.Regime{{Kind: detector.TailInflation, Device: sdb, Evidence: "p99 up"}}}
	}
	acts := r.run(3, mk)
	trials := filter(acts, KindDeviceWindow, ResultTrial)
	require.NotEmpty(t, trials, "%v", acts)
	for _, a := range trials {
		assert.LessOrEqual(t, a.ToKB, int(randGrowth*float64(a.FromKB)), "a step within the reader's budget, not the p99's 4 MB: %v", a)
	}
}

func TestFastPathContentionGetsTheSequentialFilesFirstStepAtOnce(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = func(kb int) float64 { return 17e6 * float64(kb) / 128 }
	pSeq, seq := realFile(t, filepath.Join(r.dir, "data"), "fg.dat")
	pRnd, rnd := realFile(t, filepath.Join(r.dir, "data"), "random.dat")
	r.reader(100, 7, pSeq, seq)
	r.reader(101, 8, pRnd, rnd)
	// A healthy Step first, then the fast path enters contention between
	// Steps with the device's files in its snapshot.
	r.run(1, func() detector.Snapshot { return r.snap("", seq, rnd) })
	r.clk.Advance(300 * time.Millisecond)
	fast := r.snap("", seq, rnd)
	fast.Files[1].Sequentiality = 0.05
	fast.Files[0].P95 = 20 * time.Millisecond
	fast.Devices[0].CapacityBPS = 150e6
	fast.Regimes = []detector.Regime{{Kind: detector.Contention, Device: sdb, Evidence: "fast path: 3 readers"}}
	acts := r.tn.fastOn(fast, detector.Snapshot{}, 0)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "%v", acts)
	assert.Equal(t, seq, trials[0].File)
	assert.Equal(t, 4096, trials[0].ToKB, "Little's law from the fast snapshot's p95 (20 ms x 150 MB/s)")
	assert.Equal(t, 128, r.files.window[rnd])
}

func TestTailInflationOnASaturatedDeviceStepsOneAtATime(t *testing.T) {
	// Busy at its capacity, the device's p99 is its queue: no jump.
	r := newRig(t, Config{}, nil)
	acts := r.run(1, func() detector.Snapshot {
		return detector.Snapshot{Now: r.clk.Now(),
			Devices: []detector.DeviceStats{{Device: sdb, BusyThroughput: 148e6, P99: 200 * time.Millisecond, CapacityBPS: 150e6}},
			Regimes: []detector.Regime{{Kind: detector.TailInflation, Device: sdb, Evidence: "p99 up"}}}
	})
	trials := filter(acts, KindDeviceWindow, ResultTrial)
	require.Len(t, trials, 1)
	assert.Equal(t, 256, trials[0].ToKB)
}

// A pins.json entry (forged, or left from a configuration with other
// allow-paths) naming a descriptor on a file outside the allow-paths is
// dropped without touching the open file.
func TestRestorePinsRefusesFilesOutOfScope(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	outPath, outKey := realFile(t, filepath.Join(r.dir, "outside"), "secret")
	inPath, inKey := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(200, 9, outPath, outKey)
	r.reader(201, 4, inPath, inKey)
	require.NoError(t, r.store.UpdatePins([]state.Pin{
		{PID: 200, FD: 9, Dev: uint32(outKey.Dev), Ino: outKey.Ino, Device: "sdb", WindowKB: 512, Path: filepath.Join(r.dir, "data", "blk_1")},
		{PID: 201, FD: 4, Dev: uint32(inKey.Dev), Ino: inKey.Ino, Device: "sdb", WindowKB: 512},
	}, nil))
	calls := len(r.files.calls)
	res, err := actuate.RestorePins(r.store, r.files, r.tn.scope, []string{"sdb"}, nil)
	require.NoError(t, err)
	assert.Equal(t, actuate.PinsRestored{Reset: 1, Refused: 1}, res)
	require.Len(t, r.files.calls, calls+1)
	assert.Equal(t, uint32(201), r.files.calls[calls].ref.Tgid)
	assert.Empty(t, r.store.Pins())

	// A pin on a disk the configuration does not tune is refused as well.
	require.NoError(t, r.store.UpdatePins([]state.Pin{{PID: 201, FD: 4, Dev: uint32(inKey.Dev), Ino: inKey.Ino, Device: "vda", WindowKB: 512}}, nil))
	res, err = actuate.RestorePins(r.store, r.files, r.tn.scope, []string{"sdb"}, nil)
	require.NoError(t, err)
	assert.Equal(t, actuate.PinsRestored{Refused: 1}, res)
}

// A kept prefetch keeps the stream ahead of the device whatever its window:
// the re-probe holds it off with the window, or the regime could never be
// seen to end and both would stay for good.
func TestReprobeTakesBackAKeptPrefetchWithTheWindow(t *testing.T) {
	r := newRig(t, Config{MaxKB: 256, Grace: time.Hour, ReprobeAfter: 20 * time.Second}, nil)
	prefetchedNow := false
	r.tput = prefetchPays(&prefetchedNow)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	willNeeds := func() int {
		n := 0
		for _, c := range r.files.calls {
			if c.advice == actuate.AdviceWillNeed {
				n++
			}
		}
		return n
	}
	// The detector holds the shift while the window or the prefetch is in
	// force (a saturated device), and clears it without either.
	var acts []Action
	step := func(regime func() detector.Snapshot) {
		before := willNeeds()
		r.clk.Advance(time.Second)
		acts = append(acts, r.tn.Step(regime())...)
		prefetchedNow = willNeeds() > before
	}
	for i := 0; i < 8; i++ {
		step(func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	}
	require.NotEmpty(t, filter(acts, KindPrefetch, ResultKept), "prefetch kept under the regime")
	require.Equal(t, 256, r.files.window[key])

	acts = nil
	var heldCalls []int
	for i := 0; i < 40; i++ {
		probing := r.files.window[key] == 128
		before := willNeeds()
		step(func() detector.Snapshot {
			if r.files.window[key] > 128 || prefetchedNow {
				return r.snap(detector.FileLatencyShift, key)
			}
			return r.snap("", key)
		})
		if probing {
			heldCalls = append(heldCalls, willNeeds()-before)
		}
	}
	require.Len(t, filter(acts, KindPrefetchUndo, ResultTrial), 1, "the re-probe holds the prefetch off")
	require.Len(t, filter(acts, KindFileWindowUndo, ResultTrial), 1)
	for _, n := range heldCalls {
		assert.Zero(t, n, "no prefetch issued while the re-probe holds")
	}
	assert.NotEmpty(t, filter(acts, KindFileWindowUndo, ResultUndone))
	assert.Equal(t, 128, r.files.window[key])
	assert.Empty(t, r.tn.Status().Files, "the decision ended")
}
