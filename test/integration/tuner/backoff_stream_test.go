package tuner

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/fileras"
)

// TestBackOffReachesRunningStream: on a healthy device a full-speed stream
// is bound by nothing a window can change, so the daemon's outcome trial of
// a larger window does not pay and is undone, and the trials back off
// (2 s first). The undo must reach the stream while it runs: within the
// back-off the kernel's own f_ra of the reader's open file (ra_pages and
// the window it reads ahead with) is back at the device's 128 KB, not at
// the trial's window. (On this device throughput is the same at any
// window, so only the kernel's state can tell; newBandwidthBoundLab.)
func TestBackOffReachesRunningStream(t *testing.T) {
	needRoot(t)
	it, err := fileras.Open()
	require.NoError(t, err)
	t.Cleanup(func() { it.Close() })

	l := newBandwidthBoundLab(t)
	// Never wraps within the test (noWrap checks): at about 80 MB/s,
	// 1100 MB last about 14 s, more than a trial, its undo and the
	// comparison take.
	const targetMB = 1100
	target, err := l.WriteFile("blk_stream", targetMB)
	require.NoError(t, err)
	daemonBin(t)
	d := runDaemon(t, l, filepath.Join(t.TempDir(), "state"))
	key := fileKey(t, target)
	require.NoError(t, it.Watch(key.Dev))

	seq := startChild(t, "seq", target)
	seq.goRead(t)
	var trialKB int
	var undo actionEntry
	require.Eventually(t, func() bool {
		if kf := kernelFile(t, it, seq.Pid, key); kf.WindowKB() > trialKB {
			trialKB = kf.WindowKB()
		}
		for _, a := range d.actions() {
			if strings.HasPrefix(a.Action, "file_window") && a.Result == "undone" && strings.HasSuffix(a.Target, "blk_stream") {
				undo = a
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond, "no trial was undone on the healthy device's stream:\n%s", d.logs.String())
	t.Logf("undone: %s %d -> %d KB (%s); the kernel held up to %d KB on the reader's file during the trial",
		undo.Action, undo.FromKB, undo.ToKB, undo.Evidence, trialKB)
	assert.Greater(t, trialKB, 128, "the trial's window was in force in the kernel")
	require.True(t, seq.alive(), "the reader still streams after the undo")
	var kf fileras.File
	ok := assert.Eventually(t, func() bool {
		kf = kernelFile(t, it, seq.Pid, key)
		return kf.WindowKB() == 128 && kf.SizeKB() <= 128
	}, 1500*time.Millisecond, 10*time.Millisecond, "the reader's stream is back on the device's window (kernel f_ra) within the back-off")
	t.Logf("after the undo: kernel f_ra ra_pages %d KB, window %d KB (back at 128 KB: %v); reader at %.0f MB/s",
		kf.WindowKB(), kf.SizeKB(), ok, rateOver(seq, time.Second))
	noWrap(t, seq, targetMB)
}
