package tuner

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

func TestFailMemoLogsOncePerCauseAndBacksOff(t *testing.T) {
	var m failMemo
	k := probe.FileKey{Dev: sdb, Ino: 7}
	backoff := func(n int) time.Duration { return time.Duration(n) * time.Second }
	assert.True(t, m.due(k, KindFileWindow, 0))
	assert.True(t, m.failed(k, KindFileWindow, CauseOutOfScope, 0, backoff), "the first failure is news")
	assert.False(t, m.due(k, KindFileWindow, 500*time.Millisecond), "not retried before its back-off")
	assert.True(t, m.due(k, KindTrim, 500*time.Millisecond), "another kind is not held")
	assert.True(t, m.due(k, KindFileWindow, time.Second))
	assert.False(t, m.failed(k, KindFileWindow, CauseOutOfScope, time.Second, backoff), "a repeat is counted, not logged")
	assert.False(t, m.due(k, KindFileWindow, 2500*time.Millisecond), "the back-off grows")
	assert.True(t, m.failed(k, KindFileWindow, CauseProcessGone, 3*time.Second, backoff), "another cause is news")
	k2 := probe.FileKey{Dev: sdb, Ino: 8}
	m.failed(k2, KindFileWindow, CauseProcessGone, 3*time.Second, backoff)
	assert.True(t, m.due(k2, KindFileWindow, 3*time.Second), "a reader gone holds nothing back from the next reader")
	assert.Equal(t, uint64(1), m.counts()[CauseOutOfScope])
	assert.Len(t, m.counts(), len(FailureCauses))
	m.ok(k, KindFileWindow)
	assert.True(t, m.due(k, KindFileWindow, 3*time.Second))
	assert.True(t, m.failed(k, KindFileWindow, CauseOutOfScope, 3*time.Second, backoff), "after a success a failure is news again")

	for i := 0; i < maxFailMemo+10; i++ {
		m.failed(probe.FileKey{Dev: sdb, Ino: uint64(100 + i)}, KindFileWindow, CauseOther, 3*time.Second, backoff)
	}
	assert.LessOrEqual(t, len(m.seen), maxFailMemo, "bounded")
}

func TestFailCause(t *testing.T) {
	assert.Equal(t, CauseOutOfScope, failCause(fmt.Errorf("x: %w", errOutOfScope)))
	assert.Equal(t, CauseProcessGone, failCause(fmt.Errorf("x: %w", actuate.ErrProcessGone)))
	assert.Equal(t, CauseFDGone, failCause(fmt.Errorf("x: %w", actuate.ErrFDGone)))
	assert.Equal(t, CauseOther, failCause(fmt.Errorf("x")))
}

// TestOutOfScopeNewReaderIsLoggedOnce: a file has a kept window; a new
// reader holds it through a path outside the allow-paths and streams
// (a readahead event every 100 ms). The refusal is one failed action,
// its repeats are counted, and it is not retried at every event.
func TestOutOfScopeNewReaderIsLoggedOnce(t *testing.T) {
	r := newRig(t, Config{}, nil)
	r.tput = kneeModel
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.reader(100, 7, p, key)
	r.run(6, func() detector.Snapshot { return r.snap(detector.FileLatencyShift, key) })
	require.Equal(t, 512, r.files.window[key])

	outside := filepath.Join(r.dir, "elsewhere", "blk_1")
	require.NoError(t, os.MkdirAll(filepath.Dir(outside), 0o755))
	require.NoError(t, os.Link(p, outside))
	r.files.fds[900001] = []actuate.FileRef{{Tgid: 900001, FD: 5, Key: key, Path: outside}}
	var acts []Action
	for i := 0; i < 50; i++ { // 5 s of events
		r.clk.Advance(100 * time.Millisecond)
		r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 900001, File: key, Device: sdb, RaPages: 32})
		acts = append(acts, r.tn.applyPending()...)
	}
	failed := filter(acts, KindFileWindow, ResultFailed)
	require.Len(t, failed, 1, "one line for the cause: %v", acts)
	assert.Contains(t, failed[0].Evidence, "outside the allow-paths")
	st := r.tn.Status()
	assert.Positive(t, st.Repeated[CauseOutOfScope], "the repeats are counted")
	assert.Less(t, st.Repeated[CauseOutOfScope], uint64(10), "and not retried at every event")
}
