package tuner

// The tuner's side of the actuator: sysfs device windows (rate-limited,
// originals recorded first), per-file windows, the crash record of pins.

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
)

// take takes n sysfs writes from the device's budget.
func (t *Tuner) take(d *devState, n int) bool {
	if !d.writes.takeN(t.deps.Clock.Now(), float64(n), t.cfg.SysfsWritesPerSec, float64(t.cfg.SysfsBurst)) {
		t.limited++
		return false
	}
	return true
}

// record makes sure the device's original is on disk before a write.
func (t *Tuner) record(d *devState) error {
	err := errors.New("no state store")
	if t.deps.Store != nil {
		err = t.deps.Store.Record(d.name, d.dev.String(), d.orig)
	}
	if err != nil {
		return fmt.Errorf("record original of %s before writing it: %w", d.name, err)
	}
	return nil
}

// writeDevice sets read_ahead_kb, recording the original first.
func (t *Tuner) writeDevice(d *devState, kb int) error {
	if err := t.record(d); err != nil {
		return err
	}
	return t.deps.Sysfs.SetReadAheadKB(d.name, kb)
}

// setDevice moves the device's own window (a device-wide decision).
func (t *Tuner) setDevice(d *devState, kb int, limit bool) error {
	kb = t.clamp(d, kb)
	if kb == d.cur && !d.dirty {
		return nil
	}
	if limit && !t.take(d, 1) {
		return errRateLimited
	}
	if err := t.writeDevice(d, kb); err != nil {
		return err
	}
	d.cur = kb
	d.dirty = false
	d.movedAt = t.deps.Clock.Now()
	return nil
}

// clamp bounds kb to MaxKB, never below the device's original.
func (t *Tuner) clamp(d *devState, kb int) int {
	return max(min(kb, t.cfg.MaxKB), d.orig)
}

// repairDevices retries a write back that failed after a raise.
func (t *Tuner) repairDevices() {
	for _, d := range t.devs {
		if d.known && d.dirty {
			if err := t.writeDevice(d, d.cur); err != nil {
				t.log.Error("tuner: read_ahead_kb is still not back at its intended value", "device", d.name, "want_kb", d.cur, "err", err)
				continue
			}
			d.dirty = false
			t.log.Info("tuner: read_ahead_kb put back", "device", d.name, "kb", d.cur)
		}
	}
}

// refs finds the in-scope descriptors of the file's readers (of tgids if given).
func (t *Tuner) refs(fd *fileDec, tgids map[uint32]bool) []actuate.FileRef {
	now := t.deps.Clock.Now()
	var out []actuate.FileRef
	readers := t.readers[fd.key]
	for _, tgid := range slices.Sorted(maps.Keys(readers)) {
		// Readers the tuner pinned stay reachable for the undo.
		if r := readers[tgid]; (now-r.lastSeen > t.cfg.Grace && r.appliedKB == 0) || (tgids != nil && !tgids[tgid]) {
			continue
		}
		found, err := t.deps.Files.Find(tgid, fd.key)
		if err != nil {
			t.fileFail++
			t.log.Debug("tuner: cannot list a reader's descriptors", "pid", tgid, "file", fd.key.String(), "err", err)
			continue
		}
		for _, ref := range found {
			real, err := t.scope.Check(ref.Tgid, ref.FD, ref.Path, fd.key)
			if err != nil {
				// An outcome-only stream is any sequential reader: out of
				// scope is expected, not an error.
				switch {
				case !onlyOutcome(fd.regimes):
					t.refused++
					if !fd.scopeWarned {
						t.log.Warn("tuner: file is outside the allow-paths; no per-file action", "pid", tgid, "fd", ref.FD, "path", ref.Path, "reason", err)
						fd.scopeWarned = true
					}
				case !fd.outOfScope:
					t.log.Debug("tuner: stream outside the allow-paths left alone", "pid", tgid, "fd", ref.FD, "path", ref.Path, "reason", err)
				}
				fd.outOfScope = true
				fd.scopeAt = now
				continue
			}
			fd.outOfScope = false
			fd.path = real
			out = append(out, ref)
		}
	}
	return out
}

// pin gives refs the window kb: fadvise alone at the device's window or
// twice it, else raise-pin-restore with descriptors taken first.
func (t *Tuner) pin(d *devState, kb int, refs []actuate.FileRef, limit bool) (int, error) {
	return t.raiseFiles(d, t.clamp(d, kb), refs, limit)
}

// raiseFiles pins kb unclamped to the device's original (trims pin below).
func (t *Tuner) raiseFiles(d *devState, kb int, refs []actuate.FileRef, limit bool) (int, error) {
	return t.pinWith(d, kb, refs, limit, false)
}

// lowerFiles is the one way a per-file window comes down: with per-file
// state a stream above it gets a break (a plain pin does not reach async
// readahead; actuate/lower.go).
func (t *Tuner) lowerFiles(d *devState, kb int, refs []actuate.FileRef, limit bool) (int, error) {
	t.count(EvActuatorLower)
	return t.pinWith(d, kb, refs, limit, false)
}

// pinWith sets the window through the Lowerer (breaks as in lower.go).
// noBreak: see LowerReq.NoBreak.
func (t *Tuner) pinWith(d *devState, kb int, refs []actuate.FileRef, limit, noBreak bool) (int, error) {
	if len(refs) == 0 {
		return 0, errNoReaders
	}
	_, raise := actuate.AdviceFor(kb, d.cur)
	if raise && limit && !t.take(d, 2) {
		return 0, errRateLimited
	}
	var fs []actuate.LowerFile // the refs and our descriptors on them
	var errs []error
	var set, clear []state.Pin
	for _, r := range refs {
		h, err := t.deps.Files.Dup(r)
		if err != nil {
			t.fileFail++
			errs = append(errs, err)
			if errors.Is(err, actuate.ErrProcessGone) || errors.Is(err, actuate.ErrFDGone) {
				clear = append(clear, pinOf(d, r, 0))
			}
			continue
		}
		fs = append(fs, actuate.LowerFile{Ref: r, H: h})
	}
	defer t.recordPins(&set, &clear)
	if len(fs) == 0 {
		return 0, fmt.Errorf("take descriptors: %w", errors.Join(errs...))
	}
	// A break waits with the lock released; the event path leaves the
	// marked files alone.
	for _, f := range fs {
		t.lowering[f.Ref.Key]++
	}
	defer func() {
		for _, f := range fs {
			f.H.Close()
			if t.lowering[f.Ref.Key]--; t.lowering[f.Ref.Key] <= 0 {
				delete(t.lowering, f.Ref.Key)
			}
		}
	}()
	d.movedAt = t.deps.Clock.Now()
	noBreak = noBreak || t.lower.States == nil
	// The device is written for a raise-pin-restore or a break.
	if raise || t.lower.States != nil {
		if err := t.record(d); err != nil {
			return 0, err
		}
	}
	st, err := t.lower.Lower(actuate.LowerReq{Device: d.name, DeviceKB: d.cur, KB: kb, Files: fs, During: t.unlocked, NoBreak: noBreak})
	if errors.Is(err, actuate.ErrDeviceNotBack) {
		d.dirty = true
		t.log.Error("tuner: could not put read_ahead_kb back after changing a file window; retrying next interval",
			"device", d.name, "want_kb", d.cur, "err", err)
	}
	if st.Broken > 0 {
		t.log.Debug("tuner: window lowered on streaming readers", "device", d.name, "to_kb", kb, "files", st.Broken,
			"break", st.Hold, "device_off", st.DeviceOff, "unconfirmed", st.Unconfirmed, "released", st.Released, "strays_reset", st.Strays,
			"idle_restarted", st.Rearmed, "reread_bytes", st.Reread)
	}
	if st.Strays > 0 {
		t.log.Info("tuner: files opened while read_ahead_kb held another value were given the device's window",
			"device", d.name, "files", st.Strays)
	}
	for _, u := range st.Left {
		t.log.Warn("tuner: open file not confirmed at its new window; its reader may go on with the old one (its record is kept)",
			"device", d.name, "to_kb", kb, "file", u.String())
	}
	if t.closing {
		t.left = append(t.left, st.Left...)
	}
	t.fileFail += uint64(len(fs) - st.Set)
	if st.Set == 0 {
		return 0, fmt.Errorf("set window: %w", errors.Join(append(errs, err)...))
	}
	// Failures are not told apart: all recorded set, or all cleared
	// (best effort; RestorePins resets what a crash leaves).
	for _, f := range fs {
		if kb != d.orig {
			set = append(set, pinOf(d, f.Ref, kb))
		} else if st.Confirmed(f.Ref) {
			clear = append(clear, pinOf(d, f.Ref, 0))
		}
	}
	return st.Set, nil
}

// pinsLowerer is RestorePins' Lowerer: none without per-file state.
func (t *Tuner) pinsLowerer() *actuate.Lowerer {
	if t.lower.States == nil {
		return nil
	}
	return t.lower
}

func pinOf(d *devState, r actuate.FileRef, kb int) state.Pin {
	return state.Pin{PID: r.Tgid, FD: r.FD, Dev: uint32(r.Key.Dev), Ino: r.Key.Ino, Device: d.name, WindowKB: kb, Path: r.Path}
}

// recordPins records pin's changes for a crash (best effort).
func (t *Tuner) recordPins(set, clear *[]state.Pin) {
	if t.deps.Store == nil || len(*set)+len(*clear) == 0 {
		return
	}
	if err := t.deps.Store.UpdatePins(*set, *clear); err != nil {
		t.log.Warn("tuner: could not record per-file windows; after a crash they would stay until their files are closed", "err", err)
	}
}

func (t *Tuner) pinFile(fd *fileDec, kb int, tgids map[uint32]bool, limit bool) error {
	refs := t.refs(fd, tgids)
	if len(refs) == 0 && fd.outOfScope {
		return errOutOfScope
	}
	// Against the largest window pinned on these readers or seen in their events.
	kb = t.clamp(fd.dev, kb)
	have := 0
	for _, r := range refs {
		if ri := t.readers[fd.key][r.Tgid]; ri != nil {
			have = max(have, ri.appliedKB, ri.raKB)
		}
	}
	move := t.raiseFiles
	if kb < have {
		move = t.lowerFiles
	}
	if _, err := move(fd.dev, kb, refs, limit); err != nil {
		return err
	}
	for _, ref := range refs {
		if r := t.readers[fd.key][ref.Tgid]; r != nil {
			r.appliedKB, r.pending, r.appliedAt = kb, false, t.deps.Clock.Now()
		}
	}
	return nil
}

// prefetchAll issues WILLNEED ahead of prefetched readers, within budget.
func (t *Tuner) prefetchAll() {
	if t.cfg.DryRun {
		return
	}
	now := t.deps.Clock.Now()
	for _, fd := range t.files {
		depth := fd.pf.inForce()
		fs, ok := t.fstats[fd.key]
		if depth == 0 || !ok {
			continue
		}
		d := fd.dev
		budget := d.prefetch.fill(now, t.cfg.PrefetchBytesPerSec, t.cfg.PrefetchBytesPerSec)
		// From where the last prefetch ended, if within depth ahead.
		start, end := fs.NextOffset, fs.NextOffset+uint64(depth)*1024
		if fd.pfEnd > start && fd.pfEnd < end {
			start = fd.pfEnd
		}
		n := min(end-start, uint64(budget))
		if n < probe.PageSize {
			continue
		}
		refs := t.refs(fd, nil)
		if len(refs) == 0 {
			continue
		}
		h, err := t.deps.Files.Dup(refs[0])
		if err != nil {
			t.fileFail++
			t.log.Debug("tuner: prefetch: cannot take a descriptor", "file", fd.key.String(), "err", err)
			continue
		}
		err = h.Fadvise(int64(start), int64(n), actuate.AdviceWillNeed)
		h.Close()
		if err != nil {
			t.fileFail++
			t.log.Warn("tuner: prefetch failed", "file", fd.key.String(), "path", fd.path, "err", err)
			continue
		}
		d.prefetch.tokens -= float64(n)
		fd.pfEnd = start + n
	}
}

// onlyOutcome: the decision rests on its stream's outcome alone.
func onlyOutcome(regimes []detector.RegimeKind) bool {
	return len(regimes) > 0 && !slices.ContainsFunc(regimes, func(r detector.RegimeKind) bool { return r != WindowBound })
}

// unlocked runs wait with the tuner's lock released (held by the caller).
func (t *Tuner) unlocked(wait func()) {
	t.mu.Unlock()
	defer t.mu.Lock()
	wait()
}
