package tuner

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/lab"
)

const severe = 3 * time.Millisecond

// lagRe reads the event-to-pin time from a prior's action evidence.
var lagRe = regexp.MustCompile(`descriptor\(s\) ([0-9.]+[µmn]?s) after the file's first readahead event`)

// firstAction waits for the first file_window action on path (actions
// name a file by its path, or MAJ:MIN/INODE when it is not known yet).
func firstAction(t *testing.T, d *daemon, path string, within time.Duration) (actionEntry, bool) {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	key := fmt.Sprintf("/%d", st.Ino)
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, a := range d.actions() {
			if a.Action == "file_window" && (a.Target == path || strings.HasSuffix(a.Target, key)) {
				return a, true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return actionEntry{}, false
}

// readFor runs a fresh seq reader of path for dur and returns it (stopped)
// with its start time.
func readFor(t *testing.T, path string, dur time.Duration) (*child, time.Duration) {
	t.Helper()
	require.NoError(t, lab.DropFileCache(path))
	c := startChild(t, "seq", path)
	c.goRead(t)
	start := monoNow()
	time.Sleep(dur)
	c.stop()
	return c, start
}

func rateBetween(c *child, from, to time.Duration) float64 {
	return median(rates(windows(c.points(), from, to, win), func(w window) float64 { return w.Rate / 1e6 }))
}

// TestSlowBeforeTheDaemonAndBeforeTheOpen: files slowed (+3 ms) before
// anything reads them, three start conditions in one run, each against the
// default and a 1024 KB static window measured on the same lab:
//   - slow before the daemon starts, no saved state: a stream the daemon
//     never saw healthy is bound by its window; the daemon tries a larger
//     one and keeps it (no regime, no baseline needed);
//   - slow before the open, daemon running: a fresh open in the same
//     directory gets the window that paid on its first readahead event;
//   - slow before the daemon starts, state saved by the earlier run: after
//     SIGTERM and a new start, the first open is served at once.
func TestSlowBeforeTheDaemonAndBeforeTheOpen(t *testing.T) {
	needRoot(t)
	l := newLab(t)
	var files []string
	for _, n := range []string{"blk_a", "blk_b", "blk_c"} {
		p, err := l.WriteFile(n, 128)
		require.NoError(t, err)
		files = append(files, p)
	}
	daemonBin(t)
	require.NoError(t, l.SetPermanent(severe, files...))

	// Static references on the slowed file, same lab, same run.
	static := staticSweep(t, l, files[0], []int{128, 1024}, 1, 3*time.Second)
	t.Logf("static on the +3 ms file: 128 KB %.0f MB/s, 1024 KB %.0f MB/s", static[128], static[1024])
	require.Greater(t, static[1024], 1.3*static[128], "the slowdown must cost the default window throughput")
	require.NoError(t, l.SetReadAheadKB(128))

	// 1. Slow before the daemon starts, no saved state.
	stateDir := filepath.Join(t.TempDir(), "state")
	require.NoError(t, lab.DropFileCache(files[0]))
	seq := startChild(t, "seq", files[0])
	seq.goRead(t)
	time.Sleep(time.Second)
	started, startMono := time.Now(), monoNow()
	d := runDaemon(t, l, stateDir)
	a, ok := firstAction(t, d, files[0], 8*time.Second)
	require.True(t, ok, "no action on a stream slow from before the daemon started:\n%s", d.logs.String())
	t.Logf("no saved state: first action %v after the daemon started: %s %d->%d %s (%s)", a.Time.Sub(started).Round(10*time.Millisecond), a.Action, a.FromKB, a.ToKB, a.Result, a.Evidence)
	assert.Contains(t, a.Evidence, "window_bound")
	assert.Empty(t, d.regimes(), "no slowdown regime is needed (and none was seen begin)")
	time.Sleep(8 * time.Second)
	r1 := rateBetween(seq, startMono+5*time.Second, startMono+8*time.Second)
	seq.stop()
	t.Logf("no saved state: %.0f MB/s from 5 s to 8 s after the start = %.2f of 1024 KB, %.2fx the default", r1, r1/static[1024], r1/static[128])
	assert.GreaterOrEqual(t, r1, 0.85*static[1024])

	// 2. Slow before the open, daemon running: a fresh open in the same
	// directory is served on its first readahead event.
	c, cStart := readFor(t, files[1], 4*time.Second)
	a, ok = firstAction(t, d, files[1], time.Second)
	require.True(t, ok, "no prior applied to a fresh open:\n%s", d.logs.String())
	t.Logf("fresh open: %s %d->%d %s (%s)", a.Action, a.FromKB, a.ToKB, a.Result, a.Evidence)
	checkLag(t, a)
	r2 := rateBetween(c, cStart+win, cStart+4*time.Second)
	t.Logf("fresh open: %.0f MB/s = %.2f of 1024 KB, %.2fx the default", r2, r2/static[1024], r2/static[128])
	assert.GreaterOrEqual(t, r2, 0.85*static[1024])

	// 3. Restart with the state the first run saved.
	require.Equal(t, 0, d.signal(t, syscall.SIGTERM), d.logs.String())
	_, err := os.Stat(filepath.Join(stateDir, "priors.json"))
	require.NoError(t, err, "priors saved at shutdown")
	kb, err := l.ReadAheadKB()
	require.NoError(t, err)
	require.Equal(t, 128, kb)
	d = runDaemon(t, l, stateDir)
	c, cStart = readFor(t, files[2], 4*time.Second)
	a, ok = firstAction(t, d, files[2], time.Second)
	require.True(t, ok, "the first open after a restart was not served from the saved priors:\n%s", d.logs.String())
	t.Logf("after restart: %s %d->%d %s (%s)", a.Action, a.FromKB, a.ToKB, a.Result, a.Evidence)
	assert.Contains(t, a.Evidence, "prior")
	checkLag(t, a)
	r3 := rateBetween(c, cStart+win, cStart+4*time.Second)
	t.Logf("after restart: %.0f MB/s = %.2f of 1024 KB, %.2fx the default", r3, r3/static[1024], r3/static[128])
	assert.GreaterOrEqual(t, r3, 0.85*static[1024])
	require.Equal(t, 0, d.signal(t, syscall.SIGTERM), d.logs.String())
}

// checkLag asserts the prior was pinned within 100 ms of the file's first
// readahead event (kernel timestamp to pin).
func checkLag(t *testing.T, a actionEntry) {
	t.Helper()
	m := lagRe.FindStringSubmatch(a.Evidence)
	require.NotNil(t, m, "evidence names no event-to-pin time: %s", a.Evidence)
	lag, err := time.ParseDuration(strings.Replace(m[1], "µ", "u", 1))
	require.NoError(t, err)
	t.Logf("first readahead event to pin: %v", lag)
	assert.Less(t, lag, 100*time.Millisecond)
}

// TestRandomReaderBesideARestartPriorIsTrimmedAtOnce: a daemon restarted
// with saved priors gives a fresh open its directory's window on its first
// readahead event, before it has seen the device's random readers. An mmap
// random reader already running in the same directory gets no prior of its
// own, and reads its faults' read-around at the device's window beside the
// stream until trimmed; it is trimmed on the recent
// requests within 400 ms of the prior, not at the next interval's
// Step (the restarted daemon is healthy after its first Step, so the next
// one comes about a second after the fresh open).
func TestRandomReaderBesideARestartPriorIsTrimmedAtOnce(t *testing.T) {
	needRoot(t)
	l := newLab(t)
	var files []string
	for _, n := range []string{"blk_a", "blk_b"} {
		p, err := l.WriteFile(n, 128)
		require.NoError(t, err)
		files = append(files, p)
	}
	index, err := l.WriteFile("index", 256)
	require.NoError(t, err)
	daemonBin(t)
	require.NoError(t, l.SetPermanent(severe, files...))

	// A first run learns the directory's prior on a stream slowed before
	// it started, and saves it at shutdown.
	stateDir := filepath.Join(t.TempDir(), "state")
	d := runDaemon(t, l, stateDir)
	readFor(t, files[0], 6*time.Second)
	require.Equal(t, 0, d.signal(t, syscall.SIGTERM), d.logs.String())
	_, err = os.Stat(filepath.Join(stateDir, "priors.json"))
	require.NoError(t, err, "priors saved at shutdown")

	// The random reader runs before the restart.
	rnd := startChild(t, "random", index)
	rnd.goRead(t)
	time.Sleep(time.Second)
	d = runDaemon(t, l, stateDir)
	readFor(t, files[1], 3*time.Second)
	prior, ok := firstAction(t, d, files[1], time.Second)
	require.True(t, ok, "no prior given to the fresh open after the restart:\n%s", d.logs.String())
	require.Contains(t, prior.Evidence, "prior")
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(index, &st))
	var trim *actionEntry
	for _, a := range d.actions() {
		if a.Target != index && !strings.HasSuffix(a.Target, fmt.Sprintf("/%d", st.Ino)) {
			continue
		}
		// Its faults' asynchronous readahead (a marker a read-around
		// left) is no stream's: the prior is not for it.
		assert.NotEqual(t, "file_window", a.Action, "the random reader was given a window: %s %d->%d (%s)", a.Action, a.FromKB, a.ToKB, a.Evidence)
		if a.Action == "file_trim" && trim == nil {
			trim = &a
		}
	}
	require.NotNil(t, trim, "the random reader beside the prior was not trimmed:\n%s", d.logs.String())
	after := trim.Time.Sub(prior.Time)
	t.Logf("prior %d->%d KB; random reader trimmed %d->%d KB %v after it (%s)", prior.FromKB, prior.ToKB, trim.FromKB, trim.ToKB,
		after.Round(time.Millisecond), trim.Evidence)
	assert.Less(t, after, 400*time.Millisecond, "trimmed beside the prior before the next Step")
	require.Equal(t, 0, d.signal(t, syscall.SIGTERM), d.logs.String())
}
