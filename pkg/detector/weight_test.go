package detector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// A record sampled 1 in N by the probe stands for N requests: the window's
// request and byte counts (and so throughput) count it N times, the mean
// size and the latency percentiles do not change.
func TestSampledRecordsCountWithTheirWeight(t *testing.T) {
	dev := probe.MkDev(7, 1)
	file := probe.FileKey{Dev: dev, Ino: 12}
	feed := func(weight uint32) Snapshot {
		d := New(DefaultConfig())
		for i := 0; i < 200; i++ {
			at := time.Duration(i) * 2 * time.Millisecond
			d.Observe(probe.Record{Device: dev, Sector: uint64(i) * 4096, Bytes: 4096, Issue: at,
				Latency: 100 * time.Microsecond, Depth: 4, Kind: probe.KindFile, File: file,
				Offset: uint64(i*7919%1000) * 4096, Weight: weight})
		}
		return d.Evaluate(500 * time.Millisecond)
	}
	one, eight := feed(0), feed(8)
	require.Len(t, one.Devices, 1)
	require.Len(t, eight.Devices, 1)
	a, b := one.Devices[0], eight.Devices[0]
	require.NotZero(t, a.Requests)
	assert.Equal(t, 8*a.Requests, b.Requests)
	assert.Equal(t, 8*a.Bytes, b.Bytes)
	assert.Equal(t, a.MeanSize, b.MeanSize)
	assert.Equal(t, a.P99, b.P99)
}
