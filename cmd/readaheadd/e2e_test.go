package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/config"
	"github.com/readaheadd/readaheadd/test/daemontest"
	"github.com/readaheadd/readaheadd/test/lab"
)

// daemonProc is `readaheadd run` as a subprocess (the test binary re-run
// as main).
type daemonProc struct {
	cmd    *exec.Cmd
	addr   string
	logs   *daemontest.SyncBuffer
	done   chan error
	notify *net.UnixConn // the NOTIFY_SOCKET, as systemd listens on it
}

// nextNotify returns the next sd_notify datagram.
func (d *daemonProc) nextNotify(t *testing.T) string {
	t.Helper()
	buf := make([]byte, 4096)
	require.NoError(t, d.notify.SetReadDeadline(time.Now().Add(30*time.Second)))
	n, err := d.notify.Read(buf)
	require.NoError(t, err, "no sd_notify message")
	return string(buf[:n])
}

func startDaemon(t *testing.T, args ...string) *daemonProc {
	t.Helper()
	d := &daemonProc{addr: daemontest.FreeAddr(t), logs: &daemontest.SyncBuffer{}, done: make(chan error, 1)}
	argv := append([]string{os.Args[0], "run", "--metrics-addr", d.addr}, args...)
	// Run with exactly the capabilities the systemd unit grants, so that
	// this test proves the unit's set is enough.
	if caps := unitCapabilities(t); caps != "" {
		if sp, err := exec.LookPath("setpriv"); err == nil {
			argv = append([]string{sp, "--bounding-set", "-all," + caps, "--inh-caps", "-all", "--"}, argv...)
			t.Logf("daemon capabilities (from the systemd unit): %s", caps)
		}
	}
	d.cmd = exec.Command(argv[0], argv[1:]...)
	sock := filepath.Join(t.TempDir(), "notify")
	var err error
	d.notify, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { d.notify.Close() })
	d.cmd.Env = append(os.Environ(), "READAHEADD_AS_MAIN=1", "NOTIFY_SOCKET="+sock)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	require.NoError(t, d.cmd.Start())
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			_ = d.cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.logs.String())
		}
	})
	require.Eventually(t, func() bool {
		return daemontest.OK("http://" + d.addr + "/healthz")
	}, 30*time.Second, 100*time.Millisecond, "daemon did not become healthy:\n%s", d.logs)
	if !slices.Contains(args, "--nice") {
		// Every thread, those its runtime started after the daemon yielded
		// too, at the default niceness (or the test run's own, if higher).
		prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
		require.NoError(t, err)
		want := max(config.DefaultNice, 20-prio)
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", d.cmd.Process.Pid))
		require.NoError(t, err)
		for _, task := range tasks {
			tid, _ := strconv.Atoi(task.Name())
			if p, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil {
				assert.Equal(t, want, 20-p, "thread %d of %d", tid, len(tasks))
			}
		}
	}
	return d
}

// unitCapabilities returns the unit's CapabilityBoundingSet in setpriv's
// form ("+bpf,+perfmon,...").
func unitCapabilities(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/systemd/readaheadd.service")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^CapabilityBoundingSet=(.*)$`).FindSubmatch(b)
	require.NotNil(t, m)
	var caps []string
	for _, c := range strings.Fields(string(m[1])) {
		caps = append(caps, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	return strings.Join(caps, ",")
}

// stop sends SIGTERM and returns the exit code.
func (d *daemonProc) stop(t *testing.T) int {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not exit within 30 s of SIGTERM")
	}
	return d.cmd.ProcessState.ExitCode()
}

func (d *daemonProc) metrics(t *testing.T) string {
	resp, err := http.Get("http://" + d.addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// sample returns the value of the first series whose text starts with prefix.
func sample(exposition, prefix string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(exposition))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, prefix) {
			f := strings.Fields(l)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

var actionLine = regexp.MustCompile(`(?m)^readaheadd_actions_total\{action="([a-z_]+)",device="([^"]+)",result="([a-z_]+)"\} (\S+)$`)

// prometheusServer runs Debian's Prometheus on loopback, scraping target.
func prometheusServer(t *testing.T, target string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Log("prometheus not installed (Debian package prometheus): no scrape check")
		return ""
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: readaheadd\n    static_configs:\n      - targets: [%q]\n", target)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644))
	addr := daemontest.FreeAddr(t)
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	logs := &daemontest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	require.Eventually(t, func() bool {
		return daemontest.OK("http://" + addr + "/-/ready")
	}, 30*time.Second, 200*time.Millisecond, "prometheus not ready: %s", logs)
	return addr
}

// promQuery runs an instant PromQL query and returns the result's series count and first value.
func promQuery(t *testing.T, addr, q string) (int, float64) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(q))
	require.NoError(t, err)
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	require.Equal(t, "success", r.Status, "query %s: %s", q, r.Error)
	if len(r.Data.Result) == 0 {
		return 0, 0
	}
	v, _ := strconv.ParseFloat(fmt.Sprint(r.Data.Result[0].Value[1]), 64)
	return len(r.Data.Result), v
}

// meanMBps is the throughput over samples s[i:j] (s[i-1] marks the start).
func meanMBps(s []lab.SeqSample, i, j int) float64 {
	var start time.Duration
	if i > 0 {
		start = s[i-1].At
	}
	var b int64
	for _, x := range s[i:j] {
		b += x.Bytes
	}
	d := s[j-1].At - start
	if d <= 0 {
		return 0
	}
	return float64(b) / d.Seconds() / 1e6
}

// TestEndToEndPermanentSlowdown is the daemon's acceptance test on the lab
// (`make demo` tells the same story for people): a reader that opened its file before a permanent
// slowdown regains throughput through the running daemon, the metrics
// (also as scraped by a real Prometheus) show the regime and the action,
// and SIGTERM restores the device's read_ahead_kb.
//
// The detector's report of the shift depends on the host: where labfs wakes
// late, the lab's default window no longer fills the healthy device, the
// daemon rightly raises the healthy stream's window, the device's baseline is
// learned under that queue and the slowed file's first step (within a second)
// leaves the device at its capacity, where latency is explained by queueing
// and no shift is entered (on 2026-11-29, with 5% steal time, 3 of 5 runs,
// at this and the previous commit alike). So the regime is judged only where
// the healthy stream kept the default window; a run whose regime was not
// seen runs once more on a fresh lab (lab.RunTwice); every other check holds
// in each run.
func TestEndToEndPermanentSlowdown(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end lab test: skipped in -short mode")
	}
	lab.RunTwice(t, "the slowdown's regime in the metrics", endToEndPermanentRun)
}

// endToEndPermanentRun is one run of TestEndToEndPermanentSlowdown: what
// of the regime's report it missed.
func endToEndPermanentRun(t *testing.T) (missed []string) {
	l := lab.New(t, lab.Options{SizeBytes: 2 << 30})
	origKB, err := l.ReadAheadKB()
	require.NoError(t, err)

	// The healthy reads are of a file in a directory of its own: at the
	// lab's default window a healthy stream is bound by its window, so the
	// daemon may well raise it, and the window that paid there would be
	// given at once to a fresh open in the same directory (a prior) and
	// hide the slowdown this test watches the detector report. Priors
	// have tests of their own (test/integration/tuner).
	require.NoError(t, os.Mkdir(filepath.Join(l.Mount, "baseline"), 0o755))
	warm, err := l.WriteFile("baseline/warm", 200)
	require.NoError(t, err)
	target, err := l.WriteFile("target", 700)
	require.NoError(t, err)
	for _, p := range []string{warm, target} {
		require.NoError(t, lab.DropFileCache(p))
	}

	stateDir := filepath.Join(t.TempDir(), "state")
	d := startDaemon(t, "--device", l.Name, "--allow-path", l.Mount, "--state-dir", stateDir, "--interval", "1s", "--log-level", "debug")
	assert.Contains(t, d.nextNotify(t), "READY=1", "Type=notify: ready once attached")
	prom := prometheusServer(t, d.addr)

	// Healthy reads teach the detector the device's baseline, per request
	// size, from BaselineMinWindows (3) one-second windows each. The
	// tuner may try a larger window on the healthy stream for a second or
	// two (other request sizes), so the reads go on for 7 s: 3 reads (4 s)
	// once left the default window's size learned from 2 windows only,
	// and the slowed file's shift could not be told from its latency.
	for start, i := time.Now(), 0; i < 3 || time.Since(start) < 7*time.Second; i++ {
		r, err := lab.ReadSeq(warm)
		require.NoError(t, err)
		t.Logf("healthy read of %s: %.0f MB/s", filepath.Base(warm), r.MBps())
		require.NoError(t, lab.DropFileCache(warm))
	}
	// The shift's report needs a healthy device the default window fills:
	// a window kept on the healthy stream says this host's lab does not
	// (see above), and then the regime is logged, not judged.
	healthyKept := 0.0
	for _, a := range actionLine.FindAllStringSubmatch(d.metrics(t), -1) {
		if a[1] == "file_window" && a[3] == "kept" {
			healthyKept, _ = strconv.ParseFloat(a[4], 64)
		}
	}

	// The reader opens its file before the slowdown, as a DataNode does.
	rd, err := lab.OpenSeq(target)
	require.NoError(t, err)
	defer rd.Close()
	require.NoError(t, l.SetPermanent(8*time.Millisecond, target))
	t.Logf("permanent slowdown: +8 ms on every read of %s", filepath.Base(target))

	// Watch the metrics while the reader runs.
	var (
		mu          sync.Mutex
		regimeSeen  bool
		actions     = map[string]float64{}
		maxFilesAdj float64
		maxRA       float64
	)
	ctx, cancel := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for ctx.Err() == nil {
			m := d.metrics(t)
			mu.Lock()
			if v, ok := sample(m, `readaheadd_regime_active{device="`+l.Name+`",regime="file_latency_shift"}`); ok && v == 1 {
				regimeSeen = true
			}
			for _, a := range actionLine.FindAllStringSubmatch(m, -1) {
				v, _ := strconv.ParseFloat(a[4], 64)
				actions[a[1]+"/"+a[3]] = v
			}
			if v, ok := sample(m, `readaheadd_files_adjusted{device="`+l.Name+`"}`); ok && v > maxFilesAdj {
				maxFilesAdj = v
			}
			if v, ok := sample(m, `readaheadd_read_ahead_kb{device="`+l.Name+`"}`); ok && v > maxRA {
				maxRA = v
			}
			mu.Unlock()
			time.Sleep(250 * time.Millisecond)
		}
	}()
	rctx, rcancel := context.WithTimeout(context.Background(), 14*time.Second)
	res, err := rd.Read(rctx, 500*time.Millisecond)
	rcancel()
	require.NoError(t, err)

	var status bytes.Buffer
	if st, err := fetchStatus(context.Background(), d.addr); err == nil {
		printStatus(&status, st)
	}
	cancel()
	<-watchDone

	require.GreaterOrEqual(t, len(res.Samples), 6, "the reader ran long enough")
	// The first half second is before any action; the last 1.5 s after.
	n := len(res.Samples)
	before := meanMBps(res.Samples, 0, 1)
	after := meanMBps(res.Samples, n-3, n)
	t.Logf("reader of the slowed file: %.0f MB/s in its first half second, %.0f MB/s in its last 1.5 s (%.2fx)", before, after, after/before)
	for _, s := range res.Samples {
		t.Logf("  t=%5.1fs %6.1f MB/s", s.At.Seconds(), s.MBps)
	}
	mu.Lock()
	t.Logf("metrics seen: file_latency_shift active=%v, actions=%v, max files_adjusted=%g, max read_ahead_kb=%g", regimeSeen, actions, maxFilesAdj, maxRA)
	mu.Unlock()
	t.Logf("readaheadd status during the run:\n%s", status.String())

	switch {
	case !regimeSeen && healthyKept > 0:
		t.Logf("not judged: readaheadd_regime_active never showed the slowdown, on a lab whose healthy stream was given a window (%g kept)", healthyKept)
	case !regimeSeen:
		missed = append(missed, "readaheadd_regime_active never showed the permanent slowdown")
	}
	var acted float64
	for k, v := range actions {
		if strings.HasPrefix(k, "file_window/") || strings.HasPrefix(k, "device_window/") || strings.HasPrefix(k, "prefetch/") {
			if !strings.HasSuffix(k, "/failed") {
				acted += v
			}
		}
	}
	assert.Positive(t, acted, "readaheadd_actions_total shows an action")
	assert.True(t, maxFilesAdj > 0 || maxRA > float64(origKB), "the window set shows (files_adjusted or read_ahead_kb)")
	assert.Greater(t, after, 1.3*before, "the reader's throughput recovers")

	if prom != "" {
		n, _ := promQuery(t, prom, `readaheadd_read_latency_seconds_bucket{device="`+l.Name+`"}`)
		assert.Positive(t, n, "Prometheus scraped the latency histogram")
		n, v := promQuery(t, prom, `max_over_time(readaheadd_regime_active{device="`+l.Name+`",regime="file_latency_shift"}[5m])`)
		assert.Equal(t, 1, n)
		if (regimeSeen || healthyKept == 0) && v != 1 {
			missed = append(missed, fmt.Sprintf("Prometheus did not see the regime active (max %g)", v))
		}
		_, p99 := promQuery(t, prom, `histogram_quantile(0.99, sum by (le) (rate(readaheadd_read_latency_seconds_bucket{device="`+l.Name+`"}[30s])))`)
		t.Logf("p99 read latency of %s per Prometheus: %.1f ms", l.Name, p99*1000)
	}

	require.NoError(t, l.Clear())
	assert.Equal(t, 0, d.stop(t), "SIGTERM exits 0")
	assert.Equal(t, "STOPPING=1", d.nextNotify(t))
	assert.Contains(t, d.logs.String(), "restored; exiting")
	kb, err := l.ReadAheadKB()
	require.NoError(t, err)
	assert.Equal(t, origKB, kb, "SIGTERM restores the original read_ahead_kb")
	_, err = os.Stat(filepath.Join(stateDir, "originals.json"))
	assert.True(t, os.IsNotExist(err), "nothing left to restore")
	return missed
}
