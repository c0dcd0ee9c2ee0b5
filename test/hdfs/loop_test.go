package hdfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// loopExt4 creates a file-backed loop device of sizeMB MiB (direct I/O, so reads reach the
// disk under the image rather than its page cache), formats it ext4 and mounts it. Returns
// the mount point and the device number; everything is undone in t.Cleanup.
func loopExt4(tb testing.TB, sizeMB int64) (string, uint64) {
	tb.Helper()
	dir := tb.TempDir()
	img := filepath.Join(dir, "hdfs.img")
	f, err := os.Create(img)
	require.NoError(tb, err)
	require.NoError(tb, f.Truncate(sizeMB<<20))
	require.NoError(tb, f.Close())

	out, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", img).CombinedOutput()
	require.NoError(tb, err, "losetup: %s", out)
	dev := strings.TrimSpace(string(out))
	tb.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			tb.Errorf("detach %s: %v: %s", dev, err, out)
		}
	})
	// Initialise inode tables now, so ext4lazyinit does not write during the measurement.
	out, err = exec.Command("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev).CombinedOutput()
	require.NoError(tb, err, "mkfs.ext4 %s: %s", dev, out)

	mnt := filepath.Join(dir, "mnt")
	require.NoError(tb, os.Mkdir(mnt, 0o755))
	require.NoError(tb, unix.Mount(dev, mnt, "ext4", 0, ""), "mount %s", dev)
	tb.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			tb.Errorf("unmount %s: %v (something still uses it; lazy unmount)", mnt, err)
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	var st unix.Stat_t
	require.NoError(tb, unix.Stat(dev, &st))
	return mnt, st.Rdev
}
