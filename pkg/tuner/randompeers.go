package tuner

// Who the random readers beside a stream are, and whether the stream is
// slower than them.

import (
	"fmt"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// randomReaderBeside reports whether another file on fd's device is read
// randomly now (or its read-around is trimmed).
func (t judgeCtx) randomReaderBeside(fd *fileDec) bool {
	return t.trimmedOn(fd.dev) || t.randomBesideDev(fd.dev.dev, fd.key)
}

// randomOnDevice returns a file read randomly now on the device whose reads
// are read-around sized (an mmap reader: each fault reads the file's window
// around it, so a larger device window makes every fault larger), or one
// trimmed there, if any. A buffered random reader reads what it asks for
// whatever the window and is no reason to keep the device's window down.
func (t judgeCtx) randomOnDevice(dev probe.Dev) (probe.FileKey, bool) {
	for k, td := range t.trims {
		if td.dev != nil && td.dev.dev == dev {
			return k, true
		}
	}
	kb := 0
	if d := t.devs[dev]; d != nil {
		kb = d.orig
	}
	for k, fs := range t.fstats {
		if fs.Device == dev && t.readRandomly(fs) && readAroundSized(fs, min(kb, t.cfg.TrimKB)) && t.snap.Now-fs.LastSeen <= t.cfg.Settle {
			return k, true
		}
	}
	return probe.FileKey{}, false
}

// randomsBeside returns the random readers on dev in the tuner's view,
// other than except, with their service now.
func (t judgeCtx) randomsBeside(dev probe.Dev, except probe.FileKey) []randObs {
	var out []randObs
	for k, fs := range t.fstats {
		if k == except || fs.Device != dev || !t.readRandomly(fs) {
			continue
		}
		svc, ok := serviceOf(fs)
		out = append(out, randObs{key: k, fs: fs, svc: svc, ok: ok, ref: t.randRefs[k]})
	}
	slices.SortFunc(out, func(a, b randObs) int { return compareKeys(a.key, b.key) })
	return out
}

type randObs struct {
	key probe.FileKey
	fs  detector.FileStats
	svc randService
	ok  bool
	ref *randRef
}

// slowerThanPeers reports whether a stream's requests, less the wait
// behind its own, take peerSlowMult times as long as those of the random
// readers on its device (its file is slow, not the device's queue, which
// they wait in too), with why; false with no random reader to compare with.
// Measured on the lab, healthy: the stream's median 2.5 ms, 1.1 of it
// behind its own requests, beside a random reader's 1.2-2.5 ms.
func (t judgeCtx) slowerThanPeers(fs detector.FileStats) (bool, string) {
	var peer time.Duration
	for _, r := range t.randomsBeside(fs.Device, fs.Key) {
		if r.fs.Requests >= minBoundRequests && r.fs.P50 > peer {
			peer = r.fs.P50
		}
	}
	if peer <= 0 || fs.P50 <= 0 {
		return false, ""
	}
	// A stream's requests also wait behind its own: on average half the
	// bytes it keeps in flight, at the device's capacity. A random reader
	// with one fault at a time waits behind no request of its own. What is
	// left is what the device makes the stream's requests wait.
	own := time.Duration(0)
	if capBPS := t.dstats[fs.Device].CapacityBPS; capBPS > 0 && fs.Inflight > 0 {
		own = time.Duration(fs.Inflight * fs.MeanSize / 2 / capBPS * float64(time.Second))
	}
	lat := max(fs.P50-own, fs.P50/4)
	ratio := float64(lat) / float64(peer)
	return ratio >= peerSlowMult, fmt.Sprintf("median %v (%v of it behind its own requests), %.1fx the random readers' beside it",
		fs.P50.Round(10*time.Microsecond), own.Round(10*time.Microsecond), ratio)
}

// randomBesideDev reports whether a file other than except is read
// randomly on dev in the tuner's view.
func (t judgeCtx) randomBesideDev(dev probe.Dev, except probe.FileKey) bool {
	for k, fs := range t.fstats {
		if k != except && fs.Device == dev && t.readRandomly(fs) {
			return true
		}
	}
	return false
}

const (
	// trimMaxSequentiality: only files read this randomly are trimmed.
	trimMaxSequentiality = 0.2
	// trimMinRequests: the file's window must hold this many requests.
	trimMinRequests = 16
	// trimSizeFactor: its requests must average at least this multiple
	// of TrimKB (read-around sized, not reads the reader asked for).
	trimSizeFactor = 4
)

// readRandomly reports whether a file is read now, and randomly, with
// enough requests in the window to tell.
func (t judgeCtx) readRandomly(fs detector.FileStats) bool {
	return t.snap.Now-fs.LastSeen <= t.cfg.Settle && fs.Sequentiality <= trimMaxSequentiality && fs.Requests >= trimMinRequests
}

// readAroundSized reports whether a file's requests are the size a window
// of trimSizeFactor x kb reads around each fault, not what a reader asks.
func readAroundSized(fs detector.FileStats, kb int) bool {
	return fs.MeanSize >= float64(trimSizeFactor*kb*1024)
}

const (
	// minBoundRequests: fewer requests in a window say too little.
	minBoundRequests = 8
	// peerSlowMult: a stream whose median request latency is this many
	// times its random peers' is slowed by its file, not by the queue.
	peerSlowMult = 1.5
)

// serviceOf is a random reader's service in fs, ok if it has enough
// requests to say.
func serviceOf(fs detector.FileStats) (randService, bool) {
	if fs.Requests < trimMinRequests || fs.BusyThroughput <= 0 || fs.MeanSize <= 0 || fs.Inflight <= 0 || fs.P95 <= 0 || fs.P99 <= 0 {
		return randService{}, false
	}
	// Little's law: the mean latency is the requests in flight while busy
	// times the bytes per request over the busy throughput.
	mean := time.Duration(fs.Inflight * fs.MeanSize / fs.BusyThroughput * float64(time.Second))
	return randService{mean: mean, tail: fs.P99, size: fs.MeanSize, requests: fs.Requests}, true
}
