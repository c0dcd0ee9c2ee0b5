package tuner

// What the tuner reports (actions, status) and its shutdown.

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/readaheadd/readaheadd/pkg/actuate"
)

// Status reports the tuner's state.
func (t *Tuner) Status() Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := Status{DryRun: t.cfg.DryRun, Counts: maps.Clone(t.counts), FileOpFailures: t.fileFail, OutOfScope: t.refused, RateLimited: t.limited}
	st.Repeated = t.fails.counts()
	st.Events = make(map[Event]uint64, numEvents)
	for e, v := range t.events {
		st.Events[Event(e)] = v
	}
	st.Recent = append([]Action(nil), t.recent...)
	for _, d := range t.devs {
		if !d.known {
			continue
		}
		ds := DeviceStatus{Device: d.name, Dev: d.dev, CurrentKB: d.cur, OriginalKB: d.orig}
		for _, fd := range t.files {
			if fd.dev == d && fd.win.inForce() != d.cur {
				ds.FilesAdjusted++
			}
			if fd.dev == d && fd.pf.inForce() > 0 {
				ds.Prefetching++
			}
		}
		for _, td := range t.trims {
			if td.dev == d && !td.dry {
				ds.FilesAdjusted++
			}
		}
		st.Devices = append(st.Devices, ds)
	}
	sort.Slice(st.Devices, func(i, j int) bool { return st.Devices[i].Device < st.Devices[j].Device })
	for _, fd := range t.files {
		s := "watching"
		switch {
		case fd.outOfScope:
			s = "out_of_scope"
		case fd.win.trial.to != 0 || fd.pf.trial.to != 0:
			s = "trial"
		case fd.win.back.knee:
			s = "knee"
		case fd.win.back.failures > 0 && fd.win.cur == fd.win.base:
			s = "backing_off"
		case fd.win.cur > fd.win.base:
			s = "kept"
		}
		st.Files = append(st.Files, FileStatus{Device: fd.dev.name, File: fd.key, Path: fd.path, WindowKB: fd.win.inForce(),
			BaseKB: fd.win.base, PrefetchKB: fd.pf.inForce(), Readers: len(t.readers[fd.key]), State: s})
	}
	for _, td := range t.trims {
		s := "trimmed"
		if td.trialAt != 0 {
			s = "trial"
		}
		if td.dry {
			s = "dry_run"
		}
		st.Files = append(st.Files, FileStatus{Device: td.dev.name, File: td.key, Path: td.path, WindowKB: td.kb,
			BaseKB: td.from, Readers: len(td.refs), State: s})
	}
	sort.Slice(st.Files, func(i, j int) bool { return st.Files[i].File.String() < st.Files[j].File.String() })
	return st
}

// RestoreAll undoes everything (devices, open files, prefetch, the durable
// record); used on SIGTERM/SIGINT.
func (t *Tuner) RestoreAll() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closing = true
	t.out = nil
	if t.cfg.DryRun {
		return nil
	}
	// Priors outlive the run: a restart mid-slowdown serves the first open.
	t.savePriors(true)
	var errs []error
	for _, d := range t.devs {
		if !d.known {
			continue
		}
		d.winActive = false
		if d.cur != d.orig || d.dirty {
			from := d.cur
			if err := t.setDevice(d, d.orig, false); err != nil {
				errs = append(errs, fmt.Errorf("restore %s to %d KB: %w", d.name, d.orig, err))
				continue
			}
			t.emit(Action{Time: t.deps.Clock.Now(), Device: d.name, Dev: d.dev, Kind: KindDeviceWindowUndo, FromKB: from, ToKB: d.orig, Result: ResultUndone, Evidence: "shutting down"})
		}
		if len(d.reached) > 0 {
			t.atStep().reachOpenFiles(d)
		}
	}
	for k, fd := range t.files {
		t.undoFile(fd, "shutting down")
		delete(t.files, k)
	}
	for _, k := range sortedKeys(t.trims) {
		t.endTrim(t.trims[k], "shutting down")
	}
	if t.deps.Store != nil {
		// An original whose write failed (read-only sysfs) is still in
		// force: writing it back would only fail again.
		for _, e := range t.deps.Store.Entries() {
			if kb, err := t.deps.Sysfs.ReadAheadKB(e.Device); err == nil && kb == e.ReadAheadKB {
				if err := t.deps.Store.Forget(e.Device); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if err := t.deps.Store.Restore(t.deps.Sysfs); err != nil {
			errs = append(errs, err)
		}
		// Windows the undos did not reach are reset from the record.
		if len(t.deps.Store.Pins()) > 0 {
			res, err := actuate.RestorePins(t.deps.Store, t.deps.Files, t.scope, t.cfg.Devices, t.pinsLowerer())
			if err != nil {
				errs = append(errs, fmt.Errorf("reset per-file windows: %w", err))
			}
			t.left = append(t.left, res.Unconfirmed...)
		}
	}
	// Each file once, as last seen (RestorePins tries the undos' again).
	last := map[actuate.FileRef]string{}
	for _, u := range t.left {
		last[u.Ref] = u.String()
	}
	if len(last) > 0 {
		ls := slices.Sorted(maps.Values(last))
		errs = append(errs, fmt.Errorf("%d open file(s) not confirmed at their device's window (records kept for readaheadd restore): %s", len(ls), strings.Join(ls, "; ")))
	}
	return errors.Join(errs...)
}
