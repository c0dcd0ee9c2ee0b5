package tuner

import (
	"time"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Trimming descriptors opened on a trimmed file.
//
// A trim reaches the descriptors open when it is taken (trim.go). A random
// reader that opens its file again (a service that opens its index per
// batch of lookups, several times a second) gets the device's window on
// each new descriptor, and its read-arounds are as large as before: the
// search for descriptors every trimScanEvery cannot keep up with opens
// that live a fraction of a second. So while a trim is in force, the probe
// watches its file (ReadAroundWatch): the first read-around of an open file
// whose window is above the trim is reported at once, with the process
// that faulted, and that process's descriptors on the file get the trim
// from the event path, a few milliseconds after the open's first fault.

const (
	// openedQuiet: a reader whose read-around reports found no
	// descriptor to trim (a mapping whose descriptor is closed, or one
	// outside the allow-paths) is looked for again after this long.
	openedQuiet = time.Second
	// openedMaxRefs bounds the descriptors a trim keeps to give back at
	// its end: past it, those closed meanwhile are dropped.
	openedMaxRefs = 64
	// openedPerSec and openedBurst bound the trims of opened descriptors
	// per device. They have a budget of their own, beside the sysfs
	// writes of the other actions (SysfsWritesPerSec): a reader that
	// re-opens its file four times a second would take most of that,
	// and the stream beside it, whose window the trim makes room for,
	// would wait for its steps. Each takes two writes of read_ahead_kb.
	openedPerSec = 10
	openedBurst  = 4
)

// watchAround asks the probe to report read-arounds of a trim's file that
// the trim has not reached.
func (t *Tuner) watchAround(td *trimDec) {
	if t.deps.Around == nil || td.dry || td.watched {
		return
	}
	if err := t.deps.Around.WatchReadAround(td.key, td.kb); err != nil {
		t.logOnce(td.dev.dev, "trim/watch", "tuner: read-arounds of trimmed files are not reported: descriptors opened after a trim keep the device's window until the next search for them",
			"file", td.key.String(), "err", err)
		return
	}
	td.watched = true
}

// unwatchAround ends watchAround.
func (t *Tuner) unwatchAround(td *trimDec) {
	if !td.watched {
		return
	}
	td.watched = false
	if err := t.deps.Around.UnwatchReadAround(td.key); err != nil {
		t.log.Debug("tuner: could not stop watching a trimmed file's read-arounds", "file", td.key.String(), "err", err)
	}
}

// trimOpened gives the trim to the descriptors process ev.Tgid holds on a
// trimmed file, on a report that one of them read around with a larger
// window. Called with t.mu held, from the event path.
func (t *Tuner) trimOpened(ev probe.ReadaheadEvent, now time.Duration) {
	td := t.trims[ev.File]
	if td == nil || !td.watched || int(ev.RaPages)*probe.PageSize/1024 <= td.kb || t.lowering[ev.File] > 0 {
		return
	}
	m := td.opened[ev.Tgid]
	if now < m.until || ev.Time != 0 && ev.Time < m.at {
		// Looked for lately with nothing found, or reported before its
		// descriptors were trimmed (still queued in the ring).
		return
	}
	found, err := t.deps.Files.Find(ev.Tgid, ev.File)
	if err != nil {
		t.fileFail++
		t.log.Debug("tuner: cannot list the descriptors of a trimmed file's reader", "pid", ev.Tgid, "file", ev.File.String(), "err", err)
	}
	var refs []actuate.FileRef
	for _, ref := range found {
		real, err := t.scope.Check(ref.Tgid, ref.FD, ref.Path, ev.File)
		if err != nil {
			t.refused++
			continue
		}
		ref.Path = real
		refs = append(refs, ref)
	}
	if len(refs) == 0 {
		t.count(EvTrimOpenedMissed)
		td.opened[ev.Tgid] = openedMark{at: m.at, until: now + openedQuiet}
		return
	}
	if !td.dev.opened.take(now, openedPerSec, openedBurst) {
		// The next report (the kernel sends one per 10 ms while the
		// descriptor reads around) can take the next token.
		t.count(EvTrimOpenedMissed)
		t.limited++
		td.opened[ev.Tgid] = openedMark{at: m.at, until: now + time.Second/openedPerSec}
		return
	}
	n, err := t.trimOpenedFiles(td.dev, td.kb, refs)
	if err != nil {
		t.count(EvTrimOpenedMissed)
		t.log.Debug("tuner: could not trim a descriptor opened on a trimmed file", "pid", ev.Tgid, "file", ev.File.String(), "err", err)
		td.opened[ev.Tgid] = openedMark{at: m.at, until: now + openedQuiet}
		return
	}
	t.events[EvTrimOpened] += uint64(n)
	td.opened[ev.Tgid] = openedMark{at: now, until: now}
	// Not a change of the trim (the device's trimAt): the reader's
	// requests keep the size the trim gave them, its new open file
	// trimmed within milliseconds of its first fault.
	t.keepRefs(td, refs)
}

// keepRefs adds refs to the descriptors td gives back at its end, one per
// process and number, within openedMaxRefs.
func (t *Tuner) keepRefs(td *trimDec, refs []actuate.FileRef) {
	for _, r := range refs {
		dup := false
		for _, o := range td.refs {
			if o.Tgid == r.Tgid && o.FD == r.FD {
				dup = true
				break
			}
		}
		if !dup {
			td.refs = append(td.refs, r)
		}
	}
	if len(td.refs) <= openedMaxRefs {
		return
	}
	open := td.refs[:0]
	for _, r := range td.refs {
		if !t.closed(r) {
			open = append(open, r)
		}
	}
	td.refs = open
	if len(td.refs) > openedMaxRefs {
		// Still open: the oldest are given back by their readers' close.
		td.refs = td.refs[len(td.refs)-openedMaxRefs:]
	}
}

// pruneOpened forgets processes the event path has not acted on for a
// while.
func pruneOpened(td *trimDec, now time.Duration) {
	for tgid, m := range td.opened {
		if now-max(m.at, m.until) >= trimScanEvery {
			delete(td.opened, tgid)
		}
	}
}

// trimScanEvery bounds how often one file's readers are searched for
// in every process's descriptors.
const trimScanEvery = 30 * time.Second

// closed reports whether ref is known closed (or its process gone).
func (t *Tuner) closed(ref actuate.FileRef) bool { return !t.deps.Files.Holds(ref) }
