package main

import (
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/fileras"
	"github.com/readaheadd/readaheadd/pkg/metrics"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/tuner"
)

// raStates is the tuner's view of the kernel's per-file readahead state,
// nil (no interface value) without an iterator.
func raStates(it *fileras.Iter) tuner.RAStates {
	if it == nil {
		return nil
	}
	return fileras.States{It: it}
}

// censusShare bounds what the census costs: it walks every process's open
// files (about 0.7 us each here: 70 ms for 100,000), so a count is reused
// for 100 times its walk's duration (1% of a core however often /metrics
// or /debug/status is read), and at least a second.
const (
	censusShare  = 100
	censusReused = time.Second
)

// fileOps reaches other processes' open files: through /proc, and with
// the iterator for searches of every process.
func fileOps(it *fileras.Iter) tuner.FileOps {
	if it == nil {
		return tuner.NewProcFileOps()
	}
	return fileras.NewFileOps(it)
}

// openFileWindows counts the open regular files on the disks in keep
// (every disk when keep is empty) by the window the kernel holds for them.
// Files on a partition count for its disk.
func openFileWindows(it *fileras.Iter, sys blockdev.SysFS, keep map[string]bool, log *slog.Logger) func() []metrics.OpenWindows {
	var (
		mu   sync.Mutex
		last []metrics.OpenWindows
		at   time.Time
		took time.Duration
	)
	count := countOpenWindows(it, sys, keep, log)
	return func() []metrics.OpenWindows {
		mu.Lock()
		defer mu.Unlock()
		if !at.IsZero() && time.Since(at) < max(censusReused, censusShare*took) {
			return last
		}
		start := time.Now()
		last = count()
		at, took = time.Now(), time.Since(start)
		return last
	}
}

func countOpenWindows(it *fileras.Iter, sys blockdev.SysFS, keep map[string]bool, log *slog.Logger) func() []metrics.OpenWindows {
	disk := map[probe.Dev]string{} // s_dev -> disk name, "" for none (tmpfs, overlay...)
	return func() []metrics.OpenWindows {
		fs, err := it.Files(fileras.Query{AllDevs: true})
		if err != nil {
			log.Warn("could not read the open files' readahead windows", "err", err)
			return nil
		}
		counts := map[metrics.OpenWindows]int{}
		for _, f := range fs {
			name, ok := disk[f.Key.Dev]
			if !ok {
				if d, err := sys.DiskOf(f.Key.Dev); err == nil {
					name = d.Name
				}
				disk[f.Key.Dev] = name
			}
			if name == "" || len(keep) > 0 && !keep[name] {
				continue
			}
			counts[metrics.OpenWindows{Device: name, WindowKB: f.WindowKB()}]++
		}
		out := make([]metrics.OpenWindows, 0, len(counts))
		for k, n := range counts {
			k.Files = n
			out = append(out, k)
		}
		sort.Slice(out, func(i, j int) bool {
			if out[i].Device != out[j].Device {
				return out[i].Device < out[j].Device
			}
			return out[i].WindowKB < out[j].WindowKB
		})
		return out
	}
}
