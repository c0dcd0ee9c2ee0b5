package tuner

import (
	"errors"
	"maps"
	"time"

	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Causes of a failed per-file action: the bounded label set of
// readaheadd_repeated_failures_total.
const (
	CauseOutOfScope  = "out_of_scope"
	CauseProcessGone = "process_gone"
	CauseFDGone      = "fd_gone"
	CausePermission  = "permission"
	CauseOther       = "other"
)

// FailureCauses lists every cause, for series that exist at zero.
var FailureCauses = []string{CauseOutOfScope, CauseProcessGone, CauseFDGone, CausePermission, CauseOther}

// maxFailMemo bounds the memo; past it, expired entries go, then all.
const maxFailMemo = 4096

// failCause classifies an error of a per-file action.
func failCause(err error) string {
	switch {
	case errors.Is(err, errOutOfScope):
		return CauseOutOfScope
	case errors.Is(err, actuate.ErrProcessGone):
		return CauseProcessGone
	case errors.Is(err, actuate.ErrFDGone):
		return CauseFDGone
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return CausePermission
	}
	return CauseOther
}

type failKey struct {
	file  probe.FileKey
	kind  ActionKind
	cause string
}

type failSeen struct {
	n       int
	retryAt time.Duration
}

// failMemo logs a failure repeated for a file, kind and cause once, counts
// the rest and retries with exponential back-off, not on every event.
type failMemo struct {
	seen     map[failKey]*failSeen
	repeated map[string]uint64 // by cause
}

// due reports whether kind on file may be tried at now. A reader gone or
// its descriptor closed says nothing of the next: logged once, hold nothing.
func (m *failMemo) due(file probe.FileKey, kind ActionKind, now time.Duration) bool {
	for _, c := range FailureCauses {
		if c == CauseProcessGone || c == CauseFDGone {
			continue
		}
		if s, ok := m.seen[failKey{file, kind, c}]; ok && now < s.retryAt {
			return false
		}
	}
	return true
}

// failed records a failure; true if first for its cause (log it).
func (m *failMemo) failed(file probe.FileKey, kind ActionKind, cause string, now time.Duration, backoff func(int) time.Duration) bool {
	if m.seen == nil {
		m.seen, m.repeated = map[failKey]*failSeen{}, map[string]uint64{}
	}
	k := failKey{file, kind, cause}
	s, ok := m.seen[k]
	if !ok {
		if len(m.seen) >= maxFailMemo { // full: forget what waits no more, or all
			if maps.DeleteFunc(m.seen, func(_ failKey, s *failSeen) bool { return now >= s.retryAt }); len(m.seen) >= maxFailMemo {
				clear(m.seen)
			}
		}
		s = &failSeen{}
		m.seen[k] = s
	}
	s.n++
	s.retryAt = now + backoff(s.n)
	if ok {
		m.repeated[cause]++
	}
	return !ok
}

// ok forgets kind's failures on file after a success.
func (m *failMemo) ok(file probe.FileKey, kind ActionKind) {
	for _, c := range FailureCauses {
		delete(m.seen, failKey{file, kind, c})
	}
}

// counts returns the repeats by cause.
func (m *failMemo) counts() map[string]uint64 {
	out := make(map[string]uint64, len(FailureCauses))
	for _, c := range FailureCauses {
		out[c] = m.repeated[c]
	}
	return out
}

// errRateLimited defers a step to a later interval; it is not a failure.
var errRateLimited = errors.New("sysfs write rate limit reached")

// errNoReaders: no reader of the file is known to hold it open (yet).
var errNoReaders = errors.New("no known reader holds the file open")

// errOutOfScope: the readers' descriptors are outside the allow-paths.
var errOutOfScope = errors.New("the file is outside the allow-paths")
