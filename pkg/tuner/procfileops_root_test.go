package tuner

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/scope"
	"github.com/readaheadd/readaheadd/pkg/state"
)

const helperEnv = "READAHEADD_TUNER_TEST_READER"

// TestMain lets the test binary double as the reader process: it opens a
// file, then reads it on command, like a DataNode that opened a block file
// before readaheadd acted.
func TestMain(m *testing.M) {
	if p := os.Getenv(helperEnv); p != "" {
		os.Exit(readerMain(p))
	}
	os.Exit(m.Run())
}

func readerMain(path string) int {
	f, err := os.Open(path)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("ready", f.Fd())
	in := bufio.NewScanner(os.Stdin)
	buf := make([]byte, 64<<10)
	var mapped []byte
	for in.Scan() {
		var off, n int64
		if _, err := fmt.Sscanf(in.Text(), "touch %d", &off); err == nil {
			// A page fault on a shared mapping of the open file: the
			// kernel reads around it with the open file's window.
			if mapped == nil {
				st, _ := f.Stat()
				if mapped, err = unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED); err != nil {
					fmt.Println("error", err)
					return 1
				}
			}
			fmt.Println("done", mapped[off])
			continue
		}
		if _, err := fmt.Sscanf(in.Text(), "read %d %d", &off, &n); err != nil {
			return 0
		}
		for done := int64(0); done < n; done += int64(len(buf)) {
			if _, err := f.ReadAt(buf, off+done); err != nil && err != io.EOF {
				fmt.Println("error", err)
				return 1
			}
		}
		fmt.Println("done")
	}
	return 0
}

type reader struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	fd  int
}

func startReader(t *testing.T, path string) *reader {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	outp, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	r := &reader{cmd: cmd, in: in, out: bufio.NewScanner(outp)}
	require.True(t, r.out.Scan(), "reader did not start")
	var fd int
	_, err = fmt.Sscanf(r.out.Text(), "ready %d", &fd)
	require.NoError(t, err, "reader said %q", r.out.Text())
	r.fd = fd
	return r
}

func (r *reader) read(t *testing.T, off, n int64) {
	t.Helper()
	_, err := fmt.Fprintf(r.in, "read %d %d\n", off, n)
	require.NoError(t, err)
	require.True(t, r.out.Scan())
	require.Equal(t, "done", r.out.Text())
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %v: %s", name, args, out)
	return strings.TrimSpace(string(out))
}

// loopFS makes a file-backed loop device with ext4 mounted in a temp dir,
// torn down on cleanup. It returns the mount point and the loop's name.
func loopFS(t *testing.T) (string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a loop device and mounts it")
	}
	for _, tool := range []string{"losetup", "mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	f, err := os.Create(img)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(256<<20))
	f.Close()
	dev := run(t, "losetup", "--find", "--show", img)
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	// A loop device keeps the settings its previous user left: start from
	// the kernel default on ours.
	require.NoError(t, blockdev.SysFS{}.SetReadAheadKB(filepath.Base(dev), 128))
	run(t, "mkfs.ext4", "-q", "-F", dev)
	mnt := filepath.Join(dir, "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	run(t, "mount", dev, mnt)
	t.Cleanup(func() {
		if err := exec.Command("umount", mnt).Run(); err != nil {
			exec.Command("umount", "-l", mnt).Run()
		}
	})
	return mnt, filepath.Base(dev)
}

func writeUncached(t *testing.T, path string, size int) probe.FileKey {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	f, err := os.Create(path)
	require.NoError(t, err)
	buf := make([]byte, 1<<20)
	for i := 0; i < size>>20; i++ {
		_, err := f.Write(buf)
		require.NoError(t, err)
	}
	require.NoError(t, f.Sync())
	f.Close()
	dropCache(t, path)
	var st unix.Stat_t
	require.NoError(t, unix.Stat(path, &st))
	return probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}
}

func dropCache(t *testing.T, path string) {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
}

// quiesce waits until the device has no read in flight and its counters
// stopped moving, so a readahead still running is not counted in the next
// measurement.
func quiesce(t *testing.T, name string) {
	t.Helper()
	last := sectorsRead(t, name)
	for i := 0; i < 100; i++ {
		time.Sleep(20 * time.Millisecond)
		b, err := os.ReadFile(filepath.Join("/sys/block", name, "inflight"))
		require.NoError(t, err)
		now := sectorsRead(t, name)
		if now == last && strings.Fields(string(b))[0] == "0" {
			return
		}
		last = now
	}
	t.Fatalf("%s did not become idle", name)
}

// sectorsRead is field 3 of /sys/block/NAME/stat.
func sectorsRead(t *testing.T, name string) uint64 {
	b, err := os.ReadFile(filepath.Join("/sys/block", name, "stat"))
	require.NoError(t, err)
	f := strings.Fields(string(b))
	v, err := strconv.ParseUint(f[2], 10, 64)
	require.NoError(t, err)
	return v
}

// procTuner is a tuner on a loop device of its own with a reader child
// that opened name (64 MiB, not cached) before any change, like a running
// DataNode or service.
type procTuner struct {
	tn   *Tuner
	st   *state.Store
	sys  blockdev.SysFS
	disk blockdev.Disk
	loop string
	orig int
	path string
	key  probe.FileKey
	rd   *reader
}

func newProcTuner(t *testing.T, name string) *procTuner {
	t.Helper()
	mnt, loop := loopFS(t)
	p := &procTuner{loop: loop}
	var err error
	p.disk, err = p.sys.Lookup(loop)
	require.NoError(t, err)
	p.orig, err = p.sys.ReadAheadKB(loop)
	require.NoError(t, err)
	p.path = filepath.Join(mnt, "data", name)
	p.key = writeUncached(t, p.path, 64<<20)
	p.rd = startReader(t, p.path)
	p.st, err = state.Open(t.TempDir(), state.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { p.st.Close() })
	p.tn, err = New(Config{AllowPaths: []string{filepath.Join(mnt, "data")}, MaxKB: 4096},
		Deps{Sysfs: p.sys, Files: actuate.NewProcFileOps(), Clock: clock.Monotonic{}, Store: p.st, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { p.tn.RestoreAll(); p.sys.SetReadAheadKB(loop, p.orig) })
	return p
}

// pinOne pins kb on the one descriptor in refs (below the device's
// window too) and checks the device is back at its own value.
func (p *procTuner) pinOne(t *testing.T, kb int, refs []actuate.FileRef) *devState {
	t.Helper()
	p.tn.mu.Lock()
	d := p.tn.device(p.disk.Dev)
	require.NotNil(t, d)
	n, err := p.tn.raiseFiles(d, kb, refs, false)
	p.tn.mu.Unlock()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	now, err := p.sys.ReadAheadKB(p.loop)
	require.NoError(t, err)
	assert.Equal(t, p.orig, now, "the device is back at its own window")
	return d
}

func TestProcFileOpsPinsAnOpenFileWindow(t *testing.T) {
	p := newProcTuner(t, "blk_1")
	orig, path, key, rd, st, tn, loop := p.orig, p.path, p.key, p.rd, p.st, p.tn, p.loop

	// Baseline: 2 MB read with the window the file got at open.
	before := sectorsRead(t, loop)
	rd.read(t, 0, 2<<20)
	quiesce(t, loop)
	base := (sectorsRead(t, loop) - before) * 512
	dropCache(t, path)

	// Find the reader's descriptor through /proc and check its scope.
	refs, err := tn.deps.Files.Find(uint32(rd.cmd.Process.Pid), key)
	require.NoError(t, err)
	require.Len(t, refs, 1)
	assert.Equal(t, rd.fd, refs[0].FD)
	real, err := tn.scope.Check(refs[0].Tgid, refs[0].FD, refs[0].Path, key)
	require.NoError(t, err)
	assert.Equal(t, path, real)

	// Raise, pin, restore a 4 MB window on that open file only.
	p.pinOne(t, 4096, refs)
	recorded, ok := st.Original(loop)
	require.True(t, ok, "the original was recorded before the raise")
	assert.Equal(t, orig, recorded)

	quiesce(t, loop)
	before = sectorsRead(t, loop)
	rd.read(t, 0, 2<<20)
	quiesce(t, loop)
	pinned := (sectorsRead(t, loop) - before) * 512
	t.Logf("device bytes read for 2 MiB consumed: window %d KB at open: %d; pinned 4096 KB: %d (%.1fx)", orig, base, pinned, float64(pinned)/float64(base))
	assert.Greater(t, pinned, 2*base, "the pinned window reads much further ahead")

	// A file opened now still gets the device's default.
	dropCache(t, path)
	rd2 := startReader(t, path)
	quiesce(t, loop)
	before = sectorsRead(t, loop)
	rd2.read(t, 0, 2<<20)
	quiesce(t, loop)
	fresh := (sectorsRead(t, loop) - before) * 512
	assert.Less(t, fresh, pinned/2, "a new open file is not affected: %d", fresh)

	// The reader exits: taking its descriptor is a clean, recognisable failure.
	require.NoError(t, rd.cmd.Process.Kill())
	rd.cmd.Wait()
	_, err = tn.deps.Files.Dup(refs[0])
	assert.ErrorIs(t, err, actuate.ErrProcessGone)
}

func (r *reader) touch(t *testing.T, off int64) {
	t.Helper()
	_, err := fmt.Fprintf(r.in, "touch %d\n", off)
	require.NoError(t, err)
	require.True(t, r.out.Scan())
	require.True(t, strings.HasPrefix(r.out.Text(), "done"), "reader said %q", r.out.Text())
}

// TestProcFileOpsTrimsAnMmapReadersReadAround: an mmap reader that no
// readahead event names is found among every process's descriptors, and a
// window pinned below the device's on its open file shrinks what each of
// its page faults reads.
func TestProcFileOpsTrimsAnMmapReadersReadAround(t *testing.T) {
	p := newProcTuner(t, "index")
	orig, key, rd, tn, loop := p.orig, p.key, p.rd, p.tn, p.loop

	// Faults 1 MiB apart: each one's read-around is its own.
	faults := func(first int64) uint64 {
		quiesce(t, loop)
		before := sectorsRead(t, loop)
		for i := int64(0); i < 16; i++ {
			rd.touch(t, (first+2*i)<<20+64<<10)
		}
		quiesce(t, loop)
		return (sectorsRead(t, loop) - before) * 512 / 16
	}
	base := faults(0)

	refs, err := tn.deps.Files.FindAll(key)
	require.NoError(t, err)
	require.Len(t, refs, 1, "the reader's descriptor, found without a readahead event")
	assert.Equal(t, rd.fd, refs[0].FD)
	assert.Equal(t, uint32(rd.cmd.Process.Pid), refs[0].Tgid)

	d := p.pinOne(t, 16, refs)
	trimmed := faults(1)

	tn.mu.Lock()
	_, err = tn.raiseFiles(d, d.cur, refs, false)
	tn.mu.Unlock()
	require.NoError(t, err)
	back := faults(32)
	t.Logf("device bytes per page fault: window %d KB: %d; trimmed to 16 KB: %d; back: %d", orig, base, trimmed, back)
	assert.LessOrEqual(t, trimmed, uint64(16<<10), "a fault reads at most the trimmed window")
	assert.Greater(t, base, 4*trimmed)
	assert.Greater(t, back, 4*trimmed, "the device's window is back on the open file")
}

func TestScopeRefusesOutsideAndBindMounts(t *testing.T) {
	mnt, _ := loopFS(t)
	data := filepath.Join(mnt, "data")
	in := filepath.Join(data, "blk_1")
	inKey := writeUncached(t, in, 1<<20)
	out := filepath.Join(mnt, "other", "f")
	outKey := writeUncached(t, out, 1<<20)
	sc, err := scope.New([]string{data})
	require.NoError(t, err)

	ops := actuate.NewProcFileOps()
	for _, c := range []struct {
		path string
		key  probe.FileKey
		ok   bool
	}{{in, inKey, true}, {out, outKey, false}} {
		rd := startReader(t, c.path)
		refs, err := ops.Find(uint32(rd.cmd.Process.Pid), c.key)
		require.NoError(t, err)
		require.Len(t, refs, 1)
		_, err = sc.Check(refs[0].Tgid, refs[0].FD, refs[0].Path, c.key)
		assert.Equal(t, c.ok, err == nil, "%s: %v", c.path, err)
	}

	// A directory of another filesystem bind-mounted under the allow-path.
	elsewhere := t.TempDir()
	ext := filepath.Join(elsewhere, "f")
	require.NoError(t, os.WriteFile(ext, []byte("x"), 0o644))
	bind := filepath.Join(data, "bind")
	require.NoError(t, os.Mkdir(bind, 0o755))
	run(t, "mount", "--bind", elsewhere, bind)
	t.Cleanup(func() { exec.Command("umount", bind).Run() })
	rd := startReader(t, filepath.Join(bind, "f"))
	var stt unix.Stat_t
	require.NoError(t, unix.Stat(ext, &stt))
	extKey := probe.FileKey{Dev: probe.DevFromUnix(stt.Dev), Ino: stt.Ino}
	refs, err := ops.Find(uint32(rd.cmd.Process.Pid), extKey)
	require.NoError(t, err)
	require.Len(t, refs, 1)
	assert.True(t, strings.HasPrefix(refs[0].Path, data), "the reader's path is under the allow-path: %s", refs[0].Path)
	_, err = sc.Check(refs[0].Tgid, refs[0].FD, refs[0].Path, extKey)
	assert.Error(t, err, "a bind mount from another filesystem does not count")
}
