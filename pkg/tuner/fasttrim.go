package tuner

import (
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Read-around trims between Steps. A window raised before the tuner has
// seen the device's random readers (a saved prior given to a fresh open
// just after start-up, a stream's first step on a device whose mmap reader
// starts later) is paid by every fault of theirs until the next Step
// trims them: up to a whole Settle of read-around beside the raised
// window, which a random reader's p99 over a run shows. Every quarter
// Settle the recent requests of the devices with a window raised are
// searched for random readers reading around their faults, and those are
// trimmed at once, judged at a Step like any other trim.

// trimStreams returns, at most every Settle/onsetEvery, the files with a
// window raised and one file read on each device raised device-wide
// (detector.Recent then holds every file read on their devices), and the
// span to look back over; nothing when no window is raised or trims are
// off.
func (t *Tuner) trimStreams() ([]probe.FileKey, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.deps.Clock.Now()
	if t.cfg.DisableTrim || t.scope.Empty() || now-t.trimAskAt < t.cfg.Settle/onsetEvery {
		return nil, 0
	}
	var keys []probe.FileKey
	for _, fd := range t.files {
		if fd.win.raised() {
			keys = append(keys, fd.key)
		}
	}
	for _, d := range t.devs {
		if !d.raisedWide() {
			continue
		}
		// A device-wide raise: any file read there names the device.
		for k, fs := range t.fstats {
			if fs.Device == d.dev {
				keys = append(keys, k)
				break
			}
		}
	}
	if len(keys) == 0 {
		return nil, 0
	}
	// Asked for at the first tick after a window is raised: the span
	// looks back over the random readers' requests from before it.
	t.trimAskAt = now
	slices.SortFunc(keys, compareKeys)
	return slices.Compact(keys), t.cfg.Settle / freshSpanDiv
}

// fastTrim trims the random readers reading around their faults in the
// recent requests (snap, over span; detector.Recent) of devices with a
// window raised, as the next Step would.
func (t *Tuner) fastTrim(snap detector.Snapshot, span time.Duration) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = nil
	if t.cfg.DisableTrim || t.scope.Empty() || span <= 0 || len(snap.Files) == 0 {
		return nil
	}
	j := t.on(snap, span, judgeStep)
	for _, d := range sortedDevs(t.devs) {
		if t.helping(d) && slices.ContainsFunc(snap.Devices, func(ds detector.DeviceStats) bool { return ds.Device == d.dev }) {
			j.startTrims(d, false)
		}
	}
	return t.out
}
