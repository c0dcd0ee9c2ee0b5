package tuner

import (
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/fileras"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/test/lab"
)

// kernelFile is what the kernel holds for pid's open file of path.
func kernelFile(t *testing.T, it *fileras.Iter, pid int, key probe.FileKey) fileras.File {
	t.Helper()
	fs, err := it.Files(fileras.Query{Tgid: uint32(pid)})
	require.NoError(t, err)
	for _, f := range fs {
		if f.Key == key {
			return f
		}
	}
	t.Fatalf("pid %d holds no open file %s (iterator)", pid, key)
	return fileras.File{}
}

func fileKey(t *testing.T, path string) probe.FileKey {
	t.Helper()
	var st syscallStat
	require.NoError(t, statPath(path, &st))
	return probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}
}

// lowerOne sets the window of pid's one open file of key through low (the
// device at 128 KB).
func lowerOne(t *testing.T, l *lab.Lab, low *actuate.Lowerer, pid int, key probe.FileKey) func(kb int) actuate.LowerStats {
	t.Helper()
	refs, err := low.Files.Find(uint32(pid), key)
	require.NoError(t, err)
	require.Len(t, refs, 1)
	return func(kb int) actuate.LowerStats {
		h, err := low.Files.Dup(refs[0])
		require.NoError(t, err)
		defer h.Close()
		st, err := low.Lower(actuate.LowerReq{Device: l.Name, DeviceKB: 128, KB: kb, Files: []actuate.LowerFile{{Ref: refs[0], H: h}}})
		require.NoError(t, err)
		return st
	}
}

// rateOver is a reader's throughput (MB/s) over the next d.
func rateOver(c *child, d time.Duration) float64 {
	from := monoNow()
	time.Sleep(d)
	ws := windows(c.points(), from, monoNow(), d-150*time.Millisecond)
	if len(ws) == 0 {
		return 0
	}
	return ws[0].Rate / 1e6
}

// TestLowerRunningStream: a reader streaming on a 1024 KB window of a slowed
// file keeps it after a plain POSIX_FADV_NORMAL at the device's 128 KB (the
// kernel's asynchronous readahead never shrinks a window), and is back at
// the default window's f_ra and throughput after Lowerer.Lower. Files
// opened on the device while read_ahead_kb held 0 or a raised value end
// with the device's own window.
func TestLowerRunningStream(t *testing.T) {
	needRoot(t)
	l := newLab(t)
	// Large enough that the reader never wraps around (a new pass starts
	// a fresh window and would hide the point).
	const fileMB = 1024
	path, err := l.WriteFile("blk_lower", fileMB)
	require.NoError(t, err)
	require.NoError(t, l.SetPermanent(3*time.Millisecond, path))
	key := fileKey(t, path)
	it, err := fileras.Open()
	require.NoError(t, err)
	t.Cleanup(func() { it.Close() })
	require.NoError(t, it.Watch(key.Dev))
	sys := blockdev.SysFS{Root: "/sys"}
	files := actuate.NewProcFileOps()
	low := &actuate.Lowerer{Sysfs: sys, Files: files, States: fileras.States{It: it}}

	require.NoError(t, lab.DropFileCache(path))
	c := startChild(t, "seq", path)
	c.goRead(t)
	time.Sleep(1500 * time.Millisecond) // ramp, and the file's writeback done
	def := rateOver(c, 1500*time.Millisecond)
	kf := kernelFile(t, it, c.Pid, key)
	t.Logf("default: %.0f MB/s; f_ra ra_pages %d KB, window %d KB", def, kf.WindowKB(), kf.SizeKB())
	require.Equal(t, 128, kf.WindowKB())

	set := lowerOne(t, l, low, c.Pid, key)

	// Opens in a loop on the device while windows change: each must end
	// with the device's own window.
	var opened []*os.File
	var omu sync.Mutex
	var stop atomic.Bool
	var wg sync.WaitGroup
	t.Cleanup(func() {
		stop.Store(true)
		wg.Wait()
		for _, f := range opened {
			f.Close()
		}
	})
	probeFile, err := l.WriteFile("opened_meanwhile", 1)
	require.NoError(t, err)
	// Opens while set runs (a few thousand at most: the descriptor limit).
	opener := func() {
		stop.Store(false)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				omu.Lock()
				full := len(opened) >= 12000
				omu.Unlock()
				if full {
					return
				}
				if f, err := os.Open(probeFile); err == nil {
					omu.Lock()
					opened = append(opened, f)
					omu.Unlock()
				}
				time.Sleep(20 * time.Microsecond)
			}
		}()
	}
	halt := func() { stop.Store(true); wg.Wait() }

	opener()
	up := set(1024)
	halt()
	time.Sleep(500 * time.Millisecond)
	raised := rateOver(c, 1500*time.Millisecond)
	kf = kernelFile(t, it, c.Pid, key)
	t.Logf("raised to 1024 KB (read_ahead_kb at 1024 for %v; %d file(s) opened meanwhile reset): %.0f MB/s; f_ra %d KB, window %d KB",
		up.DeviceOff, up.Strays, raised, kf.WindowKB(), kf.SizeKB())
	require.Equal(t, 1024, kf.WindowKB())
	require.Greater(t, raised, 1.3*def, "the raised window must speed up the slowed reader")

	// The kernel's behaviour the lowering works around.
	refs, err := files.Find(uint32(c.Pid), key)
	require.NoError(t, err)
	h, err := files.Dup(refs[0])
	require.NoError(t, err)
	require.NoError(t, h.Fadvise(0, 0, actuate.AdviceNormal))
	h.Close()
	naive := rateOver(c, 1500*time.Millisecond)
	kf = kernelFile(t, it, c.Pid, key)
	t.Logf("plain FADV_NORMAL at 128 KB: %.0f MB/s; f_ra ra_pages %d KB, window %d KB", naive, kf.WindowKB(), kf.SizeKB())

	opener()
	down := set(128)
	halt()
	after := rateOver(c, 1500*time.Millisecond)
	kf = kernelFile(t, it, c.Pid, key)
	t.Logf("Lower to 128 KB: break %v (read_ahead_kb at 0 for %v, %d file(s) opened meanwhile reset, %d unconfirmed); %.0f MB/s after (default %.0f, raised %.0f); f_ra %d KB, window %d KB",
		down.Hold, down.DeviceOff, down.Strays, down.Unconfirmed, after, def, raised, kf.WindowKB(), kf.SizeKB())
	assert.Equal(t, 1, down.Broken)
	assert.Zero(t, down.Unconfirmed)
	assert.Equal(t, 128, kf.WindowKB())
	assert.LessOrEqual(t, kf.SizeKB(), 128, "the stream's window is back within the device's")
	assert.InEpsilon(t, def, after, 0.3, "throughput back at the default window's")
	assert.Less(t, after, 0.7*raised, "throughput no longer the raised window's")

	pts := c.points()
	require.Less(t, pts[len(pts)-1].Count, int64(fileMB)<<20, "the reader wrapped around its file: the measurement is void")

	all, err := it.Files(fileras.Query{})
	require.NoError(t, err)
	n := 0
	for _, f := range all {
		if f.Tgid == uint32(os.Getpid()) && f.Key.Dev == key.Dev {
			n++
			require.Equal(t, 128, f.WindowKB(), "a file opened while the windows changed kept %d KB", f.WindowKB())
		}
	}
	t.Logf("%d files opened during the changes, all at 128 KB", n)
}

type syscallStat = unix.Stat_t

func statPath(p string, st *unix.Stat_t) error { return unix.Stat(p, st) }
