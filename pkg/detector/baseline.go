package detector

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// classBaseline is the healthy latency of one device and size class: EWMAs
// of windowed percentiles, updated only from windows without regimes.
type classBaseline struct {
	p50, p95, p99 float64 // ns
	windows       int     // healthy windows folded into p50/p95
	tailWindows   int     // ... and into p99 (needs more samples)
}

func (c *classBaseline) learned(minWindows int) bool { return c.windows >= minWindows && c.p50 > 0 }
func (c *classBaseline) tailLearned(minWindows int) bool {
	return c.tailWindows >= minWindows && c.p99 > 0
}

// baseline is a device's healthy reference.
type baseline struct {
	classes    [maxClass + 1]classBaseline
	inflight   float64 // requests in flight (Little's law) in healthy windows
	inflightN  int
	depth      float64 // mean device depth at issue (Record.Depth) in healthy windows
	capacity   float64 // bytes/s: decaying peak of the device's busy throughput
	capacityAt int64   // when capacity was last raised or decayed
}

func (b *baseline) init() {}

// ewma folds x into *v with weight alpha, but averages plainly while fewer
// than 1/alpha windows have been seen, so a fresh baseline converges fast.
func ewma(v *float64, n int, x, alpha float64) {
	w := alpha
	if n > 0 && 1/float64(n+1) > alpha {
		w = 1 / float64(n+1)
	}
	if n == 0 {
		w = 1
	}
	*v += w * (x - *v)
}

func (b *baseline) learnClass(c uint8, p50, p95, p99 float64, withTail bool, alpha float64) {
	cb := &b.classes[c]
	ewma(&cb.p50, cb.windows, p50, alpha)
	ewma(&cb.p95, cb.windows, p95, alpha)
	cb.windows++
	if withTail {
		ewma(&cb.p99, cb.tailWindows, p99, alpha)
		cb.tailWindows++
	}
}

func (b *baseline) learnInflight(x, depth, alpha float64) {
	ewma(&b.inflight, b.inflightN, x, alpha)
	ewma(&b.depth, b.inflightN, depth, alpha)
	b.inflightN++
}

// observeCapacity decays the learned peak and raises it to bt if higher.
func (b *baseline) observeCapacity(now int64, bt float64, halfLife time.Duration) {
	if b.capacityAt != 0 && now > b.capacityAt {
		b.capacity *= math.Exp2(-float64(now-b.capacityAt) / float64(halfLife))
	}
	b.capacityAt = now
	if bt > b.capacity {
		b.capacity = bt
	}
}

// BaselineFileVersion is the version of the baseline file format.
const BaselineFileVersion = 1

type baselineFile struct {
	Version int              `json:"version"`
	Devices []baselineDevice `json:"devices"`
}

type baselineDevice struct {
	Device      string          `json:"device"` // major:minor, for people
	Dev         uint32          `json:"dev"`    // kernel encoding
	Inflight    float64         `json:"inflight"`
	InflightN   int             `json:"inflight_windows"`
	Depth       float64         `json:"depth"`
	CapacityBPS float64         `json:"capacity_bytes_per_second"`
	Classes     []baselineClass `json:"classes"`
}

type baselineClass struct {
	Class       int     `json:"size_class"` // requests of 2^(class-1)+1 .. 2^class bytes
	P50         float64 `json:"p50_ns"`
	P95         float64 `json:"p95_ns"`
	P99         float64 `json:"p99_ns"`
	Windows     int     `json:"windows"`
	TailWindows int     `json:"tail_windows"`
}

// SaveBaseline writes every device's learned baseline to path as JSON,
// atomically: a temporary file in the same directory, fsync, rename, fsync
// of the directory.
func (d *Detector) SaveBaseline(path string) error {
	data, err := d.BaselineData()
	if err != nil {
		return err
	}
	return writeAtomic(path, data)
}

// BaselineData encodes the baselines as SaveBaseline writes them, for a
// caller that writes the file itself.
func (d *Detector) BaselineData() ([]byte, error) {
	d.mu.Lock()
	f := baselineFile{Version: BaselineFileVersion}
	for _, ds := range d.devices {
		bd := baselineDevice{
			Device: ds.dev.String(), Dev: uint32(ds.dev),
			Inflight: ds.base.inflight, InflightN: ds.base.inflightN, Depth: ds.base.depth, CapacityBPS: ds.base.capacity,
		}
		for c := range ds.base.classes {
			cb := &ds.base.classes[c]
			if cb.windows == 0 {
				continue
			}
			// The p99 is an average over the windows with enough
			// requests for it, the p50 and p95 over all: each is a
			// percentile, but their averages over different windows
			// need not stay in order. Written in order, as the loader
			// requires of any file (seen: a p99 below the p95 made the
			// daemon's own file rejected at its restart).
			p95 := max(cb.p95, cb.p50)
			p99 := cb.p99
			if cb.tailWindows > 0 {
				p99 = max(p99, p95)
			}
			bd.Classes = append(bd.Classes, baselineClass{Class: c, P50: cb.p50, P95: p95, P99: p99, Windows: cb.windows, TailWindows: cb.tailWindows})
		}
		if len(bd.Classes) > 0 || bd.CapacityBPS > 0 {
			f.Devices = append(f.Devices, bd)
		}
	}
	d.mu.Unlock()
	slices.SortFunc(f.Devices, func(a, b baselineDevice) int { return int(int64(a.Dev) - int64(b.Dev)) })
	data, err := json.MarshalIndent(&f, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("save detector baseline: %w", err)
	}
	return append(data, '\n'), nil
}

func writeAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("save detector baseline: create temporary file in %s (does the state directory exist and is it writable?): %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("save detector baseline: write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("save detector baseline: fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("save detector baseline: close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("save detector baseline: rename to %s: %w", path, err)
	}
	if dh, derr := os.Open(dir); derr == nil {
		// Make the rename itself durable; failure here leaves a valid file.
		_ = dh.Sync()
		_ = dh.Close()
	}
	return nil
}

// ErrBaselineVersion is wrapped by LoadBaseline for a file of another format version.
var ErrBaselineVersion = errors.New("unsupported baseline file version")

// LoadBaseline reads a file written by SaveBaseline and replaces the
// baselines of the devices it names (other devices keep theirs). A
// corrupt, inconsistent or unknown-version file is rejected as a whole with
// an error and nothing is changed: the detector then learns afresh.
func (d *Detector) LoadBaseline(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("load detector baseline: %w", err)
	}
	return d.LoadBaselineData(path, data)
}

// maxBaselineDevices bounds the devices a baseline file may name: each
// becomes a device entry in the detector.
const maxBaselineDevices = 1024

// LoadBaselineData is LoadBaseline on a file's content already read (by a
// caller that reads it with its own bounds); path names it in errors.
func (d *Detector) LoadBaselineData(path string, data []byte) error {
	var f baselineFile
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("load detector baseline %s: corrupt file (delete it to relearn): %w", path, err)
	}
	if f.Version != BaselineFileVersion {
		return fmt.Errorf("load detector baseline %s: version %d, this build reads %d (delete it to relearn): %w", path, f.Version, BaselineFileVersion, ErrBaselineVersion)
	}
	if len(f.Devices) > maxBaselineDevices {
		return fmt.Errorf("load detector baseline %s: %d devices, more than %d (delete the file to relearn)", path, len(f.Devices), maxBaselineDevices)
	}
	loaded := make(map[probe.Dev]baseline, len(f.Devices))
	for _, bd := range f.Devices {
		var b baseline
		if !finiteNonNeg(bd.Inflight, bd.Depth, bd.CapacityBPS) || bd.InflightN < 0 {
			return fmt.Errorf("load detector baseline %s: device %s: invalid in-flight or capacity values (delete the file to relearn)", path, bd.Device)
		}
		b.inflight, b.inflightN, b.depth, b.capacity = bd.Inflight, bd.InflightN, bd.Depth, bd.CapacityBPS
		for _, c := range bd.Classes {
			if c.Class < 0 || c.Class > maxClass || !finiteNonNeg(c.P50, c.P95, c.P99) || c.Windows < 0 || c.TailWindows < 0 ||
				c.P50 > c.P95 || (c.TailWindows > 0 && c.P95 > c.P99) {
				return fmt.Errorf("load detector baseline %s: device %s size class %d: invalid values (need 0 <= p50 <= p95 <= p99; delete the file to relearn)", path, bd.Device, c.Class)
			}
			b.classes[c.Class] = classBaseline{p50: c.P50, p95: c.P95, p99: c.P99, windows: c.Windows, tailWindows: c.TailWindows}
		}
		dev := probe.Dev(bd.Dev)
		if _, dup := loaded[dev]; dup {
			return fmt.Errorf("load detector baseline %s: device %s listed twice (delete the file to relearn)", path, bd.Device)
		}
		loaded[dev] = b
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for dev, b := range loaded {
		ds := d.device(dev)
		ds.base = b
	}
	return nil
}

func finiteNonNeg(xs ...float64) bool {
	for _, x := range xs {
		if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
			return false
		}
	}
	return true
}
