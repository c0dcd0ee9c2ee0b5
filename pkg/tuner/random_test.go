package tuner

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// runBeside steps n intervals of a stream with an mmap random reader of
// another file on the same device; rnd gives the random reader's requests
// per second and p95 for the stream's window.
func (r *rig) runBeside(n int, st stream, rnd func(kb int) (float64, time.Duration)) []Action {
	var all []Action
	rkey := probe.FileKey{Dev: st.key.Dev, Ino: st.key.Ino + 1}
	for i := 0; i < n; i++ {
		r.clk.Advance(time.Second)
		s := r.outcomeSnap(st)
		s.Devices[0].CapacityBPS = 150e6
		req, p95 := rnd(r.files.window[st.key])
		size := uint64(128 << 10) // its faults read around at the device's window
		if r.files.window[st.key] > 128 {
			size = 16 << 10 // trimmed beside the raised window
		}
		s.Files = append(s.Files, detector.FileStats{Key: rkey, Device: sdb, Requests: uint64(req), Bytes: uint64(req) * size,
			MeanSize: float64(size), Sequentiality: 0.01, P50: p95 / 2, P95: p95, P99: p95, LastSeen: s.Now})
		all = append(all, r.tn.Step(s)...)
	}
	return all
}

func TestStepThatCostsARandomReaderBesideIsNotKept(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel // the stream gains at every step to 1024 KB
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	// Each window of the stream's queued transfers is waiting time for the
	// random reader's faults.
	rnd := func(kb int) (float64, time.Duration) {
		lat := time.Millisecond + time.Duration(kb/128)*870*time.Microsecond
		return float64(time.Second / lat), lat
	}
	acts := r.runBeside(10, stream{key: key, tgid: 100, fill: 0.9}, rnd)
	logActs(t, acts)
	undone := filter(acts, KindFileWindowUndo, ResultUndone)
	require.NotEmpty(t, undone)
	assert.Contains(t, undone[0].Evidence, "random readers beside it lost")
	assert.Empty(t, filter(acts, KindFileWindow, ResultKept))
	assert.Equal(t, 128, r.files.window[key])
}

func TestStepARandomReaderBesideDoesNotPayForIsKept(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	rnd := func(int) (float64, time.Duration) { return 600, 2 * time.Millisecond }
	acts := r.runBeside(6, stream{key: key, tgid: 100, fill: 0.9}, rnd)
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultKept))
	assert.Greater(t, r.files.window[key], 128)
}

// Steps that each cost the random reader a little must not add up: each is
// judged against the stream's base window too.
func TestSmallRandomReaderLossesDoNotAddUp(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true, MaxKB: 4096}, nil)
	r.tput = func(kb int) float64 { return float64(kb) * 0.25e6 } // every doubling pays
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	// 6% more latency per doubling: within randLatMax of the step before,
	// beyond it from the base window after two.
	rnd := func(kb int) (float64, time.Duration) {
		lat := 2 * time.Millisecond
		for w := 128; w < kb; w *= 2 {
			lat = lat * 106 / 100
		}
		return 600, lat
	}
	acts := r.runBeside(12, stream{key: key, tgid: 100, fill: 0.9}, rnd)
	logActs(t, acts)
	assert.LessOrEqual(t, r.files.window[key], 256)
	var fromBase bool
	for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
		if assert.Contains(t, a.Evidence, "random readers beside it lost") {
			fromBase = fromBase || strings.Contains(a.Evidence, "at the stream's base window") || strings.Contains(a.Evidence, "at the device's default window")
		}
	}
	assert.True(t, fromBase, "a step undone for the loss since the base window")
}

// The random reader's own trim makes its faults cheaper than the default
// window's: the stream may use that gain, up to what the random reader got
// from the default window (not what it gets since its trim).
func TestStreamMayUseWhatARandomReadersTrimGave(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	// At the default window the random reader does 600 faults/s at a 2 ms
	// p95; from the first step on it is trimmed (its faults cheaper), and
	// each doubling of the stream's window costs it 0.4 ms (a fault at a
	// time: its rate is one over its latency).
	trimmed := false
	rnd := func(kb int) (float64, time.Duration) {
		if !trimmed {
			return 600, 2 * time.Millisecond
		}
		lat := 800 * time.Microsecond
		for w := 128; w < kb; w *= 2 {
			lat += 400 * time.Microsecond
		}
		return float64(time.Second / lat), lat
	}
	r.runBeside(1, st, rnd) // seen at the default window; the first step
	trimmed = true
	acts := r.runBeside(8, st, rnd)
	logActs(t, acts)
	// 256 KB: 1.2 ms, 512 KB: 1.6 ms (625 faults/s: within 5% of 600,
	// p95 under 2.2 ms), 1024 KB: 2 ms (500 faults/s: a loss).
	assert.GreaterOrEqual(t, r.files.window[key], 512)
	for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
		assert.NotContains(t, a.Evidence, "before the step", "judged against the default window, not the trimmed reader")
	}
}

// The reference a random reader beside a stream is judged against: what the
// device's default window gave it when it was seen there, else none (the
// step's before-measure is used).
func TestRandomReaderReference(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	now := r.clk.Now()
	seq := probe.FileKey{Dev: 1, Ino: 10}
	rnd := probe.FileKey{Dev: 1, Ino: 11}
	r.tn.snap = detector.Snapshot{Now: now}
	r.tn.fstats = map[probe.FileKey]detector.FileStats{
		seq: {Key: seq, Device: sdb, Requests: 800, Bytes: 100e6, BusyThroughput: 100e6, Sequentiality: 1, LastSeen: now},
		rnd: {Key: rnd, Device: sdb, Requests: 1200, Bytes: 1200 * 16 << 10, MeanSize: 16 << 10, Sequentiality: 0.01, P95: time.Millisecond, LastSeen: now},
	}
	r.tn.dstats = map[probe.Dev]detector.DeviceStats{sdb: {Device: sdb, Bytes: 120e6}}
	m := r.tn.fileMeasure(seq)
	assert.Equal(t, 1200.0, m.randReq)
	assert.Zero(t, m.randDefReq, "never seen at the default window, not trimmed: no reference")

	r.tn.trims[rnd] = &trimDec{key: rnd}
	m = r.tn.fileMeasure(seq)
	assert.Zero(t, m.randDefReq, "trimmed, never seen at the default window: no reference")

	r.tn.randDefault = map[probe.FileKey]randRef{rnd: {req: 640, p99: 1900 * time.Microsecond, at: now}}
	m = r.tn.fileMeasure(seq)
	assert.Equal(t, 640.0, m.randDefReq, "what the default window gave it")
	assert.Equal(t, 1900*time.Microsecond, m.randDefP99)
	assert.Empty(t, randomLost(&ladder{}, measure{randReq: 620, randP99: 2 * time.Millisecond, randDefReq: 640, randDefP99: 1900 * time.Microsecond}))
	assert.NotEmpty(t, randomLost(&ladder{}, measure{randReq: 590, randP99: 2 * time.Millisecond, randDefReq: 640, randDefP99: 1900 * time.Microsecond}))
}

// A random reader whose read-around trim is coming: the step's verdict waits
// for it (its service changes with it), at most twice, then the step is
// judged like any other.
func TestStepBesideARandomReaderAwaitingItsTrimIsJudgedAfterIt(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	rkey := probe.FileKey{Dev: key.Dev, Ino: key.Ino + 1}
	var acts []Action
	for i := 0; i < 4; i++ {
		r.clk.Advance(time.Second)
		s := r.outcomeSnap(st)
		s.Devices[0].CapacityBPS = 150e6
		req := 600.0
		if r.files.window[key] > 128 {
			req = 300 // the stream's step costs it half its faults
		}
		// Faults read around their page: 128 KB each (its trim would
		// make them 16 KB; its descriptor is not found here, so none).
		s.Files = append(s.Files, detector.FileStats{Key: rkey, Device: sdb, Requests: uint64(req), Bytes: uint64(req) * 128 << 10,
			MeanSize: 128 << 10, Sequentiality: 0.01, P50: time.Millisecond, P95: 2 * time.Millisecond, P99: 2 * time.Millisecond, LastSeen: s.Now})
		acts = append(acts, r.tn.Step(s)...)
	}
	logActs(t, acts)
	undone := filter(acts, KindFileWindowUndo, ResultUndone)
	require.Len(t, undone, 1)
	trial := filter(acts, KindFileWindow, ResultTrial)[0]
	assert.Equal(t, 3*time.Second, undone[0].Time-trial.Time, "judged after two intervals' wait for the trim")
	assert.Contains(t, undone[0].Evidence, "random readers beside it lost")
	assert.Empty(t, filter(acts, KindFileWindow, ResultKept))
}

// A fresh stream beside a random reader the tuner has not yet seen at the
// default window waits for the next interval: that interval records what
// the default window gives the random reader, the reference of every later
// step beside it.
func TestFreshStreamWaitsForTheRandomReadersDefaultToBeSeen(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	rkey := probe.FileKey{Dev: key.Dev, Ino: key.Ino + 1}
	random := func(s detector.Snapshot) detector.Snapshot {
		s.Files = append(s.Files, detector.FileStats{Key: rkey, Device: sdb, Requests: 600, Bytes: 600 * 128 << 10,
			MeanSize: 128 << 10, Sequentiality: 0.01, P50: time.Millisecond, P95: 2 * time.Millisecond, LastSeen: s.Now})
		return s
	}
	r.clk.Advance(300 * time.Millisecond)
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 100, File: key, Device: sdb, RaPages: 32})
	r.clk.Advance(300 * time.Millisecond)
	keys, span := r.tn.FreshStreams()
	require.Len(t, keys, 1)
	assert.Empty(t, r.tn.FastOutcome(random(r.recentSnap(span, st)), span), "no first step before the random reader was seen at the default window")
	r.clk.Advance(400 * time.Millisecond)
	s := random(r.outcomeSnap(st))
	s.Devices[0].CapacityBPS = 150e6
	acts := r.tn.Step(s)
	logActs(t, acts)
	assert.Contains(t, r.tn.randDefault, rkey, "seen at the default window")
	assert.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial), "the step comes with that interval")
}

// Only a random reader whose faults read around at the device's window is a
// reference of what the default window gives: one whose open file still
// holds a trim reads 16 KB per fault and would make a cheap one.
func TestRandomDefaultIsRecordedOnlyForReadAroundFaults(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	now := r.clk.Now()
	big := probe.FileKey{Dev: 1, Ino: 20}
	small := probe.FileKey{Dev: 1, Ino: 21}
	r.tn.snap = detector.Snapshot{Now: now}
	r.tn.fstats = map[probe.FileKey]detector.FileStats{
		big:   {Key: big, Device: sdb, Requests: 600, MeanSize: 128 << 10, Sequentiality: 0.01, P95: 2 * time.Millisecond, LastSeen: now},
		small: {Key: small, Device: sdb, Requests: 1500, MeanSize: 16 << 10, Sequentiality: 0.01, P95: time.Millisecond, LastSeen: now},
	}
	r.tn.noteRandomDefaults(now)
	assert.Contains(t, r.tn.randDefault, big)
	assert.NotContains(t, r.tn.randDefault, small)
}
