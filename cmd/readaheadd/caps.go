package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/psx"
)

// runtimeCaps are the capabilities the daemon keeps once its BPF programs
// are loaded and attached; docs/security.md lists what each is for and the
// test that shows it is needed. Loading and attaching need CAP_BPF and
// CAP_PERFMON; afterwards the ring buffer, map reads, program statistics,
// and creating and reading a BPF iterator from a program loaded at start
// need no capability (measured on Linux 6.18). Writing read_ahead_kb needs
// none either: uid 0 owns the sysfs file. What stays:
//
//	CAP_SYS_PTRACE       pidfd_getfd and readlink of /proc/PID/fd/N of readers
//	CAP_DAC_READ_SEARCH  list /proc/PID/fd of readers of another uid, and
//	                     resolve paths under data directories that are
//	                     0700 to another user (HDFS), for the scope check
var runtimeCaps = []int{capDACReadSearch, capSysPtrace}

const capSetPCap = 8

// capsMask returns the bit mask of caps.
func capsMask(caps []int) uint64 {
	var m uint64
	for _, c := range caps {
		m |= 1 << c
	}
	return m
}

// allThreads runs a syscall on every thread of the process: capabilities
// are per thread, and Go runs the daemon on many. psx does it in both
// builds: without cgo through the Go runtime (syscall.AllThreadsSyscall),
// with cgo, where the runtime refuses, through libpsx, which also reaches
// threads the C side started. Syscall6 with zeros: libpsx's Syscall3
// leaves the fourth and fifth arguments unset, and prctl(PR_CAP_AMBIENT,
// PR_CAP_AMBIENT_CLEAR_ALL) fails with EINVAL unless they are 0.
func allThreads(trap, a1, a2, a3 uintptr) error {
	if _, _, e := psx.Syscall6(trap, a1, a2, a3, 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// dropCapabilities reduces the effective and permitted sets to keep (what
// of it is held), empties the inheritable and ambient sets and, when
// CAP_SETPCAP is held (readaheadd run by hand as root), the bounding set
// to keep as well. Permitted capabilities once dropped cannot come back;
// with no_new_privs (the unit's NoNewPrivileges=, the pod's
// allowPrivilegeEscalation: false) no execve can grant them either.
func dropCapabilities(keep []int) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var cur [2]unix.CapUserData
	if err := unix.Capget(&hdr, &cur[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	permitted := uint64(cur[0].Permitted) | uint64(cur[1].Permitted)<<32
	effective := uint64(cur[0].Effective) | uint64(cur[1].Effective)<<32
	mask := capsMask(keep) & permitted
	if effective&(1<<capSetPCap) != 0 {
		last := lastCap()
		for c := 0; c <= last; c++ {
			if mask&(1<<c) != 0 {
				continue
			}
			if err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil {
				return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
			}
		}
	}
	if err := allThreads(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	data := [2]unix.CapUserData{
		{Effective: uint32(mask), Permitted: uint32(mask)},
		{Effective: uint32(mask >> 32), Permitted: uint32(mask >> 32)},
	}
	hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// lastCap is the highest capability this kernel knows.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 40
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 40
	}
	return n
}

// capNames names the capabilities in mask, for the log.
func capNames(mask uint64) []string {
	names := map[int]string{
		capDACOverride: "CAP_DAC_OVERRIDE", capDACReadSearch: "CAP_DAC_READ_SEARCH", capSetPCap: "CAP_SETPCAP",
		capSysPtrace: "CAP_SYS_PTRACE", capSysAdmin: "CAP_SYS_ADMIN", capPerfmon: "CAP_PERFMON", capBPF: "CAP_BPF",
	}
	var out []string
	for c := 0; c < 64; c++ {
		if mask&(1<<c) == 0 {
			continue
		}
		if n, ok := names[c]; ok {
			out = append(out, n)
		} else {
			out = append(out, "cap"+strconv.Itoa(c))
		}
	}
	return out
}
