// Package metrics exports what readaheadd sees and does: a Prometheus
// collector that reads the probe's in-kernel aggregates, the detector's
// latest snapshot and the tuner's status at scrape time, and a read-only
// HTTP server for /metrics, /healthz and the /debug endpoints that
// `readaheadd status` reads.
//
// No metric carries a file path or inode: per-file detail is served, bounded,
// by /debug/files.
package metrics

import (
	"strconv"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/failslow"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// DeviceIO is the probe's in-kernel aggregate for one device since it was
// attached.
type DeviceIO struct {
	Device string // name as in /sys/block
	// LatencyLog2US[i] counts reads whose latency was in [2^i, 2^(i+1))
	// microseconds (bucket 0 from zero); the last bucket counts everything
	// above (probe.DeviceStats.Hist).
	LatencyLog2US []uint64
	// LatencySum is the sum of all latencies counted in the histogram.
	LatencySum time.Duration
	Bytes      uint64
	Requests   uint64
	// SampleEvery is the probe's sampling period: 1 in N samplable
	// requests (under 32 KiB, or not read for a file) is seen by the
	// detector (1: every request).
	SampleEvery uint32
}

// ProbeStats is what the probe reports at scrape time.
type ProbeStats struct {
	Attached   bool
	Devices    []DeviceIO
	EventsLost uint64
	// ProgramRunTime is the kernel's accumulated run time per BPF program
	// (kernel.bpf_stats_enabled=1), keyed by program name.
	ProgramRunTime map[string]time.Duration
	// ProgramMisses counts, per BPF program, the runs the kernel skipped
	// because the program was already running on that CPU.
	ProgramMisses map[string]uint64
}

// DeviceState is the tuner's view of one device.
type DeviceState struct {
	Name          string `json:"name"`
	Dev           string `json:"dev"` // major:minor
	ReadAheadKB   int    `json:"read_ahead_kb"`
	OriginalKB    int    `json:"original_kb"`
	FilesAdjusted int    `json:"files_adjusted"`
}

// ActionCount counts actions of one kind on one device by result.
type ActionCount struct {
	Device string
	Action string // e.g. device_window, file_window, prefetch
	Result string // kept, undone or failed
	Count  uint64
}

// Action is one recent action, for status and logs.
type Action struct {
	Time     time.Time `json:"time"`
	Device   string    `json:"device"`
	Action   string    `json:"action"`
	Target   string    `json:"target,omitempty"` // file path or key, for per-file actions
	FromKB   int       `json:"from_kb"`
	ToKB     int       `json:"to_kb"`
	Result   string    `json:"result"`           // kept, undone, failed, pending, dry-run
	Effect   string    `json:"effect,omitempty"` // measured effect, e.g. "+84% busy throughput"
	Evidence string    `json:"evidence,omitempty"`
}

// Kinds of readaheadd_tuner_errors_total.
const (
	ErrFileOp      = "file_op"
	ErrOutOfScope  = "out_of_scope"
	ErrRateLimited = "rate_limited"
)

// Labels of readaheadd_actions_total that exist at zero for every
// watched device from the start, so that dashboards and rate() tell an
// idle device from a broken exporter. Undo actions count under the kind
// they undo.
var (
	ActionNames   = []string{"device_window", "file_window", "prefetch", "file_trim"}
	ActionResults = []string{"trial", "kept", "applied", "undone", "failed", "dry_run"}
	// FailureCauses label readaheadd_repeated_failures_total.
	FailureCauses = []string{"out_of_scope", "process_gone", "fd_gone", "permission", "other"}
)

// TunerStatus is what the tuner reports at scrape time.
type TunerStatus struct {
	DryRun bool
	// Errors counts operations that did not happen, by kind (ErrFileOp,
	// ErrOutOfScope, ErrRateLimited); missing kinds are zero.
	Errors map[string]uint64
	// Repeated counts failed per-file actions not logged because the same
	// failure was logged before, by cause (FailureCauses).
	Repeated map[string]uint64
	Devices  []DeviceState
	Actions  []ActionCount
	Recent   []Action // newest last, bounded by the tuner
	// Control counts the control core's own events by name (tuner.Events);
	// missing names are zero.
	Control map[string]uint64
}

// Sources are read at scrape and request time. A nil function means the
// part is not running; its metrics are then absent rather than zero.
type Sources struct {
	Probe    func() ProbeStats
	Detector func() (detector.Snapshot, bool) // the latest evaluation, false before the first
	Tuner    func() TunerStatus
	// DetectorFiles reports how many files the detector tracks and how
	// many it has evicted; optional.
	DetectorFiles func() (tracked int, evicted uint64)
	// DeviceName maps a device number to its name in /sys/block; "" if unknown.
	DeviceName func(probe.Dev) string
	// FilePath resolves a file for display in /debug/files; optional.
	FilePath func(probe.FileKey) string
	// OpenFiles counts open files per device by the window the kernel
	// holds for them and lists those above their device's (a BPF iterator
	// over every process's files); optional.
	OpenFiles func() OpenFiles
	// FailSlow is the latest fail-slow verdict per disk (pkg/failslow);
	// optional.
	FailSlow func() []failslow.Disk
}

// OpenFiles is one walk of every process's open files on the tuned disks.
type OpenFiles struct {
	Windows []OpenWindows
	// Above: the files whose window in force is above their device's
	// read_ahead_kb, whoever set it (at most MaxAboveListed listed;
	// AboveCount counts them all, per device).
	Above      []OpenFileAbove
	AboveCount map[string]int
}

// MaxAboveListed bounds OpenFiles.Above.
const MaxAboveListed = 50

// OpenWindows is how many open regular files on a device the kernel reads
// ahead with a window of WindowKB, whoever set it: the larger of the
// file's ra_pages and its stream's current window (f_ra.size, which an
// asynchronous readahead keeps even when ra_pages comes down).
type OpenWindows struct {
	Device   string `json:"device"`
	WindowKB int    `json:"window_kb"`
	Files    int    `json:"files"`
}

// OpenFileAbove is an open file whose window in force is above its
// device's read_ahead_kb.
type OpenFileAbove struct {
	Device    string `json:"device"`
	DeviceKB  int    `json:"device_kb"`
	PID       uint32 `json:"pid"`
	FD        int    `json:"fd"`
	Path      string `json:"path"`
	RAPagesKB int    `json:"ra_pages_kb"` // the file's ra_pages
	StreamKB  int    `json:"stream_kb"`   // its stream's window (f_ra.size)
}

// WindowBucket is the label a window gets in readaheadd_open_file_windows:
// the window rounded up to a power of two (0 stays 0), "+Inf" above
// 16384 KB, so the label set stays bounded whatever windows are set.
func WindowBucket(kb int) string {
	if kb <= 0 {
		return "0"
	}
	b := 4
	for b < kb {
		b *= 2
	}
	if b > 16384 {
		return "+Inf"
	}
	return strconv.Itoa(b)
}

func (s Sources) devName(d probe.Dev) string {
	if s.DeviceName != nil {
		if n := s.DeviceName(d); n != "" {
			return n
		}
	}
	return d.String()
}
