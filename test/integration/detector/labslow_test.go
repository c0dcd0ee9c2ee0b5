package detector_test

import (
	"math/bits"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/readaheadd/readaheadd/test/lab"
)

const (
	// labSlowMult, labSlowShare: the lab itself was slow around a moment
	// when at least labSlowShare of the requests it served then took
	// labSlowMult times the run's p99 of their size class from arrival to
	// reply. In a quiet second the share is about a tenth of a percent.
	labSlowMult  = 2.0
	labSlowShare = 0.01
	// labSlowBefore, labSlowAfter: the span around a regime's entry whose
	// requests are looked at (the detector judges the last second).
	labSlowBefore = 1250 * time.Millisecond
	labSlowAfter  = 250 * time.Millisecond
)

// labSlowAt reports the share of the requests labfs served around at (a
// regime's entry, CLOCK_MONOTONIC) that took labSlowMult times the run's
// p99 of their size class, and whether that says the lab itself was slow
// then. The lab is a user space server: when the host takes its CPU, its
// replies are late, the emulated device really is slower, and a detector
// that says so is right.
func labSlowAt(reqs []lab.Request, at time.Duration) (float64, bool) {
	class := func(r lab.Request) int { return bits.Len64(r.Len) }
	lats := map[int][]time.Duration{}
	for _, r := range reqs {
		lats[class(r)] = append(lats[class(r)], r.Latency)
	}
	p99 := map[int]time.Duration{}
	for c, l := range lats {
		slices.Sort(l)
		p99[c] = l[(len(l)-1)*99/100]
	}
	var n, slow int
	for _, r := range reqs {
		if r.Start < at-labSlowBefore || r.Start > at+labSlowAfter {
			continue
		}
		n++
		if float64(r.Latency) > labSlowMult*float64(p99[class(r)]) {
			slow++
		}
	}
	if n == 0 {
		return 0, false
	}
	share := float64(slow) / float64(n)
	return share, share >= labSlowShare
}

// The lab's own replies tell a second the host took its CPU from a quiet one.
func TestLabSlowAt(t *testing.T) {
	var reqs []lab.Request
	for i := 0; i < 10000; i++ { // 10 s, 1000 a second, 1 ms each
		reqs = append(reqs, lab.Request{Start: time.Duration(i) * time.Millisecond, Len: 128 << 10, Latency: time.Millisecond})
	}
	for i := 5000; i < 5030; i++ { // 30 late replies in the sixth second
		reqs[i].Latency = 5 * time.Millisecond
	}
	share, slow := labSlowAt(reqs, 6*time.Second)
	assert.True(t, slow, "share %.3f", share)
	assert.InDelta(t, 30.0/1500, share, 0.002)
	_, slow = labSlowAt(reqs, 2*time.Second)
	assert.False(t, slow, "a quiet second")
	// Another size class has its own p99: 4 KB requests at 1 ms are not
	// slow beside 128 KB ones at 1 ms.
	for i := 2000; i < 2100; i++ {
		reqs[i].Len = 4 << 10
	}
	_, slow = labSlowAt(reqs, 2*time.Second)
	assert.False(t, slow)
	_, slow = labSlowAt(nil, time.Second)
	assert.False(t, slow, "no requests: nothing says the lab was slow")
}
