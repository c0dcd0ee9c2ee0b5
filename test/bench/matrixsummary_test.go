package bench

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/docsync"
)

// TestReadmeResultsFromMatrix: the README's results table is the class
// summary of the committed matrix (docs/results/matrix/matrix.json).
// READAHEADD_UPDATE_DOCS=1 rewrites it after a matrix run.
func TestReadmeResultsFromMatrix(t *testing.T) {
	raw, err := os.ReadFile("../../docs/results/matrix/matrix.json")
	require.NoError(t, err)
	var rep MatrixReport
	require.NoError(t, json.Unmarshal(raw, &rep))
	docsync.Check(t, "../../README.md", "matrix-summary", ClassSummary(rep.Rows),
		"README.md's results differ from docs/results/matrix/matrix.json: run READAHEADD_UPDATE_DOCS=1 go test ./test/bench/ -run TestReadmeResultsFromMatrix")
}

func TestClassSummary(t *testing.T) {
	rows := []MatrixRow{
		{Classes: []string{"whole-device"}, Verdict: VerdictResult{Verdict: "met", DefaultMBps: 40, DaemonMBps: 80, BestMBps: 90, BestAdmMBps: 90, RandRate: []float64{1}}},
		{Classes: []string{"whole-device"}, Verdict: VerdictResult{Verdict: "not met", DefaultMBps: 50, DaemonMBps: 50, BestMBps: 100, BestAdmMBps: 100}},
		{Classes: []string{"healthy"}, Error: "lab failed"},
	}
	got := ClassSummary(rows)
	assert.Contains(t, got, "| whole disk slowed, fail-slow (+0.5..8 ms) | 2 (1) | 45 | 1.50x (1.00x) | 2.12x | 0.69 (0.50) |\n")
	assert.Contains(t, got, "| any of these with random or mmap readers beside the streams | 1 (1) | 40 | 2.00x (2.00x) | 2.25x | 0.89 (0.89) |\n")
	assert.NotContains(t, got, "healthy", "a harness error is no result")
}
