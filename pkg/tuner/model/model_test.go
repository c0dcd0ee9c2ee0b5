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
