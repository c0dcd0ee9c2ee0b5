package scope

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts and mount namespaces")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1) (util-linux)")
	}
}

func mountT(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("mount", args...).CombinedOutput()
	require.NoError(t, err, "mount %v: %s", args, out)
	target := args[len(args)-1]
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
}

// nsReader starts a process in a mount namespace of its own that runs
// script (mounts) and then holds file open as its descriptor 0. It
// returns the pid once the descriptor is the file want.
func nsReader(t *testing.T, script, file string, want probe.FileKey) uint32 {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script+` && exec sleep 120 <"$0"`, file)
	out := &syncBuf{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	pid := uint32(cmd.Process.Pid)
	require.Eventually(t, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		var st unix.Stat_t
		return unix.Stat("/proc/"+strconv.Itoa(int(pid))+"/fd/0", &st) == nil &&
			probe.DevFromUnix(st.Dev) == want.Dev && st.Ino == want.Ino
	}, 10*time.Second, 10*time.Millisecond)
	select {
	case <-done:
		t.Fatalf("reader exited: %s", out.String())
	default:
	}
	return pid
}

func hostReader(t *testing.T, file string) uint32 {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	cmd := exec.Command("sleep", "120")
	cmd.Stdin = f
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return uint32(cmd.Process.Pid)
}

func fd0(t *testing.T, pid uint32) string {
	t.Helper()
	p, err := os.Readlink("/proc/" + strconv.Itoa(int(pid)) + "/fd/0")
	require.NoError(t, err)
	return p
}

// TestScopeRealNamespaces: readers in mount namespaces of their own, with
// bind mounts as a container runtime makes them, against the scope of
// /host/data with a disk mounted at /host/data/1.
func TestScopeRealNamespaces(t *testing.T) {
	requireRoot(t)
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	host, other := filepath.Join(tmp, "host"), filepath.Join(tmp, "other")
	for _, d := range []string{host, other} {
		require.NoError(t, os.Mkdir(d, 0o755))
		mountT(t, "-t", "tmpfs", "-o", "size=8m", "tmpfs", d)
	}
	data := filepath.Join(host, "data")
	inKey := write(t, filepath.Join(data, "sub", "f"))
	decoy := write(t, filepath.Join(data, "f"))
	outKey := write(t, filepath.Join(host, "outside", "f"))
	require.NoError(t, os.MkdirAll(filepath.Join(data, "1"), 0o755))
	mountT(t, "-t", "tmpfs", "-o", "size=8m", "tmpfs", filepath.Join(data, "1"))
	diskKey := write(t, filepath.Join(data, "1", "x"))
	otherKey := write(t, filepath.Join(other, "sub", "f"))
	require.NoError(t, os.MkdirAll(filepath.Join(data, "bind"), 0o755))
	mountT(t, "--bind", filepath.Join(other, "sub"), filepath.Join(data, "bind"))
	require.NoError(t, os.Symlink(filepath.Join(host, "outside"), filepath.Join(data, "link")))
	vol := filepath.Join(tmp, "pod", "vol")
	require.NoError(t, os.MkdirAll(vol, 0o755))

	sc, err := New([]string{data})
	require.NoError(t, err)

	for _, c := range []struct {
		name string
		pid  func() uint32
		key  probe.FileKey
		want string
	}{
		{"pod volume: the data directory at another path", func() uint32 {
			return nsReader(t, "mount --bind "+data+" "+vol, vol+"/sub/f", inKey)
		}, inKey, filepath.Join(data, "sub", "f")},
		{"pod volume: the disk mounted below the data directory", func() uint32 {
			return nsReader(t, "mount --bind "+data+"/1 "+vol, vol+"/x", diskKey)
		}, diskKey, filepath.Join(data, "1", "x")},
		{"pod volume: recursive bind of the data directory, disk below", func() uint32 {
			return nsReader(t, "mount --rbind "+data+" "+vol, vol+"/1/x", diskKey)
		}, diskKey, filepath.Join(data, "1", "x")},
		{"outside directory mounted over the allowed path", func() uint32 {
			return nsReader(t, "mount --bind "+host+"/outside "+data, data+"/f", outKey)
		}, outKey, ""},
		{"the allowed path's own file, in a namespace that hides nothing", func() uint32 {
			return nsReader(t, "true", data+"/f", decoy)
		}, decoy, filepath.Join(data, "f")},
		{"host: disk mounted below", func() uint32 { return hostReader(t, filepath.Join(data, "1", "x")) }, diskKey, filepath.Join(data, "1", "x")},
		{"host: another file system's directory bind-mounted below", func() uint32 { return hostReader(t, filepath.Join(data, "bind", "f")) }, otherKey, ""},
		{"host: symlink out", func() uint32 { return hostReader(t, filepath.Join(data, "link", "f")) }, outKey, ""},
		{"host: dot-dot out", func() uint32 { return hostReader(t, data+"/../outside/f") }, outKey, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			pid := c.pid()
			path := fd0(t, pid)
			got, err := sc.Check(pid, 0, path, c.key)
			t.Logf("pid %d sees %s: %q %v", pid, path, got, err)
			if c.want == "" {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

type syncBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
