package tuner

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// slowedModel is a stream slowed by its file: its rate grows with its
// window (60 MB/s at 128 KB) up to the device's 150 MB/s.
func slowedModel(kb int) float64 { return min(float64(kb)*0.47e6, 150e6) }

// slowedStream is a rig whose blk_1, open by process 100 on descriptor 7,
// reads at slowedModel's rate for its window.
func slowedStream(t *testing.T) (*rig, probe.FileKey) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = slowedModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	return r, key
}

// randomStats is a random reader's window on the detector: req requests a
// second of size bytes, each waiting mean on average (the median too) and
// p99 at worst, one at a time (an mmap reader faulting pages).
func randomStats(key probe.FileKey, now time.Duration, req float64, mean, p99 time.Duration, size uint64) detector.FileStats {
	return detector.FileStats{Key: key, Device: sdb, Requests: uint64(req), Bytes: uint64(req) * size,
		MeanSize: float64(size), Sequentiality: 0.01, P50: mean, P95: (mean + p99) / 2, P99: p99, LastSeen: now,
		Inflight: 1, BusyThroughput: float64(size) / mean.Seconds()}
}

// runBeside steps n intervals of a stream with an mmap random reader of
// another file on the same device; rnd gives the random reader's requests
// per second and the p99 of its wait behind the stream for the stream's
// window (the mean wait is 0.6 of it). Each fault also transfers its own
// read: its read-around at the device's window, 16 KB once trimmed beside a
// raised window, at the lab's 6.8 us per KB.
func (r *rig) runBeside(n int, st stream, rnd func(kb int) (float64, time.Duration)) []Action {
	return r.runBesideOf(n, st, rnd, true)
}

// runBesideOf is runBeside with a random reader whose reads are its own
// 16 KB requests whatever the window (a buffered random reader) unless
// readAround.
func (r *rig) runBesideOf(n int, st stream, rnd func(kb int) (float64, time.Duration), readAround bool) []Action {
	var all []Action
	rkey := probe.FileKey{Dev: st.key.Dev, Ino: st.key.Ino + 1}
	for i := 0; i < n; i++ {
		r.clk.Advance(time.Second)
		s := r.outcomeSnap(st)
		s.Devices[0].CapacityBPS = 150e6
		req, p99 := rnd(r.files.window[st.key])
		size := uint64(128 << 10) // its faults read around at the device's window
		if r.files.window[st.key] > 128 || !readAround {
			size = 16 << 10 // trimmed beside the raised window
		}
		own := time.Duration(size>>10) * 6800 * time.Nanosecond
		rs := randomStats(rkey, s.Now, req, p99*6/10+own, p99+own, size)
		s.Files = append(s.Files, rs)
		// The stream is slowed by its file: its requests take three
		// times as long as the random reader's.
		s.Files[0].P50 = max(s.Files[0].P50, 3*rs.P50)
		all = append(all, r.tn.Step(s)...)
	}
	return all
}

// labRandom is a random mmap reader on the lab's device (one 150 MB/s
// channel, 6.8 us per KB): each fault waits 150 us, the transfer of its own
// read-around (its open file's window) and most of the stream's window
// queued ahead of it; 1.4x that at the p99.
func labRandom(rkb, skb int) (req float64, mean, p99 time.Duration) {
	mean = 150*time.Microsecond + time.Duration(rkb)*6800*time.Nanosecond + time.Duration(skb)*4800*time.Nanosecond
	return float64(time.Second) / float64(mean), mean, mean * 14 / 10
}

// labRig is a slowed stream (kneeModel) and a random mmap reader of another
// file, on the lab's device, both under the allow-path (the random
// reader's descriptor is found, so its trim can be applied).
type labRig struct {
	*rig
	st         stream
	rkey       probe.FileKey
	streamP50  time.Duration // 0: three times the random reader's median
	randomGone bool
	// wait, perStreamKB: the random reader's own wait per fault and what
	// each KB of the stream's window adds to it (0: labRandom's).
	wait, perStreamKB time.Duration
	// model, if set, is the random reader's service instead.
	model func(rkb, skb int) (req float64, mean, p99 time.Duration)
}

// random is the random reader's model on this rig: labRandom's, or with
// the rig's own wait and cost per KB of the stream's window.
func (l *labRig) random(rkb, skb int) (req float64, mean, p99 time.Duration) {
	if l.model != nil {
		return l.model(rkb, skb)
	}
	if l.wait == 0 && l.perStreamKB == 0 {
		return labRandom(rkb, skb)
	}
	mean = l.wait + time.Duration(rkb)*6800*time.Nanosecond + time.Duration(skb)*l.perStreamKB
	return float64(time.Second) / float64(mean), mean, mean * 14 / 10
}

func newLabRig(t *testing.T) *labRig {
	r, key := slowedStream(t)
	rp, rkey := realFile(t, filepath.Join(r.dir, "data"), "index")
	r.files.open(200, 9, rp, rkey)
	return &labRig{rig: r, st: stream{key: key, tgid: 100, fill: 0.9}, rkey: rkey}
}

// service is the random reader's mean and p99 latency now.
func (l *labRig) service() (mean, p99 time.Duration) {
	_, mean, p99 = l.random(l.files.window[l.rkey], l.files.window[l.st.key])
	return mean, p99
}

func (l *labRig) snapshot() detector.Snapshot {
	s := l.outcomeSnap(l.st)
	s.Devices[0].CapacityBPS = 150e6
	if !l.randomGone {
		rkb := l.files.window[l.rkey]
		req, mean, p99 := l.random(rkb, l.files.window[l.st.key])
		rs := randomStats(l.rkey, s.Now, req, mean, p99, uint64(rkb)<<10)
		s.Files = append(s.Files, rs)
		s.Devices[0].Bytes += rs.Bytes // the device reads the random reader's bytes too
		s.Files[0].P50 = 3 * rs.P50
		if l.streamP50 > 0 {
			s.Files[0].P50 = l.streamP50
		}
	}
	return s
}

// pinBeforeFirstInterval gives the stream a kept window of kb before the
// tuner has seen an interval (a prior given to a fresh open at start-up).
func (l *labRig) pinBeforeFirstInterval(kb int) {
	l.files.window[l.st.key] = kb
	l.tn.mu.Lock()
	defer l.tn.mu.Unlock()
	fd := l.tn.newDec(l.st.key, l.tn.device(sdb), true, l.clk.Now(), WindowBound)
	fd.win.cur, fd.win.keptAt = kb, l.clk.Now()
}

// priorGivenAfterASecond gives the stream a kept window of kb a second
// into the rig's life, before any Step (a saved prior at a fresh open).
func (l *labRig) priorGivenAfterASecond(kb int) {
	l.clk.Advance(time.Second)
	l.files.window[l.st.key] = kb
	l.tn.mu.Lock()
	defer l.tn.mu.Unlock()
	fd := l.tn.newDec(l.st.key, l.tn.device(sdb), true, l.clk.Now(), WindowBound)
	fd.win.cur, fd.win.keptAt, fd.win.movedAt = kb, l.clk.Now(), l.clk.Now()
}

func (l *labRig) run(n int) []Action {
	return l.rig.run(n, l.snapshot)
}

func TestLabRandomModel(t *testing.T) {
	// The lab's +1.5 ms mixed device: 1.65 ms mean at the default window
	// untrimmed, 0.85 ms trimmed (measured; the model is within 10%).
	req, mean, _ := labRandom(128, 128)
	assert.InDelta(t, 1.65e-3, mean.Seconds(), 0.17e-3)
	assert.InDelta(t, 600, req, 60)
	_, mean, _ = labRandom(16, 128)
	assert.InDelta(t, 0.85e-3, mean.Seconds(), 0.09e-3)
}

// A slowed stream beside a random reader: the reader's read-around trim
// comes with the stream's first step, and the stream grows in steps of at
// most randGrowth, each within the budget the trim left the random reader:
// at the end the reader gets its reference service or better, and the
// stream more than the device's window.
func TestStreamBesideARandomReaderSpendsTheBudgetItsTrimLeaves(t *testing.T) {
	l := newLabRig(t)
	refMean, refP99 := l.service()
	acts := l.run(12)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.NotEmpty(t, trials)
	trims := filter(acts, KindTrim, ResultTrial)
	require.Len(t, trims, 1)
	assert.Equal(t, trials[0].Time, trims[0].Time, "the trim comes with the first step")
	for _, a := range trials {
		assert.LessOrEqual(t, float64(a.ToKB), randGrowth*float64(a.FromKB), "small steps beside a random reader: %d -> %d", a.FromKB, a.ToKB)
		assert.Zero(t, a.ToKB%randStepKB)
	}
	w := l.files.window[l.st.key]
	assert.GreaterOrEqual(t, w, 192, "the stream spends the budget the trim left")
	mean, p99 := l.service()
	assert.LessOrEqual(t, float64(mean), randMeanBudget*float64(refMean), "mean %v against the reference %v", mean, refMean)
	assert.LessOrEqual(t, float64(p99), randTailBudget*float64(refP99), "tail %v against the reference %v", p99, refP99)
	noUndoOverBudget(t, acts, "steps are sized to fit: none goes over")
}

// A random reader that waits long on each fault of its own (a slowed
// device) and pays little for each KB of the stream's window (2 us, as on
// the lab below the device's bandwidth), beside a stream whose first step
// brought its trim (so that step taught nothing of what a KB costs):
//   - 1.2 ms of its own wait: the prior cost per KB (a KB's transfer at
//     the capacity, with slack) allows 238 KB from 192, the smallest step
//     worth a trial is 240 on the 16 KB grid: taken;
//   - 2.5 ms: the prior allows 223 KB, less than that step: once the trim
//     has settled, the step is taken to show what a KB really costs.
//
// The steps after it are sized by what it showed, and the reader stays
// within its budget throughout.
func TestStepBesideATrimmedRandomReaderLearnsWhatAKBCosts(t *testing.T) {
	for _, c := range []struct {
		wait    time.Duration
		atLeast int
	}{{1200 * time.Microsecond, 288}, {2500 * time.Microsecond, 240}} {
		t.Run(c.wait.String(), func(t *testing.T) {
			l := newLabRig(t)
			l.wait, l.perStreamKB = c.wait, 2*time.Microsecond
			refMean, refP99 := l.service()
			acts := l.run(20)
			logActs(t, acts)
			var from192 bool
			for _, a := range filter(acts, KindFileWindow, ResultTrial) {
				from192 = from192 || a.FromKB == 192
			}
			assert.True(t, from192, "a step from the window the prior alone stops at")
			assert.Greater(t, l.tn.devs[sdb].randSlope, 0.0, "what a KB costs the random reader was learned")
			w := l.files.window[l.st.key]
			assert.GreaterOrEqual(t, w, c.atLeast, "the stream spends the budget the learned cost leaves")
			mean, p99 := l.service()
			assert.LessOrEqual(t, float64(mean), randMeanBudget*float64(refMean), "mean %v against the reference %v at %d KB", mean, refMean, w)
			assert.LessOrEqual(t, float64(p99), randTailBudget*float64(refP99), "tail %v against the reference %v", p99, refP99)
			noUndoOverBudget(t, acts, "no step goes over their budget")
		})
	}
}

// A stream on a device slowed as a whole, beside a random reader just as
// slow (both wait the device's added latency, no regime: the device was
// slow before the daemon started): the stream's window binds it and the
// device has room, so it is stepped, within the random reader's budget.
// (Only a stream slower than its random peers was stepped once, and a
// fail-slow drive's never was.)
func TestWholeDeviceSlowStreamBesideAnEquallySlowRandomReaderIsStepped(t *testing.T) {
	l := newLabRig(t)
	_, mean, _ := labRandom(128, 128)
	l.streamP50 = mean
	acts := l.run(8)
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultKept))
	assert.Greater(t, l.files.window[l.st.key], 128)
	ref := l.tn.randRefs[l.rkey].svc
	_, p99 := l.service()
	assert.LessOrEqual(t, float64(p99), randTailBudget*float64(ref.tail), "p99 %v against the reference %v", p99, ref.tail)
	noUndoOverBudget(t, acts, "no step goes over the random readers' budget")
}

// severeAbove256: a random reader whose faults come 2.7x fewer and 5x
// slower once the stream beside it reads with a window above 256 KB.
func severeAbove256(kb int) (float64, time.Duration) {
	if kb > 256 {
		return 330, 8 * time.Millisecond
	}
	return 880, 1500 * time.Microsecond
}

// A step the random reader beside it did not have the budget for (its
// faults slow down far beyond the model above 256 KB) is undone whatever
// the stream gained, and the knee it leaves is not confirmed two seconds
// later: every probe is a second over their budget.
func TestStepOverTheRandomBudgetIsUndoneAndItsKneeHolds(t *testing.T) {
	r, key := slowedStream(t)
	acts := r.runBeside(20, stream{key: key, tgid: 100, fill: 0.9}, severeAbove256)
	logActs(t, acts)
	undone := filter(acts, KindFileWindowUndo, ResultUndone)
	require.Len(t, undone, 1)
	assert.Contains(t, undone[0].Evidence, "over budget")
	assert.Contains(t, undone[0].Evidence, "against its reference")
	var past int
	for _, a := range filter(acts, KindFileWindow, ResultTrial) {
		if a.ToKB > 256 {
			past++
		}
	}
	assert.Equal(t, 1, past, "one trial past 256 KB, not its confirmation")
	assert.LessOrEqual(t, r.files.window[key], 256)
	assert.True(t, r.tn.files[key].win.back.kneeRandom)
}

// A first step sized by the random readers' budget that went over it shows
// the budget smaller than the model said: the next step from the base is
// smaller, not the same one again (whole-device-bursty tried 128 -> 192 KB
// four times in 20 s, each costing the bursty reader 10% of its mean).
func TestStepOverTheRandomBudgetFromTheBaseIsNotRepeated(t *testing.T) {
	r, key := slowedStream(t)
	overAbove128 := func(kb int) (float64, time.Duration) {
		if kb > 128 {
			return 400, 3 * time.Millisecond
		}
		return 500, 2 * time.Millisecond
	}
	acts := r.runBeside(40, stream{key: key, tgid: 100, fill: 0.9}, overAbove128)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.GreaterOrEqual(t, len(trials), 2, "a first step and a smaller one after the back-off")
	for i := 1; i < len(trials); i++ {
		assert.Less(t, trials[i].ToKB, trials[i-1].ToKB, "each step below the one that went over: %v", trials)
	}
	assert.Contains(t, filter(acts, KindFileWindowUndo, ResultUndone)[0].Evidence, "no step to")
	assert.Equal(t, 128, r.files.window[key])
}

// The budget is the random reader's reference, not the step before: steps
// that each cost it a little do not add up past it. A buffered random
// reader (no read-around to trim) beside a stream on a device where what a
// KB of the stream's window costs it is not known yet: one small step shows
// it, and the next steps are sized by what it showed.
func TestSmallRandomReaderCostsDoNotAddUp(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true, MaxKB: 4096}, nil)
	r.tput = func(kb int) float64 { return float64(kb) * 0.25e6 } // every step pays
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	// 3% more wait per 64 KB of the stream's window.
	wait := func(kb int) time.Duration {
		lat := 1500 * time.Microsecond
		for w := 128; w < kb; w += 64 {
			lat = lat * 103 / 100
		}
		return lat
	}
	rnd := func(kb int) (float64, time.Duration) { return 600, wait(kb) }
	acts := r.runBesideOf(12, stream{key: key, tgid: 100, fill: 0.9}, rnd, false)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.NotEmpty(t, trials)
	assert.Equal(t, 160, trials[0].ToKB, "a small first step")
	assert.Contains(t, trials[0].Evidence, "window_bound")
	assert.Greater(t, r.tn.devs[sdb].randSlope, 0.0, "what a KB costs the random reader was learned")
	own := 16 * 6800 * time.Nanosecond
	ref, now := wait(128)*6/10+own, wait(r.files.window[key])*6/10+own
	assert.LessOrEqual(t, float64(now), randMeanBudgetUntrimmed*float64(ref), "%v against the reference %v at %d KB", now, ref, r.files.window[key])
	noUndoOverBudget(t, acts, "no step goes over the random readers' budget")
}

// A random reader that costs nothing more at any window does not hold the
// stream back: its steps are kept, one small step at a time.
func TestStepARandomReaderBesideDoesNotPayForIsKept(t *testing.T) {
	r, key := slowedStream(t)
	rnd := func(int) (float64, time.Duration) { return 600, 1500 * time.Microsecond }
	acts := r.runBeside(6, stream{key: key, tgid: 100, fill: 0.9}, rnd)
	logActs(t, acts)
	kept := filter(acts, KindFileWindow, ResultKept)
	require.NotEmpty(t, kept)
	assert.Equal(t, 192, kept[0].ToKB)
	assert.Greater(t, r.files.window[key], 192)
}

// Without a reference for a random reader (not yet measured with enough
// requests), nothing is tried beside it.
func TestNoStepBesideARandomReaderWithoutItsReference(t *testing.T) {
	l := newLabRig(t)
	l.run(1)
	delete(l.tn.randRefs, l.rkey)
	l.tn.mu.Lock()
	lim, why := l.tn.atStep().randomLimitKB(l.tn.devs[sdb], l.st.key, &ladder{base: 128, cur: 128})
	l.tn.mu.Unlock()
	assert.Zero(t, lim)
	assert.Contains(t, why, "no reference")
}

// A reference is learned while nothing the tuner does is in force on the
// device, and frozen while it acts there.
func TestRandomReferenceIsFrozenWhileTheTunerActs(t *testing.T) {
	l := newLabRig(t)
	l.run(1)
	ref := *l.tn.randRefs[l.rkey]
	assert.True(t, ref.clean)
	l.run(6)
	got := l.tn.randRefs[l.rkey]
	require.Greater(t, l.files.window[l.st.key], 128, "the stream's window is raised")
	assert.Equal(t, ref.svc.mean, got.svc.mean, "the trimmed reader beside the raised window is no reference")
	assert.Equal(t, ref.svc.tail, got.svc.tail)
}

// A random reader's knee ends when the random reader goes: the stream may
// grow again.
func TestRandomKneeEndsWhenTheRandomReaderGoes(t *testing.T) {
	r, key := slowedStream(t)
	st := stream{key: key, tgid: 100, fill: 0.9}
	severe := func(kb int) (float64, time.Duration) {
		if kb > 192 {
			return 330, 8 * time.Millisecond
		}
		return 880, 1500 * time.Microsecond
	}
	r.runBeside(8, st, severe)
	require.True(t, r.tn.files[key].win.back.knee)
	w := r.files.window[key]
	acts := r.runOutcome(3, st)
	logActs(t, acts)
	assert.Greater(t, r.files.window[key], w, "alone on the device, the stream steps past the random reader's knee")
}

// A regime the detector's fast path enters between Steps on a stream
// beside an untrimmed random reader: the first step waits a quarter
// interval, for the random reader's service in the new conditions (a
// slowed stream leaves it more of the device), which becomes its reference;
// then the step and the reader's trim come together.
func TestFastPathStepBesideARandomReaderWaitsForItsNewService(t *testing.T) {
	l := newLabRig(t)
	l.streamP50 = time.Millisecond
	l.st.fill = 0.3 // healthy: its window not full, nothing yet
	require.Empty(t, l.run(2))
	l.st.fill = 0.9
	before := l.tn.randRefs[l.rkey].svc
	l.clk.Advance(300 * time.Millisecond)
	s := l.snapshot()
	s.Files[0].P50 = 8 * time.Millisecond
	s.Regimes = []detector.Regime{{Kind: detector.FileLatencyShift, Device: sdb, File: l.st.key, Evidence: "test"}}
	fast := detector.Snapshot{Now: s.Now, Devices: s.Devices, Files: s.Files[:1], Regimes: s.Regimes}
	assert.Empty(t, l.tn.fastOn(fast, s, time.Second/4), "no step yet beside the random reader")

	// A quarter interval later the random reader waits less (the slowed
	// stream takes less of the device): that is its reference now.
	l.clk.Advance(250 * time.Millisecond)
	keys, span := l.tn.onsetStreams()
	require.Contains(t, keys, l.st.key)
	recent := l.snapshot()
	recent.Files[0].P50 = 8 * time.Millisecond
	rs := &recent.Files[1]
	rs.BusyThroughput *= 1.25
	rs.P95, rs.P99 = rs.P95*8/10, rs.P99*8/10
	rs.Requests = 150 // a quarter interval's
	acts := l.tn.fastOnset(recent, span)
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial))
	require.NotEmpty(t, filter(acts, KindTrim, ResultTrial), "the trim with the step")
	after := l.tn.randRefs[l.rkey].svc
	assert.Less(t, after.mean, before.mean, "the reference is what the reader gets since the slowdown began")
	require.GreaterOrEqual(t, rs.Requests, uint64(refreshTailRequests))
	assert.Equal(t, rs.P99, after.tail,
		"its p99 over enough requests since the slowdown is its reference, not a blend with the one from before it")
	assert.False(t, l.tn.randRefs[l.rkey].tailSure, "a quarter interval's p99 is not sure: the account stands for it")
	assert.Equal(t, uint64(1), l.tn.Status().Events[EvDeferred])
}

// A refresh over few recent requests moves a random reader's p99 reference
// only by their share of refreshTailRequests: a p99 over a few dozen is
// their largest.
func TestRefreshTailWeight(t *testing.T) {
	for _, c := range []struct {
		n    uint64
		want float64
	}{{0, 0}, {25, 0.25}, {50, 0.5}, {refreshTailRequests, 1}, {400, 1}} {
		assert.InDelta(t, c.want, refreshTailWeight(c.n), 1e-9, "%d requests", c.n)
	}
}

// A device-wide tail beside a random mmap reader: no device-wide window
// (every later open would take it), windows for the device's streams.
func TestTailInflationBesideARandomReaderTakesPerFileWindows(t *testing.T) {
	l := newLabRig(t)
	l.tput = slowedModel
	var acts []Action
	for i := 0; i < 3; i++ {
		l.clk.Advance(time.Second)
		s := l.snapshot()
		s.Files[0].P50 = s.Files[1].P50 // no file of its own is slower
		s.Regimes = []detector.Regime{{Kind: detector.TailInflation, Device: sdb, Evidence: "test"}}
		acts = append(acts, l.tn.Step(s)...)
	}
	logActs(t, acts)
	assert.Empty(t, filter(acts, KindDeviceWindow, ResultTrial))
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.NotEmpty(t, trials)
	assert.Contains(t, trials[0].Evidence, string(detector.TailInflation))
	assert.Equal(t, 128, l.sys.get("sdb"))
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
			acts = r.runBeside(14, st, func(int) (float64, time.Duration) { return 600, 1500 * time.Microsecond })
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

func TestRandomCostEvidenceNamesTheReader(t *testing.T) {
	l := newLabRig(t)
	l.run(1)
	l.tn.mu.Lock()
	defer l.tn.mu.Unlock()
	// The reader's latency doubled against its reference.
	for k, fs := range l.tn.fstats {
		if k == l.rkey {
			fs.BusyThroughput /= 2
			fs.P99 *= 2
			l.tn.fstats[k] = fs
		}
	}
	c := l.tn.atStep().randomCost(sdb, l.st.key)
	assert.Equal(t, 1, c.n)
	assert.Greater(t, c.mean, 1.0)
	assert.InDelta(t, 2.0, c.tail, 0.01)
	assert.True(t, c.over())
	assert.True(t, strings.Contains(c.why, l.rkey.String()), c.why)
}

// A trimmed reader that opens its file again and again (an mmap service's
// bursts) reads around with the device's window until each new open's trim
// lands: those faults are its slowest, so its p99 is its trimmed requests'
// plus the transfer the trim spares each (its median before the trim less
// now). Trimmed on one open, its p99 is as measured.
func TestReopeningReadersP99IsItsUntrimmedFaults(t *testing.T) {
	l := newLabRig(t)
	l.run(1)
	l.tn.mu.Lock()
	defer l.tn.mu.Unlock()
	fs := l.tn.fstats[l.rkey]
	ref := l.tn.randRefs[l.rkey]
	require.NotNil(t, ref)
	fs.P99, fs.P50 = ref.svc.tail, ref.svc.tail/4 // trimmed: within its p99 budget
	l.tn.fstats[l.rkey] = fs
	l.tn.trims[l.rkey] = &trimDec{key: l.rkey, dev: l.tn.device(sdb), kb: 16, from: 128, beforeP: fs.P50 + ref.svc.tail/2, opened: map[uint32]openedMark{}}
	c := l.tn.atStep().randomCost(sdb, l.st.key)
	assert.InDelta(t, 1.0, c.tail, 0.01, "trimmed once: %s", c.why)

	l.tn.reopened(l.rkey)
	c = l.tn.atStep().randomCost(sdb, l.st.key)
	assert.InDelta(t, 1.5, c.tail, 0.01, "its untrimmed faults: %s", c.why)
	assert.Greater(t, c.tail, randTailBudget)
}

// A kept window whose cost to the random reader beside it stays over its
// budget, though not by far (one interval's p99 strays that much), comes
// down to the window kept before it once several intervals show it, and
// holds there; one noisy interval does not bring it down.
func TestWatchBringsAKeptWindowDownWhenItsCostStaysOverBudget(t *testing.T) {
	for _, persistent := range []bool{true, false} {
		r, key := slowedStream(t)
		st := stream{key: key, tgid: 100, fill: 0.9}
		calm := func(int) (float64, time.Duration) { return 600, 1500 * time.Microsecond }
		// Up to 288 KB with a calm random reader beside it (a knee there:
		// the stream reads no faster above it).
		r.tput = func(kb int) float64 { return slowedModel(min(kb, 288)) }
		r.runBeside(4, st, calm)
		require.Equal(t, 288, r.files.window[key])
		// Then its p99 is 25% over its budget at that window (reference:
		// 0.9 ms of wait + 0.87 ms read-around at the default window).
		interval := 0
		over := func(kb int) (float64, time.Duration) {
			interval++
			if kb <= 192 || !persistent && interval != 1 {
				return 600, 1500 * time.Microsecond
			}
			return 600, 2900 * time.Microsecond
		}
		acts := r.runBeside(4, st, over)
		logActs(t, acts)
		var down []Action
		for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
			if strings.Contains(a.Evidence, "over budget over the last intervals") {
				down = append(down, a)
			}
		}
		if !persistent {
			assert.Empty(t, down, "one noisy interval brings nothing down")
			assert.GreaterOrEqual(t, r.files.window[key], 288)
			continue
		}
		require.Len(t, down, 1)
		assert.Equal(t, 288, down[0].FromKB)
		assert.Equal(t, 192, down[0].ToKB, "back to the window kept before")
		assert.Contains(t, down[0].Evidence, "over budget over the last intervals")
		assert.Equal(t, 192, r.files.window[key])
		assert.Empty(t, filter(r.runBeside(10, st, over), KindFileWindow, ResultTrial), "no step to half way back or more")
	}
}

// A random reader first seen beside a window the tuner raised (a prior
// given to a fresh open before the first interval) has no measure of what
// it gets without one: its reference is estimated by the same account steps
// are sized by, and the stream's steps answer to it.
func TestRandomReaderFirstSeenBesideARaisedWindowGetsAnEstimatedReference(t *testing.T) {
	l := newLabRig(t)
	l.pinBeforeFirstInterval(192)
	_, trueMean, _ := labRandom(128, 128) // at the default window
	acts := l.run(8)
	logActs(t, acts)
	ref := l.tn.randRefs[l.rkey]
	require.False(t, ref.clean)
	assert.InDelta(t, float64(trueMean), float64(ref.svc.mean), 0.2*float64(trueMean), "estimated %v, %v at the default window", ref.svc.mean, trueMean)
	assert.LessOrEqual(t, ref.svc.mean, trueMean, "the estimate errs on the reader's side")
	mean, _ := l.service()
	assert.LessOrEqual(t, float64(mean), randMeanBudget*float64(trueMean))
}

// A random reader first seen beside a prior's window has an estimated
// reference, and its p99 is the least sure part of it (one interval's p99,
// less an account of the window's cost). Trimmed, the reader's p99 is a
// larger multiple of its mean than it was reading around (its own transfer
// no longer hides how its wait varies, and the device is no longer near its
// bandwidth), 1.23x the estimate with the mean well within budget: the
// window stays. Only a p99 far off brings it down. (On the lab, +3 ms, a
// 240 KB prior that read 0.92 of the best static window came down on "mean
// 1.01ms p99 2.28ms against its reference 1.23ms / 1.81ms", and the stream
// read 0.66 of it.)
func TestEstimatedReferencesP99CountsOnlyFarOff(t *testing.T) {
	l := newLabRig(t)
	trimmedTail := 3.5
	l.model = func(rkb, skb int) (float64, time.Duration, time.Duration) {
		if rkb > 16 {
			req, mean, _ := labRandom(rkb, skb)
			return req, mean, mean * 127 / 100
		}
		mean := 150*time.Microsecond + time.Duration(rkb)*6800*time.Nanosecond + time.Duration(skb)*3*time.Microsecond
		return float64(time.Second) / float64(mean), mean, time.Duration(trimmedTail * float64(mean))
	}
	acts, ref := l.priorAt240(t)
	_, _, p99 := l.random(16, 240)
	require.Greater(t, float64(p99), randTailBudget*float64(ref.svc.tail), "the trimmed reader's p99 is over the estimate's budget")
	require.Less(t, float64(p99), randTailSevere*float64(ref.svc.tail))
	for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
		if a.FromKB <= 240 { // a step past the prior may cost it more
			assert.NotContains(t, a.Evidence, "over budget")
		}
	}
	assert.GreaterOrEqual(t, l.files.window[l.st.key], 240)

	// Far off, it does.
	trimmedTail = 5
	acts = l.run(4)
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindowUndo, ResultUndone))
	assert.Less(t, l.files.window[l.st.key], 240)
}

// priorAt240 gives the rig's stream a 240 KB prior, its knee, before the
// first interval, runs 8 intervals and returns their actions and the random
// reader's reference, estimated.
func (l *labRig) priorAt240(t *testing.T) ([]Action, *randRef) {
	l.tput = func(kb int) float64 { return slowedModel(min(kb, 240)) }
	l.pinBeforeFirstInterval(240)
	acts := l.run(8)
	logActs(t, acts)
	ref := l.tn.randRefs[l.rkey]
	require.False(t, ref.clean)
	return acts, ref
}

// A window raised before the random reader beside it was known (a saved
// prior given to a fresh open at start-up) that costs the reader more than
// its budget: the reader's trim comes at the first Step, and the window is
// judged on the trimmed reader; still over budget, it comes down, and the
// windows half way back are out of reach. The trim ends once no window is
// raised for a while; the stream's next step brings it back with it (the
// step's budget counts on it), even within trimScanEvery of the last search
// for the reader's descriptors: without it the reader paid for each step in
// full, every step was undone and the stream stayed at the device's window.
func TestPriorOverBudgetBesideAReaderNotYetKnownComesDownAndGrowsAgain(t *testing.T) {
	l := newLabRig(t)
	l.pinBeforeFirstInterval(384)
	acts := l.run(16)
	logActs(t, acts)
	trims := filter(acts, KindTrim, ResultTrial)
	require.NotEmpty(t, trims)
	down := filter(acts, KindFileWindowUndo, ResultUndone)
	require.NotEmpty(t, down, "the window over the reader's budget comes down")
	assert.Equal(t, 384, down[0].FromKB)
	assert.Less(t, trims[0].Time, down[0].Time, "judged on the trimmed reader")
	ended := filter(acts, KindTrimUndo, ResultUndone)
	require.NotEmpty(t, ended, "the trim ends with no window raised")
	steps := slices.DeleteFunc(filter(acts, KindFileWindow, ResultTrial), func(a Action) bool { return a.Time < ended[0].Time })
	require.NotEmpty(t, steps, "the stream steps again")
	assert.NotEmpty(t, slices.DeleteFunc(filter(acts, KindTrim, ResultTrial), func(a Action) bool { return a.Time != steps[0].Time }),
		"the trim comes back with the stream's next step")
	assert.Greater(t, l.files.window[l.st.key], 128, "the stream grows again, sized by the budget its trim leaves")
	_, trueMean, _ := labRandom(128, 128)
	mean, _ := l.service()
	assert.LessOrEqual(t, float64(mean), randMeanBudget*float64(trueMean), "within the budget at the end")
}

// A stream opened beside a random reader whose reference was learned with
// the device to itself: the stream's first reads at the device's window
// take some of it, and that is the random reader's reference from then on
// (what it gets at the device's window in the conditions of the moment).
func TestFreshStreamBesideARandomReaderRefreshesItsReference(t *testing.T) {
	l := newLabRig(t)
	alone := func() detector.Snapshot {
		now := l.clk.Now()
		req, mean, p99 := labRandom(128, 0)
		b := uint64(req) * 128 << 10
		return detector.Snapshot{Now: now, Files: []detector.FileStats{randomStats(l.rkey, now, req, mean, p99, 128<<10)},
			Devices: []detector.DeviceStats{{Device: sdb, Bytes: b, BusyThroughput: float64(b), CapacityBPS: 150e6}}}
	}
	l.rig.run(3, alone)
	_, aloneMean, _ := labRandom(128, 0)
	require.InDelta(t, float64(aloneMean), float64(l.tn.randRefs[l.rkey].svc.mean), 0.05*float64(aloneMean))
	// The stream opens, slowed from its first read.
	var acts []Action
	for i := 0; i < 4 && len(acts) == 0; i++ {
		l.clk.Advance(100 * time.Millisecond)
		l.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 100, File: l.st.key, Device: sdb, RaPages: 32})
		keys, span := l.tn.freshStreams()
		if len(keys) == 0 {
			continue
		}
		s := l.snapshot()
		f := span.Seconds()
		for j := range s.Files {
			s.Files[j].Bytes = uint64(float64(s.Files[j].Bytes) * f)
			s.Files[j].Requests = max(uint64(float64(s.Files[j].Requests)*f), freshMinRequests)
		}
		acts = l.tn.fastOutcome(s, span)
	}
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial))
	_, besideMean, _ := labRandom(128, 128)
	assert.InDelta(t, float64(besideMean), float64(l.tn.randRefs[l.rkey].svc.mean), 0.05*float64(besideMean),
		"the reference is the random reader beside the stream at the device's window")
}

// runBesideSplit is runBeside with the random reader's mean and p99 wait
// given apart (rnd: requests per second, mean and p99 wait behind the
// stream for the stream's window and the interval, from 1).
func (r *rig) runBesideSplit(n int, st stream, rnd func(kb, i int) (float64, time.Duration, time.Duration)) []Action {
	var all []Action
	rkey := probe.FileKey{Dev: st.key.Dev, Ino: st.key.Ino + 1}
	for i := 1; i <= n; i++ {
		r.clk.Advance(time.Second)
		s := r.outcomeSnap(st)
		s.Devices[0].CapacityBPS = 150e6
		req, mean, p99 := rnd(r.files.window[st.key], i)
		size := uint64(128 << 10)
		if r.files.window[st.key] > 128 {
			size = 16 << 10
		}
		own := time.Duration(size>>10) * 6800 * time.Nanosecond
		rs := randomStats(rkey, s.Now, req, mean+own, p99+own, size)
		s.Files = append(s.Files, rs)
		s.Files[0].P50 = max(s.Files[0].P50, 3*rs.P50)
		all = append(all, r.tn.Step(s)...)
	}
	return all
}

// One interval in which the random reader's p99 alone is far off (its mean
// within budget): on this host one interval's p99 strays that far with no
// step at all. Neither a step's verdict nor the watch of a kept window acts
// on it; two such intervals in a row bring the window down. (In the lab a
// 192 KB step that paid +27% was undone on one such interval, and a kept
// one brought down, the stream left at 0.48-0.61 of the best static window.)
func TestOneIntervalOfRandomP99AloneUndoesNothing(t *testing.T) {
	r, key, st := slowedStreamRig(t)
	calm := 900 * time.Microsecond
	spike := func(at ...int) func(int, int) (float64, time.Duration, time.Duration) {
		return func(_, i int) (float64, time.Duration, time.Duration) {
			if slices.Contains(at, i) {
				return 600, calm, 5 * calm // p99 1.9x its reference, mean unchanged
			}
			return 600, calm, 1500 * time.Microsecond
		}
	}
	acts := r.runBesideSplit(5, st, spike(2)) // a spike while a step is under trial
	logActs(t, acts)
	noUndoOverBudget(t, acts, "no step undone on one interval's p99")
	assert.Positive(t, r.tn.Status().Events[EvRandomJudgedLater])
	require.Equal(t, 288, r.files.window[key], "the stream reached its knee")

	acts = r.runBesideSplit(4, st, spike(2)) // one spike on the kept window
	logActs(t, acts)
	noUndoOverBudget(t, acts, "one interval brings nothing down")
	assert.Equal(t, 288, r.files.window[key])

	acts = r.runBesideSplit(3, st, spike(1, 2, 3)) // the p99 stays off
	logActs(t, acts)
	down := filter(acts, KindFileWindowUndo, ResultUndone)
	require.NotEmpty(t, down, "two intervals in a row bring it down")
	assert.Contains(t, down[0].Evidence, "over budget over the last intervals")
	assert.Less(t, r.files.window[key], 288)
}

// A step whose verdict and the interval after it both show the random
// reader's p99 over its budget, short of far off (its mean within budget),
// is undone there; one such interval alone is not. (On the lab at +2.5 ms a
// 272 KB step kept with the reader's p99 at 1.2x its reference held to the
// end of the run, where the watch of a kept window needs three or four
// intervals, and the reader's p99 over the run was 1.10x the default
// window's.)
func TestRandomP99OverBudgetTwoIntervalsRunningUndoesTheStep(t *testing.T) {
	r, key, st := slowedStreamRig(t)
	over := 0
	acts := r.runBesideSplit(6, st, func(kb, _ int) (float64, time.Duration, time.Duration) {
		if kb > 192 { // 1.3x its reference (1.5 ms wait and its own 128 KB untrimmed)
			over++
			return 600, 900 * time.Microsecond, 3 * time.Millisecond
		}
		return 600, 900 * time.Microsecond, 1500 * time.Microsecond
	})
	logActs(t, acts)
	require.Positive(t, over, "a step past 192 KB was tried")
	undone := filter(acts, KindFileWindowUndo, ResultUndone)
	require.NotEmpty(t, undone, "the step is undone")
	assert.Contains(t, undone[0].Evidence, "over budget: the random reader", "at its verdict, not by the watch")
	assert.Positive(t, r.tn.Status().Events[EvRandomJudgedLater], "after one interval more")
	assert.Equal(t, 192, r.files.window[key])

	// One interval over, the next within: the step is kept.
	r, key, st = slowedStreamRig(t)
	n := 0
	acts = r.runBesideSplit(6, st, func(kb, _ int) (float64, time.Duration, time.Duration) {
		if kb > 192 {
			if n++; n == 1 {
				return 600, 900 * time.Microsecond, 3 * time.Millisecond
			}
		}
		return 600, 900 * time.Microsecond, 1500 * time.Microsecond
	})
	logActs(t, acts)
	noUndoOverBudget(t, acts, "one interval's p99 undoes nothing")
	assert.Greater(t, r.files.window[key], 192)
}

// A step's verdict whose random reader's mean is over its budget by a hair
// in one interval (the budget sits inside the goal) waits one interval; the
// next, within budget, keeps it. (A +23% step was undone on "mean 1.7ms
// against 0.90 x 1.89ms", and the stream settled 3.5 s after its onset.)
func TestRandomMeanAtItsBudgetByAHairWaitsAnInterval(t *testing.T) {
	r, key, st := slowedStreamRig(t)
	acts := r.runBesideSplit(3, st, func(_, i int) (float64, time.Duration, time.Duration) {
		if i == 2 { // the first step's verdict: mean 2% over its budget, 1.05 x 1.77 ms
			return 600, 1787 * time.Microsecond, 1500 * time.Microsecond
		}
		return 600, 900 * time.Microsecond, 1500 * time.Microsecond
	})
	logActs(t, acts)
	noUndoOverBudget(t, acts, "not undone on one interval's hair")
	assert.Positive(t, r.tn.Status().Events[EvRandomJudgedLater])
	assert.Greater(t, r.files.window[key], 128)
}

// slowedStreamRig is a rig with blk_1 open by process 100, read at the
// slowed model's rate up to a knee at 288 KB.
func slowedStreamRig(t *testing.T) (*rig, probe.FileKey, stream) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = func(kb int) float64 { return slowedModel(min(kb, 288)) }
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	return r, key, stream{key: key, tgid: 100, fill: 0.9}
}

// A step beside random readers lies on their grid, at most a grid step
// above what their budget allows (the budget is an estimate, and the step's
// verdict holds them to it). On the lab, +3 ms, a stream at 240 KB whose
// budget allowed 260-274 KB took no 288 KB step for the rest of its run and
// read 0.88 of the best static window.
func TestStepBesideRandomReadersLiesAtMostAGridStepAboveTheBudget(t *testing.T) {
	for _, c := range []struct{ kb, w, want int }{
		{274, 240, 288}, // the smallest step worth a trial, 14 KB above
		{260, 240, 256}, // 288 is more than a grid step above: no step (256 < 1.2 x 240)
		{230, 192, 240},
		{225, 192, 240},
		{222, 192, 208},
		{400, 240, 400},
		{409, 240, 400},
	} {
		assert.Equal(t, c.want, budgetStep(c.kb, c.w), "budget %d KB at %d KB", c.kb, c.w)
	}
}

// A regime the detector's fast path enters before the tuner's first Step (a
// daemon that has just started, its saved memory of a slow file) on a
// stream beside a random reader: the tuner's view holds no random reader
// yet, the recent requests do. The step waits for them, and when it comes
// it is sized for them. (On the lab a daemon 0.2 s old took a stream from
// 128 to 1024 KB there, and the random reader's p99 went to 12-15 ms for
// two seconds.)
func TestFastPathBeforeTheFirstStepSeesTheRandomReaderInTheRecentRequests(t *testing.T) {
	l := newLabRig(t)
	l.clk.Advance(200 * time.Millisecond)
	s := l.snapshot()
	s.Files[0].P50 = 8 * time.Millisecond
	s.Regimes = []detector.Regime{{Kind: detector.FileLatencyShift, Device: sdb, File: l.st.key, Evidence: "test"}}
	fast := detector.Snapshot{Now: s.Now, Devices: s.Devices, Files: s.Files[:1], Regimes: s.Regimes}
	acts := l.tn.fastOn(fast, s, time.Second/4)
	logActs(t, acts)
	assert.Empty(t, filter(acts, KindFileWindow, ResultTrial), "no step sized for the stream alone")

	var all []Action
	for i := 0; i < 3; i++ {
		l.clk.Advance(250 * time.Millisecond)
		if keys, span := l.tn.onsetStreams(); len(keys) > 0 {
			recent := l.snapshot()
			recent.Files[0].P50 = 8 * time.Millisecond
			all = append(all, l.tn.fastOnset(recent, span)...)
		}
	}
	all = append(all, l.run(3)...)
	logActs(t, all)
	steps := filter(all, KindFileWindow, ResultTrial)
	require.NotEmpty(t, steps, "the stream gets its step once the random reader is known")
	assert.LessOrEqual(t, float64(steps[0].ToKB), randGrowth*128, "sized for the random reader beside it")
}

// Two intervals in a row in which the random reader's p99 is twice its
// reference and its mean over budget too, on a kept window: on this host
// a random reader's p99 strays that far for a second or two with no window
// raised (the default window's p99 per second on the lab: 3.5-7.1 ms in
// one run), and its mean with it. The window stays; a cost that shows in
// three of five intervals brings it down. (On the lab such a pair brought
// a kept 192 KB down on a stream that then read 0.72 of the best static
// window for the rest of the run.)
func TestTwoStrayIntervalsOfTheRandomReaderLeaveAKeptWindow(t *testing.T) {
	r, key, st := slowedStreamRig(t)
	calm := 900 * time.Microsecond
	stray := func(at ...int) func(int, int) (float64, time.Duration, time.Duration) {
		return func(_, i int) (float64, time.Duration, time.Duration) {
			if slices.Contains(at, i) {
				return 600, 2 * calm, 6 * calm
			}
			return 600, calm, 1500 * time.Microsecond
		}
	}
	overBudget := func(acts []Action) []Action {
		var out []Action
		for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
			if strings.Contains(a.Evidence, "over budget") {
				out = append(out, a)
			}
		}
		return out
	}
	require.Empty(t, overBudget(r.runBesideSplit(8, st, stray())))
	require.Equal(t, 288, r.files.window[key], "the stream reached its knee")

	acts := r.runBesideSplit(5, st, stray(2, 3))
	logActs(t, acts)
	assert.Empty(t, overBudget(acts), "two stray intervals bring nothing down")
	assert.Equal(t, 288, r.files.window[key])

	acts = r.runBesideSplit(5, st, stray(1, 3, 4))
	logActs(t, acts)
	down := overBudget(acts)
	require.NotEmpty(t, down, "three of five intervals over budget bring it down")
	assert.Contains(t, down[0].Evidence, "over budget over the last intervals")
	assert.Less(t, r.files.window[key], 288)
}

// An estimated reference errs on the reader's side already (its account of
// the raised window's cost is taken at its dearest): the trimmed reader's
// mean is held to it, not to a margin inside it. Here the trimmed reader
// waits 0.70 of what the default window gives it, 0.94 of the estimate:
// within budget. (On the lab, +3 ms, a 240 KB prior came down on "mean
// 1.11ms against 0.90 x 1.22ms" while the default window gives that reader
// about 1.6 ms.)
func TestEstimatedReferenceCarriesItsOwnMargin(t *testing.T) {
	l := newLabRig(t)
	l.model = func(rkb, skb int) (float64, time.Duration, time.Duration) {
		if rkb > 16 {
			return labRandom(rkb, skb)
		}
		mean := 150*time.Microsecond + time.Duration(rkb)*6800*time.Nanosecond + time.Duration(skb)*3700*time.Nanosecond
		return float64(time.Second) / float64(mean), mean, mean * 14 / 10
	}
	acts, ref := l.priorAt240(t)
	_, trueMean, _ := labRandom(128, 128)
	_, mean, _ := l.random(16, 240)
	require.Greater(t, float64(mean), randMeanBudget*float64(ref.svc.mean), "over a margin inside the estimate")
	require.Less(t, float64(mean), 0.75*float64(trueMean), "well within what the default window gives it")
	for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
		if a.FromKB <= 240 { // a step past the prior may cost it more
			assert.NotContains(t, a.Evidence, "over budget")
		}
	}
	assert.GreaterOrEqual(t, l.files.window[l.st.key], 240)
}

// A random reader first seen in the interval its trim began (a prior given
// at start-up, the trim coming with the first Step) read part of its
// requests around and part trimmed: their mean size says which. The
// estimate adds back the trim's saving on the requests it reached only; the
// whole read-around counted put the reference 27% over what the default
// window gives the reader (on the lab, +1.5 ms: 2.12 ms against 1.65-1.73,
// and the stream beside it climbed to 272 KB on that budget).
func TestEstimatedReferenceCountsTheTrimOnTheRequestsItReached(t *testing.T) {
	l := newLabRig(t)
	l.pinBeforeFirstInterval(160)
	tn := l.tn
	tn.mu.Lock()
	defer tn.mu.Unlock()
	tn.dstats = map[probe.Dev]detector.DeviceStats{sdb: {Device: sdb, CapacityBPS: 150e6}}
	tn.trims[l.rkey] = &trimDec{key: l.rkey, dev: tn.device(sdb), kb: 16, from: 128}
	_, trueMean, _ := labRandom(128, 128)
	for _, sizeKB := range []int{70, 16} {
		// Measured beside the 160 KB prior, its requests averaging sizeKB.
		_, mean, p99 := labRandom(sizeKB, 160)
		fs := randomStats(l.rkey, l.clk.Now(), 600, mean, p99, uint64(sizeKB)<<10)
		svc, ok := serviceOf(fs)
		require.True(t, ok)
		est := tn.atStep().untouchedEstimate(fs, svc)
		t.Logf("%d KB per request: measured %v, estimated %v, %v at the default window", sizeKB, svc.mean, est.mean, trueMean)
		assert.InDelta(t, float64(trueMean), float64(est.mean), 0.1*float64(trueMean), "%d KB per request", sizeKB)
	}
}

// A random reader whose p99 is its wait behind the stream's queue: its
// trim shortens its own transfers, and so its mean, but not its p99, which
// grows a KB's transfer for each KB of the stream's window (the lab at
// +3 ms: 2.6 ms at the default window, 3.3 ms beside 240 KB trimmed). The
// mean leaves the stream room to step on; the p99, over its budget beside
// the first step, holds every further step back.
func TestNoStepBesideARandomReaderWhoseP99IsOverBudgetNow(t *testing.T) {
	l := newLabRig(t)
	l.model = func(rkb, skb int) (float64, time.Duration, time.Duration) {
		req, mean, _ := labRandom(rkb, skb)
		_, _, p99 := labRandom(128, 128)
		return req, mean, p99 + time.Duration(max(0, skb-128))*6800*time.Nanosecond
	}
	_, refP99 := l.service()
	acts := l.run(12)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.NotEmpty(t, trials, "the first step is sized by the mean")
	for _, a := range trials {
		assert.LessOrEqual(t, a.ToKB, 192, "no step from a window beside which the reader's p99 is over budget")
	}
	_, p99 := l.service()
	assert.Less(t, float64(p99), 1.2*float64(refP99))
}

// A random reader first referred the moment a prior goes in (with saved
// state, a fresh stream's first outcome step gives it its directory's
// window, and the random readers beside it are searched for a few
// milliseconds later, in the same tick) has the requests of its measure
// from before the prior: its reference is measured, not estimated. Its
// mean holds the stream to the budget of a measured one. Its p99 does too
// when the requests are enough: the stream steps past the prior on the
// budget the reader's trim leaves its mean, and the reader's p99, over
// 1.1x its reference interval after interval, brings the window back (on
// the lab at +3 ms with saved state, a stream held to such a p99 only from
// 1.6x kept 352 KB with the reader's p99 1.25x the default window's). Over
// a few dozen requests their p99 is their largest or so, and counts only
// far off.
func TestReaderReferredAsAPriorGoesInIsMeasuredNotEstimated(t *testing.T) {
	for _, c := range []struct {
		name     string
		priorAgo time.Duration // before the search for random readers
		share    float64       // of a second's requests in its measure
		clean    bool
		sure     bool
	}{
		{"prior given in the same tick", 3 * time.Millisecond, 0.25, true, true},
		{"prior given in the same tick, a few dozen requests", 3 * time.Millisecond, 0.06, true, false},
		{"prior given 100 ms before", 100 * time.Millisecond, 0.25, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLabRig(t)
			// Its trim shortens its transfers and so its mean, which the
			// stream's window hardly moves; its p99, the wait behind the
			// stream's queue, grows with the window.
			_, _, refP99 := labRandom(128, 128)
			l.model = func(rkb, skb int) (float64, time.Duration, time.Duration) {
				mean := 150*time.Microsecond + time.Duration(rkb)*6800*time.Nanosecond + time.Duration(skb)*time.Microsecond
				return float64(time.Second) / float64(mean), mean, refP99 + time.Duration(max(0, skb-128))*time.Microsecond
			}
			l.priorGivenAfterASecond(240)

			l.clk.Advance(c.priorAgo)
			keys, span := l.tn.trimStreams()
			require.NotEmpty(t, keys)
			// Its recent requests: read around at the device's window,
			// nearly all from before the prior.
			now := l.clk.Now()
			req, mean, p99 := l.random(128, 128)
			recent := detector.Snapshot{Now: now, Devices: []detector.DeviceStats{{Device: sdb, BusyThroughput: 100e6, CapacityBPS: 150e6}},
				Files: []detector.FileStats{randomStats(l.rkey, now, c.share*req, mean, p99, 128<<10)}}
			acts := l.tn.fastTrim(recent, span)
			require.NotEmpty(t, filter(acts, KindTrim, ResultTrial))
			ref := l.tn.randRefs[l.rkey]
			require.NotNil(t, ref)
			require.Equal(t, c.clean, ref.clean)
			require.Equal(t, c.sure, ref.tailSure)
			if !c.clean {
				return
			}
			assert.Equal(t, refP99, ref.svc.tail)
			assert.Equal(t, mean, ref.svc.mean)

			acts = append(acts, l.run(20)...)
			logActs(t, acts)
			// At the prior the reader's p99 is 2.28 ms + 1 us per KB of
			// the stream's window beyond 128: its budget is spent there,
			// and no step past it is tried (tailLimitKB), whether its
			// reference is sure or the account stands for it.
			assert.Empty(t, slices.DeleteFunc(filter(acts, KindFileWindow, ResultTrial), func(a Action) bool { return a.ToKB <= 240 }),
				"no step past the prior: the reader's p99 budget is spent there")
			_, p99 = l.service()
			assert.LessOrEqual(t, float64(p99), randTailBudget*float64(refP99), "at %d KB", l.files.window[l.st.key])
			assert.Equal(t, 240, l.files.window[l.st.key])
		})
	}
}

// channelKB is a KB's transfer at the lab's 150 MB/s channel.
const channelKB = 6830 * time.Nanosecond

// channelTail is a random reader's p99 on one transfer channel: its own
// request's transfer and the stream's window queued ahead of it (the
// lab's, measured by make bench-frontier within 5%).
func channelTail(rkb, skb int) time.Duration {
	return 150*time.Microsecond + time.Duration(rkb+skb)*channelKB
}

// newChannelRig is a lab rig whose random reader's p99 is channelTail and
// whose mean grows by half a KB's transfer per KB of the stream's window;
// at128 is its p99 with both at 128 KB, if not zero.
func newChannelRig(t *testing.T, at128 time.Duration) *labRig {
	l := newLabRig(t)
	l.tput = func(kb int) float64 { return min(float64(kb)*0.47e6, 140e6) }
	l.model = func(rkb, skb int) (float64, time.Duration, time.Duration) {
		mean := 150*time.Microsecond + time.Duration(rkb)*channelKB + time.Duration(skb)*3420*time.Nanosecond
		req := float64(time.Second) / float64(mean)
		if at128 > 0 && rkb == 128 && skb == 128 {
			return req, mean, at128
		}
		return req, mean, channelTail(rkb, skb)
	}
	return l
}

// A random reader whose reference was learned in seconds of the default
// window's high mode (its p99 2.6 ms there, where its requests wait behind
// two of the stream's transfers; 1.9 ms in most seconds) is held to what
// the account of the raised windows says the default window gives it now
// (tailAtDefault): the stream's window stops where the reader's p99 is
// within 1.1x of that, not of the high second. Each KB of the stream's
// window costs the reader's p99 a KB's transfer (the lab's one channel),
// and its mean about half that.
func TestRandomReaderHeldToTheDefaultWindowsP99ByTheAccount(t *testing.T) {
	l := newChannelRig(t, 2600*time.Microsecond) // the reference's seconds
	physics := channelTail
	acts := l.run(16)
	logActs(t, acts)
	ref := l.tn.randRefs[l.rkey]
	require.NotNil(t, ref)
	require.Equal(t, 2600*time.Microsecond, ref.svc.tail, "its reference is the high second's")
	w := l.files.window[l.st.key]
	def := physics(128, 128)
	assert.Greater(t, w, 192, "the stream still grows")
	assert.LessOrEqual(t, float64(physics(l.files.window[l.rkey], w)), randTailBudget*float64(def),
		"the reader's p99 at %d KB against the default window's %v", w, def)
	assert.Less(t, float64(physics(16, w+randStepKB)), randTailBudget*float64(ref.svc.tail),
		"its measured reference alone would let the stream grow further")
	// The steps are sized to the account's budget: one that overshoots
	// it is undone and says so.
	for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
		assert.Contains(t, a.Evidence, "by the account of the windows raised beside it", "an undo names the account as the reader's p99 reference")
	}
}

// A random reader referred to a few dozen requests as a saved prior went
// in (its p99 their largest: not sure, so counted only far off) is held by
// the account of the raised windows at a KB's transfer, before any step
// has shown what a KB costs it, whether their largest was a stray high or
// a low draw: the prior comes down to where the reader's p99 is within
// 1.1x of what the device's window gives it.
func TestUnsureReferenceIsHeldByTheAccountOfThePrior(t *testing.T) {
	for _, c := range []struct {
		name string
		p99  time.Duration // the few dozen requests' p99: their largest
	}{{"a stray high", 3300 * time.Microsecond}, {"a low draw", 1500 * time.Microsecond}} {
		t.Run(c.name, func(t *testing.T) { unsureReferenceHeldByTheAccount(t, c.p99) })
	}
}

func unsureReferenceHeldByTheAccount(t *testing.T, fewP99 time.Duration) {
	l := newChannelRig(t, 0)
	physics := channelTail
	l.priorGivenAfterASecond(288)
	l.clk.Advance(3 * time.Millisecond)
	keys, span := l.tn.trimStreams()
	require.NotEmpty(t, keys)
	// A few dozen requests, nearly all from before the prior.
	now := l.clk.Now()
	req, mean, _ := l.random(128, 128)
	recent := detector.Snapshot{Now: now, Devices: []detector.DeviceStats{{Device: sdb, BusyThroughput: 100e6, CapacityBPS: 150e6}},
		Files: []detector.FileStats{randomStats(l.rkey, now, 0.06*req, mean, fewP99, 128<<10)}}
	acts := l.tn.fastTrim(recent, span)
	require.NotEmpty(t, filter(acts, KindTrim, ResultTrial))
	ref := l.tn.randRefs[l.rkey]
	require.NotNil(t, ref)
	require.False(t, ref.tailSure)

	acts = append(acts, l.run(12)...)
	logActs(t, acts)
	w := l.files.window[l.st.key]
	def := physics(128, 128)
	assert.Less(t, w, 288, "the prior comes down")
	assert.GreaterOrEqual(t, w, 192)
	assert.LessOrEqual(t, float64(physics(l.files.window[l.rkey], w)), randTailBudget*float64(def),
		"the reader's p99 at %d KB against the default window's %v", w, def)
	// The steps are sized to the account's budget: one that overshoots
	// it is undone and says so.
	for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
		assert.Contains(t, a.Evidence, "by the account of the windows raised beside it", "an undo names the account as the reader's p99 reference")
	}
}

// At the daemon's start a stream bound by its window shares the device
// with random reads spread over files too thin yet for a reference (a
// DataNode's preads over ten block files): the first step waits until the
// device has been watched a Settle, then is taken.
func TestFirstStepWaitsAnIntervalForRandomReadsNotYetMeasured(t *testing.T) {
	r, key := slowedStream(t)
	st := stream{key: key, tgid: 100, fill: 0.9}
	thin := probe.FileKey{Dev: key.Dev, Ino: key.Ino + 1}
	step := func() []Action {
		r.clk.Advance(time.Second)
		s := r.outcomeSnap(st)
		s.Files = append(s.Files, randomStats(thin, s.Now, 6, 3*time.Millisecond, 9*time.Millisecond, 64<<10))
		return r.tn.Step(s)
	}
	acts := step()
	logActs(t, acts)
	assert.Empty(t, filter(acts, KindFileWindow, ResultTrial), "the device's first interval: no step blind of its random reads")
	acts = step()
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultTrial), "a Settle later the step is taken")
}

// A random reader known from the last Step (its reference a moment old) is
// beside a fresh stream even when the fresh stream's recent view holds too
// few of its reads to show it: the fast path takes no step blind of its
// budget, and the Step that sees both sizes one.
func TestFreshStreamBesideAKnownRandomReaderIsNotSteppedBlind(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	r.tput = slowedModel
	rkey := probe.FileKey{Dev: 254, Ino: 99}
	step := func(ss ...stream) []Action {
		r.clk.Advance(time.Second)
		s := r.outcomeSnap(ss...)
		s.Files = append(s.Files, randomStats(rkey, s.Now, 300, 3*time.Millisecond, 4*time.Millisecond, 16<<10))
		return r.tn.Step(s)
	}
	require.Empty(t, step(), "the random reader alone: its reference")
	require.NotNil(t, r.tn.randRefs[rkey])
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	var acts []Action
	for i := 0; i < 3; i++ {
		acts = append(acts, r.fastTick(st)...)
	}
	logActs(t, acts)
	assert.Empty(t, filter(acts, KindFileWindow, ResultTrial), "no step between Steps blind of the random reader")
	acts = step(st)
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.NotEmpty(t, trials, "the Step sizes a step within its budget")
	assert.LessOrEqual(t, trials[0].ToKB, 256)
}

// A fresh stream's first step that went over a random reader's budget is
// undone on that budget, not as judged on the stream's start: the budget
// bounds the next step (whole-device-bursty's stream took 128 -> 192 KB
// twice in three seconds, the first undo "tried again once it is measured
// whole", with the bursty reader's mean 1.2x over its budget).
func TestFreshStepOverTheRandomBudgetIsNotTakenAgainWhole(t *testing.T) {
	r := mildFromOpen(t)
	rkey := probe.FileKey{Dev: sdb, Ino: 99}
	randomAt := func(s detector.Snapshot, kb int) detector.Snapshot {
		lat := 2 * time.Millisecond
		if kb > 128 {
			lat = 3 * time.Millisecond // 1.5x: over any budget
		}
		s.Files = append(s.Files, randomStats(rkey, s.Now, 400, lat, 2*lat, 16<<10))
		return s
	}
	for range 3 { // the reader alone: its reference
		r.clk.Advance(time.Second)
		s := randomAt(detector.Snapshot{Now: r.clk.Now()}, 128)
		s.Devices = []detector.DeviceStats{{Device: sdb, Bytes: 400 * 16 << 10, BusyThroughput: 400 * 16 << 10, CapacityBPS: 150e6}}
		r.tn.Step(s)
	}
	key, st, acts := r.freshStream(t)
	var undo []Action
	for i := 0; i < 4 && len(undo) == 0; i++ {
		r.clk.Advance(time.Second)
		a := r.tn.Step(randomAt(r.outcomeSnap(st), r.files.window[key]))
		logActs(t, a)
		acts = append(acts, a...)
		undo = filter(a, KindFileWindowUndo, ResultUndone)
	}
	require.NotEmpty(t, undo, "the step over the reader's budget was kept")
	assert.Contains(t, undo[0].Evidence, "over budget")
	assert.Contains(t, undo[0].Evidence, "no step to")
	assert.NotContains(t, undo[0].Evidence, "measured whole")
	for range 6 {
		r.clk.Advance(time.Second)
		acts = append(acts, r.tn.Step(randomAt(r.outcomeSnap(st), r.files.window[key]))...)
	}
	trials := filter(acts, KindFileWindow, ResultTrial)
	for i := 1; i < len(trials); i++ {
		assert.Less(t, trials[i].ToKB, trials[0].ToKB, "no step as large as the one over budget: %v", trials)
	}
}

// The share of a step over the random readers' budget that would have met
// it: what was left of their budget before it over what it cost them, by
// the mean and by the p99 (the smaller); a budget already spent before the
// step (one that counts on a trim not yet in force) tells nothing.
func TestBudgetShareOfAStepOverIt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before randCost
		after  randCost
		want   float64
	}{
		{"within budget", randCost{mean: 0.5, tail: 1}, randCost{mean: 0.9, tail: 1.04}, 1},
		{"mean: half the step", randCost{mean: 0.5, tail: 1}, randCost{mean: 1.5, tail: 1}, 0.5},
		{"mean over before the step: no measure of the room", randCost{mean: 1.1, tail: 1}, randCost{mean: 1.3, tail: 1}, 1},
		{"mean over before, p99: a fifth", randCost{mean: 1.1, tail: 1}, randCost{mean: 1.3, tail: 1.25}, 0.2},
		{"p99: a fifth of the step", randCost{mean: 0.5, tail: 1}, randCost{mean: 0.9, tail: 1.25}, 0.2},
		{"both: the smaller", randCost{mean: 0.5, tail: 1}, randCost{mean: 1.5, tail: 1.25}, 0.2},
		{"no readers before", randCost{}, randCost{mean: 2, tail: 1}, 0.5},
	} {
		assert.InDelta(t, tc.want, budgetShare(tc.before, tc.after), 1e-9, tc.name)
	}
}

// A ceiling the random readers' budget set holds the stream's share of the
// device, not its bytes in flight: once the stream's file slows, each KB of
// its window reads (and queues on the device) half as much, and a step past
// the old ceiling's KB costs the reader no more than the ceiling did. On
// the lab a step over budget on the healthy device held a stream that slowed
// after at 128 KB for 5 minutes (0.51 of its best static window).
func TestRandomCeilingMovesWithTheStreamsRate(t *testing.T) {
	r, key := slowedStream(t)
	slow := 1.0
	r.tput = func(kb int) float64 { return slowedModel(kb) / slow }
	// Over budget once the stream reads more than 70 MB/s, whatever its window.
	byRate := func(kb int) (float64, time.Duration) {
		if r.tput(kb) > 70e6 {
			return 400, 3 * time.Millisecond
		}
		return 500, 2 * time.Millisecond
	}
	st := stream{key: key, tgid: 100, fill: 0.9}
	acts := r.runBeside(12, st, byRate)
	logActs(t, acts)
	undone := filter(acts, KindFileWindowUndo, ResultUndone)
	require.NotEmpty(t, undone)
	require.Contains(t, undone[0].Evidence, "no step to")
	ceil := r.tn.files[key].win.limit.ceil
	require.NotZero(t, ceil)
	slow = 2.5
	acts = r.runBeside(20, st, byRate)
	logActs(t, acts)
	assert.Greater(t, r.files.window[key], ceil, "a window past the ceiling's KB once a KB reads less (ceiling %d KB)", ceil)
	noUndoOverBudget(t, acts, "each step within the reader's budget")
}

// A buffered random reader whose requests are what it asks for (64 KB
// preads, as a DataNode's) is not read around: its requests are half the
// device's 128 KB window, a trim would spare it nothing, and no step counts
// on one. On the lab (s1-0) its trim was tried with a 160 KB step sized on
// the transfer the trim would spare, the step cost the reader 10% of its
// mean and 16% of its p99 for a second, and its p99 over the run read 1.12x.
func TestAPreadReaderIsNotTakenForReadAround(t *testing.T) {
	r, key := slowedStream(t)
	st := stream{key: key, tgid: 100, fill: 0.9}
	rkey := probe.FileKey{Dev: key.Dev, Ino: key.Ino + 1}
	p, _ := realFile(t, filepath.Join(r.dir, "data"), "blk_2")
	r.files.open(101, 5, p, rkey)
	var acts []Action
	for i := 0; i < 20; i++ {
		r.clk.Advance(time.Second)
		s := r.outcomeSnap(st)
		s.Devices[0].CapacityBPS = 150e6
		// Its 64 KB requests wait behind the stream's window: 2 us per KB.
		mean := 2*time.Millisecond + time.Duration(r.files.window[key])*2*time.Microsecond
		s.Files = append(s.Files, randomStats(rkey, s.Now, 300, mean, mean*14/10, 64<<10))
		s.Files[0].P50 = max(s.Files[0].P50, 3*mean)
		acts = append(acts, r.tn.Step(s)...)
	}
	logActs(t, acts)
	assert.Empty(t, filter(acts, KindTrim, ResultTrial), "no trim of a reader that asks for its 64 KB")
	noUndoOverBudget(t, acts, "no step sized on a trim that cannot come")
}

// Two streams stepped at the same Step beside one random reader spend one
// budget: the second step's room is what the first's leaves (its bytes are
// not in the reader's measure yet). On the lab (s3-46) two streams each
// took the "one small step" beside a DataNode's preads in the same Step,
// the reader's mean rose 15% and its p99 for that second 2.2x.
func TestStepsAtOnceBesideARandomReaderShareItsBudget(t *testing.T) {
	r, k1 := slowedStream(t)
	p, k2 := realFile(t, filepath.Join(r.dir, "data"), "blk_3")
	r.files.open(102, 7, p, k2)
	rkey := probe.FileKey{Dev: k1.Dev, Ino: 1 << 40}
	ss := []stream{{key: k1, tgid: 100, fill: 0.9}, {key: k2, tgid: 102, fill: 0.9}}
	var acts []Action
	for i := 0; i < 12; i++ {
		r.clk.Advance(time.Second)
		s := r.outcomeSnap(ss...)
		s.Devices[0].CapacityBPS = 150e6
		// Its 16 KB preads wait behind both streams' windows: 3 us per KB raised.
		mean := 2*time.Millisecond + time.Duration(r.files.window[k1]+r.files.window[k2]-256)*3*time.Microsecond
		s.Files = append(s.Files, randomStats(rkey, s.Now, 400, mean, mean*14/10, 16<<10))
		for j := range ss {
			s.Files[j].P50 = max(s.Files[j].P50, 3*mean)
		}
		acts = append(acts, r.tn.Step(s)...)
	}
	logActs(t, acts)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.NotEmpty(t, trials)
	at := map[time.Duration]int{}
	for _, a := range trials {
		at[a.Time]++
		assert.LessOrEqual(t, at[a.Time], 1, "one step at a time where the budget has room for one: %v", trials)
	}
}

// noUndoOverBudget: no step in acts was undone over the random readers' budget.
func noUndoOverBudget(t *testing.T, acts []Action, msg string) {
	t.Helper()
	for _, a := range filter(acts, KindFileWindowUndo, ResultUndone) {
		assert.NotContains(t, a.Evidence, "over budget", msg)
	}
}
