package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/readaheadd/readaheadd/pkg/metrics"
)

// BuildDaemon builds cmd/readaheadd into out (READAHEADD_BIN overrides).
func BuildDaemon(ctx context.Context, out string) (string, error) {
	if b := os.Getenv("READAHEADD_BIN"); b != "" {
		return b, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/readaheadd")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build readaheadd: %w\n%s", err, b)
	}
	return out, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/readaheadd/readaheadd\n") {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("run from inside the readaheadd module (go.mod not found above the working directory)")
		}
		dir = up
	}
}

// ActionRecord is one action readaheadd reported, as seen in /debug/status.
type ActionRecord struct {
	Time     time.Time `json:"time"`
	Action   string    `json:"action"`
	Target   string    `json:"target,omitempty"`
	FromKB   int       `json:"from_kb"`
	ToKB     int       `json:"to_kb"`
	Result   string    `json:"result"`
	Evidence string    `json:"evidence,omitempty"`
	// At is the time since the run's onset (negative: before onset).
	At time.Duration `json:"at_ns"`
}

// Daemon is a running `readaheadd run` subprocess.
type Daemon struct {
	cmd     *exec.Cmd
	addr    string
	LogPath string
	done    chan struct{}
	waitErr error

	mu      sync.Mutex
	actions []ActionRecord
	regimes map[string]bool
	stopPol chan struct{}
	polled  chan struct{}
	startT  time.Time
	quiet   atomic.Bool // no status polls: the daemon's CPU is being measured
}

// StartDaemon runs bin on device dev, allowed to act on files under
// mount, and waits until its /healthz answers ok. It polls /debug/status
// every pollEvery to record actions (the status keeps only its last 64;
// each action carries the daemon's own time, so the poll's period does not
// blur when it happened).
func StartDaemon(ctx context.Context, bin, dev, mount, work string) (*Daemon, error) {
	return StartDaemonState(ctx, bin, dev, mount, work, "")
}

// StartDaemonState is StartDaemon with a given state directory (one an
// earlier run left, say); "" makes a fresh one.
func StartDaemonState(ctx context.Context, bin, dev, mount, work, state string) (*Daemon, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if state == "" {
		if state, err = os.MkdirTemp(work, "state-"); err != nil {
			return nil, err
		}
	}
	logf, err := os.CreateTemp(work, "readaheadd-*.log")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--device", dev, "--allow-path", mount, "--state-dir", state,
		"--metrics-addr", addr, "--interval", "1s", "--log-format", "json", "--log-level", "debug")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a signal to the benchmark must not reach it
	// before the benchmark has stopped it cleanly (it restores on SIGTERM).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	logf.Close()
	d := &Daemon{cmd: cmd, addr: addr, LogPath: logf.Name(), done: make(chan struct{}), regimes: map[string]bool{}, stopPol: make(chan struct{}), polled: make(chan struct{}), startT: time.Now()}
	go func() { d.waitErr = cmd.Wait(); close(d.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := d.get("/healthz"); err == nil && strings.HasPrefix(b, "ok") {
			break
		}
		select {
		case <-d.done:
			return nil, fmt.Errorf("readaheadd exited during start (%v); log: %s", d.waitErr, tail(d.LogPath))
		case <-ctx.Done():
			d.Stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.Stop()
			return nil, fmt.Errorf("readaheadd not healthy within 30 s; log: %s", tail(d.LogPath))
		}
	}
	go d.poll()
	return d, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

func (d *Daemon) get(path string) (string, error) {
	resp, err := httpClient.Get("http://" + d.addr + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	if resp.StatusCode != http.StatusOK {
		return b.String(), fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return b.String(), sc.Err()
}

func (d *Daemon) poll() {
	defer close(d.polled)
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		if !d.quiet.Load() {
			d.pollOnce()
		}
		select {
		case <-d.stopPol:
			return
		case <-d.done:
			return
		case <-t.C:
		}
	}
}

func (d *Daemon) pollOnce() {
	b, err := d.get("/debug/status")
	if err != nil {
		return
	}
	var st metrics.Status
	if err := json.Unmarshal([]byte(b), &st); err != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range st.Regimes {
		d.regimes[r.Kind] = true
	}
	for _, a := range st.RecentActions {
		d.actions = append(d.actions, ActionRecord{Time: a.Time, Action: a.Action, Target: a.Target,
			FromKB: a.FromKB, ToKB: a.ToKB, Result: a.Result, Evidence: a.Evidence})
	}
	d.actions = DedupeActions(d.actions)
}

// DedupeActions drops repeated sightings of one action: /debug/status
// lists recent actions on every poll, with wall-clock times converted from
// the daemon's monotonic clock at each request (so they jitter by
// microseconds). Two entries are one action when everything but the time
// is equal and the times are within 50 ms.
func DedupeActions(acts []ActionRecord) []ActionRecord {
	var out []ActionRecord
	// Every kept sighting's time per key: two actions with the same key at
	// different times are seen in turn, poll after poll.
	kept := map[string][]time.Time{}
	for _, a := range acts {
		k := fmt.Sprintf("%s|%s|%d|%d|%s|%s", a.Action, a.Target, a.FromKB, a.ToKB, a.Result, a.Evidence)
		if slices.ContainsFunc(kept[k], func(t time.Time) bool {
			dt := a.Time.Sub(t)
			return dt < 50*time.Millisecond && dt > -50*time.Millisecond
		}) {
			continue
		}
		kept[k] = append(kept[k], a.Time)
		out = append(out, a)
	}
	return out
}

// pollEvery: a status poll costs the daemon a JSON status (about 1 ms of
// CPU); at 10 a second they took +0.5 ms on a random reader's p99 on the
// 2-core host (docs/reliability.md), which a benchmark must not charge to
// the daemon.
const pollEvery = time.Second

// Quiet stops the status polls until the returned func is called: each
// poll costs the daemon a JSON status (about 1 ms of CPU, pollEvery),
// which a measure of the daemon's own CPU share must not count. The daemon
// keeps its last RecentActions (64) actions; the resumed poll reads them.
func (d *Daemon) Quiet() (resume func()) {
	d.quiet.Store(true)
	return func() {
		d.quiet.Store(false)
		d.pollOnce()
	}
}

// Actions returns the actions seen so far, At relative to onset.
func (d *Daemon) Actions(onset time.Time) []ActionRecord {
	d.pollOnce()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := append([]ActionRecord(nil), d.actions...)
	for i := range out {
		out[i].At = out[i].Time.Sub(onset)
	}
	return out
}

// Regimes returns the regime kinds the daemon reported at some point.
// Every entry is in the daemon's log (one JSON line each), so none is
// missed between two status polls.
func (d *Daemon) Regimes() []string {
	seen := map[string]bool{}
	if b, err := os.ReadFile(d.LogPath); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			var rec struct {
				Msg    string `json:"msg"`
				Regime string `json:"regime"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "detector: regime entered" && rec.Regime != "" {
				seen[rec.Regime] = true
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := range d.regimes {
		seen[k] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// ActionsTotal sums readaheadd_actions_total over its labels.
func (d *Daemon) ActionsTotal() (float64, error) { return d.ActionsWith("") }

// ActionsWith is ActionsTotal over the series whose labels contain label
// (`result="trial"`, say); "" sums them all.
func (d *Daemon) ActionsWith(label string) (float64, error) {
	b, err := d.get("/metrics")
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, l := range strings.Split(b, "\n") {
		if !strings.HasPrefix(l, "readaheadd_actions_total{") || !strings.Contains(l, label) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("parse %q: %w", l, err)
		}
		sum += v
	}
	return sum, nil
}

// Usage is the daemon's own cost.
type Usage struct {
	CPUSeconds float64 `json:"cpu_seconds"` // utime + stime
	WallSec    float64 `json:"wall_seconds"`
	RSSMB      float64 `json:"rss_mb"` // VmRSS at the end
	HWMMB      float64 `json:"hwm_mb"` // peak RSS
}

// CPUPercent is the CPU share of one core over the daemon's life.
func (u Usage) CPUPercent() float64 {
	if u.WallSec <= 0 {
		return 0
	}
	return 100 * u.CPUSeconds / u.WallSec
}

// Usage reads /proc/PID/stat and /proc/PID/status.
func (d *Daemon) Usage() (Usage, error) {
	pid := d.cmd.Process.Pid
	u := Usage{WallSec: time.Since(d.startT).Seconds()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// Fields after the parenthesised comm: state is field 3, utime 14, stime 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return u, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	u.CPUSeconds = (ut + st) / 100 // USER_HZ is 100 on Linux
	b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			u.RSSMB = kb / 1024
		case "VmHWM:":
			u.HWMMB = kb / 1024
		}
	}
	return u, nil
}

// Stop sends SIGTERM (the daemon restores what it changed and exits 0),
// and kills its process group if it has not exited within 15 s. Safe to
// call twice.
func (d *Daemon) Stop() error {
	select {
	case <-d.done:
		return d.exitErr()
	default:
	}
	select {
	case <-d.stopPol:
	default:
		close(d.stopPol)
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return d.exitErr()
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
		return fmt.Errorf("readaheadd did not exit within 15 s of SIGTERM: killed; log %s", d.LogPath)
	}
}

func (d *Daemon) exitErr() error {
	if d.waitErr != nil {
		return fmt.Errorf("readaheadd exited: %w; log: %s", d.waitErr, tail(d.LogPath))
	}
	return nil
}
