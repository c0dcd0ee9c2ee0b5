package tuner

import (
	"time"
)

// A knee is what the next window step did not win at the moment it was
// tried. A stream that reads well below its rate of that moment, at the
// same window, reads under other conditions: the host stalls its reader
// between requests (page reclaim on a full page cache, CPU contention), so
// fewer bytes stay in flight than the window allows, or the device's
// latency moved less than a regime needs. The step the knee held back may
// pay now: it is tried again, at once, rather than after BackoffMax.
//
// Measured on the lab with the page cache full (the steady state of a
// DataNode): a stream held at a knee found while it read at the device's
// bandwidth fell to 0.8 of it for a second of every two, while the best
// static window read flat.
const (
	// kneeStaleDrop: the stream's rate must be below this share of its
	// rate when the knee was found (one interval of a steady stream varies
	// less).
	kneeStaleDrop = 0.85
)

// kneeStale ends a file window's knee when the stream, at the knee's window
// and bound by it, reads below kneeStaleDrop of its rate when the knee was
// found. Not a knee the random readers' loss set: what a larger window costs
// them does not change with the stream's rate. A stream whose rate merely
// varies costs a trial now and then: the re-probes that find nothing to
// keep are spaced by the same exponential back-off as trials (BackoffBase,
// doubling, up to BackoffMax), and a kept step resets it.
func (t *Tuner) kneeStale(fd *fileDec, m measure) {
	l := &fd.win
	now := t.deps.Clock.Now()
	if !l.knee || l.kneeRandom || l.trial != 0 || l.probeUntil != 0 || now >= l.retryAt {
		return
	}
	if !m.ok || !l.kneeM.ok || l.kneeM.rate <= 0 || m.rate >= kneeStaleDrop*l.kneeM.rate {
		return
	}
	// The measure must come from the knee's window alone.
	if now-l.movedAt < t.cfg.Settle {
		return
	}
	if l.staleAt != 0 && now-l.staleAt < t.backoff(l.staleN) {
		return
	}
	t.log.Debug("tuner: stream reads below its rate at the knee", "file", fd.key.String(), "window_kb", l.cur,
		"knee_mbps", l.kneeM.rate/1e6, "now_mbps", m.rate/1e6, "p50", m.p50.Round(10*time.Microsecond))
	l.knee, l.retryAt, l.failures = false, 0, 0
	l.staleAt = now
	l.staleN++
	t.count(EvKneeStale)
}
