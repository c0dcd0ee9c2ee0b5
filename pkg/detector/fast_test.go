package detector

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

func TestFastPathEntersAStrongShiftWithinAFewHundredMilliseconds(t *testing.T) {
	s, seq := labMix(21)
	onset := 30*sec + 300*time.Millisecond
	seq.extra = func(t time.Duration) time.Duration {
		if t >= onset {
			return 3 * time.Millisecond
		}
		return 0
	}
	d := New(DefaultConfig())
	var tl timeline
	s.run(d, 30*sec, interval, tl.add)
	entered := runFast(s, d, 33*sec, &tl)
	require.Len(t, entered, 1, "only the slowed file: %v", entered)
	at, ok := entered[seq.file.String()]
	require.True(t, ok)
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
	s, seq := labMix(22)
	onset := 30*sec + 300*time.Millisecond
	seq.extra = func(t time.Duration) time.Duration {
		if t >= onset {
			return 3 * time.Millisecond
		}
		return 0
	}
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
