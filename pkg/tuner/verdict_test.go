package tuner

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// verdictTick is the daemon's check of steps under trial.
func (r *rig) verdictTick(after time.Duration, st stream, lat time.Duration) []Action {
	return r.recentTick(after, r.tn.trialStreams, r.tn.fastVerdict, st, lat, 0)
}

// A fresh stream slow from its first read gets its first step between
// Steps. Half an interval on, its recent requests read far above its
// before-measure: the step is kept then and the next one taken, not at the
// Step up to two intervals after it. A step that pays less than
// earlyKeepGain waits for its Step.
func TestStepThatClearlyPaysIsKeptEarly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tput  func(int) float64
		early bool
	}{
		{"pays 2x", func(kb int) float64 { return min(float64(kb)*0.3e6, 150e6) }, true},
		{"pays 15%", func(kb int) float64 {
			if kb > 128 {
				return 46e6
			}
			return 40e6
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{DisablePrefetch: true}, nil)
			r.tput = tc.tput
			p, key := realFile(t, filepath.Join(r.dir, "data"), "blk_1")
			r.files.open(100, 7, p, key)
			st := stream{key: key, tgid: 100, fill: 0.9}
			var trials []Action
			for i := 0; i < 5 && len(trials) == 0; i++ {
				trials = filter(r.fastTick(st), KindFileWindow, ResultTrial)
			}
			require.Len(t, trials, 1, "the fresh stream's first step")
			first := trials[0].ToKB
			// Before half a Settle: nothing is judged.
			assert.Empty(t, r.verdictTick(300*time.Millisecond, st, 4*time.Millisecond))
			acts := r.verdictTick(300*time.Millisecond, st, 4*time.Millisecond)
			logActs(t, acts)
			kept := filter(acts, KindFileWindow, ResultKept)
			if !tc.early {
				assert.Empty(t, kept, "a step that pays less than earlyKeepGain waits for its Step")
				assert.Equal(t, first, r.tn.files[key].win.trial.to)
				return
			}
			require.Len(t, kept, 1, "kept on its recent requests")
			next := filter(acts, KindFileWindow, ResultTrial)
			require.Len(t, next, 1, "and the next step taken at once")
			assert.Greater(t, next[0].ToKB, first)
			assert.Equal(t, next[0].ToKB, r.files.window[key])
			assert.Equal(t, uint64(1), r.tn.Status().Events[EvKeptEarly])
		})
	}
}

// Beside a trimmed random reader, a step that clearly pays is kept early
// too when the reader's recent mean is clearly within its budget; when it
// is near its budget the step waits for its Step. A p99 over its budget
// but not far off in the quarter interval (a handful of requests) does not
// hold the keep back: the watch follows the kept window.
func TestStepBesideARandomReaderIsKeptEarlyOnlyWellWithinItsBudget(t *testing.T) {
	for _, tc := range []struct {
		name        string
		trimmedMean time.Duration // 0: the lab model's
		tailX       float64       // the reader's p99 in the quarter as a multiple of its reference; 0: the model's
		early       bool
	}{
		{"well within", 0, 0, true},
		{"near its budget", 1400 * time.Microsecond, 0, false},
		// Kept early, 1.24x its p99 reference let slow-stream-bursty's reader
		// wait 5 s over budget before the watch took it back (p99 over the
		// run 1.14x): the whole interval judges it (random_judged_later).
		{"p99 over its budget in the quarter", 0, 1.35, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLabRig(t)
			if tc.trimmedMean > 0 {
				l.model = func(rkb, skb int) (float64, time.Duration, time.Duration) {
					if rkb > 16 {
						return labRandom(rkb, skb)
					}
					return float64(time.Second) / float64(tc.trimmedMean), tc.trimmedMean, tc.trimmedMean * 14 / 10
				}
			}
			var trials []Action
			for i := 0; i < 6 && len(trials) == 0; i++ {
				trials = filter(l.run(1), KindFileWindow, ResultTrial)
			}
			require.Len(t, trials, 1)
			if tc.tailX > 0 {
				ref := l.tn.randRefs[l.rkey]
				require.NotNil(t, ref)
				require.True(t, ref.tailSure)
				tail := time.Duration(tc.tailX * float64(ref.svc.tail))
				l.model = func(rkb, skb int) (float64, time.Duration, time.Duration) {
					req, mean, _ := labRandom(rkb, skb)
					return req, mean, tail
				}
			}
			l.clk.Advance(500 * time.Millisecond)
			keys, span := l.tn.trialStreams()
			require.Contains(t, keys, l.st.key)
			s := l.snapshot()
			f := span.Seconds()
			for j := range s.Files {
				s.Files[j].Bytes = uint64(float64(s.Files[j].Bytes) * f)
				s.Files[j].Requests = max(uint64(float64(s.Files[j].Requests)*f), freshMinRequests)
			}
			s.Devices[0].Bytes = uint64(float64(s.Devices[0].Bytes) * f)
			acts := l.tn.fastVerdict(s, span)
			logActs(t, acts)
			kept := filter(acts, KindFileWindow, ResultKept)
			if !tc.early {
				assert.Empty(t, kept)
				return
			}
			require.Len(t, kept, 1, "kept on the recent requests, the random reader's among them")
			assert.Contains(t, kept[0].Evidence, "within budget: the random reader", "what the reader got against its reference is named")
			assert.Equal(t, uint64(1), l.tn.Status().Events[EvKeptEarly])
		})
	}
}

// A verdict is a function of the step, its measure and the judging mode,
// whichever order the modes judge in: a Step judges a step a whole Settle
// after it; fastVerdict (early) keeps before that only a step that pays by
// earlyKeepGain, and never undoes one; endedVerdict (ended) judges at once,
// keep or undo, since its stream reads no more.
func TestVerdictIsAFunctionOfItsMode(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	tn := r.tn
	tn.mu.Lock()
	defer tn.mu.Unlock()
	d := tn.device(sdb)
	require.NotNil(t, d)
	settle := tn.cfg.Settle
	recent := settle / freshSpanDiv
	const wait, kept, undone = "wait", "kept", "undone"
	modes := []judgeMode{judgeStep, judgeEarly, judgeEnded}
	for _, tc := range []struct {
		name string
		age  time.Duration // since the step
		gain float64
		want [3]string // by mode: step, early, ended
	}{
		{"half a Settle, pays 40%", settle / 2, 0.4, [3]string{wait, kept, kept}},
		{"half a Settle, pays 15%", settle / 2, 0.15, [3]string{wait, wait, kept}},
		{"half a Settle, loses 20%", settle / 2, -0.2, [3]string{wait, wait, undone}},
		{"a Settle, pays 15%", settle, 0.15, [3]string{kept, kept, kept}},
		{"a Settle, loses 20%", settle, -0.2, [3]string{undone, undone, undone}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := r.clk.Now()
			step := ladder{kind: KindFileWindow, base: 128, cur: 128, movedAt: now - tc.age,
				trial: trialStep{to: 256, from: 128, at: now - tc.age, before: measure{ok: true, tput: 100e6, rate: 100e6, dev: 100e6}}}
			m := measure{ok: true, tput: (1 + tc.gain) * 100e6, rate: (1 + tc.gain) * 100e6, dev: (1 + tc.gain) * 100e6}
			views := [3]*view{&tn.view, {span: recent}, {span: tc.age}}
			judge := func(mode judgeMode) string {
				l := step
				j := judgeCtx{Tuner: tn, view: views[mode], mode: mode}
				j.drive(&l, d, probe.FileKey{Dev: sdb, Ino: 9}, "", m, "test", false, func(int) error { return nil })
				switch {
				case l.trial.to != 0:
					return wait
				case l.cur == step.trial.to:
					return kept
				default:
					return undone
				}
			}
			for _, order := range [][]judgeMode{
				{judgeStep, judgeEarly, judgeEnded}, {judgeStep, judgeEnded, judgeEarly},
				{judgeEarly, judgeStep, judgeEnded}, {judgeEarly, judgeEnded, judgeStep},
				{judgeEnded, judgeStep, judgeEarly}, {judgeEnded, judgeEarly, judgeStep},
			} {
				var got [3]string
				for _, mode := range order {
					got[mode] = judge(mode)
				}
				assert.Equal(t, tc.want, got, "modes %v judged in the order %v", modes, order)
			}
		})
	}
}
