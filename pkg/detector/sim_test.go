package detector

import (
	"container/heap"
	"math/rand/v2"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// sim is a small discrete-event model of an SSD-like device, the lab's:
// each read waits its latency (all in parallel), then takes size/bandwidth
// on one shared transfer channel. Readers are closed loops: a sequential
// reader keeps `window` requests in flight, a random reader one at a time
// with a think time. Records come out in completion order.
type sim struct {
	rng      *rand.Rand
	dev      probe.Dev
	base     time.Duration // per-request latency before transfer
	bw       float64       // bytes/s of the shared channel
	chanFree time.Duration
	now      time.Duration
	inflight uint32
	readers  []*reader
	events   evHeap
	// tail: while tailOn(t), a share tailP of all requests waits tailExtra more.
	tailOn    func(t time.Duration) bool
	tailP     float64
	tailExtra time.Duration
	// sampleEvery > 1 streams records as the probe does above a disk's
	// budget: of the samplable requests (under probe.SampleBelow, or not
	// a file's), each of two CPUs streams its own completions 1 in
	// sampleEvery, with that weight; file reads of SampleBelow or more
	// are all streamed.
	sampleEvery uint64
	sampleRng   *rand.Rand
	cpuSeq      [2]uint64
}

// streamed applies the probe's sampling to r: whether it is streamed,
// and its weight.
func (s *sim) streamed(r *probe.Record) bool {
	if s.sampleEvery <= 1 || (r.Kind == probe.KindFile && r.Bytes >= probe.SampleBelow) {
		return true
	}
	if s.sampleRng == nil {
		s.sampleRng = rand.New(rand.NewPCG(7, 7))
	}
	cpu := s.sampleRng.IntN(2)
	n := s.cpuSeq[cpu]
	s.cpuSeq[cpu]++
	r.Weight = uint32(s.sampleEvery)
	return n%s.sampleEvery == 0
}

type reader struct {
	file    probe.FileKey
	seq     bool
	size    uint32
	window  int
	think   time.Duration
	span    uint64 // file size: wraps around
	extent  uint64 // extent size in bytes (0: one extent)
	secBase uint64
	next    uint64
	inFl    int
	// extra latency on every request while on(t) (a file-level shift)
	extra func(t time.Duration) time.Duration
	// extra latency on the first extentReqs requests of each extent while extentOn(t)
	extentOn    func(t time.Duration) bool
	extentExtra time.Duration
	pending     bool          // a start after think time is scheduled
	stopAt      time.Duration // stop issuing at this time (0: never)
	startAt     time.Duration
	// unattributed: the probe cannot name the file (O_DIRECT reads).
	unattributed bool
}

type ev struct {
	at    time.Duration
	rec   probe.Record
	r     *reader
	start bool // an issue after think time
	ready bool // the request's latency has passed: it queues for the channel
}

type evHeap []ev

func (h evHeap) Len() int           { return len(h) }
func (h evHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h evHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *evHeap) Push(x any)        { *h = append(*h, x.(ev)) }
func (h *evHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func newSim(seed uint64, base time.Duration, bw float64) *sim {
	return &sim{rng: rand.New(rand.NewPCG(seed, 42)), dev: probe.MkDev(7, 0), base: base, bw: bw}
}

var nextIno uint64 = 100

func (s *sim) addSeq(size uint32, window int) *reader {
	nextIno++
	r := &reader{file: probe.FileKey{Dev: probe.MkDev(7, 0), Ino: nextIno}, seq: true, size: size, window: window,
		span: 256 << 20, secBase: nextIno << 24}
	s.readers = append(s.readers, r)
	return r
}

func (s *sim) addRandom(size uint32, think time.Duration) *reader {
	nextIno++
	r := &reader{file: probe.FileKey{Dev: probe.MkDev(7, 0), Ino: nextIno}, size: size, window: 1, think: think,
		span: 1 << 30, secBase: nextIno << 24}
	s.readers = append(s.readers, r)
	return r
}

// sector maps a file offset to a device sector: extents are laid out
// non-contiguously (each one 1 GiB apart).
func (r *reader) sector(off uint64) uint64 {
	if r.extent == 0 {
		return r.secBase + off/512
	}
	e := off / r.extent
	return r.secBase + e*(1<<21) + (off%r.extent)/512
}

const extentReqs = 4

func (s *sim) issue(r *reader, at time.Duration) {
	if (r.stopAt != 0 && at >= r.stopAt) || at < r.startAt {
		return
	}
	var off uint64
	size := r.size
	if r.seq {
		off = r.next
		if r.extent != 0 {
			// Split at extent boundaries, as the block layer must.
			if rem := r.extent - off%r.extent; rem < uint64(size) {
				size = uint32(rem)
			}
		}
		r.next = (off + uint64(size)) % r.span
	} else {
		off = (s.rng.Uint64N(r.span / uint64(size))) * uint64(size)
	}
	s.inflight++
	r.inFl++
	// Latency before transfer: base with +-20% jitter and a healthy tail
	// (0.5% of requests 3x).
	pre := time.Duration(float64(s.base) * (0.8 + 0.4*s.rng.Float64()))
	if s.rng.Float64() < 0.005 {
		pre *= 3
	}
	if r.extra != nil {
		pre += r.extra(at)
	}
	if r.extentOn != nil && r.extentOn(at) && r.extent != 0 && off%r.extent < extentReqs*uint64(r.size) {
		pre += r.extentExtra
	}
	if s.tailOn != nil && s.tailOn(at) && s.rng.Float64() < s.tailP {
		pre += s.tailExtra
	}
	rec := probe.Record{Device: s.dev, Sector: r.sector(off), Bytes: size, Issue: at,
		Depth: s.inflight, Kind: probe.KindFile, File: r.file, Offset: off}
	if r.unattributed {
		rec.Kind, rec.File, rec.Offset = probe.KindUnknown, probe.FileKey{}, 0
	}
	heap.Push(&s.events, ev{at: at + pre, rec: rec, r: r, ready: true})
}

// run advances the model to until, feeding d and evaluating every interval;
// onEval sees each snapshot.
func (s *sim) run(d *Detector, until, interval time.Duration, onEval func(Snapshot)) {
	for _, r := range s.readers {
		if !r.pending && r.inFl == 0 {
			r.pending = true
			heap.Push(&s.events, ev{at: max(s.now, r.startAt), r: r, start: true})
		}
	}
	nextEval := (s.now/interval + 1) * interval
	for s.now < until {
		if len(s.events) == 0 || s.events[0].at > nextEval {
			s.now = nextEval
			snap := d.Evaluate(s.now)
			if onEval != nil {
				onEval(snap)
			}
			nextEval += interval
			continue
		}
		e := heap.Pop(&s.events).(ev)
		s.now = e.at
		if e.start {
			e.r.pending = false
			for e.r.inFl < e.r.window {
				before := e.r.inFl
				s.issue(e.r, e.at)
				if e.r.inFl == before {
					break
				}
			}
			continue
		}
		if e.ready {
			// The shared channel serves requests in the order they are ready.
			start := max(e.at, s.chanFree)
			done := start + time.Duration(float64(e.rec.Bytes)/s.bw*1e9)
			s.chanFree = done
			e.rec.Latency = done - e.rec.Issue
			heap.Push(&s.events, ev{at: done, rec: e.rec, r: e.r})
			continue
		}
		s.inflight--
		e.r.inFl--
		if s.streamed(&e.rec) {
			d.Observe(e.rec)
		}
		if e.r.inFl >= e.r.window {
			// The window shrank: let it drain.
		} else if e.r.think > 0 {
			e.r.pending = true
			heap.Push(&s.events, ev{at: e.at + e.r.think, r: e.r, start: true})
		} else {
			for e.r.inFl < e.r.window {
				before := e.r.inFl
				s.issue(e.r, e.at)
				if e.r.inFl == before {
					break
				}
			}
		}
	}
}

// runHealthy is the common warm-up: a sequential reader and two random
// readers for the given time.
func during(a, b time.Duration) func(time.Duration) bool {
	return func(t time.Duration) bool { return t >= a && t < b }
}
