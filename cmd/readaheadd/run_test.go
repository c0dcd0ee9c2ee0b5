package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/config"
	"github.com/readaheadd/readaheadd/pkg/metrics"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
	"github.com/readaheadd/readaheadd/test/daemontest"
)

// The test binary doubles as the readaheadd binary, so that exit codes and
// stderr are checked as an operator sees them.
func TestMain(m *testing.M) {
	if os.Getenv("READAHEADD_AS_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	if spec := os.Getenv("READAHEADD_FILEOPS_CHECK"); spec != "" {
		os.Exit(fileOpsCheck(spec))
	}
	if spec := os.Getenv("READAHEADD_ATTACH_CHECK"); spec != "" {
		os.Exit(attachCheck(spec))
	}
	os.Exit(m.Run())
}

func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "READAHEADD_AS_MAIN=1", "NOTIFY_SOCKET=")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), o.String(), e.String()
	}
	require.NoError(t, err)
	return 0, o.String(), e.String()
}

func TestRunBadInputExitsTwoAndChangesNothing(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		return p
	}
	unknownKey := write("unknown.yaml", "devices: [vda]\n")
	malformed := write("malformed.yaml", "device: [vda\n")
	badValue := write("badvalue.yaml", "max-read-ahead-kb: -5\n")
	wrongType := write("wrongtype.yaml", "interval: 5\n")

	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"unknown flag":        {[]string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
		"extra argument":      {[]string{"sda"}, `unexpected argument "sda"`},
		"missing config file": {[]string{"--config", filepath.Join(dir, "none.yaml")}, "config file"},
		"unknown YAML key":    {[]string{"--config", unknownKey}, `unknown field "devices"`},
		"malformed YAML":      {[]string{"--config", malformed}, "malformed.yaml"},
		"bad YAML value":      {[]string{"--config", badValue}, "max-read-ahead-kb -5 is out of range"},
		"wrong YAML type":     {[]string{"--config", wrongType}, "duration must be a string"},
		"negative size":       {[]string{"--max-read-ahead-kb", "-1"}, "max-read-ahead-kb -1 is out of range"},
		"absurd size":         {[]string{"--max-read-ahead-kb", "99999999"}, "out of range"},
		"bad size syntax":     {[]string{"--max-read-ahead-kb", "4MB"}, "invalid argument"},
		"bad interval":        {[]string{"--interval", "1ms"}, "interval 1ms is out of range"},
		"bad log format":      {[]string{"--log-format", "xml"}, `log-format "xml"`},
		"bad log level":       {[]string{"--log-level", "chatty"}, `log-level "chatty"`},
		"nonexistent device":  {[]string{"--device", "nosuchdisk0"}, `block device "nosuchdisk0": no such block device`},
		"device with slash":   {[]string{"--device", "../../etc"}, "invalid block device name"},
		"device dotdot":       {[]string{"--device", ".."}, "invalid block device name"},
		"relative allow-path": {[]string{"--allow-path", "data/dn"}, `allow-path "data/dn" is not an absolute path`},
		"missing allow-path":  {[]string{"--allow-path", "/nonexistent/readaheadd/dn"}, "allow-path /nonexistent/readaheadd/dn does not exist"},
		"file as allow-path":  {[]string{"--allow-path", unknownKey}, "is not a directory"},
		"root as allow-path":  {[]string{"--allow-path", "/"}, "allow-path / is the whole root filesystem"},
		"bad metrics address": {[]string{"--metrics-addr", "127.0.0.1"}, "is not HOST:PORT"},
		"bad metrics port":    {[]string{"--metrics-addr", "127.0.0.1:99999"}, `port "99999"`},
		"relative state dir":  {[]string{"--state-dir", "state"}, "state-dir \"state\" is not an absolute path"},
	} {
		t.Run(name, func(t *testing.T) {
			stateDir := filepath.Join(t.TempDir(), "state")
			args := append([]string{"run", "--state-dir", stateDir}, tc.args...)
			if name == "relative state dir" {
				args = append([]string{"run"}, tc.args...)
			}
			code, stdout, stderr := runMain(t, args...)
			assert.Equal(t, exitUsage, code, "stderr: %s", stderr)
			assert.Contains(t, stderr, tc.want)
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
			assert.True(t, strings.HasPrefix(stderr, "readaheadd: "), stderr)
			assert.Empty(t, stdout)
			_, err := os.Stat(stateDir)
			assert.True(t, os.IsNotExist(err), "state dir must not be created")
		})
	}
}

func TestRestoreCommand(t *testing.T) {
	code, out, _ := runMain(t, "restore", "--state-dir", filepath.Join(t.TempDir(), "none"))
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "nothing to restore")

	code, _, stderr := runMain(t, "restore", "--state-dir", "relative")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "not an absolute path")

	// A recorded original is written back (in a fake sysfs, in-process).
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	dir := t.TempDir()
	st, err := state.Open(dir, state.Options{})
	require.NoError(t, err)
	require.NoError(t, st.Record("sdx", "8:0", 256))
	require.NoError(t, st.Close())
	cmd := newRestoreCmd(sys)
	var buf bytes.Buffer
	cmd.SetOut(&buf)
	cmd.SetArgs([]string{"--state-dir", dir})
	require.NoError(t, cmd.Execute())
	assert.Contains(t, buf.String(), "sdx: read_ahead_kb restored to 256")
	kb, err := sys.ReadAheadKB("sdx")
	require.NoError(t, err)
	assert.Equal(t, 256, kb)
}

func fakeSysfs(t *testing.T, disks map[string]int) blockdev.SysFS {
	t.Helper()
	root := t.TempDir()
	minor := 0
	for name, kb := range disks {
		q := filepath.Join(root, "block", name, "queue")
		require.NoError(t, os.MkdirAll(q, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "block", name, "dev"), []byte("8:"+itoa(minor)+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(q, "read_ahead_kb"), []byte(itoa(kb)+"\n"), 0o644))
		minor += 16
	}
	return blockdev.SysFS{Root: root}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// notes records sd_notify messages.
type notes struct {
	mu  sync.Mutex
	msg []string
}

func (n *notes) notify(s string) (bool, error) {
	n.mu.Lock()
	n.msg = append(n.msg, s)
	n.mu.Unlock()
	return true, nil
}

func (n *notes) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msg...)
}

func TestRunServesAndRestoresOnStop(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	stateDir := filepath.Join(t.TempDir(), "state")

	// A previous run was killed after raising sdx to 1024: its original
	// (128) is recorded; the device still shows 1024.
	st, err := state.Open(stateDir, state.Options{BootID: "boot"})
	require.NoError(t, err)
	require.NoError(t, st.Record("sdx", "8:0", 128))
	require.NoError(t, st.Close())
	require.NoError(t, sys.SetReadAheadKB("sdx", 1024))

	rec := probe.Record{Device: probe.MkDev(8, 0), Bytes: 131072, Latency: 3 * time.Millisecond, Kind: probe.KindFile, File: probe.FileKey{Dev: probe.MkDev(8, 1), Ino: 12}}
	replay := probe.NewReplay(rec, rec, rec)
	replay.Hold = true

	var n notes
	addrc := make(chan net.Addr, 1)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	logs := &daemontest.SyncBuffer{}
	env := runEnv{
		sys:        sys,
		clk:        clock.Monotonic{},
		openProbe:  func(probe.Config) (probe.Source, error) { return replay, nil },
		signals:    func(c context.Context) (context.Context, context.CancelFunc) { return context.WithCancel(c) },
		notify:     n.notify,
		onListen:   func(a net.Addr) { addrc <- a },
		stderr:     logs,
		bootID:     "boot",
		newControl: newController,
	}
	c := config.Default()
	c.Devices = []string{"sdx"}
	c.StateDir = stateDir
	c.MetricsAddr = "127.0.0.1:0"
	c.Interval = config.Duration(100 * time.Millisecond)
	v, err := config.Validate(c, sys)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- runDaemon(ctx, v, env) }()
	var base string
	select {
	case a := <-addrc:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("run stopped early: %v\n%s", err, logs.String())
	}

	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool { code, _ := get("/healthz"); return code == http.StatusOK }, 10*time.Second, 50*time.Millisecond)
	assert.Contains(t, n.all()[0], "READY=1")

	kb, err := sys.ReadAheadKB("sdx")
	require.NoError(t, err)
	assert.Equal(t, 128, kb, "the original left by the killed run is restored at start")

	_, body := get("/metrics")
	assert.Contains(t, body, `readaheadd_read_requests_total{device="sdx"} 3`)
	assert.Contains(t, body, `readaheadd_read_bytes_total{device="sdx"} 393216`)
	assert.Contains(t, body, `readaheadd_read_latency_seconds_bucket{device="sdx",le="0.004096"} 3`)
	assert.Contains(t, body, `readaheadd_read_ahead_kb{device="sdx"} 128`)
	assert.Contains(t, body, `readaheadd_probe_attached 1`)

	_, body = get("/debug/status")
	var s metrics.Status
	require.NoError(t, json.Unmarshal([]byte(body), &s))
	assert.True(t, s.Healthy)
	require.Len(t, s.Devices, 1)
	assert.Equal(t, "sdx", s.Devices[0].Name)
	var out bytes.Buffer
	printStatus(&out, s)
	assert.Contains(t, out.String(), "sdx")
	assert.Contains(t, out.String(), "healthy")

	stop() // as SIGTERM does
	select {
	case err := <-done:
		require.NoError(t, err, logs.String())
	case <-time.After(15 * time.Second):
		t.Fatal("run did not stop")
	}
	msgs := n.all()
	assert.Equal(t, "STOPPING=1", msgs[len(msgs)-1])
	assert.Contains(t, logs.String(), "restored; exiting")
	_, err = os.Stat(filepath.Join(stateDir, state.FileName))
	assert.True(t, os.IsNotExist(err), "no record left after a clean stop")
}

func TestRunMetricsAddressTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	c := config.Default()
	c.Devices = []string{"sdx"}
	c.StateDir = filepath.Join(t.TempDir(), "state")
	c.MetricsAddr = ln.Addr().String()
	v, err := config.Validate(c, sys)
	require.NoError(t, err)
	env := defaultRunEnv()
	env.dropCaps = nil // never the test process's own
	env.yieldCPU = nil // nor its niceness
	env.sys = sys
	env.stderr = io.Discard
	env.openProbe = func(probe.Config) (probe.Source, error) {
		t.Fatal("probe loaded before the address was bound")
		return nil, nil
	}
	err = runDaemon(context.Background(), v, env)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--metrics-addr")
	_, statErr := os.Stat(c.StateDir)
	assert.True(t, os.IsNotExist(statErr), "nothing written when the address is taken")
}

func TestHealthStates(t *testing.T) {
	clk := clock.NewFake(100 * time.Second)
	d := &daemonState{clk: clk, interval: time.Second}
	assert.EqualError(t, d.health(), "probe not attached")
	d.attached.Store(true)
	assert.EqualError(t, d.health(), "detector has not evaluated yet")
	d.stepped(clk.Now())
	assert.NoError(t, d.health())
	clk.Advance(5 * time.Second)
	assert.ErrorContains(t, d.health(), "detector stale: last evaluation 5s ago")
}

func TestStatusCommandUnreachable(t *testing.T) {
	addr := daemontest.FreeAddr(t)
	code, _, stderr := runMain(t, "status", "--metrics-addr", addr, "--timeout", "2s")
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, stderr, "daemon not reachable")
}

func TestRunWithoutCapabilitiesNamesThem(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	c := config.Default()
	c.Devices = []string{"sdx"}
	c.StateDir = filepath.Join(t.TempDir(), "state")
	c.MetricsAddr = ""
	v, err := config.Validate(c, sys)
	require.NoError(t, err)
	env := defaultRunEnv()
	env.dropCaps = nil // never the test process's own
	env.yieldCPU = nil // nor its niceness
	env.sys = sys
	env.stderr = io.Discard
	env.openProbe = func(probe.Config) (probe.Source, error) {
		t.Fatal("probe loaded without the capabilities")
		return nil, nil
	}
	for caps, want := range map[uint64]string{
		0:                                   "missing CAP_BPF and CAP_PERFMON",
		1 << capBPF:                         "missing CAP_PERFMON",
		1 << capPerfmon:                     "missing CAP_BPF:",
		1 << capSysPtrace:                   "missing CAP_BPF and CAP_PERFMON",
		1<<capDACOverride | 1<<capSysPtrace: "missing CAP_BPF and CAP_PERFMON",
	} {
		env.capStatus = statusFile(t, caps)
		err := runDaemon(context.Background(), v, env)
		require.Error(t, err)
		assert.Contains(t, err.Error(), want)
		_, statErr := os.Stat(c.StateDir)
		assert.True(t, os.IsNotExist(statErr), "nothing written without the capabilities")
	}
	assert.NoError(t, requireTracingCaps(statusFile(t, 1<<capSysAdmin)))
	assert.NoError(t, requireTracingCaps(statusFile(t, 1<<capBPF|1<<capPerfmon)))
}

func TestRunCorruptStateFileChangesNothing(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 512})
	stateDir := filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.MkdirAll(stateDir, 0o700))
	corrupt := []byte(`{"version":1,"devices":[{"device":"sdx","read_ahe`)
	require.NoError(t, os.WriteFile(filepath.Join(stateDir, state.FileName), corrupt, 0o600))

	c := config.Default()
	c.Devices = []string{"sdx"}
	c.StateDir = stateDir
	c.MetricsAddr = ""
	v, err := config.Validate(c, sys)
	require.NoError(t, err)
	env := defaultRunEnv()
	env.dropCaps = nil // never the test process's own
	env.yieldCPU = nil // nor its niceness
	env.sys = sys
	env.stderr = io.Discard
	env.capStatus = ""
	env.openProbe = func(probe.Config) (probe.Source, error) { return probe.NewReplay(), nil }
	env.newControl = func(controlDeps) (controller, error) {
		t.Fatal("controller built on a corrupt state file")
		return nil, nil
	}
	err = runDaemon(context.Background(), v, env)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unusable")
	kb, err := sys.ReadAheadKB("sdx")
	require.NoError(t, err)
	assert.Equal(t, 512, kb, "nothing written to sysfs")
	b, err := os.ReadFile(filepath.Join(stateDir, state.FileName))
	require.NoError(t, err)
	assert.Equal(t, corrupt, b, "the state file is left for the operator")
}

// failingSource is a probe whose event stream breaks.
type failingSource struct{ *probe.Replay }

func (f failingSource) Run(ctx context.Context, h probe.Handler) error {
	time.Sleep(200 * time.Millisecond)
	return errors.New("read BPF ring buffer: boom")
}

func TestRunProbeFailureStopsAndRestores(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	c := config.Default()
	c.Devices = []string{"sdx"}
	c.StateDir = filepath.Join(t.TempDir(), "state")
	c.MetricsAddr = ""
	v, err := config.Validate(c, sys)
	require.NoError(t, err)
	var n notes
	logs := &daemontest.SyncBuffer{}
	env := defaultRunEnv()
	env.dropCaps = nil // never the test process's own
	env.yieldCPU = nil // nor its niceness
	env.sys = sys
	env.stderr = logs
	env.capStatus = ""
	env.bootID = "b"
	env.notify = n.notify
	env.openProbe = func(probe.Config) (probe.Source, error) { return failingSource{probe.NewReplay()}, nil }
	err = runDaemon(context.Background(), v, env)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "probe stopped: read BPF ring buffer: boom")
	msgs := n.all()
	require.Len(t, msgs, 2)
	assert.Contains(t, msgs[0], "READY=1")
	assert.Equal(t, "STOPPING=1", msgs[1])
	assert.Contains(t, logs.String(), "restored; exiting")
}

// A forged originals.json names a disk the configuration does not tune
// (vda here): restore refuses it on one line and writes nothing there,
// while the configured disk whose identity matches gets its original back.
func TestRestoreCommandRefusesForgedOriginals(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 128, "vda": 128})
	dir := t.TempDir()
	sdx, err := sys.Lookup("sdx")
	require.NoError(t, err)
	vda, err := sys.Lookup("vda")
	require.NoError(t, err)
	// True device numbers; no diskseq (this fake kernel has none).
	forged := `{"version":1,"devices":[
	 {"device":"sdx","dev":"` + sdx.Dev.String() + `","read_ahead_kb":256,"recorded_at":"2026-01-01T00:00:00Z"},
	 {"device":"vda","dev":"` + vda.Dev.String() + `","read_ahead_kb":1048576,"recorded_at":"2026-01-01T00:00:00Z"}]}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, state.FileName), []byte(forged), 0o600))
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("device: [sdx]\n"), 0o644))
	cmd := newRestoreCmd(sys)
	var buf bytes.Buffer
	cmd.SetOut(&buf)
	cmd.SetArgs([]string{"--state-dir", dir, "--config", cfg})
	require.NoError(t, cmd.Execute(), buf.String())
	assert.Contains(t, buf.String(), "sdx: read_ahead_kb restored to 256")
	assert.Contains(t, buf.String(), "vda: refused, nothing written (not a device this configuration tunes")
	for name, want := range map[string]int{"sdx": 256, "vda": 128} {
		kb, err := sys.ReadAheadKB(name)
		require.NoError(t, err)
		assert.Equal(t, want, kb, name)
	}

	// With --device naming it, the same record is written back.
	cmd = newRestoreCmd(sys)
	buf.Reset()
	cmd.SetOut(&buf)
	cmd.SetArgs([]string{"--state-dir", dir, "--device", "vda"})
	require.NoError(t, cmd.Execute(), buf.String())
	kb, _ := sys.ReadAheadKB("vda")
	assert.Equal(t, 1048576, kb)
}
