package failslow

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

const kib = 1024

// cell is a latency cell with p10 in milliseconds.
func cell(class, depth uint8, n int, p10ms, meanDepth float64) detector.LatencyCell {
	size := math.Ldexp(0.75, int(class)) // mean size inside the class
	return detector.LatencyCell{Class: class, Depth: depth, Requests: n,
		P10: time.Duration(p10ms * float64(time.Millisecond)), P50: time.Duration(1.3 * p10ms * float64(time.Millisecond)),
		MeanDepth: meanDepth, MeanSize: size, QueueBytes: meanDepth * size}
}

// behind is c queued behind requests of devMeanSize bytes on average.
func behind(c detector.LatencyCell, devMeanSize float64) detector.LatencyCell {
	c.QueueBytes = c.MeanDepth * devMeanSize
	return c
}

// ssd is the latency of a lab-like device: fixed cost plus 150 MB/s.
func ssd(fixedMS float64, class uint8) float64 {
	return fixedMS + math.Ldexp(0.75, int(class))/150e6*1e3
}

func TestFitModel(t *testing.T) {
	for _, tc := range []struct {
		name           string
		cells          []detector.LatencyCell
		valid          bool
		fixedMS, perMB float64 // expected, when valid
	}{
		{"one class: no model", []detector.LatencyCell{cell(17, 0, 100, 1, 1)}, false, 0, 0},
		{"fixed 0.15 ms + 150 MB/s", []detector.LatencyCell{
			cell(17, 0, 40, ssd(0.15, 17), 1), cell(18, 0, 40, ssd(0.15, 18), 1), cell(20, 0, 40, ssd(0.15, 20), 1)}, true, 0.15, 1e6 / 150e6 * 1e3},
		{"fixed 3.15 ms", []detector.LatencyCell{
			cell(17, 0, 40, ssd(3.15, 17), 1), cell(19, 1, 40, ssd(3.15, 19), 2)}, true, 3.15, 1e6 / 150e6 * 1e3},
		{"deep cells are not points", []detector.LatencyCell{
			cell(17, 0, 40, ssd(0.15, 17), 1), cell(19, 3, 40, 30, 6)}, false, 0, 0},
		{"the shallowest cell of a class is its point; one odd class cannot swing Theil-Sen", []detector.LatencyCell{
			cell(17, 0, 40, ssd(0.15, 17), 1), cell(17, 1, 40, 9, 2), cell(18, 0, 40, ssd(0.15, 18), 1),
			cell(19, 0, 40, 25, 1), cell(20, 0, 40, ssd(0.15, 20), 1), cell(21, 0, 40, ssd(0.15, 21), 1)}, true, 0.15, 1e6 / 150e6 * 1e3},
		{"too few requests in a cell", []detector.LatencyCell{cell(17, 0, 4, 1, 1), cell(18, 0, 4, 2, 1)}, false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := FitModel(tc.cells, 8)
			require.Equal(t, tc.valid, m.Valid(), "%+v", m)
			if tc.valid {
				assert.InDelta(t, tc.fixedMS, m.FixedNS/1e6, 0.05)
				assert.InDelta(t, tc.perMB, m.PerByteNS*1e6/1e6, 0.05)
			}
		})
	}
}

func TestCellRatio(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    detector.LatencyCell
		ref  []detector.LatencyCell
		ok   bool
		want float64
	}{
		{"same class and depth", cell(17, 0, 20, 4, 1), []detector.LatencyCell{cell(17, 0, 20, 1, 1)}, true, 4},
		{"the nearest deeper cell is the reference", cell(17, 0, 20, 4, 1),
			[]detector.LatencyCell{cell(17, 2, 20, 2, 3.5), cell(17, 4, 20, 8, 12)}, true, 2},
		{"a shallower reference is scaled up to the cell's depth", cell(17, 3, 20, 6, 6),
			[]detector.LatencyCell{cell(17, 0, 20, 1, 1)}, true, 1},
		{"a shallower reference counts as unqueued", cell(17, 3, 20, 8, 8),
			[]detector.LatencyCell{cell(17, 1, 20, 1, 2)}, true, 1},
		{"same bucket, deeper on average", cell(17, 3, 20, 8, 8),
			[]detector.LatencyCell{cell(17, 3, 20, 2, 5)}, true, 2.5},
		{"queued behind 1 MiB requests: their bytes count", behind(cell(17, 3, 20, 30, 6), 1<<20),
			[]detector.LatencyCell{cell(17, 3, 20, 5, 6)}, true, 30.0 / (5 * (6 * (1 << 20)) / (6 * math.Ldexp(0.75, 17)))},
		{"a reference queued behind larger requests is not scaled down", cell(17, 3, 20, 8, 6),
			[]detector.LatencyCell{behind(cell(17, 3, 20, 4, 6), 1<<20)}, true, 2},
		{"no cell of the class", cell(17, 0, 20, 4, 1), []detector.LatencyCell{cell(20, 0, 20, 1, 1)}, false, 0},
		{"reference cell too small", cell(17, 0, 20, 4, 1), []detector.LatencyCell{cell(17, 0, 3, 1, 1)}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := cellRatio(tc.c, tc.ref, 16)
			require.Equal(t, tc.ok, ok)
			assert.InDelta(t, tc.want, r, 1e-9)
		})
	}
}

// disk is a device's snapshot: its profile.
func disk(dev probe.Dev, cells ...detector.LatencyCell) detector.DeviceStats {
	return detector.DeviceStats{Device: dev, Profile: cells}
}

var (
	devA = probe.MkDev(8, 16)
	devB = probe.MkDev(8, 32)
	devC = probe.MkDev(8, 48)
)

// noisy multiplies ms by a factor in [1-j, 1+j].
func noisy(r *rand.Rand, ms, j float64) float64 { return ms * (1 - j + 2*j*r.Float64()) }

// streaming is a healthy disk read by 128 KiB readahead at depth 1-2,
// fixed cost fixedMS.
func streaming(r *rand.Rand, dev probe.Dev, fixedMS float64) detector.DeviceStats {
	return disk(dev, cell(17, 0, 120, noisy(r, ssd(fixedMS, 17), 0.25), 1), cell(17, 1, 60, noisy(r, ssd(fixedMS, 17)*1.1, 0.25), 2))
}

// tuned is a disk whose streams a tuner gave windows of several MiB: most
// reads are 1-2 MiB, queued 2-6 deep on a 150 MB/s channel (a fixed cost
// is diluted there, and the host's jitter is a few ms), 128-256 KiB reads
// behind them wait for their transfers, and only each stream's first
// small readahead requests (a handful a window, r decides how many) are
// issued with nothing ahead of them (Unqueued).
func tuned(r *rand.Rand, dev probe.Dev, fixedMS float64) detector.DeviceStats {
	big := func(depth uint8, meanDepth float64) detector.LatencyCell {
		wait := (meanDepth - 1) * math.Ldexp(0.75, 21) / 150e6 * 1e3
		return behind(cell(21, depth, 30, noisy(r, ssd(fixedMS, 21)+wait, 0.35), meanDepth), 1.4*1024*kib)
	}
	behindBig := ssd(fixedMS, 18) + math.Ldexp(0.75, 21)/150e6*1e3
	d := disk(dev,
		// alone at completion, but some waited behind a 2 MiB transfer
		cell(18, 0, 4+r.IntN(8), noisy(r, behindBig, 0.5), 1),
		behind(cell(18, 1, 6, noisy(r, behindBig, 0.3), 2), 1.4*1024*kib),
		big(0, 1), big(1, 2), big(2, 3.5), big(3, 6))
	d.Unqueued = []detector.LatencyCell{cell(18, 0, 4+r.IntN(8), noisy(r, ssd(fixedMS, 18), 0.15), 1), big(0, 1)}
	return d
}

// tunedLarge is tuned with too few small unqueued reads to compare (2 a
// window): the unqueued 256-512 KiB, 1 MiB and 2 MiB reads still draw the
// disk's cost line.
func tunedLarge(r *rand.Rand, dev probe.Dev, fixedMS float64) detector.DeviceStats {
	d := tuned(r, dev, fixedMS)
	d.Unqueued = []detector.LatencyCell{
		cell(18, 0, 2, noisy(r, ssd(fixedMS, 18), 0.1), 1),
		cell(19, 0, 4+r.IntN(4), noisy(r, ssd(fixedMS, 19), 0.1), 1),
		cell(20, 0, 60+r.IntN(60), noisy(r, ssd(fixedMS, 20), 0.05), 1),
		cell(21, 0, 5+r.IntN(15), noisy(r, ssd(fixedMS, 21), 0.1), 1),
	}
	return d
}

// TestJudgeScenarios drives the judge with fake snapshots, one a second.
func TestJudgeScenarios(t *testing.T) {
	type phase struct {
		evals int
		snap  func(r *rand.Rand, i int) []detector.DeviceStats
	}
	for _, tc := range []struct {
		name      string
		phases    []phase
		named     map[probe.Dev]bool // at the end
		everNamed map[probe.Dev]bool // at any evaluation (false: never)
		reference map[probe.Dev]Reference
		namedBy   int // if > 0: the slow disk named within this many evaluations of the last phase
	}{
		{
			name: "two healthy disks alike: nothing named",
			phases: []phase{{600, func(r *rand.Rand, _ int) []detector.DeviceStats {
				return []detector.DeviceStats{streaming(r, devA, 0.15), streaming(r, devB, 0.15)}
			}}},
			everNamed: map[probe.Dev]bool{devA: false, devB: false},
			reference: map[probe.Dev]Reference{devA: Peers, devB: Peers},
		},
		{
			name: "one disk 3 ms slower on every read: named within the hold time, the other not",
			phases: []phase{
				{60, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{streaming(r, devA, 0.15), streaming(r, devB, 0.15)}
				}},
				{20, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{streaming(r, devA, 3.15), streaming(r, devB, 0.15)}
				}},
			},
			named:     map[probe.Dev]bool{devA: true, devB: false},
			everNamed: map[probe.Dev]bool{devB: false},
			reference: map[probe.Dev]Reference{devA: Peers},
			namedBy:   10,
		},
		{
			name: "different request sizes, no size in common: no peer verdict, each against its own baseline, nothing named",
			phases: []phase{{300, func(r *rand.Rand, _ int) []detector.DeviceStats {
				return []detector.DeviceStats{
					streaming(r, devA, 0.15),
					disk(devB, cell(21, 0, 60, noisy(r, ssd(0.15, 21), 0.25), 1)),
				}
			}}},
			everNamed: map[probe.Dev]bool{devA: false, devB: false},
			reference: map[probe.Dev]Reference{devA: Baseline, devB: Baseline},
		},
		{
			name: "different sizes in common classes: the cost models agree, nothing named",
			phases: []phase{{300, func(r *rand.Rand, _ int) []detector.DeviceStats {
				return []detector.DeviceStats{
					disk(devA, cell(17, 0, 100, noisy(r, ssd(0.15, 17), 0.2), 1), cell(18, 0, 20, noisy(r, ssd(0.15, 18), 0.2), 1)),
					disk(devB, cell(18, 0, 20, noisy(r, ssd(0.15, 18), 0.2), 1), cell(20, 0, 100, noisy(r, ssd(0.15, 20), 0.2), 1), cell(21, 0, 40, noisy(r, ssd(0.15, 21), 0.2), 1)),
				}
			}}},
			everNamed: map[probe.Dev]bool{devA: false, devB: false},
			reference: map[probe.Dev]Reference{devA: Peers, devB: Peers},
		},
		{
			name: "different queue depths: a saturated deep queue is not a slow disk",
			phases: []phase{{300, func(r *rand.Rand, _ int) []detector.DeviceStats {
				// b keeps 8 requests of 128 KiB in flight on a 150 MB/s
				// channel: each waits for the others' transfers.
				deep := ssd(0.15, 17) + 7*math.Ldexp(0.75, 17)/150e6*1e3
				return []detector.DeviceStats{
					streaming(r, devA, 0.15),
					disk(devB, cell(17, 3, 200, noisy(r, deep, 0.2), 8)),
				}
			}}},
			everNamed: map[probe.Dev]bool{devA: false, devB: false},
		},
		{
			name: "one disk read unpaced at a 1 MiB window: its small reads queue behind large ones, it is not slow",
			phases: []phase{
				{60, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{streaming(r, devA, 0.15), streaming(r, devB, 0.15)}
				}},
				{300, func(r *rand.Rand, _ int) []detector.DeviceStats {
					// a: 1 MiB requests 6 deep on a 150 MB/s channel, and
					// the first 128 KiB reads of each pass behind them.
					wait := 5 * float64(1<<20) / 150e6 * 1e3
					return []detector.DeviceStats{
						disk(devA, behind(cell(17, 3, 40, noisy(r, ssd(0.15, 17)+wait, 0.2), 6.5), 900*kib),
							behind(cell(20, 3, 150, noisy(r, ssd(0.15, 20)+wait, 0.2), 6.5), 900*kib)),
						streaming(r, devB, 0.15),
					}
				}},
			},
			everNamed: map[probe.Dev]bool{devA: false, devB: false},
		},
		{
			name: "windows of several MiB on both disks: one 3 ms slower named on its small unqueued reads, the other not",
			phases: []phase{
				{60, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{tuned(r, devA, 0.15), tuned(r, devB, 0.15)}
				}},
				{30, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{tuned(r, devA, 3.15), tuned(r, devB, 0.15)}
				}},
			},
			named:     map[probe.Dev]bool{devA: true, devB: false},
			everNamed: map[probe.Dev]bool{devB: false},
			reference: map[probe.Dev]Reference{devA: Peers},
			namedBy:   30, // windows without enough unqueued reads judge on diluted cells
		},
		{
			name: "windows of several MiB, too few small unqueued reads: judged on the unqueued cost lines",
			phases: []phase{
				{600, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{tunedLarge(r, devA, 0.15), tunedLarge(r, devB, 0.15)}
				}},
				{20, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{tunedLarge(r, devA, 3.15), tunedLarge(r, devB, 0.15)}
				}},
			},
			named:     map[probe.Dev]bool{devA: true, devB: false},
			everNamed: map[probe.Dev]bool{devB: false},
			reference: map[probe.Dev]Reference{devA: Peers},
			namedBy:   10,
		},
		{
			name: "one disk with windows of several MiB beside one at 128 KiB (a trial): nothing named",
			phases: []phase{{600, func(r *rand.Rand, i int) []detector.DeviceStats {
				if i%20 < 10 {
					return []detector.DeviceStats{tuned(r, devA, 0.15), streaming(r, devB, 0.15)}
				}
				return []detector.DeviceStats{streaming(r, devA, 0.15), tuned(r, devB, 0.15)}
			}}},
			everNamed: map[probe.Dev]bool{devA: false, devB: false},
		},
		{
			name: "unqueued reads of different sizes within a class: the larger are not a slow disk",
			phases: []phase{{300, func(r *rand.Rand, _ int) []detector.DeviceStats {
				a := cell(17, 0, 40, noisy(r, 0.15+120*kib/150e6*1e3, 0.2), 1)
				a.MeanSize = 120 * kib
				b := cell(17, 0, 40, noisy(r, 0.15+66*kib/150e6*1e3, 0.2), 1)
				b.MeanSize = 66 * kib
				da, db := disk(devA), disk(devB)
				da.Unqueued, db.Unqueued = []detector.LatencyCell{a}, []detector.LatencyCell{b}
				return []detector.DeviceStats{da, db}
			}}},
			everNamed: map[probe.Dev]bool{devA: false, devB: false},
		},
		{
			name: "a disk with no reads has no verdict",
			phases: []phase{{100, func(r *rand.Rand, _ int) []detector.DeviceStats {
				return []detector.DeviceStats{streaming(r, devA, 0.15), streaming(r, devB, 0.15), disk(devC)}
			}}},
			everNamed: map[probe.Dev]bool{devC: false},
			reference: map[probe.Dev]Reference{devC: None},
		},
		{
			name: "single disk: against its learned baseline",
			phases: []phase{
				{120, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{streaming(r, devA, 0.15)}
				}},
				{20, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{streaming(r, devA, 3.15)}
				}},
			},
			named:     map[probe.Dev]bool{devA: true},
			reference: map[probe.Dev]Reference{devA: Baseline},
			namedBy:   10,
		},
		{
			name: "single disk slow from the start: learned as normal (no reference says otherwise)",
			phases: []phase{{200, func(r *rand.Rand, _ int) []detector.DeviceStats {
				return []detector.DeviceStats{streaming(r, devA, 3.15)}
			}}},
			everNamed: map[probe.Dev]bool{devA: false},
		},
		{
			name: "a slow disk recovers: cleared",
			phases: []phase{
				{40, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{streaming(r, devA, 3.15), streaming(r, devB, 0.15), streaming(r, devC, 0.15)}
				}},
				{20, func(r *rand.Rand, _ int) []detector.DeviceStats {
					return []detector.DeviceStats{streaming(r, devA, 0.15), streaming(r, devB, 0.15), streaming(r, devC, 0.15)}
				}},
			},
			named: map[probe.Dev]bool{devA: false},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, err := New(Config{})
			require.NoError(t, err)
			r := rand.New(rand.NewPCG(1, 2))
			ever := map[probe.Dev]bool{}
			var last []Disk
			now := time.Duration(0)
			firstNamed := -1
			for pi, ph := range tc.phases {
				for i := range ph.evals {
					now += time.Second
					last = j.Update(detector.Snapshot{Now: now, Devices: ph.snap(r, i)})
					for _, d := range last {
						if d.Slow {
							ever[d.Device] = true
							if pi == len(tc.phases)-1 && firstNamed < 0 {
								firstNamed = i + 1
							}
						}
					}
				}
			}
			for dev, want := range tc.everNamed {
				assert.Equal(t, want, ever[dev], "%s ever named", dev)
			}
			byDev := map[probe.Dev]Disk{}
			for _, d := range last {
				byDev[d.Device] = d
			}
			for dev, want := range tc.named {
				assert.Equal(t, want, byDev[dev].Slow, "%s named at the end: %+v", dev, byDev[dev])
			}
			for dev, want := range tc.reference {
				assert.Equal(t, want, byDev[dev].Reference, "%s reference", dev)
			}
			if tc.namedBy > 0 {
				require.Positive(t, firstNamed, "never named")
				assert.LessOrEqual(t, firstNamed, tc.namedBy, "named after %d evaluations", firstNamed)
			}
		})
	}
}

func TestJudgeFiles(t *testing.T) {
	j, err := New(Config{})
	require.NoError(t, err)
	slow := probe.FileKey{Dev: devA, Ino: 12}
	ok := probe.FileKey{Dev: devA, Ino: 13}
	few := probe.FileKey{Dev: devA, Ino: 14}
	var last []Disk
	for i := range 5 {
		last = j.Update(detector.Snapshot{Now: time.Duration(i+1) * time.Second,
			Devices: []detector.DeviceStats{disk(devA, cell(17, 0, 200, 1, 1))},
			Files: []detector.FileStats{
				{Key: slow, Device: devA, DiskRatio: 2.8, DiskRatioRequests: 100},
				{Key: ok, Device: devA, DiskRatio: 1.1, DiskRatioRequests: 100},
				{Key: few, Device: devA, DiskRatio: 5, DiskRatioRequests: 10},
			}})
		if i < 2 {
			assert.Empty(t, last[0].SlowFiles, "named before its hold (evaluation %d)", i+1)
		}
	}
	require.Len(t, last, 1)
	require.Len(t, last[0].SlowFiles, 1, "only the file slower than its disk over enough requests")
	assert.Equal(t, slow, last[0].SlowFiles[0].Key)
	assert.Equal(t, 3*time.Second, last[0].SlowFiles[0].Since)
	// It recovers: cleared at once.
	last = j.Update(detector.Snapshot{Now: 6 * time.Second, Devices: []detector.DeviceStats{disk(devA, cell(17, 0, 200, 1, 1))},
		Files: []detector.FileStats{{Key: slow, Device: devA, DiskRatio: 1.0, DiskRatioRequests: 100}}})
	assert.Empty(t, last[0].SlowFiles)
}

func TestConfigValidate(t *testing.T) {
	assert.NoError(t, DefaultConfig().Validate())
	bad := DefaultConfig()
	bad.Exit = 2
	assert.Error(t, bad.Validate())
	bad = DefaultConfig()
	bad.Hold = 0
	assert.Error(t, bad.Validate())
	_, err := New(bad)
	assert.Error(t, err)
}

func TestWeightedMedian(t *testing.T) {
	assert.Equal(t, 0.0, weightedMedian(nil))
	assert.Equal(t, 2.0, weightedMedian([]weighted{{1, 1}, {2, 5}, {9, 1}}))
	assert.Equal(t, 1.0, weightedMedian([]weighted{{1, 5}, {2, 4}}))
}
