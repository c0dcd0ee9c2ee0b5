package main

import (
	"bufio"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"io"
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

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/scope"
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

// readCaps reads the Cap* lines of a /proc status file.
func readCaps(t *testing.T, f io.Reader) map[string]uint64 {
	t.Helper()
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
	require.NoError(t, sc.Err())
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

// threadCaps reads the capability sets of every thread of process pid:
// capabilities are per thread, and /proc/PID/status shows only the first.
func threadCaps(t *testing.T, pid int) map[int]map[string]uint64 {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	require.NoError(t, err)
	out := map[int]map[string]uint64{}
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		require.NoError(t, err)
		f, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
		if os.IsNotExist(err) {
			continue // the thread exited
		}
		require.NoError(t, err)
		out[tid] = readCaps(t, f)
		f.Close()
	}
	require.NotEmpty(t, out)
	return out
}

// buildDaemon builds readaheadd with cgo or without, as a plain `go build`
// does on a machine with or without a C compiler, and checks which it got:
// a cgo binary calls the C library's pthread_create.
func buildDaemon(t *testing.T, cgo bool) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "readaheadd")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	flag := map[bool]string{true: "1", false: "0"}[cgo]
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+flag)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "build: %s", out)
	info, err := buildinfo.ReadFile(bin)
	require.NoError(t, err)
	var setting string
	for _, s := range info.Settings {
		if s.Key == "CGO_ENABLED" {
			setting = s.Value
		}
	}
	require.Equal(t, flag, setting, "CGO_ENABLED of the build")
	f, err := elf.Open(bin)
	require.NoError(t, err)
	defer f.Close()
	syms, _ := f.ImportedSymbols()
	var pthread bool
	for _, s := range syms {
		pthread = pthread || strings.HasPrefix(s.Name, "pthread_create")
	}
	require.Equal(t, cgo, pthread, "threads started by the C library in a cgo build only")
	return bin
}

// The running daemon, once its programs are attached, holds only
// runtimeCaps on every thread: read from /proc/PID/task/*/status, for a
// build with cgo and one without, started as the systemd unit starts it
// (bounding set from the unit) and as plain root.
func TestRunningDaemonKeepsOnlyRuntimeCapabilities(t *testing.T) {
	sp := requireRootAndSetpriv(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: no cgo build to check (apt-get install gcc libc6-dev)")
	}
	dev := loopDevice(t)
	want := capsMask(runtimeCaps)
	var unitMask uint64
	for _, c := range strings.Split(unitCapabilities(t), ",") {
		n, err := capFromName(strings.TrimPrefix(c, "+"))
		require.NoError(t, err)
		unitMask |= 1 << n
	}
	for _, cgo := range []bool{false, true} {
		t.Run(map[bool]string{false: "without cgo", true: "with cgo"}[cgo], func(t *testing.T) {
			bin := buildDaemon(t, cgo)
			for _, start := range []struct {
				name   string
				prefix []string
			}{
				{"as the unit starts it", []string{sp, "--bounding-set", "-all," + unitCapabilities(t), "--inh-caps", "-all", "--no-new-privs", "--"}},
				{"as root", nil},
			} {
				t.Run(start.name, func(t *testing.T) {
					checkDaemonCaps(t, bin, dev, start.prefix, want, unitMask)
				})
			}
		})
	}
}

// checkDaemonCaps starts bin on dev (argv prefixed by prefix), waits until
// it is healthy, checks every thread's capabilities and that the daemon
// still works without the ones dropped, and stops it with SIGTERM.
func checkDaemonCaps(t *testing.T, bin, dev string, prefix []string, want, unitMask uint64) {
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
		return daemontest.OK("http://" + addr + "/healthz")
	}, 30*time.Second, 100*time.Millisecond, "daemon not healthy:\n%s", logs)

	threads := threadCaps(t, cmd.Process.Pid)
	main := threads[cmd.Process.Pid]
	t.Logf("daemon after attach, %d threads: CapEff=%016x CapPrm=%016x CapInh=%016x CapAmb=%016x CapBnd=%016x (kept: %v)",
		len(threads), main["CapEff"], main["CapPrm"], main["CapInh"], main["CapAmb"], main["CapBnd"], capNames(main["CapEff"]))
	assert.Greater(t, len(threads), 1, "the Go runtime runs the daemon on several threads")
	for tid, caps := range threads {
		assert.Equal(t, want, caps["CapEff"], "thread %d effective: %v", tid, capNames(caps["CapEff"]))
		assert.Equal(t, want, caps["CapPrm"], "thread %d permitted: %v", tid, capNames(caps["CapPrm"]))
		assert.Zero(t, caps["CapInh"], "thread %d inheritable", tid)
		assert.Zero(t, caps["CapAmb"], "thread %d ambient", tid)
		if prefix == nil {
			assert.Equal(t, want, caps["CapBnd"], "thread %d: with CAP_SETPCAP the bounding set is narrowed too: %v", tid, capNames(caps["CapBnd"]))
		} else {
			assert.Equal(t, unitMask, caps["CapBnd"], "thread %d: the unit's bounding set (no CAP_SETPCAP to narrow it)", tid)
		}
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
	assert.NotContains(t, logs.String(), "capabilities not dropped")
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
	ops := actuate.NewProcFileOps()
	refs, err := ops.Find(uint32(pid), key)
	if err != nil || len(refs) == 0 {
		fmt.Println("find:", err, len(refs))
		return 1
	}
	sc, err := scope.New([]string{parts[1]})
	if err != nil {
		fmt.Println("scope:", err)
		return 1
	}
	if _, err := sc.Check(refs[0].Tgid, refs[0].FD, refs[0].Path, key); err != nil {
		fmt.Println("scope check:", err)
		return 1
	}
	h, err := ops.Dup(refs[0])
	if err != nil {
		fmt.Println("dup:", err)
		return 1
	}
	defer h.Close()
	if err := h.Fadvise(0, 0, actuate.AdviceNormal); err != nil {
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
