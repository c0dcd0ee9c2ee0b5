package model

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
)

const kib = 1024

// unqueuedCells are the unqueued cells a lab device would report: every
// request waits fixed, then moves its bytes at bps (the lab's model, one
// transfer channel), each cell's median off by the given noise, at sizes 4, 16, 64 and 128 KiB (metadata, a trimmed
// random reader, a read-around, a default readahead window).
func unqueuedCells(fixed time.Duration, bps float64, noise []time.Duration) []detector.LatencyCell {
	sizes := []float64{4 * kib, 16 * kib, 64 * kib, 128 * kib}
	classes := []uint8{12, 14, 16, 17}
	var out []detector.LatencyCell
	for i, s := range sizes {
		lat := fixed.Seconds() + s/bps + noise[i].Seconds()
		out = append(out, detector.LatencyCell{Class: classes[i], Requests: 20 + 10*i, MeanSize: s,
			P10: time.Duration(0.9 * lat * 1e9), P50: time.Duration(lat * 1e9)})
	}
	return out
}

// depthCells is the profile of a device at its capacity bps: 128 KiB
// requests wait fixed, then for the bytes queued around them at bps.
func depthCells(fixed time.Duration, bps float64, depths []float64) []detector.LatencyCell {
	var out []detector.LatencyCell
	for _, d := range depths {
		q := d * 128 * kib
		out = append(out, detector.LatencyCell{Class: 17, Depth: detector.DepthBucket(uint32(d)), Requests: 100, MeanSize: 128 * kib,
			MeanDepth: d, QueueBytes: q, P50: fixed + time.Duration(q/bps*1e9)})
	}
	return out
}

// The lab's device (docs/lab.md: 150 us, then one 150 MB/s transfer
// channel) has its capacity fitted on its unqueued requests; made
// fail-slow (every request +3 ms) its fixed cost rises and its capacity
// stays, although a stream then reads it at about 60 MB/s (the rate the
// detector's decaying peak learns).
func TestCapacityFitTakesTheTransferRateNotTheRateSeen(t *testing.T) {
	us := time.Microsecond
	noise := []time.Duration{15 * us, -10 * us, 10 * us, -5 * us}
	for _, tc := range []struct {
		name  string
		fixed time.Duration
		bps   float64
		seen  float64 // what a stream reads it at: the peak the detector keeps
	}{
		{"healthy", 150 * time.Microsecond, 150e6, 156e6},
		{"every request +3 ms", 3150 * time.Microsecond, 150e6, 60e6},
		{"every request +8 ms", 8150 * time.Microsecond, 150e6, 25e6},
		{"a 40 MB/s channel idle now and then", 150 * time.Microsecond, 40e6, 40e6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := detector.DeviceStats{BusyThroughput: tc.seen, CapacityBPS: tc.seen, Unqueued: unqueuedCells(tc.fixed, tc.bps, noise)}
			c, ok := CapacityFit(ds, 4)
			require.True(t, ok)
			assert.Equal(t, "unqueued", c.From)
			assert.Equal(t, 4, c.Points)
			assert.InEpsilon(t, tc.bps, c.BPS, 0.08, "capacity %.1f MB/s", c.BPS/1e6)
			assert.InDelta(t, tc.fixed.Seconds(), c.Fixed.Seconds(), 0.05*tc.fixed.Seconds()+30e-6, "fixed cost %v", c.Fixed)
		})
	}
}

// The unqueued reads measured on the lab with the tuner acting
// (docs/operations.md, fail-slow disks): 128-256 KiB reads (taken at 192
// KiB) 2.1-2.4 ms healthy and 5.1-5.5 ms at +3 ms, 1 MiB reads 7.7-8.0
// ms and 10.8-10.9 ms. At every corner of those ranges the fit finds the
// lab's 150 MB/s channel within 8%, and +3 ms in the fixed cost alone.
func TestCapacityFitOnTheLabsUnqueuedReads(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	cells := func(small, large float64) []detector.LatencyCell {
		return []detector.LatencyCell{
			{Class: 18, Requests: 40, MeanSize: 192 * kib, P50: ms(small)},
			{Class: 20, Requests: 600, MeanSize: 1024 * kib, P50: ms(large)},
		}
	}
	fixed := map[string]time.Duration{}
	for _, tc := range []struct {
		name         string
		small, large float64
	}{
		{"healthy, low", 2.1, 7.7}, {"healthy, high", 2.4, 8.0}, {"healthy, spread", 2.1, 8.0}, {"healthy, close", 2.4, 7.7},
		{"+3 ms, low", 5.1, 10.8}, {"+3 ms, high", 5.5, 10.9}, {"+3 ms, spread", 5.1, 10.9}, {"+3 ms, close", 5.5, 10.8},
	} {
		c, ok := CapacityFit(detector.DeviceStats{Unqueued: cells(tc.small, tc.large), BusyThroughput: 60e6}, 4)
		require.True(t, ok, tc.name)
		assert.InEpsilon(t, 150e6, c.BPS, 0.08, "%s: %.1f MB/s", tc.name, c.BPS/1e6)
		fixed[tc.name] = c.Fixed
	}
	assert.InDelta(t, 3.0, (fixed["+3 ms, low"]-fixed["healthy, low"]).Seconds()*1e3, 0.2)
	assert.InDelta(t, 3.0, (fixed["+3 ms, high"]-fixed["healthy, high"]).Seconds()*1e3, 0.2)
}

// labCell is one cell of a profile the detector reported for its
// simulated lab device (sim_test.go: each read waits 150 us with jitter,
// then one shared transfer channel; a stream of 128 KiB reads two in
// flight, random readers of 4, 16 and 64 KiB), after 30 s.
type labCell struct {
	class, depth uint8
	requests     int
	size, queued float64
	p50us        int
}

func profileOf(cells []labCell) []detector.LatencyCell {
	var out []detector.LatencyCell
	for _, c := range cells {
		out = append(out, detector.LatencyCell{Class: c.class, Depth: c.depth, Requests: c.requests, MeanSize: c.size,
			QueueBytes: c.queued, P50: time.Duration(c.p50us) * time.Microsecond})
	}
	return out
}

// A device its streams keep busy is never idle: no unqueued cells (none
// in any of the detector's simulated runs, whose stream keeps its window
// in flight). Its median latency rises with the bytes queued, so it is at
// its capacity, which is then its busy rate; a fail-slow device's does
// not rise, and its busy rate is not taken.
func TestCapacityFitOfASaturatedDevice(t *testing.T) {
	for _, tc := range []struct {
		name  string
		busy  float64
		cells []labCell
		ok    bool
	}{
		{"a 40 MB/s channel", 39.8e6, []labCell{
			{12, 2, 85, 4096, 270550, 4065}, {12, 3, 43, 4096, 370916, 5704},
			{14, 2, 56, 16384, 296732, 6980}, {14, 3, 29, 16384, 370916, 7083},
			{16, 2, 33, 65536, 296732, 5083}, {16, 3, 39, 65536, 370916, 8360},
			{17, 2, 157, 131072, 489224, 7065}, {17, 3, 98, 131072, 655360, 8704},
		}, true},
		{"the 150 MB/s channel at the default window", 149.9e6, []labCell{
			{12, 2, 235, 4096, 314297, 1396}, {14, 2, 151, 16384, 322069, 1690}, {14, 3, 1, 16384, 479609, 1717},
			{16, 2, 111, 65536, 322332, 1465}, {16, 3, 6, 65536, 479609, 1574},
			{17, 1, 270, 131072, 262144, 1747}, {17, 2, 781, 131072, 427117, 1856}, {17, 3, 8, 131072, 655360, 2321},
		}, true},
		{"every read +3 ms", 73.6e6, []labCell{
			{12, 2, 126, 4096, 302439, 3217}, {12, 3, 29, 4096, 427212, 3814},
			{14, 2, 91, 16384, 301396, 3265}, {14, 3, 28, 16384, 427212, 3267},
			{16, 2, 79, 65536, 303915, 3613}, {16, 3, 14, 65536, 427212, 3943},
			{17, 1, 48, 131072, 262144, 4025}, {17, 2, 403, 131072, 456313, 4024}, {17, 3, 46, 131072, 655360, 4020},
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := detector.DeviceStats{BusyThroughput: tc.busy, CapacityBPS: tc.busy, Profile: profileOf(tc.cells),
				Unqueued: []detector.LatencyCell{{Class: 17, Requests: 1, MeanSize: 128 * kib, P50: 3500 * time.Microsecond}}}
			c, ok := CapacityFit(ds, 4)
			require.Equal(t, tc.ok, ok, "%+v", c)
			if ok {
				assert.Equal(t, "saturated", c.From)
				assert.Equal(t, tc.busy, c.BPS)
			}
		})
	}
}

// Where the data cannot say, the fit says so rather than give a number.
func TestCapacityFitCannotSay(t *testing.T) {
	noise := make([]time.Duration, 4)
	cells := unqueuedCells(150*time.Microsecond, 150e6, noise)
	few := unqueuedCells(150*time.Microsecond, 150e6, noise)
	for i := range few {
		few[i].Requests = 3
	}
	falling := unqueuedCells(150*time.Microsecond, 150e6, noise)
	falling[0].P50, falling[3].P50 = falling[3].P50, falling[0].P50
	// Below its capacity a device serves its queue in parallel: the
	// latency holds across depths (within noise).
	flat := depthCells(1024*time.Microsecond, 1e15, []float64{2, 3.5, 6.5})
	flat[1].P50 += 20 * time.Microsecond
	for _, tc := range []struct {
		name string
		ds   detector.DeviceStats
	}{
		{"nothing", detector.DeviceStats{}},
		{"one size", detector.DeviceStats{Unqueued: cells[3:]}},
		{"sizes too close", detector.DeviceStats{Unqueued: []detector.LatencyCell{cells[3], {Class: 17, Requests: 20, MeanSize: 100 * kib, P50: 900 * time.Microsecond}}}},
		{"cells under the least", detector.DeviceStats{Unqueued: few}},
		{"latency falling with size", detector.DeviceStats{Unqueued: falling}},
		{"latency flat across depths", detector.DeviceStats{Profile: flat, BusyThroughput: 60e6}},
		{"one depth", detector.DeviceStats{Profile: depthCells(150*time.Microsecond, 40e6, []float64{6.5}), BusyThroughput: 40e6}},
		{"a rise and no busy rate", detector.DeviceStats{Profile: depthCells(150*time.Microsecond, 40e6, []float64{2, 3.5, 6.5})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := CapacityFit(tc.ds, 4)
			assert.False(t, ok, "%+v", c)
		})
	}
}

func TestHeadroom(t *testing.T) {
	for _, tc := range []struct {
		name        string
		c, total    float64
		contenders  []float64
		bound       int
		wantMBps    float64
		description string
	}{
		{"a fail-slow device's lone stream", 150e6, 59e6, nil, 1, 91, "what the device leaves unread"},
		{"a saturated device", 40e6, 40e6, nil, 1, 0, "none"},
		{"beyond the capacity", 150e6, 156e6, nil, 1, -6, "a capacity fitted low"},
		{"a contender above its fair share", 150e6, 150e6, []float64{110e6}, 1, 35, "its share beyond 75"},
		{"a contender within its fair share", 150e6, 150e6, []float64{40e6}, 2, 0, "50 each"},
		{"two contenders, one above", 150e6, 140e6, []float64{70e6, 20e6}, 1, 10 + 20, "unread, and 70 beyond 50"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.InDelta(t, tc.wantMBps, Headroom(tc.c, tc.total, tc.contenders, tc.bound)/1e6, 1e-9, tc.description)
		})
	}
}

func TestWindowBoundAndNeeds(t *testing.T) {
	// A stream on the +3 ms lab device at the default window: two 128 KiB
	// requests in flight, busy all of a 1 s span.
	stream := detector.FileStats{Sequentiality: 0.98, Inflight: 1.7, MeanSize: 128 * kib, P50: 3600 * time.Microsecond,
		Bytes: 59e6, BusyThroughput: 59e6, Requests: 450}
	with := func(f func(*detector.FileStats)) detector.FileStats { s := stream; f(&s); return s }
	for _, tc := range []struct {
		name   string
		fs     detector.FileStats
		window int
		want   bool
	}{
		{"window-bound", stream, 128, true},
		{"random", with(func(s *detector.FileStats) { s.Sequentiality = 0.3 }), 128, false},
		{"window unknown", stream, 0, false},
		{"no requests", with(func(s *detector.FileStats) { s.Inflight, s.Bytes = 0, 0 }), 128, false},
		{"a window mostly empty", stream, 1024, false},
		{"just over the fill", with(func(s *detector.FileStats) { s.Inflight = 0.41 * 4 }), 512, true},
		{"just under the fill", with(func(s *detector.FileStats) { s.Inflight = 0.39 * 4 }), 512, false},
		{"busy just over half the span", with(func(s *detector.FileStats) { s.Bytes = 0.52 * 59e6 }), 128, true},
		{"busy just under half the span", with(func(s *detector.FileStats) { s.Bytes = 0.48 * 59e6 }), 128, false},
		{"idle most of the span", with(func(s *detector.FileStats) { s.Bytes = 20e6 }), 128, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := WindowBound(tc.fs, tc.window, time.Second, 0.8)
			assert.Equal(t, tc.want, got, why)
		})
	}
	x := Rate(stream)
	assert.InEpsilon(t, 1.7*128*kib/3.6e-3, x, 1e-9)
	assert.True(t, Needs(true, 91e6, x, 0.1))
	assert.False(t, Needs(false, 91e6, x, 0.1), "not bound")
	assert.False(t, Needs(true, 0.04*x, x, 0.1), "headroom under half the margin")
	assert.Zero(t, Rate(detector.FileStats{Inflight: 2, MeanSize: 128 * kib}), "no latency, no rate")
}

func TestGridUp(t *testing.T) {
	g := Grid{BaseKB: 128, Growth: 2, MaxKB: 4096}
	for _, tc := range []struct{ kb, want int }{
		{0, 128}, {100, 128}, {128, 128}, {129, 256}, {843, 1024}, {1024, 1024}, {4000, 4096}, {9000, 4096},
	} {
		assert.Equal(t, tc.want, g.Up(tc.kb), "%d KB", tc.kb)
	}
	assert.Equal(t, 3000, Grid{BaseKB: 128, Growth: 2, MaxKB: 3000}.Up(2049))
	assert.Equal(t, 128, Grid{BaseKB: 128, Growth: 1, MaxKB: 4096}.Up(300), "no growth: the base")
}

func TestStepKB(t *testing.T) {
	g := Grid{BaseKB: 128, Growth: 2, MaxKB: 4096}
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	failSlow := Stream{X: 59e6, L: ms(3.6), WindowKB: 128} // +3 ms on the lab's device, default window
	for _, tc := range []struct {
		name         string
		s            Stream
		c, h         float64
		n            int
		margin       float64
		target, step int
	}{
		// Its target the capacity less half the margin, 142.9 MB/s:
		// 862.7 kB (the plan's 860 KB), 843 KiB.
		{"+3 ms, lone stream", failSlow, 150e6, 91e6, 1, 0.1, 843, 1024},
		// 59 + 60/2 MB/s: 89 MB/s.
		{"+3 ms, two streams share the headroom", failSlow, 150e6, 60e6, 2, 0.1, 391, 512},
		{"+1.5 ms", Stream{X: 97e6, L: ms(2.1), WindowKB: 128}, 150e6, 53e6, 1, 0.1, 443, 512},
		{"capped", Stream{X: 59e6, L: ms(20), WindowKB: 128}, 150e6, 91e6, 1, 0.1, 5211, 4096},
		{"no headroom", failSlow, 150e6, 0, 1, 0.1, 0, 0},
		{"negative headroom", failSlow, 150e6, -5e6, 1, 0.1, 0, 0},
		{"its latency is its window's queue", Stream{X: 40e6, L: ms(3.2), WindowKB: 2048}, 40e6, 1e6, 1, 0.1, 0, 0},
		{"the target no larger than the window", Stream{X: 140e6, L: ms(1.9), WindowKB: 512}, 150e6, 10e6, 1, 0.1, 41, 0},
		{"a target of twice the capacity", failSlow, 150e6, 500e6, 1, -1.2, 0, 0},
		{"no capacity", failSlow, 0, 91e6, 1, 0.1, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.target, TargetKB(tc.s, tc.c, tc.h, tc.n, tc.margin), "target")
			assert.Equal(t, tc.step, StepKB(tc.s, tc.c, tc.h, tc.n, tc.margin, g), "step")
		})
	}
	assert.Equal(t, 900, StepKB(failSlow, 150e6, 91e6, 1, 0.1, Grid{BaseKB: 128, Growth: 2, MaxKB: 900}), "capped at the grid's max")
}

// s1-17 (docs/results/matrix): a pread reader of 32 KiB beside a stream
// on the 150 MB/s lab device; its p99 at device windows of 128, 256, 512,
// 1024 KB: 9.9, 10.5, 15.9, 21.2 ms, and 28.4 ms beside the 4096 KB file
// window readaheadd kept.
func TestBudgetBytes(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	const c, slack = 150e6, 1.25
	at128 := Reader{Ref: ms(9.9), Now: ms(9.9)}

	b, ok := BudgetBytes([]Reader{at128}, c, slack, 0)
	require.True(t, ok)
	// 5% of 9.9 ms at 1.25 transfers of a byte at 150 MB/s: 59.4 kB.
	assert.InEpsilon(t, 59.4e3, b, 1e-6)
	// A step to 256 KB queues 128 KiB more: over the budget, and the lab
	// measured the reader's p99 1.06x its default's there.
	assert.Less(t, b, float64(128*kib))
	assert.Greater(t, 10.5/9.9, TailBudget)

	// The 4096 KB window readaheadd kept queues 3968 KiB beyond the
	// device's: the budget is spent 68 times over.
	b, ok = BudgetBytes([]Reader{at128}, c, slack, 3968*kib)
	require.True(t, ok)
	assert.Less(t, b, -60*59.4e3)

	for _, tc := range []struct {
		name    string
		readers []Reader
		c       float64
		slack   float64
		raised  float64
		want    float64
		ok      bool
	}{
		{"the least reader sets it", []Reader{at128, {Ref: ms(2), Now: ms(1)}}, c, slack, 0, 59.4e3, true},
		{"already over its budget", []Reader{at128, {Ref: ms(2), Now: ms(2.2)}}, c, slack, 0, -0.1e-3 * c / slack, true},
		{"a trim coming with the step", []Reader{{Ref: ms(9.9), Now: ms(9.9), Spared: 96 * kib}}, c, slack, 0, 59.4e3 + 96*kib/slack, true},
		{"a learned delay of half a transfer", []Reader{at128}, c, 0.5, 0, 148.5e3, true},
		{"raised windows queue part of it", []Reader{at128}, c, slack, 20e3, 39.4e3, true},
		{"no reader", nil, c, slack, 0, 0, false},
		{"no capacity", []Reader{at128}, 0, slack, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := BudgetBytes(tc.readers, tc.c, tc.slack, tc.raised)
			assert.Equal(t, tc.ok, ok)
			assert.InDelta(t, tc.want, got, 1)
		})
	}
}
