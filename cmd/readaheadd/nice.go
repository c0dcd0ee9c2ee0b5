package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// yieldCPU sets every thread of the daemon to niceness n, keeping a higher
// one it was started with (0: nothing changes). Linux keeps a niceness per
// thread and a new thread takes its creator's, so the threads that exist
// now are set once, before the probe and the control loop start: their
// bursts of work (a Step, a scan of descriptors) then wait behind the
// services whose reads they serve, not the reverse.
func yieldCPU(n int) error {
	if n == 0 {
		return nil
	}
	// A thread not yet set may start another while the list is read, and
	// the new one takes the creator's niceness: pass again until a pass
	// finds every thread set.
	for range 8 {
		set, err := yieldPass(n)
		if err != nil || set == 0 {
			return err
		}
	}
	return nil
}

// yieldPass sets the threads listed now below niceness n, returning how
// many it set.
func yieldPass(n int) (int, error) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, fmt.Errorf("list the daemon's threads to lower their CPU priority: %w", err)
	}
	set := 0
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		// The raw syscall reports 20 - niceness.
		prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
		if err != nil || 20-prio >= n {
			continue // gone, or started nicer than n
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil {
			return set, fmt.Errorf("set thread %d to niceness %d: %w (start it at that niceness, e.g. systemd's Nice=, or give --nice 0)", tid, n, err)
		}
		set++
	}
	return set, nil
}
