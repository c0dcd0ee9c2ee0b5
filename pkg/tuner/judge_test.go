package tuner

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/docsync"
)

// paidFacts: a file window step judged a whole Settle after it, +20%
// against a 10% margin, nothing lost elsewhere.
func paidFacts() facts {
	return facts{kind: KindFileWindow, settle: time.Second, since: time.Second,
		m:      measure{ok: true, tput: 120e6, rate: 120e6, dev: 200e6},
		before: measure{ok: true, tput: 100e6, rate: 100e6, dev: 200e6},
		gain:   0.2, margin: 0.1, ordinary: 0.1, lossDev: 200e6}
}

// TestJudgeTrialRuleByRule: each rule of the table decides on the evidence
// it is written for, and not one rule earlier or later (one row per rule,
// and the edges where the next rule takes over).
func TestJudgeTrialRuleByRule(t *testing.T) {
	const short = -0.1
	seen := map[ruleReason]bool{}
	rand := func(mean, tail float64) randCost { return randCost{n: 1, mean: mean, tail: tail, why: "reader r"} }
	for _, tc := range []struct {
		name   string
		facts  func(e *facts)
		want   ruleReason
		waiver ruleReason // numReasons: none
		clause string
	}{
		{"half a Settle, not kept early", func(e *facts) { e.since = e.settle / 2 }, rNotYet, numReasons, ""},
		{"half a Settle, kept early", func(e *facts) { e.since, e.keepsEarly = e.settle/2, true }, rKept, numReasons, ""},
		{"half a Settle, the stream ended", func(e *facts) { e.since, e.ended = e.settle/2, true }, rKept, numReasons, ""},
		{"no reads, 2 Settles", func(e *facts) { e.m, e.gain, e.since = measure{}, 0, 2*e.settle }, rNoReads, numReasons, ""},
		{"no reads, 4 Settles", func(e *facts) { e.m, e.gain, e.since = measure{}, 0, 4*e.settle }, rNotPaid, numReasons, ""},
		{"short, stalled span, tail needs more", func(e *facts) { e.gain, e.tailNow, e.resizeTo = short, true, 512 }, rTailResized, numReasons, ""},
		{"short, stalled span, ended", func(e *facts) { e.gain, e.tailNow, e.resizeTo, e.ended = short, true, 512, true }, rNotPaid, numReasons, ""},
		{"short, stalled span", func(e *facts) { e.gain, e.tailNow = short, true }, rJudgedLater, numReasons, ""},
		{"short, stalled span, before's too", func(e *facts) { e.gain, e.tailNow, e.beforeTail = short, true, true }, rNotPaid, numReasons, ""},
		{"short, stalled span, put off twice", func(e *facts) { e.gain, e.tailNow, e.later, e.resizeTo = short, true, tailMaxLater, 512 }, rNotPaid, numReasons, ""},
		{"short, tail needs more, span not stalled", func(e *facts) { e.gain, e.resizeTo = short, 512 }, rNotPaid, numReasons, ""},
		{"short, stalled span, device window", func(e *facts) { e.gain, e.tailNow, e.kind = short, true, KindDeviceWindow }, rNotPaid, numReasons, ""},
		{"short, prior confirmed (and a tail)", func(e *facts) { e.gain, e.prior, e.tail = short, "prior", "tail" }, rKept, rPriorConfirmed, ""},
		{"short, tail kept", func(e *facts) { e.gain, e.tail, e.shift = short, "tail", "shift" }, rKept, rTailKept, ""},
		{"short, shift kept", func(e *facts) { e.gain, e.shift = short, "shift" }, rKept, rShiftKept, ""},
		{"paid: no waiver", func(e *facts) { e.tail = "tail" }, rKept, numReasons, ""},
		{"short of a young start's margin", func(e *facts) { e.margin, e.youngBefore, e.atBase = youngMargin, true, true }, rYoungRetry, numReasons,
			"judged on the stream's start: tried again once it is measured whole"},
		{"short of a young start's margin, not from base", func(e *facts) { e.margin, e.youngBefore = youngMargin, true }, rNotPaid, numReasons, ""},
		{"short of the ordinary margin too", func(e *facts) { e.margin, e.youngBefore, e.atBase, e.gain = youngMargin, true, true, 0.05 }, rNotPaid, numReasons, ""},
		{"short", func(e *facts) { e.gain = short }, rNotPaid, numReasons, ""},
		{"short of a young start's margin, random readers' mean far over", func(e *facts) {
			e.margin, e.youngBefore, e.atBase, e.m.rand = youngMargin, true, true, rand(1.5, 1.0)
		}, rRandomOver, numReasons, "over budget: reader r"},
		{"short, random readers' mean far over", func(e *facts) { e.gain, e.m.rand = short, rand(1.5, 1.0) }, rRandomOver, numReasons, "over budget: reader r"},
		{"short, random readers' mean over by a hair", func(e *facts) { e.gain, e.m.rand = short, rand(1.02, 1.0) }, rNotPaid, numReasons, ""},
		{"the device's total fell, random readers' p99 over again", func(e *facts) { e.m.dev, e.m.rand, e.randLater = 150e6, rand(0.8, 1.2), true }, rRandomOver, numReasons,
			"over budget: reader r"},
		{"the device's total fell", func(e *facts) { e.m.dev = 150e6 }, rDeviceFell, numReasons, "the device's total fell 200.0 -> 150.0 MB/s: its other readers lost more"},
		{"the device's total fell, tail kept", func(e *facts) { e.gain, e.tail, e.m.dev = short, "tail", 150e6 }, rDeviceFell, rTailKept,
			"the device's total fell 200.0 -> 150.0 MB/s: its other readers lost more"},
		{"the device's total fell, device window", func(e *facts) { e.kind, e.m.dev = KindDeviceWindow, 150e6 }, rKept, numReasons, ""},
		{"the device at its capacity, its busy rate flat", func(e *facts) {
			e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy = 100e6, 150e6, 0.9, 145e6, 146e6
		}, rDeviceAtCapacity, numReasons,
			"the device read at its capacity (145.0 -> 146.0 of 150.0 MB/s) and its busy rate rose 1.0 MB/s of the stream's 20.0"},
		{"the device at its capacity after the step only, its busy rate up by a quarter of the stream's gain", func(e *facts) {
			e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy = 100e6, 150e6, 0.9, 130e6, 135e6
		}, rDeviceAtCapacity, numReasons,
			"the device read at its capacity (130.0 -> 135.0 of 150.0 MB/s) and its busy rate rose 5.0 MB/s of the stream's 20.0"},
		{"the device at its capacity, up by most of the stream's gain, not of the step taken with it", func(e *facts) {
			e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy, e.peerGain = 100e6, 150e6, 0.9, 135e6, 147e6, 30e6
		}, rDeviceAtCapacity, numReasons,
			"the device read at its capacity (135.0 -> 147.0 of 150.0 MB/s) and its busy rate rose 12.0 MB/s of the stream's 20.0 and the 30.0 of steps taken with it"},
		{"the device at its capacity, up by half of what the stream and the step taken with it gained", func(e *facts) {
			e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy, e.peerGain = 100e6, 150e6, 0.9, 120e6, 146e6, 30e6
		}, rKept, numReasons, ""},
		{"the device at its capacity, its busy rate up by the margin", func(e *facts) {
			e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy = 100e6, 150e6, 0.9, 140e6, 160e6
		}, rKept, numReasons, ""},
		{"the device at its capacity, up by most of the stream's gain but under the margin", func(e *facts) {
			e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy = 100e6, 150e6, 0.9, 145e6, 157e6
		}, rKept, numReasons, ""},
		{"the device at its capacity, flat, the random readers' read-around spared by what the stream gained", func(e *facts) {
			e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy, e.before.random, e.m.random = 100e6, 150e6, 0.9, 145e6, 146e6, 36e6, 10e6
		}, rKept, numReasons, ""},
		{"the device at its capacity, flat, the random readers' bytes up", func(e *facts) {
			e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy, e.before.random, e.m.random = 100e6, 150e6, 0.9, 145e6, 146e6, 10e6, 36e6
		}, rDeviceAtCapacity, numReasons, "the device read at its capacity (145.0 -> 146.0 of 150.0 MB/s) and its busy rate rose 1.0 MB/s of the stream's 20.0"},
		{"the device at its capacity, flat, only contenders beside it", func(e *facts) { e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy = 150e6, 0.9, 145e6, 146e6 }, rKept, numReasons, ""},
		{"the device below its capacity, its busy rate flat", func(e *facts) {
			e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy = 100e6, 150e6, 0.9, 100e6, 100e6
		}, rKept, numReasons, ""},
		// A waiver says the step cost the stream nothing, not the others.
		{"the device at its capacity, flat, tail kept", func(e *facts) {
			e.gain, e.tail, e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy = short, "tail", 100e6, 150e6, 0.9, 145e6, 146e6
		}, rDeviceAtCapacity, rTailKept, "the device read at its capacity (145.0 -> 146.0 of 150.0 MB/s) and its busy rate rose 1.0 MB/s of the stream's 20.0"},
		{"the device at its capacity, flat, shift kept, the stream's rate flat", func(e *facts) {
			e.gain, e.shift, e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy, e.m.rate = short, "shift", 100e6, 150e6, 0.9, 145e6, 146e6, 100e6
		}, rKept, rShiftKept, ""},
		// A prior given before the daemon read the device: no before.
		{"the device at its capacity, no before of it, protected readers beside", func(e *facts) {
			e.before.devBusy, e.lossDev, e.lossOthers, e.capBPS, e.capFrac, e.m.devBusy = 149e6, 150e6, 100e6, 150e6, 0.9, 149e6
		}, rDeviceAtCapacity, numReasons, "the device read at its capacity (149.0 -> 149.0 of 150.0 MB/s) and its busy rate rose 0.0 MB/s of the stream's 20.0"},
		{"no before of the device, alone on it", func(e *facts) {
			e.before.devBusy, e.lossDev, e.lossOthers, e.capBPS, e.capFrac, e.m.devBusy = 149e6, 150e6, 0, 150e6, 0.9, 149e6
		}, rKept, numReasons, ""},
		{"no before of the device, below its capacity", func(e *facts) {
			e.before.devBusy, e.lossDev, e.lossOthers, e.capBPS, e.capFrac, e.m.devBusy = 100e6, 100e6, 60e6, 150e6, 0.9, 100e6
		}, rKept, numReasons, ""},
		{"a before whose readers all ended, at capacity, flat", func(e *facts) {
			e.lossDev, e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy = 0, 0, 150e6, 0.9, 145e6, 146e6
		}, rKept, numReasons, ""},
		{"the device below its capacity, flat, tail kept", func(e *facts) {
			e.gain, e.tail, e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy = short, "tail", 100e6, 150e6, 0.9, 100e6, 100e6
		}, rKept, rTailKept, ""},
		{"the device at its capacity, flat, device window", func(e *facts) {
			e.kind, e.lossOthers, e.capBPS, e.capFrac, e.before.devBusy, e.m.devBusy = KindDeviceWindow, 100e6, 150e6, 0.9, 145e6, 146e6
		}, rKept, numReasons, ""},
		{"other readers lost", func(e *facts) { e.m.othersMustNotLose, e.lossOthers, e.m.others = true, 100e6, 50e6 }, rOthersLost, numReasons,
			"the device's other readers lost 100.0 -> 50.0 MB/s"},
		{"other readers lost, the device's busy rate up by the margin", func(e *facts) {
			e.m.othersMustNotLose, e.lossOthers, e.m.others, e.before.devBusy, e.m.devBusy = true, 100e6, 50e6, 90e6, 150e6
		}, rKept, numReasons, ""},
		{"other readers lost, the device's busy rate flat", func(e *facts) {
			e.m.othersMustNotLose, e.lossOthers, e.m.others, e.before.devBusy, e.m.devBusy = true, 100e6, 50e6, 150e6, 150e6
		}, rOthersLost, numReasons, "the device's other readers lost 100.0 -> 50.0 MB/s"},
		{"other readers lost, not protected", func(e *facts) { e.lossOthers, e.m.others = 100e6, 50e6 }, rKept, numReasons, ""},
		{"other readers lost, under othersMin", func(e *facts) { e.m.othersMustNotLose, e.lossOthers, e.m.others = true, 10e6, 5e6 }, rKept, numReasons, ""},
		{"random readers' mean over by a hair", func(e *facts) { e.m.rand = rand(1.02, 1.0) }, rRandomLater, numReasons, ""},
		{"random readers' p99 over, mean within", func(e *facts) { e.m.rand = rand(0.8, 1.2) }, rRandomLater, numReasons, ""},
		{"random readers' p99 over, early keep", func(e *facts) { e.m.rand, e.since, e.keepsEarly = rand(0.8, 1.2), e.settle/2, true }, rKept, numReasons, "watched: reader r"},
		{"random readers' p99 over again", func(e *facts) { e.m.rand, e.randLater = rand(0.8, 1.2), true }, rRandomOver, numReasons, "over budget: reader r"},
		{"random readers' mean far over", func(e *facts) { e.m.rand = rand(1.5, 1.0) }, rRandomOver, numReasons, "over budget: reader r"},
		{"random readers' p99 severe, mean within", func(e *facts) { e.m.rand = rand(0.8, randTailSevere) }, rRandomLater, numReasons, ""},
		{"random readers' p99 severe, mean over by a hair", func(e *facts) { e.m.rand = rand(1.02, randTailSevere) }, rRandomOver, numReasons, "over budget: reader r"},
		{"random readers within budget", func(e *facts) { e.m.rand = rand(0.8, 1.0) }, rKept, numReasons, "within budget: reader r"},
		{"random readers' mean far over, device window", func(e *facts) { e.kind, e.m.rand = KindDeviceWindow, rand(1.5, 1.0) }, rRandomOver, numReasons, "over budget: reader r"},
		{"random readers' mean far over, prefetch", func(e *facts) { e.kind, e.m.rand = KindPrefetch, rand(1.5, 1.0) }, rKept, numReasons, ""},
		{"paid", func(*facts) {}, rKept, numReasons, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := paidFacts()
			tc.facts(&e)
			v := judgeTrial(e)
			require.NotNil(t, v.rule)
			seen[v.rule.reason] = true
			if v.waiver != nil {
				seen[v.waiver.reason] = true
			}
			assert.Equal(t, tc.want, v.rule.reason, "rule")
			if tc.waiver == numReasons {
				assert.Nil(t, v.waiver, "waiver")
			} else if assert.NotNil(t, v.waiver, "waiver") {
				assert.Equal(t, tc.waiver, v.waiver.reason, "waiver")
			}
			got := ""
			if v.rule.clause != nil {
				got = v.rule.clause(&e)
			}
			assert.Equal(t, tc.clause, got, "the rule's clause of the evidence text")
		})
	}
	assert.Len(t, seen, int(numReasons), "a row for every rule")
}

// TestJudgeTrialIsPure: judging the same evidence twice gives the same
// verdict and leaves the evidence as it was (drive judges again after a
// resize that could not be applied).
func TestJudgeTrialIsPure(t *testing.T) {
	e := paidFacts()
	e.gain, e.tailNow, e.resizeTo = -0.1, true, 512
	before := e
	assert.Equal(t, judgeTrial(e), judgeTrial(e))
	assert.Equal(t, before, e)
	// The resize not applied: the put-off it counted stands.
	e.resizeTo, e.later = 0, 1
	assert.Equal(t, rJudgedLater, judgeTrial(e).rule.reason)
	e.later = tailMaxLater
	assert.Equal(t, rNotPaid, judgeTrial(e).rule.reason)
}

// verdictRuleOrder is the documented order of the rules (docs/tuner-rules.md).
var verdictRuleOrder = []string{
	"not_yet", "no_reads", "tail_resized", "judged_later", "prior_confirmed", "tail_kept", "shift_kept", "random_over_budget",
	"young_retry", "not_paid", "device_total_fell", "others_lost", "device_at_capacity", "random_judged_later", "kept",
}

// TestVerdictRulesInOrder: the table holds each reason once, at its own
// place, in the documented order, each with a doc line and a predicate;
// the last holds always; the events the rules count are the ones drive
// counted before the table.
func TestVerdictRulesInOrder(t *testing.T) {
	var names []string
	events := map[string]string{}
	for i, r := range verdictRules {
		assert.Equal(t, ruleReason(i), r.reason, "rule %d", i)
		assert.Equal(t, r.name, r.reason.String())
		assert.NotEmpty(t, r.reason.Doc(), r.name)
		assert.NotContains(t, r.reason.Doc(), "\n", r.name)
		require.NotNil(t, r.when, r.name)
		names = append(names, r.name)
		if r.event != evNone {
			events[r.name] = r.event.String()
		}
	}
	assert.Equal(t, verdictRuleOrder, names)
	assert.True(t, verdictRules[len(verdictRules)-1].when(&facts{}), "the last rule must always hold")
	assert.Equal(t, map[string]string{
		"tail_resized": "outcome_judged_later", "judged_later": "outcome_judged_later", "tail_kept": "outcome_tail_kept",
		"shift_kept": "outcome_shift_kept", "random_judged_later": "outcome_random_judged_later",
	}, events)
}

// verdictOutcomeDoc says what each outcome does, for the docs.
var verdictOutcomeDoc = map[ruleOut]string{
	outWait: "not judged yet", outResize: "resized, judged next interval", outLater: "judged next interval",
	outRandLater: "judged next interval", outWaive: "margin waived", outRetry: "undone, taken again whole",
	outUndo: "undone", outUndoRandom: "undone, knee held", outKeep: "kept",
}

// verdictRulesTable renders the docs table of the verdict rules from the table.
func verdictRulesTable(t *testing.T) string {
	var b strings.Builder
	b.WriteString("| # | rule | gives | counts | when |\n|---|---|---|---|---|\n")
	for i, r := range verdictRules {
		out, ok := verdictOutcomeDoc[r.out]
		require.True(t, ok, "outcome %d has no doc", r.out)
		ev := ""
		if r.event != evNone {
			ev = "`" + r.event.String() + "`"
		}
		fmt.Fprintf(&b, "| %d | `%s` | %s | %s | %s |\n", i+1, r.name, out, ev, r.doc)
	}
	return b.String()
}

// TestRulesDocumented: docs/tuner-rules.md lists the verdict rules in the
// table's order, with their docs, as generated from the table.
func TestRulesDocumented(t *testing.T) {
	docsync.Check(t, "../../docs/tuner-rules.md", "verdict-rules", verdictRulesTable(t),
		"docs/tuner-rules.md's verdict rules differ from pkg/tuner/judge.go: run READAHEADD_UPDATE_DOCS=1 go test ./pkg/tuner/ -run TestRulesDocumented")
}
