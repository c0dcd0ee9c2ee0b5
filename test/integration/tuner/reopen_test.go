package tuner

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/fileras"
)

// controlCount reads one event of readaheadd_tuner_control_total.
func controlCount(t *testing.T, d *daemon, event string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	prefix := fmt.Sprintf("readaheadd_tuner_control_total{event=%q} ", event)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			n, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no %s in /metrics", prefix)
	return 0
}

// TestRandomReaderThatReopensItsFileKeepsItsTrim: beside a slowed stream
// whose window the daemon raises, a random mmap reader that opens its file
// again every 250 ms is trimmed, and each new open file gets the trim
// from the probe's report of its first read-around, not the device's
// window until the next search: sampled in the kernel's own per-file
// state, the reader's open file holds the trim most of the time, and the
// trim is not undone for reads that stayed read-around sized.
func TestRandomReaderThatReopensItsFileKeepsItsTrim(t *testing.T) {
	needRoot(t)
	l := newLab(t)
	target, err := l.WriteFile("blk_target", 256)
	require.NoError(t, err)
	index, err := l.WriteFile("index", 256)
	require.NoError(t, err)
	daemonBin(t)
	require.NoError(t, l.SetPermanent(severe, target))

	it, err := fileras.Open()
	require.NoError(t, err)
	t.Cleanup(func() { it.Close() })
	require.NoError(t, it.Watch(fileKey(t, index).Dev))
	key := fileKey(t, index)

	d := runDaemon(t, l, t.TempDir())
	rnd := startChild(t, "reopen", index)
	rnd.goRead(t)
	seq := startChild(t, "seq", target)
	seq.goRead(t)

	// The reader's open file's window, every 20 ms, for 8 s.
	type sample struct {
		at time.Time
		kb int
	}
	var samples []sample
	end := time.Now().Add(8 * time.Second)
	for time.Now().Before(end) {
		fs, err := it.Files(fileras.Query{Tgid: uint32(rnd.Pid)})
		require.NoError(t, err)
		for _, f := range fs {
			if f.Key == key {
				samples = append(samples, sample{time.Now(), f.WindowKB()})
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.True(t, rnd.alive(), "the reader failed: %v", rnd.failures())
	require.Empty(t, rnd.failures())

	var trim *actionEntry
	var undone []actionEntry
	for _, a := range d.actions() {
		if !strings.HasSuffix(a.Target, "/index") && !strings.HasSuffix(a.Target, fmt.Sprintf("/%d", key.Ino)) {
			continue
		}
		switch {
		case a.Action == "file_trim" && trim == nil:
			trim = &a
		case a.Action == "file_trim_undo":
			undone = append(undone, a)
		}
	}
	require.NotNil(t, trim, "the random reader beside the raised window was not trimmed:\n%s", d.logs.String())
	opened := controlCount(t, d, "trim_opened")
	t.Logf("trimmed %d->%d KB (%s); descriptors trimmed at their first read-around: %.0f; missed: %.0f",
		trim.FromKB, trim.ToKB, trim.Evidence, opened, controlCount(t, d, "trim_opened_missed"))
	assert.GreaterOrEqual(t, opened, 4.0, "the reader's new open files were trimmed from the probe's reports")
	for _, u := range undone {
		t.Logf("undone: %s", u.Evidence)
		assert.NotContains(t, u.Evidence, "every descriptor it trimmed is closed", "the trim reached the re-opened descriptors")
	}

	// While the trim is in force (from its action to its first undo, if
	// any), the reader's open file holds it most of the time: each new
	// open file has the device's window only until its first fault's
	// report is handled.
	until := end
	if len(undone) > 0 {
		until = undone[0].Time
	}
	from := trim.Time.Add(100 * time.Millisecond)
	in, at := 0, 0
	for _, s := range samples {
		if s.at.After(from) && s.at.Before(until) {
			in++
			if s.kb <= trim.ToKB {
				at++
			}
		}
	}
	require.Greater(t, in, 20, "too few samples while the trim was in force (%v to %v)", from, until)
	share := float64(at) / float64(in)
	t.Logf("the reader's open file held the trim in %d of %d samples (%.0f%%) over %v", at, in, 100*share, until.Sub(from).Round(time.Millisecond))
	assert.Greater(t, share, 0.7, "the re-opened files keep the trim")
}
