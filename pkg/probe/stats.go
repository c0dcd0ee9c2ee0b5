package probe

import (
	"math"
	"math/bits"
	"sort"
	"time"
)

// HistBuckets is the number of buckets of DeviceStats.Hist.
const HistBuckets = 28

// HistUpperBound is the exclusive upper bound of latency histogram bucket
// i: bucket i counts latencies in [2^i, 2^(i+1)) microseconds (bucket 0
// from zero), and the last bucket everything above, so its bound is +Inf.
// For a Prometheus histogram in seconds, use le = HistUpperBound(i).Seconds()
// and cumulative counts.
func HistUpperBound(i int) time.Duration {
	if i >= HistBuckets-1 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(1<<(i+1)) * time.Microsecond
}

// HistBucket returns the histogram bucket of latency d, as the kernel
// side computes it.
func HistBucket(d time.Duration) int {
	us := uint64(d / time.Microsecond)
	if d < 0 || us == 0 {
		return 0
	}
	b := bits.Len64(us) - 1
	if b >= HistBuckets {
		b = HistBuckets - 1
	}
	return b
}

// DeviceStats are one disk's read totals since load. Requests, Bytes,
// Errors, LatencySum and Hist count every request, sampled or not.
type DeviceStats struct {
	Requests   uint64
	Bytes      uint64
	Errors     uint64
	LatencySum time.Duration // over the Requests - Untimed requests in Hist
	InFlight   int64         // read requests the kernel counts in flight now (/sys/dev/block/M:m/inflight)
	Hist       [HistBuckets]uint64
	// Sampled counts the requests streamed as records (all of them while
	// the disk is under Config.SampleBudget).
	Sampled uint64
	// Samplable counts the requests the probe streams 1 in SampleEvery:
	// those smaller than SampleBelow, and those of any size that are no
	// readahead for a file (direct I/O, metadata). The others (a file's
	// readahead requests of SampleBelow or more) are always streamed. The sampling period
	// follows this count's rate.
	Samplable uint64
	// Untimed counts requests without a latency: not sampled, on a queue
	// that keeps neither I/O statistics nor accounting timestamps.
	Untimed uint64
	// AllocTimed counts requests timed from their allocation
	// (request start_time_ns: includes time queued before issue) because
	// the queue keeps no issue time (io_start_time_ns, set only while the
	// queue collects statistics).
	AllocTimed uint64
	// SampleEvery is the current sampling period N: 1 in N samplable
	// requests is streamed (1: every request).
	SampleEvery uint32
}

// FileStats are one file's read totals since load. While a disk is
// sampled they are estimates: each sampled request counts for N.
type FileStats struct {
	File       FileKey
	Disk       Dev // disk of the first request seen
	Requests   uint64
	Bytes      uint64
	LatencySum time.Duration
	DepthSum   uint64        // sum of Record.Depth; DepthSum/Requests is the mean queue depth
	Last       time.Duration // completion of the latest request (CLOCK_MONOTONIC)
}

// Lost counts events the kernel side could not record. Aggregates still
// include requests whose ring record was dropped.
type Lost struct {
	Records   uint64 // ring buffer full: read records dropped
	Readahead uint64 // ring buffer full: readahead events dropped
	Inflight  uint64 // always 0 since the probe keeps no in-flight table (kept for the metric's stability)
	DeviceMap uint64 // per-disk map full
	FileMap   uint64 // per-file map insert failed
	Undecoded uint64 // ring records user space could not decode
	Stale     uint64 // always 0 since the probe keeps no in-flight table
}

// Total sums all lost counters.
func (l Lost) Total() uint64 {
	return l.Records + l.Readahead + l.Inflight + l.DeviceMap + l.FileMap + l.Undecoded + l.Stale
}

// ProgramStats is a BPF program's cumulative run time and run count, as
// the kernel counts them while kernel.bpf_stats_enabled is 1 (or while a
// BPF_ENABLE_STATS descriptor is held: see Config.EnableStats).
type ProgramStats struct {
	Runs    uint64
	RunTime time.Duration
	// Misses: runs the kernel skipped because the program was already
	// running on that CPU (a completion in an interrupt inside another
	// one's run). What such a run would have counted is not counted.
	Misses uint64
}

// PerRun returns the mean cost of one run, or 0 without runs.
func (p ProgramStats) PerRun() time.Duration {
	if p.Runs == 0 {
		return 0
	}
	return p.RunTime / time.Duration(p.Runs)
}

// Program names, as reported in Stats.Programs and Check. The probe runs
// block_rq_complete, the two readahead programs and, where the kernel has
// its tracepoint (Linux 6.10 and later), page_cache_ra_order for the
// read-around of watched files; block_rq_issue and
// block_rq_requeue name the tracepoints of earlier builds (and of the
// benchmarks' empty programs).
const (
	ProgBlockRqIssue     = "block_rq_issue"
	ProgBlockRqComplete  = "block_rq_complete"
	ProgBlockRqRequeue   = "block_rq_requeue"
	ProgPageCacheSyncRa  = "page_cache_sync_ra"
	ProgPageCacheAsyncRa = "page_cache_async_ra"
	ProgPageCacheRaOrder = "page_cache_ra_order"
)

// Stats is a snapshot of the kernel-side aggregates.
type Stats struct {
	Devices  map[Dev]DeviceStats
	Files    map[FileKey]FileStats
	Lost     Lost
	Programs map[string]ProgramStats
}

// TopFiles returns the n files with the most bytes read (all if n <= 0),
// ties broken by key for a stable order.
func (s Stats) TopFiles(n int) []FileStats {
	out := make([]FileStats, 0, len(s.Files))
	for _, f := range s.Files {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		if out[i].File.Dev != out[j].File.Dev {
			return out[i].File.Dev < out[j].File.Dev
		}
		return out[i].File.Ino < out[j].File.Ino
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// Aggregator computes, in user space, the aggregates the kernel side keeps:
// used by Replay and to check the kernel against the record stream. Records
// count with their weight (per-disk totals are then estimates too).
type Aggregator struct {
	devs  map[Dev]DeviceStats
	files map[FileKey]FileStats
}

// Add accounts one record.
func (a *Aggregator) Add(r Record) {
	if a.devs == nil {
		a.devs = map[Dev]DeviceStats{}
		a.files = map[FileKey]FileStats{}
	}
	w := r.W()
	d := a.devs[r.Device]
	d.Requests += w
	d.Bytes += uint64(r.Bytes) * w
	d.LatencySum += r.Latency * time.Duration(w)
	if r.Error {
		d.Errors += w
	}
	d.Hist[HistBucket(r.Latency)] += w
	d.Sampled++
	if r.Samplable || r.Bytes < SampleBelow || r.Kind != KindFile {
		d.Samplable += w
		// The period of the latest samplable record (a file read of
		// SampleBelow or more weighs 1 whatever the period).
		d.SampleEvery = uint32(w)
	} else if d.SampleEvery == 0 {
		d.SampleEvery = 1
	}
	a.devs[r.Device] = d
	if r.Kind != KindFile {
		return
	}
	f, ok := a.files[r.File]
	if !ok {
		f = FileStats{File: r.File, Disk: r.Device}
	}
	f.Requests += w
	f.Bytes += uint64(r.Bytes) * w
	f.LatencySum += r.Latency * time.Duration(w)
	f.DepthSum += uint64(r.Depth) * w
	if c := r.Complete(); c > f.Last {
		f.Last = c
	}
	a.files[r.File] = f
}

// Stats returns a copy of the aggregates.
func (a *Aggregator) Stats() Stats {
	s := Stats{Devices: map[Dev]DeviceStats{}, Files: map[FileKey]FileStats{}, Programs: map[string]ProgramStats{}}
	for k, v := range a.devs {
		s.Devices[k] = v
	}
	for k, v := range a.files {
		s.Files[k] = v
	}
	return s
}
