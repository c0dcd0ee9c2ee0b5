// Package labbench measures a real HDFS client's read throughput with the DataNode's
// storage on the lab's emulated SSD, healthy and with a permanent slowdown on the block
// file, at the default and a large read_ahead_kb. A separate package, so that the hdfs
// package's own tests do not depend on the lab.
package labbench

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/hdfs"
	"github.com/readaheadd/readaheadd/test/lab"
)

const fileMB = 256

// BenchmarkRealHDFSOnLab prints, side by side in one run, the client's MB/s for each
// (regime, read_ahead_kb) pair and the gain of the large window over the default.
func BenchmarkRealHDFSOnLab(b *testing.B) {
	hdfs.Skip(b)
	l := lab.New(b, lab.Options{})
	ctx := context.Background()
	c, err := hdfs.StartWith(ctx, filepath.Join(l.Mount, "hdfs"),
		hdfs.Options{LogPath: filepath.Join(b.TempDir(), "hdfs.log")})
	require.NoError(b, err)
	b.Cleanup(func() {
		if err := c.Close(); err != nil {
			b.Errorf("close cluster: %v", err)
		}
	})
	w, err := c.Write(ctx, "/bench/f0", fileMB)
	require.NoError(b, err)
	require.Len(b, w.Blocks, 1)
	orig, err := l.ReadAheadKB()
	require.NoError(b, err)
	b.Cleanup(func() { _ = l.SetReadAheadKB(orig) })

	read := func(kb int) float64 {
		b.Helper()
		// The DataNode opens the block file per read request, and a file takes the
		// device's read_ahead_kb when opened: setting it before the read is enough.
		require.NoError(b, l.SetReadAheadKB(kb))
		require.NoError(b, hdfs.DropCaches())
		r, err := c.Read(ctx, 1, "/bench/f0")
		require.NoError(b, err)
		require.Equal(b, w.Bytes, r.Bytes)
		return r.MBps
	}
	read(orig) // JIT warm-up of client and DataNode

	type point struct {
		regime string
		kb     int
	}
	var order []point
	sum := map[point]float64{}
	regimes := []struct {
		name  string
		extra time.Duration
	}{{"healthy", 0}, {"slow3ms", 3 * time.Millisecond}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, rg := range regimes {
			if rg.extra > 0 {
				require.NoError(b, l.SetPermanent(rg.extra, w.Blocks...))
			} else {
				require.NoError(b, l.Clear())
			}
			for _, kb := range []int{128, 1024} {
				p := point{rg.name, kb}
				if i == 0 {
					order = append(order, p)
				}
				sum[p] += read(kb)
			}
		}
	}
	b.StopTimer()
	require.NoError(b, l.Clear())
	for _, p := range order {
		b.ReportMetric(sum[p]/float64(b.N), fmt.Sprintf("MB/s_%s_ra%d", p.regime, p.kb))
	}
	for _, rg := range regimes {
		lo, hi := sum[point{rg.name, 128}], sum[point{rg.name, 1024}]
		b.ReportMetric(hi/lo, "x_ra1024/ra128_"+rg.name)
		b.Logf("%s: %.1f MB/s at read_ahead_kb 128, %.1f at 1024 (%.2fx)",
			rg.name, lo/float64(b.N), hi/float64(b.N), hi/lo)
	}
}
