package tuner

import (
	"fmt"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// A stream slowed by its file (its requests slower than the device's for
// their size: an old file, a slowed region) needs a window larger in
// proportion to read at the device's bandwidth (Little's law: bytes in
// flight = rate x latency). Its first steps pay their margin (the default
// window covers a fraction of the latency); the last ones toward the window
// that covers it gain a few percent each, less than the noise of one
// interval on a busy host, and a ladder that asks every step for its margin
// stops short (measured: 256 KB and 91% of the best static window beside a
// random reader, where 4 MB reads 147 MB/s). So on such a stream a step
// that cost it nothing is kept while the bytes it keeps in flight (rate x
// median latency at the step) are more than the window it left: the window
// still limits it. Slowed: the detector reports the file's latency shift,
// or at its base window the stream read below slowedFrac of the device's
// learned capacity while the device had bandwidth to spare (its total below
// CapacityFrac of it): a healthy stream alone reads at 0.93-1.0 of it there,
// several streams share it, and their steps still pay their margin. The device's total, its other readers and the random
// readers beside it are judged after this, as for any step.
// slowedFrac: a stream reading below this share of its device's capacity at
// the device's window, with bandwidth to spare, is slowed by its file.
const slowedFrac = 0.8

func (t *Tuner) shiftKeep(file probe.FileKey, l *ladder, m measure) (string, bool) {
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
	case l.baseM.ok && capBPS > 0 && l.baseM.tput < slowedFrac*capBPS && l.baseM.dev > 0 && l.baseM.dev < t.cfg.CapacityFrac*capBPS:
		slowed = fmt.Sprintf("at its base window it read %.1f MB/s (the device %.1f MB/s), below %.0f%% of the device's %.1f MB/s",
			l.baseM.tput/1e6, l.baseM.dev/1e6, 100*slowedFrac, capBPS/1e6)
	default:
		return "", false
	}
	inflightKB := int(m.tput * m.p50.Seconds() / 1024)
	if inflightKB <= l.trialFrom {
		return "", false
	}
	t.counts["outcome/shift_kept"]++
	return fmt.Sprintf("kept without its margin: %s and the step cost it nothing; it keeps about %d KB in flight (p50 %v), more than the %d KB it left",
		slowed, inflightKB, m.p50.Round(100*time.Microsecond), l.trialFrom), true
}
