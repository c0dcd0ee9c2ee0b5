package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/test/lab"
)

// TestMixedDeviceFrontier maps what a mixed device can give both of its
// readers: a sequential stream (its file slowed by each of the extra
// latencies) at each stream window, beside an mmap random reader at its
// read-around window (the device's 128 KB) or trimmed (16 KB). For each
// point it prints the stream's MB/s, the random reader's touches/s and
// touch p99, and the block-layer latency of the random reader's requests
// (what the tuner's random-reader budget works from, docs/tuner-rules.md). Root,
// about 4 minutes with the defaults: `make bench-frontier`.
//
// READAHEADD_FRONTIER_WS, _WR, _EXTRA_US: comma-separated stream windows
// (KB), random reader windows (KB) and extra latencies (us).
func TestMixedDeviceFrontier(t *testing.T) {
	if os.Getenv("READAHEADD_BENCH") != "frontier" {
		t.Skip("set READAHEADD_BENCH=frontier (root) to map the mixed device (make bench-frontier)")
	}
	if err := lab.Available(); err != nil {
		t.Skipf("lab unavailable: %v", err)
	}
	ws := envInts(t, "READAHEADD_FRONTIER_WS", "128,192,256,384")
	wr := envInts(t, "READAHEADD_FRONTIER_WR", "16,128")
	extras := envInts(t, "READAHEADD_FRONTIER_EXTRA_US", "0,1500,3000")
	l, err := lab.Up(lab.Options{SizeBytes: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	seq, err := l.WriteFile("seq.dat", 256)
	if err != nil {
		t.Fatal(err)
	}
	rndPath, err := l.WriteFile("random.dat", 512)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(rndPath)
	if err != nil {
		t.Fatal(err)
	}
	rndIno := st.Sys().(*syscall.Stat_t).Ino
	fmt.Println("extra_us rnd_kb seq_kb | seq MB/s | touches/s touch_p50 touch_p99 ms | block: rnd req/s p50 p95 p99 mean ms | seq p50 p99 ms")
	for _, ex := range extras {
		for _, r := range wr {
			for _, s := range ws {
				p := frontierPoint(t, l, seq, rndPath, rndIno, time.Duration(ex)*time.Microsecond, r, s)
				fmt.Printf("FRONTIER %d %d %d | %.1f | %.0f %.2f %.2f | %.0f %.2f %.2f %.2f %.2f | %.2f %.2f\n", ex, r, s, p.seqMBps,
					p.touches, ms(p.touchP50), ms(p.touchP99), p.rndReq, ms(p.rndP50), ms(p.rndP95), ms(p.rndP99), ms(p.rndMean), ms(p.seqP50), ms(p.seqP99))
			}
		}
	}
}

type frontier struct {
	seqMBps, touches, rndReq        float64
	touchP50, touchP99              time.Duration
	rndP50, rndP95, rndP99, rndMean time.Duration
	seqP50, seqP99                  time.Duration
}

// frontierPoint measures one point: the random reader opened at rKB, the
// stream at sKB (a file copies read_ahead_kb when it is opened), the
// stream's file slowed by extra; 1 s of warm-up, 6 s measured.
func frontierPoint(t *testing.T, l *lab.Lab, seq, rndPath string, rndIno uint64, extra time.Duration, rKB, sKB int) frontier {
	t.Helper()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(l.Clear())
	must(lab.DropFileCache(seq))
	must(lab.DropFileCache(rndPath))
	must(l.SetReadAheadKB(rKB))
	rnd, err := openMmapRandom(rndPath)
	must(err)
	defer rnd.Close()
	must(l.SetReadAheadKB(sKB))
	ss, err := openSeqStream(seq, false)
	must(err)
	defer ss.Close()
	must(l.SetReadAheadKB(DefaultKB))
	if extra > 0 {
		must(l.SetPermanent(extra, seq))
	}
	defer func() { must(l.Clear()) }()
	capt, err := startCapture(l.Dev)
	must(err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = ss.run(ctx) }()
	go func() { defer wg.Done(); _ = rnd.run(ctx, 42) }()
	time.Sleep(time.Second)
	t0, m0, b0 := time.Now(), clock.Monotonic{}.Now(), ss.bytes.Load()
	time.Sleep(6 * time.Second)
	el, b1 := time.Since(t0), ss.bytes.Load()
	cancel()
	wg.Wait()
	touch := rnd.since(t0)
	var rl, sl []time.Duration
	for _, rc := range capt.stop() {
		if rc.Issue < m0 || rc.Kind != probe.KindFile {
			continue
		}
		if rc.File.Ino == rndIno {
			rl = append(rl, rc.Latency)
		} else {
			sl = append(sl, rc.Latency)
		}
	}
	if os.Getenv("READAHEADD_FRONTIER_PER_SECOND") != "" {
		// The random reader's p99 in each second of the measured period.
		var per [6][]time.Duration
		for _, rc := range capt.recs {
			if rc.Issue >= m0 && rc.Kind == probe.KindFile && rc.File.Ino == rndIno {
				if i := int((rc.Issue - m0) / time.Second); i >= 0 && i < len(per) {
					per[i] = append(per[i], rc.Latency)
				}
			}
		}
		var line []string
		for _, xs := range per {
			sort.Slice(xs, func(i, j int) bool { return xs[i] < xs[j] })
			line = append(line, fmt.Sprintf("%.2f", ms(lab.Quantile(xs, 0.99))))
		}
		fmt.Printf("PERSECOND extra=%v rnd=%d seq=%d p99/s: %s\n", extra, rKB, sKB, strings.Join(line, " "))
	}
	sort.Slice(rl, func(i, j int) bool { return rl[i] < rl[j] })
	sort.Slice(sl, func(i, j int) bool { return sl[i] < sl[j] })
	var sum time.Duration
	for _, x := range rl {
		sum += x
	}
	p := frontier{seqMBps: float64(b1-b0) / el.Seconds() / 1e6, touches: float64(len(touch)) / el.Seconds(),
		touchP50: lab.Quantile(touch, 0.5), touchP99: lab.Quantile(touch, 0.99), rndReq: float64(len(rl)) / el.Seconds(),
		rndP50: lab.Quantile(rl, 0.5), rndP95: lab.Quantile(rl, 0.95), rndP99: lab.Quantile(rl, 0.99),
		seqP50: lab.Quantile(sl, 0.5), seqP99: lab.Quantile(sl, 0.99)}
	if len(rl) > 0 {
		p.rndMean = sum / time.Duration(len(rl))
	}
	return p
}

func envInts(t *testing.T, name, def string) []int {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatalf("%s: %q is not a number", name, f)
		}
		out = append(out, n)
	}
	return out
}
