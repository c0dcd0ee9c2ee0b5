package tuner

// Event is one of the control core's own events. The list below is the one
// source of readaheadd_tuner_control_total's labels and help, the
// /debug/status counts and docs/metrics.md's table (a test checks them).
type Event uint8

const (
	EvPaid Event = iota
	EvNotPaid
	EvFresh
	EvOnset
	EvJudgedLater
	EvTailKept
	EvShiftKept
	EvKneeStale
	EvOnsetInTrial
	EvKeptEarly
	EvDeferred
	EvKeptEnded
	EvEndedUnjudged
	EvYoungRetry
	EvRandomJudgedLater
	EvPriorApplied
	EvPriorRecheck
	EvPriorConfirmed
	EvPriorDropped
	EvPriorClimb
	EvPriorCaughtUp
	EvActuatorLower
	EvReadersDropped
	EvTrimScanDeferred
	EvTrimOpened
	EvTrimOpenedMissed
	numEvents
)

var eventInfo = [numEvents]struct{ name, help string }{
	EvPaid:              {"outcome_paid", "a trial of a larger window for a stream bound by its window paid and was kept (no regime needed)"},
	EvNotPaid:           {"outcome_not_paid", "such a trial did not pay and was undone"},
	EvFresh:             {"outcome_fresh", "a first step for a stream opened within the last interval, judged on its recent requests"},
	EvOnset:             {"outcome_onset", "a step taken between intervals for a stream whose recent requests slowed since the last one"},
	EvJudgedLater:       {"outcome_judged_later", "a verdict put off one interval: the step's span stalled, the span before it did not"},
	EvTailKept:          {"outcome_tail_kept", "a step kept without its margin: the stream's latency has a tail its former window could not cover, and the step cost nothing"},
	EvShiftKept:         {"outcome_shift_kept", "a step kept without its margin on a file slower than its device while the window still limits it, and the step cost nothing"},
	EvKneeStale:         {"outcome_knee_stale", "a knee probed again before its back-off: the stream reads well below its rate when the knee was found, at the same window"},
	EvOnsetInTrial:      {"outcome_onset_in_trial", "a trial ended unjudged because the stream slowed during it; the onset's own step follows at once"},
	EvKeptEarly:         {"outcome_kept_early", "a step kept on its recent requests half an interval after it was taken, because it clearly paid; the next step follows at once"},
	EvDeferred:          {"outcome_deferred", "a first step beside random readers taken a quarter interval after a slowdown began, once their service in the new conditions is known"},
	EvKeptEnded:         {"outcome_kept_ended", "a step kept when its stream stopped reading (its file ended), judged on what it read since the step"},
	EvEndedUnjudged:     {"outcome_ended_unjudged", "a step ended with no knee because its stream stopped too soon after it to judge it"},
	EvYoungRetry:        {"outcome_young_retry", "a step undone on a stream's first requests taken again once the stream read enough to judge it"},
	EvRandomJudgedLater: {"outcome_random_judged_later", "a verdict put off one interval because the random readers beside the stream were over their budget by one interval's p99 or by a hair"},
	EvPriorApplied:      {"prior_applied", "a fresh open given the window that paid in its directory"},
	EvPriorRecheck:      {"prior_recheck", "a fresh open read at the device's window for one settle time, to check its directory's prior again"},
	EvPriorConfirmed:    {"prior_confirmed", "a re-check found the prior still pays: the stream read slower at the device's window than the prior's streams; the next re-check waits twice as long"},
	EvPriorDropped:      {"prior_dropped", "a re-check found the stream as fast at the device's window as the prior's streams at theirs (the device recovered): the prior is dropped"},
	EvPriorClimb:        {"prior_climb", "a fresh open given the step above its directory's prior, to learn whether the prior should climb"},
	EvPriorCaughtUp:     {"prior_caught_up", "a file's kept window raised to its directory's prior at a new stream"},
	EvActuatorLower:     {"actuator_lower", "a per-file window lowered"},
	EvReadersDropped:    {"readers_dropped", "a reader not tracked: the readers table was full"},
	EvTrimScanDeferred:  {"trim_scan_deferred", "a whole-system descriptor scan deferred: over its budget"},
	EvTrimOpened:        {"trim_opened", "a descriptor opened on a trimmed file given the trim at its first read-around, reported by the probe"},
	EvTrimOpenedMissed:  {"trim_opened_missed", "such a report that found no descriptor to trim, or came over the budget of such trims"},
}

// String is the event's metric label.
func (e Event) String() string {
	if e >= numEvents {
		return "unknown"
	}
	return eventInfo[e].name
}

// Help says what one count of the event means.
func (e Event) Help() string {
	if e >= numEvents {
		return ""
	}
	return eventInfo[e].help
}

// Events lists every event, in the order of the list above.
func Events() []Event {
	out := make([]Event, numEvents)
	for i := range out {
		out[i] = Event(i)
	}
	return out
}
