package tuner

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// stepUnderTrial runs a window-bound stream (205 MB/s at 512 KB, 400 at
// 1024) until its second step is under trial, and returns the step's
// window and when it was taken.
func stepUnderTrial(t *testing.T, r *rig) (stream, int, time.Duration) {
	r.tput = func(w int) float64 { return min(float64(w)*0.4e6, 400e6) }
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	st := stream{key: key, tgid: 100, fill: 0.9}
	var acts []Action
	for i := 0; i < 6 && len(filter(acts, KindFileWindow, ResultKept)) == 0; i++ {
		acts = append(acts, r.runOutcome(1, st)...)
	}
	trials := filter(acts, KindFileWindow, ResultTrial)
	require.NotEmpty(t, filter(acts, KindFileWindow, ResultKept))
	last := trials[len(trials)-1]
	require.Greater(t, last.FromKB, 128, "a second step under trial")
	return st, last.ToKB, last.Time
}

// readsUntil has st's reader read until the clock has advanced by d (its
// readahead events), then stop; the recent snapshot over the span since
// the step holds what it read at the step's window.
func (r *rig) readsUntil(st stream, since, d time.Duration) detector.Snapshot {
	r.clk.Advance(d)
	w := r.files.window[st.key]
	r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: st.tgid, File: st.key, Device: sdb, RaPages: uint32(w / 4)})
	rate := r.tput(w)
	read := r.clk.Now() - since
	b := uint64(rate * read.Seconds())
	return detector.Snapshot{Now: r.clk.Now(),
		Files: []detector.FileStats{{Key: st.key, Device: sdb, Requests: b / (128 << 10), Bytes: b, BusyThroughput: rate,
			Sequentiality: 1, NextOffset: 64 << 20, LastSeen: r.clk.Now(), P50: 3 * time.Millisecond, MeanSize: 128 << 10,
			Inflight: st.fill * float64(w) / 128}},
		Devices: []detector.DeviceStats{{Device: sdb, Bytes: b, BusyThroughput: rate, CapacityBPS: rate}}}
}

// A stream that reads its file to the end 450 ms after a step is judged
// on those 450 ms as soon as it stops, before any Step: the step paid and
// is kept (and the directory's prior learns it).
func TestStepJudgedWhenItsStreamEnds(t *testing.T) {
	r := newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true}, nil)
	st, next, at := stepUnderTrial(t, r)
	snap := r.readsUntil(st, at, 450*time.Millisecond)
	snap.Now += 300 * time.Millisecond // the last request, then nothing
	r.clk.Advance(300 * time.Millisecond)
	ended := r.tn.endedTrials()
	require.Len(t, ended, 1, "the stream stopped: its step is judged now")
	assert.Equal(t, st.key, ended[0].Key)
	assert.Equal(t, 750*time.Millisecond, ended[0].Span)
	// Another stream on the device, just stepped: the span is not its
	// step's, and it is not judged here.
	other := probe.FileKey{Dev: st.key.Dev, Ino: st.key.Ino + 1}
	r.tn.files[other] = &fileDec{key: other, dev: r.tn.files[st.key].dev, byRate: true,
		win: ladder{kind: KindFileWindow, base: 128, cur: 128,
			trial: trialStep{to: 512, from: 128, at: r.clk.Now() - 100*time.Millisecond}}}
	snap.Files = append(snap.Files, detector.FileStats{Key: other, Device: sdb, Requests: 100, Bytes: 13e6, BusyThroughput: 130e6,
		Sequentiality: 1, LastSeen: snap.Now, MeanSize: 128 << 10})
	acts := r.tn.endedVerdict(ended[0], snap)
	assert.Equal(t, 512, r.tn.files[other].win.trial.to, "the other stream's step stays under trial")
	logActs(t, acts)
	k := filter(acts, KindFileWindow, ResultKept)
	require.Len(t, k, 1)
	assert.Equal(t, next, k[0].ToKB)
	assert.Empty(t, filter(acts, KindFileWindow, ResultTrial), "no next step for a stream that ended")
	assert.Equal(t, next, r.files.window[st.key])
	kb, p := r.tn.mem.Lookup(probe.FileKey{Dev: st.key.Dev}, filepath.Join(r.dir, "data", "blk_2"))
	assert.Equal(t, next, kb, "the directory's prior learned the step")
	assert.NotNil(t, p)
}

// A stream that stops 100 ms after a step read too little to judge it:
// the step ends unjudged, with no knee and no back-off.
func TestStepEndsUnjudgedWhenItsStreamStopsAtOnce(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	st, next, at := stepUnderTrial(t, r)
	r.readsUntil(st, at, 100*time.Millisecond)
	r.clk.Advance(300 * time.Millisecond)
	assert.Empty(t, r.tn.endedTrials())
	acts := r.tn.applyPending()
	logActs(t, acts)
	u := filter(acts, KindFileWindowUndo, ResultUndone)
	require.Len(t, u, 1)
	assert.Equal(t, next, u[0].FromKB)
	assert.Contains(t, u[0].Evidence, "too little to judge")
	fd := r.tn.files[st.key]
	require.NotNil(t, fd)
	assert.Zero(t, fd.win.trial.to)
	assert.False(t, fd.win.back.knee, "no knee on no evidence")
	assert.Zero(t, fd.win.back.retryAt)
}

// A stream's rate is over the part of the span it read: from its first
// readahead event when it began inside the span (a fresh open), to its
// last request when it stopped inside it.
func TestStreamsRateIsOverThePartOfTheSpanItRead(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	k := probe.FileKey{Dev: 1, Ino: 5}
	now := r.clk.Now()
	fs := detector.FileStats{Key: k, Device: sdb, Requests: 480, Bytes: 60e6, BusyThroughput: 200e6, Sequentiality: 1, LastSeen: now}
	view := func(fs detector.FileStats) measure {
		r.tn.snap = detector.Snapshot{Now: now, Files: []detector.FileStats{fs}}
		r.tn.fstats = map[probe.FileKey]detector.FileStats{k: fs}
		return r.tn.atStep().fileMeasure(k)
	}
	assert.InDelta(t, 60e6, view(fs).rate, 1, "read all along")
	r.tn.readers[k] = map[uint32]*readerInfo{7: {firstSeen: now - 300*time.Millisecond, lastSeen: now}}
	assert.InDelta(t, 200e6, view(fs).rate, 1, "began 300 ms ago")
	fs.LastSeen = now - 500*time.Millisecond
	r.tn.readers[k][7].firstSeen = now - 2*time.Second
	m := view(fs)
	assert.InDelta(t, 120e6, m.rate, 1, "stopped 500 ms ago")
	assert.True(t, m.ended)
	fs.LastSeen = now - 950*time.Millisecond
	assert.False(t, view(fs).ok, "read 50 ms of the span: too little")
}

// A slow stream on a large window has a readahead event only every few
// hundred milliseconds: it has not ended for want of one in endedGap.
func TestSlowStreamOnALargeWindowHasNotEnded(t *testing.T) {
	l := &ladder{trial: trialStep{to: 4096, before: measure{ok: true, rate: 10e6}}}
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	assert.Greater(t, r.tn.readaheadGap(l), 800*time.Millisecond)
	l.trial.before.rate = 300e6
	assert.Equal(t, endedGap, r.tn.readaheadGap(l))
}
