package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/config"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/failslow"
	"github.com/readaheadd/readaheadd/pkg/fileras"
	"github.com/readaheadd/readaheadd/pkg/metrics"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/sdnotify"
	"github.com/readaheadd/readaheadd/pkg/state"
	"github.com/readaheadd/readaheadd/pkg/tuner"
)

// runEnv is what `run` touches outside the process; tests replace parts.
type runEnv struct {
	sys          blockdev.SysFS
	clk          clock.Clock
	openProbe    func(probe.Config) (probe.Source, error)
	signals      func(ctx context.Context) (context.Context, context.CancelFunc)
	notify       func(state string) (bool, error)
	onListen     func(net.Addr) // tests learn the metrics address
	stderr       io.Writer
	bootID       string // state.Options.BootID override for tests
	capStatus    string // /proc/self/status, for the capability check; "" skips it
	newControl   func(controlDeps) (controller, error)
	ringBytes    int                    // probe.Config.RingBytes; 0 is the probe's default
	sampleBudget int                    // probe.Config.SampleBudget; 0 is the probe's default, negative never samples
	dropCaps     func(keep []int) error // nil keeps every capability (tests in-process)
	yieldCPU     func(nice int) error   // nil keeps the niceness (tests in-process)
	// openRA loads the iterator of open files' readahead state; nil: none.
	openRA func() (*fileras.Iter, error)
}

func defaultRunEnv() runEnv {
	return runEnv{
		sys: blockdev.SysFS{},
		clk: clock.Monotonic{},
		openProbe: func(c probe.Config) (probe.Source, error) {
			p, err := probe.Load(c)
			if err != nil {
				return nil, err
			}
			return p, nil
		},
		signals: func(ctx context.Context) (context.Context, context.CancelFunc) {
			return signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
		},
		notify:     sdnotify.Notify,
		stderr:     os.Stderr,
		capStatus:  "/proc/self/status",
		newControl: newController,
		dropCaps:   dropCapabilities,
		yieldCPU:   yieldCPU,
		openRA:     fileras.Open,
	}
}

func newRunCmd(env runEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: trace block reads, detect slowdowns, adapt readahead, export metrics",
		Long: `Run the daemon. Flags can also be given in a YAML file (--config) whose keys
are the flag names; flags given on the command line win. Invalid flags or
configuration exit with code 2 before anything is changed on the machine.`,
		Args: noArgs,
	}
	flags := config.AddFlags(cmd.Flags())
	// Hidden: the ring size only matters to tests that make it overflow.
	ringKB := cmd.Flags().Int("probe-ring-kb", 0, "BPF ring buffer size in KiB (a power of two, at least a page; 0: 4096)")
	_ = cmd.Flags().MarkHidden("probe-ring-kb")
	// Hidden: tests that need every request streamed (to overflow the ring).
	sampleBudget := cmd.Flags().Int("probe-sample-budget", 0, "samplable requests (under 32 KiB, or not read for a file) per second and disk streamed before the probe samples them 1 in N (0: 4096; negative: never sample)")
	_ = cmd.Flags().MarkHidden("probe-sample-budget")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if *ringKB < 0 || *ringKB > 1<<20 || *ringKB&(*ringKB-1) != 0 || *ringKB != 0 && *ringKB*1024 < os.Getpagesize() {
			return usageErrorf("probe-ring-kb %d: must be 0 or a power of two from the page size up to 1048576", *ringKB)
		}
		env.ringBytes = *ringKB * 1024
		env.sampleBudget = *sampleBudget
		c, err := flags.Config()
		if err != nil {
			return usageError{err}
		}
		v, err := config.Validate(c, env.sys)
		if err != nil {
			return usageError{err}
		}
		return runDaemon(cmd.Context(), v, env)
	}
	return cmd
}

func newLogger(w io.Writer, v config.Validated) *slog.Logger {
	opts := &slog.HandlerOptions{Level: v.Level}
	if v.LogFormat == config.LogJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// controlDeps is what a controller is built from.
type controlDeps struct {
	cfg   config.Validated
	sys   blockdev.SysFS
	clk   clock.Clock
	store *state.Store
	log   *slog.Logger
	names func(probe.Dev) string
	ra    *fileras.Iter // nil: the kernel's per-file state is not readable
	// around: the probe's reports of read-arounds on trimmed files (nil
	// when the probe has none).
	around tuner.ReadAroundWatch
}

// controller is the probe -> detector -> tuner loop behind one seam: it is
// fed every probe event (from the probe's goroutine), stepped every
// interval, read by the metrics endpoints, and asked to put everything back
// on exit.
type controller interface {
	probe.Handler
	// Step evaluates at monotonic time now and acts on what it finds.
	Step(now time.Duration)
	// Snapshot is the latest evaluation, false before the first.
	Snapshot() (detector.Snapshot, bool)
	// TunerStatus reports windows, originals and actions.
	TunerStatus() metrics.TunerStatus
	// ApplyPending reaches readers that opened a file after its decision;
	// called more often than Step, since HDFS opens a block file per read.
	ApplyPending()
	// FilePath names a file for display, "" if unknown.
	FilePath(probe.FileKey) string
	// RestoreAll undoes every change the controller made (and saves what
	// it learned that outlives a restart).
	RestoreAll() error
}

func runDaemon(parent context.Context, v config.Validated, env runEnv) error {
	if parent == nil {
		parent = context.Background()
	}
	log := newLogger(env.stderr, v)
	slog.SetDefault(log)

	// Bind first: a metrics address in use must fail before anything changes.
	var ln net.Listener
	if v.MetricsAddr != "" {
		var err error
		if ln, err = metrics.Listen(v.MetricsAddr); err != nil {
			return err
		}
		defer ln.Close()
		if env.onListen != nil {
			env.onListen(ln.Addr())
		}
	}

	// Without the capabilities for BPF tracing nothing below can work: say
	// which are missing before anything is written.
	if env.capStatus != "" {
		if err := requireTracingCaps(env.capStatus); err != nil {
			return err
		}
	}
	if env.yieldCPU != nil {
		if err := env.yieldCPU(v.Nice); err != nil {
			// Not fatal: a system call filter may forbid it (the unit sets Nice= itself).
			log.Warn("the daemon's CPU priority is left as started", "err", err)
		}
	}

	names := map[probe.Dev]string{}
	devs := make([]probe.Dev, 0, len(v.Disks))
	for _, d := range v.Disks {
		names[d.Dev] = d.Name
		devs = append(devs, d.Dev)
	}
	devName := func(d probe.Dev) string {
		if n, ok := names[d]; ok {
			return n
		}
		if disk, err := env.sys.DiskOf(d); err == nil {
			return disk.Name
		}
		return ""
	}
	if len(devs) > probe.MaxDevices {
		devs = nil // more than the kernel filter holds: trace all; the tuner still acts only on the configured devices
	}
	// The records are collected when an evaluation is due (flush, every
	// fast-path tick) and otherwise every eventPoll: the first readahead
	// of a file (a fresh open, which gets the window that paid for its
	// neighbours) and a filling ring wake the collection at once. The
	// wait between collections sleeps in the runtime's poller: a blocking
	// epoll_wait per poll cost the daemon 2-3x the CPU at high IOPS.
	src, err := env.openProbe(probe.Config{Devices: devs, RingBytes: env.ringBytes, SampleBudget: env.sampleBudget, Poll: eventPoll, PollerWait: true})
	if err != nil {
		return fmt.Errorf("attach the BPF probe: %w (run `readaheadd check` for details)", err)
	}
	defer src.Close()

	store, err := state.Open(v.StateDir, stateOptions(v, env.sys, log, env.bootID))
	if err != nil {
		return err
	}
	defer store.Close()
	// A previous run that was killed left its changes recorded: undo them
	// before anything else, so that originals are originals.
	if err := store.Restore(env.sys); err != nil {
		return fmt.Errorf("restore settings left by a previous run: %w", err)
	}

	// The kernel's per-file readahead state: lowerings that reach readers
	// already streaming, and the windows really in force in status and
	// metrics. Loaded before the tuner, which resets windows left by a
	// crashed run as it starts.
	var ra *fileras.Iter
	if env.openRA != nil {
		if ra, err = env.openRA(); err != nil {
			log.Warn("the open files' readahead iterator is not available: a lowered window will not reach a reader already streaming on a larger one, and status shows only the windows readaheadd set", "err", err)
			ra = nil
		} else {
			defer ra.Close()
		}
	}

	deps := controlDeps{cfg: v, sys: env.sys, clk: env.clk, store: store, log: log, names: devName, ra: ra}
	if w, ok := src.(tuner.ReadAroundWatch); ok {
		deps.around = w
	}
	ctl, err := env.newControl(deps)
	if err != nil {
		return err
	}
	// Everything that needs CAP_BPF and CAP_PERFMON is loaded and attached:
	// keep only what running needs.
	if env.dropCaps != nil {
		if err := env.dropCaps(runtimeCaps); err != nil {
			log.Warn("capabilities not dropped after attaching: the daemon keeps all it was started with", "err", err)
		} else if caps, err := effectiveCaps("/proc/self/status"); err == nil {
			log.Info("capabilities dropped after attaching", "kept", capNames(caps))
		}
	}
	d := &daemonState{clk: env.clk, interval: v.Interval}
	d.attached.Store(true)

	ctx, stop := env.signals(parent)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	errc := make(chan error, 3)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := src.Run(ctx, ctl); err != nil {
			d.attached.Store(false)
			errc <- fmt.Errorf("probe stopped: %w", err)
		}
	}()

	sources := metrics.Sources{
		Probe: func() metrics.ProbeStats {
			return probeStats(src, d.attached.Load(), devName, log)
		},
		Detector:   ctl.Snapshot,
		Tuner:      ctl.TunerStatus,
		DeviceName: devName,
		FilePath:   ctl.FilePath,
	}
	if ra != nil {
		keep := map[string]bool{}
		for _, d := range v.Disks {
			keep[d.Name] = true
		}
		sources.OpenFiles = openFiles(ra, env.sys, keep, log)
	}
	if fc, ok := ctl.(interface{ FailSlow() []failslow.Disk }); ok {
		sources.FailSlow = fc.FailSlow
	}
	if fc, ok := ctl.(interface{ DetectorFiles() (int, uint64) }); ok {
		sources.DetectorFiles = fc.DetectorFiles
	}
	if ln != nil {
		srv := metrics.NewServer(sources, metrics.NewRegistry(sources), d.health, version, log)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(ctx, ln); err != nil {
				errc <- err
			}
		}()
	}

	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(v.Interval)
		defer t.Stop()
		// The detector's fast path (and the tuner's pending re-applications).
		pending := time.NewTicker(detector.FastPathInterval(v.Interval))
		defer pending.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				flush(ctx, src)
				now := env.clk.Now()
				ctl.Step(now)
				d.stepped(now)
			case <-pending.C:
				flush(ctx, src)
				ctl.ApplyPending()
			}
		}
	}()

	log.Info("readaheadd running", "devices", v.Devices, "os_disk", v.OSDisk, "allow_paths", v.AllowPaths, "metrics_addr", v.MetricsAddr,
		"state_dir", v.StateDir, "max_read_ahead_kb", v.MaxReadAheadKB, "interval", v.Interval, "dry_run", v.DryRun)
	if _, err := env.notify(sdnotify.Ready + "\n" + sdnotify.Status("watching %d device(s)", len(v.Disks))); err != nil {
		log.Warn("systemd notification failed", "error", err)
	}

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("stopping: restoring every setting readaheadd changed")
	case runErr = <-errc:
		log.Error("stopping after a failure; restoring every setting readaheadd changed", "error", runErr)
	}
	if _, err := env.notify(sdnotify.Stopping); err != nil {
		log.Warn("systemd notification failed", "error", err)
	}
	cancel()
	wg.Wait()

	// Restore after the loop has stopped, so that nothing acts afterwards.
	restoreErr := errors.Join(ctl.RestoreAll(), store.Restore(env.sys))
	if restoreErr != nil {
		log.Error("restore incomplete; the state directory keeps what is left for `readaheadd restore`", "error", restoreErr, "state_dir", v.StateDir)
	} else {
		log.Info("restored; exiting")
	}
	return errors.Join(runErr, restoreErr)
}

// stateOptions opens the state directory so that restore writes only to
// the disks this configuration tunes.
func stateOptions(v config.Validated, sys blockdev.SysFS, log *slog.Logger, bootID string) state.Options {
	tunable := map[string]bool{}
	for _, d := range v.Disks {
		tunable[d.Name] = true
	}
	return state.Options{
		Logger: log, BootID: bootID, DiskSeq: sys.DiskSeq, DevOf: state.DevOfSysfs(sys),
		Tunable:   func(name string) bool { return tunable[name] },
		Protected: func(name string) bool { return name == v.OSDisk },
	}
}

// eventPoll is how often the daemon collects the probe's records when no
// evaluation asks for them first (flush) and nothing wakes it: twice the
// fast path's tick, so that the ticks' flushes do the collecting. Measured
// idle: a 20 ms poll alone cost 2.3% of a core, a 100 ms one 0.7%.
const eventPoll = 200 * time.Millisecond

// flushWait bounds how long an evaluation waits for the records before it.
const flushWait = 20 * time.Millisecond

// flush collects the probe's records before an evaluation, so that it sees
// every record up to now although the probe is collected only every
// eventPoll otherwise. A source that cannot flush is left as it is.
func flush(ctx context.Context, src probe.Source) {
	f, ok := src.(interface{ Flush(context.Context) error })
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, flushWait)
	defer cancel()
	_ = f.Flush(ctx) // late records are seen at the next evaluation
}

// daemonState tracks health.
type daemonState struct {
	clk      clock.Clock
	interval time.Duration
	mu       sync.Mutex
	last     time.Duration
	attached atomic.Bool
}

func (d *daemonState) stepped(now time.Duration) {
	d.mu.Lock()
	d.last = now
	d.mu.Unlock()
}

// health is nil while the probe is attached and the loop evaluated within
// the last three intervals (plus a second of scheduling slack).
func (d *daemonState) health() error {
	if !d.attached.Load() {
		return errors.New("probe not attached")
	}
	d.mu.Lock()
	last := d.last
	d.mu.Unlock()
	if last == 0 {
		return errors.New("detector has not evaluated yet")
	}
	if age := d.clk.Now() - last; age > 3*d.interval+time.Second {
		return fmt.Errorf("detector stale: last evaluation %s ago", age.Round(time.Millisecond))
	}
	return nil
}

// probeStats converts the probe's aggregates for the metrics collector.
func probeStats(src probe.Source, attached bool, name func(probe.Dev) string, log *slog.Logger) metrics.ProbeStats {
	ps := metrics.ProbeStats{Attached: attached}
	st, err := src.Stats()
	if err != nil {
		log.Warn("read probe statistics", "error", err)
		ps.Attached = false
		return ps
	}
	for dev, d := range st.Devices {
		n := name(dev)
		if n == "" {
			continue // not a disk this machine knows (gone, or not watched)
		}
		ps.Devices = append(ps.Devices, metrics.DeviceIO{
			Device: n, LatencyLog2US: append([]uint64(nil), d.Hist[:]...),
			LatencySum: d.LatencySum, Bytes: d.Bytes, Requests: d.Requests,
			SampleEvery: d.SampleEvery,
		})
	}
	ps.EventsLost = st.Lost.Total()
	ps.ProgramRunTime, ps.ProgramMisses = map[string]time.Duration{}, map[string]uint64{}
	for p, s := range st.Programs {
		ps.ProgramRunTime[p] = s.RunTime
		ps.ProgramMisses[p] = s.Misses
	}
	return ps
}

// noArgs rejects positional arguments as a usage error (exit code 2).
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unexpected argument %q for %q: it takes flags only (see --help)", args[0], cmd.CommandPath())
	}
	return nil
}

// requireTracingCaps fails, naming what is missing, when the process cannot
// load BPF tracing programs (CAP_BPF with CAP_PERFMON, or CAP_SYS_ADMIN).
func requireTracingCaps(statusPath string) error {
	caps, err := effectiveCaps(statusPath)
	if err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	has := func(n int) bool { return caps&(1<<n) != 0 }
	if has(capSysAdmin) || has(capBPF) && has(capPerfmon) {
		return nil
	}
	var missing []string
	if !has(capBPF) {
		missing = append(missing, "CAP_BPF")
	}
	if !has(capPerfmon) {
		missing = append(missing, "CAP_PERFMON")
	}
	return fmt.Errorf("missing %s: readaheadd needs CAP_BPF and CAP_PERFMON to trace block reads; run it as root (the systemd unit and the DaemonSet grant them), and `readaheadd check` lists everything it needs",
		strings.Join(missing, " and "))
}
