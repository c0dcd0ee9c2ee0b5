package probe

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// emptyTracing loads and attaches a tp_btf program that returns at once:
// the fixed cost of a BPF program run (trampoline and run-time accounting)
// on this machine, measured side by side with the probe.
func emptyTracing(t testing.TB, tp string) (*ebpf.Program, link.Link) {
	return baseline(t, tp, "empty", asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()})
}

// clockTracing is a tp_btf program that only reads bpf_ktime_get_ns: what
// one clock read costs here, the floor under any latency measurement.
func clockTracing(t testing.TB, tp string) (*ebpf.Program, link.Link) {
	return baseline(t, tp, "clock", asm.Instructions{asm.FnKtimeGetNs.Call(), asm.Mov.Imm(asm.R0, 0), asm.Return()})
}

func baseline(t testing.TB, tp, what string, insns asm.Instructions) (*ebpf.Program, link.Link) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         what + "_" + tp[:8],
		Type:         ebpf.Tracing,
		AttachType:   ebpf.AttachTraceRawTp,
		AttachTo:     tp,
		License:      "GPL",
		Instructions: insns,
	})
	require.NoError(t, err)
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	require.NoError(t, err)
	return prog, l
}

// benchVariant is one build of the probe under comparison: the embedded
// object (through Load, streaming to a reader) or, for A/B comparisons
// during development, another build of bpf/probe.bpf.c named in
// READAHEADD_BENCH_OBJS (comma-separated paths to .o files).
type benchVariant struct {
	name string
	// attach loads and attaches the variant's block programs and returns
	// them by name, with a function that detaches and unloads them.
	attach func(t *testing.T) (map[string]*ebpf.Program, func())
}

func embeddedVariant() benchVariant {
	return benchVariant{name: "probe (embedded)", attach: func(t *testing.T) (map[string]*ebpf.Program, func()) {
		// No device filter: every run of the block programs then traces a
		// request (the loop device's and, below it, the disk's).
		p, err := Load(Config{})
		require.NoError(t, err)
		var c collector
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx, &c) }()
		progs := map[string]*ebpf.Program{}
		for _, a := range p.attachments() {
			progs[a.name] = a.prog
		}
		return progs, func() {
			cancel()
			require.NoError(t, <-done)
			s, err := p.Stats()
			require.NoError(t, err)
			c.mu.Lock()
			n := len(c.recs)
			c.mu.Unlock()
			var reqs uint64
			for _, d := range s.Devices {
				reqs += d.Requests
			}
			fmt.Printf("probe cost:   %d requests traced on all disks, %d records streamed, lost %d (%+v)\n", reqs, n, s.Lost.Total(), s.Lost)
			require.NoError(t, p.Close())
		}
	}}
}

func objectVariant(path string) benchVariant {
	return benchVariant{name: filepath.Base(path), attach: func(t *testing.T) (map[string]*ebpf.Program, func()) {
		spec, err := ebpf.LoadCollectionSpec(path)
		require.NoError(t, err)
		cfg, err := Config{}.withDefaults()
		require.NoError(t, err)
		require.NoError(t, cfg.configure(spec))
		coll, err := ebpf.NewCollection(spec)
		require.NoError(t, err, "load %s", path)
		var links []link.Link
		progs := map[string]*ebpf.Program{}
		for _, name := range []string{ProgBlockRqIssue, ProgBlockRqComplete, ProgBlockRqRequeue} {
			if coll.Programs[name] == nil {
				continue // a build without this program (the present one runs at completion only)
			}
			l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[name]})
			require.NoError(t, err, "attach %s of %s", name, path)
			links = append(links, l)
			progs[name] = coll.Programs[name]
		}
		return progs, func() {
			for _, l := range links {
				l.Close()
			}
			coll.Close()
		}
	}}
}

func perRun(ps *ebpf.ProgramStats) float64 {
	if ps == nil || ps.RunCount == 0 {
		return 0
	}
	return float64(ps.Runtime.Nanoseconds()) / float64(ps.RunCount)
}

// TestBenchProbeCost prints what the BPF programs cost per block read
// request, from the kernel's BPF run-time statistics, while reading 512 MB
// from a loop device the test creates, in READAHEADD_BENCH_ROUNDS rounds
// (default 3). Each round measures every variant in turn (rotating the
// order), each with freshly attached empty programs on the same tracepoints
// as the baseline of the same reads. The variants are the probe, the
// reference design for block latency (request hash map and log2 histogram)
// and that design's hash map alone (refdesign_test.go), plus the builds
// named in READAHEADD_BENCH_OBJS. It asserts nothing about the figures
// (this VM is shared and noisy): see docs/probe.md.
// Run with READAHEADD_BENCH=1 as root (make bench-probe).
func TestBenchProbeCost(t *testing.T) {
	if os.Getenv("READAHEADD_BENCH") == "" {
		t.Skip("benchmark: set READAHEADD_BENCH=1 (make bench-probe)")
	}
	needRoot(t, "loads BPF programs and creates a loop device")
	rounds := 3
	if v := os.Getenv("READAHEADD_BENCH_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "READAHEADD_BENCH_ROUNDS")
		rounds = n
	}
	// The reference design and its hash map alone are measured in the
	// same rounds: the floor, on this machine, of the design the probe
	// follows (refdesign_test.go).
	variants := []benchVariant{embeddedVariant(), refVariant(t, true), refVariant(t, false)}
	if v := os.Getenv("READAHEADD_BENCH_OBJS"); v != "" {
		for _, p := range strings.Split(v, ",") {
			variants = append(variants, objectVariant(p))
		}
	}

	l := newLab(t, 640)
	var paths []string
	for i := range 4 {
		p, _ := l.writeFile(t, fmt.Sprintf("f%d", i), mb(128))
		paths = append(paths, p)
	}
	// Run-time accounting on for the whole test: the same counters as
	// kernel.bpf_stats_enabled=1, switched off by the kernel when the
	// descriptor closes, even if the test dies.
	st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })

	type figure struct{ issue, complete, emptyPair, clock float64 }
	summary := make([]map[string]figure, rounds)
	for r := range rounds {
		summary[r] = map[string]figure{}
		for i := range variants {
			v := variants[(i+r)%len(variants)]
			for _, p := range paths {
				evict(t, p)
			}
			progs, detach := v.attach(t)
			eIssue, lIssue := emptyTracing(t, "block_rq_issue")
			eDone, lDone := emptyTracing(t, "block_rq_complete")
			cDone, lcDone := clockTracing(t, "block_rq_complete")
			start := time.Now()
			// 128 KiB reads with readahead off for the file (FADV_RANDOM):
			// one 128 KiB request per read, whatever the device's window,
			// without touching device settings.
			for _, p := range paths {
				readChunks(t, p, 128<<10)
			}
			elapsed := time.Since(start)
			time.Sleep(300 * time.Millisecond)
			stats := map[string]*ebpf.ProgramStats{}
			for name, p := range progs {
				s, err := p.Stats()
				require.NoError(t, err)
				stats[name] = s
			}
			ei, err := eIssue.Stats()
			require.NoError(t, err)
			ec, err := eDone.Stats()
			require.NoError(t, err)
			cc, err := cDone.Stats()
			require.NoError(t, err)
			lIssue.Close()
			eIssue.Close()
			lDone.Close()
			eDone.Close()
			lcDone.Close()
			cDone.Close()
			fmt.Printf("probe cost: round %d, %s (512 MB in %.2f s):\n", r+1, v.name, elapsed.Seconds())
			detach()
			for _, name := range []string{ProgBlockRqIssue, ProgBlockRqComplete, ProgBlockRqRequeue, ProgPageCacheSyncRa, ProgPageCacheAsyncRa, ProgPageCacheRaOrder} {
				if s := stats[name]; s != nil && s.RunCount > 0 {
					fmt.Printf("probe cost:   %-26s %8d runs %6.0f ns/run\n", name, s.RunCount, perRun(s))
				}
			}
			fmt.Printf("probe cost:   %-26s %8d runs %6.0f ns/run\n", "empty block_rq_issue", ei.RunCount, perRun(ei))
			fmt.Printf("probe cost:   %-26s %8d runs %6.0f ns/run\n", "empty block_rq_complete", ec.RunCount, perRun(ec))
			fmt.Printf("probe cost:   %-26s %8d runs %6.0f ns/run\n", "clock read (complete)", cc.RunCount, perRun(cc))
			pi, pc := stats[ProgBlockRqIssue], stats[ProgBlockRqComplete]
			require.NotZero(t, pc.RunCount, "no block requests seen on %s", l.Loop)
			fmt.Printf("probe cost:   issue+complete %.0f ns per request (target <= 300); empty pair %.0f ns\n",
				perRun(pi)+perRun(pc), perRun(ei)+perRun(ec))
			summary[r][v.name] = figure{perRun(pi), perRun(pc), perRun(ei) + perRun(ec), perRun(cc)}
		}
	}
	fmt.Printf("probe cost: summary, ns per run (issue + complete = pair; empty pair and clock read measured beside each):\n")
	for r, figs := range summary {
		for _, v := range variants {
			f := figs[v.name]
			fmt.Printf("probe cost:   round %d %-30s %4.0f + %4.0f = %4.0f   empty pair %4.0f   clock %3.0f\n",
				r+1, v.name, f.issue, f.complete, f.issue+f.complete, f.emptyPair, f.clock)
		}
	}
}

// evict writes back and drops path's pages from the page cache, so that
// its reads hit the device (this file only: other tests' caches stay).
func evict(t testing.TB, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Sync())
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
}

// readChunks reads path in chunk-sized reads with the file's readahead off.
func readChunks(t testing.TB, path string, chunk int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM))
	buf := make([]byte, chunk)
	for {
		n, err := f.Read(buf)
		if n == 0 || err != nil {
			return
		}
	}
}
