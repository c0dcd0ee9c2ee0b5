package tuner

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/state"
	"github.com/readaheadd/readaheadd/test/lab"
)

// TestPriorClimbsOverBlockFilesReadInUnderASecond: on a fast device every
// block file (each opened afresh by its own process and read whole once,
// as a DataNode serves a block) is read in a third of a second, before any
// step above its directory's prior can be judged on the file itself. The
// prior climbs, one fresh open at a time; the steps of streams that end
// are judged on what they read; the state a daemon saves serves the next
// daemon's first files at the learned window.
//
// Ten files: a step whose stream ends a quarter second in may read as
// no gain on a noisy host and hold the prior at its knee for two seconds
// (BackoffBase), three files' worth; ten leave the climb room after that.
func TestPriorClimbsOverBlockFilesReadInUnderASecond(t *testing.T) {
	needRoot(t)
	l := newModelLab(t, lab.Model{Latency: 500 * time.Microsecond, BandwidthMBps: 400, Slots: 32})
	dir := filepath.Join(l.Mount, "data", "subdir0")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	var files []string
	for i := 0; i < 10; i++ {
		p, err := l.WriteFile(filepath.Join("data", "subdir0", fmt.Sprintf("blk_%d", 1000+i)), 128)
		require.NoError(t, err)
		files = append(files, p)
	}
	require.NoError(t, l.SetPermanent(severe, files...))
	pass := func() float64 {
		var total int64
		start := time.Now()
		for _, f := range files {
			require.NoError(t, lab.DropFileCache(f))
			out, err := exec.Command("dd", "if="+f, "of=/dev/null", "bs=64k", "status=none").CombinedOutput()
			require.NoError(t, err, "dd %s: %s", f, out)
			st, err := os.Stat(f)
			require.NoError(t, err)
			total += st.Size()
		}
		return float64(total) / time.Since(start).Seconds() / 1e6
	}
	require.NoError(t, l.SetReadAheadKB(4096))
	best := pass()
	require.NoError(t, l.SetReadAheadKB(128))
	t.Logf("static 4096 KB over the ten files: %.0f MB/s", best)

	daemonBin(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	d := runDaemon(t, l, stateDir)
	first := pass()
	climbs, keptClimbs, firstKB := 0, 0, 0
	for _, a := range d.actions() {
		if strings.Contains(a.Evidence, "prior climbs") {
			climbs++
		}
		if a.Result == "kept" && a.Action == "file_window" && firstKB == 0 {
			firstKB = a.ToKB
		}
		// A climb is kept on a file already raised (1024->2048) or on a
		// fresh open that starts at the step above the prior (128->2048).
		if a.Result == "kept" && a.Action == "file_window" && a.ToKB > firstKB {
			keptClimbs++
		}
		t.Logf("%s %s %d->%d %s: %s", a.Time.Format("15:04:05.000"), a.Action, a.FromKB, a.ToKB, a.Result, a.Evidence)
	}
	t.Logf("first pass, no state: %.0f MB/s = %.2f of 4096 KB", first, first/best)
	assert.Positive(t, climbs, "no fresh open tried the step above the prior")
	assert.Positive(t, keptClimbs, "no step above the first window was kept on files read in a third of a second")
	require.Equal(t, 0, d.signal(t, syscall.SIGTERM), d.logs.String())

	pr, err := state.LoadPriors(filepath.Join(stateDir, state.PriorsName))
	require.NoError(t, err)
	require.NotEmpty(t, pr.Dirs, "priors saved at shutdown")
	t.Logf("saved prior: %d KB for %s (%d streams)", pr.Dirs[0].WindowKB, pr.Dirs[0].Dir, pr.Dirs[0].Streams)
	assert.Greater(t, pr.Dirs[0].WindowKB, firstKB, "the prior climbed above the first window that paid")

	d = runDaemon(t, l, stateDir)
	saved := pass()
	t.Logf("after a restart with state: %.0f MB/s = %.2f of 4096 KB", saved, saved/best)
	assert.GreaterOrEqual(t, saved, 0.8*best)
	assert.Greater(t, saved, first, "the learned window serves every file from its open")
	require.Equal(t, 0, d.signal(t, syscall.SIGTERM), d.logs.String())
	kb, err := l.ReadAheadKB()
	require.NoError(t, err)
	assert.Equal(t, 128, kb, "the device's window is put back")
}
