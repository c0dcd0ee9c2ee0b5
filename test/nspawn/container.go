package nspawn

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/readaheadd/readaheadd/test/daemontest"
)

// Container is a booted systemd-nspawn container. Commands run inside it
// with nsenter into its PID 1's namespaces: without a system bus on the
// host, nspawn runs unregistered, so machinectl and systemd-run -M cannot
// reach it.
type Container struct {
	Name string
	// Leader is the host PID of the container's PID 1 (systemd).
	Leader int
	// BootTime is from starting nspawn to systemd reporting the boot done.
	BootTime time.Duration

	cmd     *exec.Cmd
	out     daemontest.SyncBuffer
	done    chan struct{}
	cgroups []string
}

var seq atomic.Int64

// cgroupPrefix names the cgroups Boot creates: cgroupPrefix + Name, and a
// Name holds the pid of the test process that booted it.
const cgroupPrefix = "nspawn-"

// Boot starts root (see Root) with systemd as PID 1 and waits until the
// boot is done. The root is not written: the container runs on a tmpfs
// overlay over it (--volatile=overlay). args are more systemd-nspawn
// options (binds, capabilities, system calls). The container is powered
// off, and anything it left (processes, cgroups) removed, when the test
// ends.
//
// nspawn runs with SYSTEMD_NSPAWN_API_VFS_WRITABLE=1: /sys and /proc/sys
// are writable in the container as on a host, so that only the units' own
// sandboxing (ProtectKernelTunables=, ReadWritePaths=) restricts them.
func Boot(t testing.TB, root string, args ...string) *Container {
	t.Helper()
	c, err := Start(root, args...)
	if err != nil {
		t.Fatalf("nspawn: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Teardown(); err != nil {
			t.Errorf("nspawn: %v", err)
		}
	})
	return c
}

// Start is Boot for callers that tear the container down themselves
// (Teardown). On error nothing is left running.
func Start(root string, args ...string) (*Container, error) {
	c := &Container{
		Name: fmt.Sprintf("readaheadd-%d-%d", os.Getpid(), seq.Add(1)),
		done: make(chan struct{}),
	}
	removeStale()
	var err error
	if c.cgroups, err = makeCgroups(cgroupPrefix + c.Name); err != nil {
		return nil, err
	}
	argv := append([]string{"systemd-nspawn", "--directory=" + root, "--boot", "--machine=" + c.Name,
		"--register=no", "--keep-unit", "--volatile=overlay", "--console=passive"}, args...)
	// Start nspawn inside cgroups of its own: it creates its payload and
	// supervisor cgroups below the one it starts in, and does not remove
	// them.
	c.cmd = exec.Command("/bin/sh", append([]string{"-c",
		`IFS=:; for d in $NSPAWN_CGROUPS; do echo $$ > "$d/cgroup.procs" || exit 1; done; unset IFS NSPAWN_CGROUPS; exec "$@"`, "sh"}, argv...)...)
	c.cmd.Env = append(os.Environ(), "NSPAWN_CGROUPS="+strings.Join(c.cgroups, ":"), "SYSTEMD_NSPAWN_API_VFS_WRITABLE=1")
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := c.cmd.Start(); err != nil {
		removeCgroups(c.cgroups)
		return nil, fmt.Errorf("start %v: %w", argv, err)
	}
	go func() { c.cmd.Wait(); close(c.done) }()
	if err := c.waitBoot(90 * time.Second); err != nil {
		err = fmt.Errorf("boot %s: %w\n--- nspawn output:\n%s", root, err, tail(c.Output(), 40))
		if terr := c.Teardown(); terr != nil {
			err = fmt.Errorf("%w\n%v", err, terr)
		}
		return nil, err
	}
	c.BootTime = time.Since(start)
	return c, nil
}

func (c *Container) waitBoot(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for c.Leader == 0 {
		if c.exited() {
			return fmt.Errorf("systemd-nspawn exited: %v", c.cmd.ProcessState)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no systemd process under systemd-nspawn (pid %d) after %v", c.cmd.Process.Pid, timeout)
		}
		c.Leader = childNamed(c.cmd.Process.Pid, "systemd")
		time.Sleep(20 * time.Millisecond)
	}
	for {
		// --wait blocks until the boot is done, once systemd answers.
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		out, err := c.run(ctx, "systemctl", "is-system-running", "--wait")
		cancel()
		state := strings.TrimSpace(out)
		switch {
		case state == "running":
			return nil
		case state == "degraded":
			failed, _ := c.Run("systemctl", "--failed", "--no-legend", "--plain")
			fmt.Fprintf(&c.out, "boot degraded; failed units:\n%s", failed)
			return nil
		case c.exited():
			return fmt.Errorf("systemd-nspawn exited: %v", c.cmd.ProcessState)
		case time.Now().After(deadline):
			return fmt.Errorf("boot not done after %v: %q %v", timeout, state, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Run runs a command inside the container (as root, in its namespaces and
// root directory) and returns its standard output and error together.
func (c *Container) Run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return c.run(ctx, args...)
}

func (c *Container) run(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{"--target", strconv.Itoa(c.Leader), "--all", "--"}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", argv...).CombinedOutput()
	if err != nil {
		err = fmt.Errorf("%s in the container: %w", strings.Join(args, " "), err)
	}
	return string(out), err
}

// Output is what nspawn and the container's console printed.
func (c *Container) Output() string { return c.out.String() }

func (c *Container) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Kill ends the container at once, as a power loss would: SIGKILL to
// nspawn and everything in its cgroups, no shutdown, no ExecStop*.
func (c *Container) Kill() error {
	syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("systemd-nspawn (pid %d) still running 10 s after SIGKILL", c.cmd.Process.Pid)
	}
	return killCgroups(c.cgroups)
}

// Poweroff shuts the container down in order (SIGTERM to nspawn, which
// asks systemd to power off) and waits up to timeout.
func (c *Container) Poweroff(timeout time.Duration) error {
	if c.exited() {
		return nil
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("container %s not powered off after %v", c.Name, timeout)
	}
}

// Teardown powers the container off (or kills it after 20 s) and removes
// what it left: processes in its cgroups, the cgroups.
func (c *Container) Teardown() error {
	var errs []string
	if err := c.Poweroff(20 * time.Second); err != nil {
		errs = append(errs, err.Error())
	}
	if err := c.Kill(); err != nil {
		errs = append(errs, err.Error())
	}
	if err := removeCgroups(c.cgroups); err != nil {
		errs = append(errs, err.Error())
	}
	os.Remove(filepath.Join(propagate, c.Name))
	if len(errs) > 0 {
		return fmt.Errorf("teardown of %s: %s", c.Name, strings.Join(errs, "; "))
	}
	return nil
}

// childNamed returns the PID of a child of ppid whose command is comm.
func childNamed(ppid int, comm string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		f := strings.Fields(s[closing+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) && s[open+1:closing] == comm {
			return pid
		}
	}
	return 0
}

// makeCgroups creates a cgroup named name below this process's own in the
// cgroup2 hierarchy and in systemd's named v1 hierarchy (hybrid hosts),
// whichever are mounted.
func makeCgroups(name string) ([]string, error) {
	var dirs []string
	for _, parent := range cgroupParents() {
		d := filepath.Join(parent, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			removeCgroups(dirs)
			return nil, fmt.Errorf("create cgroup %s: %w", d, err)
		}
		dirs = append(dirs, d)
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no cgroup2 or name=systemd hierarchy mounted")
	}
	return dirs, nil
}

// cgroupParents returns the directories of this process's own cgroups in
// the cgroup2 hierarchy and in systemd's named v1 hierarchy, whichever are
// mounted.
func cgroupParents() []string {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	mnt := hierarchies()
	var dirs []string
	for _, l := range strings.Split(string(own), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && (f[1] == "" || f[1] == "name=systemd") && mnt[f[1]] != "" {
			dirs = append(dirs, filepath.Join(mnt[f[1]], f[2]))
		}
	}
	return dirs
}

// hierarchies returns where the cgroup2 hierarchy ("") and systemd's named
// v1 hierarchy ("name=systemd") are mounted, from their roots.
func hierarchies() map[string]string {
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	mnt := map[string]string{}
	for _, l := range strings.Split(string(mounts), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 || pf[3] != "/" {
			continue
		}
		switch {
		case qf[0] == "cgroup2":
			if _, ok := mnt[""]; !ok {
				mnt[""] = pf[4]
			}
		case qf[0] == "cgroup" && strings.Contains(","+qf[2]+",", ",name=systemd,"):
			if _, ok := mnt["name=systemd"]; !ok {
				mnt["name=systemd"] = pf[4]
			}
		}
	}
	return mnt
}

// removeStale removes containers left by test processes that are gone
// (killed by a test timeout before their cleanup ran): what runs in their
// cgroups is killed, the cgroups and nspawn's directories for them removed.
func removeStale() {
	for _, parent := range cgroupParents() {
		ents, _ := os.ReadDir(parent)
		for _, e := range ents {
			var pid, n int
			if _, err := fmt.Sscanf(e.Name(), cgroupPrefix+"readaheadd-%d-%d", &pid, &n); err != nil || !e.IsDir() {
				continue
			}
			if err := syscall.Kill(pid, 0); err == nil || err == syscall.EPERM {
				continue // its test is still running
			}
			removeCgroups([]string{filepath.Join(parent, e.Name())})
		}
	}
	ents, _ := os.ReadDir(propagate)
	for _, e := range ents {
		var pid, n int
		if _, err := fmt.Sscanf(e.Name(), "readaheadd-%d-%d", &pid, &n); err != nil {
			continue
		}
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			os.Remove(filepath.Join(propagate, e.Name()))
		}
	}
}

// propagate is where nspawn keeps a directory per machine for mounts it
// propagates into it.
const propagate = "/run/systemd/nspawn/propagate"

// killCgroups SIGKILLs every process left in the cgroups and waits until
// they are empty.
func killCgroups(dirs []string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for _, d := range dirs {
			filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
				if err != nil || !e.IsDir() {
					return nil
				}
				b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
				for _, s := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(s); err == nil {
						syscall.Kill(pid, syscall.SIGKILL)
						left = append(left, s)
					}
				}
				return nil
			})
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still in %v after SIGKILL", left, dirs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeCgroups removes the cgroups and the ones nspawn and the
// container's systemd created below them, deepest first.
func removeCgroups(dirs []string) error {
	if err := killCgroups(dirs); err != nil {
		return err
	}
	var errs []string
	for _, d := range dirs {
		var sub []string
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				sub = append(sub, p)
			}
			return nil
		})
		for i := len(sub) - 1; i >= 0; i-- {
			if err := os.Remove(sub[i]); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove cgroups: %s", strings.Join(errs, "; "))
	}
	return nil
}

// HostPID returns the host PID of the container's process pid.
func (c *Container) HostPID(pid int) (int, error) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", c.Leader))
	if err != nil {
		return 0, err
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		host, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err != nil || l != ns {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			// NSpid: the pid in each namespace, the container's last.
			if f := strings.Fields(strings.TrimPrefix(l, "NSpid:")); strings.HasPrefix(l, "NSpid:") && len(f) > 1 && f[len(f)-1] == strconv.Itoa(pid) {
				return host, nil
			}
		}
	}
	return 0, fmt.Errorf("no process with pid %d in container %s", pid, c.Name)
}

// Cgroup2Dir returns the directory of a host process's cgroup in the
// cgroup2 hierarchy.
func Cgroup2Dir(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	var path string
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			path = p
		}
	}
	if path == "" {
		return "", fmt.Errorf("process %d is in no cgroup2 cgroup", pid)
	}
	if m := hierarchies()[""]; m != "" {
		return filepath.Join(m, path), nil
	}
	return "", fmt.Errorf("no cgroup2 hierarchy mounted")
}
