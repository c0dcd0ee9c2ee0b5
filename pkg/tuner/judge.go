package tuner

// The verdict on a step under trial as data: the evidence, gathered once
// (evidenceFor), and one ordered table of rules. The first rule that holds
// decides; a waiver only lets a step short of its margin on to the rules
// after it. docs/tuner-rules.md lists the table (TestRulesDocumented).

import (
	"fmt"
	"time"
)

// facts: the evidence, all a step's verdict depends on.
type facts struct {
	kind      ActionKind
	m, before measure // the measure judged; the one before the step (its tput the steady mean, if any)
	// gain over before; the keep margin (youngMargin if the before-measure
	// took in the stream's start), and the margin without that.
	gain, margin, ordinary float64
	atCap                  bool // the margin is halved: a lone stream at the device's capacity (marginFor)
	since, settle          time.Duration
	keepsEarly, ended      bool // an early keep that pays (keepsEarly); the stream stopped (endedVerdict)
	// The stream's tail (tail.go): the window a stalled span grows the step
	// to (0: none), put-offs; the tail in the span judged, in the before's.
	resizeTo, later     int
	tailNow, beforeTail bool
	// Why the step is kept without its margin, "" if not: prior confirmed,
	// the stream's tail (tailKeep), a file slower than its device (shiftKeep).
	prior, tail, shift  string
	youngBefore, atBase bool // before-measure young (ladder.trial.young); the step left base
	// lossDev, lossOthers: the device's total and its protected readers'
	// share before the step, of the readers still reading (lossBase).
	lossDev, lossOthers float64
	// capBPS: the device's capacity, else the detector's peak, else the busier
	// of before and now (a slow device's good steps raise its busy rate);
	// capFrac: the share of it read at capacity (Config.CapacityFrac);
	// peerGain: what the device's other file window steps taken with this
	// one added to their streams, bytes/s (judgeCtx.peerGain).
	capBPS, capFrac, peerGain float64
	randLater                 bool // the verdict was put off once on the random readers (ladder.trial.randLater)
}

func (e *facts) beforeSettle() bool  { return e.since < e.settle-e.settle/10 }
func (e *facts) shortOfMargin() bool { return !e.m.ok || e.gain < e.margin }
func (e *facts) onFileWindow() bool  { return e.kind == KindFileWindow }

// onWindow: a file's or the device's window; either queues ahead of the
// random readers beside it (a prefetch is a stream's own reads, bounded).
func (e *facts) onWindow() bool     { return e.kind == KindFileWindow || e.kind == KindDeviceWindow }
func (e *facts) marginWaived() bool { return e.prior != "" || e.tail != "" || e.shift != "" }

// devRise is the device's busy rate's rise with what its random readers no
// longer read (their budget says what the step cost them).
func (e *facts) devRise() float64 {
	return e.m.devBusy - e.before.devBusy + max(0, e.before.random-e.m.random)
}

// stalledSpan: a file window step short of its margin on a measure, the
// stream still reading, the span judged stalled and the before-measure's
// not, put off fewer than tailMaxLater times: it can be resized or waited for.
func (e *facts) stalledSpan() bool {
	return e.m.ok && e.gain < e.margin && !e.ended && e.onFileWindow() && e.tailNow && !e.beforeTail && e.later < tailMaxLater
}

// randOver: the random readers over budget (their p99 short of far off over a
// whole interval); randNear: by so little, for the first time, it waits one.
func (e *facts) randOver() bool {
	return e.onWindow() && (e.m.rand.over() || !e.beforeSettle() && e.m.rand.n > 0 && e.m.rand.tail > randTailBudget)
}
func (e *facts) randNear() bool {
	return !e.randLater && (e.m.rand.mean <= 1 || e.m.rand.mean <= randMeanNear && e.m.rand.tail < randTailSevere)
}

// ruleOut is what a verdict does to the step.
type ruleOut uint8

const (
	outWait       ruleOut = iota // not judged now: the step stays, nothing changes
	outResize                    // grown to the window the stream's tail needs, judged next interval
	outLater                     // judged next interval (ladder.trial.later)
	outRandLater                 // judged next interval (ladder.trial.randLater)
	outWaive                     // kept without its margin if no rule below undoes it
	outRetry                     // undone, and taken again once the stream is measured whole
	outUndo                      // undone: back-off, or the knee
	outUndoRandom                // undone, the knee held for BackoffMax on the random readers
	outKeep                      // kept; the next step follows
)

// ruleReason names a rule; its value is the rule's place in the table.
type ruleReason uint8

const (
	rNotYet ruleReason = iota
	rNoReads
	rTailResized
	rJudgedLater
	rPriorConfirmed
	rTailKept
	rShiftKept
	rRandomOver
	rYoungRetry
	rNotPaid
	rDeviceFell
	rOthersLost
	rDeviceAtCapacity
	rRandomLater
	rKept
	numReasons
)

// othersMin: the device's other readers count for a step's verdict once
// they read at least this share of its bytes.
const othersMin = 0.1

// devShareOfGain: under this share of a stream's gain on the device's busy
// rate, the rest was other readers' (device_at_capacity).
const devShareOfGain = 0.5

// evNone: a rule that counts no event.
const evNone = numEvents

// verdictRule is one entry of the table: reason, name and doc, when it holds,
// what it gives, the event it counts, the evidence clause it adds (nil: none).
type verdictRule struct {
	reason    ruleReason
	name, doc string
	out       ruleOut
	event     Event
	when      func(e *facts) bool
	clause    func(e *facts) string
}

var verdictRules = [numReasons]verdictRule{
	// The tick one Settle after a step may read the clock a little early and
	// must still judge it (beforeSettle allows a tenth).
	{rNotYet, "not_yet", "under most of a Settle since the step, not kept early (keepsEarly), its stream still reading: judged later", outWait, evNone,
		func(e *facts) bool { return e.beforeSettle() && !e.keepsEarly && !(e.ended && e.m.ok) }, nil},
	{rNoReads, "no_reads", "no reads to judge by, under 4 Settles since the step: judged later", outWait, evNone,
		func(e *facts) bool { return !e.m.ok && e.since < 4*e.settle }, nil},
	// A stalled span against a stall-free before-measure compares a stall
	// with its absence, not two windows: the step is grown to what the stall
	// needs, or judged next interval. An ended stream has no more to wait for.
	{rTailResized, "tail_resized", "short of its margin on a span with the stream's tail, the before-measure's without: grown to the window the tail needs", outResize, EvJudgedLater,
		func(e *facts) bool { return e.stalledSpan() && e.resizeTo > 0 }, nil},
	{rJudgedLater, "judged_later", "short of its margin on a span with the stream's tail, the before-measure's without: judged next interval (twice at most)", outLater, EvJudgedLater,
		func(e *facts) bool { return e.stalledSpan() }, nil},
	{rPriorConfirmed, "prior_confirmed", "short of its margin, a first step to its directory's prior that reads as the prior's streams did: the margin waived", outWaive, evNone,
		func(e *facts) bool { return e.shortOfMargin() && e.prior != "" }, func(e *facts) string { return e.prior }},
	{rTailKept, "tail_kept", "short of its margin, the stream's tail needs more than the window left and the step cost nothing: the margin waived", outWaive, EvTailKept,
		func(e *facts) bool { return e.shortOfMargin() && e.tail != "" }, func(e *facts) string { return e.tail }},
	{rShiftKept, "shift_kept", "short of its margin on a file slower than its device, the window still limiting it, the step cost nothing: the margin waived", outWaive, EvShiftKept,
		func(e *facts) bool { return e.shortOfMargin() && e.shift != "" }, func(e *facts) string { return e.shift }},
	// Over their budget: undone whatever the stream gained, before any rule on
	// its gain (their cost needs no stream measured whole). So is a p99 over
	// budget two intervals running (a kept window's watch needs three or four).
	{rRandomOver, "random_over_budget", "the random readers beside it over their budget (short of random_judged_later's hair), or their p99 over it two intervals running, whatever the stream gained: undone, the knee held at once (from the base: for BackoffMax no step past the share of it that met their budget)", outUndoRandom, evNone,
		func(e *facts) bool { return e.randOver() && !e.randNear() }, func(e *facts) string { return "over budget: " + e.m.rand.why }},
	// The ordinary margin paid, the start's did not: taken again after one
	// whole interval at the device's window, not after a back-off.
	{rYoungRetry, "young_retry", "short of the margin of a stream's start, paid the ordinary one: undone, taken again once the stream is measured whole (outcome_young_retry counts that)", outRetry, evNone,
		func(e *facts) bool {
			return e.shortOfMargin() && !e.marginWaived() && e.youngBefore && e.m.ok && e.atBase && e.gain >= e.ordinary && e.kind != KindDeviceWindow
		}, func(*facts) string { return "judged on the stream's start: tried again once it is measured whole" }},
	{rNotPaid, "not_paid", "short of its margin: undone, with back-off, or the knee if an earlier step paid", outUndo, evNone,
		func(e *facts) bool { return e.shortOfMargin() && !e.marginWaived() }, nil},
	// The other readers must not pay for the gain: a window that only queues
	// ahead of others wins nothing the device did not lose elsewhere.
	{rDeviceFell, "device_total_fell", "a file window step under which the device's total fell by more than devLossMax: undone", outUndo, evNone,
		func(e *facts) bool {
			return e.onFileWindow() && e.lossDev > 0 && e.m.dev > 0 && e.m.dev < (1-devLossMax)*e.lossDev
		}, func(e *facts) string {
			return fmt.Sprintf("the device's total fell %.1f -> %.1f MB/s: its other readers lost more", e.lossDev/1e6, e.m.dev/1e6)
		}},
	// Unless the device's busy rate rose by the margin, the others' loss is the
	// stream's gain (zero-sum at capacity). Readers readaheadd does not serve
	// (O_DIRECT, outside the allow-paths) are contenders, not protected.
	{rOthersLost, "others_lost", "a step no regime asked for under which the device's protected readers (othersMin of its bytes) lost more than devLossMax and the device's busy rate did not rise by the margin: undone", outUndo, evNone,
		func(e *facts) bool {
			return e.m.othersMustNotLose && e.lossDev > 0 && e.lossOthers > othersMin*e.lossDev && e.m.others < (1-devLossMax)*e.lossOthers &&
				!(e.before.devBusy > 0 && e.m.devBusy >= (1+e.ordinary)*e.before.devBusy)
		}, func(e *facts) string {
			return fmt.Sprintf("the device's other readers lost %.1f -> %.1f MB/s", e.lossOthers/1e6, e.m.others/1e6)
		}},
	// At capacity a window bound stream reads its share (Little's law): a gain
	// the device's busy rate did not show is another stream's loss, whatever
	// asked or waived. Steps taken together share the one rise (peerGain).
	{rDeviceAtCapacity, "device_at_capacity", "a file step, paid or waived, on a device reading at its capacity (CapacityFrac; its peak, else the busier of before and after, if not known yet) before or after it, under which the device's busy rate (with what its random readers no longer read) rose by less than devShareOfGain of what the stream and the steps taken with it gained (no rise shown without a before of the device), protected readers beside it (othersMin): undone, its gain was their share", outUndo, evNone,
		func(e *facts) bool {
			return e.kind != KindDeviceWindow && e.capBPS > 0 && max(e.before.devBusy, e.m.devBusy) >= e.capFrac*e.capBPS &&
				e.devRise() < devShareOfGain*(e.m.rate-e.before.rate+e.peerGain) && e.lossDev > 0 && e.lossOthers > othersMin*e.lossDev
		}, func(e *facts) string {
			peers := ""
			if e.peerGain > 0 {
				peers = fmt.Sprintf(" and the %.1f of steps taken with it", e.peerGain/1e6)
			}
			return fmt.Sprintf("the device read at its capacity (%.1f -> %.1f of %.1f MB/s) and its busy rate rose %.1f MB/s of the stream's %.1f%s",
				e.before.devBusy/1e6, e.m.devBusy/1e6, e.capBPS/1e6, e.devRise()/1e6, (e.m.rate-e.before.rate)/1e6, peers)
		}},
	// Their p99 alone in one interval strays 20-30% with no step (and a trim
	// within the span mixes two request sizes); nor is their mean over its
	// budget by a hair a verdict. The next interval judges it.
	{rRandomLater, "random_judged_later", "the random readers beside it over their budget by one interval's p99, or their mean by a hair, for the first time: judged next interval", outRandLater, EvRandomJudgedLater,
		func(e *facts) bool { return e.randOver() && e.randNear() }, nil},
	// Beside random readers the watch starts afresh.
	{rKept, "kept", "kept: it paid its margin (or had it waived) and nothing above undid it", outKeep, evNone,
		func(*facts) bool { return true }, func(e *facts) string {
			switch {
			case !e.onWindow() || e.m.rand.n == 0:
				return ""
			case e.m.rand.tail > randTailBudget:
				return "watched: " + e.m.rand.why
			}
			return "within budget: " + e.m.rand.why
		}},
}

func (r ruleReason) String() string { return verdictRules[r].name }

// Doc is what the rule decides, in one line.
func (r ruleReason) Doc() string { return verdictRules[r].doc }

// trialVerdict: the rule that decided and the waiver that let the step past, if any.
type trialVerdict struct {
	rule, waiver *verdictRule
}

// judgeTrial walks the table: the first rule that holds decides; the first
// waiver that holds is kept and the walk goes on.
func judgeTrial(e facts) trialVerdict {
	var v trialVerdict
	for i := range verdictRules {
		switch r := &verdictRules[i]; {
		case !r.when(&e):
		case r.out != outWaive:
			v.rule = r
			return v
		case v.waiver == nil:
			v.waiver = r
		}
	}
	panic("tuner: the last verdict rule always holds")
}
