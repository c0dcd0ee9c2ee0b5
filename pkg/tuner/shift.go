package tuner

import (
	"fmt"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// slowedFrac: a stream reading below this share of its device's capacity at
// the device's window, with bandwidth to spare, is slowed by its file.
const slowedFrac = 0.8

// shiftKeep reports whether a file window step that did not pay its margin
// is kept anyway, and why. A stream slowed by its file (an old file, a
// slowed region) needs a window larger in proportion to read at the
// device's bandwidth (Little's law: bytes in flight = rate x latency). Its
// first steps pay their margin; the last ones toward the window that
// covers the latency gain a few percent each, less than one interval's
// noise on a busy host, and a ladder that asks each for its margin stops
// short (slowed before the open at +1.5 ms: 0.97 of the best static window
// before this, 0.99 with it). Such a step is kept if it cost the stream
// nothing and the bytes it keeps in flight (rate x median latency) are more
// than the window it left: the window still limits it. Slowed: the detector
// reports the file's latency shift, or at its base window the stream read
// below slowedFrac of the device's learned capacity while the device had
// bandwidth to spare (a healthy stream alone reads at 0.93-1.0 of it;
// several share it). Never beside a random reader. The device's total and
// its other readers are judged after this, as for any step.
func (t judgeCtx) shiftKeep(file probe.FileKey, l *ladder, m measure) (string, bool) {
	fd := t.files[file]
	if fd == nil || !m.ok || l.kind != KindFileWindow || t.randomReaderBeside(fd) {
		// Beside a random reader every step pays its margin, as for a
		// tail: its faults wait behind every byte the stream keeps
		// queued, and a step measured across a change of its trim has no
		// reference for what it cost them (measured: kept at 512 KB on
		// +3 ms, the random reader's p99 2.8x the default's).
		return "", false
	}
	if l.before.tput <= 0 || m.tput < l.before.tput || m.p50 <= 0 {
		return "", false
	}
	var slowed string
	capBPS := t.dstats[fd.dev.dev].CapacityBPS
	switch {
	case slices.Contains(fd.regimes, detector.FileLatencyShift):
		slowed = fmt.Sprintf("the file's requests are slower than the device's (%s)", detector.FileLatencyShift)
	case l.baseM.ok && !l.baseM.young && capBPS > 0 && l.baseM.tput < slowedFrac*capBPS && l.baseM.dev > 0 && l.baseM.dev < t.cfg.CapacityFrac*capBPS:
		slowed = fmt.Sprintf("at its base window it read %.1f MB/s (the device %.1f MB/s), below %.0f%% of the device's %.1f MB/s",
			l.baseM.tput/1e6, l.baseM.dev/1e6, 100*slowedFrac, capBPS/1e6)
	default:
		return "", false
	}
	inflightKB := int(m.tput * m.p50.Seconds() / 1024)
	if inflightKB <= l.trialFrom {
		return "", false
	}
	t.count(EvShiftKept)
	return fmt.Sprintf("kept without its margin: %s and the step cost it nothing; it keeps about %d KB in flight (p50 %v), more than the %d KB it left",
		slowed, inflightKB, m.p50.Round(100*time.Microsecond), l.trialFrom), true
}
