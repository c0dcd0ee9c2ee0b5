package detector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// In a long sequential stream (readahead keeping two requests in flight),
// a request that completes ahead of its predecessor is not a jump: seen on
// the lab device, where such pairs made a plain file look fragmented.
func TestOutOfOrderCompletionInSequentialStreamIsNotAJump(t *testing.T) {
	d := New(DefaultConfig())
	dev := probe.MkDev(8, 0)
	file := probe.FileKey{Dev: dev, Ino: 7}
	const spr = 128 * kib / 512
	rec := func(i uint64, issue time.Duration) probe.Record {
		return probe.Record{Device: dev, Bytes: 128 * kib, Sector: 1000 + i*spr, Offset: i * 128 * kib, Issue: issue,
			Latency: time.Millisecond, Depth: 2, Kind: probe.KindFile, File: file}
	}
	var i uint64
	at := func() time.Duration { return time.Duration(i) * 500 * time.Microsecond }
	for ; i < 100; i++ {
		d.Observe(rec(i, at()))
	}
	// i+1 completes before i, twice.
	for k := 0; k < 2; k++ {
		d.Observe(rec(i+1, at()))
		d.Observe(rec(i, at()))
		i += 2
		for end := i + 10; i < end; i++ {
			d.Observe(rec(i, at()))
		}
	}
	snap := d.Evaluate(at() + time.Millisecond)
	require.Len(t, snap.Files, 1)
	assert.Zero(t, snap.Files[0].Jumps, "out-of-order completions must not count as jumps")
	assert.InDelta(t, 1.0, snap.Files[0].Sequentiality, 0.02)

	// A real jump still counts.
	d.Observe(rec(i+1000, at()))
	i++
	snap = d.Evaluate(at() + 2*time.Millisecond)
	assert.Equal(t, uint64(1), snap.Files[0].Jumps)
}
