package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

var (
	sda = probe.MkDev(8, 0)
	sdb = probe.MkDev(8, 16)
)

func fakeSources() Sources {
	return Sources{
		Probe: func() ProbeStats {
			return ProbeStats{
				Attached: true,
				Devices: []DeviceIO{{
					Device: "sda",
					// 3 reads in [0,2) us, 1 in [2,4) us, 4 in [4,8) us, none above.
					LatencyLog2US: []uint64{3, 1, 4, 0},
					LatencySum:    30 * time.Microsecond,
					Bytes:         8 * 4096,
					Requests:      8,
				}},
				EventsLost:     7,
				ProgramRunTime: map[string]time.Duration{"block_rq_complete": 1500 * time.Millisecond, "block_rq_issue": 250 * time.Millisecond},
				ProgramMisses:  map[string]uint64{"block_rq_complete": 3},
			}
		},
		Tuner: func() TunerStatus {
			return TunerStatus{
				Devices: []DeviceState{{Name: "sda", Dev: "8:0", ReadAheadKB: 1024, OriginalKB: 128, FilesAdjusted: 2}},
				Actions: []ActionCount{
					{Device: "sda", Action: "file_window", Result: "kept", Count: 3},
					{Device: "sda", Action: "file_window", Result: "kept", Count: 1},
					{Device: "sda", Action: "device_window", Result: "failed", Count: 1},
				},
				Recent: []Action{{Device: "sda", Action: "file_window", FromKB: 128, ToKB: 1024, Result: "kept", Effect: "+80% busy throughput"}},
			}
		},
		Detector: func() (detector.Snapshot, bool) {
			return detector.Snapshot{
				Now:     10 * time.Second,
				Devices: []detector.DeviceStats{{Device: sda, Requests: 8, Bytes: 8 * 4096, P50: 2 * time.Millisecond, P99: 5 * time.Millisecond}},
				Files: []detector.FileStats{
					{Key: probe.FileKey{Dev: sda, Ino: 12}, Device: sda, Bytes: 100},
					{Key: probe.FileKey{Dev: sda, Ino: 13}, Device: sda, Bytes: 300, P99: time.Millisecond},
					{Key: probe.FileKey{Dev: sdb, Ino: 14}, Device: sdb, Bytes: 200},
				},
				Regimes: []detector.Regime{
					{Kind: detector.FileLatencyShift, Device: sda, File: probe.FileKey{Dev: sda, Ino: 13}, Since: 4 * time.Second, Confidence: 0.9, Evidence: "p50 3.1 ms vs baseline 0.2 ms"},
				},
			}, true
		},
		DeviceName: func(d probe.Dev) string {
			if d == sda {
				return "sda"
			}
			return ""
		},
	}
}

func TestLog2USHistogram(t *testing.T) {
	count, sum, b := Log2USHistogram([]uint64{3, 1, 4, 2}, 0.5)
	assert.Equal(t, uint64(10), count, "the overflow bucket counts in +Inf")
	assert.Equal(t, 0.5, sum)
	assert.Equal(t, map[float64]uint64{2e-6: 3, 4e-6: 4, 8e-6: 8}, b)

	// The probe's real layout: bounds agree with probe.HistUpperBound.
	var h [probe.HistBuckets]uint64
	for i := range h {
		h[i] = 1
	}
	count, _, b = Log2USHistogram(h[:], 0)
	assert.Equal(t, uint64(probe.HistBuckets), count)
	require.Len(t, b, probe.HistBuckets-1)
	for i := 0; i < probe.HistBuckets-1; i++ {
		le := probe.HistUpperBound(i).Seconds()
		assert.Equal(t, uint64(i+1), b[le], "le=%g", le)
	}
}

func TestCollectorExposition(t *testing.T) {
	want := `
# HELP readaheadd_bpf_events_lost_total Probe events dropped because the ring buffer was full.
# TYPE readaheadd_bpf_events_lost_total counter
readaheadd_bpf_events_lost_total 7
# HELP readaheadd_bpf_missed_runs_total Runs of each BPF program the kernel skipped because it was already running on that CPU: requests the probe did not count.
# TYPE readaheadd_bpf_missed_runs_total counter
readaheadd_bpf_missed_runs_total{program="block_rq_complete"} 3
readaheadd_bpf_missed_runs_total{program="block_rq_issue"} 0
# HELP readaheadd_bpf_run_seconds_total Kernel CPU time spent in each BPF program (needs kernel.bpf_stats_enabled=1).
# TYPE readaheadd_bpf_run_seconds_total counter
readaheadd_bpf_run_seconds_total{program="block_rq_complete"} 1.5
readaheadd_bpf_run_seconds_total{program="block_rq_issue"} 0.25
# HELP readaheadd_files_adjusted Open files whose readahead window readaheadd currently holds changed.
# TYPE readaheadd_files_adjusted gauge
readaheadd_files_adjusted{device="sda"} 2
# HELP readaheadd_read_ahead_kb Current /sys/block/DEVICE/queue/read_ahead_kb.
# TYPE readaheadd_read_ahead_kb gauge
readaheadd_read_ahead_kb{device="sda"} 1024
# HELP readaheadd_read_ahead_original_kb read_ahead_kb found before readaheadd changed anything; restored on exit.
# TYPE readaheadd_read_ahead_original_kb gauge
readaheadd_read_ahead_original_kb{device="sda"} 128
# HELP readaheadd_read_bytes_total Bytes read from the device by completed block read requests.
# TYPE readaheadd_read_bytes_total counter
readaheadd_read_bytes_total{device="sda"} 32768
# HELP readaheadd_read_latency_seconds Block read request latency, issue to completion, from the in-kernel log2 histogram.
# TYPE readaheadd_read_latency_seconds histogram
readaheadd_read_latency_seconds_bucket{device="sda",le="2e-06"} 3
readaheadd_read_latency_seconds_bucket{device="sda",le="4e-06"} 4
readaheadd_read_latency_seconds_bucket{device="sda",le="8e-06"} 8
readaheadd_read_latency_seconds_bucket{device="sda",le="+Inf"} 8
readaheadd_read_latency_seconds_sum{device="sda"} 3e-05
readaheadd_read_latency_seconds_count{device="sda"} 8
# HELP readaheadd_read_requests_total Completed block read requests.
# TYPE readaheadd_read_requests_total counter
readaheadd_read_requests_total{device="sda"} 8
# HELP readaheadd_regime_active 1 while the detector sees this slowdown regime on the device (on the device or on any of its files), else 0.
# TYPE readaheadd_regime_active gauge
readaheadd_regime_active{device="sda",regime="contention"} 0
readaheadd_regime_active{device="sda",regime="extent_start"} 0
readaheadd_regime_active{device="sda",regime="file_latency_shift"} 1
readaheadd_regime_active{device="sda",regime="starved_stream"} 0
readaheadd_regime_active{device="sda",regime="tail_inflation"} 0
`
	c := NewCollector(fakeSources())
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"readaheadd_bpf_events_lost_total", "readaheadd_bpf_missed_runs_total", "readaheadd_bpf_run_seconds_total",
		"readaheadd_files_adjusted", "readaheadd_read_ahead_kb", "readaheadd_read_ahead_original_kb",
		"readaheadd_read_bytes_total", "readaheadd_read_latency_seconds", "readaheadd_read_requests_total",
		"readaheadd_regime_active"))

	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	// read_ahead_kb mirrors the sysfs knob's name and unit on purpose (the
	// names are a contract); every other metric must pass the linter.
	var other []string
	for _, p := range problems {
		if p.Metric == "readaheadd_read_ahead_kb" || p.Metric == "readaheadd_read_ahead_original_kb" {
			assert.Contains(t, p.Text, "abbreviated units")
			continue
		}
		other = append(other, p.Metric+": "+p.Text)
	}
	assert.Empty(t, other, "metric names follow Prometheus conventions (base units, _total)")
}

func TestNoPathOrInodeLabels(t *testing.T) {
	reg := NewRegistry(fakeSources())
	mfs, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				assert.NotContains(t, []string{"path", "file", "inode", "ino"}, l.GetName(), mf.GetName())
				assert.NotContains(t, l.GetValue(), "/", "%s has a path-like label value", mf.GetName())
			}
		}
	}
	for _, n := range []string{"go_goroutines", "process_resident_memory_bytes", "readaheadd_probe_attached", "readaheadd_dry_run"} {
		assert.True(t, names[n], n)
	}
}

func TestPartsNotRunningAreAbsent(t *testing.T) {
	c := NewCollector(Sources{Tuner: fakeSources().Tuner})
	n := testutil.CollectAndCount(c, "readaheadd_read_latency_seconds", "readaheadd_regime_active", "readaheadd_bpf_events_lost_total")
	assert.Equal(t, 0, n)
	assert.Equal(t, 1, testutil.CollectAndCount(c, "readaheadd_read_ahead_kb"))
}

func TestUnknownDeviceNamedByNumber(t *testing.T) {
	src := fakeSources()
	src.Detector = func() (detector.Snapshot, bool) {
		return detector.Snapshot{Regimes: []detector.Regime{{Kind: detector.TailInflation, Device: sdb}}}, true
	}
	assert.Equal(t, 1.0, regimeGauge(t, NewCollector(src), "8:16", "tail_inflation"))
	assert.Equal(t, 0.0, regimeGauge(t, NewCollector(src), "8:16", "contention"))
}

// regimeGauge extracts one regime_active series as a collector.
func regimeGauge(t *testing.T, c *Collector, dev, regime string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "readaheadd_regime_active" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["device"] == dev && l["regime"] == regime {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no regime_active{device=%q,regime=%q}", dev, regime)
	return 0
}

func TestHealthz(t *testing.T) {
	var healthErr error
	s := NewServer(fakeSources(), NewRegistry(fakeSources()), func() error { return healthErr }, "test", nil)
	h := s.Handler()

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "ok\n", rec.Body.String())

	for _, reason := range []string{"probe not attached", "detector stale: last evaluation 12s ago"} {
		healthErr = errors.New(reason)
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
		assert.Contains(t, rec.Body.String(), reason)
	}
}

func TestReadOnly(t *testing.T) {
	s := NewServer(fakeSources(), NewRegistry(fakeSources()), nil, "test", nil)
	for _, path := range []string{"/metrics", "/healthz", "/debug/status", "/debug/files"} {
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest(m, path, strings.NewReader("x")))
			assert.Equal(t, http.StatusMethodNotAllowed, rec.Code, "%s %s", m, path)
		}
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodHead, path, nil))
		assert.Equal(t, http.StatusOK, rec.Code, "HEAD %s", path)
	}
}

func TestDebugFilesBounded(t *testing.T) {
	src := fakeSources()
	src.FilePath = func(k probe.FileKey) string {
		if k.Ino == 13 {
			return "/data/blk_13"
		}
		return ""
	}
	s := NewServer(src, NewRegistry(src), nil, "test", nil)
	get := func(q string) (int, []FileStatus) {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/files"+q, nil))
		var out []FileStatus
		if rec.Code == http.StatusOK {
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
		}
		return rec.Code, out
	}
	code, files := get("")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, files, 3)
	assert.Equal(t, "8:0/13", files[0].File, "most bytes first")
	assert.Equal(t, "/data/blk_13", files[0].Path)
	assert.Equal(t, []string{"file_latency_shift"}, files[0].ActiveRegimes)
	assert.Equal(t, "8:16", files[1].Device, "unknown device named by number")

	_, files = get("?n=1")
	assert.Len(t, files, 1)
	code, _ = get("?n=0")
	assert.Equal(t, http.StatusBadRequest, code)
	code, _ = get("?n=abc")
	assert.Equal(t, http.StatusBadRequest, code)

	many := make([]detector.FileStats, 1000)
	for i := range many {
		many[i] = detector.FileStats{Key: probe.FileKey{Dev: sda, Ino: uint64(i)}, Bytes: uint64(i)}
	}
	src.Detector = func() (detector.Snapshot, bool) { return detector.Snapshot{Files: many}, true }
	s = NewServer(src, NewRegistry(src), nil, "test", nil)
	_, files = get("?n=100000")
	assert.Len(t, files, MaxTopFiles)
}

func TestDebugStatus(t *testing.T) {
	s := NewServer(fakeSources(), NewRegistry(fakeSources()), func() error { return errors.New("probe not attached") }, "v1", nil)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/status", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	var st Status
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &st))
	assert.Equal(t, "v1", st.Version)
	assert.False(t, st.Healthy)
	assert.Equal(t, "probe not attached", st.HealthReason)
	assert.True(t, st.ProbeAttached)
	assert.Equal(t, uint64(7), st.EventsLost)
	require.Len(t, st.Devices, 1)
	assert.Equal(t, 1024, st.Devices[0].ReadAheadKB)
	assert.Equal(t, 128, st.Devices[0].OriginalKB)
	assert.Equal(t, 5.0, st.Devices[0].P99ms)
	require.Len(t, st.Regimes, 1)
	assert.Equal(t, "file_latency_shift", st.Regimes[0].Kind)
	assert.Equal(t, 6.0, st.Regimes[0].ForSeconds)
	assert.Equal(t, "8:0/13", st.Regimes[0].File)
	require.Len(t, st.RecentActions, 1)
	assert.Equal(t, "+80% busy throughput", st.RecentActions[0].Effect)
}

func TestServeAndShutdown(t *testing.T) {
	ln, err := Listen("127.0.0.1:0")
	require.NoError(t, err)
	_, err = Listen(ln.Addr().String())
	require.Error(t, err, "an address in use is reported")
	assert.Contains(t, err.Error(), "--metrics-addr")

	s := NewServer(fakeSources(), NewRegistry(fakeSources()), nil, "test", nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(body), `readaheadd_read_latency_seconds_bucket{device="sda",le="8e-06"} 8`)
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("server did not shut down")
	}
}

func TestTunerErrorsExported(t *testing.T) {
	src := Sources{Tuner: func() TunerStatus {
		return TunerStatus{Errors: map[string]uint64{ErrFileOp: 3, ErrOutOfScope: 2}}
	}}
	want := `
# HELP readaheadd_tuner_errors_total Tuner operations that did not happen: file_op (a reader's descriptor could not be taken or advised: process exited, file closed or deleted), out_of_scope (a descriptor outside the allow-paths was refused), rate_limited (a sysfs write deferred).
# TYPE readaheadd_tuner_errors_total counter
readaheadd_tuner_errors_total{kind="file_op"} 3
readaheadd_tuner_errors_total{kind="out_of_scope"} 2
readaheadd_tuner_errors_total{kind="rate_limited"} 0
`
	require.NoError(t, testutil.CollectAndCompare(NewCollector(src), strings.NewReader(want), "readaheadd_tuner_errors_total"))
}

// series gathers every sample of the named metric as "labels value" lines
// keyed by the series' labels (name=value, sorted as exposed).
func series(t *testing.T, c prometheus.Collector, name string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, p := range m.GetLabel() {
				ls = append(ls, p.GetName()+"="+p.GetValue())
			}
			k := strings.Join(ls, ",")
			switch {
			case m.GetCounter() != nil:
				out[k] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[k] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				h := m.GetHistogram()
				out[k+",count"] = float64(h.GetSampleCount())
				for _, b := range h.GetBucket() {
					out[fmt.Sprintf("%s,le=%g", k, b.GetUpperBound())] = float64(b.GetCumulativeCount())
				}
			}
		}
	}
	return out
}

// TestEveryWatchedDeviceHasItsSeriesFromTheStart: a watched device that
// was never read from and never acted on (sdc) has its latency buckets,
// byte and request counters and every action kind and result at zero;
// the read device keeps its counts; repeated failures exist by cause.
func TestEveryWatchedDeviceHasItsSeriesFromTheStart(t *testing.T) {
	src := fakeSources()
	tuner := src.Tuner
	src.Tuner = func() TunerStatus {
		ts := tuner()
		ts.Devices = append(ts.Devices, DeviceState{Name: "sdc", Dev: "8:32", ReadAheadKB: 128, OriginalKB: 128})
		ts.Repeated = map[string]uint64{"out_of_scope": 4}
		return ts
	}
	c := NewCollector(src)

	lat := series(t, c, "readaheadd_read_latency_seconds")
	assert.Equal(t, 0.0, lat["device=sdc,count"])
	var buckets int
	for k, v := range lat {
		if strings.HasPrefix(k, "device=sdc,le=") {
			buckets++
			assert.Zero(t, v, k)
		}
	}
	assert.Equal(t, probe.HistBuckets-1, buckets, "every finite bucket of the probe's histogram")
	assert.Equal(t, 8.0, lat["device=sda,count"])
	for _, name := range []string{"readaheadd_read_bytes_total", "readaheadd_read_requests_total"} {
		s := series(t, c, name)
		v, ok := s["device=sdc"]
		assert.True(t, ok, "%s{device=sdc}", name)
		assert.Zero(t, v)
		assert.Positive(t, s["device=sda"])
	}

	acts := series(t, c, "readaheadd_actions_total")
	for _, dev := range []string{"sda", "sdc"} {
		for _, a := range ActionNames {
			for _, r := range ActionResults {
				k := "action=" + a + ",device=" + dev + ",result=" + r
				_, ok := acts[k]
				assert.True(t, ok, k)
			}
		}
	}
	assert.Len(t, acts, 2*len(ActionNames)*len(ActionResults), "no other series")
	assert.Equal(t, 4.0, acts["action=file_window,device=sda,result=kept"], "duplicates summed")
	assert.Equal(t, 1.0, acts["action=device_window,device=sda,result=failed"])
	assert.Zero(t, acts["action=file_window,device=sdc,result=failed"])

	rep := series(t, c, "readaheadd_repeated_failures_total")
	assert.Len(t, rep, len(FailureCauses))
	assert.Equal(t, 4.0, rep["cause=out_of_scope"])
	assert.Zero(t, rep["cause=process_gone"])
}

// Debug requests beyond MaxDebugInFlight are refused at once (429) instead
// of queueing work behind the ones in flight.
func TestDebugRequestsInFlightAreBounded(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, MaxDebugInFlight)
	src := Sources{Tuner: func() TunerStatus {
		entered <- struct{}{}
		<-release
		return TunerStatus{}
	}}
	srv := NewServer(src, prometheus.NewRegistry(), nil, "test", nil)
	h := srv.Handler()
	done := make(chan int, MaxDebugInFlight)
	for i := 0; i < MaxDebugInFlight; i++ {
		go func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/status", nil))
			done <- rec.Code
		}()
	}
	for i := 0; i < MaxDebugInFlight; i++ {
		<-entered
	}
	for _, path := range []string{"/debug/status", "/debug/files"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		assert.Equal(t, http.StatusTooManyRequests, rec.Code, path)
		assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	}
	// Health checks are not held up by debug requests.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	assert.Equal(t, http.StatusOK, rec.Code)
	close(release)
	for i := 0; i < MaxDebugInFlight; i++ {
		assert.Equal(t, http.StatusOK, <-done)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/files", nil))
	assert.Equal(t, http.StatusOK, rec.Code, "slots are given back")
}

func TestWindowBucketBounded(t *testing.T) {
	for kb, want := range map[int]string{0: "0", 4: "4", 16: "16", 100: "128", 128: "128", 1024: "1024", 16384: "16384", 16385: "+Inf", 1 << 30: "+Inf"} {
		assert.Equal(t, want, WindowBucket(kb), "%d KB", kb)
	}
}

// The open files' windows in force and the files above their device's
// window reach /metrics and /debug/status.
func TestOpenFilesExported(t *testing.T) {
	src := Sources{OpenFiles: func() OpenFiles {
		return OpenFiles{
			Windows:    []OpenWindows{{Device: "sdb", WindowKB: 128, Files: 3}, {Device: "sdb", WindowKB: 2048, Files: 1}, {Device: "sdc", WindowKB: 128, Files: 2}},
			Above:      []OpenFileAbove{{Device: "sdb", DeviceKB: 128, PID: 42, FD: 7, Path: "/data/blk_1", RAPagesKB: 128, StreamKB: 2048}},
			AboveCount: map[string]int{"sdb": 1},
		}
	}}
	want := `
# HELP readaheadd_open_files_above_device_window Open regular files on the device whose window in force (as in open_file_windows) is above the device's read_ahead_kb, whoever set it: while readaheadd runs, the files it raised; after it stops, windows left behind.
# TYPE readaheadd_open_files_above_device_window gauge
readaheadd_open_files_above_device_window{device="sdb"} 1
readaheadd_open_files_above_device_window{device="sdc"} 0
`
	require.NoError(t, testutil.CollectAndCompare(NewCollector(src), strings.NewReader(want), "readaheadd_open_files_above_device_window"))
	assert.Equal(t, 3, testutil.CollectAndCount(NewCollector(src), "readaheadd_open_file_windows"))
	srv := NewServer(src, NewRegistry(src), nil, "v", nil)
	st := srv.BuildStatus()
	assert.Len(t, st.OpenFileWindows, 3)
	require.Len(t, st.OpenFilesAbove, 1)
	assert.Equal(t, 2048, st.OpenFilesAbove[0].StreamKB)
}
