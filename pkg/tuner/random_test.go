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

// severeAbove256: a random reader whose faults come 2.7x fewer and 4x
// slower once the stream beside it reads with a window above 256 KB.
func severeAbove256(kb int) (float64, time.Duration) {
	if kb > 256 {
		return 330, 8 * time.Millisecond
	}
	return 880, 2 * time.Millisecond
}

// A step that cost the random reader beside the stream far more than an
// interval's noise (its faults 2.7x fewer) leaves a knee that is not probed
// again two seconds later: every probe is a second of that loss for it.
func TestSevereRandomLossHoldsTheKnee(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	acts := r.runBeside(20, stream{key: key, tgid: 100, fill: 0.9}, severeAbove256)
	logActs(t, acts)
	var past []Action
	for _, a := range filter(acts, KindFileWindow, ResultTrial) {
		if a.ToKB > 256 {
			past = append(past, a)
		}
	}
	require.NotEmpty(t, past)
	assert.Len(t, past, 1, "one trial past 256 KB, not its confirmation")
	assert.Equal(t, 256, r.files.window[key])
}

// A stream at its window's knee beside a random reader gets no prefetch:
// the prefetched ranges queue ahead of the random reader's faults as a
// larger window would. Alone on the device, the same stream gets it.
func TestNoPrefetchBesideARandomReader(t *testing.T) {
	for _, beside := range []bool{true, false} {
		r := newRig(t, Config{}, nil)
		r.tput = func(kb int) float64 { return min(float64(kb)*0.4e6, 110e6) } // a knee at 256 KB
		p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
		r.files.open(100, 7, p, key)
		st := stream{key: key, tgid: 100, fill: 0.9}
		var acts []Action
		if beside {
			acts = r.runBeside(12, st, func(int) (float64, time.Duration) { return 600, 2 * time.Millisecond })
		} else {
			acts = r.runOutcome(12, st)
		}
		logActs(t, acts)
		require.NotEmpty(t, filter(acts, KindFileWindowUndo, ResultUndone), "the window found its knee")
		if beside {
			assert.Empty(t, filter(acts, KindPrefetch, ResultTrial), "no prefetch beside the random reader")
		} else {
			assert.NotEmpty(t, filter(acts, KindPrefetch, ResultTrial), "prefetch when alone")
		}
	}
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
			fromBase = fromBase || strings.Contains(a.Evidence, "at the stream's base window")
		}
	}
	assert.True(t, fromBase, "a step undone for the loss since the base window")
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

// A trim that lands while a stream's step is under trial changes what the
// random reader's requests are (16 KB instead of its read-around each): its
// requests per second before the step are no reference for after it. The
// step is judged on the stream's own gain, and the next one against the
// trimmed reader beside the kept window.
func TestTrimDuringAStepIsNoRandomLoss(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	rp, rkey := realFile(t, filepath.Join(r.dir, "data"), "index")
	r.files.open(200, 9, rp, rkey)
	st := stream{key: key, tgid: 100, fill: 0.9}
	var acts []Action
	for i := 0; i < 8; i++ {
		r.clk.Advance(time.Second)
		s := r.outcomeSnap(st)
		s.Devices[0].CapacityBPS = 150e6
		kb, rkb := r.files.window[key], r.files.window[rkey]
		// Untrimmed, each fault's read-around is several requests; trimmed,
		// one small one, and fewer of them the more the stream queues.
		req, size := 800.0, uint64(128<<10)
		if rkb < 128 {
			size = 16 << 10
			req = map[int]float64{128: 1000, 256: 340}[kb]
			if kb > 256 {
				req = 200
			}
		}
		s.Files = append(s.Files, detector.FileStats{Key: rkey, Device: sdb, Requests: uint64(req), Bytes: uint64(req) * size,
			MeanSize: float64(size), Sequentiality: 0.01, P50: time.Millisecond, P95: 2 * time.Millisecond, P99: 2 * time.Millisecond, LastSeen: s.Now})
		acts = append(acts, r.tn.Step(s)...)
	}
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindTrim, ResultTrial), "the random reader is trimmed beside the raised window")
	kept := filter(acts, KindFileWindow, ResultKept)
	require.NotEmpty(t, kept, "the step the trim landed under is judged on the stream's gain")
	assert.Equal(t, 256, kept[0].ToKB)
	var lost bool
	for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
		lost = lost || (a.FromKB > 256 && strings.Contains(a.Evidence, "random readers beside it lost: 340 -> 200"))
	}
	assert.True(t, lost, "the next step answers to the trimmed reader beside the kept window")
	assert.Equal(t, 256, r.files.window[key])
}
