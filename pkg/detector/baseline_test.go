package detector

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// learnedDetector runs the healthy lab mix long enough to learn a baseline.
func learnedDetector(t *testing.T, seed uint64) *Detector {
	t.Helper()
	s, _ := labMix(seed)
	d := New(DefaultConfig())
	s.run(d, 20*sec, interval, nil)
	snap := d.Evaluate(20 * sec)
	require.True(t, snap.Devices[0].BaselineLearned)
	return d
}

func TestBaselineRoundTrip(t *testing.T) {
	d := learnedDetector(t, 21)
	path := filepath.Join(t.TempDir(), "baseline.json")
	require.NoError(t, d.SaveBaseline(path))
	d2 := New(DefaultConfig())
	require.NoError(t, d2.LoadBaseline(path))
	a, b := d.Evaluate(21 * sec).Devices[0], d2.Evaluate(21 * sec).Devices[0]
	assert.Equal(t, a.Baselines, b.Baselines)
	assert.InDelta(t, a.BaselineInflight, b.BaselineInflight, 1e-9)
	assert.Greater(t, b.CapacityBPS, 100e6)
	// No temporary files are left behind.
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1)
}

// The p99 is averaged over fewer windows than the p50 and p95, so the
// learned averages can fall out of order; what the daemon saves it must
// load back at its next start.
func TestBaselineWithItsAveragesOutOfOrderLoadsBack(t *testing.T) {
	d := learnedDetector(t, 21)
	d.mu.Lock()
	for _, ds := range d.devices {
		for c := range ds.base.classes {
			cb := &ds.base.classes[c]
			if cb.windows > 0 {
				cb.tailWindows = max(cb.tailWindows, 1)
				cb.p99 = cb.p95 * 0.9
			}
		}
	}
	d.mu.Unlock()
	path := filepath.Join(t.TempDir(), "baseline.json")
	require.NoError(t, d.SaveBaseline(path))
	require.NoError(t, New(DefaultConfig()).LoadBaseline(path))
}

func TestBaselineCorruptAndUnknownVersionRejected(t *testing.T) {
	dir := t.TempDir()
	d := New(DefaultConfig())
	corrupt := filepath.Join(dir, "corrupt.json")
	require.NoError(t, os.WriteFile(corrupt, []byte(`{"version":1,"devices":[{"dev":7340032,`), 0o600))
	require.ErrorContains(t, d.LoadBaseline(corrupt), "corrupt")
	future := filepath.Join(dir, "future.json")
	require.NoError(t, os.WriteFile(future, []byte(`{"version":99,"devices":[]}`), 0o600))
	require.ErrorIs(t, d.LoadBaseline(future), ErrBaselineVersion)
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"version":1,"devices":[{"device":"7:0","dev":7340032,"classes":[{"size_class":17,"p50_ns":5,"p95_ns":1,"windows":3}]}]}`), 0o600))
	require.ErrorContains(t, d.LoadBaseline(bad), "invalid values")
	require.Error(t, d.LoadBaseline(filepath.Join(dir, "missing.json")))
	// Nothing was used.
	assert.Empty(t, d.Evaluate(time.Second).Devices)
	require.Error(t, d.SaveBaseline(filepath.Join(dir, "no-such-dir", "b.json")))
}

func TestSlowdownPresentAtStartRecognisedAfterLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "baseline.json")
	require.NoError(t, learnedDetector(t, 22).SaveBaseline(path))

	// A restart while one file is already slow.
	slowFromStart := func(seed uint64) (*sim, *reader) {
		s, seq := labMix(seed)
		seq.extra = func(time.Duration) time.Duration { return 1500 * time.Microsecond }
		return s, seq
	}
	s, seq := slowFromStart(23)
	d := New(DefaultConfig())
	require.NoError(t, d.LoadBaseline(path))
	var tl timeline
	s.run(d, 10*sec, interval, tl.add)
	at, ok := tl.first(FileLatencyShift, seq.file, 0)
	require.True(t, ok, "slowdown present at start not recognised with the saved baseline")
	assert.LessOrEqual(t, at, time.Second)

	// Without the saved baseline the slow state is all the detector knows.
	s, seq = slowFromStart(24)
	fresh := New(DefaultConfig())
	var tl2 timeline
	s.run(fresh, 10*sec, interval, tl2.add)
	_, ok = tl2.first(FileLatencyShift, seq.file, 0)
	assert.False(t, ok)
}

func TestFileSlowFromStartNotLearnedAsHealthy(t *testing.T) {
	// No saved baseline, and one of two sequential files is slow from the
	// first request: the healthy one is the reference, so the slow one is
	// recognised once the baseline is learned instead of becoming it.
	s := newSim(25, labBase, labBW)
	healthy := s.addSeq(128*kib, 2)
	slow := s.addSeq(128*kib, 2)
	slow.extra = func(time.Duration) time.Duration { return 3 * time.Millisecond }
	s.addRandom(4*kib, 5*time.Millisecond)
	d := New(DefaultConfig())
	var tl timeline
	s.run(d, 15*sec, interval, tl.add)
	at, ok := tl.first(FileLatencyShift, slow.file, 0)
	require.True(t, ok, "a file slow from the start was learned as the device's healthy latency")
	assert.LessOrEqual(t, at, 5*time.Second)
	assert.Empty(t, tl.activeBetween(FileLatencyShift, healthy.file, 0, 15*sec))
	last := tl.snaps[len(tl.snaps)-1]
	require.Len(t, last.Devices, 1)
	for _, f := range last.Files {
		if f.Key == slow.file {
			assert.Less(t, float64(last.Devices[0].BaselineP50)*DefaultConfig().ShiftMult, float64(f.P50), "baseline learned from the healthy file")
		}
	}
}
