package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/readaheadd/readaheadd/pkg/metrics"
	"github.com/readaheadd/readaheadd/pkg/tuner"
)

// TestZeroSeriesLabelsMatchTheTuner: the labels exported at zero from the
// start are exactly what the tuner can report.
func TestZeroSeriesLabelsMatchTheTuner(t *testing.T) {
	kinds := map[string]bool{}
	for _, k := range []tuner.ActionKind{tuner.KindDeviceWindow, tuner.KindFileWindow, tuner.KindPrefetch, tuner.KindTrim,
		tuner.KindDeviceWindowUndo, tuner.KindFileWindowUndo, tuner.KindPrefetchUndo, tuner.KindTrimUndo} {
		kinds[strings.TrimSuffix(string(k), "_undo")] = true
	}
	assert.ElementsMatch(t, keys(kinds), metrics.ActionNames)
	assert.ElementsMatch(t, []string{string(tuner.ResultTrial), string(tuner.ResultKept), string(tuner.ResultApplied),
		string(tuner.ResultUndone), string(tuner.ResultFailed), string(tuner.ResultDryRun)}, metrics.ActionResults)
	assert.Equal(t, tuner.FailureCauses, metrics.FailureCauses)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
