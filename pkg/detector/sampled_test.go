package detector

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// wquantile is the percentile of the values repeated by their weights, and
// selectPercentile's result when every weight is 1.
func TestWeightedQuantile(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var buf []weighted
	for trial := 0; trial < 200; trial++ {
		n := 1 + rng.IntN(60)
		vals := make([]float64, n)
		ws := make([]uint64, n)
		ones := make([]uint64, n)
		var expanded []float64
		for i := range vals {
			vals[i] = float64(rng.IntN(40))
			ws[i] = uint64(1 + rng.IntN(16))
			ones[i] = 1
			for range ws[i] {
				expanded = append(expanded, vals[i])
			}
		}
		slices.Sort(expanded)
		for _, p := range []float64{0, 0.01, 0.5, 0.95, 0.99, 1} {
			require.Equal(t, percentile(expanded, p), wquantile(slices.Clone(vals), ws, p, &buf), "p %v vals %v ws %v", p, vals, ws)
			sorted := slices.Sorted(slices.Values(vals))
			require.Equal(t, percentile(sorted, p), wquantile(slices.Clone(vals), ones, p, &buf))
			require.Equal(t, percentile(sorted, p), wquantile(slices.Clone(vals), nil, p, &buf))
		}
	}
}

// While every sample stands for itself the device's busy time is the union
// of the requests' intervals, as before sampling existed.
func TestDevBusyIsTheUnionWithoutSampling(t *testing.T) {
	d := New(DefaultConfig())
	set := []sample{
		{complete: 100, lat: 50, depth: 2},
		{complete: 120, lat: 40, depth: 2},
		{complete: 400, lat: 100, depth: 1, weight: 1},
	}
	assert.Equal(t, int64(70+100), d.devBusy(set))
}

// A direct-I/O stream the probe streams 1 in N (it cannot name its file)
// on a fast device, beside a file stream streamed whole: the device's
// request and byte rates over the last second (Recent, as the tuner reads
// them), its busy throughput, depth and median and the learned capacity
// are those of the run that streamed every request, within the sampling's
// noise, and nothing is reported in either. The direct reads come at
// about 15k a second: the probe's budget (4096) would stream them 1 in 4;
// 1 in 16 keeps fewer than the budget. Without the busy time's estimate
// from the requests' depths (devBusy), the union of the streamed intervals
// alone made the busy throughput, and so the learned capacity, 1.2 times
// too high here beside the paced reader at 1 in 4, 3.4 times at 1 in 16.
func TestSampledDirectReadsKeepDeviceStats(t *testing.T) {
	type result struct {
		reqs, bytes, bt, depth, p50, capacity float64
		regimes                               []string
	}
	// Latency-bound: the transfer channel is far from full, so the busy
	// time is the requests' own (a union of intervals with gaps once
	// requests are left out).
	const fastBase, fastBW = 400 * time.Microsecond, 16e9
	run := func(every uint64, stream bool) result {
		s := newSim(21, fastBase, fastBW)
		// Beside a file stream, or beside a paced file reader only (the
		// direct reads then make most of the device's busy time).
		file := s.addSeq(128*kib, 2)
		if !stream {
			file.window, file.think = 1, 5*time.Millisecond
		}
		direct := s.addSeq(256*kib, 4)
		direct.unattributed = true
		s.sampleEvery = every
		d := New(DefaultConfig())
		var tl timeline
		var r result
		n := 0
		s.run(d, 20*sec, interval, func(snap Snapshot) {
			tl.add(snap)
			if snap.Now < 5*sec {
				return
			}
			require.Len(t, snap.Devices, 1)
			ds := snap.Devices[0]
			// Half a second: at these rates a second is more than the
			// device's ring holds unsampled.
			rec := d.Recent(snap.Now, sec/2, []probe.FileKey{file.file})
			require.Len(t, rec.Devices, 1)
			r.reqs += 2 * float64(rec.Devices[0].Requests)
			r.bytes += 2 * float64(rec.Devices[0].Bytes)
			r.bt += ds.BusyThroughput
			r.depth += ds.MeanDepth
			r.p50 += float64(ds.P50)
			r.capacity = ds.CapacityBPS
			n++
		})
		r.reqs, r.bytes, r.bt, r.depth, r.p50 = r.reqs/float64(n), r.bytes/float64(n), r.bt/float64(n), r.depth/float64(n), r.p50/float64(n)
		r.regimes = tl.anyRegime(0, 20*sec)
		return r
	}
	for _, stream := range []bool{true, false} {
		all := run(1, stream)
		t.Logf("file stream %-5v every request: %.0f requests/s, %.0f MB/s, busy %.0f MB/s, depth %.2f, p50 %s, capacity %.0f MB/s",
			stream, all.reqs, all.bytes/1e6, all.bt/1e6, all.depth, time.Duration(all.p50), all.capacity/1e6)
		require.Empty(t, all.regimes)
		for _, every := range []uint64{4, 16} {
			got := run(every, stream)
			t.Logf("file stream %-5v 1 in %2d:       %.0f requests/s, %.0f MB/s, busy %.0f MB/s, depth %.2f, p50 %s, capacity %.0f MB/s",
				stream, every, got.reqs, got.bytes/1e6, got.bt/1e6, got.depth, time.Duration(got.p50), got.capacity/1e6)
			assert.InEpsilon(t, all.reqs, got.reqs, 0.05, "requests, 1 in %d", every)
			assert.InEpsilon(t, all.bytes, got.bytes, 0.05, "bytes, 1 in %d", every)
			assert.InEpsilon(t, all.bt, got.bt, 0.05, "busy throughput, 1 in %d", every)
			assert.InEpsilon(t, all.capacity, got.capacity, 0.05, "capacity, 1 in %d", every)
			assert.InEpsilon(t, all.depth, got.depth, 0.05, "depth, 1 in %d", every)
			assert.InEpsilon(t, all.p50, got.p50, 0.05, "median, 1 in %d", every)
			assert.Empty(t, got.regimes, "1 in %d", every)
		}
	}
}

// Two direct-I/O readers streamed 1 in 8 are still two readers: contention
// is found as fast, from as many readers, as when every request is
// streamed (TestContentionFromUnattributedDirectReaders).
func TestContentionFromSampledDirectReaders(t *testing.T) {
	for _, every := range []uint64{1, 8} {
		t.Run(fmt.Sprintf("1in%d", every), func(t *testing.T) {
			s := newSim(14, labBase, labBW)
			s.addSeq(128*kib, 2)
			onset := 30*sec + 300*time.Millisecond
			for range 2 {
				r := s.addSeq(1024*kib, 1)
				r.unattributed = true
				r.startAt = onset
			}
			s.sampleEvery = every
			d := New(DefaultConfig())
			var tl timeline
			s.run(d, 40*sec, interval, tl.add)
			at, ok := tl.first(Contention, probe.FileKey{}, onset)
			require.True(t, ok, "contention never detected; regimes %v", tl.anyRegime(onset, 40*sec))
			assert.LessOrEqual(t, at-onset, 2*time.Second)
			ev := tl.activeBetween(Contention, probe.FileKey{}, at, at)
			require.NotEmpty(t, ev)
			assert.Contains(t, ev[0], "from 3 readers", "each O_DIRECT stream is a reader")
			t.Log(ev[0])
			assert.Empty(t, tl.anyRegime(0, onset, Contention), "nothing before the onset")
		})
	}
}

// Sampled, a sequential unattributed stream keeps one stream id; random
// sampled requests do not join it.
func TestSampledStreamKeepsItsIdentity(t *testing.T) {
	ds := &deviceState{}
	const size = 1 << 20
	rng := rand.New(rand.NewPCG(1, 1))
	ids := map[uint32]int{}
	// Requests 0, 8, 16, ... of a stream of 1 MiB requests, each a few
	// requests early or late, with a random reader's requests between.
	for k := 0; k < 200; k++ {
		off := uint64(8*k+rng.IntN(7)-3) * size
		if k == 0 {
			off = 0
		}
		ids[ds.streamOf(1<<30+off/512, size, int64(k), 8)]++
		ds.streamOf(rng.Uint64N(1<<40), 4096, int64(k), 8)
	}
	best := 0
	for _, n := range ids {
		best = max(best, n)
	}
	assert.GreaterOrEqual(t, best, 195, "stream ids %v", ids)
	// Unsampled, the same jumps are new streams (as before sampling).
	ds = &deviceState{}
	a := ds.streamOf(0, size, 1, 1)
	assert.Equal(t, a, ds.streamOf(2048, size, 2, 1))
	assert.NotEqual(t, a, ds.streamOf(8*2048, size, 3, 1))
}
