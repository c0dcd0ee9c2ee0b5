package tuner

import (
	"fmt"
	"time"
)

// A random reader beside a stream (an mmap reader faulting pages, a service
// reading records) waits, on each of its reads, behind the transfers the
// stream's window keeps queued: a larger window for the stream is paid in
// its latency and so in its rate. Its bytes say nothing of that (a trimmed
// reader reads fewer bytes by design), its requests and their latency do.
// A stream's step is kept only if the random readers beside it did not
// lose: their requests per second within randLossMax of what they were
// before the step and at the stream's base window, their p95 within
// randLatMax (the p95: over one interval's few hundred faults the p99 is a
// handful of them). Judged against the base window too, so that steps that
// each cost a little do not add up.
//
// A random reader's requests before its trim and after it are not the
// same requests (16 KB instead of a read-around window each, several
// times as many per second): a reference taken across a trim change is
// no reference, and the step is judged on the stream's own gain. The step
// kept, the trimmed readers' service beside it is the reference the next
// steps answer to (rebaseRandom).
//
// What their own read-around trim gave them is theirs: judged against the
// default window's service instead, the stream took the gain back and more
// (measured: the random reader's p99 1.6-1.8x the default's; see
// docs/results/outcome-control).
const (
	randLossMax = 0.05
	randLatMax  = 0.10
)

// randSevere: a loss this many times the bound (requests/s below half of
// the reference, or a p95 1.5x it) is no interval's noise: the knee it
// leaves is not probed again soon (each probe is a second of that loss).
const randSevere = 5

// randomLost says how the random readers beside a stream lost by its step
// (m against the step's before-measure and the decision's base-window
// measure), "" if they did not or there were none in both, and whether by
// far more than one interval's noise (randSevere).
func randomLost(l *ladder, m measure) (why string, severe bool) {
	for _, ref := range []struct {
		name string
		m    measure
	}{{"before the step", l.before}, {"at the stream's base window, or since their last trim", l.baseM}} {
		b := ref.m
		if b.randReq <= 0 || m.randReq <= 0 || !sameRandom(b, m) {
			continue
		}
		reqLost := func(k float64) bool { return m.randReq < (1-k*randLossMax)*b.randReq }
		latLost := func(k float64) bool {
			return b.randP95 > 0 && m.randP95 > time.Duration(float64(b.randP95)*(1+k*randLatMax))
		}
		severe = severe || reqLost(randSevere) || latLost(randSevere)
		switch {
		case why != "":
		case reqLost(1):
			why = fmt.Sprintf("the random readers beside it lost: %.0f -> %.0f requests/s (%s)", b.randReq, m.randReq, ref.name)
		case latLost(1):
			why = fmt.Sprintf("the random readers beside it lost: p95 %v -> %v (%s)", b.randP95, m.randP95, ref.name)
		}
	}
	return why, severe
}

// sameRandom reports whether two measures saw the random readers under the
// same trims.
func sameRandom(a, b measure) bool {
	return a.randGen == b.randGen && a.randGen >= 0
}

// rebaseRandom makes m (a step's before-measure, or a kept step's) the
// random readers' base-window reference if the one there was taken under
// other trims.
func rebaseRandom(l *ladder, m measure) {
	if m.randReq > 0 && !sameRandom(l.baseM, m) && m.randGen >= 0 {
		l.baseM.randReq, l.baseM.randP95, l.baseM.randGen = m.randReq, m.randP95, m.randGen
	}
}

// trimComing reports whether a random reader on the device has its
// read-around trim under trial, or is read-around sized and not trimmed
// yet (its trim comes with the device's raised window).
func (t *Tuner) trimComing(d *devState) bool {
	for _, td := range t.trims {
		if td.dev == d && td.trialAt != 0 {
			return true
		}
	}
	if k, ok := t.randomOnDevice(d.dev); ok && t.trims[k] == nil {
		return true
	}
	return false
}
