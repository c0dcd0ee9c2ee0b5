package detector

import (
	"math"
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
	// P10 and P50: the cell's 10th percentile and median latency. The
	// 10th percentile is the requests that found the least queue ahead of
	// them: a fixed cost added to every request shows there undiluted
	// by queueing (a burst of n requests sharing one transfer channel
	// completes at L+t, L+2t, ... L+nt).
	P10, P50 time.Duration
	// MeanDepth is the cell's mean of read requests in flight at
	// completion (probe.Record.Depth); MeanSize its mean request size in
	// bytes.
	MeanDepth float64
	MeanSize  float64
	// QueueBytes estimates the bytes in flight around the cell's requests:
	// MeanDepth times the device's mean request size over the window. A
	// request waits for the bytes ahead of it, not their count: a 128 KiB
	// read behind 1 MiB ones waits eight times longer than behind its
	// like.
	QueueBytes float64
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

// classKey groups by size class alone: a file's requests and the rest of
// its disk's, over the same window, share the disk's queue, so they are
// matched by size only (cells of one depth bucket were too sparse once
// large windows spread requests over many buckets).
func classKey(s *sample) uint16 { return uint16(s.class) << 8 }

// diskCells is the device's window sorted by cell and latency, for its
// latency profile and for each file's latency against the rest of the disk.
type diskCells struct {
	keys []uint16  // per cell
	lo   []int     // start of each cell in lats
	lats []float64 // ns, sorted within each cell
	// depth, size: summed depth and bytes of each cell's requests
	depth, size []float64
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
func buildCells(set []sample, key func(*sample) uint16) diskCells {
	type kv struct {
		key   uint16
		lat   float64
		depth uint32
		size  uint32
	}
	all := make([]kv, len(set))
	for i := range set {
		all[i] = kv{key(&set[i]), float64(set[i].lat), max(set[i].depth, 1), set[i].bytes}
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
			dc.depth = append(dc.depth, 0)
			dc.size = append(dc.size, 0)
		}
		dc.lats[i] = e.lat
		dc.depth[len(dc.depth)-1] += float64(e.depth)
		dc.size[len(dc.size)-1] += float64(e.size)
	}
	return dc
}

// profile is the device's latency per cell; devMeanSize is the device's
// mean request size over the same window.
func (dc *diskCells) profile(devMeanSize float64) []LatencyCell {
	out := make([]LatencyCell, len(dc.keys))
	for i, k := range dc.keys {
		v := dc.values(i)
		out[i] = LatencyCell{Class: uint8(k >> 8), Depth: uint8(k), Requests: len(v), P10: durNS(percentile(v, 0.1)), P50: durNS(percentile(v, 0.5)),
			MeanDepth: dc.depth[i] / float64(len(v)), MeanSize: dc.size[i] / float64(len(v))}
		out[i].QueueBytes = out[i].MeanDepth * max(devMeanSize, out[i].MeanSize)
	}
	return out
}

// MinOthersInCell is how many requests of other files (or unattributed
// ones) a cell must hold for a file's requests in it to be compared with
// them.
const MinOthersInCell = 8

// othersQuantile is the p-quantile (nearest rank) of sorted cell values
// without the sorted values own (a subset of cell): the rest of the disk,
// in that cell. ok is false when fewer than MinOthersInCell remain.
func othersQuantile(cell, own []float64, p float64) (float64, bool) {
	m := len(cell) - len(own)
	if m < MinOthersInCell {
		return 0, false
	}
	// The smallest cell value with at least r+1 others at or below it
	// (the count is monotone in the index).
	r := max(0, int(math.Ceil(p*float64(m)))-1)
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

// DiskRatioQuantile is the quantile at which files are compared with the
// rest of their disk (LatencyCell.P10: where queueing dilutes a fixed
// cost least).
const DiskRatioQuantile = 0.1

// fillDiskRatios sets, for each file with requests in set (set = win[:n]),
// DiskRatio: the DiskRatioQuantile of its requests' latencies, each over
// the same quantile of the rest of the disk's requests of the same size
// class (dc built with classKey), and DiskRatioRequests, how many of its
// requests had such a reference. A file slower than its own disk has a
// ratio above 1, however slow or fast the disk is.
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
			k := classKey(s)
			byCell[k] = append(byCell[k], float64(s.lat))
		}
		ratios = ratios[:0]
		for k, own := range byCell {
			ci, ok := dc.cell(k)
			if !ok {
				continue
			}
			slices.Sort(own)
			ref, ok := othersQuantile(dc.values(ci), own, DiskRatioQuantile)
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
			a.stats.DiskRatio = percentile(ratios, DiskRatioQuantile)
		}
	}
}

// unqueuedAtIssue returns the samples of set (one device's window) issued
// while no other sample of set was in flight: every request issued
// before it had completed. The first issued is left out (what was in
// flight before the window is unknown), and so is everything when any
// sample stands for several requests (sampling: a request not streamed
// could have been ahead).
func unqueuedAtIssue(set []sample) []sample {
	idx := make([]int, 0, len(set))
	for i := range set {
		if set[i].weight > 1 {
			return nil
		}
		idx = append(idx, i)
	}
	sort.Slice(idx, func(a, b int) bool { return set[idx[a]].issue() < set[idx[b]].issue() })
	var out []sample
	var busyUntil int64 // latest completion among the requests issued so far
	for k, i := range idx {
		s := &set[i]
		if k > 0 && busyUntil <= s.issue() {
			out = append(out, *s)
		}
		busyUntil = max(busyUntil, s.complete)
	}
	return out
}
