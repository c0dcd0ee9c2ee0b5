package detector_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/test/lab"
)

// RecordEnv names a file to save a lab run's recording to (gzip'd gob), for
// the replay benchmark's testdata.
const RecordEnv = "READAHEADD_DETECTOR_RECORD"

// workload is the lab's healthy background: paced sequential readers (one
// on a plain file, one on a fragmented file) re-reading their files from the
// device, and random 4 KiB readers of a third file, like a DataNode serving
// block reads next to a service's index lookups.
type workload struct {
	seqA, frag, rnd, bg string
	cancel              context.CancelFunc
	wg                  sync.WaitGroup
	mu                  sync.Mutex
	err                 error
}

func prepareFiles(t *testing.T, l *lab.Lab) *workload {
	t.Helper()
	w := &workload{}
	var err error
	w.seqA, err = l.WriteFile("seq-a.dat", 256)
	require.NoError(t, err)
	w.frag, _, err = l.WriteFragmented("frag.dat", "frag-other.dat", 64, 2)
	require.NoError(t, err)
	w.rnd, err = l.WriteFile("random.dat", 256)
	require.NoError(t, err)
	w.bg, err = l.WriteFile("background.dat", 256)
	require.NoError(t, err)
	exts, err := lab.Extents(w.frag)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(exts), 8, "the fragmented file must have many extents (it has %d)", len(exts))
	return w
}

func (w *workload) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

func (w *workload) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	for _, p := range []string{w.seqA, w.frag} {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for ctx.Err() == nil {
				if err := pacedRead(ctx, p, seqRate); err != nil {
					w.fail(err)
					return
				}
			}
		}()
	}
	for i := range 2 {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			if err := randomReads(ctx, w.rnd, uint64(i+1)); err != nil {
				w.fail(err)
			}
		}()
	}
	t.Cleanup(w.stop)
}

func (w *workload) stop() {
	if w.cancel != nil {
		w.cancel()
		w.wg.Wait()
	}
}

// seqRate is each sequential reader's pace: a client fetching a block at
// 50 MB/s (about a 1 GbE link's worth of payload with protocol overhead
// left over). Two readers keep the 150 MB/s lab device two-thirds busy, so
// a per-file slowdown shows in latency without the other reader taking up
// the slack at once. Unpaced readers saturate the device; see
// docs/detector.md for how the detector fares then.
const seqRate = 50e6

// pacedRead reads path once from the device (its cache dropped first) with
// buffered 64 KiB reads at no more than rate bytes/s.
func pacedRead(ctx context.Context, path string, rate float64) error {
	if err := lab.DropFileCache(path); err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, lab.SeqBlock)
	start := time.Now()
	var n int64
	for ctx.Err() == nil {
		k, err := f.Read(buf)
		n += int64(k)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		ahead := time.Duration(float64(n)/rate*1e9) - time.Since(start)
		switch {
		case ahead > 0:
			time.Sleep(ahead)
		case ahead < 0:
			// Behind after a slow read: carry on at the pace rather than
			// catch up in a burst (a network-bound client cannot either;
			// a burst would queue on the device and raise every reader's
			// latency after each stall).
			start, n = time.Now(), 0
		}
	}
	return nil
}

// randomReads reads random 4 KiB pages with pread on a file advised
// POSIX_FADV_RANDOM (so each miss is one 4 KiB device read), with a short
// think time, and drops the file's cache now and then so that reads keep
// reaching the device.
func randomReads(ctx context.Context, path string, seed uint64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
		return err
	}
	pages := st.Size() / 4096
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	buf := make([]byte, 4096)
	lastDrop := time.Now()
	for ctx.Err() == nil {
		if _, err := f.ReadAt(buf, rng.Int64N(pages)*4096); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		time.Sleep(2 * time.Millisecond)
		if time.Since(lastDrop) > 10*time.Second {
			if err := lab.DropFileCache(path); err != nil {
				return err
			}
			lastDrop = time.Now()
		}
	}
	return nil
}

// live runs the probe on the lab device into a detector driven as the
// daemon drives it (DaemonCadence: Evaluate every second, FastPath every
// 100 ms, on CLOCK_MONOTONIC tickers), and records the probe's stream.
type live struct {
	rec     *Recording
	dr      *driver
	p       *probe.Probe
	mu      sync.Mutex
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	runErr  error
	stopped bool
}

func startLive(t *testing.T, l *lab.Lab, w *workload, c Cadence) *live {
	t.Helper()
	p, err := probe.Load(probe.Config{Devices: []probe.Dev{l.Dev}, Poll: 20 * time.Millisecond, PollerWait: true})
	if err != nil {
		if errors.Is(err, probe.ErrPermission) || errors.Is(err, probe.ErrNoBTF) || errors.Is(err, probe.ErrTracepointMissing) {
			t.Skipf("probe unavailable: %v", err)
		}
		require.NoError(t, err, "load the BPF probe")
	}
	lv := &live{dr: &driver{det: detector.New(c.Config())}, p: p, rec: &Recording{Device: l.Dev, Files: map[string]probe.FileKey{}}}
	for _, path := range []string{w.seqA, w.frag, w.rnd, w.bg} {
		var st unix.Stat_t
		require.NoError(t, unix.Stat(path, &st))
		lv.rec.Files[path] = probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}
	}
	ctx, cancel := context.WithCancel(context.Background())
	lv.cancel = cancel
	lv.rec.Start = clock.Monotonic{}.Now()
	lv.wg.Add(2)
	go func() {
		defer lv.wg.Done()
		lv.runErr = p.Run(ctx, probe.HandlerFuncs{Record: func(r probe.Record) {
			lv.dr.det.Observe(r)
			lv.mu.Lock()
			lv.rec.Records = append(lv.rec.Records, r)
			lv.mu.Unlock()
		}})
	}()
	logEntered := func(now time.Duration, rs []detector.Regime) {
		for _, r := range rs {
			t.Logf("entered at %s: %s dev %s file %s conf %.2f: %s", now, r.Kind, r.Device, r.File, r.Confidence, r.Evidence)
		}
	}
	go func() {
		defer lv.wg.Done()
		// The daemon's loop (cmd/readaheadd run.go): two tickers.
		tick := time.NewTicker(c.Interval)
		defer tick.Stop()
		var fastC <-chan time.Time
		if c.Fast > 0 {
			fast := time.NewTicker(c.Fast)
			defer fast.Stop()
			fastC = fast.C
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				now := clock.Monotonic{}.Now()
				lv.mu.Lock()
				entered := lv.dr.evaluate(now)
				lv.mu.Unlock()
				logEntered(now, entered)
			case <-fastC:
				now := clock.Monotonic{}.Now()
				lv.mu.Lock()
				entered := lv.dr.fast(now)
				lv.mu.Unlock()
				logEntered(now, entered)
			}
		}
	}()
	t.Cleanup(func() { lv.stop(t) })
	return lv
}

// stop ends the probe and evaluations; it returns the live evaluations.
func (lv *live) stop(t *testing.T) []Eval {
	lv.mu.Lock()
	stopped := lv.stopped
	lv.stopped = true
	lv.mu.Unlock()
	if !stopped {
		lv.rec.End = clock.Monotonic{}.Now()
		lv.cancel()
		lv.wg.Wait()
		assert.NoError(t, lv.runErr, "probe run")
		assert.NoError(t, lv.p.Close(), "probe close")
		lv.rec.sortRecords()
	}
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return lv.dr.evals
}

// p99 is the 99th percentile latency of the reads of at most size
// recorded so far (0 before any).
func (lv *live) p99(size uint32) time.Duration {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	var ls []time.Duration
	for _, r := range lv.rec.Records {
		if r.Bytes <= size {
			ls = append(ls, r.Latency)
		}
	}
	slices.Sort(ls)
	return lab.Quantile(ls, 0.99)
}

// evaluations counts the Evaluate calls among evals.
func evaluations(evals []Eval) int {
	n := 0
	for _, e := range evals {
		if !e.Fast {
			n++
		}
	}
	return n
}

// sleepJitter sleeps d plus a random part of a second, so that regime
// changes fall at every phase of the evaluation ticker.
func sleepJitter(d time.Duration, rng *rand.Rand) {
	time.Sleep(d + time.Duration(rng.Int64N(int64(time.Second))))
}

// finishRun stops the workload and the live detector, saves the recording
// as name when asked, and scores the evaluations against the lab's ground
// truth.
func finishRun(t *testing.T, l *lab.Lab, w *workload, lv *live, name string) Score {
	t.Helper()
	w.stop()
	require.NoError(t, w.err, "workload")
	evals := lv.stop(t)
	truth, err := l.GroundTruth()
	require.NoError(t, err)
	lv.rec.Name = name
	lv.rec.Truth = truthFromLab(truth)
	saveIfAsked(t, lv.rec)
	eps, err := lv.rec.Episodes()
	require.NoError(t, err)
	sc := ScoreRun(eps, evals, time.Second)
	t.Logf("live detector at the daemon's cadence, %d records, %d evaluations, %d fast-path entries:\n%s",
		len(lv.rec.Records), evaluations(evals), len(evals)-evaluations(evals), sc.Table())
	return sc
}

// TestDetectorLabRegimes induces each lab regime in turn on a healthy
// workload and checks the live path end to end, on a real kernel: the probe's
// records of the lab device, fed to the detector at the daemon's cadence,
// recognise every lab regime with the right kind and target and clear it.
// The acceptance targets (every episode, within 1 s, cleared within 3 s:
// targetsMissed) are timing figures, so they are checked where the timing
// is exact, on the committed recording of such a live run
// (TestDetectorReplay), and this run prints its own. The lab is a user
// space server on a shared host: when the host takes its CPU for seconds
// the emulated device really is slower, and an episode that falls in such a
// stretch is judged against what the device did, not what the lab meant (on
// a host with 8-18% steal time, two of seven runs in a day met every timing
// target, each miss a different one; in one CI job three runs in a row
// missed, one by a temporal stall still reported 10 s after its end). Live,
// each regime must be entered in three of its five episodes and cleared
// within 10 s of their end; a run that misses is run once more on a fresh
// lab (lab.RunTwice).
func TestDetectorLabRegimes(t *testing.T) {
	lab.RunTwice(t, "the live detector's regimes", regimesRun)
}

// regimesRun is one run of TestDetectorLabRegimes: the regimes it missed.
func regimesRun(t *testing.T) []string {
	// Five rounds: a median over an odd count is one episode's figure,
	// so a slow one (a loaded machine) does not decide it.
	rounds, on, off, warm := 5, 6*time.Second, 6*time.Second, 15*time.Second
	t.Logf("%d rounds of permanent, temporal, intrinsic and contention (%s on, %s+jitter off)", rounds, on, off)
	l := lab.New(t, lab.Options{})
	w := prepareFiles(t, l)
	w.start(t)
	lv := startLive(t, l, w, DaemonCadence())
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))

	time.Sleep(warm)
	// A tail regime is a tail of this device: the lab is a user space
	// server, and on a busy host its own healthy p99 reaches 10 ms or more
	// (baseline p95 4.6 ms against a median of 1.5 ms in a CI run), where
	// a +20 ms stall is no longer twice the p99 and none of five was seen.
	// The stall is three times the warm-up's p99, 20 ms at the least.
	tailExtra := max(20*time.Millisecond, (3 * lv.p99(128<<10)).Round(time.Millisecond))
	t.Logf("warm-up p99 of reads up to 128 KiB %s: temporal stalls of +%s", lv.p99(128<<10), tailExtra)
	for range rounds {
		for _, regime := range []string{"permanent", "temporal", "intrinsic", "contention"} {
			sleepJitter(off, rng)
			switch regime {
			case "permanent":
				require.NoError(t, l.SetPermanent(1500*time.Microsecond, w.seqA))
				time.Sleep(on)
				require.NoError(t, l.Clear("permanent"))
			case "temporal":
				_, err := l.SetTemporal(lab.Temporal{Period: 2 * time.Second, Duration: time.Second, Fraction: 0.05, Extra: tailExtra})
				require.NoError(t, err)
				time.Sleep(on)
				require.NoError(t, l.Clear("temporal"))
			case "intrinsic":
				require.NoError(t, l.SetIntrinsic(4, 2*time.Millisecond, w.frag))
				time.Sleep(on)
				require.NoError(t, l.Clear("intrinsic"))
			case "contention":
				c, err := l.StartContention(w.bg, 2, 1024)
				require.NoError(t, err)
				time.Sleep(on)
				require.NoError(t, c.Stop())
			}
		}
	}
	time.Sleep(off)
	sc := finishRun(t, l, w, lv, "lab-regimes")
	if m := sc.targetsMissed(); len(m) > 0 {
		t.Logf("timing targets this live run missed (checked on the recording): %v", m)
	}
	var missed []string
	for _, k := range sc.Labs {
		if ok := k.Detected - k.Uncleared; 2*ok <= k.Episodes {
			missed = append(missed, fmt.Sprintf("%s: %d of %d episodes entered as %s and cleared within 10 s (%d entered)", k.Lab, ok, k.Episodes, k.Kind, k.Detected))
		}
	}
	return missed
}

// TestDetectorLabMildShiftOnABusyHost is the permanent regime as a slow,
// busy host shows it: the lab device at 0.9 ms per request instead of 0.15
// and a process spinning on one of the two cores (the lab's server then
// answers late now and then: a long healthy tail), so +1.5 ms puts a paced
// stream at 1.6-1.7x its baseline median but moves its p95 little. Every
// episode must be entered as the file's shift, the median within 1 s of the
// onset, and no other file reported shifted. The host's own stalls add to
// the spinning process's (one CI run entered five of six; another three of
// six twice, while the shift was judged by p95s the stalls decided, before
// ShiftBodyMult), so a run that misses is run once more on a fresh lab
// (lab.RunTwice).
func TestDetectorLabMildShiftOnABusyHost(t *testing.T) {
	lab.RunTwice(t, "the mild shift's targets", mildShiftRun)
}

// mildShiftRun is one run of TestDetectorLabMildShiftOnABusyHost: the
// targets it missed.
func mildShiftRun(t *testing.T) (missed []string) {
	const rounds = 6
	l := lab.New(t, lab.Options{Model: lab.Model{Latency: 900 * time.Microsecond}})
	spin := exec.Command("sh", "-c", "while :; do :; done")
	require.NoError(t, spin.Start(), "start the spinning process")
	t.Cleanup(func() {
		_ = spin.Process.Kill()
		_ = spin.Wait()
	})
	w := prepareFiles(t, l)
	w.start(t)
	lv := startLive(t, l, w, DaemonCadence())
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	time.Sleep(15 * time.Second)
	for range rounds {
		sleepJitter(6*time.Second, rng)
		require.NoError(t, l.SetPermanent(1500*time.Microsecond, w.seqA))
		time.Sleep(6 * time.Second)
		require.NoError(t, l.Clear("permanent"))
	}
	time.Sleep(6 * time.Second)
	sc := finishRun(t, l, w, lv, "lab-mild-shift-busy")
	for _, k := range sc.Labs {
		if k.Lab != "permanent" {
			continue
		}
		require.Equal(t, rounds, k.Episodes)
		if k.Detected != k.Episodes {
			missed = append(missed, fmt.Sprintf("%d of %d episodes entered as %s", k.Detected, k.Episodes, k.Kind))
		}
		if d := median(k.Delays); len(k.Delays) > 0 && d > time.Second {
			missed = append(missed, fmt.Sprintf("median detection delay %v over 1s (all: %v)", d, k.Delays))
		}
	}
	for _, is := range sc.Instances {
		if is.Kind == detector.FileLatencyShift && is.False > 0 {
			missed = append(missed, fmt.Sprintf("%d shifts reported outside the episodes: %v", is.False, is.Evidence))
		}
	}
	return missed
}

// TestDetectorLabHealthy runs the healthy workload (sequential readers and
// background random reads) and requires zero regimes: 30 s by default, the
// 2-minute acceptance form with READAHEADD_BENCH=full. The lab is a user
// space server on a shared host: when the host takes its CPU for seconds,
// the emulated device really is slower and busier, and the detector says
// so (contention at 1.8-1.9x the baseline's latency with twice its
// requests in flight, in runs that completed 10-15% fewer requests; a
// tail inflation with 2.3-2.5% of a second's requests over twice their
// baseline p99, in both runs of one CI job). So a regime entered while the
// lab's own replies were late (labSlowAt) is the device's, and is only
// logged (the lab cannot see a stall before a request reaches it, in the
// kernel's queue to it); a run that reports any other regime is run again,
// on a fresh lab, up to three runs, and the last must report none: a
// detector that sees regimes in a healthy workload fails all three.
func TestDetectorLabHealthy(t *testing.T) {
	const runs = 3
	for attempt := 1; attempt <= runs; attempt++ {
		var reported []detector.Regime
		t.Run(fmt.Sprintf("run%d", attempt), func(t *testing.T) { reported = healthyRun(t) })
		if len(reported) == 0 {
			return
		}
		if attempt < runs {
			t.Logf("run %d reported %d regimes on the healthy lab (first: %s since %s): once more on a fresh lab", attempt, len(reported), reported[0].Kind, reported[0].Since)
			continue
		}
		assert.Empty(t, reported, "a healthy lab must give no regime (%d runs reported some)", runs)
	}
}

// healthyRun is one healthy run of TestDetectorLabHealthy: the regimes it
// reported.
func healthyRun(t *testing.T) []detector.Regime {
	d := 30 * time.Second
	if lab.Full() {
		d = 2 * time.Minute
	}
	t.Logf("healthy run of %s (READAHEADD_BENCH=full: 2 minutes)", d)
	l := lab.New(t, lab.Options{RequestLog: true})
	w := prepareFiles(t, l)
	w.start(t)
	lv := startLive(t, l, w, DaemonCadence())
	time.Sleep(d)
	w.stop()
	require.NoError(t, w.err, "workload")
	evals := lv.stop(t)
	truth, err := l.GroundTruth()
	require.NoError(t, err)
	lv.rec.Name = "lab-healthy"
	lv.rec.Truth = truthFromLab(truth)
	saveIfAsked(t, lv.rec)
	reqs, err := l.RequestLog()
	require.NoError(t, err)
	var reported []detector.Regime
	late := 0
	for _, e := range evals {
		for _, r := range e.Regimes {
			if share, slow := labSlowAt(reqs, r.Since); slow {
				late++
				t.Logf("the lab itself was slow when %s was entered (%.1f%% of its replies around it took %gx its p99): the device's, not counted: %s",
					r.Kind, 100*share, labSlowMult, r.Evidence)
				continue
			}
			reported = append(reported, r)
		}
	}
	t.Logf("%d records, %d evaluations, %d fast-path entries, %d regime reports (%d while the lab was slow), %d lab requests",
		len(lv.rec.Records), evaluations(evals), len(evals)-evaluations(evals), len(reported)+late, late, len(reqs))
	if len(reqs) > 0 {
		// One clock for both: a regime's entry is matched to the lab's
		// requests around it.
		assert.InDelta(t, float64(lv.rec.End), float64(reqs[len(reqs)-1].Start), float64(5*time.Second),
			"the lab's last request and the run's end are on one CLOCK_MONOTONIC")
	}
	for i, r := range reported {
		if i < 5 {
			share, _ := labSlowAt(reqs, r.Since)
			t.Logf("reported %s dev %s file %s since %s (lab replies over %gx their p99 around it: %.2f%%): %s", r.Kind, r.Device, r.File, r.Since, labSlowMult, 100*share, r.Evidence)
		}
	}
	assert.GreaterOrEqual(t, evaluations(evals), int(d/time.Second)-2)
	return reported
}

func saveIfAsked(t *testing.T, rec *Recording) {
	dir := os.Getenv(RecordEnv)
	if dir == "" {
		return
	}
	path := dir + "/" + rec.Name + ".rec.gz"
	require.NoError(t, rec.Save(path))
	st, err := os.Stat(path)
	require.NoError(t, err)
	t.Logf("recording saved to %s (%d records, %.1f MB)", path, len(rec.Records), float64(st.Size())/1e6)
}
