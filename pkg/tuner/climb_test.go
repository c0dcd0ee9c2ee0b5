package tuner

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/tuner/prior"
)

// theDirsPrior returns the rig's one directory prior.
func theDirsPrior(t *testing.T, r *rig) *prior.Dir {
	dirs, _, _ := r.tn.mem.Len()
	require.Equal(t, 1, dirs)
	for p := range r.tn.mem.Dirs() {
		return p
	}
	return nil
}

// climbReady learns a 512 KB prior in data/sub0 (kneeModel: 60 MB/s at
// 128 KB, 150 at 512) and lifts the knee its stream found there, so that
// the prior may climb.
func climbReady(t *testing.T, r *rig) *prior.Dir {
	r.tput = kneeModel
	learnPrior(t, r, "blk_1")
	p := theDirsPrior(t, r)
	require.Equal(t, 512, p.Window)
	assert.Greater(t, p.KneeUntil, r.clk.Now(), "the stream's own knee holds the prior too")
	p.KneeUntil = 0
	return p
}

// openFresh opens a block file in data/sub0 for process tgid and delivers
// its first readahead event.
func (r *rig) openFresh(t *testing.T, name string, tgid uint32) probe.FileKey {
	p, k := realFile(t, filepath.Join(r.dir, "data", "sub0"), name)
	r.files.open(tgid, 9, p, k)
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: tgid, File: k, Device: sdb, RaPages: 32})
	return k
}

// Block files read whole in less than a second end before any step above
// their directory's prior can be judged on them: the prior climbs, one
// fresh open at a time trying the step above it, judged against what the
// prior's window gave its streams.
func TestPriorClimbsOneFreshOpenAtATime(t *testing.T) {
	r := newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true}, nil)
	p := climbReady(t, r)
	r.tput = func(kb int) float64 { return min(float64(kb)*0.3e6, 400e6) } // 1024 KB pays over 512
	k2 := r.openFresh(t, "blk_2", 200)
	assert.Equal(t, 1024, r.files.window[k2], "the step above the prior")
	r.clk.Advance(time.Second) // the device's write rate limit
	k3 := r.openFresh(t, "blk_3", 300)
	assert.Equal(t, 512, r.files.window[k3], "one climber at a time: the prior's window")
	acts := r.tn.applyPending()
	logActs(t, acts)
	require.Len(t, filter(acts, KindFileWindow, ResultTrial), 2)
	assert.Contains(t, acts[0].Evidence, "prior climbs")

	acts = r.runOutcome(1, stream{key: k2, tgid: 200, fill: 0.9})
	logActs(t, acts)
	kept := filter(acts, KindFileWindow, ResultKept)
	require.Len(t, kept, 1)
	assert.Equal(t, 1024, kept[0].ToKB)
	assert.Equal(t, 1024, p.Window, "the prior climbed")
	k4 := r.openFresh(t, "blk_4", 400)
	assert.Equal(t, 2048, r.files.window[k4], "the climb ended: the next open tries the next step")
}

// A climb that does not pay falls back to the prior's window, and the
// prior holds it for BackoffMax.
func TestPriorClimbThatDoesNotPayHoldsThePriorsWindow(t *testing.T) {
	r := newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true}, nil)
	p := climbReady(t, r)
	k2 := r.openFresh(t, "blk_2", 200)
	require.Equal(t, 1024, r.files.window[k2])
	acts := r.runOutcome(1, stream{key: k2, tgid: 200, fill: 0.9})
	logActs(t, acts)
	undone := filter(acts, KindFileWindowUndo, ResultUndone)
	require.Len(t, undone, 1)
	assert.Equal(t, 512, undone[0].ToKB)
	assert.Equal(t, 512, r.files.window[k2], "back to the prior's window, not the device's")
	assert.Equal(t, 512, p.Window)
	assert.Equal(t, r.clk.Now()+r.tn.cfg.BackoffBase, p.KneeUntil, "one stream's measure: confirmed once, soon")
	k3 := r.openFresh(t, "blk_3", 300)
	assert.Equal(t, 512, r.files.window[k3], "no climb while the knee holds")
	// Confirmed by the next climb: the knee holds for BackoffMax.
	r.clk.Advance(r.tn.cfg.BackoffBase)
	k4 := r.openFresh(t, "blk_4", 400)
	require.Equal(t, 1024, r.files.window[k4], "the knee confirmed by another climb")
	r.runOutcome(1, stream{key: k4, tgid: 400, fill: 0.9})
	assert.Equal(t, 512, r.files.window[k4])
	assert.Equal(t, r.clk.Now()+r.tn.cfg.BackoffMax, p.KneeUntil)
}

// A climbing stream that reads no better than the prior's streams did at
// the device's window says the prior itself no longer pays: back to the
// device's window, and the prior halves.
func TestPriorClimbReadingAsAtTheDevicesWindowHalvesThePrior(t *testing.T) {
	r := newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true}, nil)
	p := climbReady(t, r)
	r.tput = func(int) float64 { return 60e6 }
	k2 := r.openFresh(t, "blk_2", 200)
	require.Equal(t, 1024, r.files.window[k2])
	acts := r.runOutcome(1, stream{key: k2, tgid: 200, fill: 0.9})
	logActs(t, acts)
	assert.Equal(t, 128, r.files.window[k2])
	assert.Contains(t, acts[len(acts)-1].Evidence, "the prior is halved")
	if q := r.tn.mem.Dir(k2.Dev, filepath.Join(r.dir, "data", "sub0", "x")); q != nil {
		assert.Less(t, q.Window, 512)
	}
	_ = p
}

// A file whose decision was kept under an older prior, read again from its
// head (a fresh open), catches up with its directory's prior.
func TestFileDecisionCatchesUpWithItsDirectorysPrior(t *testing.T) {
	r := newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true}, nil)
	r.tput = kneeModel
	p1, k1 := realFile(t, filepath.Join(r.dir, "data", "sub0"), "blk_1")
	r.files.open(100, 7, p1, k1)
	r.runOutcome(6, stream{key: k1, tgid: 100, fill: 0.9})
	fd := r.tn.files[k1]
	require.NotNil(t, fd)
	require.Equal(t, 512, fd.win.cur)
	fd.win.back.knee = false
	theDirsPrior(t, r).Window = 2048 // climbed since, on other files
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 100, File: k1, Device: sdb, RaPages: 32, Index: 0})
	assert.Equal(t, 2048, fd.win.cur)
	assert.Equal(t, 2048, r.files.window[k1])
}
