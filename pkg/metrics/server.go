package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/failslow"
	"github.com/readaheadd/readaheadd/pkg/tuner"
)

// Bounds of /debug/files.
const (
	DefaultTopFiles = 20
	MaxTopFiles     = 200
)

// MaxDebugInFlight and MaxMetricsInFlight bound concurrent requests: the
// endpoints are unauthenticated, and a scrape or a status is a few
// milliseconds of work, so more at once is a client misbehaving. Excess
// requests get 429 (503 from promhttp) at once instead of queueing.
const (
	MaxDebugInFlight   = 2
	MaxMetricsInFlight = 4
)

// Status is the JSON served at /debug/status and printed by `readaheadd status`.
type Status struct {
	Version       string         `json:"version"`
	StartedAt     time.Time      `json:"started_at"`
	Healthy       bool           `json:"healthy"`
	HealthReason  string         `json:"health_reason,omitempty"`
	ProbeAttached bool           `json:"probe_attached"`
	DryRun        bool           `json:"dry_run"`
	EventsLost    uint64         `json:"events_lost"`
	Devices       []DeviceStatus `json:"devices"`
	Regimes       []RegimeStatus `json:"regimes"`
	RecentActions []Action       `json:"recent_actions"`
	// ControlEvents counts the tuner's control events by name, every name
	// of tuner.Events() present (zero until it happens).
	ControlEvents map[string]uint64 `json:"control_events,omitempty"`
	// OpenFileWindows: open files per device by the window in force (the
	// kernel's own per-file state), sorted by device and window.
	OpenFileWindows []OpenWindows `json:"open_file_windows,omitempty"`
	// OpenFilesAbove: open files whose window in force is above their
	// device's read_ahead_kb (at most MaxAboveListed).
	OpenFilesAbove []OpenFileAbove `json:"open_files_above_device,omitempty"`
	// FailSlow: the fail-slow verdict of every disk with one, or named
	// (sorted by device), with the files named slower than their disk.
	FailSlow []SlowDiskStatus `json:"fail_slow,omitempty"`
}

// SlowDiskStatus is one disk's fail-slow verdict in Status.
type SlowDiskStatus struct {
	Device    string  `json:"device"`
	Ratio     float64 `json:"ratio"`      // the latest window's, 0 without a verdict
	HeldRatio float64 `json:"held_ratio"` // the median of the last verdicts, which names the disk
	Reference string  `json:"reference"`  // peers, baseline or none
	Requests  int     `json:"requests"`
	// Over: consecutive evaluations at or above the threshold.
	Over       int              `json:"over"`
	Slow       bool             `json:"slow"`
	ForSeconds float64          `json:"for_seconds,omitempty"` // named this long
	SlowFiles  []SlowFileStatus `json:"slow_files,omitempty"`
}

// SlowFileStatus is a file named slower than its own disk: its path when
// it lies under the allow-paths, else major:minor/inode.
type SlowFileStatus struct {
	File       string  `json:"file"`
	Ratio      float64 `json:"ratio"`
	Requests   int     `json:"requests"`
	ForSeconds float64 `json:"for_seconds"`
}

// DeviceStatus is one device in Status.
type DeviceStatus struct {
	DeviceState
	Requests uint64  `json:"requests"`
	Bytes    uint64  `json:"bytes"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
}

// RegimeStatus is one active regime in Status.
type RegimeStatus struct {
	Kind         string  `json:"kind"`
	Device       string  `json:"device"`
	File         string  `json:"file,omitempty"`
	ForSeconds   float64 `json:"for_seconds"`
	Confidence   float64 `json:"confidence"`
	Evidence     string  `json:"evidence,omitempty"`
	DeviceWide   bool    `json:"device_wide"`
	SinceMonoSec float64 `json:"since_monotonic_seconds"`
}

// FileStatus is one entry of /debug/files.
type FileStatus struct {
	Device        string   `json:"device"`
	File          string   `json:"file"` // major:minor/inode
	Path          string   `json:"path,omitempty"`
	Requests      uint64   `json:"requests"`
	Bytes         uint64   `json:"bytes"`
	P50ms         float64  `json:"p50_ms"`
	P99ms         float64  `json:"p99_ms"`
	MeanSizeKB    float64  `json:"mean_size_kb"`
	MeanDepth     float64  `json:"mean_depth"`
	BusyMBps      float64  `json:"busy_mb_per_s"`
	Sequentiality float64  `json:"sequentiality"`
	LastSeenMonoS float64  `json:"last_seen_monotonic_seconds"`
	ActiveRegimes []string `json:"regimes,omitempty"`
}

// Server serves the read-only HTTP endpoints.
type Server struct {
	src     Sources
	reg     *prometheus.Registry
	health  func() error
	version string
	started time.Time
	log     *slog.Logger
	srv     *http.Server
}

// NewServer returns a server over src. health returns nil when the daemon is
// healthy (probe attached, detector fresh) and otherwise the reason.
func NewServer(src Sources, reg *prometheus.Registry, health func() error, version string, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{src: src, reg: reg, health: health, version: version, started: time.Now(), log: log}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slogAdapter{log}, MaxRequestsInFlight: MaxMetricsInFlight}))
	mux.HandleFunc("/healthz", s.serveHealth)
	debug := make(chan struct{}, MaxDebugInFlight) // shared by both debug endpoints
	mux.Handle("/debug/status", limit(debug, http.HandlerFunc(s.serveStatus)))
	mux.Handle("/debug/files", limit(debug, http.HandlerFunc(s.serveFiles)))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "readaheadd: /metrics /healthz /debug/status /debug/files")
	})
	s.srv = &http.Server{
		Handler:           readOnly(mux),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
	return s
}

// Handler returns the server's HTTP handler (for tests).
func (s *Server) Handler() http.Handler { return s.srv.Handler }

// Listen binds addr, so that an address already in use is reported before
// the daemon changes anything.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %s: %w (choose another --metrics-addr, or \"\" to disable)", addr, err)
	}
	return ln, nil
}

// Serve serves on ln until ctx is done, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics server: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := s.srv.Shutdown(sctx)
		if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
			err = e
		}
		return err
	}
}

// readOnly rejects every method but GET and HEAD: nothing on this server
// changes the daemon.
func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "read-only endpoint: use GET", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// limit serves at most cap(slots) requests at once and refuses the rest.
func limit(slots chan struct{}, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			h.ServeHTTP(w, r)
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, fmt.Sprintf("too many requests in flight (at most %d): retry in a second", cap(slots)), http.StatusTooManyRequests)
		}
	})
}

func (s *Server) healthErr() error {
	if s.health == nil {
		return nil
	}
	return s.health()
}

func (s *Server) serveHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := s.healthErr(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "unhealthy:", err)
		return
	}
	fmt.Fprintln(w, "ok")
}

// BuildStatus assembles the status document.
func (s *Server) BuildStatus() Status {
	st := Status{Version: s.version, StartedAt: s.started, Devices: []DeviceStatus{}, Regimes: []RegimeStatus{}, RecentActions: []Action{}}
	if err := s.healthErr(); err != nil {
		st.HealthReason = err.Error()
	} else {
		st.Healthy = true
	}
	if s.src.OpenFiles != nil {
		of := s.src.OpenFiles()
		st.OpenFileWindows, st.OpenFilesAbove = of.Windows, of.Above
	}
	byName := map[string]int{}
	if s.src.Tuner != nil {
		ts := s.src.Tuner()
		st.DryRun = ts.DryRun
		for _, d := range ts.Devices {
			byName[d.Name] = len(st.Devices)
			st.Devices = append(st.Devices, DeviceStatus{DeviceState: d})
		}
		if ts.Recent != nil {
			st.RecentActions = ts.Recent
		}
		st.ControlEvents = map[string]uint64{}
		for _, e := range tuner.Events() {
			st.ControlEvents[e.String()] = ts.Control[e.String()]
		}
	}
	if s.src.Probe != nil {
		ps := s.src.Probe()
		st.ProbeAttached = ps.Attached
		st.EventsLost = ps.EventsLost
	}
	var now time.Duration
	if s.src.Detector != nil {
		if snap, ok := s.src.Detector(); ok {
			now = snap.Now
			for _, d := range snap.Devices {
				n := s.src.devName(d.Device)
				i, ok := byName[n]
				if !ok {
					i = len(st.Devices)
					byName[n] = i
					st.Devices = append(st.Devices, DeviceStatus{DeviceState: DeviceState{Name: n, Dev: d.Device.String()}})
				}
				st.Devices[i].Requests, st.Devices[i].Bytes = d.Requests, d.Bytes
				st.Devices[i].P50ms, st.Devices[i].P99ms = ms(d.P50), ms(d.P99)
			}
			for _, r := range snap.Regimes {
				rs := RegimeStatus{
					Kind: string(r.Kind), Device: s.src.devName(r.Device),
					ForSeconds: (snap.Now - r.Since).Seconds(), Confidence: r.Confidence,
					Evidence: r.Evidence, DeviceWide: r.File.IsZero(), SinceMonoSec: r.Since.Seconds(),
				}
				if !r.File.IsZero() {
					rs.File = s.filePath(r.File.String(), r)
				}
				st.Regimes = append(st.Regimes, rs)
			}
		}
	}
	if s.src.FailSlow != nil {
		for _, d := range s.src.FailSlow() {
			if d.Reference == failslow.None && !d.Slow && len(d.SlowFiles) == 0 {
				continue
			}
			ds := SlowDiskStatus{Device: s.src.devName(d.Device), Ratio: d.Ratio, HeldRatio: d.Held, Reference: string(d.Reference),
				Requests: d.Requests, Over: d.Over, Slow: d.Slow}
			if d.Slow {
				ds.ForSeconds = (now - d.Since).Seconds()
			}
			for _, f := range d.SlowFiles {
				name := f.Key.String()
				if s.src.FilePath != nil {
					if p := s.src.FilePath(f.Key); p != "" {
						name = p
					}
				}
				ds.SlowFiles = append(ds.SlowFiles, SlowFileStatus{File: name, Ratio: f.Ratio, Requests: f.Requests, ForSeconds: (now - f.Since).Seconds()})
			}
			st.FailSlow = append(st.FailSlow, ds)
		}
	}
	return st
}

func (s *Server) filePath(key string, r detector.Regime) string {
	if s.src.FilePath != nil {
		if p := s.src.FilePath(r.File); p != "" {
			return p
		}
	}
	return key
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (s *Server) serveStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, s.BuildStatus())
}

// TopFiles returns at most n files of the latest snapshot, most bytes first.
func (s *Server) TopFiles(n int) []FileStatus {
	out := []FileStatus{}
	if s.src.Detector == nil {
		return out
	}
	snap, ok := s.src.Detector()
	if !ok {
		return out
	}
	files := append([]detector.FileStats(nil), snap.Files...)
	sort.Slice(files, func(i, j int) bool {
		if files[i].Bytes != files[j].Bytes {
			return files[i].Bytes > files[j].Bytes
		}
		return files[i].Key.Ino < files[j].Key.Ino
	})
	if len(files) > n {
		files = files[:n]
	}
	regimes := map[[2]uint64][]string{}
	for _, r := range snap.Regimes {
		k := [2]uint64{uint64(r.File.Dev), r.File.Ino}
		regimes[k] = append(regimes[k], string(r.Kind))
	}
	for _, f := range files {
		fs := FileStatus{
			Device: s.src.devName(f.Device), File: f.Key.String(),
			Requests: f.Requests, Bytes: f.Bytes, P50ms: ms(f.P50), P99ms: ms(f.P99),
			MeanSizeKB: f.MeanSize / 1024, MeanDepth: f.MeanDepth, BusyMBps: f.BusyThroughput / 1e6,
			Sequentiality: f.Sequentiality, LastSeenMonoS: f.LastSeen.Seconds(),
			ActiveRegimes: regimes[[2]uint64{uint64(f.Key.Dev), f.Key.Ino}],
		}
		if s.src.FilePath != nil {
			fs.Path = s.src.FilePath(f.Key)
		}
		out = append(out, fs)
	}
	return out
}

func (s *Server) serveFiles(w http.ResponseWriter, r *http.Request) {
	n := DefaultTopFiles
	if q := r.URL.Query().Get("n"); q != "" {
		v, err := strconv.Atoi(q)
		if err != nil || v < 1 {
			http.Error(w, fmt.Sprintf("n=%q: give a count from 1 to %d", q, MaxTopFiles), http.StatusBadRequest)
			return
		}
		n = min(v, MaxTopFiles)
	}
	writeJSON(w, s.TopFiles(n))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away; nothing to do
}

type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Println(v ...any) { a.l.Error("serving metrics", "error", fmt.Sprint(v...)) }
