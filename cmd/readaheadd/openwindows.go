package main

import (
	"log/slog"
	"os"
	"sort"
	"strconv"

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

// openFiles walks, at each call, the open regular files on the disks in
// keep (every disk when keep is empty): it counts them by the window in
// force the kernel holds for them, and lists those above their disk's
// read_ahead_kb. Files on a partition count for its disk.
func openFiles(it *fileras.Iter, sys blockdev.SysFS, keep map[string]bool, log *slog.Logger) func() metrics.OpenFiles {
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
