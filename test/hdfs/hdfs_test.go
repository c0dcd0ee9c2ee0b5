package hdfs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const fileMB = 256

// startOnLoop starts a cluster whose storage is on a fresh loop device.
func startOnLoop(tb testing.TB, ctx context.Context) (*Cluster, string, uint64) {
	tb.Helper()
	mnt, rdev := loopExt4(tb, 1536)
	base := filepath.Join(mnt, "hdfs")
	t0 := time.Now()
	c, err := StartWith(ctx, base, Options{LogPath: filepath.Join(tb.TempDir(), "hdfs.log")})
	require.NoError(tb, err)
	// Registered after the mount's cleanup, so the JVM is gone before the unmount.
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Errorf("close cluster: %v", err)
		}
	})
	tb.Logf("cluster pid %d up in %.1f s (JVM-side %.1f s), data dir %s",
		c.PID, time.Since(t0).Seconds(), c.StartSeconds, c.DataDir)
	return c, mnt, rdev
}

func TestRealHDFSReadOnLoopDevice(t *testing.T) {
	Skip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c, mnt, rdev := startOnLoop(t, ctx)

	const path = "/bench/f0"
	w, err := c.Write(ctx, path, fileMB)
	require.NoError(t, err)
	require.Equal(t, int64(fileMB)<<20, w.Bytes)
	require.Len(t, w.Blocks, 1, "a 256 MiB file is one 256 MiB block")
	for _, b := range w.Blocks {
		assert.True(t, strings.HasPrefix(b, mnt+"/"), "block file %s is on the loop device's file system", b)
		assert.True(t, strings.HasPrefix(filepath.Base(b), "blk_"))
		assert.False(t, strings.HasSuffix(b, ".meta"))
		var st unix.Stat_t
		require.NoError(t, unix.Stat(b, &st))
		assert.Equal(t, int64(fileMB)<<20, st.Size)
		assert.Equal(t, rdev, st.Dev, "block file %s lives on the loop device", b)
	}
	blocks, err := c.Blocks(ctx, path)
	require.NoError(t, err)
	assert.Equal(t, w.Blocks, blocks)
	t.Logf("wrote %d MiB in %.2f s", fileMB, w.Seconds)

	require.NoError(t, DropCaches())
	// While the client reads, the JVM whose PID we hold must have the block file open:
	// that is the tgid the daemon's readahead events will name.
	stop := make(chan struct{})
	seen := make(chan bool, 1)
	go func() { seen <- watchOpen(c.PID, w.Blocks[0], stop) }()
	r, err := c.Read(ctx, 1, path)
	close(stop)
	require.NoError(t, err)
	require.Equal(t, w.Bytes, r.Bytes, "the client read the whole file")
	assert.True(t, <-seen, "process %d never had %s open during the read", c.PID, w.Blocks[0])
	require.Len(t, r.Readers, 1)
	t.Logf("HDFS client read of %d MiB after drop_caches: %.1f MB/s (%.2f s)", fileMB, r.MBps, r.Seconds)

	// Concurrent readers of two different files.
	w2, err := c.Write(ctx, "/bench/f1", fileMB)
	require.NoError(t, err)
	require.NoError(t, DropCaches())
	r2, err := c.Read(ctx, 2, path, "/bench/f1")
	require.NoError(t, err)
	require.Equal(t, w.Bytes+w2.Bytes, r2.Bytes)
	require.Len(t, r2.Readers, 2)
	for _, rd := range r2.Readers {
		assert.Equal(t, w.Bytes, rd.Bytes, "reader of %s", rd.Path)
	}
	t.Logf("2 concurrent readers after drop_caches: %.1f MB/s total", r2.MBps)

	_, err = c.Read(ctx, 1, "/no/such/file")
	assert.ErrorContains(t, err, "FileNotFoundException", "a missing file is an error, not zero bytes")

	pid := c.PID
	require.NoError(t, c.Close())
	assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "JVM %d still exists after Close", pid)
	out, _ := exec.Command("pgrep", "-f", "hdfsbench.Server "+filepath.Join(mnt, "hdfs")).Output()
	assert.Empty(t, strings.TrimSpace(string(out)), "server processes left for this base dir")
	entries, _ := os.ReadDir(filepath.Join(mnt, "hdfs"))
	t.Logf("after shutdown the base dir holds %d entries (MiniDFSCluster empties the DataNode storage)", len(entries))
}

// BenchmarkRealHDFSRead reads one 256 MiB file through the HDFS client after dropping
// caches, on a plain loop device (a baseline for the lab's slowed devices).
func BenchmarkRealHDFSRead(b *testing.B) {
	Skip(b)
	ctx := context.Background()
	c, _, _ := startOnLoop(b, ctx)
	const path = "/bench/f0"
	_, err := c.Write(ctx, path, fileMB)
	require.NoError(b, err)
	b.SetBytes(int64(fileMB) << 20)
	b.ResetTimer()
	var mbps float64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		require.NoError(b, DropCaches())
		b.StartTimer()
		r, err := c.Read(ctx, 1, path)
		require.NoError(b, err)
		mbps += r.MBps
	}
	b.ReportMetric(mbps/float64(b.N), "MB/s")
}

// watchOpen polls /proc/PID/fd until stop and reports whether file was ever open there.
func watchOpen(pid int, file string, stop <-chan struct{}) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	for {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == file {
				return true
			}
		}
		select {
		case <-stop:
			return false
		case <-time.After(2 * time.Millisecond):
		}
	}
}
