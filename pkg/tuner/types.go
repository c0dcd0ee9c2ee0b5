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
	// AllowPaths: directories whose files may get per-file actions, each on
	// its own filesystem only. Empty: device-wide actions only.
	AllowPaths []string
	// MaxKB caps every window, device or file (default 4096).
	MaxKB int
	// Growth multiplies the window at each escalation step (default 2).
	Growth int
	// FirstStepFactor: the least first step, in device windows, of a stream
	// bound by its window with no regime to size it (default 8): its
	// Little's-law hint undershoots an unknown capacity, and a window that
	// just covers the latency leaves the stream short.
	FirstStepFactor int
	// Margin is the busy-throughput gain that keeps an action (default 0.10).
	Margin float64
	// DeviceMargin is the gain that keeps a device-wide step (default 0.20):
	// it reaches every later reader of the device, not only the one measured.
	DeviceMargin float64
	// Settle is how long after an action its effect is measured (default 1s).
	// Set it to at least the detector's window so the measure sees only the new value.
	Settle time.Duration
	// BackoffBase, BackoffMax: exponential back-off after an action that did
	// not pay (defaults 2s, 5m); a knee waits BackoffMax before probing again.
	BackoffBase, BackoffMax time.Duration
	// Grace: how long with no regime before a target's actions are undone (default 10s).
	Grace time.Duration
	// DeviceMinFiles, DeviceFileFraction: a device-wide window is tried when
	// this many files, and this share of the device's, need more (defaults 4, 0.5).
	DeviceMinFiles     int
	DeviceFileFraction float64
	// SysfsWritesPerSec and SysfsBurst rate-limit read_ahead_kb writes per
	// device (defaults 10/s, burst 4). A raise-pin-restore takes two.
	SysfsWritesPerSec float64
	SysfsBurst        int
	// PrefetchStartKB, PrefetchMaxKB bound the prefetch depth (defaults 2048, 16384).
	PrefetchStartKB, PrefetchMaxKB int
	// PrefetchBytesPerSec is each device's prefetch budget (default 64 MiB/s).
	PrefetchBytesPerSec float64
	// MinSequentiality: the least FileStats.Sequentiality for a window step or
	// prefetch (default 0.6): more readahead costs a random reader.
	MinSequentiality float64
	// CapacityFrac: no further window step or prefetch for a file at this share
	// of its device's capacity (default 0.9); a lone stream up to 1/(1+Margin/2),
	// as a step to the capacity pays at half the margin.
	CapacityFrac float64
	// ReprobeAfter: a file window kept this long goes back to the device's for
	// ReprobeHold, to learn whether its regime is over, which a saturated device
	// hides (default 1m, doubled while the regime persists, up to BackoffMax).
	ReprobeAfter time.Duration
	// ReprobeHold: how long a re-probe holds the device's window (default 5 x
	// Settle: the detector clears a regime after two evaluations, the first may
	// hold the large window's queue, and the clocks are not in phase).
	ReprobeHold time.Duration
	// DryRun logs and reports what would be done without writing anything.
	DryRun bool
	// DisablePrefetch turns the prefetch actuator off.
	DisablePrefetch bool
	// TrimKB: the window of a read-around random reader's open files while a
	// window is raised on its device (default 16; trim.go). DisableTrim: off.
	TrimKB      int
	DisableTrim bool
	// RecentActions is how many actions Status keeps (default 64).
	RecentActions int
}

func (c Config) withDefaults() Config {
	// Order matters where a default derives from another (ReprobeHold from Settle).
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
	// States: the kernel's per-file readahead state (fileras.States). With it
	// a lowering reaches a reader streaming on a larger window (a break);
	// without, it only sets ra_pages, which such a reader ignores.
	States actuate.RAStates
	// Around reports read-arounds by descriptors opened since a trim (the
	// probe); nil: only the periodic search finds them (trim.go).
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
	// KindTrim: a random mmap reader's open files given a smaller window (trim.go).
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
	// FileOpFailures counts failed per-file operations (process or fd gone, fadvise).
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

// ReadAroundWatch reports mmap read-arounds of a file by open files whose
// window is above kb, as ReadaheadEvents with ReadAround set (probe.Probe).
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
	// (Little's law); a larger window is tried, kept only if it pays.
	WindowBound detector.RegimeKind = "window_bound"
	// FromPrior: a fresh open given, at its first readahead event, the window
	// that paid for recent streams in its directory (or the file itself).
	FromPrior detector.RegimeKind = "prior"
)
