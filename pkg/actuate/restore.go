package actuate

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/scope"
	"github.com/readaheadd/readaheadd/pkg/state"
)

// PinsRestored counts what RestorePins did with the recorded pins.
type PinsRestored struct {
	Reset   int // windows reset to their device's
	Gone    int // readers exited, or descriptors closed or reused
	Refused int // outside the allow-paths or the tuned devices: not touched, dropped
	// Unconfirmed: files the kernel still shows above their device's
	// window (or that could not be checked); their records are kept.
	Unconfirmed []Unconfirmed
}

// RestorePins resets every open file an earlier run recorded as pinned
// (state.Store.Pins) to its device's window (POSIX_FADV_NORMAL; devices are
// back at their originals by then). The record is untrusted: a pin is acted
// on only if its descriptor still names the recorded file, in scope, on one
// of devices; refused pins are dropped untouched. Gone readers need
// nothing; other unreachable entries stay recorded. With a Lowerer, a
// reader still streaming on the old window comes down too (lower.go).
func RestorePins(st *state.Store, files FileOps, sc *scope.Scope, devices []string, low *Lowerer) (PinsRestored, error) {
	var res PinsRestored
	var done []state.Pin
	var errs []error
	byDev := map[string][]LowerFile{}
	pinOfFile := map[Handle]state.Pin{}
	for _, p := range st.Pins() {
		key := probe.FileKey{Dev: probe.Dev(p.Dev), Ino: p.Ino}
		ref, err := pinRef(files, p, key)
		var h Handle
		if err == nil {
			if _, serr := sc.Check(ref.Tgid, ref.FD, ref.Path, key); serr != nil || len(devices) > 0 && !slices.Contains(devices, p.Device) {
				res.Refused++
				done = append(done, p)
				continue
			}
			h, err = files.Dup(ref)
		}
		if errors.Is(err, ErrProcessGone) || errors.Is(err, ErrFDGone) {
			res.Gone++
			done = append(done, p)
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("pid %d fd %d (%s): %w", p.PID, p.FD, p.Path, err))
			continue
		}
		if low == nil {
			ferr := h.Fadvise(0, 0, AdviceNormal)
			h.Close()
			if ferr != nil {
				errs = append(errs, fmt.Errorf("pid %d fd %d (%s): fadvise: %w", p.PID, p.FD, p.Path, ferr))
				continue
			}
			res.Reset++
			done = append(done, p)
			continue
		}
		byDev[p.Device] = append(byDev[p.Device], LowerFile{Ref: ref, H: h})
		pinOfFile[h] = p
	}
	// Readers still streaming on the old window come down too.
	for _, dev := range slices.Sorted(maps.Keys(byDev)) {
		fs := byDev[dev]
		kb, rerr := low.Sysfs.ReadAheadKB(dev)
		if rerr == nil {
			var lst LowerStats
			lst, rerr = low.Lower(LowerReq{Device: dev, DeviceKB: kb, KB: kb, Files: fs})
			if rerr == nil || lst.Set == len(fs) {
				res.Unconfirmed = append(res.Unconfirmed, lst.Left...)
				for _, f := range fs {
					if lst.Confirmed(f.Ref) {
						res.Reset++
						done = append(done, pinOfFile[f.H])
					}
				}
			}
		}
		if rerr != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", dev, rerr))
		}
		for _, f := range fs {
			f.H.Close()
		}
	}
	if uerr := st.UpdatePins(nil, done); uerr != nil {
		errs = append(errs, uerr)
	}
	return res, errors.Join(errs...)
}

// pinRef finds the recorded descriptor among those the process holds on
// the recorded file, with the path it has now (for the scope check).
func pinRef(files FileOps, p state.Pin, key probe.FileKey) (FileRef, error) {
	refs, err := files.Find(p.PID, key)
	if err != nil {
		return FileRef{}, err
	}
	for _, r := range refs {
		if r.FD == p.FD {
			return r, nil
		}
	}
	return FileRef{}, fmt.Errorf("pid %d fd %d no longer names %s: %w", p.PID, p.FD, key, ErrFDGone)
}
