package tuner

// Between Steps: the detector's fast path (regimes entered a moment ago),
// the checks on recent requests, and kept decisions reaching the
// descriptors opened since.

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// fastOn acts at once on the regimes the detector's fast path entered
// (snap: detector.FastPath, between Steps): each file that has no decision
// yet (for contention, each sequential file read on the device) gets one
// and its first step, sized by Little's law from the snapshot's file p95
// and device capacity, without waiting for the next Step. The step is
// judged at the first Step one Settle later, as any other. The snapshot
// holds only the fast path's files and devices; the rest of the tuner's
// view is left as the last Step saw it. recent (over span;
// detector.Recent, or empty) holds the regimes' files' recent requests: a
// regime entered between Steps on a stream that already has a decision
// takes its step measured on them. The snapshot's window reaches back a
// whole Settle, mostly before the onset, and a step measured against the
// stream's rate from before it (a contended stream against its free self)
// looks as if it did not pay.
func (t *Tuner) fastOn(snap, recent detector.Snapshot, span time.Duration) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = nil
	if len(snap.Regimes) == 0 || t.scope.Empty() {
		return nil
	}
	now := t.deps.Clock.Now()
	for _, f := range snap.Files {
		t.fstats[f.Key] = f
	}
	for _, d := range snap.Devices {
		if ds, ok := t.dstats[d.Device]; ok { // the last Step's, with the fast path's capacity
			ds.CapacityBPS = d.CapacityBPS
			d = ds
		}
		t.dstats[d.Device] = d
	}
	// Measured on the last Step's view that the fast path's files joined,
	// or on the recent requests (onRecent), with the regime just in.
	j := judgeCtx{Tuner: t, view: &t.view, justIn: true}
	// Random readers in the recent requests: before the first Step (a
	// daemon that has just started) the tuner's view holds none, and a
	// step sized for a stream alone would be paid by them.
	randomNow := map[probe.Dev]bool{}
	for _, f := range recent.Files {
		if j.readRandomly(f) {
			randomNow[f.Device] = true
		}
	}
	deferStep := func(fd *fileDec, dev probe.Dev) bool {
		return j.deferBesideRandom(fd, dev, now, randomNow[dev])
	}
	start := func(key probe.FileKey, dev probe.Dev, kind detector.RegimeKind) {
		if fd := t.files[key]; fd != nil {
			if t.regimeTakesOver(fd) {
				fd.regimes = append(fd.regimes, kind)
				fd.lastNeeded = now
				if l := &fd.win; l.trial == 0 && l.movedAt != 0 && now-l.movedAt < t.cfg.Settle/freshSpanDiv {
					// Its window moved a moment ago (a step undone): the
					// recent requests hold the old one's, and a step
					// measured against them looks as if it did not pay (on
					// the lab a 176 KB step taken 90 ms after the undo of
					// 192 read +7% against a rate of 82.9 MB/s, where the
					// stream reads 68 at 128 KB, and was backed off). The
					// check a quarter interval on (retryYoung) or the next
					// Step takes it.
					return
				}
				if !deferStep(fd, dev) {
					t.onRecent(j, key, recent, span).driveFile(fd, true)
				}
			}
			return
		}
		d := t.device(dev)
		if d == nil {
			return
		}
		fd := t.newDec(key, d, false, now, kind)
		if !deferStep(fd, dev) {
			j.driveFile(fd, true)
		}
	}
	for _, r := range snap.Regimes {
		switch {
		case !r.File.IsZero():
			start(r.File, r.Device, r.Kind)
		case r.Kind == detector.Contention:
			// As Step does: each sequential file read on the device gets
			// the closed loop, unless the contention is among them.
			if _, zeroSum := t.contentionAmongStreams(t.snap, r.Device); zeroSum {
				continue
			}
			for _, f := range snap.Files {
				if f.Device == r.Device && f.Sequentiality >= t.cfg.MinSequentiality && snap.Now-f.LastSeen <= t.cfg.Settle {
					start(f.Key, r.Device, detector.Contention)
				}
			}
		}
	}
	return t.out
}

// onRecent is j on the recent requests (over span) if they hold enough of
// key's to measure it by.
func (t *Tuner) onRecent(j judgeCtx, key probe.FileKey, recent detector.Snapshot, span time.Duration) judgeCtx {
	i := slices.IndexFunc(recent.Files, func(fs detector.FileStats) bool { return fs.Key == key })
	if span <= 0 || i < 0 || recent.Files[i].Requests < freshMinRequests || recent.Files[i].BusyThroughput <= 0 {
		return j
	}
	j.view = newView(recent, span, t.dstats)
	return j
}

// applyPending gives readers that opened a file after its decision the
// decision's window, at every Tick, so HDFS's per-read opens are reached
// fast; it also returns the actions the event path took since.
func (t *Tuner) applyPending() []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out, t.evOut = t.evOut, nil
	t.applyPendingLocked()
	return t.out
}

func (t *Tuner) applyPendingLocked() {
	now := t.deps.Clock.Now()
	for _, fd := range t.files {
		t.applyPendingFile(fd, now)
	}
}

// applyPendingFile pins the window in force on the descriptors of the
// file's readers marked pending.
func (t *Tuner) applyPendingFile(fd *fileDec, now time.Duration) {
	w := fd.win.inForce()
	if t.cfg.DryRun || w <= fd.win.base {
		return
	}
	tg := map[uint32]bool{}
	for tgid, r := range t.readers[fd.key] {
		if r.pending {
			tg[tgid] = true
		}
	}
	if len(tg) == 0 || !t.fails.due(fd.key, KindFileWindow, now) {
		return
	}
	err := t.pinFile(fd, w, tg, true)
	if errors.Is(err, errRateLimited) {
		return
	}
	res, ev := ResultApplied, fmt.Sprintf("new reader(s) of a file with a %d KB decision", w)
	a := fd.action(now, KindFileWindow, fd.win.base, w, res, ev)
	if err != nil {
		for tgid := range tg {
			t.readers[fd.key][tgid].pending = false // try again on its next event
		}
		a.Result, a.Evidence = ResultFailed, ev+": "+err.Error()
		t.emitFailed(a, err)
		return
	}
	t.fails.ok(fd.key, KindFileWindow)
	t.emit(a)
}

func (t *Tuner) pruneReaders(now time.Duration) {
	for k, rs := range t.readers {
		for tgid, r := range rs {
			if now-r.lastSeen > 2*t.cfg.Grace && (r.appliedKB == 0 || t.files[k] == nil) {
				delete(rs, tgid)
				t.nReaders--
			}
		}
		if len(rs) == 0 {
			delete(t.readers, k)
		}
	}
}
