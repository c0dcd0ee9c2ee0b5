package detector

import (
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// RegimeKind names a slowdown regime. The values are stable: they are the
// `regime` label of readaheadd_regime_active.
type RegimeKind string

const (
	// FileLatencyShift: one file's reads are slower than the device's
	// baseline for the same request size while other files are normal
	// (the permanent, per-file slowdown of aged data).
	FileLatencyShift RegimeKind = "file_latency_shift"
	// TailInflation: the device's p99 is up while its median is not
	// (temporal slowdown: periodic internal work).
	TailInflation RegimeKind = "tail_inflation"
	// ExtentStart: reads right after a file's reads jump to a new extent
	// are slower (intrinsic slowdown); File names a fragmented file.
	ExtentStart RegimeKind = "extent_start"
	// Contention: latency rises with queue depth and with other readers.
	Contention RegimeKind = "contention"
	// StarvedStream: a sequential file whose throughput is bounded by
	// latency times too few requests in flight: a larger window pays.
	StarvedStream RegimeKind = "starved_stream"
)

// Kinds lists every regime kind.
var Kinds = []RegimeKind{FileLatencyShift, TailInflation, ExtentStart, Contention, StarvedStream}

// Regime is one active slowdown.
type Regime struct {
	Kind       RegimeKind
	Device     probe.Dev
	File       probe.FileKey // zero for a device-wide regime
	Since      time.Duration // CLOCK_MONOTONIC time the regime was entered
	Confidence float64       // 0..1
	Evidence   string        // what triggered it, for logs and status
}

// FileStats is the detector's view of one file over its sliding window.
type FileStats struct {
	Key            probe.FileKey
	Device         probe.Dev
	Requests       uint64
	Bytes          uint64
	P50, P95, P99  time.Duration
	MeanSize       float64 // bytes per request
	MeanDepth      float64 // device read requests in flight (probe.Record.Depth: at completion, the kernel's count)
	BusyThroughput float64 // bytes/s over the time at least one of its requests was in flight
	Sequentiality  float64 // 0..1: share of requests that continue the previous one
	NextOffset     uint64  // byte offset just past the last request read
	LastSeen       time.Duration
	// Inflight is the mean number of the file's requests in flight while it
	// was busy (Little's law: summed latency over busy time).
	Inflight float64
	// Jumps counts window requests that start a new run after a jump in
	// file offset or a crossing into a new extent; ExtentCrossings counts the
	// crossings (sector discontinuity at a contiguous file offset) since the
	// file was first seen: how fragmented its reads find it.
	Jumps           uint64
	ExtentCrossings uint64
	// DiskRatio is the 10th percentile (DiskRatioQuantile), over the
	// file's requests in the device's window, of each request's latency
	// over the 10th percentile of the rest of the device's requests of the
	// same size class in the same window (they share its queue);
	// DiskRatioRequests counts the requests that had such a reference (0:
	// no ratio). Above 1: the file reads slower than its own disk.
	DiskRatio         float64
	DiskRatioRequests int
}

// ClassBaseline is a device's healthy latency for one request-size class:
// requests of 2^(Class-1)+1 .. 2^Class bytes.
type ClassBaseline struct {
	Class         uint8
	P50, P95, P99 time.Duration // P99 is zero until enough large windows were seen
	Windows       int           // healthy windows learned from
	Learned       bool          // used as a reference
}

// DeviceStats is the detector's view of one device over its sliding window.
type DeviceStats struct {
	Device         probe.Dev
	Requests       uint64
	Bytes          uint64
	P50, P95, P99  time.Duration
	MeanSize       float64
	MeanDepth      float64
	BusyThroughput float64
	// Baseline latencies learned while the device was healthy (zero until learned).
	BaselineP50, BaselineP99 time.Duration
	BaselineLearned          bool
	// Additions: per-class baselines (BaselineP50/P95/P99 are those of the
	// class with the most requests in the window, or the most learned one),
	// healthy requests in flight, learned capacity (decaying peak busy
	// throughput), failed requests seen since start.
	BaselineP95      time.Duration
	Baselines        []ClassBaseline
	BaselineInflight float64
	CapacityBPS      float64
	Errors           uint64
	// Profile is the window's median latency per size class and
	// queue-depth bucket, sorted by class then depth: what fail-slow
	// comparisons between disks match on.
	Profile []LatencyCell
	// Unqueued is the window's latency per size class (Depth 0) of the
	// requests issued with no other read of the device in flight, from the
	// window's own issue and completion times: their latency is the
	// device's fixed cost plus their own bytes, whatever the queues around
	// them. Empty when the window's records are sampled (a request not
	// streamed could have been ahead).
	Unqueued []LatencyCell
}

// Snapshot is what the detector reports at each evaluation.
type Snapshot struct {
	Now     time.Duration
	Devices []DeviceStats
	Files   []FileStats
	Regimes []Regime
}
