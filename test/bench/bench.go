// Package bench is readaheadd's evaluation: on the lab's emulated SSD it
// runs each workload under each slowdown regime once per arm — the default
// read_ahead_kb, every static value of a sweep (the best of them is the
// "oracle") and readaheadd itself, started as a subprocess of the built
// binary — and reports their figures side by side, with the targets as
// ratios, a Markdown report and PNG plots (see docs/benchmarks.md).
//
// Every run follows one protocol. The arm's window is set on the lab
// device, then the readers open their files (a file copies read_ahead_kb
// when it is opened). They read for a warm-up period on a healthy device;
// then the regime starts ("onset") and they read on for the measured
// period. Throughput, request latency and device bytes are taken over the
// measured period only. For the readaheadd arm the device stays at the
// default window and the daemon has to find and act on the already-open
// files by itself.
package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/readaheadd/readaheadd/test/lab"
)

// DefaultKB is the kernel's default read_ahead_kb and the window the
// readaheadd arm starts from.
const DefaultKB = 128

// Arm is one way of setting readahead that a run measures.
type Arm struct {
	Name   string // "ra128" ... "ra4096", or "readaheadd"
	KB     int    // static window; DefaultKB for readaheadd
	Daemon bool
}

// Static returns the static arm for kb.
func Static(kb int) Arm { return Arm{Name: fmt.Sprintf("ra%d", kb), KB: kb} }

// Readaheadd is the daemon arm.
var Readaheadd = Arm{Name: "readaheadd", KB: DefaultKB, Daemon: true}

// Config is one benchmark matrix.
type Config struct {
	// FileMB is the size of each sequentially read file (one HDFS block).
	FileMB int
	// RandomMB is the size of the file the mmap random reader touches.
	RandomMB int
	// StaticKB are the static windows compared (DefaultKB must be one).
	StaticKB []int
	// Warm is how long readers read on a healthy device before onset in
	// static arms; DaemonWarm in the readaheadd arm (the daemon learns its
	// healthy baselines then: it needs a few detection intervals).
	Warm, DaemonWarm time.Duration
	// Measure is how long readers read after onset.
	Measure time.Duration
	// Sample is the timeline's resolution.
	Sample time.Duration
	// Cases are the (workload, regime) pairs to run.
	Cases []Case
	// Starts are the start conditions (other than onset) the readaheadd arm
	// of each seq and sendfile case under a slowdown also runs in.
	Starts []string
	// MixedReps: how many times each seq+mmap row runs (interleaved);
	// the row is the median of its runs (0 or 1: once).
	MixedReps int
	// RandomReopen: the mixed rows' random reader closes and re-opens its
	// file at every eviction, as a service that opens its index per
	// request batch does: each new descriptor starts with the device's
	// window, and a trim of the descriptors open before reaches none of
	// it.
	RandomReopen bool
	// HDFS runs the real-HDFS cases (needs Java 17 and Maven).
	HDFS bool
	// HDFSReaders is the number of concurrent HDFS clients in the
	// concurrent case.
	HDFSReaders int
	// HDFSRegimes, when set, limits the HDFS cases to these regimes.
	HDFSRegimes []string
	// DaemonBin is the readaheadd binary; empty: built into a temporary
	// directory.
	DaemonBin string
	// WorkDir keeps daemon logs; empty: a temporary directory.
	WorkDir string
	// Log receives progress.
	Log *slog.Logger
}

// Case is one workload under one regime.
type Case struct {
	Workload string // seq, sendfile, seq+mmap
	Regime   string // see Regimes
}

// Workloads.
const (
	WSeq      = "seq"
	WSendfile = "sendfile"
	WMixed    = "seq+mmap"
	WHDFS     = "hdfs"
	WHDFSConc = "hdfs-concurrent"
)

// Regime names.
const (
	RHealthy   = "healthy"
	RPerm      = "permanent+1.5ms"
	RPermSev   = "permanent+3ms"
	RTemporal  = "temporal"
	RIntrinsic = "intrinsic"
	RContended = "contention"
	RMixed     = "mixed-timeline"
)

// Regimes lists every regime in report order.
var Regimes = []string{RHealthy, RPerm, RPermSev, RTemporal, RIntrinsic, RContended, RMixed}

// PermanentExtra is the added latency of a permanent regime named
// "permanent+<Go duration>" (RPerm and RPermSev among them), ok if name is
// one: other severities than the matrix's run under the same name scheme.
func PermanentExtra(name string) (time.Duration, bool) {
	rest, ok := strings.CutPrefix(name, "permanent+")
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(rest)
	if err != nil || d <= 0 || d > time.Second {
		return 0, false
	}
	return d, true
}

// FullConfig is the matrix `make bench` runs.
func FullConfig() Config {
	var cases []Case
	for _, r := range Regimes {
		cases = append(cases, Case{WSeq, r})
	}
	for _, r := range []string{RHealthy, RPerm, RPermSev, RTemporal, RIntrinsic, RContended} {
		cases = append(cases, Case{WSendfile, r})
	}
	for _, r := range []string{RHealthy, RPerm, RPermSev} {
		cases = append(cases, Case{WMixed, r})
	}
	return Config{
		FileMB: 256, RandomMB: 512,
		StaticKB: []int{128, 256, 512, 1024, 2048, 4096},
		// 12 s: tail inflation needs 8 healthy baseline windows before it
		// can be recognised (a production daemon keeps its learned baseline
		// in its state directory across restarts).
		Warm: time.Second, DaemonWarm: 12 * time.Second, Measure: 8 * time.Second,
		Sample: 100 * time.Millisecond,
		Cases:  cases, HDFS: true, HDFSReaders: 4,
		// The random reader's p99 over 8 s strays 30-40% between two
		// runs of the default window: the rows are medians of three.
		MixedReps: 3,
		// Every seq and sendfile case under a slowdown also runs the
		// readaheadd arm slowed before the open, before the daemon's start,
		// and before a restart with saved state.
		Starts: Starts,
	}
}

// ShortConfig is the reduced matrix CI runs (a few minutes).
func ShortConfig() Config {
	return Config{
		FileMB: 64, RandomMB: 256,
		StaticKB: []int{128, 1024, 4096},
		Warm:     time.Second, DaemonWarm: 4 * time.Second, Measure: 5 * time.Second,
		Sample: 100 * time.Millisecond,
		Cases: []Case{
			{WSeq, RHealthy}, {WSeq, RPermSev}, {WSendfile, RPermSev}, {WMixed, RPermSev},
		},
		HDFSReaders: 2,
	}
}

// Arms returns the arms a config compares, static ones first.
func (c Config) Arms() []Arm {
	var out []Arm
	for _, kb := range c.StaticKB {
		out = append(out, Static(kb))
	}
	return append(out, Readaheadd)
}

func (c *Config) defaults() error {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Sample <= 0 {
		c.Sample = 100 * time.Millisecond
	}
	if c.HDFSReaders <= 0 {
		c.HDFSReaders = 2
	}
	has := false
	for _, kb := range c.StaticKB {
		has = has || kb == DefaultKB
	}
	if !has {
		return fmt.Errorf("static windows %v must include the default %d KB", c.StaticKB, DefaultKB)
	}
	sort.Ints(c.StaticKB)
	return nil
}

// Run runs the matrix and returns its results. Everything it starts (labs,
// daemons, clusters) is torn down before it returns, also on error or when
// ctx is cancelled.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := lab.Available(); err != nil {
		return nil, fmt.Errorf("the lab cannot run here: %w", err)
	}
	work := cfg.WorkDir
	if work != "" {
		if err := os.MkdirAll(work, 0o755); err != nil {
			return nil, err
		}
	} else {
		d, err := os.MkdirTemp("", "readaheadd-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		work = d
	}
	if cfg.DaemonBin == "" {
		bin, err := BuildDaemon(ctx, filepath.Join(work, "readaheadd"))
		if err != nil {
			return nil, err
		}
		cfg.DaemonBin = bin
	}
	rep := newReport(cfg)
	if len(cfg.Cases) > 0 {
		if err := runLabCases(ctx, cfg, work, rep); err != nil {
			return rep, err
		}
	}
	if cfg.HDFS {
		if err := runHDFS(ctx, cfg, work, rep); err != nil {
			return rep, err
		}
	}
	rep.finish()
	return rep, nil
}
