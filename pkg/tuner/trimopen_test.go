package tuner

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// fakeAround records what the tuner asks the probe to watch.
type fakeAround struct {
	watched map[probe.FileKey]int
	err     error
}

func (f *fakeAround) WatchReadAround(k probe.FileKey, kb int) error {
	if f.err != nil {
		return f.err
	}
	f.watched[k] = kb
	return nil
}

func (f *fakeAround) UnwatchReadAround(k probe.FileKey) error {
	delete(f.watched, k)
	return nil
}

// newWatchedMmapRig is newMmapRig with the probe's read-around reports.
func newWatchedMmapRig(t *testing.T, cfg Config) (*mmapRig, *fakeAround) {
	fa := &fakeAround{watched: map[probe.FileKey]int{}}
	return newMmapRigWith(t, cfg, func(r *rig) { r.around = fa }), fa
}

// around reports a read-around of the random file by tgid with window kb,
// emitted at the clock's now.
func (m *mmapRig) around(tgid uint32, kb int) {
	m.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: tgid, File: m.rnd, Device: sdb, RaPages: uint32(kb / 4), ReadAround: true, Time: m.clk.Now()})
}

// reopen closes the random reader's descriptor and opens the file again
// under number fd: the new open file has the device's window.
func (m *mmapRig) reopen(oldFD, fd int) {
	p := m.files.fds[200][0].Path
	m.files.closeFD(200, oldFD)
	m.files.open(200, fd, p, m.rnd)
	m.files.window[m.rnd] = m.sys.get("sdb")
}

// A random reader that opens its file again and again gets the trim on
// each new descriptor from the probe's report of its first read-around,
// not at the next search: its requests stay small and the trim is kept
// (without the reports it is undone: TestTrimUndoneOnAReaderThatReopensSaysSo).
func TestTrimReachesEachReopenedDescriptorFromItsFirstReadAround(t *testing.T) {
	m, fa := newWatchedMmapRig(t, Config{})
	m.files.closedFDs = true
	acts := trimActs(m.run(1), m.rnd)
	require.Len(t, acts, 1)
	require.Equal(t, ResultTrial, acts[0].Result)
	assert.Equal(t, map[probe.FileKey]int{m.rnd: 16}, fa.watched, "the trimmed file is watched at the trim's window")
	m.tn.mu.Lock()
	trimAt := m.tn.devs[sdb].trimAt
	m.tn.mu.Unlock()

	for i := range 3 {
		fd := 10 + i
		m.reopen(fd-1, fd)
		require.Equal(t, 128, m.files.window[m.rnd])
		m.clk.Advance(50 * time.Millisecond)
		m.around(200, 128)
		assert.Equal(t, 16, m.files.window[m.rnd], "re-open %d: trimmed from the report", i)
		assert.Equal(t, 128, m.sys.get("sdb"), "the device's own window is back")
		evOut := m.tn.applyPending()
		assert.Empty(t, trimActs(evOut, m.rnd), "a descriptor trimmed from a report is counted, not an action")
		m.clk.Advance(250 * time.Millisecond)
	}
	st := m.tn.Status()
	assert.Equal(t, uint64(3), st.Events[EvTrimOpened])
	m.tn.mu.Lock()
	assert.Equal(t, trimAt, m.tn.devs[sdb].trimAt, "keeping the reader's requests trimmed is no change of its trim")
	require.NotNil(t, m.tn.randRefs[m.rnd])
	assert.True(t, m.tn.randRefs[m.rnd].reopens, "its re-opens are known: its p99 is its untrimmed faults'")
	m.tn.mu.Unlock()

	// Judged on requests that stayed small: kept.
	rnd := trimActs(m.run(1), m.rnd)
	require.Len(t, rnd, 1)
	assert.Equal(t, ResultKept, rnd[0].Result, rnd[0].Evidence)

	// The trim's end gives the descriptor open now the device's window,
	// and the file is no longer watched.
	require.NoError(t, m.tn.RestoreAll())
	assert.Equal(t, 128, m.files.window[m.rnd])
	assert.Empty(t, fa.watched)
	assert.Empty(t, m.store.Pins())
}

// Reports the tuner has already acted on, reports of a window at the trim
// and reports on files not trimmed change nothing; a reader whose mapping
// has no descriptor left is looked for once, then left alone for a while.
func TestReadAroundReportsThatNeedNothing(t *testing.T) {
	m, fa := newWatchedMmapRig(t, Config{})
	m.around(200, 128) // not trimmed yet: nothing to do
	assert.Equal(t, 128, m.files.window[m.rnd])
	m.tn.mu.Lock()
	assert.Empty(t, m.tn.readers[m.rnd], "a read-around is not a stream's reader")
	m.tn.mu.Unlock()

	m.run(1)
	require.Contains(t, fa.watched, m.rnd)
	m.reopen(9, 10)
	m.clk.Advance(10 * time.Millisecond)
	stale := m.clk.Now()
	m.clk.Advance(10 * time.Millisecond)
	m.around(200, 128)
	require.Equal(t, 16, m.files.window[m.rnd])
	calls := len(m.files.calls)

	// Emitted before that trim, delivered after it: stale.
	m.files.window[m.rnd] = 128 // would be trimmed again if looked at
	m.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 200, File: m.rnd, Device: sdb, RaPages: 32, ReadAround: true, Time: stale})
	assert.Equal(t, calls, len(m.files.calls), "a stale report is not acted on")
	// At the trim's window: nothing to do.
	m.around(200, 16)
	assert.Equal(t, calls, len(m.files.calls))
	m.files.window[m.rnd] = 16

	// A mapping whose descriptor is closed: nothing to trim; not looked
	// for again within openedQuiet.
	m.files.fds[300] = nil
	m.clk.Advance(10 * time.Millisecond)
	m.around(300, 128)
	m.clk.Advance(10 * time.Millisecond)
	m.around(300, 128)
	st := m.tn.Status()
	assert.Equal(t, uint64(1), st.Events[EvTrimOpenedMissed])
	m.clk.Advance(openedQuiet)
	m.around(300, 128)
	assert.Equal(t, uint64(2), m.tn.Status().Events[EvTrimOpenedMissed])
}

// Without the probe's reports (an older kernel) or when watching fails,
// the trim works as before: logged once, nothing else changes.
func TestTrimWithoutReadAroundReports(t *testing.T) {
	m, fa := newWatchedMmapRig(t, Config{})
	fa.err = errors.New("the kernel has no page_cache_ra_order tracepoint")
	require.Len(t, trimActs(m.run(1), m.rnd), 1)
	assert.Equal(t, 16, m.files.window[m.rnd])
	m.reopen(9, 10)
	m.around(200, 128)
	assert.Equal(t, 128, m.files.window[m.rnd], "not watched: no report is acted on")

	m, fa = newWatchedMmapRig(t, Config{DryRun: true})
	m.run(3)
	assert.Empty(t, fa.watched, "nothing watched in dry-run mode")
}

// A trim that ends (no window raised beside it any more) stops the
// watch; a decision of the file's own also does.
func TestTrimEndUnwatches(t *testing.T) {
	m, fa := newWatchedMmapRig(t, Config{})
	m.run(3)
	require.Contains(t, fa.watched, m.rnd)
	m.slowed = false
	m.files.gone[100] = true
	for range 40 {
		m.run(1)
		if len(fa.watched) == 0 {
			break
		}
	}
	m.tn.mu.Lock()
	trimmed := m.tn.trims[m.rnd] != nil
	m.tn.mu.Unlock()
	assert.False(t, trimmed)
	assert.Empty(t, fa.watched, "an ended trim is not watched")
}

// Trims of opened descriptors have a budget of their own per device: a
// burst of openedBurst, then openedPerSec a second; a report over it
// waits for the next token, and the other actions' sysfs budget is not
// touched.
func TestTrimOpenedBudget(t *testing.T) {
	m, _ := newWatchedMmapRig(t, Config{})
	m.run(1)
	p := m.files.fds[200][0].Path
	m.tn.mu.Lock()
	tokens := m.tn.devs[sdb].writes.tokens
	m.tn.mu.Unlock()
	for tgid := uint32(300); tgid < 306; tgid++ {
		m.files.open(tgid, 5, p, m.rnd)
		m.around(tgid, 128)
	}
	st := m.tn.Status()
	assert.Equal(t, uint64(openedBurst), st.Events[EvTrimOpened])
	assert.Equal(t, uint64(6-openedBurst), st.Events[EvTrimOpenedMissed])
	m.tn.mu.Lock()
	assert.Equal(t, tokens, m.tn.devs[sdb].writes.tokens, "the sysfs budget of the other actions is untouched")
	m.tn.mu.Unlock()
	// Within a token's time nothing more; after it, the next report is served.
	m.clk.Advance(time.Second / openedPerSec / 2)
	m.around(304, 128)
	assert.Equal(t, uint64(openedBurst), m.tn.Status().Events[EvTrimOpened])
	m.clk.Advance(time.Second / openedPerSec)
	m.around(304, 128)
	assert.Equal(t, uint64(openedBurst+1), m.tn.Status().Events[EvTrimOpened])
}
