package bench

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/test/hdfs"
	"github.com/readaheadd/readaheadd/test/lab"
)

// The scenario matrix: each generated scenario (lab.MatrixScenario) runs
// side by side in one run with the default window (twice), every static
// window and readaheadd started from the default, on a lab device of its
// own; a verdict (Verdict) per scenario says whether readaheadd met the
// goals. See docs/benchmarks.md.

// MatrixConfig configures RunMatrix.
type MatrixConfig struct {
	// StaticKB are the static windows besides the default.
	StaticKB []int
	// DefaultTwice runs the default arm a second time, last, so that the
	// table shows how far two runs of the same window stray.
	DefaultTwice bool
	// Measure is each arm's measured period (at least 20 s for a verdict
	// that means anything: trials of a few seconds must fit in it).
	Measure time.Duration
	// Warm: under StartOnset the readers read this long on a healthy
	// device before the slowdown (the daemon learns its baselines).
	Warm time.Duration
	// DaemonBin is the readaheadd binary; WorkDir keeps its logs.
	DaemonBin, WorkDir string
	Log                *slog.Logger
	// OnRow is called after every scenario (to write the table so far).
	OnRow func(MatrixRow)
}

// FullMatrixConfig is what `make bench-matrix` runs: every static window
// from 128 to 4096 KB, the default twice, 20 s arms.
func FullMatrixConfig() MatrixConfig {
	return MatrixConfig{StaticKB: []int{256, 512, 1024, 2048, 4096}, DefaultTwice: true,
		Measure: 20 * time.Second, Warm: 6 * time.Second}
}

// ShortMatrixConfig is CI's: one static window besides the default, the
// default once, a 2 s warm-up.
func ShortMatrixConfig() MatrixConfig {
	return MatrixConfig{StaticKB: []int{512}, Measure: 20 * time.Second, Warm: 2 * time.Second}
}

// ShortMatrixScenarios are CI's scenarios: the whole device slow beside a
// bursty reader, and a saturated device, with smaller files than the
// named ones (writing them is most of a scenario's set-up).
func ShortMatrixScenarios() []lab.MatrixScenario {
	a, _ := lab.NamedScenario("whole-device-bursty")
	b, _ := lab.NamedScenario("saturated-streams")
	out := []lab.MatrixScenario{a, b}
	for i := range out {
		s := &out[i]
		s.Name += "-ci"
		s.Readers = append([]lab.MatrixReader(nil), s.Readers...)
		for j := range s.Readers {
			s.Readers[j].FileMB = min(s.Readers[j].FileMB, 128)
			if s.Device.BandwidthMBps > 0 {
				s.Readers[j].FileMB = 64
			}
		}
	}
	return out
}

// RandomFig is one random reader's figures in one arm.
type RandomFig struct {
	Reader        string    `json:"reader"`
	TouchesPerSec float64   `json:"touches_per_s"`
	P99ms         float64   `json:"p99_ms"`
	P99PerSec     []float64 `json:"p99_per_s_ms,omitempty"`
}

// MatrixArm is one arm of one scenario.
type MatrixArm struct {
	Arm    string `json:"arm"` // ra128 ... ra4096, readaheadd
	KB     int    `json:"kb"`
	Daemon bool   `json:"daemon,omitempty"`
	// Run: 1, or 2 for the default's second run.
	Run         int         `json:"run"`
	Seconds     float64     `json:"seconds"` // measured period
	StreamsMBps float64     `json:"streams_mbps"`
	Randoms     []RandomFig `json:"randoms,omitempty"`
	DevMB       float64     `json:"dev_mb"`
	DeliveredMB float64     `json:"delivered_mb"`
	// Amp is DevMB / DeliveredMB: the device's read amplification.
	Amp float64 `json:"amp"`
	// Daemon arm: its actions over the whole arm, those kept, those before
	// the measured period (StartOnset's warm-up), its CPU share of one
	// core, and the delay from the start of the measured period (onset,
	// open or daemon start) to its first action (-1: none).
	Actions        int            `json:"actions,omitempty"`
	Kept           int            `json:"kept,omitempty"`
	ActionsBefore  int            `json:"actions_before,omitempty"`
	CPUPct         float64        `json:"cpu_pct,omitempty"`
	FirstActionSec float64        `json:"first_action_s,omitempty"`
	ActionLog      []ActionRecord `json:"action_log,omitempty"`
	DaemonLog      string         `json:"daemon_log,omitempty"`
	// MemFailcnt: how often the memory cgroup hit its limit (memcg only).
	MemFailcnt uint64 `json:"mem_failcnt,omitempty"`
}

// MatrixRow is one scenario's arms and verdict.
type MatrixRow struct {
	Scenario lab.MatrixScenario `json:"scenario"`
	Desc     string             `json:"desc"`
	Classes  []string           `json:"classes"`
	Arms     []MatrixArm        `json:"arms"`
	Verdict  VerdictResult      `json:"verdict"`
	Seconds  float64            `json:"seconds"`       // wall time of the scenario
	Load     string             `json:"load"`          // /proc/loadavg at its end
	Run      int                `json:"run,omitempty"` // MatrixReport.Runs index
	Error    string             `json:"error,omitempty"`
}

// RunMatrix runs the scenarios one after another, each on a lab of its own.
// A harness error (lab, reader, daemon) ends the run and is returned with
// the rows so far.
func RunMatrix(ctx context.Context, cfg MatrixConfig, scs []lab.MatrixScenario) ([]MatrixRow, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Measure <= 0 {
		return nil, fmt.Errorf("matrix: measured period %v must be positive", cfg.Measure)
	}
	for _, s := range scs {
		if err := s.Validate(); err != nil {
			return nil, err
		}
	}
	if err := checkHDFS(ctx, scs); err != nil {
		return nil, err
	}
	if err := lab.Available(); err != nil {
		return nil, fmt.Errorf("the lab cannot run here: %w", err)
	}
	work := cfg.WorkDir
	if work == "" {
		d, err := os.MkdirTemp("", "readaheadd-matrix-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		work = d
	} else if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	if cfg.DaemonBin == "" {
		bin, err := BuildDaemon(ctx, filepath.Join(work, "readaheadd"))
		if err != nil {
			return nil, err
		}
		cfg.DaemonBin = bin
	}
	var rows []MatrixRow
	for _, s := range scs {
		if err := ctx.Err(); err != nil {
			return rows, err
		}
		t0 := time.Now()
		row, err := runScenario(ctx, cfg, work, s)
		row.Seconds = time.Since(t0).Seconds()
		row.Load = loadAvg()
		if err != nil {
			return rows, fmt.Errorf("scenario %s: %w", s.Name, err)
		}
		rows = append(rows, row)
		if cfg.OnRow != nil {
			cfg.OnRow(row)
		}
	}
	return rows, nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// mEnv is one scenario's lab and files.
type mEnv struct {
	cfg   MatrixConfig
	sc    lab.MatrixScenario
	l     *lab.Lab
	work  string
	files [][]string // per reader
	// hdfs: the scenario's real DataNode (lab.KHDFS), and its files.
	hdfs      *hdfs.Cluster
	hdfsPaths []string
}

func runScenario(ctx context.Context, cfg MatrixConfig, work string, sc lab.MatrixScenario) (row MatrixRow, err error) {
	row = MatrixRow{Scenario: sc, Desc: sc.String(), Classes: sc.Classes()}
	size := int64(sc.DataMB()+512) << 20
	l, err := lab.Up(lab.Options{SizeBytes: size, FS: sc.FS, Model: lab.Model{BandwidthMBps: sc.Device.BandwidthMBps}})
	if err != nil {
		return row, fmt.Errorf("lab up: %w", err)
	}
	defer func() {
		if e := l.Down(); e != nil && err == nil {
			err = fmt.Errorf("lab down: %w", e)
		}
	}()
	e := &mEnv{cfg: cfg, sc: sc, l: l, work: work}
	// Every file in one directory, as a DataNode keeps its blocks.
	if err := os.MkdirAll(filepath.Join(l.Mount, "data"), 0o755); err != nil {
		return row, err
	}
	cfg.Log.Info("matrix: writing files", "scenario", sc.Name, "mb", sc.DataMB(), "fs", sc.FS)
	defer func() {
		if e.hdfs == nil {
			return
		}
		if e2 := e.hdfs.Close(); e2 != nil && err == nil {
			err = fmt.Errorf("close HDFS: %w", e2)
		}
	}()
	for j, r := range sc.Readers {
		if r.Kind == lab.KHDFS {
			cfg.Log.Info("matrix: starting a DataNode on the lab, writing its blocks through HDFS", "scenario", sc.Name)
			blocks, err := e.startHDFS(ctx, j, r)
			if err != nil {
				return row, err
			}
			e.files = append(e.files, blocks)
			continue
		}
		n := 1
		if r.Kind == lab.KDataNode {
			n = r.Blocks
		}
		var fs []string
		for k := 0; k < n; k++ {
			p, err := l.WriteFile(fmt.Sprintf("data/blk_%d_%d", j, k), r.FileMB)
			if err != nil {
				return row, err
			}
			fs = append(fs, p)
		}
		e.files = append(e.files, fs)
	}
	type spec struct {
		kb     int
		daemon bool
		run    int
	}
	specs := []spec{{DefaultKB, false, 1}}
	for _, kb := range cfg.StaticKB {
		if kb != DefaultKB {
			specs = append(specs, spec{kb, false, 1})
		}
	}
	specs = append(specs, spec{DefaultKB, true, 1})
	if cfg.DefaultTwice {
		specs = append(specs, spec{DefaultKB, false, 2})
	}
	for _, sp := range specs {
		if err := ctx.Err(); err != nil {
			return row, err
		}
		state := ""
		if sp.daemon && sc.Start == lab.StartSaved {
			if state, err = e.teach(ctx); err != nil {
				return row, fmt.Errorf("earlier run for the saved state: %w", err)
			}
		}
		a, err := e.runArm(ctx, sp.kb, sp.daemon, state, cfg.Measure)
		if err != nil {
			return row, fmt.Errorf("arm %d KB daemon=%v: %w", sp.kb, sp.daemon, err)
		}
		a.Run = sp.run
		cfg.Log.Info("matrix: arm", "scenario", sc.Name, "arm", a.Arm, "run", a.Run,
			"streams_mbps", fmt.Sprintf("%.1f", a.StreamsMBps), "amp", fmt.Sprintf("%.2f", a.Amp), "actions", a.Actions)
		row.Arms = append(row.Arms, a)
	}
	row.Verdict = Verdict(row.Arms)
	return row, nil
}

// teachFor is how long the earlier run of StartSaved reads before the
// daemon is stopped and its state saved.
const matrixTeachFor = 10 * time.Second

// teach runs the daemon arm once unmeasured, slow before the daemon's
// start, and returns the state directory it left.
func (e *mEnv) teach(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp(e.work, "state-saved-")
	if err != nil {
		return "", err
	}
	_, err = e.runArmAs(ctx, DefaultKB, true, dir, matrixTeachFor, lab.StartBeforeDaemon)
	return dir, err
}

func (e *mEnv) allFiles() []string {
	var out []string
	for _, fs := range e.files {
		out = append(out, fs...)
	}
	return out
}

// slow applies the scenario's slowdowns (its bandwidth is the lab's model
// from the start).
func (e *mEnv) slow() error {
	d := e.sc.Device
	var slowFiles, streams []string
	for j, r := range e.sc.Readers {
		if r.Slow {
			slowFiles = append(slowFiles, e.files[j]...)
		}
		if r.Stream() {
			streams = append(streams, e.files[j]...)
		}
	}
	if d.FileExtra > 0 && len(slowFiles) > 0 {
		if err := e.l.SetPermanent(d.FileExtra, slowFiles...); err != nil {
			return err
		}
	}
	if d.DeviceExtra > 0 {
		if err := e.l.SetDevice(d.DeviceExtra); err != nil {
			return err
		}
	}
	if d.Tail != nil {
		if _, err := e.l.SetTemporal(*d.Tail); err != nil {
			return err
		}
	}
	if d.ExtentN > 0 {
		if err := e.l.SetIntrinsic(d.ExtentN, d.ExtentExtra, streams...); err != nil {
			return err
		}
	}
	return nil
}

func (e *mEnv) runArm(ctx context.Context, kb int, daemon bool, state string, measure time.Duration) (MatrixArm, error) {
	return e.runArmAs(ctx, kb, daemon, state, measure, e.sc.Start)
}

// runArmAs runs one arm under start condition start.
func (e *mEnv) runArmAs(ctx context.Context, kb int, daemon bool, state string, measure time.Duration, start string) (a MatrixArm, err error) {
	a = MatrixArm{Arm: Static(kb).Name, KB: kb, Daemon: daemon, FirstActionSec: -1}
	if daemon {
		a.Arm = Readaheadd.Name
	}
	if err := e.l.Clear(); err != nil {
		return a, err
	}
	for _, p := range e.allFiles() {
		if err := lab.DropFileCache(p); err != nil {
			return a, err
		}
	}
	if err := e.l.SetReadAheadKB(kb); err != nil {
		return a, err
	}
	defer func() {
		if e2 := e.l.Clear(); e2 != nil && err == nil {
			err = e2
		}
		if e2 := e.l.SetReadAheadKB(DefaultKB); e2 != nil && err == nil {
			err = e2
		}
	}()
	var cg *memcg
	if e.sc.MemoryMB > 0 {
		if cg, err = enterMemcg(e.sc.MemoryMB); err != nil {
			return a, err
		}
		defer func() {
			fc, e2 := cg.leave()
			a.MemFailcnt = fc
			if e2 != nil && err == nil {
				err = e2
			}
		}()
	}
	var d *Daemon
	startDaemon := func() error {
		if !daemon {
			return nil
		}
		start := func() error {
			var err error
			if d, err = StartDaemonState(ctx, e.cfg.DaemonBin, e.l.Name, e.l.Mount, e.work, state); err != nil {
				return err
			}
			a.DaemonLog = d.LogPath
			return nil
		}
		if cg != nil {
			return cg.outside(start)
		}
		return start()
	}
	defer func() {
		if d == nil {
			return
		}
		if e2 := d.Stop(); e2 != nil && err == nil {
			err = e2
		}
		if got, e2 := e.l.ReadAheadKB(); e2 == nil && got != DefaultKB && err == nil {
			err = fmt.Errorf("readaheadd left read_ahead_kb at %d after SIGTERM (want %d restored)", got, DefaultKB)
		}
	}()

	readers := make([]mreader, len(e.sc.Readers))
	for j, r := range e.sc.Readers {
		if r.Kind == lab.KHDFS {
			readers[j] = &mHDFS{c: e.hdfs, paths: e.hdfsPaths, clients: r.Clients}
			continue
		}
		readers[j] = newMReader(r, e.files[j], e.sc.Seed*131+uint64(j)+1)
	}
	rctx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	var wg sync.WaitGroup
	errs := make([]error, len(readers))
	startReaders := func() {
		for j, r := range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := r.run(rctx); err != nil {
					errs[j] = fmt.Errorf("reader %d (%s): %w", j, e.sc.Readers[j], err)
				}
			}()
		}
	}
	defer wg.Wait()
	defer stopReaders()
	sleep := func(dur time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(dur):
			return nil
		}
	}
	// The arm is measured from mStart: the bytes are counted from the same
	// instant, so a daemon's start-up inside the arm counts at the rate the
	// readers got meanwhile (counted after it, 1.3 s of start-up cost every
	// slow-before-daemon row 6% with no action taken).
	var mStart time.Time
	var b0, streams0 int64
	var dev0 uint64
	mark := func() {
		mStart = time.Now()
		b0, dev0, streams0 = e.delivered(readers), mustDev(e.l.Name), streamBytes(readers)
	}
	switch start {
	case lab.StartOnset:
		if err := startDaemon(); err != nil {
			return a, err
		}
		startReaders()
		if err := sleep(e.cfg.Warm); err != nil {
			return a, err
		}
		mark()
		if err := e.slow(); err != nil {
			return a, err
		}
	case lab.StartBeforeOpen:
		if err := e.slow(); err != nil {
			return a, err
		}
		if err := startDaemon(); err != nil {
			return a, err
		}
		if err := sleep(2 * time.Second); err != nil {
			return a, err
		}
		mark()
		startReaders()
	default: // slow before the daemon starts, with or without state
		if err := e.slow(); err != nil {
			return a, err
		}
		startReaders()
		if err := sleep(2 * time.Second); err != nil {
			return a, err
		}
		mark()
		if err := startDaemon(); err != nil {
			return a, err
		}
	}
	// Every arm measures the same span from mStart: a daemon's start-up
	// inside it shortens the rest, not lengthens the arm (a longer arm holds
	// more of a periodic slowdown, whose phase starts with e.slow: 7.9 s of
	// tail spikes in 21.5 s against 6.6 s in 20, and a reader's p99 1.43x).
	if err := sleep(time.Until(mStart.Add(measure))); err != nil {
		return a, err
	}
	el := time.Since(mStart)
	b1, dev1 := e.delivered(readers), mustDev(e.l.Name)
	streams1 := streamBytes(readers)
	for _, r := range readers {
		tl := r.touches()
		if tl == nil {
			continue
		}
		lat := tl.since(mStart)
		a.Randoms = append(a.Randoms, RandomFig{
			TouchesPerSec: float64(len(lat)) / el.Seconds(),
			P99ms:         ms(lab.Quantile(lat, 0.99)),
			P99PerSec:     tl.p99PerSecond(mStart),
		})
	}
	k := 0
	for _, r := range e.sc.Readers {
		if !r.Stream() {
			a.Randoms[k].Reader = r.String()
			k++
		}
	}
	stopReaders()
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return a, err
		}
	}
	a.Seconds = el.Seconds()
	a.StreamsMBps = float64(streams1-streams0) / el.Seconds() / 1e6
	a.DevMB = float64(dev1-dev0) / 1e6
	a.DeliveredMB = float64(b1-b0) / 1e6
	if a.DeliveredMB > 0 {
		a.Amp = a.DevMB / a.DeliveredMB
	}
	if d != nil {
		acts := d.Actions(mStart)
		for _, x := range acts {
			a.Actions++
			if x.At < 0 {
				a.ActionsBefore++
			} else if a.FirstActionSec < 0 {
				a.FirstActionSec = x.At.Seconds()
			}
		}
		a.Kept = keptInArm(acts)
		if len(acts) > 50 {
			acts = acts[:50]
		}
		a.ActionLog = acts
		u, err := d.Usage()
		if err != nil {
			return a, fmt.Errorf("readaheadd usage: %w", err)
		}
		a.CPUPct = u.CPUPercent()
	}
	return a, nil
}

// keptInArm counts the steps kept within the measured period, and those
// kept before it (a warm-up's) still in force at its start: one kept and
// undone before the period costs it nothing.
func keptInArm(acts []ActionRecord) int {
	type knob struct {
		base    int
		kept    bool
		inForce bool
	}
	before := map[string]*knob{}
	n := 0
	for _, x := range acts {
		if x.At >= 0 {
			if x.Result == "kept" {
				n++
			}
			continue
		}
		key := x.Target + "/" + strings.TrimSuffix(x.Action, "_undo")
		k := before[key]
		if k == nil {
			k = &knob{base: x.FromKB}
			before[key] = k
		}
		switch x.Result {
		case "kept":
			k.kept, k.inForce = true, true
		case "undone":
			k.inForce = x.ToKB != k.base
		}
	}
	for _, k := range before {
		if k.kept && k.inForce {
			n++
		}
	}
	return n
}

func (e *mEnv) delivered(rs []mreader) int64 {
	var n int64
	for _, r := range rs {
		n += r.delivered()
	}
	return n
}

func streamBytes(rs []mreader) int64 {
	var n int64
	for _, r := range rs {
		if r.touches() == nil {
			n += r.delivered()
		}
	}
	return n
}

// memcgRoot is the cgroup v1 memory hierarchy (this machine's); a v2-only
// host has none and the memcg scenarios fail with that said.
const memcgRoot = "/sys/fs/cgroup/memory"

// memcg is a memory cgroup this process runs in for one arm: the page
// cache its readers fault in is charged to it, so a limit of a few MB a
// stream makes 4096 KB windows thrash (pages read ahead are evicted
// before they are read). The process's own text and heap are charged too
// when touched, so the limit can also catch the harness: the cgroup's OOM
// killer is off, and a watchdog that allocates nothing moves the process
// out as soon as the cgroup is under OOM (the arm then reports it).
type memcg struct {
	dir      string
	stop     chan struct{}
	done     chan struct{}
	escaped  atomic.Bool
	rootFD   int
	oomFD    int
	pidBytes []byte
}

func enterMemcg(mb int) (*memcg, error) {
	if _, err := os.Stat(filepath.Join(memcgRoot, "memory.limit_in_bytes")); err != nil {
		return nil, fmt.Errorf("memory scenarios need the cgroup v1 memory controller at %s: %w", memcgRoot, err)
	}
	dir := filepath.Join(memcgRoot, fmt.Sprintf("readaheadd-matrix-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("create memory cgroup: %w", err)
	}
	m := &memcg{dir: dir, stop: make(chan struct{}), done: make(chan struct{}), rootFD: -1, oomFD: -1,
		pidBytes: []byte(strconv.Itoa(os.Getpid()))}
	fail := func(what string, err error) (*memcg, error) {
		m.closeFDs()
		os.Remove(dir)
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var err error
	if err = os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.Itoa(mb<<20)), 0); err != nil {
		return fail(fmt.Sprintf("set memory limit %d MB", mb), err)
	}
	if err = os.WriteFile(filepath.Join(dir, "memory.oom_control"), []byte("1"), 0); err != nil {
		return fail("turn the memory cgroup's OOM killer off", err)
	}
	if m.rootFD, err = unix.Open(filepath.Join(memcgRoot, "cgroup.procs"), unix.O_WRONLY, 0); err != nil {
		return fail("open the root memory cgroup", err)
	}
	if m.oomFD, err = unix.Open(filepath.Join(dir, "memory.oom_control"), unix.O_RDONLY, 0); err != nil {
		return fail("open memory.oom_control", err)
	}
	if err = os.WriteFile(filepath.Join(dir, "cgroup.procs"), m.pidBytes, 0); err != nil {
		return fail("enter memory cgroup", err)
	}
	go m.watch()
	return m, nil
}

// watch leaves the cgroup when it is under OOM (see memcg). No
// allocation: a blocked allocation must not be needed to get out.
func (m *memcg) watch() {
	defer close(m.done)
	buf := make([]byte, 256)
	key := []byte("under_oom 1")
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		n, err := unix.Pread(m.oomFD, buf, 0)
		if err != nil || !bytes.Contains(buf[:n], key) {
			continue
		}
		if _, err := unix.Write(m.rootFD, m.pidBytes); err == nil {
			m.escaped.Store(true)
			return
		}
	}
}

func (m *memcg) closeFDs() {
	if m.rootFD >= 0 {
		unix.Close(m.rootFD)
	}
	if m.oomFD >= 0 {
		unix.Close(m.oomFD)
	}
}

// run calls f outside the cgroup (starting the daemon: a child inherits
// its parent's cgroup, and the daemon is no reader).
func (m *memcg) outside(f func() error) error {
	if err := leaveMemcg(os.Getpid()); err != nil {
		return err
	}
	err := f()
	if m.escaped.Load() {
		return err
	}
	if e := os.WriteFile(filepath.Join(m.dir, "cgroup.procs"), m.pidBytes, 0); e != nil && err == nil {
		err = fmt.Errorf("enter memory cgroup again: %w", e)
	}
	return err
}

func leaveMemcg(pid int) error {
	if err := os.WriteFile(filepath.Join(memcgRoot, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("move %d back to the root memory cgroup: %w", pid, err)
	}
	return nil
}

// leave moves this process back to the root cgroup, removes the cgroup and
// returns how often it hit its limit; an error if the harness itself ran
// out of memory in it.
func (m *memcg) leave() (uint64, error) {
	close(m.stop)
	<-m.done
	m.closeFDs()
	err := leaveMemcg(os.Getpid())
	var fc uint64
	if b, e := os.ReadFile(filepath.Join(m.dir, "memory.failcnt")); e == nil {
		fc, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	// The charges left in it move to the parent on removal; an emptied
	// cgroup can take a moment to release.
	var rerr error
	for i := 0; i < 50; i++ {
		if rerr = os.Remove(m.dir); rerr == nil || os.IsNotExist(rerr) {
			rerr = nil
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err == nil && rerr != nil {
		err = fmt.Errorf("remove memory cgroup %s: %w", m.dir, rerr)
	}
	if err == nil && m.escaped.Load() {
		err = fmt.Errorf("the harness ran out of memory in the scenario's memory cgroup (%s): raise lab's memcgMB", m.dir)
	}
	return fc, err
}
