package tuner

import (
	"fmt"
	"slices"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// What needs help now: the detector's regimes turned into needs, per file
// (a window of its own) and per device (a device-wide window).

// needs returns the files that need a larger window and why (their
// regimes), the device of each, and the devices that need a device-wide
// window and why. Outcome-driven needs (streams bound by their window, no
// regime) are added by outcomeNeeds.
func (t judgeCtx) needs(snap detector.Snapshot) (fileNeeds map[probe.FileKey][]detector.RegimeKind, fileDev map[probe.FileKey]probe.Dev, devWide map[probe.Dev]string) {
	fileNeeds = map[probe.FileKey][]detector.RegimeKind{}
	fileDev = map[probe.FileKey]probe.Dev{}
	devWide = map[probe.Dev]string{}
	for _, r := range snap.Regimes {
		switch {
		case !r.File.IsZero() && (r.Kind == detector.FileLatencyShift || r.Kind == detector.StarvedStream || r.Kind == detector.ExtentStart):
			fileNeeds[r.File] = append(fileNeeds[r.File], r.Kind)
			fileDev[r.File] = r.Device
		case r.File.IsZero() && r.Kind == detector.TailInflation:
			devWide[r.Device] = fmt.Sprintf("%s: %s", r.Kind, r.Evidence)
			if _, ok := t.randomOnDevice(r.Device); ok && !t.scope.Empty() {
				// No device-wide window beside a random mmap reader
				// (below): the device's streams get windows of their own,
				// within the random readers' budget.
				for _, f := range snap.Files {
					if f.Device == r.Device && f.Sequentiality >= t.cfg.MinSequentiality && snap.Now-f.LastSeen <= t.cfg.Settle &&
						!slices.Contains(fileNeeds[f.Key], detector.TailInflation) {
						fileNeeds[f.Key] = append(fileNeeds[f.Key], detector.TailInflation)
						fileDev[f.Key] = r.Device
					}
				}
			}
		}
	}
	// Device-wide need from many files (contention's per-file needs below
	// do not count: a device-wide window does not outbid other readers).
	perDev := map[probe.Dev]int{}
	for k := range fileNeeds {
		perDev[fileDev[k]]++
	}
	// Contention: other readers take the device; a larger window on a
	// sequential reader's open file keeps more of its requests queued and
	// wins back its share. Each such file gets the closed loop (kept only
	// if its own throughput improves by the margin).
	for _, r := range snap.Regimes {
		if r.Kind != detector.Contention || !r.File.IsZero() {
			continue
		}
		if why, zeroSum := t.contentionAmongStreams(snap, r.Device); zeroSum {
			t.logOnce(r.Device, "contention-zero-sum", "tuner: contention is among the sequential readers themselves; no per-file step (one would only take share from the others)",
				"device", r.Device.String(), "why", why)
			continue
		}
		for _, f := range snap.Files {
			if f.Device != r.Device || f.Sequentiality < t.cfg.MinSequentiality || snap.Now-f.LastSeen > t.cfg.Settle {
				continue
			}
			if !slices.Contains(fileNeeds[f.Key], detector.Contention) {
				fileNeeds[f.Key] = append(fileNeeds[f.Key], detector.Contention)
				fileDev[f.Key] = r.Device
			}
		}
	}
	active := map[probe.Dev]int{}
	for _, f := range snap.Files {
		active[f.Device]++
	}
	for dev, n := range perDev {
		if n >= t.cfg.DeviceMinFiles && float64(n) >= t.cfg.DeviceFileFraction*float64(active[dev]) {
			if _, ok := devWide[dev]; !ok {
				devWide[dev] = fmt.Sprintf("%d of %d files read on the device need a larger window", n, active[dev])
			}
		}
	}
	return fileNeeds, fileDev, devWide
}
