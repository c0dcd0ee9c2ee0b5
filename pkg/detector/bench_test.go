package detector

import (
	"testing"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// benchRecords replays 10 s of the lab mix (a sequential reader and two
// random readers, ~16k records) as a fixed record stream.
func benchRecords(b *testing.B) []probe.Record {
	b.Helper()
	s2, _ := labMix(99)
	d := New(DefaultConfig())
	s2.run(d, 10*sec, interval, nil)
	// Recover the stream from the ring, oldest first.
	ds := d.devices[s2.dev]
	out := make([]probe.Record, 0, min(ds.n, uint64(len(ds.ring))))
	for k := uint64(0); k < min(ds.n, uint64(len(ds.ring))); k++ {
		sm := ds.ring[(ds.n-min(ds.n, uint64(len(ds.ring)))+k)%uint64(len(ds.ring))]
		r := probe.Record{Device: s2.dev, Bytes: sm.bytes, Issue: time.Duration(sm.issue()), Latency: time.Duration(sm.lat), Depth: sm.depth}
		if sm.slot != noSlot {
			f := &d.files[sm.slot]
			r.Kind, r.File, r.Offset, r.Sector = probe.KindFile, f.key, uint64(k)*uint64(sm.bytes), uint64(k)*uint64(sm.bytes)/512
		}
		out = append(out, r)
	}
	return out
}

// BenchmarkObserve measures the hot path: ns and allocations per record.
func BenchmarkObserve(b *testing.B) {
	recs := benchRecords(b)
	d := New(DefaultConfig())
	span := recs[len(recs)-1].Complete() - recs[0].Issue + time.Second
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := recs[i%len(recs)]
		shift := time.Duration(i/len(recs)) * span
		r.Issue += shift
		d.Observe(r)
	}
}

// BenchmarkEvaluate measures one evaluation over a full one-second window of
// the lab mix.
func BenchmarkEvaluate(b *testing.B) {
	recs := benchRecords(b)
	d := New(DefaultConfig())
	for _, r := range recs {
		d.Observe(r)
	}
	now := recs[len(recs)-1].Complete()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d.Evaluate(now)
	}
}
