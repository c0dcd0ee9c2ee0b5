package tuner

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A knee found while the stream read at the device's bandwidth, held by a
// stream that then reads far below that rate at the same window (its
// reader stalled by page reclaim), is probed again at once, not after
// BackoffMax: the step it held back pays now and is kept.
func TestStaleKneeIsProbedAgain(t *testing.T) {
	r := newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true}, nil)
	stalled := false
	r.tput = func(kb int) float64 {
		if stalled {
			return min(float64(kb)*0.2e6, 148e6) // 102 MB/s at 512 KB, 148 at 1024
		}
		return min(float64(kb)*0.6e6, 150e6) // at the bandwidth from 256 KB
	}
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	acts := r.runOutcome(12, st)
	logActs(t, acts)
	knee := r.files.window[key]
	require.Equal(t, 512, knee, "the first step (sized by Little's law) is the knee")
	require.Zero(t, r.tn.Status().Events[EvKneeStale])

	stalled = true
	acts = r.runOutcome(8, st)
	logActs(t, acts)
	assert.Equal(t, uint64(1), r.tn.Status().Events[EvKneeStale])
	assert.NotEmpty(t, filter(acts, KindFileWindow, ResultKept), "the step past the old knee pays now")
	assert.Greater(t, r.files.window[key], knee)
}

// A stream whose rate falls for reasons no window can mend costs one
// re-probe and its confirmation: the knee they find again is anchored at the
// stream's new rate, so it is not stale a second time while that rate holds.
func TestStaleKneeIsReprobedOnceWhenNothingPays(t *testing.T) {
	r := newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true, BackoffMax: time.Minute}, nil)
	slow := false
	r.tput = func(kb int) float64 {
		if slow {
			return min(float64(kb)*0.6e6, 100e6) // limited elsewhere: no window pays
		}
		return min(float64(kb)*0.6e6, 150e6)
	}
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	r.runOutcome(12, st)
	knee := r.files.window[key]
	require.Equal(t, 512, knee)

	slow = true
	acts := r.runOutcome(120, st)
	logActs(t, acts)
	assert.Equal(t, uint64(1), r.tn.Status().Events[EvKneeStale])
	// The re-probe, its confirmation BackoffBase later, then one probe per
	// BackoffMax.
	assert.LessOrEqual(t, len(filter(acts, KindFileWindow, ResultTrial)), 4)
	for _, a := range filter(acts, KindFileWindow, ResultKept) {
		assert.LessOrEqual(t, a.ToKB, knee, "nothing past the knee paid: %s", a.Evidence)
	}
	assert.Equal(t, knee, r.files.window[key])
}

// A stream whose rate keeps falling re-anchors its knee at each re-probe;
// the re-probes back off exponentially between themselves.
func TestStaleKneeReprobesBackOff(t *testing.T) {
	r := newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true, BackoffMax: 5 * time.Minute}, nil)
	cap := 150e6
	r.tput = func(kb int) float64 { return min(float64(kb)*0.6e6, cap) }
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	r.runOutcome(12, st)
	require.Equal(t, 512, r.files.window[key])
	var staleAt []time.Duration
	last := uint64(0)
	for i := 0; i < 120; i++ {
		cap *= 0.97 // 3% less each second: no window mends it
		r.runOutcome(1, st)
		if n := r.tn.Status().Events[EvKneeStale]; n != last {
			staleAt, last = append(staleAt, r.clk.Now()), n
		}
	}
	t.Logf("re-probes at %v", staleAt)
	require.GreaterOrEqual(t, len(staleAt), 3)
	for i := 2; i < len(staleAt); i++ {
		assert.Greater(t, staleAt[i]-staleAt[i-1], staleAt[i-1]-staleAt[i-2]-time.Second, "spaced by a growing back-off")
	}
	assert.LessOrEqual(t, len(staleAt), 7)
}

// A knee the random readers' loss set does not go stale with the stream's
// rate: what a larger window costs them does not change with it.
func TestRandomLossKneeIsNeverStale(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	stalled := false
	r.tput = func(kb int) float64 {
		if stalled {
			return slowedModel(kb) / 2
		}
		return slowedModel(kb)
	}
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	r.runBeside(12, st, severeAbove256)
	require.Equal(t, 192, r.files.window[key], "the random reader's loss set the knee")
	require.True(t, r.tn.files[key].win.back.kneeRandom)
	stalled = true
	acts := r.runBeside(20, st, severeAbove256)
	logActs(t, acts)
	assert.Zero(t, r.tn.Status().Events[EvKneeStale])
	for _, a := range filter(acts, KindFileWindow, ResultTrial) {
		assert.LessOrEqual(t, a.ToKB, 192, "no step past the random reader's knee")
	}
}
