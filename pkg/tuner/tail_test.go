package tuner

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// stallModel is a stream on a device whose latency comes and goes: every
// other second a share of its requests waits 10 ms more. Between stalls
// any window reads at the device's bandwidth; through them the reader's
// rate depends on how much of the stall its window covers.
type stallModel struct {
	tail bool // the stall shows in the stream's p99 (false: a steady stream)
}

func (sm stallModel) stats(kb int, stalled bool) (rate float64, p50, p99 time.Duration) {
	p50 = windowLat(kb)
	p99 = p50 * 11 / 10
	if !stalled {
		return 148e6, p50, p99
	}
	if sm.tail {
		p99 = p50 + 10*time.Millisecond
	}
	switch {
	case kb >= 2048:
		return 149e6, p50, p99
	case kb >= 1024:
		return 145e6, p50, p99
	case kb >= 512:
		return 135e6, p50, p99
	default:
		return 80e6, p50, p99
	}
}

// windowLat is a lab stream's median latency at window kb: its requests
// queue behind the window's others on a 150 MB/s channel.
func windowLat(kb int) time.Duration {
	return time.Duration(float64(1700*time.Microsecond) * float64(kb) / 128)
}

// streamSpan is a snapshot of one span of a stream read at window w (KB):
// its rate, latencies, and fill of its window in flight, alone on a device
// of 150 MB/s.
func streamSpan(key probe.FileKey, now time.Duration, w int, rate float64, p50, p99 time.Duration, fill float64) detector.Snapshot {
	b := uint64(rate)
	return detector.Snapshot{Now: now, Files: []detector.FileStats{{Key: key, Device: sdb, Requests: b / (128 << 10), Bytes: b,
		BusyThroughput: rate, Sequentiality: 1, NextOffset: 64 << 20, LastSeen: now, P50: p50, P95: p50, P99: p99,
		MeanSize: 128 << 10, Inflight: fill * float64(w) / 128}},
		Devices: []detector.DeviceStats{{Device: sdb, Bytes: b, BusyThroughput: rate, CapacityBPS: 150e6}}}
}

// tickStream advances the clock a second and reports blk_1's reader (tgid
// 100) reading key at its window now: the interval's end and that window.
func (r *rig) tickStream(key probe.FileKey) (time.Duration, int) {
	r.clk.Advance(time.Second)
	w := r.files.window[key]
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 100, File: key, Device: sdb, RaPages: uint32(w / 4)})
	return r.clk.Now(), w
}

// runStalls steps n intervals of a stream under sm, stalled in odd seconds
// (stalled reports the phase of each interval), with other files optional.
func (r *rig) runStalls(n int, sm stallModel, key probe.FileKey, extra ...detector.FileStats) []Action {
	var all []Action
	for i := 0; i < n; i++ {
		now, w := r.tickStream(key)
		stalled := int(now/time.Second)%2 == 1
		rate, p50, p99 := sm.stats(w, stalled)
		s := streamSpan(key, now, w, rate, p50, p99, 0.9)
		for _, f := range extra {
			f.LastSeen = now
			s.Files = append(s.Files, f)
		}
		all = append(all, r.tn.Step(s)...)
	}
	return all
}

// Whichever phase the stream's first interval falls in: a first step taken
// between stalls and judged through one looks like a loss against the
// stall-free rate before it.
// creepingClock advances a microsecond on every reading, as a real clock
// does between the start of a Step and its decisions.
type creepingClock struct{ f *clock.Fake }

func (c creepingClock) Now() time.Duration {
	c.f.Advance(time.Microsecond)
	return c.f.Now()
}

func TestStepOnAStreamWithATailIsKeptWhenItCostsNothing(t *testing.T) {
	for _, firstStalled := range []bool{true, false} {
		t.Run(map[bool]string{true: "first interval stalled", false: "first interval between stalls"}[firstStalled], func(t *testing.T) {
			r := newRig(t, Config{DisablePrefetch: true}, nil)
			// The daemon's clock moves on while a Step runs.
			tn, err := New(Config{FirstStepFactor: 4, DisablePrefetch: true, AllowPaths: []string{filepath.Join(r.dir, "data")}}, Deps{Sysfs: r.sys, Files: r.files, Clock: creepingClock{r.clk}, Store: r.store, Logger: quiet()})
			require.NoError(t, err)
			r.tn = tn
			if !firstStalled {
				r.clk.Advance(time.Second)
			}
			p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
			r.files.open(100, 7, p, key)
			acts := r.runStalls(12, stallModel{tail: true}, key)
			logActs(t, acts)
			require.NotEmpty(t, filter(acts, KindFileWindow, ResultKept))
			assert.GreaterOrEqual(t, r.files.window[key], 1024, "the window covers the stalls")
			for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
				assert.GreaterOrEqual(t, a.ToKB, 1024, "no step below the tail's window undone: %s", a.Evidence)
			}
			// Once there, it stays: every later verdict keeps it.
			var at []int
			for i := 0; i < 10; i++ {
				r.runStalls(1, stallModel{tail: true}, key)
				at = append(at, r.files.window[key])
			}
			for _, w := range at {
				assert.GreaterOrEqual(t, w, 1024, "windows after: %v", at)
			}
		})
	}
}

// The same stream without the evidence of a tail in its requests: a step
// judged in a stall-free interval against a stalled one (or the reverse)
// is undone as often as not, and nothing is kept for the stalls.
func TestStepOnASteadyStreamMustPayItsMargin(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	acts := r.runStalls(12, stallModel{tail: false}, key)
	logActs(t, acts)
	assert.Zero(t, r.tn.Status().Events[EvTailKept])
	for _, a := range filter(acts, KindFileWindow, ResultKept) {
		assert.NotContains(t, a.Evidence, "tail", "every kept step paid its margin")
	}
}

// Beside a random reader every step must pay: its faults wait behind each
// window of the stream's queued transfers.
func TestNoTailKeepBesideARandomReader(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	random := detector.FileStats{Key: probe.FileKey{Dev: key.Dev, Ino: key.Ino + 1}, Device: sdb, Requests: 200,
		Bytes: 200 * 16 << 10, MeanSize: 16 << 10, Sequentiality: 0.01, P50: time.Millisecond}
	acts := r.runStalls(12, stallModel{tail: true}, key, random)
	logActs(t, acts)
	assert.Zero(t, r.tn.Status().Events[EvTailKept])
}

// A span of requests that mixes two windows is no tail: a reader that
// re-opens the file reads at the device's window until the event path pins
// the decision's window on it, and a larger window queues more, so the
// span's median is the small window's and its p99 the large one's.
func TestLatencySpreadOfTwoWindowsIsNoTail(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	var acts []Action
	fd := 8
	for i := 0; i < 12; i++ {
		w := r.files.window[key]
		r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 100, File: key, Device: sdb, RaPages: uint32(w / 4)})
		p50, p99 := windowLat(128), windowLat(128)*11/10
		r.clk.Advance(500 * time.Millisecond)
		if w > 128 {
			// Mid-interval the reader re-opens the file and reads at the
			// device's window until its first readahead event is seen.
			r.files.open(100, fd, p, key)
			fd++
			r.tn.ObserveReadahead(probe.ReadaheadEvent{Time: r.clk.Now(), Tgid: 100, File: key, Device: sdb, RaPages: 32})
			acts = append(acts, r.tn.applyPending()...)
			p99 = windowLat(w) * 11 / 10
		}
		r.clk.Advance(500 * time.Millisecond)
		now := r.clk.Now()
		// A healthy stream at the device's bandwidth at any window.
		acts = append(acts, r.tn.Step(streamSpan(key, now, w, 148e6, p50, p99, 0.9))...)
	}
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial), "the stream was tried")
	assert.Empty(t, filter(acts, KindFileWindow, ResultKept), "no step kept on a healthy stream at bandwidth")
	assert.Zero(t, r.tn.Status().Events[EvTailKept])
}

// Spans that are never free of stalls (a period the detector's interval
// does not divide): the step from a stall-free before-measure is judged on
// a span where part of the stream stalls. A step too small for the stall
// reads slower than the stall-free before; it is resized to the window the
// tail needs and judged again, rather than undone.
func TestStepTooSmallForTheTailIsResizedToIt(t *testing.T) {
	r := newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	// Through a stall: what the window covers of 10 ms more on a share
	// of the requests.
	stalled := func(kb int) float64 { return min(148e6, 20e6*float64(kb)/128) }
	var acts []Action
	for i := 0; i < 10; i++ {
		now, w := r.tickStream(key)
		rate, p99 := 148e6, windowLat(w)*11/10
		if i > 0 { // half of every span after the first stalls
			rate, p99 = (148e6+stalled(w))/2, windowLat(w)+10*time.Millisecond
		}
		acts = append(acts, r.tn.Step(streamSpan(key, now, w, rate, windowLat(w), p99, 0.9))...)
	}
	logActs(t, acts)
	var resized []Action
	for _, a := range filter(acts, KindFileWindow, ResultTrial) {
		if strings.Contains(a.Evidence, "resized to the stream's tail") {
			resized = append(resized, a)
		}
	}
	require.NotEmpty(t, resized)
	assert.GreaterOrEqual(t, r.files.window[key], 2048)
	for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
		assert.GreaterOrEqual(t, a.ToKB, 2048, "no step below the tail's window undone: %s", a.Evidence)
	}
}

// runSpread steps n intervals of a healthy stream at the device's
// bandwidth whose p99 is 1.1x its median, but tenths/10 x in span odd.
func (r *rig) runSpread(n int, key probe.FileKey, odd int, tenths time.Duration) []Action {
	var acts []Action
	for i := 0; i < n; i++ {
		now, w := r.tickStream(key)
		p99 := windowLat(w) * 11 / 10
		if i == odd {
			p99 = windowLat(w) * tenths / 10
		}
		acts = append(acts, r.tn.Step(streamSpan(key, now, w, 148e6, windowLat(w), p99, 1.9))...)
	}
	return acts
}

// A healthy stream's p99 strays now and then (a scheduling hiccup): one span
// with a p99 under tailStrong times the median is no tail, and a step that
// did not pay is undone as on any healthy stream.
func TestOneSpanOfModestSpreadIsNoTail(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	acts := r.runSpread(3, key, 1, 17) // the trial's span strays to 1.7x
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial))
	assert.Empty(t, filter(acts, KindFileWindow, ResultKept))
	assert.Equal(t, 128, r.files.window[key])
}

// At the device's window a healthy stream on a busy host strays further in
// one span (2.3x its median, a 2 ms hiccup at 1.7 ms, seen in CI): no tail
// either, the trial that follows is judged on its margin and undone.
func TestOneHiccupAtTheDevicesWindowIsNoTail(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	acts := r.runSpread(3, key, 0, 23) // the first span strays to 2.3x, at 128 KB
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial))
	assert.Empty(t, filter(acts, KindFileWindow, ResultKept))
	assert.NotEmpty(t, filter(acts, KindFileWindowUndo, ResultUndone))
	assert.Zero(t, r.tn.Status().Events[EvTailKept])
	assert.Equal(t, 128, r.files.window[key])

	// The same spread stands at tailStrongBase and more for a stall: a
	// tail from one span.
	r2 := newRig(t, Config{DisablePrefetch: true}, nil)
	p2, key2 := realFile(t, filepath.Join(r2.dir, "data"), "blk_2")
	r2.files.open(100, 7, p2, key2)
	r2.clk.Advance(time.Second)
	r2.tn.Step(streamSpan(key2, r2.clk.Now(), 128, 148e6, windowLat(128), windowLat(128)*31/10, 1.9))
	_, ok := r2.tn.tailOf(key2)
	assert.True(t, ok, "3.1x at the device's window is a tail in one span")
}

// A stream's first trial, judged between stalls, did not pay and the
// device's outcome trials back off; a tail that shows afterwards and needs
// more than that trial tried is new evidence: the next trial comes at once.
func TestTailSeenAfterAFailedTrialEndsTheBackoff(t *testing.T) {
	r := newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true, BackoffBase: 8 * time.Second}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	sm := stallModel{tail: true}
	step := func(stalled bool) []Action {
		now, w := r.tickStream(key)
		rate, p50, p99 := sm.stats(w, stalled)
		return r.tn.Step(streamSpan(key, now, w, rate, p50, p99, 0.9))
	}
	acts := append(step(false), step(false)...)
	logActs(t, acts)
	require.Len(t, filter(acts, KindFileWindowUndo, ResultUndone), 1, "the first trial, between stalls, did not pay")
	acts = step(true) // the first stall at the device's window: a tail
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "a trial at once, not after the 8 s back-off")
	assert.GreaterOrEqual(t, trials[0].ToKB, 1024, "sized by the tail (80 MB/s x 11.7 ms)")
}

// A healthy stream at the device's bandwidth whose p99 is about twice its
// median at every window (its own requests queued in the device, as on the
// lab): the spread costs it nothing, so a step that gains nothing is undone,
// not kept for a tail's sake (the healthy bench kept 512 KB so).
func TestQueueSpreadAtTheDevicesBandwidthKeepsNoStep(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	key, acts := r.runSpreadModel(t, 12, func(w int) (float64, time.Duration) { return 147.5e6, 2 * windowLat(w) })
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial), "the stream was tried")
	assert.Empty(t, filter(acts, KindFileWindow, ResultKept), "no step kept on a healthy stream at bandwidth")
	assert.Zero(t, r.tn.Status().Events[EvTailKept])
	assert.Equal(t, 128, r.files.window[key])
}

// A healthy stream a little below the device's peak rate at its window (a
// busy host: 130 MB/s against 150), whose p99 is about twice its median
// there in every span: that spread is its own queue's, no stall, and no
// window is kept for it (CI kept 1024 KB so on "p99 3.8ms at p50 1.7ms",
// and the re-probe never took it back). The 1024 KB trial reads 141 MB/s
// at 8x the median: the device saturates there, and that fresh saturation
// point is its capacity, not the peak; the smallest step, 256 KB, reads at
// it and is kept at half the margin (a step to the capacity).
func TestHealthySpreadBelowTheDevicesBandwidthKeepsNoStep(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	key, acts := r.runSpreadModel(t, 12, func(w int) (float64, time.Duration) {
		if w <= 128 {
			return 130e6, windowLat(w) * 22 / 10
		}
		return 141e6, windowLat(w) * 12 / 10
	})
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial), "the stream was tried")
	require.NotEmpty(t, filter(acts, KindFileWindowUndo, ResultUndone), "the 1024 KB trial was undone")
	for _, a := range filter(acts, KindFileWindow, ResultKept) {
		assert.LessOrEqual(t, a.ToKB, 256, "only the step to the saturation point is kept")
		assert.Contains(t, a.Evidence, "by its saturation")
	}
	assert.Zero(t, r.tn.Status().Events[EvTailKept])
	assert.LessOrEqual(t, r.files.window[key], 256)
}

// A lone stream that a mild slowdown (extent starts on the lab: 137 MB/s at
// the device's window, 150 at any from 512 KB) holds 8% under the device's
// capacity: a step that takes it to the capacity pays at half the margin
// (its first, judged on the stream's start, is taken again measured whole),
// and is no tail's keep. Beside a random reader the full margin stands: the
// stream, within 10% of the capacity, is not tried.
func TestLoneStreamTakenToTheDevicesCapacityIsKeptAtHalfTheMargin(t *testing.T) {
	model := func(w int) (float64, time.Duration) {
		if w <= 128 {
			return 137e6, windowLat(w) * 22 / 10
		}
		return 149e6, windowLat(w) * 12 / 10
	}
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	key, acts := r.runSpreadModel(t, 12, model)
	kept := filter(acts, KindFileWindow, ResultKept)
	require.NotEmpty(t, kept, "the step to the device's capacity is kept")
	assert.Contains(t, kept[0].Evidence, "half the margin: the stream alone reads at the device's capacity")
	assert.Zero(t, r.tn.Status().Events[EvTailKept])
	assert.Greater(t, r.files.window[key], 128)

	r = newRig(t, Config{DisablePrefetch: true}, nil)
	rnd := randomStats(probe.FileKey{Dev: sdb, Ino: 77}, 0, 600, 2*time.Millisecond, 2600*time.Microsecond, 128<<10)
	key, acts = r.runSpreadModel(t, 12, model, rnd)
	assert.Empty(t, filter(acts, KindFileWindow, ResultKept), "beside a random reader the full margin")
	assert.Equal(t, 128, r.files.window[key])
}

// The same mild slowdown begun under the daemon's eyes: a stream at the
// device's capacity drops to 137 MB/s of 150 and the detector reports its
// extent starts. Within 10% of the capacity, the stream is tried all the
// same (half the margin is left to gain) and the step is kept.
func TestMildRegimeOnALoneStreamAtNinetyPercentIsTried(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	var acts []Action
	for i := 0; i < 14; i++ {
		now, w := r.tickStream(key)
		rate := 149.5e6
		if i >= 4 && w <= 128 {
			rate = 137e6
		}
		s := streamSpan(key, now, w, rate, windowLat(w), windowLat(w)*12/10, 0.9)
		if i >= 4 {
			s.Regimes = []detector.Regime{{Kind: detector.ExtentStart, Device: sdb, File: key, Evidence: "test"}}
		}
		acts = append(acts, r.tn.Step(s)...)
	}
	logActs(t, acts)
	kept := filter(acts, KindFileWindow, ResultKept)
	require.NotEmpty(t, kept, "tried at 91% of the capacity, kept at half the margin")
	assert.Contains(t, kept[0].Evidence, "half the margin")
	assert.Greater(t, r.files.window[key], 128)
}

// runSpreadModel opens blk_1 and steps n intervals of a stream whose rate
// and p99 at window w are model(w) (its median windowLat(w)).
func (r *rig) runSpreadModel(t *testing.T, n int, model func(w int) (float64, time.Duration), extra ...detector.FileStats) (probe.FileKey, []Action) {
	t.Helper()
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	var acts []Action
	for i := 0; i < n; i++ {
		now, w := r.tickStream(key)
		rate, p99 := model(w)
		s := streamSpan(key, now, w, rate, windowLat(w), p99, 0.9)
		for _, f := range extra {
			f.LastSeen = now
			s.Files = append(s.Files, f)
		}
		acts = append(acts, r.tn.Step(s)...)
	}
	logActs(t, acts)
	return key, acts
}
