package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/fileras"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// attachCheck runs in a child process: it loads the iterator with every
// capability, keeps only the daemon's runtime set on the thread it then
// uses (as the daemon does on all), and attaches what a raise attaches at
// run time: an iterator bound to the process pid (whose descriptor 7 is
// open on path) and the open hook. Exit 0 when both work.
func attachCheck(spec string) int {
	pidStr, path, _ := strings.Cut(spec, ":")
	pid, _ := strconv.Atoi(pidStr)
	it, err := fileras.Open()
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	runtime.LockOSThread() // the capability sets below are this thread's
	mask := capsMask(runtimeCaps)
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{{Effective: uint32(mask), Permitted: uint32(mask)}, {Effective: uint32(mask >> 32), Permitted: uint32(mask >> 32)}}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		fmt.Println("capset:", err)
		return 1
	}
	if again, err := fileras.Open(); err == nil {
		again.Close()
		fmt.Println("capabilities not reduced: a BPF program still loads")
		return 1
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		fmt.Println("stat:", err)
		return 1
	}
	fs, err := it.Files(fileras.Query{Tgid: uint32(pid), AllDevs: true})
	if err != nil || !slicesContainsFD(fs, 7) {
		fmt.Println("task-bound walk:", err, len(fs))
		return 1
	}
	if err := it.Arm(probe.DevFromUnix(st.Dev)); err != nil {
		fmt.Println("arm:", err)
		return 1
	}
	if _, err := it.Opened(); err != nil {
		fmt.Println("opened:", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

func slicesContainsFD(fs []fileras.File, fd int) bool {
	for _, f := range fs {
		if f.FD == fd {
			return true
		}
	}
	return false
}

// TestRuntimeAttachesWithRuntimeCapabilities: what a raise attaches while
// the daemon runs (an iterator bound to a reader, the open hook on
// sys_exit) needs none of the capabilities dropped after start.
func TestRuntimeAttachesWithRuntimeCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: BPF load")
	}
	file := t.TempDir() + "/f"
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	reader := fd7Reader(t, file)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("READAHEADD_ATTACH_CHECK=%d:%s", reader, file))
	out, err := cmd.CombinedOutput()
	assert.NoError(t, err, "%s", out)
	assert.Equal(t, "ok", strings.TrimSpace(string(out)))
}
