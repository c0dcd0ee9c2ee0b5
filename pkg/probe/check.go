package probe

import (
	"fmt"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// ProgramCheck is what Check found for one BPF program.
type ProgramCheck struct {
	Name     string
	Attach   string // the tracepoint, e.g. "tp_btf/block_rq_complete"
	Loaded   bool
	Attached bool
	Err      error // why not, wrapping ErrPermission/ErrTracepointMissing where it applies
	// Optional: the probe runs without this program, losing only what it
	// adds (page_cache_ra_order: the read-around of files a trim watches).
	Optional bool
}

// CheckReport is the outcome of Check.
type CheckReport struct {
	BTF      error // nil when the kernel has BTF
	Programs []ProgramCheck
}

// OK reports whether every program the probe needs loaded and attached.
func (r CheckReport) OK() bool {
	if r.BTF != nil || len(r.Programs) == 0 {
		return false
	}
	for _, p := range r.Programs {
		if !p.Attached && !p.Optional {
			return false
		}
	}
	return true
}

// Check loads and attaches each BPF program on its own, detaches it again,
// and reports per program what works on this machine, so that an operator
// sees every problem at once rather than the first. It changes nothing
// lasting and needs the same privileges as Load.
func Check() CheckReport {
	var rep CheckReport
	if err := checkBTF(); err != nil {
		rep.BTF = err
		return rep
	}
	cfg, _ := Config{}.withDefaults()
	spec, err := cfg.spec()
	if err != nil {
		rep.BTF = err
		return rep
	}
	names := make([]string, 0, len(spec.Programs))
	for n := range spec.Programs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		ps := spec.Programs[name]
		pc := ProgramCheck{Name: name, Attach: ps.SectionName, Optional: name == ProgPageCacheRaOrder}
		if pc.Optional && !hasTracepoint(name) {
			pc.Err = fmt.Errorf("%w: %w", ErrTracepointMissing, ErrNoReadAround)
			rep.Programs = append(rep.Programs, pc)
			continue
		}
		one := spec.Copy()
		for n := range one.Programs {
			if n != name {
				delete(one.Programs, n)
			}
		}
		coll, err := ebpf.NewCollection(one)
		if err != nil {
			pc.Err = classify("load "+name, err)
			rep.Programs = append(rep.Programs, pc)
			continue
		}
		pc.Loaded = true
		l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[name]})
		if err != nil {
			pc.Err = classify("attach "+name, err)
		} else {
			pc.Attached = true
			if cerr := l.Close(); cerr != nil {
				pc.Err = fmt.Errorf("detach %s: %w", name, cerr)
			}
		}
		coll.Close()
		rep.Programs = append(rep.Programs, pc)
	}
	return rep
}
