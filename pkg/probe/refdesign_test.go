package probe

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/require"
)

// The reference design for block latency in BPF (the one bcc's
// libbpf-tools biolatency follows): at issue, the clock stored in a hash
// map keyed by the request's address; at completion, looked up, the
// latency's log2 slot incremented in a histogram, the entry deleted.
// Written here as raw instructions, with nothing the probe adds (no disk
// filter, depth, attribution, ring record), to measure side by side with
// the probe what the design alone costs on this machine.

const (
	// refSlots is the histogram's size: log2 of microseconds, the last
	// slot taking everything from 2^31 us up.
	refSlots = 32
	// refInFlight is the request map's capacity (biolatency's too).
	refInFlight = 10240
)

// The reference design's maps. The request map: request address -> u64,
// preallocated (the hash map's default), as in the reference. The
// histogram: refSlots u64 counters; the reference keeps its histograms in a
// hash map keyed by disk and flags, one key when not per disk; a one-entry
// array is the cheapest form of that.
var (
	refStartSpec = ebpf.MapSpec{Name: "ref_start", Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: refInFlight}
	refHistSpec  = ebpf.MapSpec{Name: "ref_hist", Type: ebpf.Array, KeySize: 4, ValueSize: refSlots * 8, MaxEntries: 1}
)

// refMap creates one of the reference design's maps.
func refMap(t testing.TB, spec ebpf.MapSpec) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&spec)
	require.NoError(t, err, "create the reference design's map %s", spec.Name)
	return m
}

// mapPtr loads m's address into dst. The instruction holds m itself, not
// only its descriptor, so that m stays open until the program is loaded.
func mapPtr(dst asm.Register, m *ebpf.Map) asm.Instruction {
	ins := asm.LoadMapPtr(dst, 0)
	if err := ins.AssociateMap(m); err != nil {
		panic(err) // LoadMapPtr is a map load
	}
	return ins
}

// refIssue stores the request's address (the tracepoint's first argument,
// at offset 0 of a tp_btf context) with a value in the request map: the
// clock when clock is set (the reference), 0 otherwise (the map's cost
// alone).
func refIssue(start *ebpf.Map, clock bool) asm.Instructions {
	insns := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, 0, asm.DWord),
		asm.StoreMem(asm.RFP, -8, asm.R6, asm.DWord),
	}
	if clock {
		insns = append(insns,
			asm.FnKtimeGetNs.Call(),
			asm.StoreMem(asm.RFP, -16, asm.R0, asm.DWord),
		)
	} else {
		insns = append(insns,
			asm.Mov.Imm(asm.R1, 0),
			asm.StoreMem(asm.RFP, -16, asm.R1, asm.DWord),
		)
	}
	return append(insns,
		mapPtr(asm.R1, start),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -16),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
}

// refComplete finds the request in the request map and deletes it; with a
// histogram (the reference), it first adds the latency in microseconds to
// the histogram's log2 slot.
func refComplete(start, hist *ebpf.Map) asm.Instructions {
	insns := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, 0, asm.DWord),
		asm.StoreMem(asm.RFP, -8, asm.R6, asm.DWord),
	}
	if hist != nil {
		insns = append(insns,
			asm.FnKtimeGetNs.Call(),
			asm.Mov.Reg(asm.R7, asm.R0),
		)
	}
	insns = append(insns,
		mapPtr(asm.R1, start),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "exit"),
	)
	if hist != nil {
		insns = append(insns,
			asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
			asm.Sub.Reg(asm.R7, asm.R1),
			asm.JSLT.Imm(asm.R7, 0, "delete"),
			asm.Div.Imm(asm.R7, 1000),
			asm.Mov.Imm(asm.R8, 0),
		)
		// log2 by halving: for k = 32, 16, ... 1, if v >> k is not zero,
		// v >>= k and slot += k.
		for k := int32(32); k >= 1; k /= 2 {
			skip := fmt.Sprintf("log2_%d", k)
			insns = append(insns,
				asm.Mov.Reg(asm.R1, asm.R7),
				asm.RSh.Imm(asm.R1, k),
				asm.JEq.Imm(asm.R1, 0, skip),
				asm.Mov.Reg(asm.R7, asm.R1),
				asm.Add.Imm(asm.R8, k),
				asm.Mov.Imm(asm.R0, 0).WithSymbol(skip),
			)
		}
		insns = append(insns,
			asm.JLE.Imm(asm.R8, refSlots-1, "slot"),
			asm.Mov.Imm(asm.R8, refSlots-1),
			asm.StoreImm(asm.RFP, -12, 0, asm.Word).WithSymbol("slot"),
			mapPtr(asm.R1, hist),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -12),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "delete"),
			asm.LSh.Imm(asm.R8, 3),
			asm.Add.Reg(asm.R0, asm.R8),
			asm.Mov.Imm(asm.R1, 1),
			asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0),
		)
	}
	return append(insns,
		mapPtr(asm.R1, start).WithSymbol("delete"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapDeleteElem.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("exit"),
		asm.Return(),
	)
}

// refVariant is the reference design (withHist) or its request map alone
// (issue: update; completion: lookup and delete), as a benchmark variant.
// Its maps are created once and kept for all rounds, as a tool's maps live
// as long as the tool: from the second round on, the map's preallocated
// elements have all been through the caches at least once.
func refVariant(t *testing.T, withHist bool) benchVariant {
	name, tag := "reference design (biolatency)", "ref"
	if !withHist {
		name, tag = "hash map only", "map"
	}
	start := refMap(t, refStartSpec)
	t.Cleanup(func() { start.Close() })
	var hist *ebpf.Map
	if withHist {
		hist = refMap(t, refHistSpec)
		t.Cleanup(func() { hist.Close() })
	}
	var counted uint64
	return benchVariant{name: name, attach: func(t *testing.T) (map[string]*ebpf.Program, func()) {
		progs := map[string]*ebpf.Program{}
		var closers []func() error
		for _, p := range []struct {
			name, tp string
			insns    asm.Instructions
		}{
			{ProgBlockRqIssue, "block_rq_issue", refIssue(start, withHist)},
			{ProgBlockRqComplete, "block_rq_complete", refComplete(start, hist)},
		} {
			prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
				Name:         tag + "_" + p.tp[9:],
				Type:         ebpf.Tracing,
				AttachType:   ebpf.AttachTraceRawTp,
				AttachTo:     p.tp,
				License:      "GPL",
				Instructions: p.insns,
			})
			require.NoError(t, err, "load %s's %s program", name, p.tp)
			l, err := link.AttachTracing(link.TracingOptions{Program: prog})
			require.NoError(t, err, "attach %s's %s program", name, p.tp)
			progs[p.name] = prog
			closers = append(closers, l.Close, prog.Close)
		}
		return progs, func() {
			for _, c := range closers {
				c()
			}
			// Requests in flight when the programs detached stay in the
			// map: a handful at most.
			var left int
			var k, v uint64
			for it := start.Iterate(); it.Next(&k, &v); {
				left++
			}
			if hist == nil {
				fmt.Printf("probe cost:   %s: %d requests left in the map\n", name, left)
				return
			}
			slots := make([]uint64, refSlots)
			require.NoError(t, hist.Lookup(uint32(0), &slots))
			var n uint64
			for _, c := range slots {
				n += c
			}
			fmt.Printf("probe cost:   %s: %d latencies added to the histogram, %d requests left in the map\n", name, n-counted, left)
			require.Greater(t, n, counted, "the reference design's completion recorded no latency")
			counted = n
		}
	}}
}
