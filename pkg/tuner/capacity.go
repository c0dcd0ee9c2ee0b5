package tuner

// A device's capacity, learned by the model rather than by the best rate
// seen: by Little's law a stream reads at bytes in flight over latency;
// below the device's capacity more bytes in flight add throughput at the
// same latency, at its capacity they only add latency. A file window step
// is that experiment: when it raised the device's bytes in flight by half
// again and its total read less than the keep margin more (a step's gain
// that would not be kept), the device was at its capacity, and the rate it
// read is that capacity. A
// fail-slow drive's steps pay (the latency, not the device, bound them), so
// its slow rate is never taken for its capacity.

import (
	"fmt"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/state"
)

// capQRise: a step counts as an experiment on the device's capacity when
// the device's bytes in flight rose at least this much.
const capQRise = 1.5

// devCapacity is a learned capacity (bytes/s) and when it was learned.
type devCapacity struct {
	bps  float64
	wall time.Time
}

// learnCapacity updates the capacity of d from a file window step's
// before- and after-measures. The device's busy throughput is its rate
// while it had requests in flight: a rate however far back the detector
// reached for its samples.
func (t *Tuner) learnCapacity(d *devState, b, m measure) {
	if d.name == "" || !b.ok || !m.ok || m.young || m.ended || b.devBusy <= 0 || m.devBusy <= 0 || b.devQ <= 0 || b.devP50 <= 0 || m.devP50 <= 0 {
		return
	}
	old := t.mem.caps[d.name].bps
	// By Little's law the device reads its bytes in flight over its
	// latency. Judged so rather than by the bytes read, a reader starved
	// of CPU for part of either interval (the device idle meanwhile, its
	// latency unchanged) does not move the verdict.
	bx, mx := b.devQ/b.devP50.Seconds(), m.devQ/m.devP50.Seconds()
	saturated := m.devQ >= capQRise*b.devQ && mx < (1+t.cfg.Margin)*bx
	switch {
	case saturated:
		c := max(b.devBusy, m.devBusy)
		t.mem.caps[d.name] = devCapacity{bps: c, wall: time.Now()}
		t.mem.dirty = true
		if old == 0 || c < old*(1-devLossMax) || c > old*(1+devLossMax) {
			t.log.Info("tuner: device capacity learned: more bytes in flight added no throughput", "device", d.name,
				"capacity_mbps", c/1e6, "inflight_kb_before", b.devQ/1024, "inflight_kb_after", m.devQ/1024,
				"p50_before", b.devP50, "p50_after", m.devP50, "mbps_before", b.devBusy/1e6, "mbps_after", m.devBusy/1e6)
		}
	case old > 0 && m.devBusy > (1+t.cfg.Margin)*old:
		// It read well past the capacity learned: that was no knee.
		delete(t.mem.caps, d.name)
		t.mem.dirty = true
		t.log.Info("tuner: device capacity forgotten: the device read past it", "device", d.name,
			"capacity_mbps", old/1e6, "mbps_now", m.devBusy/1e6)
	}
}

// learnedCapacity is the capacity of the device learnCapacity learned, 0
// when none is known.
func (t *Tuner) learnedCapacity(d *devState) float64 {
	if d == nil {
		return 0
	}
	return t.mem.caps[d.name].bps
}

// atCapacity reports whether a stream reads at its device's learned
// capacity, or the device does with the streams readaheadd serves taking
// most of its bytes: within the keep margin of it, where no step can gain
// what an outcome step must. A larger window then adds latency (for every
// reader of the device) and no throughput worth a trial, so the stream is
// not bound by its window. The device's busy throughput counts too. Other
// readers (O_DIRECT, files outside the allow-paths) are contenders whose
// share a larger window legitimately wins back: a device they load is not
// judged.
func (t *Tuner) atCapacity(fs detector.FileStats) (bool, string) {
	c := t.learnedCapacity(t.devs[fs.Device])
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

func (t *Tuner) readsAtCapacity(fs detector.FileStats, c float64) (bool, string) {
	reach := 1 / (1 + t.cfg.Margin)
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
		if o.Device == fs.Device && (k == fs.Key || t.protectedStream(k, o)) {
			served += o.Bytes
		}
	}
	if float64(served) < streamShareMin*float64(ds.Bytes) {
		return false, ""
	}
	return true, fmt.Sprintf("the device reads %.1f MB/s, its capacity (%.1f MB/s), %.0f%% of it for the streams readaheadd serves",
		ds.BusyThroughput/1e6, c/1e6, 100*float64(served)/float64(ds.Bytes))
}

// exportCaps and loadCaps carry the learned capacities in the priors file.
func (m *memory) exportCaps(p *state.Priors) {
	for name, c := range m.caps {
		p.Devices = append(p.Devices, state.DeviceCapacity{Device: name, CapacityBPS: c.bps, Updated: c.wall})
	}
}

func (m *memory) loadCaps(p state.Priors, ok func(device string) bool) (refused int) {
	for _, d := range p.Devices {
		if !ok(d.Device) {
			refused++
			continue
		}
		m.caps[d.Device] = devCapacity{bps: d.CapacityBPS, wall: d.Updated}
	}
	return refused
}
