package lab

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

type mountEntry struct{ source, dir, fstype string }

// mounts parses /proc/self/mounts (octal escapes in paths decoded).
func mounts() []mountEntry {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 3 {
			continue
		}
		out = append(out, mountEntry{unescape(fs[0]), unescape(fs[1]), fs[2]})
	}
	return out
}

func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isMountPoint(dir string) bool {
	for _, m := range mounts() {
		if m.dir == dir {
			return true
		}
	}
	return false
}

// mountSource is the device mounted at dir ("" if none); the last mount wins.
func mountSource(dir string) string {
	src := ""
	for _, m := range mounts() {
		if m.dir == dir {
			src = m.source
		}
	}
	return src
}

// loopBacking is the backing file of loop device dev (/dev/loopN), or "".
func loopBacking(dev string) string {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// isLabFS reports whether pid is a live labfs process (not a reused pid).
func isLabFS(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return false
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// A zombie has exited already; its parent just has not reaped it.
		if i := strings.LastIndexByte(string(st), ')'); i > 0 && strings.HasPrefix(string(st[i+1:]), " Z") {
			return false
		}
	}
	arg0, _, _ := strings.Cut(string(b), "\x00")
	return filepath.Base(arg0) == "labfs"
}

// moduleRoot finds the module's root directory from this source file.
func moduleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if ok {
		dir := filepath.Dir(file)
		for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				return d, nil
			}
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "test", "lab", "labfs", "labfs.c")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("cannot find the readaheadd source tree (test/lab/labfs/labfs.c): set READAHEADD_LABFS to a built labfs")
}

// BuildLabFS returns the labfs binary, building it (cc, pkg-config fuse3)
// when it is missing or older than its source. READAHEADD_LABFS overrides.
func BuildLabFS() (string, error) {
	if p := os.Getenv("READAHEADD_LABFS"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("READAHEADD_LABFS=%s: %w", p, err)
		}
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	src := filepath.Join(root, "test", "lab", "labfs", "labfs.c")
	bin := filepath.Join(root, "test", "lab", "labfs", "labfs")
	ss, err := os.Stat(src)
	if err != nil {
		return "", fmt.Errorf("labfs source: %w", err)
	}
	if bs, err := os.Stat(bin); err == nil && !bs.ModTime().Before(ss.ModTime()) {
		return bin, nil
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	flags, err := exec.Command("pkg-config", "--cflags", "--libs", "fuse3").Output()
	if err != nil {
		return "", fmt.Errorf("pkg-config fuse3: %w (install libfuse3-dev and pkg-config)", err)
	}
	// Build next to the target and rename, so that concurrent test
	// binaries never run a half-written file.
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	args := append([]string{"-O2", "-Wall", "-Wextra", "-o", tmp, src}, strings.Fields(string(flags))...)
	args = append(args, "-lpthread", "-lm")
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build labfs (%s %s): %w: %s", cc, strings.Join(args, " "), err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	slog.Info("lab: built labfs", "bin", bin)
	return bin, nil
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

// Cleanup removes what labs left behind: labs recorded in StateDir whose
// owning process has died, detached labs (lab up) when detached is set, and
// any tagged FUSE mount, loop device or labfs process no remaining lab
// claims (a crash before the first state write). A lab whose owner process
// is alive (a running test) is never touched. It returns what it removed.
func Cleanup(detached bool) ([]string, error) {
	var removed []string
	var errs []error
	states, err := States()
	if err != nil {
		errs = append(errs, err)
	}
	claimed := map[string]bool{}
	for _, st := range states {
		keep := (st.Owner != 0 && alive(st.Owner)) || (st.Owner == 0 && !detached)
		if keep {
			claimed[st.Image] = true
			claimed[st.WorkDir] = true
			claimed[fmt.Sprint(st.PID)] = true
			continue
		}
		if err := teardown(st); err != nil {
			errs = append(errs, fmt.Errorf("lab %s: %w", st.ID, err))
			continue
		}
		removed = append(removed, "lab "+st.ID)
	}
	// Ext4 mounts of loop devices backed by a lab image, then the loops.
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range loops {
		b, err := os.ReadFile(bf)
		if err != nil {
			continue
		}
		backing := strings.TrimSpace(string(b))
		if !strings.Contains(backing, "/"+WorkPrefix) || filepath.Base(backing) != "image" || claimed[backing] {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(bf)))
		for _, m := range mounts() {
			if m.source == dev {
				if err := unmount(m.dir); err != nil {
					errs = append(errs, err)
				} else {
					removed = append(removed, "mount "+m.dir)
				}
			}
		}
		if _, err := run("losetup", "-d", dev); err != nil {
			errs = append(errs, err)
		} else {
			removed = append(removed, "loop "+dev)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid); err != nil || !isLabFS(pid) || claimed[fmt.Sprint(pid)] {
			continue
		}
		b, _ := os.ReadFile(p)
		if !strings.Contains(string(b), "/"+WorkPrefix) {
			continue // some other program called labfs
		}
		st := State{PID: pid}
		if err := teardown(st); err != nil {
			errs = append(errs, err)
		}
		removed = append(removed, fmt.Sprintf("labfs pid %d", pid))
	}
	for _, m := range mounts() {
		if strings.HasPrefix(m.fstype, "fuse") && m.source == FSName && !claimed[filepath.Dir(m.dir)] {
			if err := unmount(m.dir); err != nil {
				errs = append(errs, err)
			} else {
				removed = append(removed, "fuse mount "+m.dir)
			}
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), WorkPrefix+"*"))
	for _, d := range dirs {
		if claimed[d] {
			continue
		}
		if isMountPoint(filepath.Join(d, "fuse")) || isMountPoint(filepath.Join(d, "mnt")) {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "ctl.sock")); err != nil {
			if _, err2 := os.Stat(filepath.Join(d, "truth.jsonl")); err2 != nil {
				continue // not recognisably ours
			}
		}
		if err := os.RemoveAll(d); err == nil {
			removed = append(removed, "dir "+d)
		}
	}
	return removed, errors.Join(errs...)
}
