package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/readaheadd/readaheadd/test/lab"
)

// TestTrialsCost measures what readaheadd's trials cost the readers of a
// device no larger window helps: a healthy device whose default window
// already reaches its bandwidth (one stream, 80 MB/s at 128 KB), and a
// device three streams fill together at the default window. A random mmap
// reader runs beside the streams in both. The arms alternate in segments
// of the same run, the default (no daemon) and readaheadd (one state
// directory for all its segments, so the capacity it learns and saves at
// its first shutdown is what later starts load, as after a restart). It
// prints, per device, the streams' total MB/s and the random reader's p99
// per arm and their ratios, against the goals: total at least 0.97 of the
// default's, p99 at most 1.10x. Root: `make bench-trialcost`.
//
// READAHEADD_TRIALCOST_MIN: minutes per arm (default 10); _SEG: segment
// length (default 60s); _CASES: "healthy", "saturated" or both (default).
func TestTrialsCost(t *testing.T) {
	work, bin := benchDaemon(t, "trialcost", "measure what trials cost")
	perArm := time.Duration(envInts(t, "READAHEADD_TRIALCOST_MIN", "10")[0]) * time.Minute
	seg, err := time.ParseDuration(envOr("READAHEADD_TRIALCOST_SEG", "60s"))
	if err != nil || seg <= 0 {
		t.Fatalf("READAHEADD_TRIALCOST_SEG: %v", err)
	}
	cases := map[string]struct {
		model   lab.Model
		streams int
	}{
		"healthy":   {lab.Model{BandwidthMBps: 80}, 1},
		"saturated": {lab.DefaultModel, 3},
	}
	for _, name := range strings.Split(envOr("READAHEADD_TRIALCOST_CASES", "healthy,saturated"), ",") {
		c, ok := cases[name]
		if !ok {
			t.Fatalf("READAHEADD_TRIALCOST_CASES: unknown case %q", name)
		}
		r := trialCost(t, bin, work, name, c.model, c.streams, perArm, seg)
		fmt.Println(r)
	}
}

// costArm sums one arm's segments.
type costArm struct {
	bytes int64
	secs  float64
	lat   []time.Duration
	segs  []string
}

func (a *costArm) mbps() float64 { return float64(a.bytes) / a.secs / 1e6 }

func (a *costArm) p99() time.Duration {
	sort.Slice(a.lat, func(i, j int) bool { return a.lat[i] < a.lat[j] })
	return lab.Quantile(a.lat, 0.99)
}

func trialCost(t *testing.T, bin, work, name string, m lab.Model, n int, perArm, seg time.Duration) string {
	l := upLab(t, lab.Options{SizeBytes: int64(n*512+1024) << 20, Model: m})
	defer func() { _ = l.Down() }() // before the next case's, not at the test's end
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(l.Mount, "data"), 0o755))
	var files []string
	for i := 0; i < n; i++ {
		p, err := l.WriteFile(filepath.Join("data", fmt.Sprintf("blk_%d", i)), 512)
		must(err)
		files = append(files, p)
	}
	rnd, err := l.WriteFile(filepath.Join("data", "index"), 512)
	must(err)
	must(l.SetReadAheadKB(128))
	state := filepath.Join(work, name+"-state")
	must(os.MkdirAll(state, 0o700))

	// One segment: the readers open their files afresh (with the device's
	// window), read for seg, and stop.
	segment := func(a *costArm, d *Daemon) {
		for _, f := range append(files, rnd) {
			must(lab.DropFileCache(f))
		}
		var ss []*seqStream
		for _, f := range files {
			s, err := openSeqStream(f, false)
			must(err)
			ss = append(ss, s)
		}
		mr, err := openMmapRandom(rnd)
		must(err)
		if d != nil {
			// The harness's status polls (pollEvery, a JSON status
			// each) are CPU the 2-core host's readers and lab would
			// share: the trials are counted from /metrics at the end.
			resume := d.Quiet()
			defer resume()
		}
		ctx, cancel := context.WithTimeout(context.Background(), seg)
		var wg sync.WaitGroup
		errs := make(chan error, n+1)
		start := time.Now()
		for _, s := range ss {
			wg.Add(1)
			go func(s *seqStream) { defer wg.Done(); errs <- s.run(ctx) }(s)
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs <- mr.run(ctx, uint64(start.UnixNano())) }()
		wg.Wait()
		cancel()
		secs := time.Since(start).Seconds()
		close(errs)
		for err := range errs {
			must(err)
		}
		var b int64
		for _, s := range ss {
			b += s.bytes.Load()
			s.Close()
		}
		lat := mr.since(start)
		mr.Close()
		a.bytes += b
		a.secs += secs
		a.lat = append(a.lat, lat...)
		note := ""
		if d != nil {
			trials, err := d.ActionsWith(`result="trial"`)
			must(err)
			note = fmt.Sprintf(", %.0f trials", trials)
		}
		a.segs = append(a.segs, fmt.Sprintf("%.1f MB/s p99 %.2f ms%s", float64(b)/secs/1e6, ms(lab.Quantile(lat, 0.99)), note))
	}
	var def, rad costArm
	for i := 0; time.Duration(i)*seg < perArm; i++ {
		segment(&def, nil)
		d, err := StartDaemonState(context.Background(), bin, l.Name, l.Mount, work, state)
		must(err)
		segment(&rad, d)
		must(d.Stop())
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s: %d stream(s) and a random mmap reader, device %.0f MB/s, %d x %v per arm, alternating\n", name, n, m.BandwidthMBps, len(def.segs), seg)
	for i := range def.segs {
		fmt.Fprintf(&b, "  segment %2d: default %s | readaheadd %s\n", i+1, def.segs[i], rad.segs[i])
	}
	total := rad.mbps() / def.mbps()
	p99 := float64(rad.p99()) / float64(def.p99())
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	fmt.Fprintf(&b, "  streams' total: default %.1f MB/s, readaheadd %.1f MB/s: %.3f of the default (goal >= 0.97: %s)\n", def.mbps(), rad.mbps(), total, verdict(total >= 0.97))
	fmt.Fprintf(&b, "  random reader p99: default %.2f ms, readaheadd %.2f ms: %.2fx (goal <= 1.10x: %s)\n", ms(def.p99()), ms(rad.p99()), p99, verdict(p99 <= 1.10))
	if caps, err := os.ReadFile(filepath.Join(state, "priors.json")); err == nil {
		fmt.Fprintf(&b, "  priors.json: %s\n", strings.Join(strings.Fields(string(caps)), " "))
	}
	return b.String()
}
