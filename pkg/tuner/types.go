package tuner

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
)

// Config bounds what the tuner may do. Zero fields take the defaults below.
type Config struct {
	// Devices the tuner may act on, by name in /sys/block; empty: any.
	Devices []string
	// AllowPaths are directories whose files may get per-file actions (the
	// DataNode's data directories, say). Each covers only the filesystem
	// it is on. Empty: no per-file actions, device-wide ones only.
	AllowPaths []string
	// MaxKB caps every window, device or file (default 4096).
	MaxKB int
	// Growth multiplies the window at each escalation step (default 2).
	Growth int
	// FirstStepFactor: the first step of a stream found bound by its window,
	// with no regime to size it, is at least this many times the device's
	// window (default 8). Its Little's-law hint undershoots where the capacity
	// is not known, and a window that only just covers the latency leaves the
	// stream short (from 4x the next step gains less than a keep margin).
	FirstStepFactor int
	// Margin is the relative busy-throughput gain an action must bring to
	// be kept (default 0.10).
	Margin float64
	// DeviceMargin is the gain a device-wide window step must bring to be
	// kept (default 0.20): larger than Margin, since a device-wide change
	// reaches every later reader of the device, not only the one measured.
	DeviceMargin float64
	// Settle is how long after an action its effect is measured (default
	// 1s). Set it to at least the detector's window so the measurement
	// covers only the new setting.
	Settle time.Duration
	// BackoffBase and BackoffMax bound the exponential back-off after an
	// action that did not pay (defaults 2s and 5m). At a knee the tuner
	// waits BackoffMax before probing one step further again.
	BackoffBase, BackoffMax time.Duration
	// Grace is how long no regime may apply to a target before its
	// actions are undone (default 10s).
	Grace time.Duration
	// DeviceMinFiles and DeviceFileFraction: a device-wide window is tried
	// when at least this many files, and this share of the files read on
	// the device, need a larger window (defaults 4 and 0.5).
	DeviceMinFiles     int
	DeviceFileFraction float64
	// SysfsWritesPerSec and SysfsBurst rate-limit read_ahead_kb writes per
	// device (defaults 10/s, burst 4). A raise-pin-restore takes two.
	SysfsWritesPerSec float64
	SysfsBurst        int
	// PrefetchStartKB and PrefetchMaxKB bound how far ahead of a
	// sequential reader prefetch runs (defaults 2048 and 16384).
	PrefetchStartKB, PrefetchMaxKB int
	// PrefetchBytesPerSec is each device's prefetch budget (default 64 MiB/s).
	PrefetchBytesPerSec float64
	// MinSequentiality is the least FileStats.Sequentiality for a file
	// window step or prefetch (default 0.6): more readahead only helps a
	// sequential reader, and costs a random one.
	MinSequentiality float64
	// CapacityFrac: once a file's busy throughput is at least this share of
	// its device's capacity (capacity.go), no further window step or prefetch
	// is tried for it (default 0.9). A stream with no random reader beside it
	// is tried up to 1/(1+Margin/2) if more: such a step pays at half the margin.
	CapacityFrac float64
	// ReprobeAfter: a file window kept this long is dropped back to the
	// device's window for ReprobeHold to learn whether its regime is over
	// (default 1m, doubled after each that found it still there, up to
	// BackoffMax): a window that saturates the device hides whether it is.
	ReprobeAfter time.Duration
	// ReprobeHold is how long a re-probe holds the device's window before
	// restoring the kept one if the regime persists (default 5 x Settle: the
	// detector needs two evaluations below its exit threshold, the first may
	// still hold the large window's queue, and the clocks are not in phase).
	ReprobeHold time.Duration
	// DryRun logs and reports what would be done without writing anything.
	DryRun bool
	// DisablePrefetch turns the prefetch actuator off.
	DisablePrefetch bool
	// TrimKB is the window given to the open files of a random reader whose
	// reads are read-around sized while the tuner has a window raised on its
	// device (default 16; trim.go). DisableTrim turns this off.
	TrimKB      int
	DisableTrim bool
	// RecentActions is how many actions Status keeps (default 64).
	RecentActions int
}

func (c Config) withDefaults() Config {
	// Zero means "the default"; order matters where one default derives
	// from another (ReprobeHold from Settle).
	c.MaxKB = cmp.Or(c.MaxKB, 4096)
	c.Growth = cmp.Or(c.Growth, 2)
	c.FirstStepFactor = cmp.Or(c.FirstStepFactor, 8)
	c.Margin = cmp.Or(c.Margin, 0.10)
	c.DeviceMargin = cmp.Or(c.DeviceMargin, 0.20)
	c.Settle = cmp.Or(c.Settle, time.Second)
	c.BackoffBase = cmp.Or(c.BackoffBase, 2*time.Second)
	c.BackoffMax = cmp.Or(c.BackoffMax, 5*time.Minute)
	c.CapacityFrac = cmp.Or(c.CapacityFrac, 0.9)
	c.ReprobeAfter = cmp.Or(c.ReprobeAfter, time.Minute)
	c.ReprobeHold = cmp.Or(c.ReprobeHold, 5*c.Settle)
	c.Grace = cmp.Or(c.Grace, 10*time.Second)
	c.DeviceMinFiles = cmp.Or(c.DeviceMinFiles, 4)
	c.DeviceFileFraction = cmp.Or(c.DeviceFileFraction, 0.5)
	c.SysfsWritesPerSec = cmp.Or(c.SysfsWritesPerSec, 10)
	c.SysfsBurst = cmp.Or(c.SysfsBurst, 4)
	c.PrefetchStartKB = cmp.Or(c.PrefetchStartKB, 2048)
	c.PrefetchMaxKB = cmp.Or(c.PrefetchMaxKB, 16384)
	c.PrefetchBytesPerSec = cmp.Or(c.PrefetchBytesPerSec, 64<<20)
	c.MinSequentiality = cmp.Or(c.MinSequentiality, 0.6)
	c.TrimKB = cmp.Or(c.TrimKB, 16)
	c.RecentActions = cmp.Or(c.RecentActions, 64)
	return c
}

func (c Config) validate() error {
	switch {
	case c.MaxKB < 4:
		return fmt.Errorf("tuner: max window %d KB is too small (give at least 4 KB, default 4096)", c.MaxKB)
	case c.Growth < 2:
		return fmt.Errorf("tuner: growth factor %d must be at least 2", c.Growth)
	case c.Margin < 0 || c.Margin > 10:
		return fmt.Errorf("tuner: keep margin %.2f must be between 0 and 10 (0.10 means +10%% throughput)", c.Margin)
	case c.DeviceMargin < 0 || c.DeviceMargin > 10:
		return fmt.Errorf("tuner: device keep margin %.2f must be between 0 and 10 (0.20 means +20%% throughput)", c.DeviceMargin)
	case c.DeviceFileFraction < 0 || c.DeviceFileFraction > 1:
		return fmt.Errorf("tuner: device file fraction %.2f must be between 0 and 1", c.DeviceFileFraction)
	case !c.DisableTrim && (c.TrimKB < 4 || c.TrimKB >= c.MaxKB):
		return fmt.Errorf("tuner: read-around trim window %d KB must be at least 4 KB and below the maximum window %d KB", c.TrimKB, c.MaxKB)
	case c.SysfsBurst < 2:
		return fmt.Errorf("tuner: sysfs burst %d must be at least 2 (a raise-pin-restore writes twice)", c.SysfsBurst)
	case c.SysfsWritesPerSec <= 0 || c.PrefetchBytesPerSec < 0:
		return errors.New("tuner: rates must be positive")
	case c.BackoffMax < c.BackoffBase:
		return fmt.Errorf("tuner: back-off maximum %v is below its base %v", c.BackoffMax, c.BackoffBase)
	}
	for _, d := range c.Devices {
		if err := blockdev.ValidName(d); err != nil {
			return fmt.Errorf("tuner: %w", err)
		}
	}
	return nil
}

// Sysfs is the part of blockdev.SysFS the tuner uses.
type Sysfs interface {
	actuate.DeviceRW
	ByDev(dev probe.Dev) (blockdev.Disk, error)
}

var _ Sysfs = blockdev.SysFS{}

// Deps are the tuner's seams to the system.
type Deps struct {
	Sysfs Sysfs
	Files actuate.FileOps // actuate.NewProcFileOps() or fileras.NewFileOps in production
	// States is the kernel's per-file readahead state (fileras.States in
	// production). With it the Lowerer gives a break where needed, so a
	// lowering reaches a reader streaming on a larger window; without, it only
	// sets ra_pages, which such a reader ignores.
	States actuate.RAStates
	// Around reports read-arounds of trimmed files by descriptors opened
	// since the trim (the probe in production); nil: those are found by
	// the periodic search only (trim.go).
	Around ReadAroundWatch
	Clock  clock.Clock
	Store  *state.Store // may be nil only in dry-run mode
	Logger *slog.Logger
}

// ActionKind names what an action changed.
type ActionKind string

const (
	KindDeviceWindow     ActionKind = "device_window"
	KindFileWindow       ActionKind = "file_window"
	KindPrefetch         ActionKind = "prefetch"
	KindDeviceWindowUndo ActionKind = "device_window_undo"
	KindFileWindowUndo   ActionKind = "file_window_undo"
	KindPrefetchUndo     ActionKind = "prefetch_undo"
	// KindTrim: a random mmap reader's open files given a window below
	// the device's (read-around trim, trim.go).
	KindTrim     ActionKind = "file_trim"
	KindTrimUndo ActionKind = "file_trim_undo"
)

// undoOf is the kind of the action that takes back one of kind k.
func undoOf(k ActionKind) ActionKind { return k + "_undo" }

// Result is what became of an action.
type Result string

const (
	// ResultTrial: applied, its effect is measured after Config.Settle.
	ResultTrial Result = "trial"
	// ResultKept: the measured gain reached the margin; the step stays.
	ResultKept Result = "kept"
	// ResultApplied: a kept decision reached a new reader of its file.
	ResultApplied Result = "applied"
	// ResultUndone: put back (a step that did not pay, or the regime ended).
	ResultUndone Result = "undone"
	// ResultFailed: the system refused (process gone, write error...).
	ResultFailed Result = "failed"
	// ResultDryRun: would have been done; nothing was written.
	ResultDryRun Result = "dry_run"
)

// Action is one thing the tuner did (or would do, in dry-run mode).
type Action struct {
	Time     time.Duration // CLOCK_MONOTONIC
	Device   string
	Dev      probe.Dev
	File     probe.FileKey // zero for device-wide actions
	Path     string        // the file's path, when known
	Kind     ActionKind
	FromKB   int // window (or prefetch depth) before
	ToKB     int // window (or prefetch depth) after
	Result   Result
	Evidence string
}

// DeviceStatus describes one device the tuner touched or watches.
type DeviceStatus struct {
	Device        string
	Dev           probe.Dev
	CurrentKB     int // read_ahead_kb as the tuner last set or read it
	OriginalKB    int // value found before the first write
	FilesAdjusted int // open files with a window other than the device's
	Prefetching   int // files being prefetched
}

// FileStatus describes one file with a decision.
type FileStatus struct {
	Device     string
	File       probe.FileKey
	Path       string
	WindowKB   int // window in force on its readers' open files
	BaseKB     int
	PrefetchKB int
	Readers    int
	State      string
}

// Status is the tuner's state for metrics and `readaheadd status`.
type Status struct {
	DryRun  bool
	Devices []DeviceStatus
	Files   []FileStatus
	Recent  []Action // oldest first
	// Counts of actions by kind and result ("file_window/kept").
	Counts map[string]uint64
	// Events counts the control core's own events (Events()).
	Events map[Event]uint64
	// FileOpFailures counts per-file operations that failed (the process
	// or descriptor went away, fd reuse, fadvise error).
	FileOpFailures uint64
	// OutOfScope counts descriptors refused by the allow-path rules.
	OutOfScope uint64
	// RateLimited counts steps deferred by the sysfs write rate limit.
	RateLimited uint64
	// Repeated counts failed per-file actions not logged because the same
	// failure (file, kind, cause) was logged before, by cause.
	Repeated map[string]uint64
}

// compareKeys orders files by device, then inode.
func compareKeys(a, b probe.FileKey) int {
	return cmp.Or(cmp.Compare(a.Dev, b.Dev), cmp.Compare(a.Ino, b.Ino))
}

// ReadAroundWatch reports the mmap read-arounds of a file by open files
// whose window is above kb, as ReadaheadEvents with ReadAround set
// (probe.Probe in production).
type ReadAroundWatch interface {
	WatchReadAround(file probe.FileKey, kb int) error
	UnwatchReadAround(file probe.FileKey) error
}

// openedMark is what the event path did for one process on a trimmed file.
type openedMark struct {
	at    time.Duration // its descriptors were trimmed (reports emitted before are stale)
	until time.Duration // not looked for again before
}

// Labels of decisions that no detector regime started. They are evidence in
// actions and status, not regimes: the detector reports none for them.
const (
	// WindowBound: a sequential stream whose bytes in flight fill its window
	// (Little's law), whatever its history. A larger window is tried, kept
	// only if the stream's throughput pays.
	WindowBound detector.RegimeKind = "window_bound"
	// FromPrior: a fresh open given the window that paid for recent
	// streams in its directory (or for the file itself) on its first
	// readahead event.
	FromPrior detector.RegimeKind = "prior"
)
