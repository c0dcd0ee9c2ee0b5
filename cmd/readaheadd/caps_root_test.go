package main

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/tuner"
	"github.com/readaheadd/readaheadd/test/daemontest"
)

func requireRootAndSetpriv(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: BPF attach, loop devices and other users' processes")
	}
	sp, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv not installed (util-linux)")
	}
	return sp
}

// procCaps reads the capability sets of process pid.
func procCaps(t *testing.T, pid int) map[string]uint64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.HasPrefix(k, "Cap") {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			require.NoError(t, err)
			out[k] = n
		}
	}
	return out
}

// loopDevice attaches a small file to a new loop device, detached at the end.
func loopDevice(t *testing.T) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(img, nil, 0o600))
	require.NoError(t, os.Truncate(img, 32<<20))
	out, err := exec.Command("losetup", "-f", "--show", img).CombinedOutput()
	require.NoError(t, err, "losetup: %s", out)
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return filepath.Base(dev)
}

// buildDaemon builds readaheadd without cgo, as `make build` and the image
// do: Go changes every thread's capabilities only in such a binary.
func buildDaemon(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "readaheadd")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "build: %s", out)
	return bin
}

// The running daemon, once its programs are attached, holds only
// runtimeCaps: read from its /proc/PID/status, started as the systemd unit
// starts it (bounding set from the unit) and as plain root.
func TestRunningDaemonKeepsOnlyRuntimeCapabilities(t *testing.T) {
	sp := requireRootAndSetpriv(t)
	bin := buildDaemon(t)
	dev := loopDevice(t)
	want := capsMask(runtimeCaps)
	var unitMask uint64
	for _, c := range strings.Split(unitCapabilities(t), ",") {
		n, err := capFromName(strings.TrimPrefix(c, "+"))
		require.NoError(t, err)
		unitMask |= 1 << n
	}
	for name, prefix := range map[string][]string{
		"as the unit starts it": {sp, "--bounding-set", "-all," + unitCapabilities(t), "--inh-caps", "-all", "--no-new-privs", "--"},
		"as root":               nil,
	} {
		t.Run(name, func(t *testing.T) {
			addr := daemontest.FreeAddr(t)
			logs := &daemontest.SyncBuffer{}
			argv := append(append([]string(nil), prefix...), bin, "run", "--device", dev, "--metrics-addr", addr,
				"--state-dir", filepath.Join(t.TempDir(), "state"), "--interval", "200ms")
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Stdout, cmd.Stderr = logs, logs
			cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=")
			require.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() {
				if cmd.ProcessState == nil {
					_ = cmd.Process.Kill()
					<-done
				}
				if t.Failed() {
					t.Logf("daemon log:\n%s", logs)
				}
			})
			require.Eventually(t, func() bool {
				resp, err := http.Get("http://" + addr + "/healthz")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK
			}, 30*time.Second, 100*time.Millisecond, "daemon not healthy:\n%s", logs)

			caps := procCaps(t, cmd.Process.Pid)
			t.Logf("daemon after attach: CapEff=%016x CapPrm=%016x CapInh=%016x CapAmb=%016x CapBnd=%016x (kept: %v)",
				caps["CapEff"], caps["CapPrm"], caps["CapInh"], caps["CapAmb"], caps["CapBnd"], capNames(caps["CapEff"]))
			assert.Equal(t, want, caps["CapEff"], "effective: %v", capNames(caps["CapEff"]))
			assert.Equal(t, want, caps["CapPrm"], "permitted: %v", capNames(caps["CapPrm"]))
			assert.Zero(t, caps["CapInh"])
			assert.Zero(t, caps["CapAmb"])
			if prefix == nil {
				assert.Equal(t, want, caps["CapBnd"], "with CAP_SETPCAP the bounding set is narrowed too: %v", capNames(caps["CapBnd"]))
			} else {
				assert.Equal(t, unitMask, caps["CapBnd"], "the unit's bounding set (no CAP_SETPCAP to narrow it)")
			}

			// Still working without them: metrics read the BPF maps and
			// program statistics, and SIGTERM restores.
			resp, err := http.Get("http://" + addr + "/metrics")
			require.NoError(t, err)
			b := new(strings.Builder)
			_, _ = fmt.Fprint(b, readAll(resp))
			assert.Contains(t, b.String(), "readaheadd_probe_attached 1")
			resp, err = http.Get("http://" + addr + "/debug/status")
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			resp.Body.Close()
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("no exit within 30 s of SIGTERM")
			}
			assert.Equal(t, 0, cmd.ProcessState.ExitCode())
			assert.Contains(t, logs.String(), "capabilities dropped after attaching")
		})
	}
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			return sb.String()
		}
	}
}

func capFromName(n string) (int, error) {
	for c, name := range map[int]string{capDACOverride: "dac_override", capDACReadSearch: "dac_read_search", capSysPtrace: "sys_ptrace",
		capSysAdmin: "sys_admin", capPerfmon: "perfmon", capBPF: "bpf", capSetPCap: "setpcap"} {
		if name == n {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown capability %q", n)
}

// fileOpsCheck runs in a child process started with a reduced capability
// set: it takes the reader's descriptor on a file under a data directory
// private to another user exactly as a per-file action does (find it in
// /proc/PID/fd, check its path against the allow-path, pidfd_getfd,
// fadvise). spec is "PID:DATADIR:PATH". Exit 0 when all of it works.
func fileOpsCheck(spec string) int {
	parts := strings.SplitN(spec, ":", 3)
	pid, _ := strconv.Atoi(parts[0])
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/fd/7", pid), &st); err != nil {
		fmt.Println("stat fd:", err)
		return 1
	}
	key := probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}
	ops := tuner.NewProcFileOps()
	refs, err := ops.Find(uint32(pid), key)
	if err != nil || len(refs) == 0 {
		fmt.Println("find:", err, len(refs))
		return 1
	}
	scope, err := tuner.NewScope([]string{parts[1]})
	if err != nil {
		fmt.Println("scope:", err)
		return 1
	}
	if _, err := scope.Check(refs[0].Tgid, refs[0].FD, refs[0].Path, key); err != nil {
		fmt.Println("scope check:", err)
		return 1
	}
	h, err := ops.Dup(refs[0])
	if err != nil {
		fmt.Println("dup:", err)
		return 1
	}
	defer h.Close()
	if err := h.Fadvise(0, 0, tuner.AdviceNormal); err != nil {
		fmt.Println("fadvise:", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// fd7Reader starts a process (through the command prefix, if any) that
// holds file open on descriptor 7 until the test ends, and returns its pid.
func fd7Reader(t *testing.T, file string, prefix ...string) int {
	t.Helper()
	argv := append(prefix, "sh", "-c", `exec 7<"$0"; exec sleep 60`, file)
	reader := exec.Command(argv[0], argv[1:]...)
	require.NoError(t, reader.Start())
	t.Cleanup(func() { _ = reader.Process.Kill(); _ = reader.Wait() })
	require.Eventually(t, func() bool {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/7", reader.Process.Pid))
		return target == file
	}, 5*time.Second, 20*time.Millisecond)
	return reader.Process.Pid
}

// CAP_DAC_READ_SEARCH with CAP_SYS_PTRACE is enough to act on the open file
// of a reader of another uid under a 0700 data directory of that uid, and
// each of the two is needed (CAP_DAC_OVERRIDE is not).
func TestRuntimeCapabilitiesReachAnotherUsersPrivateDataDirectory(t *testing.T) {
	sp := requireRootAndSetpriv(t)
	// Not under t.TempDir(): its parent is private to root, and the
	// reader of uid 65534 must reach its own directory.
	base, err := os.MkdirTemp("", "readaheadd-caps-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	require.NoError(t, os.Chmod(base, 0o755))
	data := filepath.Join(base, "dn")
	require.NoError(t, os.MkdirAll(filepath.Join(data, "current"), 0o700))
	file := filepath.Join(data, "current", "blk_1")
	require.NoError(t, os.WriteFile(file, []byte("block"), 0o600))
	for _, p := range []string{data, filepath.Join(data, "current"), file} {
		require.NoError(t, os.Chown(p, 65534, 65534))
	}
	// The reader: uid 65534 with the file open on fd 7.
	reader := fd7Reader(t, file, sp, "--reuid", "65534", "--regid", "65534", "--clear-groups", "--")

	run := func(caps string) (bool, string) {
		cmd := exec.Command(sp, "--bounding-set", "-all"+caps, "--inh-caps", "-all", "--no-new-privs", "--", os.Args[0])
		cmd.Env = append(os.Environ(), fmt.Sprintf("READAHEADD_FILEOPS_CHECK=%d:%s:%s", reader, data, file))
		out, err := cmd.CombinedOutput()
		return err == nil, strings.TrimSpace(string(out))
	}
	ok, out := run(",+dac_read_search,+sys_ptrace")
	assert.True(t, ok, "with CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE: %s", out)
	ok, out = run(",+sys_ptrace")
	assert.False(t, ok, "without CAP_DAC_READ_SEARCH: %s", out)
	t.Logf("CAP_SYS_PTRACE alone: %s", out)
	ok, out = run(",+dac_read_search")
	assert.False(t, ok, "without CAP_SYS_PTRACE: %s", out)
	t.Logf("CAP_DAC_READ_SEARCH alone: %s", out)
}
