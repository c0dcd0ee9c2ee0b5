package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDemo runs `make demo`'s program as a newcomer would and checks what
// they see: the before/after table with readaheadd well above the default
// window, the actions taken, a PNG timeline, and no test-runner noise.
func TestDemo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("demo: needs root (lab device, BPF)")
	}
	if testing.Short() {
		t.Skip("demo: skipped in -short mode (about a minute on the lab)")
	}
	bin := filepath.Join(t.TempDir(), "demo")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "-out", dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "demo failed:\n%s\n%s", stdout.String(), stderr.String())
	got := stdout.String()
	t.Logf("demo output:\n%s", got)
	assert.Empty(t, stderr.String(), "nothing on stderr without -v")

	rate := func(row string) float64 {
		m := regexp.MustCompile(row + `\s+(\d+) MB/s`).FindStringSubmatch(got)
		require.Len(t, m, 2, "row %q in the table", row)
		v, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		return v
	}
	def := rate(`default window \(128 KB\)`)
	daemon := rate(`readaheadd \(from \d+ KB\)`)
	best := rate(`best static window \(\d+ KB\)`)
	assert.Greater(t, daemon, 1.5*def, "readaheadd shows its effect over the default window")
	assert.Greater(t, best, def)
	assert.Regexp(t, `readaheadd \(from \d+ KB\)\s+\d+ MB/s\s+\d+\.\d+x\s+\d+ MB/s at [+-]\d+\.\d s\s+(never|ends below|until [+-]\d+\.\d s)\n`, got,
		"the daemon's row shows its worst 0.3 s after the onset and the end of its last dip")
	assert.Regexp(t, `Actions readaheadd took[^\n]*\n\s+[+-]\d+\.\d s\s+file_window`, got, "the actions, a per-file window among them")
	assert.NotRegexp(t, `\w+_test\.go:\d+|^=== RUN|--- PASS`, got, "no test-runner lines")

	m := regexp.MustCompile(`Timeline[^:]*: (\S+\.png)`).FindStringSubmatch(got)
	require.Len(t, m, 2, "the PNG timeline is named")
	png, err := os.ReadFile(m[1])
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")), "a PNG file")
	assert.Greater(t, len(png), 10<<10, "a drawn timeline, not an empty image")
}
