package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/metrics"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

func TestPrintFailSlow(t *testing.T) {
	var out bytes.Buffer
	printFailSlow(&out, []metrics.SlowDiskStatus{
		{Device: "sdb", Ratio: 3.1, HeldRatio: 2.9, Reference: "peers", Requests: 300, Over: 14, Slow: true, ForSeconds: 75},
		{Device: "sdc", Ratio: 1.6, HeldRatio: 1.1, Reference: "baseline", Requests: 120, Over: 2, SlowFiles: []metrics.SlowFileStatus{
			{File: "/data/dn/current/blk_12", Ratio: 3.3, Requests: 120, ForSeconds: 12},
			{File: "8:32/13", Ratio: 1.8, Requests: 40, ForSeconds: 3},
		}},
	})
	s := out.String()
	for _, want := range []string{
		"fail-slow disks: sdb\n",
		"sdb     YES         2.90x  3.10x        peers      300       1m15s",
		"sdc     over for 2  1.10x  1.60x        baseline   120       -",
		"files slower than their disk:",
		"sdc     /data/dn/current/blk_12  3.30x  120       12s",
		"sdc     8:32/13                  1.80x  40        3s",
	} {
		assert.Contains(t, s, want)
	}

	out.Reset()
	printFailSlow(&out, nil)
	assert.Equal(t, "\nfail-slow disks: none\n", out.String())
}

func TestInodePathsUnderAllowPathsOnly(t *testing.T) {
	allowed, other := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(allowed, "current", "sub"), 0o755))
	in := filepath.Join(allowed, "current", "sub", "blk_1")
	out := filepath.Join(other, "blk_2")
	for _, p := range []string{in, out} {
		require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
	}
	require.NoError(t, os.Symlink(other, filepath.Join(allowed, "link"))) // not followed
	kin, err := statKey(in)
	require.NoError(t, err)
	kout, err := statKey(out)
	require.NoError(t, err)

	ip := newInodePaths([]string{allowed})
	done := make(chan struct{})
	require.True(t, ip.Want([]probe.FileKey{kin, kout}, func() { close(done) }))
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("walk did not end")
	}
	assert.Equal(t, in, ip.Path(kin))
	assert.Empty(t, ip.Path(kout), "a file outside the allow-paths is not resolved, even through a symlink")
	assert.False(t, ip.Want([]probe.FileKey{kout}, nil), "a key looked for is not walked for again within a minute")

	// The budget bounds a walk.
	assert.Empty(t, walkInodes([]string{allowed}, []probe.FileKey{kin}, 2))
}
