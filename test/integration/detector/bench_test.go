package detector_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
)

var cadences = []Cadence{
	// The daemon's: Evaluate every 1 s window, FastPath every 100 ms.
	DaemonCadence(),
	// Evaluate alone, once per 1 s window (the lab figures before the
	// fast path was driven).
	{Name: "1s-evaluate-only", Interval: time.Second, Config: detector.DefaultConfig},
	// Evaluate alone, four times per 1 s window; the exit count is scaled
	// so that a regime still needs 2 s below its exit threshold to clear.
	{Name: "250ms-evaluate-only", Interval: 250 * time.Millisecond, Config: func() detector.Config {
		c := detector.DefaultConfig()
		c.ExitAfter = int(2 * time.Second / (250 * time.Millisecond))
		return c
	}},
}

func recordings(tb testing.TB) []string {
	paths, err := filepath.Glob("testdata/*.rec.gz")
	require.NoError(tb, err)
	if len(paths) == 0 {
		tb.Skip("no recordings in testdata: record them with `make bench-detector` as root")
	}
	return paths
}

// BenchmarkDetectorReplay replays recorded lab runs (probe records of the
// lab device plus the lab's ground truth) through the detector at each
// cadence and prints precision, recall, detection and clear delay per
// regime kind. ns/op is the detector's cost for one whole recording.
func BenchmarkDetectorReplay(b *testing.B) {
	for _, path := range recordings(b) {
		rec, err := LoadRecording(path)
		require.NoError(b, err)
		eps, err := rec.Episodes()
		require.NoError(b, err)
		name := strings.TrimSuffix(filepath.Base(path), ".rec.gz")
		for _, c := range cadences {
			b.Run(name+"/"+c.Name, func(b *testing.B) {
				var evals []Eval
				for b.Loop() {
					evals = Replay(rec, c)
				}
				sc := ScoreRun(eps, evals, c.Interval)
				fmt.Fprintf(os.Stdout, "\n%s (%d records over %s, %d episodes), cadence %s (fast path every %s), %s", name, len(rec.Records),
					(rec.End - rec.Start).Round(time.Second), len(eps), c.Name, fmtD(c.Fast), sc.Table())
				for _, k := range sc.Labs {
					if k.Episodes == 0 {
						continue
					}
					b.ReportMetric(float64(k.Detected)/float64(k.Episodes), k.Lab+"-recall")
					if d := median(k.Delays); d >= 0 {
						b.ReportMetric(d.Seconds(), k.Lab+"-delay-s")
					}
				}
				var correct, false_ int
				for _, is := range sc.Instances {
					correct += is.Correct
					false_ += is.False
				}
				b.ReportMetric(float64(false_), "false-regimes")
				if correct+false_ > 0 {
					b.ReportMetric(float64(correct)/float64(correct+false_), "precision")
				}
			})
		}
	}
}

// TestDetectorReplay runs without root on the committed recordings of live
// lab runs: the replay is deterministic, so the detector's acceptance
// targets are checked here, where a busy host cannot move them (live, a
// late labfs thread is the device's own latency): on the regime run every
// lab regime is entered as its kind in every episode, within 1 s (median)
// and cleared within 3 s, and no regime is reported outside an episode that
// explains it; on the healthy run none is reported.
// BenchmarkDetectorReplay prints the same figures at other cadences.
func TestDetectorReplay(t *testing.T) {
	for _, path := range recordings(t) {
		rec, err := LoadRecording(path)
		require.NoError(t, err)
		eps, err := rec.Episodes()
		require.NoError(t, err)
		c := DaemonCadence()
		sc := ScoreRun(eps, Replay(rec, c), c.Interval)
		again := ScoreRun(eps, Replay(rec, c), c.Interval)
		require.Equal(t, sc.Table(), again.Table(), "replay must be deterministic")
		t.Logf("%s:\n%s", filepath.Base(path), sc.Table())
		for _, is := range sc.Instances {
			assert.Zero(t, is.False, "%s: %s reported outside the episodes: %v", filepath.Base(path), is.Kind, is.Evidence)
		}
		if len(eps) == 0 {
			continue
		}
		for _, k := range sc.Labs {
			require.Positive(t, k.Episodes, "%s: the recording has no %s episode", filepath.Base(path), k.Lab)
		}
		assert.Empty(t, sc.targetsMissed(), "%s: the detector's acceptance targets", filepath.Base(path))
	}
}
