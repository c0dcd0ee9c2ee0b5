package main

import (
	"log/slog"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/fileras"
	"github.com/readaheadd/readaheadd/pkg/metrics"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// raStates is the tuner's view of the kernel's per-file readahead state,
// nil (no interface value) without an iterator.
func raStates(it *fileras.Iter) actuate.RAStates {
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
func fileOps(it *fileras.Iter) actuate.FileOps {
	if it == nil {
		return actuate.NewProcFileOps()
	}
	return fileras.NewFileOps(it)
}

// openFiles is the census of open files (countOpenFiles), reused while
// it is recent.
func openFiles(it *fileras.Iter, sys blockdev.SysFS, keep map[string]bool, log *slog.Logger) func() metrics.OpenFiles {
	var (
		mu   sync.Mutex
		last metrics.OpenFiles
		at   time.Time
		took time.Duration
	)
	count := countOpenFiles(it, sys, keep, log)
	return func() metrics.OpenFiles {
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

// countOpenFiles walks, at each call, the open regular files on the disks in
// keep (every disk when keep is empty): it counts them by the window in
// force the kernel holds for them, and lists those above their disk's
// read_ahead_kb. Files on a partition count for its disk.
func countOpenFiles(it *fileras.Iter, sys blockdev.SysFS, keep map[string]bool, log *slog.Logger) func() metrics.OpenFiles {
	disk := map[probe.Dev]string{} // s_dev -> disk name, "" for none (tmpfs, overlay...)
	return func() metrics.OpenFiles {
		fs, err := it.Files(fileras.Query{AllDevs: true})
		if err != nil {
			log.Warn("could not read the open files' readahead windows", "err", err)
			return metrics.OpenFiles{}
		}
		out := metrics.OpenFiles{AboveCount: map[string]int{}}
		counts := map[metrics.OpenWindows]int{}
		devKB := map[string]int{} // read_ahead_kb per disk, this walk
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
			counts[metrics.OpenWindows{Device: name, WindowKB: f.InForceKB()}]++
			kb, ok := devKB[name]
			if !ok {
				if kb, err = sys.ReadAheadKB(name); err != nil {
					kb = -1 // unreadable: no file is called above it
				}
				devKB[name] = kb
			}
			if kb < 0 || f.InForceKB() <= kb {
				continue
			}
			out.AboveCount[name]++
			if len(out.Above) < metrics.MaxAboveListed {
				path, _ := os.Readlink("/proc/" + strconv.FormatUint(uint64(f.Tgid), 10) + "/fd/" + strconv.Itoa(f.FD))
				out.Above = append(out.Above, metrics.OpenFileAbove{Device: name, DeviceKB: kb, PID: f.Tgid, FD: f.FD, Path: path,
					RAPagesKB: f.WindowKB(), StreamKB: f.SizeKB()})
			}
		}
		out.Windows = make([]metrics.OpenWindows, 0, len(counts))
		for k, n := range counts {
			k.Files = n
			out.Windows = append(out.Windows, k)
		}
		sort.Slice(out.Windows, func(i, j int) bool {
			if out.Windows[i].Device != out.Windows[j].Device {
				return out.Windows[i].Device < out.Windows[j].Device
			}
			return out.Windows[i].WindowKB < out.Windows[j].WindowKB
		})
		return out
	}
}
