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

// Two files slowed at once with no normal file to compare with are not two
// file-level shifts (seen on the lab under a device-wide stall); one slowed
// file read alone still is.
func TestTwoSlowFilesWithoutPeersAreNotFileShifts(t *testing.T) {
	dev := probe.MkDev(8, 0)
	const spr = 128 * kib / 512
	run := func(slowFiles int) []Regime {
		d := New(DefaultConfig())
		files := []probe.FileKey{{Dev: dev, Ino: 1}, {Dev: dev, Ino: 2}}
		var next [2]uint64
		var now time.Duration
		for sec := 0; sec < 20; sec++ {
			for k := 0; k < 100; k++ {
				for fi := 0; fi < 2; fi++ {
					if sec >= 10 && fi >= slowFiles {
						continue // only the slowed files are read after the onset
					}
					lat := time.Millisecond
					if sec >= 10 {
						lat = 2500 * time.Microsecond
					}
					i := next[fi]
					next[fi]++
					d.Observe(probe.Record{Device: dev, Bytes: 128 * kib, Sector: uint64(fi)<<30 + i*spr, Offset: i * 128 * kib,
						Issue: now, Latency: lat, Depth: 2, Kind: probe.KindFile, File: files[fi]})
				}
				now += 10 * time.Millisecond
			}
			snap := d.Evaluate(now)
			if sec == 19 {
				var out []Regime
				for _, r := range snap.Regimes {
					if r.Kind == FileLatencyShift {
						out = append(out, r)
					}
				}
				return out
			}
		}
		return nil
	}
	assert.Empty(t, run(2), "two files slow at once, no normal peer")
	assert.Len(t, run(1), 1, "one file slow, read alone")
}
