package probe

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// lab is an ext4 filesystem on a loop device (direct I/O on a file-backed
// image) that the test created and that t.Cleanup tears down.
type lab struct {
	Loop string // /dev/loopN
	Dev  Dev    // the loop device's number
	Mnt  string
}

func needRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
	for _, tool := range []string{"losetup", "mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (util-linux, e2fsprogs): %v", tool, err)
		}
	}
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s: %s", name, strings.Join(args, " "), out)
	return strings.TrimSpace(string(out))
}

// newLab creates a sizeMB image, attaches it, makes ext4 and mounts it.
func newLab(t testing.TB, sizeMB int) *lab {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	f, err := os.Create(img)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(int64(sizeMB)<<20))
	require.NoError(t, f.Close())

	loop := run(t, "losetup", "--find", "--show", "--direct-io=on", img)
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", loop).CombinedOutput(); err != nil {
			t.Errorf("detach %s: %v: %s", loop, err, out)
		}
	})
	run(t, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop)
	mnt := filepath.Join(dir, "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	run(t, "mount", "-t", "ext4", loop, mnt)
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			// Busy only if something still reads; detach lazily so the loop can go.
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
			t.Logf("unmount %s: %v (detached lazily)", mnt, err)
		}
	})
	var st unix.Stat_t
	require.NoError(t, unix.Stat(loop, &st))
	return &lab{Loop: loop, Dev: DevFromUnix(st.Rdev), Mnt: mnt}
}

// writeFile writes size random bytes and returns the file's key.
func (l *lab) writeFile(t testing.TB, name string, size int64) (string, FileKey) {
	t.Helper()
	p := filepath.Join(l.Mnt, name)
	f, err := os.Create(p)
	require.NoError(t, err)
	_, err = io.CopyN(f, rand.Reader, size)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	// Its pages are clean now: evict them here too, since drop_caches
	// alone left a few MB of a just written file cached in CI runs.
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
	require.NoError(t, f.Close())
	var st unix.Stat_t
	require.NoError(t, unix.Stat(p, &st))
	return p, FileKey{Dev: DevFromUnix(st.Dev), Ino: st.Ino}
}

// dropCaches writes back and drops the page cache, so reads hit the device.
func dropCaches(t testing.TB) {
	t.Helper()
	unix.Sync()
	require.NoError(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0))
}

// residentBytes is how much of p the page cache holds now (mincore): bytes
// a read will not ask the device for, should drop_caches have left some
// (pages under writeback or in use are not dropped).
func residentBytes(t testing.TB, p string) uint64 {
	t.Helper()
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)
	if st.Size() == 0 {
		return 0
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(m)
	pg := os.Getpagesize()
	vec := make([]byte, (len(m)+pg-1)/pg)
	mincore(t, m, vec)
	var n uint64
	for _, v := range vec {
		if v&1 != 0 {
			n += uint64(pg)
		}
	}
	return n
}

// mincore fills vec with the residency of m's pages (bit 0: cached).
func mincore(t testing.TB, m, vec []byte) {
	t.Helper()
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		require.NoError(t, errno, "mincore")
	}
}

// readAll reads p sequentially in a child process (so that its tgid differs
// from the test's) and returns the child's pid.
func readAll(t testing.TB, p string) int {
	t.Helper()
	return readAllBS(t, p, "1M")
}

func readAllBS(t testing.TB, p, bs string) int {
	t.Helper()
	cmd := exec.Command("dd", "if="+p, "of=/dev/null", "bs="+bs)
	var out bytes.Buffer
	cmd.Stderr = &out
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	require.NoError(t, cmd.Wait(), "dd %s: %s", p, out.String())
	return pid
}

func mb(n int64) int64 { return n << 20 }

func fmtMB(b uint64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) }

var _ = time.Second
