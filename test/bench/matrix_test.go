package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/lab"
)

func arm(kb int, daemon bool, mbps float64, rnd ...RandomFig) MatrixArm {
	a := MatrixArm{Arm: Static(kb).Name, KB: kb, Daemon: daemon, Run: 1, StreamsMBps: mbps, Randoms: rnd, Amp: 1}
	if daemon {
		a.Arm = Readaheadd.Name
	}
	return a
}

func rf(rate, p99 float64, buckets ...float64) RandomFig {
	return RandomFig{TouchesPerSec: rate, P99ms: p99, P99PerSec: buckets}
}

// The verdict's rules on figures made up to sit on each side of a bound.
func TestMatrixVerdict(t *testing.T) {
	// A static window helps the stream, but 1024 KB costs the random
	// reader: the best admissible is 512 KB at 140.
	base := []MatrixArm{
		arm(128, false, 60, rf(200, 10, 10, 11)),
		arm(512, false, 140, rf(195, 10.5)),
		arm(1024, false, 150, rf(100, 30)),
	}
	v := Verdict(append(base, arm(128, true, 130, rf(190, 10.9, 12, 19))))
	assert.Equal(t, Met, v.Verdict, v.Reasons)
	assert.True(t, v.Helps)
	assert.Equal(t, 1024, v.BestKB)
	assert.Equal(t, 512, v.BestAdmKB)
	assert.InDelta(t, 130.0/140, v.DaemonMBps/v.BestAdmMBps, 1e-9)

	for name, dm := range map[string]MatrixArm{
		"streams below 0.9 of the best admissible": arm(128, true, 120, rf(200, 10)),
		"random reader's rate below 0.9x":          arm(128, true, 140, rf(170, 10)),
		"random reader's p99 above 1.10x":          arm(128, true, 140, rf(200, 11.5)),
		"a second's p99 above 2x":                  arm(128, true, 140, rf(200, 10, 9, 21)),
	} {
		v := Verdict(append(base, dm))
		assert.Equal(t, NotMet, v.Verdict, name)
		assert.Len(t, v.Reasons, 1, "%s: %v", name, v.Reasons)
	}
	// A second the default's own runs reach is noise: 2.5x beside a
	// default that reached 2.6x by itself is met; 2.7x is not.
	noisy := append([]MatrixArm{arm(128, false, 60, rf(200, 10, 10, 26))}, base[1:]...)
	assert.Equal(t, Met, Verdict(append(noisy, arm(128, true, 140, rf(200, 10, 9, 25)))).Verdict)
	assert.Equal(t, NotMet, Verdict(append(noisy, arm(128, true, 140, rf(200, 10, 9, 27)))).Verdict)
	amp := arm(128, true, 140, rf(200, 10))
	amp.Amp = 1.2
	assert.Equal(t, NotMet, Verdict(append(base, amp)).Verdict, "amplification 1.2x the default's")

	// No static window helps (a saturated device): the default is kept,
	// and a window kept fails even at the same throughput.
	flat := []MatrixArm{arm(128, false, 100), arm(512, false, 103), arm(4096, false, 104)}
	v = Verdict(append(flat, arm(128, true, 98)))
	assert.Equal(t, Met, v.Verdict, v.Reasons)
	assert.False(t, v.Helps)
	kept := arm(128, true, 101)
	kept.Kept = 2
	assert.Equal(t, NotMet, Verdict(append(flat, kept)).Verdict)
	// Unless it paid: a per-file window beats every static value.
	paid := arm(128, true, 106)
	paid.Kept = 1
	assert.Equal(t, Met, Verdict(append(flat, paid)).Verdict)
	assert.Equal(t, NotMet, Verdict(append(flat, arm(128, true, 96))).Verdict, "0.96 of the default")

	// Two default runs: the mean is the reference, their spread reported.
	two := []MatrixArm{arm(128, false, 90), arm(512, false, 92), arm(128, true, 98)}
	again := arm(128, false, 110)
	again.Run = 2
	v = Verdict(append(two, again))
	assert.InDelta(t, 100, v.DefaultMBps, 1e-9)
	assert.InDelta(t, 0.2, v.Spread, 1e-9)
	assert.Equal(t, Met, v.Verdict, v.Reasons)

	assert.Equal(t, NotMet, Verdict([]MatrixArm{arm(512, false, 1), arm(128, true, 1)}).Verdict, "no default arm")
}

// CI's short matrix on the lab (root, about 2.5 minutes): the whole device
// slow beside a bursty reader, and a saturated device, each with the
// default, 512 KB and readaheadd for 20 s. It prints the rows and fails on
// a harness error; until the control loop is redesigned a `not met` only
// fails with READAHEADD_MATRIX_STRICT=1.
func TestMatrixShort(t *testing.T) {
	if err := lab.Available(); err != nil {
		t.Skipf("lab: %v", err)
	}
	cfg := ShortMatrixConfig()
	cfg.DaemonBin = os.Getenv("READAHEADD_BIN")
	cfg.WorkDir = t.TempDir()
	t0 := time.Now()
	rows, err := RunMatrix(context.Background(), cfg, ShortMatrixScenarios())
	for _, r := range rows {
		t.Logf("%s (%.0f s, load %s)", RowText(r), r.Seconds, r.Load)
		if r.Verdict.Verdict != Met {
			t.Logf("  %s not met: %v", r.Scenario.Name, r.Verdict.Reasons)
		}
	}
	require.NoError(t, err, "the matrix harness failed")
	require.Len(t, rows, len(ShortMatrixScenarios()))
	for _, r := range rows {
		require.Len(t, r.Arms, 3, "%s: default, 512 KB, readaheadd", r.Scenario.Name)
		for _, a := range r.Arms {
			assert.Positive(t, a.StreamsMBps, "%s/%s: streams read nothing", r.Scenario.Name, a.Arm)
			assert.GreaterOrEqual(t, a.Seconds, 20.0, "%s/%s: arm shorter than 20 s", r.Scenario.Name, a.Arm)
			// The daemon's start-up inside the arm (whole-device-bursty starts
			// it after the slowdown) must not lengthen it: a periodic slowdown
			// would weigh differently in arms of different spans.
			assert.InDelta(t, cfg.Measure.Seconds(), a.Seconds, 0.5, "%s/%s: every arm measures the same span", r.Scenario.Name, a.Arm)
			assert.Len(t, a.Randoms, len(r.Scenario.Randoms()))
			for _, x := range a.Randoms {
				assert.Positive(t, x.TouchesPerSec, "%s/%s: random reader touched nothing", r.Scenario.Name, a.Arm)
			}
		}
		if os.Getenv("READAHEADD_MATRIX_STRICT") == "1" {
			assert.Equal(t, Met, r.Verdict.Verdict, "%s: %v", r.Scenario.Name, r.Verdict.Reasons)
		}
	}
	t.Logf("short matrix: %.0f s", time.Since(t0).Seconds())
}

// A scenario with a real DataNode fails at once, before any lab is made,
// with what is missing named, when HDFS cannot run (here: no Maven to build
// the server, no java); a set without one does not ask for either.
func TestMatrixHDFSMissingToolsNamed(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("READAHEADD_HDFS_SRC", t.TempDir()) // no cached build
	sc, ok := lab.NamedScenario("hdfs-slow-dir")
	require.True(t, ok)
	_, err := RunMatrix(context.Background(), MatrixConfig{Measure: time.Second}, []lab.MatrixScenario{sc})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "hdfs-slow-dir")
	// Maven is asked for first unless a build of the DataNode's jar is
	// cached; either way the missing tool is named with its package.
	assert.Regexp(t, `(mvn|java) not found in PATH \(install `, err.Error())
	other, _ := lab.NamedScenario("saturated-streams")
	assert.NoError(t, checkHDFS(context.Background(), []lab.MatrixScenario{other}))
}

// TestKeptInArm: a step kept and undone before the measured period does not
// count; one kept before it and still in force does, as does one kept in it.
func TestKeptInArm(t *testing.T) {
	s := time.Second
	rec := func(at time.Duration, action, target string, from, to int, result string) ActionRecord {
		return ActionRecord{At: at, Action: action, Target: target, FromKB: from, ToKB: to, Result: result}
	}
	warmUp := []ActionRecord{
		rec(-5*s, "file_trim", "a", 128, 16, "trial"),
		rec(-4*s, "file_trim", "a", 128, 16, "kept"),
		rec(-2*s, "file_trim_undo", "a", 16, 128, "undone"),
	}
	assert.Equal(t, 0, keptInArm(warmUp), "kept and undone before the period")
	stillOn := []ActionRecord{
		rec(-5*s, "file_window", "b", 128, 256, "kept"),
		rec(-4*s, "file_window", "b", 256, 512, "trial"),
		rec(-3*s, "file_window_undo", "b", 512, 256, "undone"),
	}
	assert.Equal(t, 1, keptInArm(stillOn), "kept before the period, in force at its start")
	assert.Equal(t, 2, keptInArm(append(stillOn, rec(2*s, "file_window", "c", 128, 256, "kept"))), "and one kept in it")
}
