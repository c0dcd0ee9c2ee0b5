package detector

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// runFast advances the model in 100 ms steps, calling FastPath between the
// regular evaluations, and returns the time of each fast entry.
func runFast(s *sim, d *Detector, until time.Duration, tl *timeline) map[string]time.Duration {
	entered := map[string]time.Duration{}
	for t := s.now + 100*time.Millisecond; t <= until; t += 100 * time.Millisecond {
		s.run(d, t, interval, tl.add)
		snap := d.FastPath(s.now)
		for _, r := range snap.Regimes {
			if _, ok := entered[r.File.String()]; !ok {
				entered[r.File.String()] = s.now
			}
		}
	}
	return entered
}

// slowedFrom is the lab mix with its sequential file slowed by extra from
// onset on.
func slowedFrom(seed uint64, onset, extra time.Duration) (*sim, *reader) {
	s, seq := labMix(seed)
	slowAfter(seq, onset, extra)
	return s, seq
}

// slowAfter adds extra to every request of r from onset on.
func slowAfter(r *reader, onset, extra time.Duration) {
	r.extra = func(t time.Duration) time.Duration {
		if t >= onset {
			return extra
		}
		return 0
	}
}

// fastEntry runs the lab mix slowed from onset on with Evaluate every
// interval until 30 s and FastPath every 100 ms until 33 s, requires that
// the fast path entered the slowed file and only it, and returns when.
func fastEntry(t *testing.T, seed uint64, onset, extra time.Duration) (time.Duration, *reader, *timeline) {
	t.Helper()
	s, seq := slowedFrom(seed, onset, extra)
	d := New(DefaultConfig())
	tl := &timeline{}
	s.run(d, 30*sec, interval, tl.add)
	entered := runFast(s, d, 33*sec, tl)
	require.Len(t, entered, 1, "only the slowed file: %v", entered)
	at, ok := entered[seq.file.String()]
	require.True(t, ok)
	return at, seq, tl
}

func TestFastPathEntersAStrongShiftWithinAFewHundredMilliseconds(t *testing.T) {
	onset := 30*sec + 300*time.Millisecond
	at, seq, tl := fastEntry(t, 21, onset, 3*time.Millisecond)
	assert.LessOrEqual(t, at-onset, 300*time.Millisecond, "fast entry delay")
	// The regime stays entered at the next regular evaluations.
	last := tl.snaps[len(tl.snaps)-1]
	require.True(t, has(last, FileLatencyShift, seq.file))
	for _, r := range last.Regimes {
		if r.File == seq.file && r.Kind == FileLatencyShift {
			assert.LessOrEqual(t, r.Since-onset, 300*time.Millisecond)
		}
	}
	snapEv := tl.activeBetween(FileLatencyShift, seq.file, at, 33*sec)
	require.NotEmpty(t, snapEv)
}

func TestFastPathSnapshotCarriesWhatTheTunerSizesItsStepBy(t *testing.T) {
	onset := 30*sec + 300*time.Millisecond
	s, seq := slowedFrom(22, onset, 3*time.Millisecond)
	d := New(DefaultConfig())
	s.run(d, 30*sec, interval, nil)
	for at := 30*sec + 100*time.Millisecond; at <= 31*sec; at += 100 * time.Millisecond {
		s.run(d, at, interval, nil)
		snap := d.FastPath(s.now)
		if len(snap.Regimes) == 0 {
			continue
		}
		require.Len(t, snap.Files, 1)
		require.Len(t, snap.Devices, 1)
		assert.Equal(t, seq.file, snap.Files[0].Key)
		assert.Greater(t, snap.Files[0].P95, 3*time.Millisecond)
		assert.Greater(t, snap.Devices[0].CapacityBPS, 100e6)
		assert.True(t, strings.HasPrefix(snap.Regimes[0].Evidence, "fast path"), snap.Regimes[0].Evidence)
		t.Log(snap.Regimes[0].Evidence)
		return
	}
	t.Fatal("no fast entry within 0.7 s of the onset")
}

func TestFastPathQuietOnAHealthyDeviceAndForMildOrRandomSlowdowns(t *testing.T) {
	s, seq := labMix(23)
	rnd := s.readers[1]
	onset := 30*sec + 300*time.Millisecond
	// +1 ms on the sequential file: a regular shift (1.3x), not a strong one.
	seq.extra = func(t time.Duration) time.Duration {
		if t >= onset {
			return 700 * time.Microsecond
		}
		return 0
	}
	// +3 ms on a random reader: not sequential.
	rnd.extra = func(t time.Duration) time.Duration {
		if t >= onset {
			return 3 * time.Millisecond
		}
		return 0
	}
	d := New(DefaultConfig())
	var tl timeline
	entered := runFast(s, d, 60*sec, &tl)
	assert.Empty(t, entered)
}

// runDaemon drives the detector as the daemon does (Evaluate every
// interval, FastPath every FastPathInterval(interval)) and returns, per
// regime kind and file, the first time either reported it at or after from,
// and the regular evaluations' timeline.
func runDaemon(s *sim, d *Detector, until, from time.Duration) (map[string]time.Duration, *timeline) {
	first := map[string]time.Duration{}
	tl := &timeline{}
	note := func(snap Snapshot) {
		for _, r := range snap.Regimes {
			k := string(r.Kind) + " " + r.File.String()
			if _, ok := first[k]; !ok && snap.Now >= from {
				first[k] = snap.Now
			}
		}
	}
	fast := FastPathInterval(interval)
	for t := s.now + fast; t <= until; t += fast {
		s.run(d, t, interval, func(snap Snapshot) { tl.add(snap); note(snap) })
		note(d.FastPath(s.now))
	}
	return first, tl
}

// clearedAfterEnd requires that the regime entered at from cleared within
// 3 s of end but not before it, and that nothing else was reported until
// until.
func clearedAfterEnd(t *testing.T, tl *timeline, kind RegimeKind, file probe.FileKey, from, end, until time.Duration) {
	t.Helper()
	gone, ok := tl.clearedAt(kind, file, from)
	require.True(t, ok, "entered at %s: never cleared", from)
	assert.GreaterOrEqual(t, gone, end, "entered at %s: cleared before the end", from)
	assert.LessOrEqual(t, gone-end, 3*time.Second, "entered at %s: clear delay", from)
	assert.Empty(t, tl.anyRegime(0, until, kind, StarvedStream), "entered at %s", from)
}

// fasterMedian requires the fast path's median delay below Evaluate's
// alone, and at most bound.
func fasterMedian(t *testing.T, fast, eval []time.Duration, bound time.Duration) {
	t.Helper()
	t.Logf("delay with the fast path %v, with Evaluate alone %v", fast, eval)
	slices.Sort(fast)
	slices.Sort(eval)
	mf, me := fast[len(fast)/2], eval[len(eval)/2]
	assert.Less(t, mf, me, "median delay: fast path %s, Evaluate alone %s", mf, me)
	assert.LessOrEqual(t, mf, bound)
}

func tailKey() string { return string(TailInflation) + " " + probe.FileKey{}.String() }

func contentionKey() string { return string(Contention) + " " + probe.FileKey{}.String() }

func TestFastPathEntersTailInflationEarlierThanEvaluateAlone(t *testing.T) {
	var fastDelays, evalDelays []time.Duration
	// Onsets at every phase of the evaluation ticker.
	for i, phase := range []time.Duration{50, 200, 350, 500, 650, 800, 950} {
		onset := 30*sec + phase*time.Millisecond
		mk := func() *sim {
			s, _ := labMix(uint64(40 + i))
			// The lab's temporal slowdown: a few percent of all reads stall.
			s.tailOn = during(onset, onset+6*sec)
			s.tailP = 0.05
			s.tailExtra = 20 * time.Millisecond
			return s
		}
		s := mk()
		var tl timeline
		s.run(New(DefaultConfig()), 40*sec, interval, tl.add)
		evalAt, ok := tl.first(TailInflation, probe.FileKey{}, onset)
		require.True(t, ok, "evaluate alone: onset %s: never entered", onset)

		s = mk()
		first, dtl := runDaemon(s, New(DefaultConfig()), 40*sec, onset)
		fastAt, ok := first[tailKey()]
		require.True(t, ok, "daemon cadence: onset %s: never entered", onset)
		assert.LessOrEqual(t, fastAt, evalAt, "onset %s: the fast path must not enter later than Evaluate", onset)
		// Checked every 300 ms (the first 100 ms tick at least Window/4
		// after the last check): the excesses reach their third quarter
		// 0.5-0.75 s after onset, plus up to a check period.
		assert.LessOrEqual(t, fastAt-onset, 1250*time.Millisecond, "onset %s", onset)
		// Exits stay Evaluate's: cleared within 3 s of the end, not before it.
		clearedAfterEnd(t, dtl, TailInflation, probe.FileKey{}, fastAt, onset+6*sec, 40*sec)
		fastDelays = append(fastDelays, fastAt-onset)
		evalDelays = append(evalDelays, evalAt-onset)
	}
	fasterMedian(t, fastDelays, evalDelays, 900*time.Millisecond)
}

func TestFastPathEntersContentionNoLaterThanEvaluateAlone(t *testing.T) {
	onset := 30*sec + 300*time.Millisecond
	mk := func() *sim {
		s, _ := labMix(8)
		for range 5 {
			r := s.addSeq(128*kib, 2)
			r.startAt, r.stopAt = onset, onset+10*sec
		}
		return s
	}
	s := mk()
	var tl timeline
	s.run(New(DefaultConfig()), 45*sec, interval, tl.add)
	evalAt, ok := tl.first(Contention, probe.FileKey{}, onset)
	require.True(t, ok)
	first, dtl := runDaemon(mk(), New(DefaultConfig()), 45*sec, onset)
	fastAt, ok := first[contentionKey()]
	require.True(t, ok)
	t.Logf("contention entered %s after onset with the fast path, %s with Evaluate alone", fastAt-onset, evalAt-onset)
	assert.LessOrEqual(t, fastAt, evalAt)
	gone, ok := dtl.clearedAt(Contention, probe.FileKey{}, fastAt)
	require.True(t, ok)
	assert.GreaterOrEqual(t, gone, onset+10*sec, "cleared before the end")
	assert.LessOrEqual(t, gone-(onset+10*sec), 3*time.Second)

	// The entry's snapshot carries the files read on the device (the
	// tuner answers contention on its sequential readers at once).
	s = mk()
	d := New(DefaultConfig())
	s.run(d, onset, interval, nil)
	for at := onset; at < onset+3*sec; at += FastPathInterval(interval) {
		s.run(d, at, interval, nil)
		snap := d.FastPath(s.now)
		if !has(snap, Contention, probe.FileKey{}) {
			continue
		}
		var seq int
		for _, f := range snap.Files {
			if f.Sequentiality > 0.9 && f.BusyThroughput > 0 && f.P95 > 0 {
				seq++
			}
		}
		assert.GreaterOrEqual(t, seq, 2, "sequential files with their stats: %+v", snap.Files)
		return
	}
	t.Fatal("the fast path did not enter contention within 3 s")
}

func TestFastPathSingleStallQuarterIsNotTailInflation(t *testing.T) {
	// A stall shorter than a quarter of the window, with a large share of
	// requests over the tail threshold: at most two quarters of any
	// trailing window hold excesses, so neither path may enter.
	for i, at := range []time.Duration{30*sec + 100*time.Millisecond, 30*sec + 420*time.Millisecond, 30*sec + 880*time.Millisecond} {
		s, _ := labMix(uint64(60 + i))
		s.tailOn = during(at, at+200*time.Millisecond)
		s.tailP = 0.4
		s.tailExtra = 20 * time.Millisecond
		first, tl := runDaemon(s, New(DefaultConfig()), 40*sec, 0)
		_, entered := first[tailKey()]
		assert.False(t, entered, "stall at %s entered tail inflation", at)
		assert.Empty(t, tl.anyRegime(0, 40*sec, StarvedStream), "stall at %s", at)
	}
}

func TestFastPathHealthyStreamNeverEntersADeviceRegime(t *testing.T) {
	s, _ := labMix(1)
	d := New(DefaultConfig())
	first, tl := runDaemon(s, d, 120*sec, 0)
	assert.Empty(t, first, "regimes on a healthy device")
	assert.Empty(t, tl.anyRegime(0, 120*sec))
}

func TestFastPathDeviceEntryOff(t *testing.T) {
	cfg := DefaultConfig()
	cfg.FastDeviceEntry = false
	onset := 30*sec + 50*time.Millisecond
	s, _ := labMix(40)
	s.tailOn = during(onset, onset+6*sec)
	s.tailP = 0.05
	s.tailExtra = 20 * time.Millisecond
	d := New(cfg)
	s.run(d, onset, interval, nil)
	for t2 := onset; t2 < onset+2*sec; t2 += 100 * time.Millisecond {
		s.run(d, t2, interval, nil)
		for _, r := range d.FastPath(s.now).Regimes {
			assert.NotEqual(t, TailInflation, r.Kind, "device entry is off")
		}
	}
}

func TestFastPathEntersExtentStartsEarlierThanEvaluateAlone(t *testing.T) {
	var fastDelays, evalDelays []time.Duration
	for i, phase := range []time.Duration{50, 200, 350, 500, 650, 800, 950} {
		onset := 30*sec + phase*time.Millisecond
		end := onset + 8*sec
		mk := func() (*sim, *reader) {
			s, seq := labMix(uint64(60 + i))
			seq.extent = 4 << 20
			seq.extentOn = during(onset, end)
			seq.extentExtra = 3 * time.Millisecond
			return s, seq
		}
		s, seq := mk()
		var tl timeline
		s.run(New(DefaultConfig()), 45*sec, interval, tl.add)
		evalAt, ok := tl.first(ExtentStart, seq.file, onset)
		require.True(t, ok, "evaluate alone: onset %s: never entered", onset)

		s, seq = mk()
		first, dtl := runDaemon(s, New(DefaultConfig()), 45*sec, onset)
		fastAt, ok := first[string(ExtentStart)+" "+seq.file.String()]
		require.True(t, ok, "daemon cadence: onset %s: never entered", onset)
		assert.LessOrEqual(t, fastAt, evalAt, "onset %s: the fast path must not enter later than Evaluate", onset)
		assert.LessOrEqual(t, fastAt-onset, time.Second, "onset %s", onset)
		clearedAfterEnd(t, dtl, ExtentStart, seq.file, fastAt, end, 45*sec)
		fastDelays = append(fastDelays, fastAt-onset)
		evalDelays = append(evalDelays, evalAt-onset)
	}
	fasterMedian(t, fastDelays, evalDelays, 700*time.Millisecond)
}

func TestFastPathQuietOnAHealthyFragmentedFile(t *testing.T) {
	// Extent crossings without slower first reads are no extent starts, at
	// any cadence.
	s, seq := labMix(70)
	seq.extent = 4 << 20
	first, _ := runDaemon(s, New(DefaultConfig()), 60*sec, 0)
	assert.Empty(t, first)
}

func TestFileShiftClearsOnItsLatestRequests(t *testing.T) {
	// The shift's end is judged on the file's latest requests, not the
	// whole window's: two evaluations after the end at most, wherever the
	// end falls against the ticker.
	for i, phase := range []time.Duration{100, 400, 700, 950} {
		s, seq := labMix(uint64(80 + i))
		onset := 30*sec + 300*time.Millisecond
		end := 40*sec + phase*time.Millisecond
		seq.extra = func(t time.Duration) time.Duration {
			if t >= onset && t < end {
				return 1500 * time.Microsecond
			}
			return 0
		}
		_, tl := runDaemon(s, New(DefaultConfig()), 50*sec, 0)
		at, ok := tl.first(FileLatencyShift, seq.file, onset)
		require.True(t, ok)
		gone, ok := tl.clearedAt(FileLatencyShift, seq.file, at)
		require.True(t, ok)
		assert.GreaterOrEqual(t, gone, end)
		assert.LessOrEqual(t, gone-end, 2100*time.Millisecond, "end at phase %s", phase*time.Millisecond)
	}
}

func TestFastPathEntersAMilderShiftOverMoreRequests(t *testing.T) {
	// +2 ms puts the model's requests at 1.7x the baseline: between
	// FastWideMult and FastShiftMult, so the latest 32 requests are not
	// enough and the latest FastWideSamples are.
	onset := 30*sec + 300*time.Millisecond
	at, seq, _ := fastEntry(t, 24, onset, 2*time.Millisecond)
	assert.LessOrEqual(t, at-onset, 700*time.Millisecond, "fast entry delay")
	t.Logf("entered %s after the onset", at-onset)

	cfg := DefaultConfig()
	cfg.FastWideMult = 0
	s, _ := labMix(24)
	s.readers[0].extra = seq.extra
	d := New(cfg)
	s.run(d, 30*sec, interval, nil)
	assert.Empty(t, runFast(s, d, 31*sec, &timeline{}), "without the wide check the fast path leaves it to Evaluate")
}

func TestRecentGivesAFreshStreamsLittlesLawOverTheSpan(t *testing.T) {
	// A stream slow from its first read (no baseline, no regime): its
	// bytes in flight, latency and rate over the last 250 ms.
	s, seq := slowedFrom(1, 0, 3*time.Millisecond)
	d := New(DefaultConfig())
	s.run(d, 2*sec, interval, func(Snapshot) {})
	snap := d.Recent(s.now, 250*time.Millisecond, []probe.FileKey{seq.file})
	require.Len(t, snap.Devices, 1)
	var f *FileStats
	for i := range snap.Files {
		if snap.Files[i].Key == seq.file {
			f = &snap.Files[i]
		}
	}
	require.NotNil(t, f)
	assert.Greater(t, f.Sequentiality, 0.95)
	assert.InDelta(t, 2, f.Inflight, 0.3, "the reader's two requests in flight")
	assert.GreaterOrEqual(t, f.P50, 3*time.Millisecond)
	// Bytes are those of the span: rate = Bytes / span, near the stream's
	// busy throughput (it is busy all along).
	rate := float64(f.Bytes) / 0.25
	assert.InDelta(t, f.BusyThroughput, rate, 0.15*rate)
	assert.LessOrEqual(t, f.Bytes, snap.Devices[0].Bytes)
	assert.Empty(t, snap.Regimes)
	// Nothing asked about on the device: nothing reported.
	assert.Empty(t, d.Recent(s.now, 250*time.Millisecond, []probe.FileKey{{Dev: 99, Ino: 1}}).Devices)
}

func TestFastTiersRunFromTheStrongCheckToTheWideOne(t *testing.T) {
	cfg := DefaultConfig()
	tiers := fastTiers(&cfg)
	require.Len(t, tiers, 5)
	assert.Equal(t, fastTier{32, 1.8}, tiers[0])
	assert.Equal(t, fastTier{384, 1.4}, tiers[4])
	for i, n := range []int{64, 128, 256} {
		tier := tiers[i+1]
		assert.Equal(t, n, tier.n)
		assert.Less(t, tier.mult, tiers[i].mult, "a tier over more requests takes a milder shift")
		assert.Greater(t, tier.mult, tiers[4].mult)
	}
	assert.InDelta(t, 1.58, tiers[2].mult, 0.01)
	cfg.FastWideMult = 0
	assert.Equal(t, []fastTier{{32, 1.8}}, fastTiers(&cfg))
}

// A paced stream (about 300 requests a second) slowed to 1.6x: below the
// 32-request check's 1.8x, and too few requests in a window for the
// 384-request one. The tiers between take it within half a second.
func TestFastPathEntersAMilderShiftOfAPacedStreamWithinHalfASecond(t *testing.T) {
	for _, phase := range []time.Duration{0, 330 * time.Millisecond, 670 * time.Millisecond} {
		s := newSim(31, labBase, labBW)
		seq := s.addSeq(128*kib, 1)
		seq.think = 2 * time.Millisecond
		d := New(DefaultConfig())
		s.run(d, 30*sec, interval, nil)
		onset := 30*sec + phase
		slowAfter(seq, onset, 650*time.Microsecond)
		first, _ := runDaemon(s, d, 33*sec, onset)
		at, ok := first[string(FileLatencyShift)+" "+seq.file.String()]
		require.True(t, ok, "onset at %s: the slowed stream's shift was not entered: %v", onset, first)
		assert.LessOrEqual(t, at-onset, 500*time.Millisecond, "onset at %s: entry delay", onset)
		t.Logf("onset at %s: entered %s later", onset, at-onset)
	}
}

// A paced stream queued behind a device's stalls: an eighth of its
// requests 20 ms late, and almost half of the rest waiting behind those,
// lifts its median to about 1.6x with a p95 far above. That is the
// device's tail, not a slower file: the fast path enters no shift for it.
func TestFastPathEntersNoShiftForAStreamQueuedBehindStalls(t *testing.T) {
	for _, seed := range []uint64{51, 52, 53} {
		s := newSim(seed, labBase, labBW)
		seq := s.addSeq(128*kib, 1)
		seq.think = 2 * time.Millisecond
		d := New(DefaultConfig())
		s.run(d, 30*sec, interval, nil)
		onset := 30*sec + 300*time.Millisecond
		rng := rand.New(rand.NewPCG(seed, 9))
		seq.extra = func(t time.Duration) time.Duration {
			if t < onset {
				return 0
			}
			switch x := rng.Float64(); {
			case x < 0.12:
				return 20 * time.Millisecond
			case x < 0.6:
				return 700 * time.Microsecond
			}
			return 0
		}
		var entries []string
		fast := FastPathInterval(interval)
		for at := s.now + fast; at <= 31*sec+500*time.Millisecond; at += fast {
			s.run(d, at, interval, nil)
			for _, r := range d.FastPath(s.now).Regimes {
				if r.Kind == FileLatencyShift {
					entries = append(entries, r.Evidence)
				}
			}
		}
		assert.Empty(t, entries, "seed %d", seed)
	}
}

// A slowed file that starts right after a deeply queued stream ended (one
// the tuner had widened) is entered at once: that stream's queued requests
// are no peers to compare with, and without the rule they held the entry
// back for a whole window and let a false contention in.
func TestFastPathEntersAShiftRightAfterADeepStreamEnded(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		s := newSim(seed, labBase, labBW)
		deep := s.addSeq(128*kib, 2)
		slowed := s.addSeq(128*kib, 2)
		deep.stopAt = 31 * sec
		slowed.startAt = 31*sec + 50*time.Millisecond
		slowAfter(slowed, 0, 8*time.Millisecond)
		d := New(DefaultConfig())
		tl := &timeline{}
		s.run(d, 30*sec, interval, tl.add)
		deep.window = 16
		entered := runFast(s, d, 33*sec, tl)
		at, ok := entered[slowed.file.String()]
		require.True(t, ok, "seed %d: %v", seed, entered)
		assert.LessOrEqual(t, at-slowed.startAt, 300*time.Millisecond, "seed %d: fast entry delay", seed)
		assert.Len(t, entered, 1, "seed %d: only the slowed file: %v", seed, entered)
	}
}

// Under contention the requests beside the file's own are the device's
// state it is judged in, however deep their queue: O_DIRECT readers that
// keep the device's queue deep slow the stream as much as themselves,
// which is no shift of the file (its own requests see that depth too).
// The lab's contention bench once entered one when every deep-queued peer
// was left out; this model of it enters none with either rule, so the
// bench is the judge of that case, and this guards the rule's ground.
func TestFastPathEntersNoShiftForAStreamQueuedWithContenders(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		s := newSim(40+seed, labBase, labBW)
		fg := s.addSeq(128*kib, 2)
		onset := 30*sec + 300*time.Millisecond
		for range 4 {
			r := s.addSeq(1024*kib, 2)
			r.unattributed = true
			r.startAt = onset
		}
		d := New(DefaultConfig())
		tl := &timeline{}
		s.run(d, 30*sec, interval, tl.add)
		entered := runFast(s, d, 36*sec, tl)
		_, ok := entered[fg.file.String()]
		assert.False(t, ok, "seed %d: %v", seed, entered)
		_, ok = tl.first(FileLatencyShift, fg.file, onset)
		assert.False(t, ok, "seed %d: Evaluate", seed)
	}
}

// A file slowed before it was opened, alone on its device, whose window
// the tuner raised a fraction of a second after its first reads: its first
// few dozen requests were issued at the device's window, every later one
// into its own deep queue. The fast path judges it on the shallow ones and
// enters the shift; judged on its latest requests whatever their depth, a
// +8 ms file was never entered (their depth said "queueing").
func TestFastPathEntersALoneFileWhoseWindowWasRaisedAtOnce(t *testing.T) {
	s := newSim(33, labBase, labBW)
	warm := s.addSeq(128*kib, 2)
	onset := 30 * sec
	warm.stopAt = onset
	slow := s.addSeq(128*kib, 2)
	slow.startAt = onset
	slowAfter(slow, onset, 8*time.Millisecond)
	d := New(DefaultConfig())
	tl := &timeline{}
	s.run(d, onset, interval, tl.add)
	entered := runFast(s, d, onset+100*time.Millisecond, tl)
	require.Empty(t, entered, "too few requests yet")
	// The tuner's step once the file has read about 32 requests.
	s.run(d, onset+145*time.Millisecond, interval, tl.add)
	slow.window = 16
	entered = runFast(s, d, onset+2*sec, tl)
	at, ok := entered[slow.file.String()]
	require.True(t, ok, "the slowed file is entered: %v", entered)
	assert.LessOrEqual(t, at-onset, 500*time.Millisecond)
}
