package bench

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/hdfs"
)

func tl(vals ...float64) []Point {
	var out []Point
	for i, v := range vals {
		out = append(out, Point{T: 0.1 * float64(i+1), MBps: v})
	}
	return out
}

func TestRecovery(t *testing.T) {
	// Five slow samples, then back at the target: recovered 0.5 s after onset.
	assert.InDelta(t, 0.5, Recovery(tl(10, 10, 10, 10, 10, 100, 100, 100, 100, 100), 100, 0.9, 100*time.Millisecond), 1e-9)
	// Never slow: 0.
	assert.InDelta(t, 0, Recovery(tl(100, 100, 100, 100, 100), 100, 0.9, 100*time.Millisecond), 1e-9)
	// Never recovered: -1.
	assert.Equal(t, -1.0, Recovery(tl(50, 50, 50, 50, 50, 50), 100, 0.9, 100*time.Millisecond))
	// Samples before onset do not count.
	pre := append([]Point{{T: -0.2, MBps: 100}, {T: -0.1, MBps: 100}}, tl(10, 10, 10, 10, 10, 10)...)
	assert.Equal(t, -1.0, Recovery(pre, 100, 0.9, 100*time.Millisecond))
}

func TestWorstAndSettled(t *testing.T) {
	const s = 100 * time.Millisecond
	// At the target, a three-sample dip 1 s after onset, back.
	dip := tl(100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 40, 40, 40, 100, 100, 100, 100, 100, 100, 100)
	assert.InDelta(t, 0, Recovery(dip, 100, 0.9, s), 1e-9, "Recovery sees only the first recovery")
	mbps, at := Worst(dip, 300*time.Millisecond, s)
	assert.InDelta(t, 40, mbps, 1e-9)
	assert.InDelta(t, 1.0, at, 1e-9)
	// The last trailing 500 ms mean below 90 ends at 1.7 s (1.3..1.7
	// holds one slow sample), the first at or above it starts at 1.3 s.
	assert.InDelta(t, 1.3, Settled(dip, 100, 0.9, s), 1e-9)
	assert.InDelta(t, 0, Settled(tl(100, 100, 100, 100, 100), 100, 0.9, s), 1e-9)
	assert.Equal(t, -1.0, Settled(tl(100, 100, 100, 100, 100, 50, 50, 50, 50, 50), 100, 0.9, s))
	_, at = Worst(tl(1, 2), 500*time.Millisecond, s)
	assert.Equal(t, -1.0, at, "shorter than the window")
}

func TestTargetsVerdicts(t *testing.T) {
	r := &Report{Measure: 5}
	add := func(w, regime, arm string, kb int, mbps float64, tlv []Point, acts int) {
		res := Result{Workload: w, Regime: regime, Arm: arm, KB: kb, MBps: mbps, Timeline: tlv}
		for i := 0; i < acts; i++ {
			res.Actions = append(res.Actions, ActionRecord{Action: "file_window"})
		}
		r.add(res)
	}
	add(WSeq, RHealthy, "ra128", 128, 150, nil, 0)
	add(WSeq, RHealthy, "ra1024", 1024, 151, nil, 0)
	add(WSeq, RHealthy, "readaheadd", 128, 149, nil, 0)
	add(WSeq, RPermSev, "ra128", 128, 60, nil, 0)
	add(WSeq, RPermSev, "ra1024", 1024, 150, nil, 0)
	add(WSeq, RPermSev, "readaheadd", 128, 120, tl(60, 60, 60, 60, 60, 60, 60, 60, 60, 60, 150, 150, 150, 150, 150, 150), 1)
	r.finish()
	v := map[string]string{}
	for _, tg := range r.Targets {
		v[tg.Name] = tg.Verdict()
	}
	assert.Equal(t, "PASS", v["healthy, seq"])
	assert.Equal(t, "NOT MET", v["severe permanent +3ms (seq)"], "120/150 is below 0.95 of the oracle")
	assert.Equal(t, "NOT RUN", v["permanent +1.5ms (seq)"])
	assert.Equal(t, "PASS", v["reaction on already-open files"], "recovered after 1.0 s")
	g, ok := r.Group(WSeq, RPermSev)
	require.True(t, ok)
	assert.Equal(t, "ra1024", g.Oracle().Arm)
	assert.InDelta(t, 1.0, g.Daemon().RecoverySec, 1e-9)
	md := r.Markdown(nil)
	assert.Contains(t, md, "NOT MET")
	assert.Contains(t, md, "| ra1024 (oracle) |")
}

// A healthy row with a window kept: not met on a device at its bandwidth
// at the default window; met where a static window reads clearly more
// (the device's window binds the healthy stream, and the kept window pays).
func TestHealthyKeptWindowIsMetOnlyWhereAStaticWindowPays(t *testing.T) {
	verdict := func(best float64) string {
		r := &Report{Measure: 5}
		r.add(Result{Workload: WSeq, Regime: RHealthy, Arm: "ra128", KB: 128, MBps: 144})
		r.add(Result{Workload: WSeq, Regime: RHealthy, Arm: "ra1024", KB: 1024, MBps: best})
		r.add(Result{Workload: WSeq, Regime: RHealthy, Arm: "readaheadd", KB: 128, MBps: 149,
			Actions: []ActionRecord{{Action: "file_window", Result: "trial"}, {Action: "file_window", Result: "kept"}}})
		r.finish()
		for _, tg := range r.Targets {
			if tg.Name == "healthy, "+WSeq {
				return tg.Verdict()
			}
		}
		return ""
	}
	assert.Equal(t, "NOT MET", verdict(145), "the default's window reaches the bandwidth: nothing should be kept")
	assert.Equal(t, "PASS", verdict(149.6), "a static window reads 1.04x: the kept window pays")
}

// TestBenchShort runs the reduced hand-picked set (`make bench-short`) and
// prints its figures and targets. Targets that are not met are printed as
// NOT MET, not failed: these machines are shared and noisy, and the figures
// are the deliverable. The test fails when a run cannot be carried out or
// leaves something behind. READAHEADD_HDFS=1 adds HDFS. Not in CI (about 3
// minutes): the scenario matrix's short set (TestMatrixShort) reports the
// same classes there, each against every static window it runs.
func TestBenchShort(t *testing.T) {
	if os.Getenv("READAHEADD_BENCH") != "short" {
		t.Skip("set READAHEADD_BENCH=short (root) to run the reduced hand-picked set (make bench-short)")
	}
	if os.Geteuid() != 0 {
		t.Skip(errNotRoot.Error())
	}
	cfg := ShortConfig()
	if hdfs.Enabled() {
		hdfs.Skip(t)
		cfg.HDFS = true
	}
	cfg.WorkDir = t.TempDir()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, cfg)
	require.NoError(t, err)
	rep.Short = true
	t.Log("\n" + rep.Summary())
	if out := os.Getenv("READAHEADD_BENCH_OUT"); out != "" {
		require.NoError(t, Write(rep, out))
	} else {
		require.NoError(t, Write(rep, filepath.Join(t.TempDir(), "results")))
	}
	require.NotEmpty(t, rep.Targets)
}

func TestDecisionsAndCostTable(t *testing.T) {
	r := &Report{Measure: 5}
	r.add(Result{Workload: WSeq, Regime: RPerm, Arm: "ra128", KB: 128, MBps: 90})
	r.add(Result{Workload: WSeq, Regime: RPerm, Arm: "readaheadd", KB: 128, MBps: 140,
		Usage: Usage{CPUSeconds: 0.5, WallSec: 10, RSSMB: 30, HWMMB: 32},
		Actions: []ActionRecord{
			{Action: "file_window", FromKB: 128, ToKB: 256, Result: "trial", At: time.Second},
			{Action: "file_window", FromKB: 128, ToKB: 256, Result: "applied", At: time.Second},
			{Action: "file_window", FromKB: 128, ToKB: 256, Result: "kept", At: 2 * time.Second},
		}})
	r.finish()
	dec, applied := decisions(r.Results[1].Actions)
	assert.Len(t, dec, 2)
	assert.Equal(t, 1, applied)
	md := r.Markdown([]string{"x.png"})
	assert.Contains(t, md, "| seq | permanent+1.5ms | 0.50 | 10 | 5.0 | 30.0 | 32.0 | 2 | 1 |")
	assert.Contains(t, md, "re-applications")
	assert.Contains(t, md, "![x.png](x.png)")
	assert.Contains(t, r.Summary(), "decisions=2 reapplied=1")
}

func TestDedupeActions(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := ActionRecord{Action: "file_window", Target: "/x", FromKB: 128, ToKB: 256, Result: "trial", Evidence: "e"}
	b := a
	b.Time = t0.Add(30 * time.Microsecond) // the same action, seen by a later poll
	a.Time = t0
	c := a
	c.Time = t0.Add(2 * time.Second) // the same step again, later: a new action
	d := a
	d.Result = "kept"
	out := DedupeActions([]ActionRecord{a, b, d, c})
	require.Len(t, out, 3)
	assert.Equal(t, "kept", out[1].Result)
	// Two such actions, each seen by poll after poll: still two.
	c2 := c
	c2.Time = c.Time.Add(time.Millisecond)
	assert.Len(t, DedupeActions([]ActionRecord{a, c, b, c2, a, c}), 2)
}

func TestHDFSStarts(t *testing.T) {
	assert.Nil(t, hdfsStarts(nil), "no start conditions asked for: none run")
	// The main HDFS arm already is slow-before-open: the onset during the
	// read takes its place.
	assert.Equal(t, []string{SOnset, SBeforeDaemon, SBeforeDaemonSaved}, hdfsStarts(Starts))
	assert.Equal(t, []string{SOnset, SBeforeDaemon}, hdfsStarts([]string{SBeforeDaemon}))
}

func TestFirstFileAction(t *testing.T) {
	acts := []ActionRecord{
		{Action: "file_window", Target: "/m/blk_1", Result: "trial", At: -3 * time.Second}, // warm-up
		{Action: "file_window", Target: "/other", Result: "trial", At: 100 * time.Millisecond},
		{Action: "file_window", Target: "/m/blk_1", Result: "applied", At: 200 * time.Millisecond},
		{Action: "device_window", Target: "/m/blk_1", Result: "trial", At: 300 * time.Millisecond},
		{Action: "file_window", Target: "7:0/42", Result: "trial", At: 400 * time.Millisecond},
		{Action: "file_window", Target: "/m/blk_1", Result: "kept", At: 500 * time.Millisecond},
	}
	assert.InDelta(t, 0.5, firstFileAction(acts, "/m/blk_1", ""), 1e-9)
	assert.InDelta(t, 0.4, firstFileAction(acts, "/m/blk_1", "/42"), 1e-9, "named by its inode")
	assert.Equal(t, -1.0, firstFileAction(acts, "/m/blk_2", ""))
}

// On the mixed device a start row passes only if the random reader beside
// the stream keeps its service under the default window too.
func TestMixedStartRowsHoldTheRandomReader(t *testing.T) {
	r := &Report{Measure: 8}
	r.add(Result{Workload: WMixed, Regime: RPermSev, Arm: "ra128", KB: 128, MBps: 55, RandTouchesPerSec: 600, RandP99ms: 2.5})
	r.add(Result{Workload: WMixed, Regime: RPermSev, Arm: "ra512", KB: 512, MBps: 100, RandTouchesPerSec: 100, RandP99ms: 11})
	r.add(Result{Workload: WMixed, Regime: RPermSev, Arm: "readaheadd", KB: 128, MBps: 95, RandTouchesPerSec: 800, RandP99ms: 2.6})
	r.Starts = []StartResult{
		{Workload: WMixed, Regime: RPermSev, Start: SBeforeOpen, MBps: 95, RandTouchesPerSec: 560, RandP99ms: 2.6},
		{Workload: WMixed, Regime: RPermSev, Start: SBeforeDaemon, MBps: 95, RandTouchesPerSec: 700, RandP99ms: 2.9},
		{Workload: WMixed, Regime: RPermSev, Start: SBeforeDaemonSaved, MBps: 85, RandTouchesPerSec: 700, RandP99ms: 2.6},
	}
	var got []string
	for _, row := range r.StartRows() {
		got = append(got, fmt.Sprintf("%s %s %.2f %.2f", row.Start, row.Verdict, row.RandTouches, row.RandP99))
	}
	assert.Equal(t, []string{
		"onset PASS 1.33 1.04",
		"slow-before-open NOT MET 0.93 1.04",         // touches below 0.95
		"slow-before-daemon NOT MET 1.17 1.16",       // p99 above 1.10
		"slow-before-daemon-saved NOT MET 1.17 1.04", // the stream below 0.90 of the best
	}, got)
	assert.Contains(t, r.Markdown(nil), "| seq+mmap | permanent+3ms | onset | ra512 | 100.0 | 55.0 | 95.0 | 0.95 | 1.73 | 1.33 | 1.04 |")
}

func TestStartRows(t *testing.T) {
	r := &Report{Measure: 8}
	for _, w := range []string{WSeq, WHDFS} {
		r.add(Result{Workload: w, Regime: RPermSev, Arm: "ra128", KB: 128, MBps: 60})
		r.add(Result{Workload: w, Regime: RPermSev, Arm: "ra2048", KB: 2048, MBps: 150})
		r.add(Result{Workload: w, Regime: RPermSev, Arm: "readaheadd", KB: 128, MBps: 140, Actions: []ActionRecord{
			{Action: "file_window", Result: "undone", At: -2 * time.Second},
			{Action: "file_window", Result: "trial", At: 400 * time.Millisecond},
		}})
	}
	r.Starts = []StartResult{
		{Workload: WSeq, Regime: RPermSev, Start: SBeforeDaemon, MBps: 140, FirstActionSec: 1},
		{Workload: WHDFS, Regime: RPermSev, Start: SBeforeDaemonSaved, MBps: 137, FirstActionSec: 0.1, Note: "state: priors.json"},
		{Workload: WHDFS, Regime: RPermSev, Start: SOnset, MBps: 130, FirstActionSec: -1},
		{Workload: WHDFS, Regime: RPermSev, Start: SBeforeDaemon, MBps: 134, FirstActionSec: 0.9},
	}
	rows := r.StartRows()
	var got []string
	for _, row := range rows {
		got = append(got, fmt.Sprintf("%s %s %.0f %s %.2f %.1f", row.Workload, row.Start, row.MBps, row.Verdict, row.Goal, row.FirstActionSec))
	}
	assert.Equal(t, []string{
		// seq: the main arm is the onset case; 140/150 = 0.93 < 0.95.
		"seq onset 140 NOT MET 0.95 0.4",
		"seq slow-before-daemon 140 NOT MET 0.95 1.0",
		// HDFS: the main arm is slow before the DataNode's open; rows in
		// start order; 135 of 150 is the 0.90 goal.
		"hdfs onset 130 NOT MET 0.90 -1.0",
		"hdfs slow-before-open 140 PASS 0.90 0.4",
		"hdfs slow-before-daemon 134 NOT MET 0.90 0.9",
		"hdfs slow-before-daemon-saved 137 PASS 0.90 0.1",
	}, got)
	md := r.Markdown(nil)
	assert.Contains(t, md, "| hdfs | permanent+3ms | slow-before-daemon-saved | ra2048 | 150.0 | 60.0 | 137.0 | 0.91 | 2.28 | - | - | 0.10 | [] | PASS (0.90) |")
	assert.Contains(t, md, "| hdfs | permanent+3ms | onset | ra2048 | 150.0 | 60.0 | 130.0 | 0.87 | 2.17 | - | - | none | [] | NOT MET (0.90) |")
	assert.Contains(t, md, "- hdfs, permanent+3ms, slow-before-daemon-saved: state: priors.json")
	// Not maskable: the best static window is within 1.05x the default.
	r.Results[1].MBps = 62
	r.Results[4].MBps = 62
	for _, row := range r.StartRows() {
		assert.Equal(t, "not maskable", row.Verdict)
	}
}

// TestHealthyMixedTargetHoldsTheRandomReader: on a healthy device with a
// stream beside an mmap random reader, the stream keeping its rate is not
// enough; the random reader must keep its touches and its p99 too.
func TestHealthyMixedTargetHoldsTheRandomReader(t *testing.T) {
	verdict := func(touches, p99 float64) (string, string) {
		r := &Report{Measure: 5}
		r.add(Result{Workload: WMixed, Regime: RHealthy, Arm: "ra128", KB: 128, MBps: 100, RandTouchesPerSec: 500, RandP99ms: 2})
		r.add(Result{Workload: WMixed, Regime: RHealthy, Arm: "ra1024", KB: 1024, MBps: 101, RandTouchesPerSec: 60, RandP99ms: 20})
		r.add(Result{Workload: WMixed, Regime: RHealthy, Arm: "readaheadd", KB: 128, MBps: 100, RandTouchesPerSec: touches, RandP99ms: p99})
		r.finish()
		for _, tg := range r.Targets {
			if tg.Name == "healthy, "+WMixed {
				return tg.Verdict(), tg.Figure
			}
		}
		return "", ""
	}
	v, fig := verdict(495, 2.1)
	assert.Equal(t, "PASS", v, fig)
	v, fig = verdict(495, 2.3)
	assert.Equal(t, "NOT MET", v, "p99 1.15x the default's: %s", fig)
	v, fig = verdict(450, 2.0)
	assert.Equal(t, "NOT MET", v, "touches 0.90x the default's: %s", fig)
	assert.Contains(t, FullConfig().Cases, Case{WMixed, RHealthy}, "the full matrix runs the healthy mixed device")
}

// A mixed-device row run several times is the median of its runs, figure by
// figure (one run's stray p99 decides nothing), and the report lists each
// run beside the default window's.
func TestMixedRowsRunSeveralTimesAreMedians(t *testing.T) {
	assert.Equal(t, 1, Config{MixedReps: 3}.reps(WSeq))
	assert.Equal(t, 3, Config{MixedReps: 3}.reps(WMixed))
	assert.Equal(t, 1, Config{}.reps(WMixed))

	def := medianResult([]Result{
		{Workload: WMixed, Regime: RPerm, Arm: "ra128", KB: 128, MBps: 74, RandTouchesPerSec: 550, RandP99ms: 7.6},
		{Workload: WMixed, Regime: RPerm, Arm: "ra128", KB: 128, MBps: 72, RandTouchesPerSec: 530, RandP99ms: 4.3},
		{Workload: WMixed, Regime: RPerm, Arm: "ra128", KB: 128, MBps: 73, RandTouchesPerSec: 560, RandP99ms: 2.9},
	})
	assert.InDelta(t, 73, def.MBps, 1e-9)
	assert.InDelta(t, 4.3, def.RandP99ms, 1e-9, "the stray 7.6 ms run decides nothing")
	assert.InDelta(t, 550, def.RandTouchesPerSec, 1e-9)
	require.Len(t, def.Runs, 3)

	r := &Report{Measure: 8}
	r.add(def)
	r.add(Result{Workload: WMixed, Regime: RPerm, Arm: "ra2048", KB: 2048, MBps: 98, RandTouchesPerSec: 25, RandP99ms: 49})
	r.add(medianResult([]Result{
		{Workload: WMixed, Regime: RPerm, Arm: "readaheadd", KB: 128, MBps: 100, RandTouchesPerSec: 600, RandP99ms: 3.0},
		{Workload: WMixed, Regime: RPerm, Arm: "readaheadd", KB: 128, MBps: 104, RandTouchesPerSec: 640, RandP99ms: 6.0},
		{Workload: WMixed, Regime: RPerm, Arm: "readaheadd", KB: 128, MBps: 90, RandTouchesPerSec: 580, RandP99ms: 4.0},
	}))
	r.Starts = []StartResult{medianStart([]StartResult{
		{Workload: WMixed, Regime: RPerm, Start: SBeforeOpen, MBps: 95, RandTouchesPerSec: 600, RandP99ms: 4.4, DaemonLog: "a"},
		{Workload: WMixed, Regime: RPerm, Start: SBeforeOpen, MBps: 99, RandTouchesPerSec: 610, RandP99ms: 4.6, DaemonLog: "b"},
		{Workload: WMixed, Regime: RPerm, Start: SBeforeOpen, MBps: 97, RandTouchesPerSec: 590, RandP99ms: 7.0, DaemonLog: "c"},
	})}
	assert.Equal(t, "c", r.Starts[0].DaemonLog, "the log of the run of median throughput")
	rows := r.StartRows()
	require.Len(t, rows, 2)
	assert.InDelta(t, 100, rows[0].MBps, 1e-9)
	assert.InDelta(t, 4.0/4.3, rows[0].RandP99, 1e-9)
	assert.Equal(t, "PASS", rows[0].Verdict)
	assert.InDelta(t, 4.6/4.3, rows[1].RandP99, 1e-9)
	md := r.Markdown(nil)
	assert.Contains(t, md, "median of 3 runs")
	assert.Contains(t, md, "- seq+mmap, permanent+1.5ms, slow-before-open: readaheadd 95.0 / 4.40, 99.0 / 4.60, 97.0 / 7.00; default 74.0 / 7.60, 72.0 / 4.30, 73.0 / 2.90")
}

// A random reader set to re-open its file does so at every eviction, on a
// new descriptor, and the report says the rows ran with it.
func TestRandomReaderReopensItsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "random.dat")
	require.NoError(t, os.WriteFile(path, make([]byte, 1<<20), 0o644))
	m, err := openMmapRandom(path)
	require.NoError(t, err)
	defer m.Close()
	m.reopen = true
	first := m.f
	ctx, cancel := context.WithTimeout(context.Background(), evictEvery*5/2)
	defer cancel()
	require.NoError(t, m.run(ctx, 1))
	assert.GreaterOrEqual(t, m.reopens, 1)
	assert.NotSame(t, first, m.f)
	assert.NotEmpty(t, m.since(time.Time{}), "it touched pages through the new mapping")

	r := &Report{RandomReopen: true}
	assert.Contains(t, r.Markdown(nil), "random reader re-opens its file every 250ms")
	assert.NotContains(t, (&Report{}).Markdown(nil), "re-opens")
}

// The random reader's p99 per second locates its tail in a run.
func TestRandomP99PerSecond(t *testing.T) {
	t0 := time.Now()
	m := &mmapRandom{}
	for i := 0; i < 100; i++ { // second 0: 1 ms each
		m.ts, m.lat = append(m.ts, t0.Add(time.Duration(i)*5*time.Millisecond)), append(m.lat, time.Millisecond)
	}
	for i := 0; i < 100; i++ { // second 2: 4 ms each; second 1 empty
		m.ts, m.lat = append(m.ts, t0.Add(2*time.Second+time.Duration(i)*5*time.Millisecond)), append(m.lat, 4*time.Millisecond)
	}
	assert.Equal(t, []float64{1, 0, 4}, m.p99PerSecond(t0))
	assert.Equal(t, []float64{4}, m.p99PerSecond(t0.Add(2*time.Second)))
}

// Permanent slowdowns of any severity run under one name scheme; the
// matrix's two are instances of it, and nothing else parses as one.
func TestPermanentExtra(t *testing.T) {
	for name, want := range map[string]time.Duration{
		RPerm: 1500 * time.Microsecond, RPermSev: 3 * time.Millisecond,
		"permanent+2ms": 2 * time.Millisecond, "permanent+800us": 800 * time.Microsecond,
	} {
		d, ok := PermanentExtra(name)
		assert.True(t, ok, name)
		assert.Equal(t, want, d, name)
	}
	for _, name := range []string{RHealthy, RTemporal, RIntrinsic, "permanent", "permanent+", "permanent+2", "permanent+-1ms", "permanent+5s"} {
		_, ok := PermanentExtra(name)
		assert.False(t, ok, name)
	}
}
