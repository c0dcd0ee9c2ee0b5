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

// recentTick is one of the daemon's checks between Steps, after more: the
// streams list names and the span of recent requests to check them on,
// handed to judge with st's latency lat there (and, if n > 0, n requests
// of 128 KB in the span); nil when list names none.
func (r *rig) recentTick(after time.Duration, list func() ([]probe.FileKey, time.Duration),
	judge func(detector.Snapshot, time.Duration) []Action, st stream, lat time.Duration, n uint64) []Action {
	r.clk.Advance(after)
	keys, span := list()
	if len(keys) == 0 {
		return nil
	}
	s := r.recentSnap(span, st)
	if n > 0 {
		s.Files[0].Requests, s.Files[0].Bytes = n, n*128<<10
	}
	s.Files[0].P50, s.Files[0].P95, s.Files[0].P99 = lat, lat, lat
	s.Devices[0].CapacityBPS = 150e6
	return judge(s, span)
}

// onsetTick is the daemon's check between Steps for streams that slowed.
func (r *rig) onsetTick(after time.Duration, lat time.Duration, st stream) []Action {
	return r.recentTick(after, r.tn.onsetStreams, r.tn.fastOnset, st, lat, 0)
}

// bandwidthStream is a rig with one block file open and read at the
// device's bandwidth (150 MB/s at any window).
func bandwidthStream(t *testing.T) (*rig, stream) {
	t.Helper()
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = func(int) float64 { return 150e6 }
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	return r, stream{key: key, tgid: 100, fill: 0.9}
}

// healthyBackedOff is a stream at the device's bandwidth whose first trial
// did not pay: back at 128 KB, the device's outcome trials backing off.
func healthyBackedOff(t *testing.T) (*rig, stream) {
	t.Helper()
	r, st := bandwidthStream(t)
	key := st.key
	undone := false
	for i := 0; i < 6 && !undone; i++ {
		undone = len(filter(r.runOutcome(1, st), KindFileWindowUndo, ResultUndone)) > 0
	}
	require.True(t, undone, "a healthy trial did not pay")
	require.Equal(t, 128, r.files.window[key])
	return r, st
}

// A healthy stream backing off its outcome trials (they did not pay at the
// device's bandwidth) slows a moment after a Step: its step comes on its
// recent requests a quarter interval later, not at the next Step, straight
// to the window Little's law asks for, and the next Step one Settle after it
// judges it.
func TestStreamSlowedBetweenStepsIsSteppedAtOnce(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = func(int) float64 { return 150e6 } // at the device's bandwidth
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	acts := r.runOutcome(3, st)
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindowUndo, ResultUndone), "a healthy trial did not pay")
	require.Equal(t, 128, r.files.window[key])
	// The onset: 16 ms per request, 20 MB/s at 128 KB.
	r.tput = func(kb int) float64 { return min(float64(kb)*0.16e6, 150e6) }
	acts = r.onsetTick(300*time.Millisecond, 16*time.Millisecond, st)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "a step between Steps")
	assert.GreaterOrEqual(t, trials[0].ToKB, 2048, "sized by Little's law (16 ms at 150 MB/s)")
	assert.Equal(t, uint64(1), r.tn.Status().Events[EvOnset])
	// The Step 0.7 s later leaves it under trial; the one after judges it.
	r.clk.Advance(700 * time.Millisecond)
	s := r.outcomeSnap(st)
	s.Files[0].P50, s.Files[0].P95 = 16*time.Millisecond, 16*time.Millisecond
	s.Devices[0].CapacityBPS = 150e6
	assert.Empty(t, r.tn.Step(s), "too early to judge")
	r.clk.Advance(time.Second)
	s = r.outcomeSnap(st)
	s.Files[0].P50, s.Files[0].P95 = 16*time.Millisecond, 16*time.Millisecond
	s.Devices[0].CapacityBPS = 150e6
	acts = r.tn.Step(s)
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultKept))
}

// A periodic stall begins 0.6 s after a Step lowered the stream's window
// (its healthy trial did not pay, and the device's outcome trials back off):
// the recent 250 ms of requests hold no request from before that change, so
// their tail is the stall's, and the step comes at once, sized by it, not
// at the next Step.
func TestStallBeginningAfterAWindowChangeIsSteppedAtOnce(t *testing.T) {
	r, st := healthyBackedOff(t)
	// 10% of reads 10 ms slower: 88 MB/s at 128 KB, p99 7x the median.
	r.tput = func(int) float64 { return 88e6 }
	r.clk.Advance(600 * time.Millisecond)
	keys, span := r.tn.onsetStreams()
	require.NotEmpty(t, keys)
	s := r.recentSnap(span, st)
	s.Files[0].P50, s.Files[0].P95, s.Files[0].P99 = 1700*time.Microsecond, 1700*time.Microsecond, 11700*time.Microsecond
	s.Devices[0].CapacityBPS = 150e6
	acts := r.tn.fastOnset(s, span)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "a step between Steps")
	assert.GreaterOrEqual(t, trials[0].ToKB, 1024, "sized by the tail (88 MB/s x 11.7 ms)")
}

// A step undone at the last Step (it cost the random reader beside the
// stream) brings the stream back to its slower window: its rate falls from
// the trial's, its median falls with the window's queue and its p99/p50
// spreads, all by the undo itself. That is no onset: judged against the
// measure taken at that window before the trial, nothing slowed.
func TestRateFallingWithAnUndoneStepIsNoOnset(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = func(kb int) float64 { return min(float64(kb)*0.5e6, 150e6) } // every step pays
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	// The random reader beside it loses at any window past 192 KB.
	rnd := func(kb int) (float64, time.Duration) {
		if kb > 192 {
			return 350, 8 * time.Millisecond
		}
		return 800, 1500 * time.Microsecond
	}
	undone := false
	for i := 0; i < 8 && !undone; i++ {
		acts := r.runBeside(1, st, rnd)
		logActs(t, acts)
		undone = len(filter(acts, KindFileWindowUndo, ResultUndone)) > 0
	}
	require.True(t, undone, "the step past 192 KB was undone for the random reader")
	require.Equal(t, 192, r.files.window[key])
	fd := r.tn.files[key]
	require.NotNil(t, fd)
	before := fd.win.trial.before
	// 0.6 s later, at 192 KB: 0.68 of the trial's rate, the median of the
	// smaller queue, a p99 2.5x it.
	r.clk.Advance(600 * time.Millisecond)
	keys, span := r.tn.onsetStreams()
	require.NotEmpty(t, keys)
	s := r.recentSnap(span, st)
	s.Files[0].Bytes = uint64(before.rate * 0.8 * span.Seconds())
	s.Files[0].P50, s.Files[0].P95, s.Files[0].P99 = before.p50, before.p50, before.p50*5/2
	s.Devices[0].CapacityBPS = 150e6
	acts := r.tn.fastOnset(s, span)
	logActs(t, acts)
	assert.Empty(t, filter(acts, KindFileWindow, ResultTrial), "no step: the stream reads as it did at 192 KB")
	assert.Zero(t, r.tn.Status().Events[EvOnset])
}

// A stream whose rate fell with its latency unchanged is limited by its
// reader, not by the device: no step. Nor is a stream checked more often
// than every quarter interval.
func TestStreamSlowerByItsReaderIsLeftToTheStep(t *testing.T) {
	r, st := bandwidthStream(t)
	r.runOutcome(3, st) // the healthy trial judged, none under way
	r.tput = func(int) float64 { return 40e6 }
	assert.Empty(t, r.onsetTick(300*time.Millisecond, 3*time.Millisecond, st), "latency as at the last Step")
	keys, _ := r.tn.onsetStreams()
	assert.Empty(t, keys, "checked again only a quarter interval later")
	r.clk.Advance(250 * time.Millisecond)
	keys, _ = r.tn.onsetStreams()
	assert.Len(t, keys, 1)
}

func TestSlowerNow(t *testing.T) {
	ms := time.Millisecond
	fs := func(p50, p99 time.Duration) detector.FileStats { return detector.FileStats{P50: p50, P99: p99} }
	assert.True(t, slowerNow(fs(2*ms, 3*ms), fs(3*ms, 4*ms)), "median half again")
	assert.False(t, slowerNow(fs(2*ms, 3*ms), fs(2500*time.Microsecond, 4*ms)))
	assert.True(t, slowerNow(fs(2*ms, 3*ms), fs(2*ms, 9*ms)), "a new tail")
	assert.False(t, slowerNow(fs(2*ms, 9*ms), fs(2*ms, 9*ms)), "the tail was there")
	assert.False(t, slowerNow(fs(0, 0), fs(2*ms, 9*ms)), "nothing to compare with")
}

// Contention begins a tenth of a second after a Step undid a healthy trial
// (it did not pay at the device's bandwidth; the device's outcome trials
// back off): the stream's rate falls ninefold and its median with it. Its
// recent span holds few requests (two 128 KB requests in flight at 16 ms
// give about 30 in 250 ms, fewer when the span starts before the onset):
// the step still comes at the next check, not at the next Step.
func TestContentionRightAfterAnUndoneTrialIsSteppedAtOnce(t *testing.T) {
	r, st := healthyBackedOff(t)
	// The check right after the Step: healthy.
	require.Empty(t, r.onsetTick(100*time.Millisecond, 1700*time.Microsecond, st))
	// The onset, and the next check 300 ms later: 17 MB/s, 15.6 ms, 22
	// requests of 128 KB in the span.
	r.tput = func(kb int) float64 { return min(float64(kb)*0.13e6, 150e6) }
	acts := r.recentTick(300*time.Millisecond, r.tn.onsetStreams, r.tn.fastOnset, st, 15600*time.Microsecond, 22)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "a step between Steps")
	assert.GreaterOrEqual(t, trials[0].ToKB, 2048, "sized by Little's law (15.6 ms at 150 MB/s)")
}

// A healthy stream's trial of a larger window is under way when the device
// slows: judged at the next Step, the trial would be undone by the onset
// (its rate fell from the before-measure's) and backed off. It is ended
// unjudged at the next check instead, and the onset's own step taken from
// the window kept.
func TestOnsetDuringAWindowTrialEndsItAndSteps(t *testing.T) {
	r, st := bandwidthStream(t)
	key := st.key
	// The first trial is undone (no gain at the bandwidth); the stream is
	// under its second, after the back-off, when the device slows.
	inTrial := false
	for i := 0; i < 10 && !inTrial; i++ {
		acts := r.runOutcome(1, st)
		logActs(t, acts)
		fd := r.tn.files[key]
		inTrial = i > 0 && fd != nil && fd.win.trial.to != 0
	}
	require.True(t, inTrial, "a trial on a stream bound by its window")
	trialKB := r.files.window[key]
	require.Greater(t, trialKB, 128)
	// 300 ms into the trial the device slows: 16 ms per request.
	r.tput = func(kb int) float64 { return min(float64(kb)*0.13e6, 150e6) }
	acts := r.recentTick(300*time.Millisecond, r.tn.onsetStreams, r.tn.fastOnset, st, 16*time.Millisecond, 20)
	logActs(t, acts)
	undone := filter(acts, KindFileWindowUndo, ResultUndone)
	require.Len(t, undone, 1, "the trial ended unjudged")
	assert.Contains(t, undone[0].Evidence, "unjudged")
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "the onset's step")
	assert.GreaterOrEqual(t, trials[0].ToKB, 2048, "sized by Little's law (16 ms at 150 MB/s)")
	assert.Equal(t, trials[0].ToKB, r.files.window[key])
	assert.Equal(t, uint64(1), r.tn.Status().Events[EvOnsetInTrial])
	// No back-off was learned from the spoiled trial.
	fd := r.tn.files[key]
	require.NotNil(t, fd)
	assert.False(t, fd.win.back.knee)
	assert.Zero(t, fd.win.back.retryAt)
}

// A stream at its knee runs a prefetch trial one interval in three or four:
// an onset in it ends it unjudged, and the window steps at once.
func TestOnsetDuringAPrefetchTrialEndsItAndSteps(t *testing.T) {
	r := newRig(t, Config{}, nil)
	r.tput = kneeModel // 60 MB/s at 128 KB, 150 at 512 KB, 155 from 1024 KB
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	inPf := false
	for i := 0; i < 20 && !inPf; i++ {
		logActs(t, r.runOutcome(1, st))
		fd := r.tn.files[key]
		inPf = fd != nil && fd.pf.trial.to != 0
	}
	require.True(t, inPf, "a prefetch trial at the knee")
	kneeKB := r.files.window[key]
	// The onset, 300 ms into the prefetch trial: 16 ms per request.
	r.tput = func(kb int) float64 { return min(float64(kb)*0.13e6, 155e6) }
	lat := time.Duration(float64(kneeKB) * 1024 / 40e6 * float64(time.Second)) // 40 MB/s at the knee
	acts := r.recentTick(300*time.Millisecond, r.tn.onsetStreams, r.tn.fastOnset, st, lat, 20)
	logActs(t, acts)
	require.Len(t, filter(acts, KindPrefetchUndo, ResultUndone), 1, "the prefetch trial ended unjudged")
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "the window's step")
	assert.Greater(t, trials[0].ToKB, kneeKB)
	assert.Zero(t, r.tn.files[key].pf.trial.to)
}

// A mild slowdown a moment after a Step (+1 ms on the lab: 150 -> 115 MB/s,
// the median 1.3x, under the strong rule's 0.7 and 1.5x) is stepped on the
// second check running that shows it, half an interval after it began,
// not at the next Steps; a rate that fell as far at the same latency (the
// reader's, not the device's) is not, however long it lasts.
func TestMildSlowdownBetweenStepsIsSteppedOnTheSecondCheck(t *testing.T) {
	r, st := healthyBackedOff(t)
	r.tput = func(kb int) float64 { return min(float64(kb)*0.9e6, 150e6) } // 115 MB/s at 128 KB
	acts := r.onsetTick(250*time.Millisecond, 3900*time.Microsecond, st)
	assert.Empty(t, filter(acts, KindFileWindow, ResultTrial), "one check: not yet")
	acts = r.onsetTick(250*time.Millisecond, 3900*time.Microsecond, st)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "the second check running: a step")
	assert.Greater(t, trials[0].ToKB, 128)
	assert.Equal(t, uint64(1), r.tn.Status().Events[EvOnset])

	// The same drop with the latency unchanged (3 ms, the Step's): the
	// reader's, on every check.
	r, st = healthyBackedOff(t)
	r.tput = func(kb int) float64 { return 115e6 }
	for i := 0; i < 3; i++ {
		acts = r.onsetTick(250*time.Millisecond, 3*time.Millisecond, st)
		assert.Empty(t, filter(acts, KindFileWindow, ResultTrial), "check %d", i)
	}
	// A mild check, then one that is not: the next mild one starts over.
	r.tput = func(kb int) float64 { return min(float64(kb)*0.9e6, 150e6) }
	assert.Empty(t, filter(r.onsetTick(250*time.Millisecond, 3900*time.Microsecond, st), KindFileWindow, ResultTrial))
	r.tput = func(int) float64 { return 150e6 }
	assert.Empty(t, filter(r.onsetTick(250*time.Millisecond, 3*time.Millisecond, st), KindFileWindow, ResultTrial))
	r.tput = func(kb int) float64 { return min(float64(kb)*0.9e6, 150e6) }
	assert.Empty(t, filter(r.onsetTick(250*time.Millisecond, 3900*time.Microsecond, st), KindFileWindow, ResultTrial))
}

// A first step undone because it paid only the ordinary margin against the
// stream's start is taken again on the recent requests once a quarter
// interval has measured the stream whole at the device's window, not at
// the next Step; judged by the Step one Settle after it.
func TestStepUndoneOnAStreamsStartIsTakenAgainAQuarterIntervalLater(t *testing.T) {
	r := mildFromOpen(t)
	_, st, acts := r.freshStream(t)
	require.Len(t, filter(acts, KindFileWindow, ResultTrial), 1)
	var undoneAt time.Duration
	for i := 0; i < 3 && undoneAt == 0; i++ {
		for _, a := range filter(r.runOutcome(1, st), KindFileWindowUndo, ResultUndone) {
			require.Contains(t, a.Evidence, "tried again once it is measured whole")
			undoneAt = a.Time
		}
	}
	require.NotZero(t, undoneAt, "the first step was not undone as judged on the stream's start")
	require.Equal(t, 128, r.files.window[st.key])

	// 100 ms later: too little measured at the device's window. Nor is a
	// regime the detector's fast path enters on it then stepped on the
	// recent requests: they hold the undone window's (on the lab a 176 KB
	// step so taken 90 ms after the undo of 192 measured +7% against a
	// rate of 82.9 MB/s, where the stream reads 68 at 128 KB, and was
	// backed off).
	assert.Empty(t, filter(r.onsetTick(100*time.Millisecond, 2100*time.Microsecond, st), KindFileWindow, ResultTrial))
	fast := r.outcomeSnap(st)
	fast.Regimes = []detector.Regime{{Kind: detector.FileLatencyShift, Device: sdb, File: st.key, Evidence: "test"}}
	assert.Empty(t, filter(r.tn.fastOn(fast, fast, time.Second/4), KindFileWindow, ResultTrial),
		"no step on requests that hold the undone window's")
	acts = r.onsetTick(250*time.Millisecond, 2100*time.Microsecond, st)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "taken again at the check a quarter interval after the undo")
	assert.Equal(t, undoneAt+350*time.Millisecond, trials[0].Time)
	assert.Equal(t, uint64(1), r.tn.Status().Events[EvYoungRetry])
	// Judged by the Step one Settle later: kept.
	acts = r.runOutcome(1, st)
	logActs(t, acts)
	assert.NotEmpty(t, filter(acts, KindFileWindow, ResultKept))
}

// HDFS opens a block file afresh for each read: a block read at the
// device's bandwidth when a Step sees it, 0.4 s after its open, slows
// mildly a moment later. Still a fresh stream (fastOutcome judges it on
// all of its life, which averages the onset away), it is checked like any
// stream the Step saw, against its rate while it read (the Step's interval
// holds only 0.4 s of it), and stepped on the second check.
func TestFreshBlockSlowedAfterAStepIsSteppedBetweenSteps(t *testing.T) {
	r, st := healthyBackedOff(t)
	r.clk.Advance(3 * time.Second) // the reader's pause between two blocks
	r.tn.devs[sdb].outcomeRetryAt = r.clk.Now() + 8*time.Second
	r.tn.files[st.key].win.back.retryAt = r.clk.Now() + 8*time.Second
	r.tn.freshStreams() // the daemon's ticks: the first read's entry is long gone
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: st.tgid, File: st.key, Device: sdb, RaPages: 32})
	r.clk.Advance(400 * time.Millisecond)
	s := r.outcomeSnap(st)
	s.Files[0].Bytes = uint64(0.4 * 150e6) // read for 0.4 s of the interval
	s.Devices[0].CapacityBPS = 150e6
	assert.Empty(t, filter(r.tn.Step(s), KindFileWindow, ResultTrial), "healthy, backed off")
	r.tput = func(kb int) float64 { return min(float64(kb)*0.9e6, 150e6) } // 115 MB/s at 128 KB
	assert.Empty(t, filter(r.onsetTick(250*time.Millisecond, 3900*time.Microsecond, st), KindFileWindow, ResultTrial))
	acts := r.onsetTick(250*time.Millisecond, 3900*time.Microsecond, st)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.Len(t, trials, 1, "stepped 0.9 s after its open, a fresh stream")
}

// sharedDevice is two window-bound streams reading 75 MB/s each from one
// device at its bandwidth, run n intervals (their healthy trials undone).
func sharedDevice(t *testing.T, n int) (*rig, stream, stream) {
	t.Helper()
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = func(int) float64 { return 75e6 }
	p1, k1 := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	p2, k2 := realFile(t, filepath.Join(r.dir, "data"), "blk_2")
	r.files.open(100, 7, p1, k1)
	r.files.open(100, 8, p2, k2)
	s1, s2 := stream{key: k1, tgid: 100, fill: 0.9}, stream{key: k2, tgid: 100, fill: 0.9}
	logActs(t, r.runOutcome(n, s1, s2))
	return r, s1, s2
}

// Two streams share a device at its bandwidth. One slows and is stepped
// between Steps; a quarter interval later the other reads at half its rate
// with its requests twice as long, waiting behind the first one's larger
// window: that is the step's doing, not a slowdown of its own, and it is
// not stepped for it. The same fall with no step beside it is.
func TestStreamSlowedByAPeersStepIsNotSteppedForIt(t *testing.T) {
	for _, peerStep := range []bool{true, false} {
		r, s1, s2 := sharedDevice(t, 12)
		k1, k2 := s1.key, s2.key
		require.Equal(t, 128, r.files.window[k1])
		require.Equal(t, 128, r.files.window[k2])
		if peerStep {
			// The first stream slows: 16 ms per request, 20 MB/s.
			r.tput = func(int) float64 { return 20e6 }
			acts := r.onsetTick(300*time.Millisecond, 16*time.Millisecond, s1)
			logActs(t, acts)
			require.Len(t, filter(acts, KindFileWindow, ResultTrial), 1, "the slowed stream is stepped")
		} else {
			r.clk.Advance(300 * time.Millisecond)
		}
		// The second one, a quarter interval later: 30 MB/s at 6 ms (the
		// first, under trial at its larger window, reads 120).
		r.tput = func(kb int) float64 {
			if kb > 128 {
				return 120e6
			}
			return 30e6
		}
		r.clk.Advance(250 * time.Millisecond)
		keys, span := r.tn.onsetStreams()
		require.Contains(t, keys, k2)
		snap := r.recentSnap(span, s1, s2)
		snap.Files[1].P50, snap.Files[1].P95, snap.Files[1].P99 = 6*time.Millisecond, 6*time.Millisecond, 6*time.Millisecond
		snap.Devices[0].CapacityBPS = 150e6
		acts := filter(r.tn.fastOnset(snap, span), KindFileWindow, ResultTrial)
		logActs(t, acts)
		if peerStep {
			for _, a := range acts {
				assert.NotEqual(t, k2, a.File, "its fall is its peer's step's doing")
			}
			assert.Equal(t, 128, r.files.window[k2])
		} else {
			require.Len(t, acts, 1, "a fall of its own is stepped")
			assert.Equal(t, k2, acts[0].File)
		}
	}
}

// The same at a Step: two streams share a device at its bandwidth, their
// healthy trials undone and the device's outcome trials backing off. One
// reads far below the unpaid trials' stream with its median risen while
// the other has a step under trial: the new evidence that ends the back-off
// is not read into that interval. The same interval with no step beside it
// brings the trial.
func TestRateDropUnderAPeersTrialIsNoEvidence(t *testing.T) {
	for _, peerStep := range []bool{true, false} {
		r, s1, s2 := sharedDevice(t, 24)
		k1, k2 := s1.key, s2.key
		require.Greater(t, r.tn.devs[sdb].outcomeRetryAt, r.clk.Now()+4*time.Second, "backing off")
		if peerStep {
			r.tn.mu.Lock()
			fd := r.tn.newDec(k2, r.tn.device(sdb), true, r.clk.Now(), WindowBound)
			fd.win.trial.to, fd.win.trial.from, fd.win.trial.at, fd.win.movedAt = 1024, 128, r.clk.Now(), r.clk.Now()
			fd.win.trial.before = measure{ok: true, tput: 75e6, rate: 75e6, p50: 3 * time.Millisecond}
			r.tn.mu.Unlock()
		}
		r.clk.Advance(time.Second)
		s := r.outcomeSnap(s1, s2)
		s.Files[0].BusyThroughput, s.Files[0].P50 = 40e6, 4*time.Millisecond
		acts := r.tn.Step(s)
		logActs(t, acts)
		var tried bool
		for _, a := range filter(acts, KindFileWindow, ResultTrial) {
			tried = tried || a.File == k1
		}
		assert.Equal(t, !peerStep, tried, "peer step %v", peerStep)
	}
}
