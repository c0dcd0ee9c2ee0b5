package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/config"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// capability numbers (linux/capability.h).
const (
	capDACOverride   = 1
	capDACReadSearch = 2
	capSysPtrace     = 19
	capSysAdmin      = 21
	capPerfmon       = 38
	capBPF           = 39
)

// effectiveCaps reads the CapEff mask from a /proc/PID/status file.
func effectiveCaps(statusPath string) (uint64, error) {
	f, err := os.Open(statusPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("%s has no CapEff line", statusPath)
}

// statusField returns the value of a line of a /proc/PID/status file.
func statusField(statusPath, name string) (string, error) {
	b, err := os.ReadFile(statusPath)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", nil
}

// checker runs the checks of `readaheadd check`; fields are seams for tests.
type checker struct {
	w          io.Writer
	statusPath string // /proc/self/status
	sys        blockdev.SysFS
	devices    []string // empty: the default disks
	probeCheck func() probe.CheckReport
	failed     bool
}

func (c *checker) report(ok bool, fatal bool, format string, args ...any) {
	tag := "ok  "
	switch {
	case !ok && fatal:
		tag = "FAIL"
		c.failed = true
	case !ok:
		tag = "warn"
	}
	fmt.Fprintf(c.w, "%s %s\n", tag, fmt.Sprintf(format, args...))
}

func (c *checker) run() error {
	caps, err := effectiveCaps(c.statusPath)
	if err != nil {
		c.report(false, true, "read capabilities: %v", err)
		caps = 0
	}
	has := func(n int) bool { return caps&(1<<n) != 0 }
	// Tracing programs need CAP_BPF with CAP_PERFMON, or CAP_SYS_ADMIN.
	switch {
	case has(capBPF) && has(capPerfmon):
		c.report(true, true, "CAP_BPF and CAP_PERFMON held (BPF tracing programs)")
	case has(capSysAdmin):
		c.report(true, true, "CAP_SYS_ADMIN held (BPF tracing programs; CAP_BPF with CAP_PERFMON is enough)")
	default:
		c.report(false, true, "BPF tracing needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN): run as root or add them to the unit's CapabilityBoundingSet / the container's capabilities")
	}
	if has(capSysPtrace) {
		c.report(true, false, "CAP_SYS_PTRACE held (per-file actions: pidfd_getfd on the readers' files)")
	} else {
		c.report(false, false, "per-file actions need CAP_SYS_PTRACE (pidfd_getfd on the readers' files); without it only device-wide actions work")
	}
	if has(capDACReadSearch) || has(capDACOverride) {
		c.report(true, false, "CAP_DAC_READ_SEARCH held (files in data directories owned by other users, /proc/PID/fd of their readers)")
	} else {
		c.report(false, false, "CAP_DAC_READ_SEARCH missing: files under data directories owned by another user (0700 hdfs) cannot be reached for per-file actions")
	}

	// The kernel reports readers by their pids in the initial PID
	// namespace; a daemon in a namespace of its own cannot find them in
	// its /proc (NSpid lists one pid per nested namespace).
	if nspid, err := statusField(c.statusPath, "NSpid:"); err == nil && nspid != "" {
		if n := len(strings.Fields(nspid)); n > 1 {
			c.report(false, false, "readaheadd runs in a PID namespace of its own (NSpid %s): readers are reported by host pids, which its /proc does not show, so per-file actions find no reader; run in the host PID namespace (Kubernetes: hostPID: true)", nspid)
		} else {
			c.report(true, false, "host PID namespace (readers are found by the pids the kernel reports)")
		}
	}

	rep := c.probeCheck()
	if rep.BTF != nil {
		c.report(false, true, "kernel BTF: %v", rep.BTF)
	} else {
		c.report(true, true, "kernel BTF at /sys/kernel/btf/vmlinux")
		if len(rep.Programs) == 0 {
			c.report(false, true, "no BPF program found in the embedded object")
		}
	}
	for _, pc := range rep.Programs {
		if pc.Attached && pc.Err == nil {
			c.report(true, true, "BPF program %s loads and attaches (%s)", pc.Name, pc.Attach)
		} else if pc.Optional {
			c.report(false, false, "BPF program %s (%s), optional: %v; random mmap readers that re-open their files keep the device's window on each new descriptor until the next search for them", pc.Name, pc.Attach, pc.Err)
		} else {
			c.report(false, true, "BPF program %s (%s): loaded=%v attached=%v: %v", pc.Name, pc.Attach, pc.Loaded, pc.Attached, pc.Err)
		}
	}

	devices := c.devices
	if len(devices) == 0 {
		// The same rule as run's (the OS disk left out).
		disks, _, err := config.TunableDisks(config.Config{}, c.sys)
		if err != nil {
			c.report(false, true, "list disks: %v", err)
		}
		for _, d := range disks {
			devices = append(devices, d.Name)
		}
	}
	root := c.sys.Root
	if root == "" {
		root = blockdev.DefaultRoot
	}
	for _, name := range devices {
		p := filepath.Join(root, "block", name, "queue", "read_ahead_kb")
		// Effective-ID access check: nothing is written.
		err := unix.Faccessat(unix.AT_FDCWD, p, unix.W_OK, unix.AT_EACCESS)
		if err == nil {
			c.report(true, true, "%s writable", p)
		} else {
			c.report(false, true, "%s not writable: %v (needs uid 0, which owns it, and a writable file: the unit's ReadWritePaths= must list it)", p, err)
		}
	}
	if c.failed {
		return errors.New("readaheadd cannot run here: see FAIL lines above")
	}
	fmt.Fprintln(c.w, "readaheadd can run here")
	return nil
}

func newCheckCmd() *cobra.Command {
	var devices []string
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check capabilities, BTF, the BPF programs and sysfs access on this machine (exit 0 or 1)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, d := range devices {
				if err := blockdev.ValidName(d); err != nil {
					return usageError{err}
				}
			}
			c := &checker{w: cmd.OutOrStdout(), statusPath: "/proc/self/status", devices: devices, probeCheck: probe.Check}
			return c.run()
		},
	}
	cmd.Flags().StringArrayVar(&devices, "device", nil, "disk whose read_ahead_kb must be writable (repeatable; default: the default disks of run)")
	return cmd
}
