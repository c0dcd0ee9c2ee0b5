package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestDetectorFilesMetrics(t *testing.T) {
	src := Sources{DetectorFiles: func() (int, uint64) { return 4096, 12345 }}
	want := `
# HELP readaheadd_detector_files_tracked Files the detector keeps state for (bounded by its MaxFiles; idle files age out).
# TYPE readaheadd_detector_files_tracked gauge
readaheadd_detector_files_tracked 4096
# HELP readaheadd_detector_files_evicted_total Files whose detector state was dropped: idle too long, or the oldest when the table was full.
# TYPE readaheadd_detector_files_evicted_total counter
readaheadd_detector_files_evicted_total 12345
`
	require.NoError(t, testutil.CollectAndCompare(NewCollector(src), strings.NewReader(want),
		"readaheadd_detector_files_tracked", "readaheadd_detector_files_evicted_total"))
	// Absent source: no series rather than zeros.
	n, err := testutil.GatherAndCount(NewRegistry(Sources{}), "readaheadd_detector_files_tracked")
	require.NoError(t, err)
	require.Zero(t, n)
}
