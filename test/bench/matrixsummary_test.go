package bench

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadmeResultsFromMatrix: the README's results table is the class
// summary of the committed matrix (docs/results/matrix/matrix.json).
// READAHEADD_UPDATE_DOCS=1 rewrites it after a matrix run.
func TestReadmeResultsFromMatrix(t *testing.T) {
	raw, err := os.ReadFile("../../docs/results/matrix/matrix.json")
	require.NoError(t, err)
	var rep MatrixReport
	require.NoError(t, json.Unmarshal(raw, &rep))
	want := ClassSummary(rep.Rows)
	const readme = "../../README.md"
	doc, err := os.ReadFile(readme)
	require.NoError(t, err)
	s := string(doc)
	const begin, end = "<!-- matrix-summary:begin -->\n", "<!-- matrix-summary:end -->"
	i, j := strings.Index(s, begin), strings.Index(s, end)
	require.True(t, i >= 0 && j > i, "README.md has no matrix-summary markers")
	if os.Getenv("READAHEADD_UPDATE_DOCS") == "1" {
		require.NoError(t, os.WriteFile(readme, []byte(s[:i+len(begin)]+want+s[j:]), 0o644))
		return
	}
	assert.Equal(t, want, s[i+len(begin):j],
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
