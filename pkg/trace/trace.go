// Package trace turns the probe's record stream into the per-interval,
// per-file view of `readaheadd trace`: the files that read the most bytes,
// with request count, latency (mean, p99), request size, queue depth and
// reader, plus per-disk totals.
package trace

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Reader is a process seen running readahead on a file.
type Reader struct {
	Tgid uint32 `json:"tgid"`
	Comm string `json:"comm"`
}

// FileRow is one file's reads in an interval.
type FileRow struct {
	File      probe.FileKey `json:"-"`
	FileID    string        `json:"file"` // "major:minor/inode"
	Disk      probe.Dev     `json:"-"`
	DiskName  string        `json:"disk"`
	Path      string        `json:"path,omitempty"` // resolved path, or a fallback description
	Resolved  bool          `json:"path_resolved"`
	Bytes     uint64        `json:"bytes"`
	Requests  uint64        `json:"requests"`
	MeanLat   time.Duration `json:"-"`
	P99Lat    time.Duration `json:"-"`
	MeanLatMs float64       `json:"mean_latency_ms"`
	P99LatMs  float64       `json:"p99_latency_ms"`
	MeanSize  float64       `json:"mean_request_bytes"`
	MeanDepth float64       `json:"mean_queue_depth"`
	Readers   []Reader      `json:"readers,omitempty"`
}

// DeviceRow is one disk's reads in an interval.
type DeviceRow struct {
	Dev       probe.Dev     `json:"-"`
	DevID     string        `json:"dev"`
	Name      string        `json:"name"`
	Bytes     uint64        `json:"bytes"`
	Requests  uint64        `json:"requests"`
	Other     uint64        `json:"non_file_requests"` // metadata, anonymous, unattributed
	MeanLat   time.Duration `json:"-"`
	P99Lat    time.Duration `json:"-"`
	MeanLatMs float64       `json:"mean_latency_ms"`
	P99LatMs  float64       `json:"p99_latency_ms"`
	MeanDepth float64       `json:"mean_queue_depth"`
}

// Report is one interval of the view.
type Report struct {
	Start   time.Time   `json:"start"`
	End     time.Time   `json:"end"`
	Files   []FileRow   `json:"files"`
	Devices []DeviceRow `json:"devices"`
	Lost    uint64      `json:"lost_events"` // since the probe started
}

// maxSamples bounds the latencies kept per file and interval for the p99;
// beyond it, reservoir sampling keeps a uniform sample.
const maxSamples = 4096

type acc struct {
	bytes, requests, other uint64
	latSum                 time.Duration
	depthSum               uint64
	disk                   probe.Dev
	samples                []time.Duration
	seen                   uint64
}

func (a *acc) add(r probe.Record, rnd *uint64) {
	// A record the probe sampled 1 in N stands for N requests.
	w := r.W()
	a.bytes += uint64(r.Bytes) * w
	a.requests += w
	a.latSum += r.Latency * time.Duration(w)
	a.depthSum += uint64(r.Depth) * w
	a.seen++
	if len(a.samples) < maxSamples {
		a.samples = append(a.samples, r.Latency)
		return
	}
	// xorshift: cheap, deterministic reservoir index.
	*rnd ^= *rnd << 13
	*rnd ^= *rnd >> 7
	*rnd ^= *rnd << 17
	if j := *rnd % a.seen; j < maxSamples {
		a.samples[j] = r.Latency
	}
}

func (a *acc) p99() time.Duration { return Percentile(a.samples, 0.99) }

// Percentile returns the q-quantile (nearest rank) of ds; it sorts ds.
func Percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	rank := int(math.Ceil(q*float64(len(ds)))) - 1
	if rank < 0 {
		rank = 0
	}
	if rank >= len(ds) {
		rank = len(ds) - 1
	}
	return ds[rank]
}

// Window accumulates records between two calls of Flush. It implements
// probe.Handler and is safe for one producer and one flusher.
type Window struct {
	// Names gives a disk's name for display ("" leaves the number).
	Names func(probe.Dev) string
	// Paths resolves files for display; nil leaves the key.
	Paths *probe.Resolver

	mu      sync.Mutex
	start   time.Time
	files   map[probe.FileKey]*acc
	devs    map[probe.Dev]*acc
	readers map[probe.FileKey][]Reader
	rnd     uint64
}

var _ probe.Handler = (*Window)(nil)

// NewWindow starts a window at start.
func NewWindow(start time.Time) *Window {
	w := &Window{rnd: 0x9E3779B97F4A7C15}
	w.reset(start)
	return w
}

func (w *Window) reset(start time.Time) {
	w.start = start
	w.files = map[probe.FileKey]*acc{}
	w.devs = map[probe.Dev]*acc{}
	w.readers = map[probe.FileKey][]Reader{}
}

// HandleRecord implements probe.Handler.
func (w *Window) HandleRecord(r probe.Record) {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.devs[r.Device]
	if d == nil {
		d = &acc{disk: r.Device}
		w.devs[r.Device] = d
	}
	d.add(r, &w.rnd)
	if r.Kind != probe.KindFile {
		d.other += r.W()
		return
	}
	f := w.files[r.File]
	if f == nil {
		f = &acc{disk: r.Device}
		w.files[r.File] = f
	}
	f.add(r, &w.rnd)
}

// maxReaders bounds the readers listed per file.
const maxReaders = 4

// HandleReadahead implements probe.Handler.
func (w *Window) HandleReadahead(e probe.ReadaheadEvent) {
	if w.Paths != nil {
		w.Paths.Observe(e)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	rs := w.readers[e.File]
	for _, r := range rs {
		if r.Tgid == e.Tgid {
			return
		}
	}
	if len(rs) < maxReaders {
		w.readers[e.File] = append(rs, Reader{Tgid: e.Tgid, Comm: e.Comm})
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Flush returns the report of the window ending at end, with the top
// files by bytes (all if top <= 0), and starts the next window.
func (w *Window) Flush(end time.Time, top int) Report {
	w.mu.Lock()
	files, devs, readers, start := w.files, w.devs, w.readers, w.start
	w.reset(end)
	w.mu.Unlock()

	rep := Report{Start: start, End: end, Files: []FileRow{}, Devices: []DeviceRow{}}
	for k, a := range files {
		row := FileRow{File: k, FileID: k.String(), Disk: a.disk, DiskName: w.name(a.disk),
			Bytes: a.bytes, Requests: a.requests, Readers: readers[k]}
		fill(&row.MeanLat, &row.P99Lat, &row.MeanDepth, a)
		row.MeanLatMs, row.P99LatMs = ms(row.MeanLat), ms(row.P99Lat)
		row.MeanSize = float64(a.bytes) / float64(a.requests)
		rep.Files = append(rep.Files, row)
	}
	sort.Slice(rep.Files, func(i, j int) bool {
		a, b := rep.Files[i], rep.Files[j]
		if a.Bytes != b.Bytes {
			return a.Bytes > b.Bytes
		}
		if a.File.Dev != b.File.Dev {
			return a.File.Dev < b.File.Dev
		}
		return a.File.Ino < b.File.Ino
	})
	if top > 0 && len(rep.Files) > top {
		rep.Files = rep.Files[:top]
	}
	// Resolve only what is shown: it walks /proc.
	for i := range rep.Files {
		if w.Paths != nil {
			rep.Files[i].Path, rep.Files[i].Resolved = w.Paths.Resolve(rep.Files[i].File)
		}
	}
	for dev, a := range devs {
		row := DeviceRow{Dev: dev, DevID: dev.String(), Name: w.name(dev), Bytes: a.bytes,
			Requests: a.requests, Other: a.other}
		fill(&row.MeanLat, &row.P99Lat, &row.MeanDepth, a)
		row.MeanLatMs, row.P99LatMs = ms(row.MeanLat), ms(row.P99Lat)
		rep.Devices = append(rep.Devices, row)
	}
	sort.Slice(rep.Devices, func(i, j int) bool { return rep.Devices[i].Dev < rep.Devices[j].Dev })
	return rep
}

func fill(mean, p99 *time.Duration, depth *float64, a *acc) {
	if a.requests == 0 {
		return
	}
	*mean = a.latSum / time.Duration(a.requests)
	*p99 = a.p99()
	*depth = float64(a.depthSum) / float64(a.requests)
}

func (w *Window) name(d probe.Dev) string {
	if w.Names != nil {
		if n := w.Names(d); n != "" {
			return n
		}
	}
	return d.String()
}
