package tuner

// A device's capacity, learned by the model rather than by the best rate
// seen: by Little's law a stream reads at bytes in flight over latency;
// below the device's capacity more bytes in flight add throughput at the
// same latency, at its capacity they only add latency. A file window step
// is that experiment (learnCapacity). A fail-slow drive's steps pay (the
// latency, not the device, bound them): its slow rate is never taken for
// its capacity.

import (
	"fmt"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
)

// capQRise: a step counts as an experiment on the device's capacity when
// it at least doubled the window: a step of half again (beside a random
// reader, on the lab) saw its median rise 1.4x with the random reader's
// faults, and taught 63.6 MB/s of a 148 MB/s device.
const capQRise = 2.0

// learnCapacity updates the capacity of d from a file window step from
// w0 to w1 KB and its before- and after-measures. By Little's law a stream
// reads its bytes in flight, which its window sets, over its latency: when
// the window at least doubled and the latency grew with it (the
// window over the median latency gained less than the keep margin), the
// extra bytes only waited in the device's queue and the device was at its
// capacity: its busy throughput, the larger of before and after (a rate
// while it had requests in flight, however far back the detector reached
// for its samples). Judged by latency rather than bytes read, a reader
// starved of CPU for part of an interval (the device idle meanwhile, its
// latency unchanged) does not move the verdict.
func (t *Tuner) learnCapacity(d *devState, w0, w1 int, b, m measure) {
	if d.name == "" || !b.ok || !m.ok || m.young || m.ended || b.devBusy <= 0 || m.devBusy <= 0 || b.p50 <= 0 || m.p50 <= 0 || w0 <= 0 {
		return
	}
	old := t.mem.Capacity(d.name)
	grew := float64(w1) / float64(w0)
	saturated := grew >= capQRise && grew*float64(b.p50)/float64(m.p50) < 1+t.cfg.Margin
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

// atCapacity reports whether a stream reads at its device's learned
// capacity, or the device does with the streams readaheadd serves taking
// most of its bytes: within what a step must gain of it (reach below). A larger window then adds latency (for every
// reader of the device) and no throughput worth a trial, so the stream is
// not bound by its window. The device's busy throughput counts too, with
// the random readers beside the streams (a step's bytes queue ahead of
// their faults: on the lab a healthy device shared with one read 1.15x the
// default's total and the random reader's p99 1.99x). Other sequential
// readers (O_DIRECT, files outside the allow-paths) are contenders whose
// share a larger window legitimately wins back: a device they load is not
// judged.
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
	// One interval below it is the host's (a reader starved of CPU on a
	// busy host read 47 MB/s at 128 KB, against 78 on either side).
	if seen, ok := t.capSeen[fs.Key]; ok && now-seen <= capHold {
		return true, fmt.Sprintf("it read at the device's capacity (%.1f MB/s) %v ago", c/1e6, (now - seen).Round(time.Millisecond))
	}
	return false, ""
}

// capHold: a stream seen at its device's capacity within this long still
// counts as at it (atCapacity).
const capHold = 2 * time.Second

func (t judgeCtx) readsAtCapacity(fs detector.FileStats, c float64) (bool, string) {
	// Within what a step must gain: half the margin for a lone stream (a
	// step to the capacity pays that, marginFor), the margin beside a
	// random reader.
	reach := t.shortOfCapacity()
	if t.randomBesideDev(fs.Device, fs.Key) {
		reach = 1 / (1 + t.cfg.Margin)
	}
	// What its window gives at its latency (Little's law: bytes in flight
	// over latency), or what it read while busy, whichever is more: a
	// pause of the reader's or a lowering's break leaves the device idle
	// and the rate low, not the latency.
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
	var served uint64
	for k, o := range t.fstats {
		if o.Device == fs.Device && (k == fs.Key || t.protectedStream(k, o) || t.readRandomly(o)) {
			served += o.Bytes
		}
	}
	if float64(served) < streamShareMin*float64(ds.Bytes) {
		return false, ""
	}
	return true, fmt.Sprintf("the device reads %.1f MB/s, its capacity (%.1f MB/s), %.0f%% of it for the streams readaheadd serves and random readers",
		ds.BusyThroughput/1e6, c/1e6, 100*float64(served)/float64(ds.Bytes))
}

// halfMargin is what a step that takes a lone stream to the device's
// capacity must gain (marginFor).
func (t *Tuner) halfMargin() float64 { return t.cfg.Margin / 2 }

// shortOfCapacity is the share of the device's capacity below which a
// lone stream still has half the margin to gain.
func (t *Tuner) shortOfCapacity() float64 { return 1 / (1 + t.halfMargin()) }

// streamShareMin: when at least this share of a contended device's bytes
// goes to the sequential readers that a contention step would reach, the
// contention is among them.
const streamShareMin = 0.8
