package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Every thread of the daemon runs at the niceness asked for, a thread
// started after it too; one started nicer keeps its niceness, and 0 changes
// nothing. Each case runs in a child process that first takes its starting
// niceness (a niceness cannot be lowered back without privilege; under a
// niced test run, the run's niceness is the floor).
func TestYieldCPUSetsEveryThread(t *testing.T) {
	if ask := os.Getenv("READAHEADD_YIELD_CHILD"); ask != "" {
		var start, n int
		_, _ = fmt.Sscanf(ask, "%d %d", &start, &n)
		os.Exit(yieldChild(start, n))
	}
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	require.NoError(t, err)
	base := 20 - prio
	for _, tc := range []struct{ start, ask, want int }{{0, 7, 7}, {12, 7, 12}, {3, 0, 3}, {0, 19, 19}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestYieldCPUSetsEveryThread$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("READAHEADD_YIELD_CHILD=%d %d", tc.start, tc.ask))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "started at %d, asked %d: %s", tc.start, tc.ask, out)
		assert.Contains(t, string(out), fmt.Sprintf("every thread at niceness %d ", max(tc.want, base)), "started at %d, asked %d", tc.start, tc.ask)
	}
}

// yieldChild holds threads of its own, takes niceness start, yields to n,
// starts one more thread and reports the niceness of every thread.
func yieldChild(start, n int) int {
	hold := make(chan struct{})
	defer close(hold)
	lockThread := func() {
		started := make(chan struct{})
		go func() { runtime.LockOSThread(); close(started); <-hold }()
		<-started
	}
	for range 4 {
		lockThread()
	}
	if err := yieldCPU(start); err != nil {
		fmt.Println(err)
		return 1
	}
	if err := yieldCPU(n); err != nil {
		fmt.Println(err)
		return 1
	}
	lockThread()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	seen := map[int]int{}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil {
			seen[20-prio]++
		}
	}
	if len(seen) != 1 || len(tasks) < 6 {
		fmt.Printf("threads by niceness: %v (%d threads)\n", seen, len(tasks))
		return 1
	}
	for nice := range seen {
		fmt.Printf("every thread at niceness %d (%d threads)\n", nice, len(tasks))
	}
	return 0
}
