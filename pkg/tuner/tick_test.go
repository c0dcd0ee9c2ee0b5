package tuner

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// tickScene has a stream's first step under trial, its stream stopped
// reading 300 ms ago, and a fresh stream bound by its window read since
// then, both due at the next tick; recent is the detector's recent
// requests of either.
func tickScene(t *testing.T) (r *rig, ended, fresh stream, recent RecentFunc) {
	r = newRig(t, Config{FirstStepFactor: 4, DisablePrefetch: true}, nil)
	r.tput = func(w int) float64 { return min(float64(w)*0.4e6, 400e6) }
	p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
	r.files.open(100, 7, p, key)
	ended = stream{key: key, tgid: 100, fill: 0.9}
	trials := filter(r.runOutcome(1, ended), KindFileWindow, ResultTrial)
	require.Len(t, trials, 1)
	endSnap := r.readsUntil(ended, trials[0].Time, 450*time.Millisecond)
	endSnap.Now += 300 * time.Millisecond
	p, key = realFile(t, filepath.Join(r.dir, "data"), "blk_9")
	r.files.open(101, 8, p, key)
	fresh = stream{key: key, tgid: 101, fill: 0.9}
	for range 3 {
		r.clk.Advance(100 * time.Millisecond)
		r.tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: fresh.tgid, File: key, Device: sdb, RaPages: 32})
	}
	return r, ended, fresh, func(span time.Duration, keys []probe.FileKey) detector.Snapshot {
		if slices.Contains(keys, ended.key) {
			return endSnap
		}
		return r.recentSnap(span, fresh)
	}
}

// One Tick runs the checks between Steps in the order the daemon ran them
// one by one: a fresh stream's first step and the verdict on a step whose
// stream ended give, in one Tick, the actions of that sequence, and the
// recent requests are asked for the same streams in the same order.
func TestTickRunsTheChecksInTheirOrder(t *testing.T) {
	// asked records each call of recent: its span and which streams.
	asked := func(recent RecentFunc, ended, fresh stream, calls *[]string) RecentFunc {
		return func(span time.Duration, keys []probe.FileKey) detector.Snapshot {
			var names []string // in inode order, which differs between scenes
			for _, k := range keys {
				names = append(names, map[probe.FileKey]string{ended.key: "ended", fresh.key: "fresh"}[k])
			}
			slices.Sort(names)
			*calls = append(*calls, span.String()+" "+strings.Join(names, " "))
			return recent(span, keys)
		}
	}
	// The former sequence, step by step.
	r, ended, fresh, recent := tickScene(t)
	var wantCalls []string
	recent = asked(recent, ended, fresh, &wantCalls)
	var want []Action
	for _, c := range []struct {
		streams func() ([]probe.FileKey, time.Duration)
		judge   func(detector.Snapshot, time.Duration) []Action
	}{{r.tn.freshStreams, r.tn.fastOutcome}, {r.tn.onsetStreams, r.tn.fastOnset},
		{r.tn.trialStreams, r.tn.fastVerdict}, {r.tn.trimStreams, r.tn.fastTrim}} {
		if keys, span := c.streams(); len(keys) > 0 {
			want = append(want, c.judge(recent(span, keys), span)...)
		}
	}
	for _, ts := range r.tn.endedTrials() {
		want = append(want, r.tn.endedVerdict(ts, recent(ts.Span, []probe.FileKey{ts.Key}))...)
	}
	want = append(want, r.tn.applyPending()...)
	logActs(t, want)
	require.Len(t, filterFile(want, fresh.key, ResultTrial), 1, "the fresh stream's first step")
	require.Len(t, filterFile(want, ended.key, ResultKept), 1, "the ended stream's step kept")
	assert.Equal(t, "250ms fresh", wantCalls[0])
	assert.Equal(t, "750ms ended", wantCalls[len(wantCalls)-1])

	// The same scene, in one Tick.
	r2, ended2, fresh2, recent2 := tickScene(t)
	var calls []string
	got := r2.tn.Tick(detector.Snapshot{}, asked(recent2, ended2, fresh2, &calls))
	logActs(t, got)
	require.Len(t, got, len(want))
	for i := range want {
		// The files are other inodes in the second scene.
		w, g := want[i], got[i]
		w.File, w.Path, g.File, g.Path = probe.FileKey{}, "", probe.FileKey{}, ""
		assert.Equal(t, w, g, "action %d", i)
	}
	assert.Equal(t, wantCalls, calls)
}

// filterFile keeps the file window actions on key with result res.
func filterFile(acts []Action, key probe.FileKey, res Result) []Action {
	var out []Action
	for _, a := range filter(acts, KindFileWindow, res) {
		if a.File == key {
			out = append(out, a)
		}
	}
	return out
}
