package detector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

func TestDepthBucket(t *testing.T) {
	for depth, want := range map[uint32]uint8{0: 0, 1: 0, 2: 1, 3: 2, 4: 2, 5: 3, 8: 3, 9: 4, 32: 5, 33: 6} {
		assert.Equal(t, want, DepthBucket(depth), "depth %d", depth)
	}
}

func TestOthersQuantile(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cell, own []float64
		p         float64
		ok        bool
		want      float64
	}{
		{"median of the others", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, []float64{9, 10, 11}, 0.5, true, 4},
		{"p10 of the others", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, []float64{1, 2}, 0.1, true, 3},
		{"duplicates", []float64{1, 1, 1, 1, 5, 5, 5, 5, 5, 5}, []float64{1, 1}, 0.5, true, 5},
		{"too few others", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9}, []float64{1, 2}, 0.5, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := othersQuantile(tc.cell, tc.own, tc.p)
			require.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestProfileAndDiskRatio feeds two files read alike on one device, one
// of them 3 ms slower on every request: the device's profile has its
// cells by size class and depth, and only the slow file reads slower than
// the rest of its disk.
func TestProfileAndDiskRatio(t *testing.T) {
	d := New(DefaultConfig())
	dev := probe.MkDev(8, 0)
	fast, slow := probe.FileKey{Dev: dev, Ino: 1}, probe.FileKey{Dev: dev, Ino: 2}
	var off [3]uint64
	now := time.Duration(0)
	for i := range 600 {
		now += time.Millisecond
		f, lat := fast, time.Millisecond+time.Duration(i%7)*50*time.Microsecond
		if i%2 == 1 {
			f, lat = slow, lat+3*time.Millisecond
		}
		depth := uint32(1 + i%2)
		d.Observe(probe.Record{Device: dev, Bytes: 128 * kib, Sector: f.Ino<<30 + off[f.Ino]/512, Offset: off[f.Ino],
			Issue: now - lat, Latency: lat, Depth: depth, Kind: probe.KindFile, File: f})
		off[f.Ino] += 128 * kib
	}
	snap := d.Evaluate(now)
	require.Len(t, snap.Devices, 1)
	prof := snap.Devices[0].Profile
	require.Len(t, prof, 2, "class 17 at depth 1 and at depth 2: %+v", prof)
	for _, c := range prof {
		assert.Equal(t, uint8(17), c.Class)
		assert.InDelta(t, 128*kib, c.MeanSize, 1)
		assert.Positive(t, c.Requests)
		assert.LessOrEqual(t, c.P10, c.P50)
	}
	require.Len(t, snap.Files, 2)
	ratio := map[probe.FileKey]float64{}
	for _, f := range snap.Files {
		require.Positive(t, f.DiskRatioRequests, "%+v", f)
		ratio[f.Key] = f.DiskRatio
	}
	assert.Greater(t, ratio[slow], 3.0, "the slow file against the rest of its disk")
	assert.Less(t, ratio[fast], 0.5, "the fast file against the rest of its disk (the slow one)")
}

func TestUnqueuedAtIssue(t *testing.T) {
	ms := int64(time.Millisecond)
	// issue, latency in ms
	mk := func(issue, lat int64) sample {
		return sample{complete: (issue + lat) * ms, lat: lat * ms, bytes: 128 << 10}
	}
	set := []sample{
		mk(0, 10),  // first issued: what was ahead is unknown
		mk(2, 10),  // behind the first (in flight until 10)
		mk(20, 1),  // nothing in flight: unqueued
		mk(21, 30), // issued after the previous completed: unqueued
		mk(25, 1),  // behind the 30 ms one
		mk(60, 2),  // unqueued
	}
	got := unqueuedAtIssue(set)
	var issues []int64
	for _, s := range got {
		issues = append(issues, s.issue()/ms)
	}
	assert.Equal(t, []int64{20, 21, 60}, issues)

	// A sampled window: a request not streamed could have been ahead.
	set[3].weight = 4
	assert.Empty(t, unqueuedAtIssue(set))
}
