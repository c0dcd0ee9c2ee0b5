// Package lab builds an emulated block device whose latency regimes tests,
// benchmarks and the demo control: a RAM-backed image served by labfs (a
// libfuse3 server with an SSD-like latency model, see labfs/labfs.c), a loop
// device with direct I/O on it, and an ext4 file system mounted on top.
//
// Everything Up creates is tagged (work directories named readaheadd-lab-*,
// the FUSE fsname readaheadd-lab, a state file under /run/readaheadd-lab) so
// that Cleanup can remove what a crashed run left behind.
package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// StateDir holds one JSON state file per running lab.
const StateDir = "/run/readaheadd-lab"

// WorkPrefix starts the name of every work directory a lab creates.
const WorkPrefix = "readaheadd-lab-"

// FSName is the FUSE file system name labfs mounts with.
const FSName = "readaheadd-lab"

// Model is the device model of labfs: every read waits Latency (in one of
// Slots parallel units), then moves its bytes through one transfer channel
// of BandwidthMBps (10^6 bytes/s).
type Model struct {
	Latency       time.Duration
	BandwidthMBps float64
	Slots         int
}

// DefaultModel is an SSD-like device on which the default read_ahead_kb
// (128) already saturates the channel when healthy.
var DefaultModel = Model{Latency: 150 * time.Microsecond, BandwidthMBps: 150, Slots: 16}

// Options configure Up.
type Options struct {
	// Dir is where the ext4 file system is mounted; created if missing.
	// Empty: a directory inside the lab's work directory.
	Dir string
	// SizeBytes is the image size; default 2 GiB.
	SizeBytes int64
	// Model is the device model; zero fields take DefaultModel's.
	Model Model
	// LabFS is the labfs binary; default test/lab/labfs/labfs in the
	// module, built when missing or older than labfs.c.
	LabFS string
	// Detach starts labfs in its own session, so that it outlives the
	// calling process (lab up).
	Detach bool
	// RequestLog makes labfs log every read request (RequestLog method).
	RequestLog bool
	// FS is the file system made on the device: "ext4" (default) or "xfs".
	FS string
}

// State is what a running lab records in StateDir so that Attach and
// Cleanup find it.
type State struct {
	ID        string `json:"id"`
	WorkDir   string `json:"work_dir"`
	FuseDir   string `json:"fuse_dir"`
	Image     string `json:"image"`
	Control   string `json:"control"`
	Truth     string `json:"truth"`
	ReqLog    string `json:"reqlog,omitempty"`
	PID       int    `json:"pid,omitempty"`
	Loop      string `json:"loop,omitempty"` // e.g. /dev/loop5
	Mount     string `json:"mount"`
	OwnsMount bool   `json:"owns_mount"` // Mount was created by Up
	Mounted   bool   `json:"mounted"`
	// Owner is the process that manages the lab (a test), or 0 for a
	// detached lab (lab up) that lives until `lab down`.
	Owner int `json:"owner,omitempty"`
}

// Lab is a running lab device.
type Lab struct {
	// Name is the block device name, e.g. "loop5".
	Name string
	// Dev is the loop device's number.
	Dev probe.Dev
	// Mount is where its ext4 file system is mounted.
	Mount string

	st   State
	sys  blockdev.SysFS
	ctl  *control
	mu   sync.Mutex
	down bool
	cont []*Contention
}

// Available reports why a lab cannot run here, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: loop devices, mounts and FUSE")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("needs /dev/fuse: %w", err)
	}
	for _, tool := range []string{"losetup", "mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("needs %s in PATH: %w", tool, err)
		}
	}
	return nil
}

// Up creates a lab. On error everything created so far is removed.
func Up(opts Options) (l *Lab, err error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if opts.SizeBytes == 0 {
		opts.SizeBytes = 2 << 30
	}
	if opts.SizeBytes < 64<<20 || opts.SizeBytes%4096 != 0 {
		return nil, fmt.Errorf("lab size %d: give a multiple of 4096 of at least 64 MiB", opts.SizeBytes)
	}
	switch opts.FS {
	case "":
		opts.FS = "ext4"
	case "ext4", "xfs":
	default:
		return nil, fmt.Errorf("lab file system %q: give ext4 or xfs", opts.FS)
	}
	if _, err := exec.LookPath("mkfs." + opts.FS); err != nil {
		return nil, fmt.Errorf("needs mkfs.%s in PATH (xfsprogs for xfs): %w", opts.FS, err)
	}
	m := opts.Model
	if m.Latency == 0 {
		m.Latency = DefaultModel.Latency
	}
	if m.BandwidthMBps == 0 {
		m.BandwidthMBps = DefaultModel.BandwidthMBps
	}
	if m.Slots == 0 {
		m.Slots = DefaultModel.Slots
	}
	bin := opts.LabFS
	if bin == "" {
		if bin, err = BuildLabFS(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create lab state directory: %w", err)
	}
	work, err := os.MkdirTemp("", WorkPrefix)
	if err != nil {
		return nil, fmt.Errorf("create lab work directory: %w", err)
	}
	l = &Lab{st: State{
		ID:      filepath.Base(work),
		WorkDir: work,
		FuseDir: filepath.Join(work, "fuse"),
		Image:   filepath.Join(work, "fuse", "image"),
		Control: filepath.Join(work, "ctl.sock"),
		Truth:   filepath.Join(work, "truth.jsonl"),
	}}
	if !opts.Detach {
		l.st.Owner = os.Getpid()
	}
	if opts.RequestLog {
		l.st.ReqLog = filepath.Join(work, "requests.jsonl")
	}
	defer func() {
		if err != nil {
			if derr := l.Down(); derr != nil {
				slog.Warn("lab: tear-down after failed set-up", "err", derr)
			}
			l = nil
		}
	}()
	if opts.Dir == "" {
		l.st.Mount = filepath.Join(work, "mnt")
		l.st.OwnsMount = true
	} else {
		if l.st.Mount, err = filepath.Abs(opts.Dir); err != nil {
			return l, err
		}
		if _, serr := os.Stat(l.st.Mount); errors.Is(serr, os.ErrNotExist) {
			l.st.OwnsMount = true
		} else if isMountPoint(l.st.Mount) {
			return l, fmt.Errorf("lab mount directory %s is already a mount point: run `lab down` or pick another --dir", l.st.Mount)
		}
	}
	if err := os.MkdirAll(l.st.Mount, 0o755); err != nil {
		return l, fmt.Errorf("create lab mount directory: %w", err)
	}
	if err := os.Mkdir(l.st.FuseDir, 0o700); err != nil {
		return l, fmt.Errorf("create FUSE mount point: %w", err)
	}
	if err := l.saveState(); err != nil {
		return l, err
	}

	args := []string{l.st.FuseDir,
		"--size=" + strconv.FormatInt(opts.SizeBytes, 10),
		"--ctl=" + l.st.Control,
		"--truth=" + l.st.Truth,
		fmt.Sprintf("--lat-us=%g", float64(m.Latency)/float64(time.Microsecond)),
		fmt.Sprintf("--bw-mbps=%g", m.BandwidthMBps),
		"--slots=" + strconv.Itoa(m.Slots),
	}
	if l.st.ReqLog != "" {
		args = append(args, "--reqlog="+l.st.ReqLog)
	}
	cmd := exec.Command(bin, args...)
	logf, err := os.Create(filepath.Join(work, "labfs.log"))
	if err != nil {
		return l, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if opts.Detach {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := cmd.Start(); err != nil {
		return l, fmt.Errorf("start labfs %s: %w", bin, err)
	}
	l.st.PID = cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reap it whenever it ends
	if err := l.saveState(); err != nil {
		return l, err
	}
	if err := waitFor(5*time.Second, func() (bool, error) {
		select {
		case werr := <-exited:
			out, _ := os.ReadFile(filepath.Join(work, "labfs.log"))
			return false, fmt.Errorf("labfs exited during start (%v): %s", werr, strings.TrimSpace(string(out)))
		default:
		}
		if !isMountPoint(l.st.FuseDir) {
			return false, nil
		}
		_, serr := os.Stat(l.st.Control)
		return serr == nil, nil
	}); err != nil {
		return l, fmt.Errorf("labfs did not come up: %w", err)
	}
	l.ctl = &control{path: l.st.Control}

	out, err := run("losetup", "--direct-io=on", "--find", "--show", l.st.Image)
	if err != nil {
		return l, err
	}
	l.st.Loop = strings.TrimSpace(out)
	l.Name = filepath.Base(l.st.Loop)
	if err := l.saveState(); err != nil {
		return l, err
	}
	l.sys = blockdev.SysFS{}
	disk, err := l.sys.Lookup(l.Name)
	if err != nil {
		return l, err
	}
	l.Dev = disk.Dev
	// The loop device starts at the kernel default (128); say so explicitly
	// in case the distribution's udev rules changed it.
	if err := l.SetReadAheadKB(128); err != nil {
		return l, err
	}
	// lazy_*_init=0: no background zeroing disturbs the measurements;
	// nodiscard: nothing to discard in a fresh RAM image.
	mkfs := []string{"mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", l.st.Loop}
	if opts.FS == "xfs" {
		// -K: no discard at mkfs (nothing to discard in a fresh RAM image).
		mkfs = []string{"mkfs.xfs", "-q", "-f", "-K", l.st.Loop}
	}
	if _, err := run(mkfs[0], mkfs[1:]...); err != nil {
		return l, err
	}
	// noatime: reads must not cause journal writes.
	if _, err := run("mount", "-t", opts.FS, "-o", "noatime", l.st.Loop, l.st.Mount); err != nil {
		return l, err
	}
	l.st.Mounted = true
	l.Mount = l.st.Mount
	if err := l.saveState(); err != nil {
		return l, err
	}
	slog.Info("lab up", "device", l.Name, "dev", l.Dev.String(), "mount", l.Mount, "work", work)
	return l, nil
}

// State returns the lab's recorded state (paths, pid, loop device).
func (l *Lab) State() State { return l.st }

func (l *Lab) statePath() string { return filepath.Join(StateDir, l.st.ID+".json") }

func (l *Lab) saveState() error {
	b, err := json.MarshalIndent(l.st, "", "  ")
	if err != nil {
		return err
	}
	tmp := l.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write lab state: %w", err)
	}
	return os.Rename(tmp, l.statePath())
}

// Attach returns the running lab whose file system is mounted at dir (as
// started by `lab up --dir`), or the only running lab when dir is empty.
func Attach(dir string) (*Lab, error) {
	states, err := States()
	if err != nil {
		return nil, err
	}
	if dir != "" {
		if dir, err = filepath.Abs(dir); err != nil {
			return nil, err
		}
	}
	var found []State
	for _, s := range states {
		if dir == "" || s.Mount == dir {
			found = append(found, s)
		}
	}
	switch {
	case len(found) == 0:
		return nil, fmt.Errorf("no running lab%s: start one with `lab up --dir DIR`", map[bool]string{true: "", false: " at " + dir}[dir == ""])
	case len(found) > 1:
		return nil, fmt.Errorf("%d labs are running: say which with --dir", len(found))
	}
	s := found[0]
	if !s.Mounted || s.Loop == "" {
		return nil, fmt.Errorf("lab %s is not fully up (crashed during start?): run `lab down`", s.ID)
	}
	l := &Lab{st: s, Name: filepath.Base(s.Loop), Mount: s.Mount, ctl: &control{path: s.Control}}
	disk, err := l.sys.Lookup(l.Name)
	if err != nil {
		return nil, err
	}
	l.Dev = disk.Dev
	return l, nil
}

// States lists the state files of labs that may still be running.
func States() ([]State, error) {
	entries, err := os.ReadDir(StateDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []State
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(StateDir, e.Name()))
		if err != nil {
			continue
		}
		var s State
		if err := json.Unmarshal(b, &s); err != nil || s.ID == "" {
			slog.Warn("lab: unreadable state file", "file", e.Name(), "err", err)
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// SetReadAheadKB sets read_ahead_kb of the lab's own loop device.
func (l *Lab) SetReadAheadKB(kb int) error { return l.sys.SetReadAheadKB(l.Name, kb) }

// ReadAheadKB reads read_ahead_kb of the lab's loop device.
func (l *Lab) ReadAheadKB() (int, error) { return l.sys.ReadAheadKB(l.Name) }

// Down tears the lab down: stops contention, unmounts, detaches the loop
// device, stops labfs and removes the work directory. Safe to call twice.
func (l *Lab) Down() error {
	l.mu.Lock()
	if l.down {
		l.mu.Unlock()
		return nil
	}
	l.down = true
	conts := l.cont
	l.cont = nil
	l.mu.Unlock()
	for _, c := range conts {
		c.Stop()
	}
	if l.ctl != nil {
		l.ctl.close()
	}
	return teardown(l.st)
}

// teardown removes everything st describes, tolerating parts that are
// already gone; it is also how Cleanup removes leftovers.
func teardown(st State) error {
	var errs []error
	if st.Mount != "" && isMountPoint(st.Mount) && mountSource(st.Mount) == st.Loop && st.Loop != "" {
		if err := unmount(st.Mount); err != nil {
			errs = append(errs, err)
		}
	}
	if st.Loop != "" && loopBacking(st.Loop) == st.Image {
		if _, err := run("losetup", "-d", st.Loop); err != nil {
			errs = append(errs, err)
		}
	}
	if st.PID > 0 && isLabFS(st.PID) {
		_ = syscall.Kill(st.PID, syscall.SIGTERM)
		if waitFor(5*time.Second, func() (bool, error) { return !isLabFS(st.PID), nil }) != nil {
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
			_ = waitFor(2*time.Second, func() (bool, error) { return !isLabFS(st.PID), nil })
		}
	}
	if st.FuseDir != "" && isMountPoint(st.FuseDir) {
		if err := unmount(st.FuseDir); err != nil {
			errs = append(errs, err)
		}
	}
	if st.OwnsMount && st.Mount != "" && !isMountPoint(st.Mount) {
		_ = os.Remove(st.Mount) // only if empty: never delete user data
	}
	if st.WorkDir != "" && strings.HasPrefix(filepath.Base(st.WorkDir), WorkPrefix) && !isMountPoint(st.FuseDir) {
		if err := os.RemoveAll(st.WorkDir); err != nil {
			errs = append(errs, fmt.Errorf("remove lab work directory: %w", err))
		}
	}
	if len(errs) == 0 && st.ID != "" {
		_ = os.Remove(filepath.Join(StateDir, st.ID+".json"))
	}
	return errors.Join(errs...)
}

func unmount(dir string) error {
	var err error
	for i := 0; i < 20; i++ {
		if err = syscall.Unmount(dir, 0); err == nil || !isMountPoint(dir) {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // EBUSY right after a reader closed
	}
	// Last resort: detach lazily, so that no mount stays in the namespace.
	if lerr := syscall.Unmount(dir, syscall.MNT_DETACH); lerr == nil {
		slog.Warn("lab: mount was busy, detached lazily", "dir", dir, "err", err)
		return nil
	}
	return fmt.Errorf("unmount %s: %w (something still uses it: fuser -m %s)", dir, err, dir)
}

func waitFor(d time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
