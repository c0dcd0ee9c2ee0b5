package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/test/lab"
)

// Result is one run: one workload under one regime with one arm.
type Result struct {
	Workload string `json:"workload"`
	Regime   string `json:"regime"`
	Arm      string `json:"arm"`
	KB       int    `json:"kb"`

	// MBps is the measured reader's throughput after onset (all readers'
	// sum for concurrent HDFS).
	MBps float64 `json:"mbps"`
	// P50ms/P99ms: block-layer read latency after onset (probe).
	P50ms, P99ms float64
	// DevMB is what the device read after onset (/sys/block/DEV/stat).
	DevMB float64 `json:"dev_mb"`
	// ReaderMB is what the measured reader got.
	ReaderMB float64 `json:"reader_mb"`

	// Random reader (seq+mmap workload), after onset.
	RandP50ms, RandP99ms float64
	RandTouchesPerSec    float64
	RandMB               float64 // device bytes attributed to its file (probe)
	// RandP99PerSec: its p99 touch latency in each second after onset (ms).
	RandP99PerSec []float64 `json:"rand_p99_per_s_ms,omitempty"`

	// Daemon arm only.
	Actions       []ActionRecord `json:"actions,omitempty"`
	ActionsTotal  float64        `json:"actions_total"`
	DaemonRegimes []string       `json:"daemon_regimes,omitempty"`
	Usage         Usage          `json:"usage"`
	DaemonLog     string         `json:"daemon_log,omitempty"`

	// RecoverySec is onset to recovery (trailing 500 ms mean back to >= 90%
	// of the oracle's); -1 when it never recovered; filled by the report.
	RecoverySec float64 `json:"recovery_s"`

	Timeline  []Point   `json:"timeline"`
	Events    []EventAt `json:"events"`
	LatPreMs  []float64 `json:"lat_pre_ms,omitempty"`
	LatPostMs []float64 `json:"lat_post_ms,omitempty"`
	Note      string    `json:"note,omitempty"`
	// Runs: each run's figures when the row is the median of several
	// (Config.MixedReps).
	Runs []RunFigures `json:"runs,omitempty"`
}

// EventAt is a regime change at T seconds since onset.
type EventAt struct {
	T    float64 `json:"t"`
	What string  `json:"what"`
}

// labEnv is the lab device and the files the lab cases read.
type labEnv struct {
	cfg     Config
	l       *lab.Lab
	work    string
	seq     string // the sequentially read file
	fragA   string // fragmented file (intrinsic regime)
	bg      string // contention file
	rnd     string // mmap random reader's file
	probeOK bool
}

func runLabCases(ctx context.Context, cfg Config, work string, rep *Report) (err error) {
	size := int64(4*cfg.FileMB+cfg.RandomMB+512) << 20
	l, err := lab.Up(lab.Options{SizeBytes: size})
	if err != nil {
		return fmt.Errorf("lab up: %w", err)
	}
	defer func() {
		if e := l.Down(); e != nil && err == nil {
			err = fmt.Errorf("lab down: %w", e)
		}
	}()
	rep.Device = fmt.Sprintf("lab %s: labfs %v latency, %.0f MB/s channel, %d slots", l.Name,
		lab.DefaultModel.Latency, lab.DefaultModel.BandwidthMBps, lab.DefaultModel.Slots)
	e := &labEnv{cfg: cfg, l: l, work: work}
	cfg.Log.Info("writing lab files", "file_mb", cfg.FileMB, "random_mb", cfg.RandomMB)
	if e.seq, err = l.WriteFile("seq.dat", cfg.FileMB); err != nil {
		return err
	}
	if e.fragA, _, err = l.WriteFragmented("frag-a.dat", "frag-b.dat", cfg.FileMB, 4); err != nil {
		return err
	}
	if e.bg, err = l.WriteFile("bg.dat", cfg.FileMB); err != nil {
		return err
	}
	if e.rnd, err = l.WriteFile("random.dat", cfg.RandomMB); err != nil {
		return err
	}
	for _, c := range cfg.Cases {
		arms := cfg.Arms()
		withStarts := (c.Workload == WSeq || c.Workload == WSendfile || c.Workload == WMixed) && c.Regime != RHealthy && c.Regime != RMixed
		armRuns := make([][]Result, len(arms))
		startRuns := make([][]StartResult, len(cfg.Starts))
		// Several runs of a case interleave its rows, so that a spell of
		// host noise falls on all of them alike.
		for i := 0; i < cfg.reps(c.Workload); i++ {
			for j, arm := range arms {
				if err := ctx.Err(); err != nil {
					return err
				}
				cfg.Log.Info("run", "workload", c.Workload, "regime", c.Regime, "arm", arm.Name, "run", i+1)
				r, err := e.runOne(ctx, c, arm)
				if err != nil {
					return fmt.Errorf("%s/%s/%s: %w", c.Workload, c.Regime, arm.Name, err)
				}
				cfg.Log.Info("result", "workload", c.Workload, "regime", c.Regime, "arm", arm.Name,
					"mbps", fmt.Sprintf("%.1f", r.MBps), "p99_ms", fmt.Sprintf("%.2f", r.P99ms), "actions", len(r.Actions))
				armRuns[j] = append(armRuns[j], r)
			}
			if !withStarts {
				continue
			}
			for k, st := range cfg.Starts {
				if err := ctx.Err(); err != nil {
					return err
				}
				cfg.Log.Info("run", "workload", c.Workload, "regime", c.Regime, "start", st, "run", i+1)
				r, err := e.runStart(ctx, c, st)
				if err != nil {
					return fmt.Errorf("%s/%s/%s: %w", c.Workload, c.Regime, st, err)
				}
				cfg.Log.Info("result", "workload", c.Workload, "regime", c.Regime, "start", st,
					"mbps", fmt.Sprintf("%.1f", r.MBps), "first_action_s", fmt.Sprintf("%.2f", r.FirstActionSec))
				startRuns[k] = append(startRuns[k], r)
			}
		}
		for _, rs := range armRuns {
			rep.add(medianResult(rs))
		}
		for _, ss := range startRuns {
			if len(ss) > 0 {
				rep.Starts = append(rep.Starts, medianStart(ss))
			}
		}
	}
	return nil
}

// regime applies a regime at onset; it returns when the whole timeline
// has been applied or ctx ends, appending what it did to events.
func (e *labEnv) regime(ctx context.Context, name, file string, onset time.Time, ev *events) (*lab.Contention, error) {
	l := e.l
	switch name {
	case RHealthy:
		return nil, nil
	case RPerm:
		ev.add(onset, "permanent +1.5ms")
		return nil, l.SetPermanent(1500*time.Microsecond, file)
	case RPermSev:
		ev.add(onset, "permanent +3ms")
		return nil, l.SetPermanent(3*time.Millisecond, file)
	case RTemporal:
		ev.add(onset, "temporal")
		_, err := l.SetTemporal(temporal)
		return nil, err
	case RIntrinsic:
		ev.add(onset, "intrinsic")
		return nil, l.SetIntrinsic(2, 3*time.Millisecond, file)
	case RContended:
		ev.add(onset, "contention")
		return l.StartContention(e.bg, 2, 1024)
	case RMixed:
		return e.mixed(ctx, file, onset, ev)
	}
	if extra, ok := PermanentExtra(name); ok {
		ev.add(onset, "permanent +"+extra.String())
		return nil, l.SetPermanent(extra, file)
	}
	return nil, fmt.Errorf("unknown regime %q", name)
}

// temporal: during the first second of every two, 10% of reads wait
// 10 ms more (a periodic tail, like the thesis' temporal slowdown).
var temporal = lab.Temporal{Period: 2 * time.Second, Duration: time.Second, Fraction: 0.1, Extra: 10 * time.Millisecond}

// mixed: regimes come and go over the measured period.
func (e *labEnv) mixed(ctx context.Context, file string, onset time.Time, ev *events) (*lab.Contention, error) {
	m := e.cfg.Measure
	var cont *lab.Contention
	steps := []struct {
		at   float64
		what string
		do   func() error
	}{
		{0, "permanent +3ms", func() error { return e.l.SetPermanent(3*time.Millisecond, file) }},
		{0.3, "temporal on", func() error { _, err := e.l.SetTemporal(temporal); return err }},
		{0.45, "permanent off", func() error { return e.l.Clear("permanent") }},
		{0.55, "contention on", func() error {
			c, err := e.l.StartContention(e.bg, 1, 1024)
			cont = c
			return err
		}},
		{0.7, "temporal off, permanent +1.5ms", func() error {
			if err := e.l.Clear("temporal"); err != nil {
				return err
			}
			return e.l.SetPermanent(1500*time.Microsecond, file)
		}},
	}
	for _, s := range steps {
		at := onset.Add(time.Duration(s.at * float64(m)))
		select {
		case <-ctx.Done():
			return cont, nil
		case <-time.After(time.Until(at)):
		}
		ev.add(onset, s.what)
		if err := s.do(); err != nil {
			return cont, err
		}
	}
	return cont, nil
}

type events struct {
	mu sync.Mutex
	ev []EventAt
}

func (e *events) add(onset time.Time, what string) {
	e.mu.Lock()
	e.ev = append(e.ev, EventAt{T: time.Since(onset).Seconds(), What: what})
	e.mu.Unlock()
}

func (e *labEnv) reset() error {
	if err := e.l.Clear(); err != nil {
		return err
	}
	for _, p := range []string{e.seq, e.fragA, e.bg, e.rnd} {
		if err := lab.DropFileCache(p); err != nil {
			return err
		}
	}
	return nil
}

func (e *labEnv) runOne(ctx context.Context, c Case, arm Arm) (res Result, err error) {
	res = Result{Workload: c.Workload, Regime: c.Regime, Arm: arm.Name, KB: arm.KB}
	if err := e.reset(); err != nil {
		return res, err
	}
	defer func() {
		if e2 := e.l.Clear(); e2 != nil && err == nil {
			err = e2
		}
		if e2 := e.l.SetReadAheadKB(DefaultKB); e2 != nil && err == nil {
			err = e2
		}
	}()
	if err := e.l.SetReadAheadKB(arm.KB); err != nil {
		return res, err
	}
	warm := e.cfg.Warm
	var d *Daemon
	if arm.Daemon {
		warm = e.cfg.DaemonWarm
		if d, err = StartDaemon(ctx, e.cfg.DaemonBin, e.l.Name, e.l.Mount, e.work); err != nil {
			return res, err
		}
		res.DaemonLog = d.LogPath
		defer func() {
			if e2 := d.Stop(); e2 != nil && err == nil {
				err = e2
			}
			if kb, e2 := e.l.ReadAheadKB(); e2 == nil && kb != DefaultKB && err == nil {
				err = fmt.Errorf("readaheadd left read_ahead_kb at %d after SIGTERM (want %d restored)", kb, DefaultKB)
			}
		}()
	}

	file := e.seq
	if c.Regime == RIntrinsic {
		file = e.fragA
	}
	// Open before onset: the window each file gets is the one set now.
	s, err := openSeqStream(file, c.Workload == WSendfile)
	if err != nil {
		return res, err
	}
	defer s.Close()
	var rnd *mmapRandom
	if c.Workload == WMixed {
		if rnd, err = openMmapRandom(e.rnd); err != nil {
			return res, err
		}
		rnd.reopen = e.cfg.RandomReopen
		defer rnd.Close()
	}
	var rndIno uint64
	if st, err := os.Stat(e.rnd); err == nil {
		rndIno = st.Sys().(*syscall.Stat_t).Ino
	}

	capt, perr := startCapture(e.l.Dev)
	if perr != nil {
		res.Note = fmt.Sprintf("probe unavailable (%v): no request latencies", perr)
	}
	defer capt.stop()

	rctx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	var wg sync.WaitGroup
	smp := &sampler{}
	var readErr, rndErr error
	wg.Add(1)
	go func() { defer wg.Done(); smp.run(rctx, e.cfg.Sample, e.l.Name, s.bytes.Load) }()
	wg.Add(1)
	go func() { defer wg.Done(); readErr = s.run(rctx) }()
	if rnd != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rnd.run(rctx, 42); err != nil {
				rndErr = fmt.Errorf("random reader: %w", err)
			}
		}()
	}

	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(warm):
	}
	onset := time.Now()
	onsetMono := clock.Monotonic{}.Now()
	b0, d0 := s.bytes.Load(), mustDev(e.l.Name)
	ev := &events{}
	var cont *lab.Contention
	var regErr error
	regDone := make(chan struct{})
	go func() {
		defer close(regDone)
		cont, regErr = e.regime(rctx, c.Regime, file, onset, ev)
	}()
	select {
	case <-ctx.Done():
	case <-time.After(e.cfg.Measure):
	}
	elapsed := time.Since(onset)
	b1, d1 := s.bytes.Load(), mustDev(e.l.Name)
	stopReaders()
	wg.Wait()
	<-regDone
	if cont != nil {
		if err := cont.Stop(); err != nil {
			return res, err
		}
	}
	if regErr != nil {
		return res, fmt.Errorf("apply regime: %w", regErr)
	}
	if readErr != nil {
		return res, readErr
	}
	if rndErr != nil {
		return res, rndErr
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}

	res.MBps = float64(b1-b0) / elapsed.Seconds() / 1e6
	res.ReaderMB = float64(b1-b0) / 1e6
	res.DevMB = float64(d1-d0) / 1e6
	res.Timeline = smp.points(onset)
	res.Events = ev.ev
	if rnd != nil {
		lat := rnd.since(onset)
		res.RandP50ms, res.RandP99ms = ms(lab.Quantile(lat, 0.5)), ms(lab.Quantile(lat, 0.99))
		res.RandP99PerSec = rnd.p99PerSecond(onset)
		res.RandTouchesPerSec = float64(len(lat)) / elapsed.Seconds()
	}
	if capt != nil {
		ls := splitRecords(capt.stop(), onsetMono)
		res.P50ms, res.P99ms = ms(lab.Quantile(ls.post, 0.5)), ms(lab.Quantile(ls.post, 0.99))
		res.LatPreMs, res.LatPostMs = thin(ls.pre, 400), thin(ls.post, 400)
		res.RandMB = float64(ls.postBytes[rndIno]) / 1e6
		if rnd == nil {
			res.RandMB = 0
		}
	}
	if d != nil {
		res.Actions = d.Actions(onset)
		res.DaemonRegimes = d.Regimes()
		if res.ActionsTotal, err = d.ActionsTotal(); err != nil {
			return res, fmt.Errorf("scrape readaheadd metrics: %w", err)
		}
		if res.Usage, err = d.Usage(); err != nil {
			return res, fmt.Errorf("readaheadd usage: %w", err)
		}
	}
	return res, nil
}

func mustDev(dev string) uint64 {
	b, err := devReadBytes(dev)
	if err != nil {
		return 0
	}
	return b
}

var errNotRoot = errors.New("needs root: the benchmark creates a loop device, a FUSE mount and sets read_ahead_kb")
