package tuner

// A device's capacity, learned by experiment (a window step), not as the best
// rate seen: at capacity more bytes in flight only add latency (Little's law),
// while a fail-slow drive's steps pay, so its slow rate is never its capacity.

import (
	"fmt"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
)

// capQRise: a step is an experiment on the capacity when it at least
// doubled the window (smaller ones beside a random reader taught a fraction).
const capQRise = 2.0

// capDevRise, capDevShare: a step of capDevRise or more whose device busy
// rate rose by less than capDevShare of the stream's expected gain also
// shows the capacity (learnCapacity).
const (
	capDevRise  = 1.2
	capDevShare = 0.25
)

// learnCapacity learns d's capacity from a window step w0 -> w1 KB: when the
// window over the median latency gained less than the margin, the extra bytes
// only queued, and the busy throughput is the capacity (by latency, not
// bytes: a CPU-starved reader does not move it).
func (t *Tuner) learnCapacity(d *devState, w0, w1 int, b, m measure, trimmed bool) {
	if d.name == "" || !b.ok || !m.ok || m.young || m.ended || b.devBusy <= 0 || m.devBusy <= 0 || b.p50 <= 0 || m.p50 <= 0 || w0 <= 0 {
		return
	}
	old := t.mem.Capacity(d.name)
	grew := float64(w1) / float64(w0)
	queued := grew*float64(b.p50)/float64(m.p50) < 1+t.cfg.Margin
	// A smaller step shows it if the device's busy rate did not rise either
	// (capDevShare). Not across a trim, which frees device time of its own.
	devFlat := grew >= capDevRise && !trimmed && b.tput > 0 && m.devBusy-b.devBusy < capDevShare*(grew-1)*b.tput
	saturated := queued && (grew >= capQRise || devFlat)
	switch {
	case saturated:
		c := max(b.devBusy, m.devBusy)
		t.mem.SetCapacity(d.name, c, time.Now())
		d.satAt, d.satSeen = t.deps.Clock.Now(), true
		if old == 0 || c < old*(1-devLossMax) || c > old*(1+devLossMax) {
			t.log.Info("tuner: device capacity learned: more bytes in flight added no throughput", "device", d.name,
				"capacity_mbps", c/1e6, "from_kb", w0, "to_kb", w1, "p50_before", b.p50, "p50_after", m.p50,
				"mbps_before", b.devBusy/1e6, "mbps_after", m.devBusy/1e6)
		}
	case old > 0 && m.devBusy > (1+t.cfg.Margin)*old:
		// It read well past the capacity learned: that was no knee.
		t.mem.SetCapacity(d.name, 0, time.Now())
		d.satSeen = false
		t.log.Info("tuner: device capacity forgotten: the device read past it", "device", d.name,
			"capacity_mbps", old/1e6, "mbps_now", m.devBusy/1e6)
	}
}

// atCapacity reports whether a stream reads at its device's known capacity,
// or the device does with the streams readaheadd serves and random readers
// taking most of its bytes: a larger window then adds latency for every
// reader and no throughput. A device other sequential readers load (O_DIRECT,
// outside the allow-paths) is not judged: a window rightly wins their share.
func (t judgeCtx) atCapacity(fs detector.FileStats) (bool, string) {
	c := t.knownCapacity(fs.Device)
	if c <= 0 {
		return false, ""
	}
	now := t.deps.Clock.Now()
	at, why := t.readsAtCapacity(fs, c)
	if at {
		t.capSeen[fs.Key] = now
		return true, why
	}
	// One interval below it is the host's (a reader starved of CPU).
	if seen, ok := t.capSeen[fs.Key]; ok && now-seen <= capHold {
		return true, fmt.Sprintf("it read at the device's capacity (%.1f MB/s) %v ago", c/1e6, (now - seen).Round(time.Millisecond))
	}
	return false, ""
}

// capHold: a stream at its device's capacity this recently still counts as at it.
const capHold = 2 * time.Second

func (t judgeCtx) readsAtCapacity(fs detector.FileStats, c float64) (bool, string) {
	// Within what a step must gain: half the margin for a lone stream
	// (marginFor), the margin beside a random reader.
	reach := t.shortOfCapacity()
	if t.randomBesideDev(fs.Device, fs.Key) {
		reach = 1 / (1 + t.cfg.Margin)
	}
	// Its window at its latency (bytes in flight over latency) or its busy
	// rate, whichever is more: a pause lowers the rate, not the latency.
	x := fs.BusyThroughput
	if fs.P50 > 0 {
		x = max(x, fs.Inflight*fs.MeanSize/fs.P50.Seconds())
	}
	if x >= reach*c {
		return true, fmt.Sprintf("it reads %.1f MB/s by its bytes in flight and latency, the device's capacity (%.1f MB/s)", x/1e6, c/1e6)
	}
	ds, ok := t.dstats[fs.Device]
	if !ok || ds.Bytes == 0 || ds.BusyThroughput < reach*c {
		return false, ""
	}
	// A random reader's read-around a trim would spare is not served: that
	// trim frees the device, so the device is not at its capacity for them.
	var served uint64
	for k, o := range t.fstats {
		if o.Device == fs.Device && (k == fs.Key || t.protectedStream(k, o) || t.readRandomly(o) && !t.trimMayCome(k, o)) {
			served += o.Bytes
		}
	}
	if float64(served) < streamShareMin*float64(ds.Bytes) {
		return false, ""
	}
	return true, fmt.Sprintf("the device reads %.1f MB/s, its capacity (%.1f MB/s), %.0f%% of it for the streams readaheadd serves and random readers",
		ds.BusyThroughput/1e6, c/1e6, 100*float64(served)/float64(ds.Bytes))
}

// halfMargin is what a step taking a lone stream to capacity must gain.
func (t *Tuner) halfMargin() float64 { return t.cfg.Margin / 2 }

// shortOfCapacity is the share of the device's capacity below which a
// lone stream still has half the margin to gain.
func (t *Tuner) shortOfCapacity() float64 { return 1 / (1 + t.halfMargin()) }

// streamShareMin: when at least this share of a contended device's bytes
// goes to the streams a contention step would reach, the contention is
// among them.
const streamShareMin = 0.8
