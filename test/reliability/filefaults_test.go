package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/test/lab"
)

// statusAction is one entry of /debug/status recent_actions.
type statusAction struct {
	Device string `json:"device"`
	Action string `json:"action"`
	Target string `json:"target"`
	Result string `json:"result"`
	FromKB int    `json:"from_kb"`
	ToKB   int    `json:"to_kb"`
}

func (d *daemon) recentActions(t *testing.T) []statusAction {
	t.Helper()
	code, body, err := d.get("/debug/status")
	require.NoError(t, err)
	require.Equal(t, 200, code, body)
	var st struct {
		RecentActions []statusAction `json:"recent_actions"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	return st.RecentActions
}

func (d *daemon) requireHealthy(t *testing.T, what string) {
	t.Helper()
	code, body, err := d.get("/healthz")
	require.NoError(t, err, what)
	require.Equal(t, 200, code, "%s: %s", what, body)
	require.True(t, d.running(), what)
}

// readOpenUnlinked opens path, unlinks it, and reads it through its
// descriptor again and again (evicting it after each pass) until ctx ends:
// a file deleted while a reader still has it open.
func readOpenUnlinked(ctx context.Context, path string, bytes *atomic.Int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.Remove(path); err != nil {
		return err
	}
	buf := make([]byte, lab.SeqBlock)
	for ctx.Err() == nil {
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		for ctx.Err() == nil {
			n, err := f.Read(buf)
			bytes.Add(int64(n))
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// TestFaultsReadersExitAndFilesDeleted drives the daemon's per-file
// actions into readers that vanish: short-lived processes that read a
// slowed file and exit (the daemon's pidfd_open or pidfd_getfd then finds
// no process), a slowed file unlinked while its reader keeps reading it,
// and one unlinked and closed mid-read. Each is counted
// (readaheadd_tuner_errors_total, readaheadd_actions_total), the daemon
// keeps serving, decisions on vanished files end, and the device is
// restored at exit.
func TestFaultsReadersExitAndFilesDeleted(t *testing.T) {
	requireRoot(t, "BPF and the lab")
	l := newSlowedLab(t)
	const orig = 96
	require.NoError(t, l.SetReadAheadKB(orig))
	doomed, err := l.WriteFile("doomed", 128)
	require.NoError(t, err)
	closed, err := l.WriteFile("closed", 128)
	require.NoError(t, err)
	require.NoError(t, l.SetPermanent(6*time.Millisecond, doomed, closed))
	d := startDaemon(t, "--device", l.Name, "--allow-path", l.Mount, "--state-dir", filepath.Join(t.TempDir(), "state"), "--interval", "200ms")

	l.start(t)
	waitMetric(t, d, "a per-file action on the slowed file", 45*time.Second, func(m string) bool {
		return sum(m, `^readaheadd_actions_total\{.*action="file_window".*result="(trial|kept|applied)"`) > 0
	})

	// 1. Readers that exit right after reading: each opens the slowed file
	// with the default window (a new reader the daemon wants to reach),
	// reads 128 KB and exits. The long-running readers stop first, so that
	// what is counted comes from the exiting ones.
	l.halt()
	m0 := d.metrics(t)
	fileOp0, failed0 := sum(m0, `^readaheadd_tuner_errors_total\{kind="file_op"`), sum(m0, `^readaheadd_actions_total\{.*result="failed"`)
	rng := rand.New(rand.NewPCG(1, 2))
	var runs int
	deadline := time.Now().Add(30 * time.Second)
	var fileOp, failed float64
	for time.Now().Before(deadline) {
		_ = lab.DropFileCache(l.slow)
		var procs []*exec.Cmd
		for i := 0; i < 4; i++ {
			c := exec.Command("dd", "if="+l.slow, "of=/dev/null", "bs=64k", "count=2", fmt.Sprintf("skip=%d", rng.IntN(4000)), "status=none")
			require.NoError(t, c.Start())
			procs = append(procs, c)
		}
		for _, c := range procs {
			require.NoError(t, c.Wait())
		}
		runs += len(procs)
		m := d.metrics(t)
		fileOp, failed = sum(m, `^readaheadd_tuner_errors_total\{kind="file_op"`)-fileOp0, sum(m, `^readaheadd_actions_total\{.*result="failed"`)-failed0
		if fileOp+failed > 0 && runs >= 40 {
			break
		}
	}
	t.Logf("%d readers that exited right after reading the slowed file: %.0f file operations failed, %.0f actions failed", runs, fileOp, failed)
	assert.Positive(t, fileOp+failed, "a reader gone before its descriptor was taken is counted")
	d.requireHealthy(t, "after readers exited under it")

	// 2. A slowed file unlinked while its reader keeps it open and reads,
	// and another unlinked and closed mid-read.
	ctx, cancel := context.WithCancel(context.Background())
	var g group
	var n atomic.Int64
	g.Go(func() error { return readOpenUnlinked(ctx, doomed, &n) })
	cctx, ccancel := context.WithCancel(ctx)
	g.Go(func() error {
		f, err := os.Open(closed)
		if err != nil {
			return err
		}
		defer f.Close()
		buf := make([]byte, lab.SeqBlock)
		for cctx.Err() == nil {
			k, err := f.Read(buf)
			n.Add(int64(k))
			if err == io.EOF {
				if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
					return err
				}
				_, err = f.Seek(0, io.SeekStart)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	time.Sleep(4 * time.Second)
	require.NoError(t, os.Remove(closed))
	ccancel() // the reader closes the unlinked file
	time.Sleep(6 * time.Second)
	d.requireHealthy(t, "while a deleted file is read")
	cancel()
	require.NoError(t, g.Wait())
	m := d.metrics(t)
	t.Logf("deleted files: %.0f MB read; file_op errors %.0f, out_of_scope %.0f, actions failed %.0f", float64(n.Load())/1e6,
		sum(m, `^readaheadd_tuner_errors_total\{kind="file_op"`), sum(m, `^readaheadd_tuner_errors_total\{kind="out_of_scope"`),
		sum(m, `^readaheadd_actions_total\{.*result="failed"`))

	// Decisions on the deleted files end once they are no longer read;
	// neither stays among the files the detector reports.
	gone := func(p string) bool { return strings.Contains(p, "/doomed") || strings.Contains(p, "/closed") }
	require.Eventually(t, func() bool {
		held := map[string]bool{}
		for _, a := range d.recentActions(t) {
			if !gone(a.Target) || !strings.HasPrefix(a.Action, "file_window") && !strings.HasPrefix(a.Action, "prefetch") {
				continue
			}
			key := a.Target + " " + strings.TrimSuffix(a.Action, "_undo")
			held[key] = !strings.HasSuffix(a.Action, "_undo") && a.Result != "failed" && a.Result != "undone"
		}
		for k, h := range held {
			if h {
				t.Logf("still held: %s", k)
				return false
			}
		}
		_, files, err := d.get("/debug/files?n=200")
		return err == nil && !strings.Contains(files, "/doomed") && !strings.Contains(files, "/closed")
	}, 30*time.Second, time.Second, "decisions on deleted files undone and the files no longer reported")
	for _, a := range d.recentActions(t) {
		if gone(a.Target) {
			t.Logf("action on a deleted file: %s %s %d->%d %s", a.Action, a.Result, a.FromKB, a.ToKB, a.Target)
		}
	}
	d.requireHealthy(t, "after the deleted files")

	assert.Equal(t, 0, d.stop(t))
	assert.Equal(t, orig, readKB(t, l.Name), "device back at its original")
}

// TestFaultsSysfsWriteRefused runs the daemon in a private mount namespace
// in which the lab device's read_ahead_kb is bind-mounted read-only over
// itself (the test sets that up with unshare and mount, then execs the
// binary): every write the daemon tries fails with EROFS. It must log and
// count the failures, keep serving, never change the device, and exit
// cleanly.
func TestFaultsSysfsWriteRefused(t *testing.T) {
	requireRoot(t, "BPF, the lab and mount namespaces")
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux)")
	}
	l := newSlowedLab(t)
	const orig = 96
	require.NoError(t, l.SetReadAheadKB(orig))
	knob := "/sys/block/" + l.Name + "/queue/read_ahead_kb"
	// The mount exists only in the daemon's namespace; it goes with it.
	wrapper := []string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
		`mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"`, "sh", knob}
	stateDir := filepath.Join(t.TempDir(), "state")
	d := startDaemonIn(t, wrapper, "--device", l.Name, "--allow-path", l.Mount, "--state-dir", stateDir, "--interval", "200ms")
	d.waitHealthy(t)
	l.start(t)
	m := waitMetric(t, d, "a failed action", 60*time.Second, func(m string) bool {
		return sum(m, `^readaheadd_actions_total\{.*device="`+l.Name+`".*result="failed"`) > 0
	})
	time.Sleep(3 * time.Second) // more steps, retried after back-off
	d.requireHealthy(t, "with sysfs read-only")
	m = d.metrics(t)
	failed := sum(m, `^readaheadd_actions_total\{.*result="failed"`)
	ok := sum(m, `^readaheadd_actions_total\{.*result="(trial|kept|applied)"`)
	logs := d.Logs.String()
	assert.Contains(t, logs, "read-only file system", "the failure is logged with its cause")
	assert.Equal(t, orig, readKB(t, l.Name), "the device never changed")
	assert.Equal(t, float64(orig), sum(m, `^readaheadd_read_ahead_kb\{device="`+l.Name+`"`), "the daemon reports the value it could not change")
	t.Logf("sysfs read-only: %.0f actions failed, %.0f applied; device at %d KB", failed, ok, readKB(t, l.Name))
	for _, ln := range strings.Split(logs, "\n") {
		if strings.Contains(ln, "result=failed") {
			t.Logf("first failure: %s", ln)
			break
		}
	}
	l.halt()
	// At exit the daemon writes back the original it recorded before its
	// first (failed) write; sysfs still refuses, so it reports an
	// incomplete restore (exit 1) and keeps the record for `readaheadd
	// restore`, which succeeds once sysfs is writable (here: outside that
	// namespace).
	code := d.stop(t)
	t.Logf("exit code %d; log tail:\n%s", code, tail(d.Logs.String(), 2))
	assert.Equal(t, orig, readKB(t, l.Name))
	if code != 0 {
		assert.Equal(t, 1, code)
		assert.Contains(t, d.Logs.String(), "restore incomplete")
		assert.FileExists(t, filepath.Join(stateDir, "originals.json"), "the record is kept for a later restore")
		r := runBin(t, nil, "restore", "--state-dir", stateDir)
		assert.Equal(t, 0, r.code, "restore: %s %s", r.stdout, r.stderr)
		assert.NoFileExists(t, filepath.Join(stateDir, "originals.json"))
		assert.Equal(t, orig, readKB(t, l.Name))
	}
}
