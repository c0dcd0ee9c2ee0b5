package metrics

import (
	"math"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/failslow"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/tuner"
)

// Namespace prefixes every metric name.
const Namespace = "readaheadd"

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
}

var (
	descLatency = desc("read_latency_seconds",
		"Block read request latency, issue to completion, from the in-kernel log2 histogram.", "device")
	descBytes    = desc("read_bytes_total", "Bytes read from the device by completed block read requests.", "device")
	descRequests = desc("read_requests_total", "Completed block read requests.", "device")
	descRA       = desc("read_ahead_kb", "Current /sys/block/DEVICE/queue/read_ahead_kb.", "device")
	descRAOrig   = desc("read_ahead_original_kb", "read_ahead_kb found before readaheadd changed anything; restored on exit.", "device")
	descRegime   = desc("regime_active", "1 while the detector sees this slowdown regime on the device (on the device or on any of its files), else 0.", "device", "regime")
	descActions  = desc("actions_total", "Tuner actions by kind and outcome (kept: it paid; undone: it did not; failed: it could not be applied).", "device", "action", "result")
	descFiles    = desc("files_adjusted", "Open files whose readahead window readaheadd currently holds changed.", "device")
	descSample   = desc("probe_sample_every", "The probe streams 1 in this many of the device's samplable read requests (under 32 KiB, or not read for a file: direct I/O, metadata) to the detector (1: all); file reads of 32 KiB or more are all streamed; counts, bytes and the latency histogram include every request.", "device")
	descLost     = desc("bpf_events_lost_total", "Probe events dropped because the ring buffer was full.")
	descRunTime  = desc("bpf_run_seconds_total", "Kernel CPU time spent in each BPF program (needs kernel.bpf_stats_enabled=1).", "program")
	descMissed   = desc("bpf_missed_runs_total", "Runs of each BPF program the kernel skipped because it was already running on that CPU: requests the probe did not count.", "program")
	descAttached = desc("probe_attached", "1 when the BPF programs are loaded and attached.")
	descDryRun   = desc("dry_run", "1 when the tuner only logs and exports what it would do.")
	descTracked  = desc("detector_files_tracked", "Files the detector keeps state for (bounded by its MaxFiles; idle files age out).")
	descEvicted  = desc("detector_files_evicted_total", "Files whose detector state was dropped: idle too long, or the oldest when the table was full.")
	descRepeated = desc("repeated_failures_total", "Failed per-file actions not logged because the same failure (file, action, cause) was logged once before; they are retried with back-off. Causes: out_of_scope, process_gone, fd_gone, permission, other.", "cause")
	descOpenWin  = desc("open_file_windows", "Open regular files on the device by the readahead window the kernel holds for them (the larger of their ra_pages and their stream's current window f_ra.size, which asynchronous readahead keeps when ra_pages comes down; read with a BPF iterator over every process's open files), whoever set it; window_kb is rounded up to a power of two, \"+Inf\" above 16384.", "device", "window_kb")
	descAbove    = desc("open_files_above_device_window", "Open regular files on the device whose window in force (as in open_file_windows) is above the device's read_ahead_kb, whoever set it: while readaheadd runs, the files it raised; after it stops, windows left behind.", "device")
	descControl  = desc("tuner_control_total", "Events of the tuner's control core by name; docs/metrics.md says what each means (from the tuner's one list of events).", "event")
	descSlow     = desc("disk_slow", "1 while the disk is named fail-slow: its read latency has stayed at or above the threshold times its reference's (readaheadd_disk_slow_ratio) for the hold time, else 0.", "device")
	descSlowRat  = desc("disk_slow_ratio", "How many times slower the disk reads than its reference (1: alike): the median over the last 10 evaluations of its low-percentile read latency against the reference's at the same request size and the same or a deeper queue. reference=\"peers\": the median of the host's other watched disks; reference=\"baseline\": the disk's own learned healthy latency (no comparable peer). Absent while the disk has too few comparable reads for a verdict.", "device", "reference")
	descSlowFile = desc("disk_slow_files", "Files on the disk named slower than the rest of the disk at the same request size over the same window (readaheadd status names them).", "device")
	descTunerErr = desc("tuner_errors_total", "Tuner operations that did not happen: file_op (a reader's descriptor could not be taken or advised: process exited, file closed or deleted), out_of_scope (a descriptor outside the allow-paths was refused), rate_limited (a sysfs write deferred).", "kind")
)

// Collector is a prometheus.Collector reading Sources at scrape time.
type Collector struct {
	src Sources
}

// NewCollector returns a collector over src.
func NewCollector(src Sources) *Collector { return &Collector{src: src} }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLatency, descBytes, descRequests, descRA, descRAOrig,
		descRegime, descActions, descFiles, descSample, descLost, descRunTime, descMissed, descAttached, descDryRun, descTunerErr, descRepeated, descControl, descTracked, descEvicted, descOpenWin, descAbove, descSlow, descSlowRat, descSlowFile} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	var ts TunerStatus
	if c.src.Tuner != nil {
		ts = c.src.Tuner()
	}
	if c.src.Probe != nil {
		ps := c.src.Probe()
		ch <- prometheus.MustNewConstMetric(descAttached, prometheus.GaugeValue, b2f(ps.Attached))
		seen := map[string]bool{}
		for _, d := range ps.Devices {
			seen[d.Device] = true
			count, sum, buckets := Log2USHistogram(d.LatencyLog2US, d.LatencySum.Seconds())
			ch <- prometheus.MustNewConstHistogram(descLatency, count, sum, buckets, d.Device)
			ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(d.Bytes), d.Device)
			ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(d.Requests), d.Device)
			ch <- prometheus.MustNewConstMetric(descSample, prometheus.GaugeValue, float64(max(d.SampleEvery, 1)), d.Device)
		}
		// A watched device not read from yet: its series at zero, with
		// every bucket, rather than absent.
		for _, d := range ts.Devices {
			if seen[d.Name] {
				continue
			}
			seen[d.Name] = true
			count, sum, buckets := Log2USHistogram(make([]uint64, probe.HistBuckets), 0)
			ch <- prometheus.MustNewConstHistogram(descLatency, count, sum, buckets, d.Name)
			ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, 0, d.Name)
			ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, 0, d.Name)
			ch <- prometheus.MustNewConstMetric(descSample, prometheus.GaugeValue, 1, d.Name)
		}
		ch <- prometheus.MustNewConstMetric(descLost, prometheus.CounterValue, float64(ps.EventsLost))
		progs := make([]string, 0, len(ps.ProgramRunTime))
		for p := range ps.ProgramRunTime {
			progs = append(progs, p)
		}
		sort.Strings(progs)
		for _, p := range progs {
			ch <- prometheus.MustNewConstMetric(descRunTime, prometheus.CounterValue, ps.ProgramRunTime[p].Seconds(), p)
			ch <- prometheus.MustNewConstMetric(descMissed, prometheus.CounterValue, float64(ps.ProgramMisses[p]), p)
		}
	}

	if c.src.OpenFiles != nil {
		of := c.src.OpenFiles()
		counts := map[[2]string]int{}
		devs := map[string]bool{}
		for _, w := range of.Windows {
			counts[[2]string{w.Device, WindowBucket(w.WindowKB)}] += w.Files
			devs[w.Device] = true
		}
		for k, n := range counts {
			ch <- prometheus.MustNewConstMetric(descOpenWin, prometheus.GaugeValue, float64(n), k[0], k[1])
		}
		for d := range devs {
			ch <- prometheus.MustNewConstMetric(descAbove, prometheus.GaugeValue, float64(of.AboveCount[d]), d)
		}
	}

	var devices []string
	if c.src.Tuner != nil {
		ch <- prometheus.MustNewConstMetric(descDryRun, prometheus.GaugeValue, b2f(ts.DryRun))
		for _, k := range []string{ErrFileOp, ErrOutOfScope, ErrRateLimited} {
			ch <- prometheus.MustNewConstMetric(descTunerErr, prometheus.CounterValue, float64(ts.Errors[k]), k)
		}
		for _, k := range FailureCauses {
			ch <- prometheus.MustNewConstMetric(descRepeated, prometheus.CounterValue, float64(ts.Repeated[k]), k)
		}
		for _, e := range tuner.Events() {
			ch <- prometheus.MustNewConstMetric(descControl, prometheus.CounterValue, float64(ts.Control[e.String()]), e.String())
		}
		for _, d := range ts.Devices {
			devices = append(devices, d.Name)
			ch <- prometheus.MustNewConstMetric(descRA, prometheus.GaugeValue, float64(d.ReadAheadKB), d.Name)
			ch <- prometheus.MustNewConstMetric(descRAOrig, prometheus.GaugeValue, float64(d.OriginalKB), d.Name)
			ch <- prometheus.MustNewConstMetric(descFiles, prometheus.GaugeValue, float64(d.FilesAdjusted), d.Name)
		}
		// Sum duplicates so that a source reporting the same triple twice
		// cannot make the scrape fail.
		type key struct{ dev, act, res string }
		sums := map[key]uint64{}
		var order []key
		// Every action and result on every watched device, at zero until
		// it happens.
		for _, d := range ts.Devices {
			for _, a := range ActionNames {
				for _, r := range ActionResults {
					k := key{d.Name, a, r}
					if _, ok := sums[k]; !ok {
						order = append(order, k)
						sums[k] = 0
					}
				}
			}
		}
		for _, a := range ts.Actions {
			k := key{a.Device, a.Action, a.Result}
			if _, ok := sums[k]; !ok {
				order = append(order, k)
			}
			sums[k] += a.Count
		}
		for _, k := range order {
			ch <- prometheus.MustNewConstMetric(descActions, prometheus.CounterValue, float64(sums[k]), k.dev, k.act, k.res)
		}
	}

	if c.src.DetectorFiles != nil {
		tracked, evicted := c.src.DetectorFiles()
		ch <- prometheus.MustNewConstMetric(descTracked, prometheus.GaugeValue, float64(tracked))
		ch <- prometheus.MustNewConstMetric(descEvicted, prometheus.CounterValue, float64(evicted))
	}

	c.collectFailSlow(ch, devices)

	if c.src.Detector != nil {
		snap, ok := c.src.Detector()
		if !ok {
			return
		}
		active := map[[2]string]bool{}
		seen := map[string]bool{}
		for _, d := range devices {
			seen[d] = true
		}
		for _, d := range snap.Devices {
			if n := c.src.devName(d.Device); !seen[n] {
				seen[n] = true
				devices = append(devices, n)
			}
		}
		for _, r := range snap.Regimes {
			n := c.src.devName(r.Device)
			active[[2]string{n, string(r.Kind)}] = true
			if !seen[n] {
				seen[n] = true
				devices = append(devices, n)
			}
		}
		// Every kind on every device, 0 or 1, so that alerts and
		// dashboards see a regime end rather than a series vanish.
		for _, n := range devices {
			for _, k := range detector.Kinds {
				ch <- prometheus.MustNewConstMetric(descRegime, prometheus.GaugeValue, b2f(active[[2]string{n, string(k)}]), n, string(k))
			}
		}
	}
}

// collectFailSlow exports the fail-slow verdicts: readaheadd_disk_slow and
// readaheadd_disk_slow_files for every watched device (0 until there is
// something to report), the ratio only with a verdict.
func (c *Collector) collectFailSlow(ch chan<- prometheus.Metric, watched []string) {
	if c.src.FailSlow == nil {
		return
	}
	type row struct {
		slow, files float64
		ratio       float64
		ref         string
	}
	rows := map[string]*row{}
	order := []string{}
	for _, n := range watched {
		if rows[n] == nil {
			rows[n] = &row{}
			order = append(order, n)
		}
	}
	for _, d := range c.src.FailSlow() {
		n := c.src.devName(d.Device)
		r := rows[n]
		if r == nil {
			r = &row{}
			rows[n] = r
			order = append(order, n)
		}
		r.slow, r.files = b2f(d.Slow), float64(len(d.SlowFiles))
		if d.Reference != failslow.None && d.Held > 0 {
			r.ratio, r.ref = d.Held, string(d.Reference)
		}
	}
	for _, n := range order {
		r := rows[n]
		ch <- prometheus.MustNewConstMetric(descSlow, prometheus.GaugeValue, r.slow, n)
		ch <- prometheus.MustNewConstMetric(descSlowFile, prometheus.GaugeValue, r.files, n)
		if r.ref != "" {
			ch <- prometheus.MustNewConstMetric(descSlowRat, prometheus.GaugeValue, r.ratio, n, r.ref)
		}
	}
}

// Log2USHistogram converts the probe's in-kernel log2 histogram into
// Prometheus form: bucket i < len-1 counts latencies in [2^i, 2^(i+1))
// microseconds (bucket 0 from zero) and the last bucket everything above,
// as probe.HistUpperBound defines them. It returns the total count, the
// given sum, and cumulative counts keyed by upper bound in seconds; the last
// bucket only appears in +Inf. The kernel's bound is exclusive and
// Prometheus' inclusive: a latency of exactly 2^(i+1) us lands one bucket
// higher, below the histogram's resolution.
func Log2USHistogram(buckets []uint64, sumSeconds float64) (uint64, float64, map[float64]uint64) {
	out := make(map[float64]uint64, len(buckets))
	var cum uint64
	for i, n := range buckets {
		cum += n
		if i < len(buckets)-1 {
			out[math.Ldexp(1, i+1)*1e-6] = cum
		}
	}
	return cum, sumSeconds, out
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// NewRegistry returns a registry with the readaheadd collector and the Go
// and process collectors.
func NewRegistry(src Sources) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		NewCollector(src),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}
