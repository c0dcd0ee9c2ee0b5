package fileras

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/test/holder"
)

func TestMain(m *testing.M) {
	holder.Main()
	os.Exit(m.Run())
}

// holders starts a process holding n descriptors on path.
func holders(t *testing.T, n int, path string) int {
	t.Helper()
	pids, stop, err := holder.Start(1, n, path)
	t.Cleanup(stop)
	require.NoError(t, err)
	return pids[0]
}

// walked runs f and returns how many files the iterator visited meanwhile.
func walked(t *testing.T, it *Iter, f func()) uint64 {
	t.Helper()
	before, err := it.Visited()
	require.NoError(t, err)
	f()
	after, err := it.Visited()
	require.NoError(t, err)
	return after - before
}

type fakeSysfs struct{ writes []int }

func (f *fakeSysfs) ReadAheadKB(string) (int, error) { return 128, nil }
func (f *fakeSysfs) SetReadAheadKB(_ string, kb int) error {
	f.writes = append(f.writes, kb)
	return nil
}

// TestWalksScopedWithManyOpenFiles: with another process holding 19,000
// files, a walk of one process visits its files only, and neither a
// raise-pin-restore (which looks for files opened during its device write)
// nor the polls of a break (this process's descriptors, every millisecond)
// walks every process's files.
func TestWalksScopedWithManyOpenFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF iterator, pidfd_getfd)")
	}
	const held = 19000 // below the usual hard RLIMIT_NOFILE of 20,000
	it, err := Open()
	require.NoError(t, err)
	defer it.Close()
	perTask, hook := it.Scoped()
	require.True(t, perTask, "a task-bound iterator did not attach (Linux 6.1 or later has them)")
	require.True(t, hook, "the open hook (tp_btf/sys_exit) did not load")

	dir := t.TempDir()
	path := dir + "/held"
	require.NoError(t, os.WriteFile(path, make([]byte, 1<<20), 0o644))
	var st unix.Stat_t
	require.NoError(t, unix.Stat(path, &st))
	key := probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}
	holderPid := holders(t, held, path)

	var all []File
	whole := walked(t, it, func() {
		all, err = it.Files(Query{AllDevs: true})
		require.NoError(t, err)
	})
	assert.GreaterOrEqual(t, whole, uint64(held), "a walk of every process visits the held files")
	n := 0
	for _, f := range all {
		if f.Tgid == uint32(holderPid) && f.Key == key {
			n++
		}
	}
	assert.Equal(t, held, n)
	var one []File
	theirs := walked(t, it, func() {
		one, err = it.Files(Query{Tgid: uint32(holderPid), AllDevs: true})
		require.NoError(t, err)
	})
	n = 0
	for _, f := range one {
		if f.Key == key {
			n++
		}
	}
	assert.Equal(t, held, n, "a walk of the holder lists its files")
	assert.Less(t, theirs, uint64(held+100), "a walk of one process visits its files only")

	// A raise-pin-restore of one of this process's files, through the
	// tuner's Lowerer: the device write is faked, the rest is real.
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	ops := actuate.NewProcFileOps()
	ref := actuate.FileRef{Tgid: uint32(os.Getpid()), FD: int(f.Fd()), Key: key}
	h, err := ops.Dup(ref)
	require.NoError(t, err)
	defer h.Close()
	sys := &fakeSysfs{}
	var opened *os.File
	low := &actuate.Lowerer{Sysfs: sys, Files: ops, States: States{It: it}}
	var ls actuate.LowerStats
	walks := it.Walks()
	raiseStart := time.Now()
	raise := walked(t, it, func() {
		ls, err = low.Lower(actuate.LowerReq{Device: "fake", DeviceKB: 128, KB: 1024, NoBreak: true,
			Files: []actuate.LowerFile{{Ref: ref, H: h}}})
		require.NoError(t, err)
	})
	raiseTook := time.Since(raiseStart)
	assert.Equal(t, []int{1024, 128}, sys.writes, "raise, pin, restore")
	assert.Equal(t, 1, ls.Set)
	assert.Equal(t, uint64(0), it.Walks()-walks, "walks of every process in a raise-pin-restore")
	assert.Less(t, raise, uint64(held/10))

	// A file opened during the device write is found, with its window;
	// one opened on another device is not.
	opens, err := States{It: it}.WatchOpens([]probe.Dev{key.Dev})
	require.NoError(t, err)
	opened, err = os.Open(path)
	require.NoError(t, err)
	defer opened.Close()
	other, err := os.Open("/proc/self/stat")
	require.NoError(t, err)
	defer other.Close()
	got := opens()
	require.Len(t, got, 1)
	assert.Equal(t, actuate.FileRef{Tgid: uint32(os.Getpid()), FD: int(opened.Fd()), Key: key}, got[0].Ref)
	assert.Equal(t, kernelWindow(t, it, int(opened.Fd())), got[0].RA.RAPages)
	// Disarmed: a later open is not noted.
	later, err := os.Open(path)
	require.NoError(t, err)
	defer later.Close()
	fs, err := it.Opened()
	require.NoError(t, err)
	assert.Empty(t, fs)

	// A break's polls read this process's descriptors.
	walks = it.Walks()
	start := time.Now()
	self := walked(t, it, func() {
		for i := 0; i < 100; i++ {
			_, err := States{It: it}.Own([]int{int(f.Fd())})
			require.NoError(t, err)
		}
	})
	took := time.Since(start)
	assert.Equal(t, uint64(0), it.Walks()-walks)
	assert.Less(t, self/100, uint64(held/10), "files visited per poll of this process's descriptors")
	// Walks of every process, of this one and of the holder side by side:
	// each lists what it would alone.
	done := make(chan error, 3)
	for _, q := range []Query{{AllDevs: true}, {Tgid: uint32(os.Getpid()), AllDevs: true}, {Tgid: uint32(holderPid)}} {
		go func() {
			for i := 0; i < 5; i++ {
				fs, err := it.Files(q)
				if err == nil && (q.Tgid == 0 && len(fs) < held || q.Tgid != 0 && len(fs) == 0) {
					err = fmt.Errorf("walk %+v listed %d files", q, len(fs))
				}
				for _, f := range fs {
					if err == nil && q.Tgid != 0 && f.Tgid != q.Tgid {
						err = fmt.Errorf("walk of %d listed a file of %d", q.Tgid, f.Tgid)
					}
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for i := 0; i < 3; i++ {
		require.NoError(t, <-done)
	}
	start = time.Now()
	_, err = it.Files(Query{})
	require.NoError(t, err)
	t.Logf("files visited: a walk of every process %d, of the holder %d, a raise-pin-restore %d (%v, the open hook's attach and detach included), 100 polls of our own descriptors %d (%v; one walk of every process %v)",
		whole, theirs, raise, raiseTook, self, took, time.Since(start))
}

func kernelWindow(t *testing.T, it *Iter, fd int) uint32 {
	return findFD(t, it, fd).RAPages
}

// TestFindAllThroughTheIterator: the search of every process's descriptors
// for one file lists the holder's, as /proc does, and the next one within
// 100 times its duration is deferred.
func TestFindAllThroughTheIterator(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF iterator)")
	}
	it, err := Open()
	require.NoError(t, err)
	defer it.Close()
	dir := t.TempDir()
	path := dir + "/held"
	require.NoError(t, os.WriteFile(path, []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(dir+"/other", []byte("x"), 0o644))
	var st unix.Stat_t
	require.NoError(t, unix.Stat(path, &st))
	key := probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}
	pid := holders(t, 3, path)
	holders(t, 2, dir+"/other")

	now := time.Unix(1000, 0)
	ops := NewFileOps(it)
	ops.now = func() time.Time { now = now.Add(time.Millisecond); return now }
	refs, err := ops.FindAll(key)
	require.NoError(t, err)
	want, err := actuate.NewProcFileOps().Find(uint32(pid), key)
	require.NoError(t, err)
	require.Len(t, want, 3)
	assert.ElementsMatch(t, want, refs, "the holder's three descriptors, with their paths")
	_, err = ops.FindAll(key)
	assert.ErrorIs(t, err, ErrSearchDeferred)
	now = now.Add(time.Second)
	_, err = ops.FindAll(key)
	assert.NoError(t, err, "a search 1 s after one of 1 ms")
}
