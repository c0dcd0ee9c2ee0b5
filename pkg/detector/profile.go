package detector

import (
	"math/bits"
	"slices"
	"sort"
	"time"
)

// LatencyCell is a device's median read latency over its window for the
// requests of one size class issued into one queue-depth bucket: latency
// depends on both, so disks (and files) are compared cell by cell.
type LatencyCell struct {
	Class    uint8 // size class: 2^(Class-1)+1..2^Class bytes
	Depth    uint8 // depth bucket (DepthBucket): read requests in flight 2^(Depth-1)+1..2^Depth
	Requests int   // requests of the window in the cell (records, not weighted)
	P50      time.Duration
}

// DepthBucket is the queue-depth bucket of a request that completed with
// depth read requests of its device in flight: 0 for 1 (or 0), then
// ceil(log2(depth)): 2 is 1, 3-4 is 2, 5-8 is 3, ...
func DepthBucket(depth uint32) uint8 {
	if depth <= 1 {
		return 0
	}
	return uint8(bits.Len32(depth - 1))
}

// cellKey orders cells by class, then depth bucket.
func cellKey(s *sample) uint16 { return uint16(s.class)<<8 | uint16(DepthBucket(s.depth)) }

// diskCells is the device's window sorted by cell and latency, for its
// latency profile and for each file's latency against the rest of the disk.
type diskCells struct {
	keys []uint16  // per cell
	lo   []int     // start of each cell in lats
	lats []float64 // ns, sorted within each cell
}

func (dc *diskCells) cell(key uint16) (int, bool) {
	i, ok := slices.BinarySearch(dc.keys, key)
	return i, ok
}

func (dc *diskCells) values(i int) []float64 {
	hi := len(dc.lats)
	if i+1 < len(dc.lo) {
		hi = dc.lo[i+1]
	}
	return dc.lats[dc.lo[i]:hi]
}

// buildCells sorts set's latencies by cell. Every record counts once: the
// probe samples small and unattributed requests uniformly, so a cell's
// median is that of the requests the records stand for.
func buildCells(set []sample) diskCells {
	type kv struct {
		key uint16
		lat float64
	}
	all := make([]kv, len(set))
	for i := range set {
		all[i] = kv{cellKey(&set[i]), float64(set[i].lat)}
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].key != all[j].key {
			return all[i].key < all[j].key
		}
		return all[i].lat < all[j].lat
	})
	var dc diskCells
	dc.lats = make([]float64, len(all))
	for i, e := range all {
		if i == 0 || e.key != all[i-1].key {
			dc.keys = append(dc.keys, e.key)
			dc.lo = append(dc.lo, i)
		}
		dc.lats[i] = e.lat
	}
	return dc
}

// profile is the device's latency per cell.
func (dc *diskCells) profile() []LatencyCell {
	out := make([]LatencyCell, len(dc.keys))
	for i, k := range dc.keys {
		v := dc.values(i)
		out[i] = LatencyCell{Class: uint8(k >> 8), Depth: uint8(k), Requests: len(v), P50: durNS(percentile(v, 0.5))}
	}
	return out
}

// MinOthersInCell is how many requests of other files (or unattributed
// ones) a cell must hold for a file's requests in it to be compared with
// them.
const MinOthersInCell = 8

// othersMedian is the median of sorted cell values without the sorted
// values own (a subset of cell): the rest of the disk, in that cell. ok is
// false when fewer than MinOthersInCell remain.
func othersMedian(cell, own []float64) (float64, bool) {
	m := len(cell) - len(own)
	if m < MinOthersInCell {
		return 0, false
	}
	// The lower median of the others: the smallest cell value with at
	// least r+1 others at or below it (the count is monotone in the index).
	r := (m - 1) / 2
	count := func(i int) int {
		v := cell[i]
		return sort.Search(len(cell), func(j int) bool { return cell[j] > v }) -
			sort.Search(len(own), func(j int) bool { return own[j] > v })
	}
	i := sort.Search(len(cell), func(i int) bool { return count(i) >= r+1 })
	if i == len(cell) {
		return 0, false
	}
	return cell[i], true
}

// fillDiskRatios sets, for each file with requests in set (set = win[:n]),
// DiskRatio: the median over its requests of latency over the median of the
// rest of the disk's requests of the same cell (size class and depth
// bucket), and DiskRatioRequests, how many of its requests had such a
// reference. A file slower than its own disk has a ratio above 1, however
// slow or fast the disk is.
func (d *Detector) fillDiskRatios(dc *diskCells, set []sample) {
	sc := &d.sc
	byCell := map[uint16][]float64{}
	var ratios []float64
	for ai := range sc.aggs {
		a := &sc.aggs[ai]
		clear(byCell)
		for _, i := range a.set {
			if int(i) >= len(set) {
				continue
			}
			s := &set[i]
			k := cellKey(s)
			byCell[k] = append(byCell[k], float64(s.lat))
		}
		ratios = ratios[:0]
		for k, own := range byCell {
			ci, ok := dc.cell(k)
			if !ok {
				continue
			}
			slices.Sort(own)
			ref, ok := othersMedian(dc.values(ci), own)
			if !ok || ref <= 0 {
				continue
			}
			for _, l := range own {
				ratios = append(ratios, l/ref)
			}
		}
		a.stats.DiskRatio, a.stats.DiskRatioRequests = 0, len(ratios)
		if len(ratios) > 0 {
			slices.Sort(ratios)
			a.stats.DiskRatio = percentile(ratios, 0.5)
		}
	}
}
