package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/failslow"
	"github.com/readaheadd/readaheadd/pkg/metrics"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
	"github.com/readaheadd/readaheadd/pkg/tuner"
)

// pipeline is the production controller: probe records feed the detector,
// readahead events feed the tuner, and every interval the detector's
// snapshot drives one tuner step.
type pipeline struct {
	det   *detector.Detector
	tun   *tuner.Tuner
	clk   clock.Clock
	log   *slog.Logger
	sys   blockdev.SysFS
	disks []blockdev.Disk

	// The detector's healthy baseline is kept in the state directory so
	// that a slowdown already present at the next start is still seen as one.
	baselinePath string
	lastSave     time.Duration

	// Display paths for the debug endpoints: only the paths the tuner
	// resolved and checked against the allow-paths, copied from it at most
	// once per pathsEvery, so that a request never walks /proc and rarely
	// takes the tuner's lock.
	allow   []string
	pathsMu sync.Mutex
	paths   map[probe.FileKey]string
	pathsAt time.Duration

	mu     sync.Mutex
	snap   detector.Snapshot
	have   bool
	counts map[[3]string]uint64 // device, action, result
	// Regimes active at the last Step, to log each entry and exit once.
	regimes map[regimeID]bool

	// Fail-slow verdicts, judged on each Step's snapshot.
	judge *failslow.Judge
	slow  []failslow.Disk
	names func(probe.Dev) string // device names for logs; may be nil
	// paths of slow files the tuner did not resolve (under the allow-paths)
	inodes *inodePaths
}

type regimeID struct {
	kind detector.RegimeKind
	dev  probe.Dev
	file probe.FileKey
}

// logRegimes logs, at INFO, each regime that was entered or cleared since
// the last Step, with its evidence: the log alone then tells why every
// action that follows was taken.
func (p *pipeline) logRegimes(snap detector.Snapshot) {
	now := make(map[regimeID]bool, len(snap.Regimes))
	for _, r := range snap.Regimes {
		id := regimeID{r.Kind, r.Device, r.File}
		now[id] = true
		if !p.regimes[id] {
			attrs := []any{"regime", r.Kind, "device", r.Device.String(), "confidence", r.Confidence, "evidence", r.Evidence}
			if !r.File.IsZero() {
				attrs = append(attrs, "file", r.File.String())
			}
			p.log.Info("detector: regime entered", attrs...)
		}
	}
	for id := range p.regimes {
		if !now[id] {
			attrs := []any{"regime", id.kind, "device", id.dev.String()}
			if !id.file.IsZero() {
				attrs = append(attrs, "file", id.file.String())
			}
			p.log.Info("detector: regime cleared", attrs...)
		}
	}
	p.regimes = now
}

// logFailSlow logs, at WARN, each disk named fail-slow and each one
// cleared since the last Step.
func (p *pipeline) logFailSlow(prev, cur []failslow.Disk) {
	was := map[probe.Dev]bool{}
	for _, d := range prev {
		was[d.Device] = d.Slow
	}
	for _, d := range cur {
		name := d.Device.String()
		if p.names != nil {
			if n := p.names(d.Device); n != "" {
				name = n
			}
		}
		switch {
		case d.Slow && !was[d.Device]:
			p.log.Warn("fail-slow disk: reads slower than its reference for the hold time", "device", name,
				"ratio", fmt.Sprintf("%.2f", d.Held), "reference", string(d.Reference), "requests", d.Requests)
		case !d.Slow && was[d.Device]:
			p.log.Info("fail-slow disk cleared", "device", name, "ratio", fmt.Sprintf("%.2f", d.Held), "reference", string(d.Reference))
		}
	}
}

// debugFailSlow logs each disk's verdict with the latency profile it was
// judged on (class/depth bucket: requests, p10, p50 in ms, mean depth).
func (p *pipeline) debugFailSlow(snap detector.Snapshot, slow []failslow.Disk) {
	prof := map[probe.Dev]string{}
	for _, d := range snap.Devices {
		var b strings.Builder
		for _, c := range d.Profile {
			fmt.Fprintf(&b, " c%d/d%d:%d,%.2f,%.2f,%.1f", c.Class, c.Depth, c.Requests, ms(c.P10), ms(c.P50), c.MeanDepth)
		}
		b.WriteString(" unqueued:")
		for _, c := range d.Unqueued {
			fmt.Fprintf(&b, " c%d:%d,%.2f", c.Class, c.Requests, ms(c.P10))
		}
		prof[d.Device] = b.String()
	}
	for _, d := range slow {
		p.log.Debug("fail-slow verdict", "device", d.Device.String(), "ratio", fmt.Sprintf("%.2f", d.Ratio), "held", fmt.Sprintf("%.2f", d.Held),
			"reference", string(d.Reference), "basis", d.Basis, "requests", d.Requests, "over", d.Over, "slow", d.Slow,
			"slow_files", len(d.SlowFiles), "profile", prof[d.Device])
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// resolveSlowFiles looks for the paths of files named slower than their
// disk that the tuner has not resolved, under the allow-paths only.
func (p *pipeline) resolveSlowFiles(slow []failslow.Disk) {
	var keys []probe.FileKey
	for _, d := range slow {
		for _, f := range d.SlowFiles {
			if p.FilePath(f.Key) == "" {
				keys = append(keys, f.Key)
			}
		}
	}
	if len(keys) > 0 {
		p.inodes.Want(keys, nil)
	}
}

// FailSlow is the latest fail-slow verdict per disk.
func (p *pipeline) FailSlow() []failslow.Disk {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.slow
}

// BaselineFile is the detector's learned baseline in the state directory.
const BaselineFile = "baseline.json"

// baselineSaveEvery bounds what a crash loses of the learned baseline; it
// adapts slowly, so minutes are plenty.
const baselineSaveEvery = time.Minute

func newController(d controlDeps) (controller, error) {
	dc := detector.DefaultConfig()
	// One detection window per evaluation, so a regime can be entered at
	// the first evaluation after its onset.
	dc.Window = d.cfg.Interval
	if dc.LongWindow < 10*d.cfg.Interval {
		dc.LongWindow = 10 * d.cfg.Interval
	}
	if err := dc.Validate(); err != nil {
		return nil, err
	}
	tc := tuner.Config{
		Devices:    d.cfg.Devices,
		AllowPaths: d.cfg.AllowPaths,
		MaxKB:      d.cfg.MaxReadAheadKB,
		DryRun:     d.cfg.DryRun,
		// Measure an action over at least one full detection window.
		Settle: d.cfg.Interval,
	}
	tun, err := tuner.New(tc, tuner.Deps{
		Sysfs: d.sys, Files: fileOps(d.ra), States: raStates(d.ra), Around: d.around, Clock: d.clk, Store: d.store, Logger: d.log,
	})
	if err != nil {
		return nil, err
	}
	judge, err := failslow.New(failslow.DefaultConfig())
	if err != nil {
		return nil, err
	}
	p := &pipeline{det: detector.New(dc), tun: tun, judge: judge, names: d.names, inodes: newInodePaths(d.cfg.AllowPaths), allow: d.cfg.AllowPaths, clk: d.clk, log: d.log, sys: d.sys, disks: d.cfg.Disks,
		counts: map[[3]string]uint64{}, baselinePath: filepath.Join(d.cfg.StateDir, BaselineFile), lastSave: d.clk.Now()}
	switch err := p.loadBaseline(); {
	case err == nil:
		d.log.Info("loaded the detector's healthy baseline", "file", p.baselinePath)
	case errors.Is(err, fs.ErrNotExist):
		d.log.Info("no saved detector baseline: learning one while devices are healthy", "file", p.baselinePath)
	default:
		// Not fatal: the baseline is relearned, and the next save replaces the bad file.
		d.log.Warn("ignoring the saved detector baseline; learning afresh", "err", err)
	}
	return p, nil
}

// maxBaselineBytes bounds the baseline file (a few hundred bytes per disk).
const maxBaselineBytes = 1 << 20

// loadBaseline reads the detector's baseline like every state file: not
// through a symlink, and bounded.
func (p *pipeline) loadBaseline() error {
	data, err := state.ReadFileBounded(filepath.Dir(p.baselinePath), filepath.Base(p.baselinePath), maxBaselineBytes)
	if err != nil {
		return fmt.Errorf("load detector baseline: %w", err)
	}
	return p.det.LoadBaselineData(p.baselinePath, data)
}

// saveBaseline writes the detector's baseline; a failure is logged, since
// the daemon works without it (it relearns after a restart).
func (p *pipeline) saveBaseline() {
	data, err := p.det.BaselineData()
	if err == nil {
		err = state.WriteFileAtomic(filepath.Dir(p.baselinePath), filepath.Base(p.baselinePath), data, true)
	}
	if err != nil {
		p.log.Warn("could not save the detector baseline", "err", err)
	}
}

func (p *pipeline) HandleRecord(r probe.Record) { p.det.Observe(r) }

func (p *pipeline) HandleReadahead(e probe.ReadaheadEvent) {
	p.tun.ObserveReadahead(e)
}

func (p *pipeline) Step(now time.Duration) {
	snap := p.det.Evaluate(now)
	slow := p.judge.Update(snap)
	p.mu.Lock()
	p.snap, p.have = snap, true
	prev := p.slow
	p.slow = slow
	p.mu.Unlock()
	p.logRegimes(snap)
	p.logFailSlow(prev, slow)
	p.resolveSlowFiles(slow)
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		p.debugFailSlow(snap, slow)
	}
	p.count(p.tun.Step(snap))
	if now-p.lastSave >= baselineSaveEvery {
		p.lastSave = now
		p.saveBaseline()
	}
}

// activeRegimes lists the regimes logged as active.
func (p *pipeline) activeRegimes() []detector.Regime {
	out := make([]detector.Regime, 0, len(p.regimes))
	for id := range p.regimes {
		out = append(out, detector.Regime{Kind: id.kind, Device: id.dev, File: id.file})
	}
	return out
}

// ApplyPending runs between Steps (every ~100 ms): the detector's fast path
// for strongly slowed files that have no regime yet (a block file the
// DataNode has just opened), then the tuner's Tick, which acts on those
// and checks the streams it watches on their recent requests.
func (p *pipeline) ApplyPending() {
	fast := p.det.FastPath(p.clk.Now())
	if len(fast.Regimes) > 0 {
		p.logRegimes(detector.Snapshot{Regimes: append(p.activeRegimes(), fast.Regimes...)})
	}
	p.count(p.tun.Tick(fast, func(span time.Duration, keys []probe.FileKey) detector.Snapshot {
		return p.det.Recent(p.clk.Now(), span, keys)
	}))
}

// count accumulates actions for readaheadd_actions_total: the action label
// is the knob (an undo counts under its knob with result "undone").
func (p *pipeline) count(acts []tuner.Action) {
	if len(acts) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range acts {
		p.counts[[3]string{a.Device, strings.TrimSuffix(string(a.Kind), "_undo"), string(a.Result)}]++
	}
}

func (p *pipeline) Snapshot() (detector.Snapshot, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.snap, p.have
}

// DetectorFiles is the size of the detector's file table and how many
// files it has dropped, for the metrics that show it stays bounded.
func (p *pipeline) DetectorFiles() (int, uint64) { return p.det.TrackedFiles(), p.det.Evicted() }

func (p *pipeline) TunerStatus() metrics.TunerStatus {
	st := p.tun.Status()
	ts := metrics.TunerStatus{DryRun: st.DryRun, Errors: map[string]uint64{
		metrics.ErrFileOp: st.FileOpFailures, metrics.ErrOutOfScope: st.OutOfScope, metrics.ErrRateLimited: st.RateLimited,
	}, Control: map[string]uint64{}}
	for e, n := range st.Events {
		ts.Control[e.String()] = n
	}
	ts.Repeated = st.Repeated
	for _, d := range st.Devices {
		ts.Devices = append(ts.Devices, metrics.DeviceState{
			Name: d.Device, Dev: d.Dev.String(), ReadAheadKB: d.CurrentKB, OriginalKB: d.OriginalKB, FilesAdjusted: d.FilesAdjusted,
		})
	}
	// Devices the tuner has not touched yet are at their original window.
	known := map[string]bool{}
	for _, d := range ts.Devices {
		known[d.Name] = true
	}
	for _, d := range p.disks {
		if known[d.Name] {
			continue
		}
		kb, err := p.sys.ReadAheadKB(d.Name)
		if err != nil {
			continue // gone: nothing to export
		}
		ts.Devices = append(ts.Devices, metrics.DeviceState{Name: d.Name, Dev: d.Dev.String(), ReadAheadKB: kb, OriginalKB: kb})
	}
	p.mu.Lock()
	for k, n := range p.counts {
		ts.Actions = append(ts.Actions, metrics.ActionCount{Device: k[0], Action: k[1], Result: k[2], Count: n})
	}
	p.mu.Unlock()
	// Monotonic action times to wall-clock time for display.
	wallNow, monoNow := time.Now(), p.clk.Now()
	for _, a := range st.Recent {
		ma := metrics.Action{
			Time: wallNow.Add(a.Time - monoNow), Device: a.Device, Action: string(a.Kind),
			FromKB: a.FromKB, ToKB: a.ToKB, Result: string(a.Result), Evidence: a.Evidence,
		}
		if !a.File.IsZero() {
			ma.Target = a.File.String()
			if inAllowPaths(a.Path, p.allow) {
				ma.Target = a.Path
			}
		}
		// The tuner's evidence for a judged step is its measurement.
		switch a.Result {
		case tuner.ResultKept, tuner.ResultUndone, tuner.ResultFailed:
			ma.Effect = a.Evidence
		}
		ts.Recent = append(ts.Recent, ma)
	}
	return ts
}

// pathsEvery bounds how often a debug request copies paths from the tuner.
const pathsEvery = time.Second

// FilePath names a file for /debug/files and status: the path the tuner
// resolved for it and checked against the allow-paths, "" for any other
// file (the endpoint then shows device:inode). Paths of files outside the
// allow-paths are not shown, and no other process's descriptors are read
// to find one.
func (p *pipeline) FilePath(k probe.FileKey) string {
	p.pathsMu.Lock()
	defer p.pathsMu.Unlock()
	if now := p.clk.Now(); p.paths == nil || now-p.pathsAt >= pathsEvery {
		paths := map[probe.FileKey]string{}
		for _, f := range p.tun.Status().Files {
			if inAllowPaths(f.Path, p.allow) {
				paths[f.File] = f.Path
			}
		}
		p.paths, p.pathsAt = paths, now
	}
	if path := p.paths[k]; path != "" {
		return path
	}
	if p.inodes != nil {
		if path := p.inodes.Path(k); inAllowPaths(path, p.allow) {
			return path
		}
	}
	return ""
}

// inAllowPaths reports whether path lies under one of the allow-paths.
func inAllowPaths(path string, allow []string) bool {
	if path == "" || !filepath.IsAbs(path) {
		return false
	}
	path = filepath.Clean(path)
	for _, a := range allow {
		if a == "/" || path == a || strings.HasPrefix(path, a+"/") {
			return true
		}
	}
	return false
}

func (p *pipeline) RestoreAll() error {
	p.saveBaseline()
	if err := p.tun.RestoreAll(); err != nil {
		return fmt.Errorf("tuner restore: %w", err)
	}
	return nil
}
