package tuner

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/fileras"
	"github.com/readaheadd/readaheadd/pkg/metrics"
	"github.com/readaheadd/readaheadd/test/lab"
)

// streamSlowdown is the slowdown under which a raised window pays most
// (about 60 -> 150 MB/s on the lab's default model).
const streamSlowdown = 3 * time.Millisecond

// raisedStream starts a daemon and a sequential reader of a slowed file,
// and waits until the kernel holds a window above 128 KB on the reader's
// open file (checked with the iterator, not the daemon's word). It returns
// the daemon, the reader, the reader's file, a second slowed file for a
// reader at the default window, and the state directory.
func raisedStream(t *testing.T, l *lab.Lab, it *fileras.Iter) (*daemon, *child, string, string, string) {
	t.Helper()
	// Large enough that the reader never wraps around (a new pass starts
	// a fresh window and would hide the point); checked by noWrap.
	target, err := l.WriteFile("blk_stream", 1100)
	require.NoError(t, err)
	control, err := l.WriteFile("blk_control", 300)
	require.NoError(t, err)
	other, err := l.WriteFile("index_other", 200)
	require.NoError(t, err)
	daemonBin(t)
	// A random reader of another file: the detector's healthy peer.
	startChild(t, "random", other).goRead(t)
	dir := filepath.Join(t.TempDir(), "state")
	d := runDaemon(t, l, dir)
	time.Sleep(5 * time.Second)
	require.NoError(t, l.SetPermanent(streamSlowdown, target, control))
	require.NoError(t, lab.DropFileCache(target))
	seq := startChild(t, "seq", target)
	seq.goRead(t)
	key := fileKey(t, target)
	require.NoError(t, it.Watch(key.Dev))
	require.Eventually(t, func() bool {
		return kernelFile(t, it, seq.Pid, key).WindowKB() > 128
	}, 20*time.Second, 50*time.Millisecond, "the daemon never raised the slowed reader's window")
	time.Sleep(1500 * time.Millisecond) // the stream ramps onto it
	kf := kernelFile(t, it, seq.Pid, key)
	t.Logf("raised: reader at %.0f MB/s; kernel f_ra ra_pages %d KB, window %d KB", rateOver(seq, time.Second), kf.WindowKB(), kf.SizeKB())
	return d, seq, target, control, dir
}

// windowsShown: the kernel's window on the reader's open file (read with
// the iterator at each try: the daemon may be stepping it meanwhile) is
// what an operator sees, in /metrics (readaheadd_open_file_windows) and in
// `readaheadd status`.
func windowsShown(t *testing.T, d *daemon, l *lab.Lab, kernelKB func() int) {
	t.Helper()
	var line, out string
	var kb int
	assert.Eventually(t, func() bool {
		kb = kernelKB()
		series := fmt.Sprintf(`readaheadd_open_file_windows{device=%q,window_kb=%q} `, l.Name, metrics.WindowBucket(kb))
		resp, err := http.Get("http://" + d.addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		line = ""
		for _, ln := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(ln, series); ok {
				line = ln
				n, err := strconv.ParseFloat(v, 64)
				return err == nil && n >= 1 && kernelKB() == kb
			}
		}
		return false
	}, 5*time.Second, 100*time.Millisecond, "/metrics counts the reader's open file at its kernel window (%d KB; last: %q)", kb, line)
	assert.Eventually(t, func() bool {
		kb = kernelKB()
		var code int
		code, out = runCLI(t, "status", "--metrics-addr", d.addr)
		if code != 0 {
			return false
		}
		_, table, ok := strings.Cut(out, "open files by window in force (kernel's f_ra):")
		if !ok {
			return false
		}
		for _, ln := range strings.Split(table, "\n") {
			f := strings.Fields(ln)
			if len(f) == 3 && f[0] == l.Name && f[1] == strconv.Itoa(kb) {
				return kernelKB() == kb
			}
		}
		return false
	}, 5*time.Second, 200*time.Millisecond, "status lists an open file on %s at its kernel window (%d KB):\n%s", l.Name, kb, out)
	t.Logf("shown at the kernel's %d KB: %s", kb, line)
	// Above the device's window: counted per device and named.
	above := fmt.Sprintf(`readaheadd_open_files_above_device_window{device=%q} `, l.Name)
	assert.Eventually(t, func() bool {
		resp, err := http.Get("http://" + d.addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, ln := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(ln, above); ok {
				n, err := strconv.ParseFloat(v, 64)
				return err == nil && n >= 1
			}
		}
		return false
	}, 5*time.Second, 100*time.Millisecond, "/metrics counts the raised reader above its device's window")
	_, out = runCLI(t, "status", "--metrics-addr", d.addr)
	assert.Contains(t, out, "open files above their device's window (kernel's f_ra):", out)
}

// backAtDefault checks the reader's kernel window and, side by side with a
// reader that opened a file after the restore (so at the device's own
// window), its throughput.
func backAtDefault(t *testing.T, l *lab.Lab, it *fileras.Iter, seq *child, target, control string, targetMB int) {
	t.Helper()
	require.NoError(t, lab.DropFileCache(control))
	ctl := startChild(t, "seq", control)
	ctl.goRead(t)
	time.Sleep(500 * time.Millisecond)
	from := monoNow()
	time.Sleep(2 * time.Second)
	to := monoNow()
	// Each reader's samples reach the test through a pipe: wait for one
	// from after the span, or its last window cannot be cut.
	reached := func(c *child) bool {
		pts := c.points()
		return len(pts) > 0 && pts[len(pts)-1].At >= to
	}
	require.Eventually(t, func() bool { return reached(seq) && reached(ctl) }, 3*time.Second, 20*time.Millisecond,
		"both readers report samples past the span (reader alive %v, fresh reader alive %v)", seq.alive(), ctl.alive())
	rs := windows(seq.points(), from, to, 1900*time.Millisecond)
	rc := windows(ctl.points(), from, to, 1900*time.Millisecond)
	require.NotEmpty(t, rs)
	require.NotEmpty(t, rc, "fresh reader's samples: %d", len(ctl.points()))
	kf := kernelFile(t, it, seq.Pid, fileKey(t, target))
	kc := kernelFile(t, it, ctl.Pid, fileKey(t, control))
	t.Logf("after: reader %.0f MB/s, kernel f_ra ra_pages %d KB window %d KB; fresh reader at the default window %.0f MB/s, f_ra %d KB window %d KB",
		rs[0].Rate/1e6, kf.WindowKB(), kf.SizeKB(), rc[0].Rate/1e6, kc.WindowKB(), kc.SizeKB())
	assert.Equal(t, 128, kf.WindowKB(), "the reader's ra_pages is the device's again")
	assert.LessOrEqual(t, kf.SizeKB(), 128, "the reader's stream runs on the device's window again (kernel f_ra)")
	assert.InEpsilon(t, rc[0].Rate, rs[0].Rate, 0.3, "the reader reads at the default window's rate again")
	noWrap(t, seq, targetMB)
}

func noWrap(t *testing.T, c *child, mb int) {
	t.Helper()
	pts := c.points()
	require.NotEmpty(t, pts)
	require.Less(t, pts[len(pts)-1].Count, int64(mb)<<20, "the reader wrapped around its file: a new pass resets its window, the measurement is void")
}

// TestUndoReachesRunningStream: SIGTERM (its reader paused across it), and
// SIGKILL followed by `readaheadd restore` (its reader streaming), bring a
// reader on a window the daemon raised back to the device's window: the kernel's f_ra of its open
// file and its throughput, side by side with a reader at the default.
func TestUndoReachesRunningStream(t *testing.T) {
	needRoot(t)
	it, err := fileras.Open()
	require.NoError(t, err)
	t.Cleanup(func() { it.Close() })

	t.Run("SIGTERM", func(t *testing.T) {
		l := newLab(t)
		d, seq, target, control, _ := raisedStream(t, l, it)
		windowsShown(t, d, l, func() int { return kernelFile(t, it, seq.Pid, fileKey(t, target)).InForceKB() })
		// The reader pauses across the shutdown (a DataNode's sender
		// waiting on a slow client): it must not resume on its raised
		// window.
		resume := seq.pause(t, 1500*time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		at := monoNow()
		require.Equal(t, 0, d.signal(t, syscall.SIGTERM), "SIGTERM exits 0:\n%s", d.logs.String())
		require.Less(t, monoNow(), resume, "SIGTERM's restore ended while the reader was paused")
		kf := kernelFile(t, it, seq.Pid, fileKey(t, target))
		t.Logf("SIGTERM done in %v, the reader paused: f_ra ra_pages %d KB, window %d KB", (monoNow() - at).Round(time.Millisecond), kf.WindowKB(), kf.SizeKB())
		assert.LessOrEqual(t, kf.SizeKB(), 128, "the paused reader will resume on the device's window (kernel f_ra)")
		time.Sleep(resume - monoNow()) // measured once it reads again
		backAtDefault(t, l, it, seq, target, control, 1100)
	})

	t.Run("SIGKILL then restore", func(t *testing.T) {
		l := newLab(t)
		d, seq, target, control, dir := raisedStream(t, l, it)
		require.Equal(t, -1, d.signal(t, syscall.SIGKILL))
		code, out := runCLI(t, "restore", "--state-dir", dir, "--device", l.Name, "--allow-path", l.Mount)
		t.Logf("readaheadd restore: exit %d\n%s", code, out)
		require.Equal(t, 0, code)
		backAtDefault(t, l, it, seq, target, control, 1100)
	})
}
