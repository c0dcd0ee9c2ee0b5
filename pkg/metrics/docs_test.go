package metrics

import (
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/docsync"
	"github.com/readaheadd/readaheadd/pkg/tuner"
)

const metricsDoc = "../../docs/metrics.md"

// controlEventsTable renders the docs table of the tuner's control events
// from its one list.
func controlEventsTable() string {
	var b strings.Builder
	b.WriteString("| event | one count means |\n|---|---|\n")
	for _, e := range tuner.Events() {
		fmt.Fprintf(&b, "| `%s` | %s |\n", e, e.Help())
	}
	return b.String()
}

// TestDocsListEveryControlEvent: docs/metrics.md lists exactly the events
// the tuner counts, with their meaning, as generated from the tuner's list.
func TestDocsListEveryControlEvent(t *testing.T) {
	docsync.Check(t, metricsDoc, "control-events", controlEventsTable(),
		"docs/metrics.md's control events differ from pkg/tuner/events.go: run READAHEADD_UPDATE_DOCS=1 go test ./pkg/metrics/ -run TestDocsListEveryControlEvent")
}

// TestControlEventsExportedAsListed: the scrape carries one
// tuner_control_total series per listed event, and nothing else, and
// /debug/status the same names.
func TestControlEventsExportedAsListed(t *testing.T) {
	counts := map[string]uint64{}
	for i, e := range tuner.Events() {
		counts[e.String()] = uint64(i + 1)
	}
	src := Sources{Tuner: func() TunerStatus { return TunerStatus{Control: counts} }}
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(NewCollector(src)))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "readaheadd_tuner_control_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			require.Len(t, m.GetLabel(), 1)
			got[m.GetLabel()[0].GetValue()] = uint64(m.GetCounter().GetValue())
		}
	}
	assert.Equal(t, counts, got)
	st := NewServer(src, prometheus.NewRegistry(), func() error { return nil }, "test", slog.New(slog.DiscardHandler)).BuildStatus()
	assert.Equal(t, counts, st.ControlEvents)
}

// TestDocsListEveryMetric: every metric the collector can export has a row
// in docs/metrics.md, and the docs name no metric the collector lacks.
func TestDocsListEveryMetric(t *testing.T) {
	raw, err := os.ReadFile(metricsDoc)
	require.NoError(t, err)
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(readaheadd_[a-z0-9_]+)`").FindAllStringSubmatch(string(raw), -1) {
		documented[m[1]] = true
	}
	ch := make(chan *prometheus.Desc, 256)
	NewCollector(Sources{}).Describe(ch)
	close(ch)
	exported := map[string]bool{}
	name := regexp.MustCompile(`fqName: "([a-z0-9_]+)"`)
	for d := range ch {
		m := name.FindStringSubmatch(d.String())
		require.NotNil(t, m, d.String())
		exported[m[1]] = true
	}
	for n := range exported {
		assert.True(t, documented[n], "metric %s has no row in docs/metrics.md", n)
	}
	for n := range documented {
		assert.True(t, exported[n], "docs/metrics.md lists %s, which the collector does not export", n)
	}
}
