// Package docsync keeps a generated part of a document equal to what it is
// generated from: the text between two markers, <!-- NAME:begin --> and
// <!-- NAME:end -->, is checked by a test, or rewritten by it with
// READAHEADD_UPDATE_DOCS=1.
package docsync

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Check fails t unless the text between path's NAME markers is want; with
// READAHEADD_UPDATE_DOCS=1 it writes want there instead. differs says what
// differs from what, and how to update it.
func Check(t testing.TB, path, name, want, differs string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	doc := string(raw)
	begin, end := "<!-- "+name+":begin -->\n", "<!-- "+name+":end -->"
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	require.True(t, i >= 0 && j > i, "%s has no %s markers", path, name)
	if os.Getenv("READAHEADD_UPDATE_DOCS") == "1" {
		require.NoError(t, os.WriteFile(path, []byte(doc[:i+len(begin)]+want+doc[j:]), 0o644))
		return
	}
	assert.Equal(t, want, doc[i+len(begin):j], differs)
}
