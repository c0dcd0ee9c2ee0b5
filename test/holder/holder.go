// Package holder runs processes that hold many descriptors open, for the
// tests of what other processes' open files cost the daemon. A holder is a
// copy of the running test binary: its TestMain calls Main first.
package holder

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"

	"golang.org/x/sys/unix"
)

const (
	countEnv = "READAHEADD_TEST_HOLD"
	fileEnv  = "READAHEADD_TEST_HOLD_FILE"
)

// Main makes this process a holder when Start asked for one: it opens the
// file that many times, says so, and exits when its stdin closes. Otherwise
// it returns at once.
func Main() {
	n, err := strconv.Atoi(os.Getenv(countEnv))
	if err != nil {
		return
	}
	os.Exit(hold(n, os.Getenv(fileEnv)))
}

func hold(n int, path string) int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Max < uint64(n+64) {
		fmt.Fprintf(os.Stderr, "RLIMIT_NOFILE's hard limit %d is below %d files: %v\n", lim.Max, n+64, err)
		return 1
	}
	lim.Cur = lim.Max
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		fmt.Fprintln(os.Stderr, "raise RLIMIT_NOFILE:", err)
		return 1
	}
	for i := 0; i < n; i++ {
		if _, err := unix.Open(path, unix.O_RDONLY, 0); err != nil {
			fmt.Fprintln(os.Stderr, "open:", err)
			return 1
		}
	}
	fmt.Println("ready")
	bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// Start starts procs holders of n descriptors each on path and waits until
// they hold them. stop ends them (call it even on error).
func Start(procs, n int, path string) (pids []int, stop func(), err error) {
	var cmds []*exec.Cmd
	var ins []io.Closer
	stop = func() {
		for _, in := range ins {
			in.Close()
		}
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}
	for i := 0; i < procs; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), countEnv+"="+strconv.Itoa(n), fileEnv+"="+path)
		in, err := cmd.StdinPipe()
		if err != nil {
			return pids, stop, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return pids, stop, err
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return pids, stop, fmt.Errorf("start a holder of %d files: %w", n, err)
		}
		cmds, ins = append(cmds, cmd), append(ins, in)
		pids = append(pids, cmd.Process.Pid)
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
			return pids, stop, fmt.Errorf("holder %d of %d files did not start: %q %v", i, n, line, err)
		}
	}
	return pids, stop, nil
}
