package probe

import (
	"context"
	"fmt"
	"os"
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
		Name:       what + "_" + tp[:8],
		Type:       ebpf.Tracing,
		AttachType: ebpf.AttachTraceRawTp,
		AttachTo:   tp,
		License:    "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
	})
	require.NoError(t, err)
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	require.NoError(t, err)
	return prog, l
}

// TestBenchProbeCost prints what the BPF programs cost per block read
// request, from the kernel's BPF run-time statistics, while reading a few
// hundred MB from a loop device the test creates. It asserts nothing about
// the figures (this VM is shared and noisy): see docs/probe.md.
// Run with READAHEADD_BENCH=1 as root (make bench-probe).
func TestBenchProbeCost(t *testing.T) {
	if os.Getenv("READAHEADD_BENCH") == "" {
		t.Skip("benchmark: set READAHEADD_BENCH=1 (make bench-probe)")
	}
	needRoot(t, "loads BPF programs and creates a loop device")
	l := newLab(t, 640)
	var paths []string
	for i := range 4 {
		p, _ := l.writeFile(t, fmt.Sprintf("f%d", i), mb(128))
		paths = append(paths, p)
	}
	dropCaches(t)

	// BPF_ENABLE_STATS (Config.EnableStats) turns run-time accounting on
	// for as long as the descriptor is open: the same counters as
	// kernel.bpf_stats_enabled=1, restored by the kernel when the probe
	// closes, even if the test dies.
	// No device filter: every run of the block programs then traces a
	// request (the loop device's and, below it, the disk's).
	p, err := Load(Config{EnableStats: true})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	eIssue, lIssue := emptyTracing(t, "block_rq_issue")
	t.Cleanup(func() { lIssue.Close(); eIssue.Close() })
	eDone, lDone := emptyTracing(t, "block_rq_complete")
	t.Cleanup(func() { lDone.Close(); eDone.Close() })
	cDone, lcDone := clockTracing(t, "block_rq_complete")
	t.Cleanup(func() { lcDone.Close(); cDone.Close() })

	var c collector
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, &c) }()
	start := time.Now()
	// 128 KiB reads with readahead off for the file (FADV_RANDOM): one
	// 128 KiB request per read, whatever the device's window, without
	// touching device settings.
	for _, path := range paths {
		readChunks(t, path, 128<<10)
	}
	elapsed := time.Since(start)
	time.Sleep(300 * time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	s, err := p.Stats()
	require.NoError(t, err)
	ds := s.Devices[l.Dev]
	emptyIssue, err := eIssue.Stats()
	require.NoError(t, err)
	emptyDone, err := eDone.Stats()
	require.NoError(t, err)
	clockDone, err := cDone.Stats()
	require.NoError(t, err)
	per := func(ps ProgramStats) float64 {
		if ps.Runs == 0 {
			return 0
		}
		return float64(ps.RunTime.Nanoseconds()) / float64(ps.Runs)
	}
	pi, pc := s.Programs[ProgBlockRqIssue], s.Programs[ProgBlockRqComplete]
	ei := ProgramStats{Runs: emptyIssue.RunCount, RunTime: emptyIssue.Runtime}
	ec := ProgramStats{Runs: emptyDone.RunCount, RunTime: emptyDone.Runtime}
	fmt.Printf("probe cost: read %s in %d requests (%.0f MB/s, %d records streamed, lost %d)\n",
		fmtMB(ds.Bytes), ds.Requests, float64(ds.Bytes)/(1<<20)/elapsed.Seconds(), len(c.recs), s.Lost.Total())
	for _, name := range []string{ProgBlockRqIssue, ProgBlockRqComplete, ProgBlockRqRequeue, ProgPageCacheSyncRa, ProgPageCacheAsyncRa} {
		ps := s.Programs[name]
		fmt.Printf("probe cost: %-20s %8d runs %7.0f ns/run\n", name, ps.Runs, per(ps))
	}
	fmt.Printf("probe cost: %-20s %8d runs %7.0f ns/run\n", "empty block_rq_issue", ei.Runs, per(ei))
	fmt.Printf("probe cost: %-20s %8d runs %7.0f ns/run\n", "empty block_rq_complete", ec.Runs, per(ec))
	cc := ProgramStats{Runs: clockDone.RunCount, RunTime: clockDone.Runtime}
	fmt.Printf("probe cost: %-20s %8d runs %7.0f ns/run\n", "one clock read (complete)", cc.Runs, per(cc))
	var reqs uint64
	for _, d := range s.Devices {
		reqs += d.Requests
	}
	if reqs > 0 {
		perReq := float64((pi.RunTime + pc.RunTime).Nanoseconds()) / float64(reqs)
		base := per(ei) + per(ec)
		fmt.Printf("probe cost: issue+complete %.0f ns per run pair, %.0f ns per traced read request (%d on all disks); empty-program baseline %.0f ns; target <= 300 ns\n",
			per(pi)+per(pc), perReq, reqs, base)
	}
	require.NotZero(t, ds.Requests, "no requests traced on %s", l.Loop)
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
