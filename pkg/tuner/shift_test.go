package tuner

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// shiftedRate is a stream on a file 1.5 ms slower per request than its
// device: the first step pays, the later ones gain 2-3% each (measured on
// the lab: 75, 130, 134, 137, 140, 142 MB/s from 128 KB to 4 MB).
var shiftedRate = rateSteps([]int{128, 256, 512, 1024, 2048, 4096}, []float64{75e6, 130e6, 134e6, 137e6, 140e6, 142e6})

// runShifted steps n intervals of the stream at its window; shifted says
// whether the detector reports the file's latency shift; rnd, if set,
// adds a random reader of another file on the device.
func (r *rig) runShifted(n int, key probe.FileKey, shifted bool, rnd func(kb int) (float64, time.Duration)) []Action {
	return r.runRated(n, key, shiftedRate, shifted, rnd)
}

func (r *rig) runRated(n int, key probe.FileKey, rateOf func(kb int) float64, shifted bool, rnd func(kb int) (float64, time.Duration)) []Action {
	var all []Action
	for i := 0; i < n; i++ {
		r.clk.Advance(time.Second)
		now := r.clk.Now()
		w := r.files.window[key]
		r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 100, File: key, Device: sdb, RaPages: uint32(w / 4)})
		rate := rateOf(w)
		// Two windows in flight (the async readahead's), at that rate.
		p50 := time.Duration(2 * float64(w<<10) / rate * float64(time.Second))
		s := streamSpan(key, now, w, rate, p50, p50*11/10, 0.9)
		if shifted {
			s.Regimes = append(s.Regimes, detector.Regime{Kind: detector.FileLatencyShift, Device: sdb, File: key, Evidence: "test"})
		}
		if rnd != nil {
			req, p95 := rnd(w)
			rkey := probe.FileKey{Dev: key.Dev, Ino: key.Ino + 1}
			s.Files = append(s.Files, randomStats(rkey, now, req, p95*6/10, p95, 16<<10))
		}
		all = append(all, r.tn.Step(s)...)
	}
	return all
}

// A file slower than its device: the steps that gain less than their
// margin but cost nothing are kept while the window still limits the
// stream, up to the window that covers its latency.
func TestStepOnAShiftedFileIsKeptWhenItCostsNothing(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true, MaxKB: 4096}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	acts := r.runShifted(10, key, true, nil)
	logActs(t, acts)
	// Up to the device's capacity (90% of its 150 MB/s).
	assert.GreaterOrEqual(t, r.files.window[key], 1024)
	assert.Positive(t, r.tn.Status().Events[EvShiftKept])
	assert.Empty(t, filter(acts, KindFileWindowUndo, ResultUndone))
}

// The same stream without the detector's word that its file is slow: its
// rate at the device's window (half the device's), measured over a whole
// interval, says it. (Measured over its start alone it would not: a healthy
// lab stream's start read 74 MB/s on a 150 MB/s device;
// TestStreamsStartIsNoSlowedBaseRate.)
func TestStepOnASlowedStreamIsKeptWithoutTheShiftRegime(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true, MaxKB: 4096}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	// Its first read two intervals before the first Step.
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Time: r.clk.Now(), Tgid: 100, File: key, Device: sdb, RaPages: 32})
	r.clk.Advance(time.Second)
	acts := r.runShifted(10, key, false, nil)
	logActs(t, acts)
	assert.GreaterOrEqual(t, r.files.window[key], 1024)
	assert.Positive(t, r.tn.Status().Events[EvShiftKept])
}

// A healthy stream, at the device's bandwidth at its window already, whose
// rate wanders by a few percent: each step must pay its margin.
func TestStepOnAHealthyStreamMustPayItsMargin(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true, MaxKB: 4096}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	rate := func(kb int) float64 {
		if kb > 128 {
			return 144e6
		}
		return 140e6
	}
	acts := r.runRated(10, key, rate, false, nil)
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial))
	assert.Equal(t, 128, r.files.window[key])
	assert.Zero(t, r.tn.Status().Events[EvShiftKept])
}

// A step that cost the stream something is not kept on a shifted file
// either; nor one the random reader beside it paid for.
func TestShiftedFileStepsStillAnswerToTheirCosts(t *testing.T) {
	t.Run("the stream lost", func(t *testing.T) {
		r := newRig(t, Config{DisablePrefetch: true, MaxKB: 4096}, nil)
		p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
		r.files.open(100, 7, p, key)
		var acts []Action
		for i := 0; i < 6; i++ {
			r.clk.Advance(time.Second)
			w := r.files.window[key]
			r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 100, File: key, Device: sdb, RaPages: uint32(w / 4)})
			// Past 512 KB each doubling costs it 1%.
			rate := shiftedRate(min(w, 512))
			for k := 1024; k <= w; k *= 2 {
				rate *= 0.99
			}
			p50 := time.Duration(2 * float64(w<<10) / rate * float64(time.Second))
			s := streamSpan(key, r.clk.Now(), w, rate, p50, p50*11/10, 0.9)
			s.Regimes = []detector.Regime{{Kind: detector.FileLatencyShift, Device: sdb, File: key, Evidence: "test"}}
			acts = append(acts, r.tn.Step(s)...)
		}
		logActs(t, acts)
		require.NotEmpty(t, filter(acts, KindFileWindowUndo, ResultUndone))
		assert.Equal(t, 512, r.files.window[key])
		assert.Zero(t, r.tn.Status().Events[EvShiftKept])
	})
	t.Run("a random reader beside it", func(t *testing.T) {
		r := newRig(t, Config{DisablePrefetch: true, MaxKB: 4096}, nil)
		p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
		r.files.open(100, 7, p, key)
		// Whether or not its requests show what the step cost it (a
		// step across a change of its trim has no reference), the step
		// must pay.
		rnd := func(int) (float64, time.Duration) { return 600, 2 * time.Millisecond }
		acts := r.runShifted(8, key, true, rnd)
		logActs(t, acts)
		// Beside it the steps are small (128 -> 160 KB): on this file they
		// gain nothing, and none is kept without its margin.
		assert.NotEmpty(t, filter(acts, KindFileWindowUndo, ResultUndone))
		assert.Empty(t, filter(acts, KindFileWindow, ResultKept))
		assert.Equal(t, 128, r.files.window[key])
		assert.Zero(t, r.tn.Status().Events[EvShiftKept])
	})
}
