package tuner

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/lab"
)

// TestWindowUndoneAfterSlowdownEnds: once a permanent slowdown ends, the
// window the daemon kept on the reader's open file is taken back, even
// though the larger window keeps the device bandwidth-saturated (where
// latency cannot tell a slowed file from queueing, and the detector holds
// the regime): the tuner has to back off to find out. Its re-probe comes
// a minute (ReprobeAfter) after the window was kept and holds the device's
// window for 3 s, in which the detector sees the normal latency again.
//
// The premise is a healthy device whose bandwidth the device's window
// reaches, where no larger window pays and none should stay
// (newBandwidthBoundLab). The slowdown is +3 ms, so that the window binds
// clearly under it at that device's bandwidth.
//
// A stream at the device's window reads at about that bandwidth (79.5-80
// MB/s at 128 KB), on the line between bound by its window and bound by
// the device: judged by its window's fill alone, the re-probe found it
// "window_bound" in some runs and put the kept window back each time. The
// daemon first learns the device's capacity from its own healthy trial
// (more bytes in flight, no more throughput), and the test waits for that:
// a stream reading at the capacity is bound by the device, not its window,
// which is what ends the decision, in every run.
func TestWindowUndoneAfterSlowdownEnds(t *testing.T) {
	needRoot(t)
	l := newBandwidthBoundLab(t)
	// 1 GB: the reader starts its file over every 13 s at 80 MB/s, not
	// every 3 s, so the re-probe's 5 s seldom holds a restart, whose
	// first requests the detector reads as an extent start (a jump).
	target, err := l.WriteFile("blk_target", 1024)
	require.NoError(t, err)
	daemonBin(t)
	// The stream alone on the device: a full-speed random reader beside it
	// would lose to any larger window (random.go), and none would be kept.
	d := runDaemon(t, l, filepath.Join(t.TempDir(), "state"))
	require.NoError(t, lab.DropFileCache(target))
	seq := startChild(t, "seq", target)
	seq.goRead(t)
	d.capacityLearned(t, 30*time.Second)
	time.Sleep(2 * time.Second)
	require.NoError(t, l.SetPermanent(severe, target))

	kept := func() bool {
		for _, a := range d.actions() {
			if a.Action == "file_window" && a.Result == "kept" {
				return true
			}
		}
		return false
	}
	require.Eventually(t, kept, 15*time.Second, 100*time.Millisecond, "a file window is kept under the slowdown")
	time.Sleep(5 * time.Second) // the window settles at its knee
	require.NoError(t, l.Clear())
	end := time.Now()
	t.Logf("slowdown ended")

	var undoneAfter time.Duration
	// The first re-probe comes a minute after the window was kept; one
	// that finds a regime at the device's window (the reader restarting
	// its file inside it reads as an extent start) puts the window back
	// and tries again two minutes later. The window must be gone after
	// the second.
	deadline := end.Add(200 * time.Second)
	for time.Now().Before(deadline) && undoneAfter == 0 {
		probing := false
		for _, a := range d.actions() {
			if a.Action == "file_window_undo" && a.Result == "undone" && a.Time.After(end) && a.ToKB == 128 {
				undoneAfter = time.Since(end)
				t.Logf("undone %v after the slowdown ended: %s", undoneAfter.Round(100*time.Millisecond), a.Evidence)
			}
			if a.Action == "file_window_undo" && a.Result == "trial" && a.Time.After(end) {
				probing = true
			}
		}
		if probing && undoneAfter == 0 {
			// What the detector holds while the re-probe runs: the reason
			// if it does not clear.
			for _, r := range d.regimes() {
				t.Logf("  during the re-probe, %s: %s %s", time.Now().Format("15:04:05.0"), r.Kind, r.Evidence)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, a := range d.actions() {
		t.Logf("  %s %s %s %d->%d %s: %s", a.Time.Format("15:04:05.0"), a.Action, filepath.Base(a.Target), a.FromKB, a.ToKB, a.Result, a.Evidence)
	}
	d.logCapacity(t)
	assert.NotZero(t, undoneAfter, "the file window is taken back after the slowdown ends")
	assert.True(t, seq.alive())
	assert.Equal(t, 0, d.signal(t, syscall.SIGTERM))
}
