package tuner

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
	"github.com/readaheadd/readaheadd/pkg/tuner/model"
)

// failSlowUnqueued is one detector window's unqueued reads of the lab's
// device at +3 ms: a 150 MB/s transfer behind a fixed cost of 4.2 ms (the
// lab measured 5.1-5.5 ms at 128-256 KiB and 10.8-10.9 ms at 1 MiB), three
// of 128 KiB and two of 1 MiB: five a second, as a stream with a request
// or two in flight leaves.
func failSlowUnqueued() []detector.LatencyCell {
	lat := func(size float64) time.Duration {
		return 4200*time.Microsecond + time.Duration(size/150e6*float64(time.Second))
	}
	return []detector.LatencyCell{
		{Class: 17, Requests: 3, MeanSize: 128 << 10, P50: lat(128 << 10)},
		{Class: 20, Requests: 2, MeanSize: 1 << 20, P50: lat(1 << 20)},
	}
}

// Five unqueued reads a second are too few for a fit in any one window,
// and a fit within a few seconds of them pooled: the fail-slow device's
// 150 MB/s, where its best rate seen (the detector's peak) is the 60 MB/s
// its stream reads. The fit is saved with the priors.
func TestCapacityFitPoolsSparseUnqueuedReads(t *testing.T) {
	_, one := model.CapacityFit(detector.DeviceStats{Unqueued: failSlowUnqueued()}, capMinCell)
	require.False(t, one, "one window's unqueued reads are too few")

	r := newRig(t, Config{DisablePrefetch: true}, func(r *rig) { r.unqueued, r.capBPS = failSlowUnqueued(), 60e6 })
	r.tput = func(int) float64 { return 60e6 }
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	r.runOutcome(1, stream{key: key, tgid: 100, fill: 0.1})
	c, src := r.tn.atStep().capacity(sdb)
	assert.Equal(t, capPeak, src, "one second of unqueued reads: the peak")
	assert.InDelta(t, 60e6, c, 1)

	var at int
	for i := 2; i <= 10 && at == 0; i++ {
		r.runOutcome(1, stream{key: key, tgid: 100, fill: 0.1})
		if _, src := r.tn.atStep().capacity(sdb); src == capFitted {
			at = i
		}
	}
	require.NotZero(t, at, "no fit in 10 s")
	assert.LessOrEqual(t, at, 6, "a fit within a few seconds")
	c, _ = r.tn.atStep().capacity(sdb)
	assert.InDelta(t, 150e6, c, 1.5e6)
	assert.InDelta(t, 4200*time.Microsecond, r.tn.capFits[sdb].last.Fixed, float64(100*time.Microsecond), "the +3 ms is in the fixed cost")

	// Saved with the priors once the tuner knows the device by name (a
	// decision on it), and read back by a restarted daemon.
	require.NotNil(t, r.tn.device(sdb))
	r.runOutcome(1, stream{key: key, tgid: 100, fill: 0.1})
	assert.InDelta(t, 150e6, r.tn.mem.Fitted("sdb"), 1.5e6)
	require.NoError(t, r.tn.RestoreAll())
	pr, err := state.LoadPriors(filepath.Join(r.dir, "state", state.PriorsName))
	require.NoError(t, err)
	require.Len(t, pr.Devices, 1)
	assert.InDelta(t, 150e6, pr.Devices[0].FittedBPS, 1.5e6)
	assert.Zero(t, pr.Devices[0].CapacityBPS, "no saturation point learned")
}

// The pool forgets: a size class's requests count half after capHalfLife.
func TestCapacityPoolDecays(t *testing.T) {
	var p capPool
	p.add(time.Hour, failSlowUnqueued())
	p.add(time.Hour+capHalfLife, nil)
	got := p.pooled()
	require.Len(t, got, 2)
	assert.Equal(t, 1, got[0].Requests, "3 requests of 128 KiB, half of them")
	assert.Equal(t, 1<<20, int(got[1].MeanSize))
	p.add(time.Hour+3*capHalfLife, nil)
	assert.Len(t, p.pooled(), 0, "under half a request: gone")
}

// capacity's sources in order: a fresh saturation point over a higher fit;
// the fit over an old saturation point below it and over the peak (raised
// to the peak if the device read faster); the peak last; 0 with nothing.
func TestCapacitySources(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	d := r.tn.device(sdb)
	require.NotNil(t, d)
	j := r.tn.atStep()
	r.tn.dstats = map[probe.Dev]detector.DeviceStats{}
	c, src := j.capacity(sdb)
	assert.Equal(t, capNone, src)
	assert.Zero(t, c)

	r.tn.dstats[sdb] = detector.DeviceStats{Device: sdb, CapacityBPS: 60e6, BusyThroughput: 50e6}
	c, src = j.capacity(sdb)
	assert.Equal(t, capPeak, src)
	assert.Equal(t, 60e6, c)
	assert.Zero(t, j.knownCapacity(sdb), "the peak is not the model's")

	r.tn.mem.SetFitted("sdb", 150e6, time.Now())
	c, src = j.capacity(sdb)
	assert.Equal(t, capFitted, src, "a fit wins over the peak")
	assert.Equal(t, 150e6, c)

	// A saturated 40 MB/s device: the step that taught it wins over the
	// higher fit while fresh.
	r.tn.mem.SetCapacity("sdb", 40e6, time.Now())
	d.satAt, d.satSeen = r.clk.Now(), true
	c, src = j.capacity(sdb)
	assert.Equal(t, capSaturation, src)
	assert.Equal(t, 40e6, c)
	assert.Equal(t, 40e6, j.knownCapacity(sdb))
	r.clk.Advance(satFreshAge + time.Second)
	c, src = j.capacity(sdb)
	assert.Equal(t, capFitted, src, "an old saturation point below the fit")
	assert.Equal(t, 150e6, c)
	r.tn.mem.SetCapacity("sdb", 200e6, time.Now())
	c, src = j.capacity(sdb)
	assert.Equal(t, capSaturation, src, "an old saturation point above the fit: the fit underestimates")
	assert.Equal(t, 200e6, c)
	r.tn.mem.SetCapacity("sdb", 0, time.Now())
	r.tn.dstats[sdb] = detector.DeviceStats{Device: sdb, CapacityBPS: 170e6}
	c, src = j.capacity(sdb)
	assert.Equal(t, capPeakOverFit, src, "the device read faster than the fit")
	assert.Equal(t, 170e6, c)
	assert.Equal(t, 170e6, j.knownCapacity(sdb), "a rate it read, above the model's")
}

// A fail-slow device (+3 ms every read): its stream reads 60 MB/s at the
// device's window, and more with a larger one, up to the 150 MB/s
// transfer. Its best rate seen is that 60 MB/s: taken for the capacity,
// the stream "reads at the device's capacity" and gets no step. With the
// unqueued reads fitted the capacity is 150 MB/s: the stop at CapacityFrac
// of it and loneAtCapacity's half margin no longer see the stream there,
// and it is stepped. Side by side, the same stream and regime.
func TestFailSlowDeviceKeepsItsCapacityInDecisions(t *testing.T) {
	run := func(withUnqueued bool) (*rig, probe.FileKey, []Action) {
		r := newRig(t, Config{DisablePrefetch: true}, nil)
		p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
		r.files.open(100, 7, p, key)
		peak := 0.0
		mk := func(regime bool) detector.Snapshot {
			now, w := r.tickStream(key)
			rate := min(150e6, 60e6*float64(w)/128)
			peak = max(peak, rate)
			s := streamSpan(key, now, w, rate, 5200*time.Microsecond, 6*time.Millisecond, 0.9)
			s.Devices[0].CapacityBPS = peak
			if withUnqueued {
				s.Devices[0].Unqueued = failSlowUnqueued()
			}
			if regime {
				s.Regimes = []detector.Regime{{Kind: detector.FileLatencyShift, Device: sdb, File: key, Evidence: "test"}}
			} else {
				s.Files = nil // the device's unqueued reads only
			}
			return s
		}
		var acts []Action
		for i := 0; i < 6; i++ {
			acts = append(acts, r.tn.Step(mk(false))...)
		}
		require.Empty(t, acts)
		for i := 0; i < 4; i++ {
			acts = append(acts, r.tn.Step(mk(true))...)
		}
		logActs(t, acts)
		return r, key, acts
	}

	r, key, acts := run(false)
	assert.Empty(t, filter(acts, KindFileWindow, ResultTrial), "at its best rate seen: no step")
	c, src := r.tn.atStep().capacity(sdb)
	assert.Equal(t, capPeak, src)
	assert.Equal(t, 60e6, c)
	if fd := r.tn.files[key]; assert.NotNil(t, fd) {
		assert.True(t, r.tn.atStep().loneAtCapacity(fd.dev, key, measure{ok: true, tput: 60e6}))
	}

	r, key, acts = run(true)
	c, src = r.tn.atStep().capacity(sdb)
	assert.Equal(t, capFitted, src)
	assert.InDelta(t, 150e6, c, 1.5e6)
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.NotEmpty(t, trials, "short of the fitted capacity: stepped")
	assert.Equal(t, 128, trials[0].FromKB)
	if fd := r.tn.files[key]; assert.NotNil(t, fd) {
		assert.False(t, r.tn.atStep().loneAtCapacity(fd.dev, key, measure{ok: true, tput: 60e6}), "60 of 150 MB/s")
		assert.True(t, r.tn.atStep().loneAtCapacity(fd.dev, key, measure{ok: true, tput: 147e6}))
	}
}

// A device saturated at 40 MB/s by one stream (its latency grows with its
// window, its rate does not): the step that doubled the window teaches
// 40 MB/s, and that is the capacity, though its unqueued reads of earlier,
// lighter load fitted a faster transfer.
func TestSaturatedDeviceCapacityIsItsSaturationPoint(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true, BackoffMax: time.Minute}, func(r *rig) { r.queue = true })
	r.tput = func(int) float64 { return 40e6 }
	r.tn.mem.SetFitted("sdb", 150e6, time.Now())
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	acts := r.runOutcome(30, stream{key: key, tgid: 100, fill: 0.9})
	logActs(t, acts)
	require.NotEmpty(t, filter(acts, KindFileWindowUndo, ResultUndone))
	c, src := r.tn.atStep().capacity(sdb)
	assert.Equal(t, capSaturation, src)
	assert.InDelta(t, 40e6, c, 1)
	assert.Len(t, filter(acts, KindFileWindow, ResultTrial), 1, "no trial once the saturation point is known")
}
