package reliability

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/daemontest"
)

// bin is the readaheadd binary built for this package's tests, in a
// directory every user can enter (the no-root tests run it as nobody).
var bin string

func TestMain(m *testing.M) {
	var cleanup func()
	var err error
	bin, cleanup, err = daemontest.Build("readaheadd-reliability-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "build readaheadd:", err)
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

func requireRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
}

// result is one finished run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

// runBin runs the binary (optionally behind a wrapper such as setpriv) and
// waits for it.
func runBin(t *testing.T, wrapper []string, args ...string) result {
	t.Helper()
	argv := append(append([]string(nil), wrapper...), bin)
	argv = append(argv, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return result{ee.ExitCode(), o.String(), e.String()}
	}
	require.NoError(t, err, "run %v", argv)
	return result{0, o.String(), e.String()}
}

// loopDev is a plain loop device (no file system) on a sparse file, for
// tests that need a real disk name but must not touch anyone else's.
type loopDev struct {
	Name string // loopN
	Path string // /dev/loopN
}

func newLoop(t *testing.T, mb int) loopDev {
	t.Helper()
	requireRoot(t, "loop devices")
	img := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(img)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(int64(mb)<<20))
	require.NoError(t, f.Close())
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	require.NoError(t, err, "losetup: %s", out)
	p := strings.TrimSpace(string(out))
	l := loopDev{Name: filepath.Base(p), Path: p}
	t.Cleanup(func() {
		if b, err := exec.Command("losetup", "-d", p).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", p, err, b)
		}
	})
	return l
}

func readKB(t *testing.T, dev string) int {
	t.Helper()
	b, err := os.ReadFile("/sys/block/" + dev + "/queue/read_ahead_kb")
	require.NoError(t, err)
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	return v
}

func setKB(t *testing.T, dev string, kb int) {
	t.Helper()
	require.NoError(t, os.WriteFile("/sys/block/"+dev+"/queue/read_ahead_kb", []byte(strconv.Itoa(kb)), 0))
}

// daemon is `readaheadd run` as a child process.
type daemon struct {
	cmd  *exec.Cmd
	Addr string
	Logs *daemontest.SyncBuffer
	done chan struct{}
}

// startDaemon starts `readaheadd run ARGS --metrics-addr ...` and waits
// until /healthz answers 200.
func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	d := startDaemonNoWait(t, args...)
	d.waitHealthy(t)
	return d
}

func startDaemonNoWait(t *testing.T, args ...string) *daemon {
	t.Helper()
	return startDaemonIn(t, nil, args...)
}

// startDaemonIn starts the daemon behind wrapper (a command that ends by
// exec'ing its arguments, so that the process is the daemon itself), without
// waiting for it to be healthy.
func startDaemonIn(t *testing.T, wrapper []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{Addr: daemontest.FreeAddr(t), Logs: &daemontest.SyncBuffer{}, done: make(chan struct{})}
	argv := append(append(append([]string(nil), wrapper...), bin, "run", "--metrics-addr", d.Addr), args...)
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=")
	d.cmd.Stdout, d.cmd.Stderr = d.Logs, d.Logs
	require.NoError(t, d.cmd.Start())
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.done:
			case <-time.After(30 * time.Second):
				_ = d.cmd.Process.Kill()
				<-d.done
			}
		}
		if t.Failed() {
			full := filepath.Join(os.TempDir(), "readaheadd-"+strings.ReplaceAll(t.Name(), "/", "_")+".log")
			_ = os.WriteFile(full, []byte(d.Logs.String()), 0o644)
			t.Logf("daemon log (tail; all of it in %s):\n%s", full, tail(d.Logs.String(), 60))
		}
	})
	return d
}

func (d *daemon) waitHealthy(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-d.done:
			t.Fatalf("daemon exited before it was healthy:\n%s", d.Logs.String())
		default:
		}
		if resp, err := http.Get("http://" + d.Addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("daemon not healthy within 60 s:\n%s", d.Logs.String())
}

func (d *daemon) Pid() int { return d.cmd.Process.Pid }

func (d *daemon) running() bool {
	select {
	case <-d.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and returns the exit code.
func (d *daemon) stop(t *testing.T) int {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not exit within 30 s of SIGTERM")
	}
	return d.cmd.ProcessState.ExitCode()
}

// kill sends SIGKILL and waits for the process to be gone.
func (d *daemon) kill(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not die within 10 s of SIGKILL")
	}
}

func (d *daemon) get(path string) (int, string, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + d.Addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func (d *daemon) metrics(t *testing.T) string {
	t.Helper()
	code, body, err := d.get("/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	return body
}

// sum adds every sample whose series matches re (a regexp on the whole
// series text, labels included).
func sum(exposition string, re string) float64 {
	rx := regexp.MustCompile(re)
	var s float64
	sc := bufio.NewScanner(strings.NewReader(exposition))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 || !rx.MatchString(l[:i]) {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err == nil {
			s += v
		}
	}
	return s
}

// rssKB is VmRSS of pid in KiB.
func rssKB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
