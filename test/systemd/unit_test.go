// Package systemd runs deploy/systemd/readaheadd.service, unchanged, under a
// real systemd: a Debian container booted with systemd-nspawn (test/nspawn),
// with a lab device and its file system passed in.
package systemd

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/fileras"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/test/daemontest"
	"github.com/readaheadd/readaheadd/test/lab"
	"github.com/readaheadd/readaheadd/test/nspawn"
)

// reader reads a file sequentially in 64 KiB requests, from the start
// again (its pages dropped first) at the end, on one open file. perl-base
// is in every Debian root.
const reader = `open(my $f, "<", $ARGV[0]) or die "open $ARGV[0]: $!";
my $b;
while (1) {
	my $n = sysread($f, $b, 65536);
	die "read: $!" unless defined $n;
	if ($n == 0) { system("dd", "if=$ARGV[0]", "iflag=nocache", "count=0", "status=none"); sysseek($f, 0, 0); }
}`

const unitPath = "../../deploy/systemd/readaheadd.service"

// labOrig is the lab device's read_ahead_kb before the daemon starts: a
// value no default produces, so a value left behind shows.
const labOrig = 96

// rig is the shipped unit installed in a container, on a lab device whose
// files are slowed.
type rig struct {
	lab      *lab.Lab
	files    []string // host paths of the slowed files, in /data in the container
	fast     string   // host path of a file left at the device's own speed
	state    string   // host directory bound to /var/lib/readaheadd
	addr     string   // metrics address (the container shares the host's network)
	config   string   // host path of config.yaml, bound to /etc/readaheadd/config.yaml
	conf     string   // its device-level content
	rootTime time.Duration
	boot1    time.Duration // the first boot
	boot     func(t *testing.T) *nspawn.Container
	c        *nspawn.Container
}

// setup skips where nspawn cannot boot, builds the daemon, starts a lab
// device with four slowed files, writes a config (device-level: no
// allow-path) and a drop-in making the lab's read_ahead_kb writable, and
// boots a container with all of it bound in.
func setup(t *testing.T) *rig {
	begin := time.Now()
	if err := nspawn.Available(); err != nil {
		t.Skipf("nspawn: %v", err)
	}
	if err := lab.Available(); err != nil {
		t.Skipf("lab: %v", err)
	}
	root := nspawn.Root(t)
	u := &rig{rootTime: time.Since(begin)}
	bin, cleanup, err := daemontest.Build("readaheadd-systemd-")
	require.NoError(t, err)
	t.Cleanup(cleanup)

	u.lab = lab.New(t, lab.Options{SizeBytes: 1 << 30})
	require.NoError(t, u.lab.SetReadAheadKB(labOrig))
	for i := 0; i < 4; i++ {
		f, err := u.lab.WriteFile("slow"+strconv.Itoa(i), 64)
		require.NoError(t, err)
		u.files = append(u.files, f)
	}
	require.NoError(t, u.lab.SetPermanent(6*time.Millisecond, u.files...))
	u.fast, err = u.lab.WriteFile("fast", 256)
	require.NoError(t, err)

	// The unit as shipped; what a site adds for its own disks in a
	// drop-in, and its config.
	unit, err := filepath.Abs(unitPath)
	require.NoError(t, err)
	etc := t.TempDir()
	dropin := filepath.Join(etc, "readaheadd.service.d")
	require.NoError(t, os.Mkdir(dropin, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dropin, "lab.conf"),
		[]byte("[Service]\nReadWritePaths=-/sys/block/"+u.lab.Name+"/queue/read_ahead_kb\n"), 0o644))
	cfg := filepath.Join(etc, "readaheadd")
	require.NoError(t, os.Mkdir(cfg, 0o755))
	u.addr = daemontest.FreeAddr(t)
	u.conf = fmt.Sprintf("device: [%s]\nmetrics-addr: %q\ninterval: 200ms\nmax-read-ahead-kb: 2048\n", u.lab.Name, u.addr)
	u.config = filepath.Join(cfg, "config.yaml")
	require.NoError(t, os.WriteFile(u.config, []byte(u.conf), 0o644))
	// /var/lib outlives a crash of the machine; the container's own root
	// is a throw-away overlay.
	u.state = filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.Mkdir(u.state, 0o700))
	// Every container lives until the whole test ends (a subtest may boot
	// the one the next uses); failures are reported to the caller's t.
	top := t
	u.boot = func(t *testing.T) *nspawn.Container {
		t.Helper()
		c, err := nspawn.Start(root,
			// What the unit's CapabilityBoundingSet and SystemCallFilter
			// need beyond nspawn's defaults for a container.
			"--capability=CAP_BPF,CAP_PERFMON", "--system-call-filter=bpf pidfd_getfd",
			"--bind="+u.lab.Mount+":/data",
			"--bind-ro="+bin+":/usr/local/bin/readaheadd",
			"--bind-ro="+unit+":/etc/systemd/system/readaheadd.service",
			"--bind-ro="+dropin+":/etc/systemd/system/readaheadd.service.d",
			"--bind-ro="+cfg+":/etc/readaheadd",
			"--bind="+u.state+":/var/lib/readaheadd")
		require.NoError(t, err)
		top.Cleanup(func() {
			if top.Failed() {
				out, _ := c.Run("journalctl", "--no-pager", "-b", "-n", "150")
				top.Logf("journal of container %s:\n%s", c.Name, out)
			}
			if err := c.Teardown(); err != nil {
				top.Errorf("nspawn: %v", err)
			}
		})
		u.c = c
		return c
	}
	u.boot(t)
	u.boot1 = u.c.BootTime
	t.Logf("container booted in %.2f s (root ready after %.1f s)", u.c.BootTime.Seconds(), u.rootTime.Seconds())
	return u
}

// TestUnitUnderSystemd runs the shipped unit under a real systemd (a
// container booted with systemd-nspawn) on a lab device: first the unit's
// sandbox alone with the per-file calls, then the daemon's whole life.
func TestUnitUnderSystemd(t *testing.T) {
	begin := time.Now()
	u := setup(t)
	t.Run("SandboxAllowsPerFileActions", func(t *testing.T) { perFileUnderSandbox(t, u) })
	t.Run("Lifecycle", func(t *testing.T) { lifecycle(t, u) })
	t.Run("PerFileActions", func(t *testing.T) { perFileActions(t, u) })
	t.Logf("whole test %.1f s (root ready after %.1f s, first boot %.2f s)", time.Since(begin).Seconds(), u.rootTime.Seconds(), u.boot1.Seconds())
}

// lifecycle is the unit's whole life under systemd on the lab device: started through
// READY=1 with its sandbox in force, acting on slowed files read in the
// container, restoring on `systemctl stop`, after a kill -9 of the daemon
// (ExecStopPost), and after a crash of the whole machine (ExecStartPre at
// the next start).
//
// The daemon runs device-level here (no allow-path): per-file actions
// need the host PID namespace (readers are known by the pids the kernel
// reports), and nspawn always gives the container one of its own.
// perFileUnderSandbox covers pidfd_getfd under the unit's sandbox instead.
func lifecycle(t *testing.T, u *rig) {
	l := u.lab
	const orig = labOrig
	show := func() map[string]string { return u.show(t) }
	sh := func(args ...string) string { t.Helper(); return u.sh(t, args...) }

	// 1. Type=notify: `systemctl start` returns once READY=1 arrived.
	t0 := time.Now()
	sh("systemctl", "start", "readaheadd")
	st := show()
	require.Equal(t, "active", st["ActiveState"], "%v", st)
	assert.Equal(t, "running", st["SubState"])
	assert.Contains(t, st["StatusText"], "watching 1 device", "STATUS= from sd_notify")
	t.Logf("systemctl start: active in %.2f s, status %q", time.Since(t0).Seconds(), st["StatusText"])
	// systemd loaded every setting: no warning about the unit (an
	// unknown or unsupported one is logged and ignored).
	warnings := grep(sh("journalctl", "--no-pager", "-b", "-p", "warning", "-o", "cat", "_PID=1"), "readaheadd")
	assert.Empty(t, warnings, "systemd warned about the unit")
	pid := st["MainPID"]
	status := sh("cat", "/proc/"+pid+"/status")
	assert.Regexp(t, `(?m)^NoNewPrivs:\s+1$`, status)
	assert.Regexp(t, `(?m)^Seccomp:\s+2$`, status, "SystemCallFilter in force")
	// After attaching, only CAP_DAC_READ_SEARCH (2) and CAP_SYS_PTRACE (19).
	assert.Regexp(t, `(?m)^CapEff:\s+0*80004$`, status)
	// IPAddressDeny=any: systemd's firewall programs on the unit's cgroup.
	n, _ := strconv.Atoi(pid)
	host, err := u.c.HostPID(n)
	require.NoError(t, err)
	cg, err := nspawn.Cgroup2Dir(host)
	require.NoError(t, err)
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInetIngress, ebpf.AttachCGroupInetEgress} {
		assert.NotZero(t, attached(t, cg, at), "IPAddressDeny: no %v program on %s", at, cg)
	}
	mounts := sh("cat", "/proc/"+pid+"/mountinfo")
	assert.Regexp(t, `(?m) /sys ro,`, mounts, "ProtectKernelTunables: /sys read-only")
	assert.Regexp(t, `(?m) /sys/devices/\S+/`+l.Name+`/queue/read_ahead_kb rw,`, mounts, "ReadWritePaths: the lab's read_ahead_kb writable")

	// 2. It acts on the slowed files, read by processes in the container:
	// enough of them need a larger window for a device-wide one.
	for i := range u.files {
		require.NoError(t, lab.DropFileCache(u.files[i]))
		sh("systemd-run", "--unit=reader-"+strconv.Itoa(i), "--collect", "perl", "-e", reader, "/data/"+filepath.Base(u.files[i]))
	}
	raised := func(what string) {
		t.Helper()
		u.showCapacity(t)
		t0 := time.Now()
		for time.Since(t0) < 30*time.Second {
			if kb := readKB(t, l); kb > orig {
				t.Logf("%s: the daemon raised %s to %d KB after %.1f s", what, l.Name, kb, time.Since(t0).Seconds())
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		m, _ := get(u.addr, "/metrics")
		t.Fatalf("%s: the daemon did not raise %s in 30 s\n%s", what, l.Name, grep(m, "readaheadd_actions_total|readaheadd_tuner_errors_total"))
	}
	raised("first run")
	m, err := get(u.addr, "/metrics")
	require.NoError(t, err, "metrics on loopback through IPAddressAllow=localhost")
	assert.Positive(t, sum(m, `^readaheadd_actions_total\{.*action="device_window".*result="(trial|kept|applied)"`), "device_window actions")
	assert.Zero(t, sum(m, `^readaheadd_actions_total\{.*result="failed"`), "no action failed under the sandbox:\n%s", grep(m, "readaheadd_actions_total"))
	assert.FileExists(t, filepath.Join(u.state, "originals.json"), "the original recorded before the raise")

	// 3. systemctl stop restores the device.
	t0 = time.Now()
	sh("systemctl", "stop", "readaheadd")
	t.Logf("systemctl stop: %.2f s", time.Since(t0).Seconds())
	assert.Equal(t, "inactive", show()["ActiveState"])
	assert.Equal(t, orig, readKB(t, l), "device back after systemctl stop")
	assert.NoFileExists(t, filepath.Join(u.state, "originals.json"))

	// 4. kill -9 of the daemon: systemd runs ExecStopPost (restore).
	sh("systemctl", "start", "readaheadd")
	raised("second run")
	after := u.killMain(t)
	assert.Equal(t, "signal", after["Result"], "%v", after)
	assert.Equal(t, orig, readKB(t, l), "device back after kill -9 (ExecStopPost)")
	journal := sh("journalctl", "--no-pager", "-o", "cat", "-u", "readaheadd")
	assert.Contains(t, journal, l.Name+": read_ahead_kb restored to "+strconv.Itoa(orig), "ExecStopPost restored")

	// 5. A crash of the whole machine leaves the device raised and its
	// original recorded; the next start restores it before the daemon
	// runs (ExecStartPre).
	sh("systemctl", "start", "readaheadd")
	raised("third run")
	require.NoError(t, u.c.Kill())
	atCrash := readKB(t, l)
	assert.Greater(t, atCrash, orig, "the crash left the device raised")
	assert.FileExists(t, filepath.Join(u.state, "originals.json"), "the crashed run left the original recorded")
	c := u.boot(t)
	t.Logf("machine crashed with %s at %d KB; booted again in %.2f s", l.Name, atCrash, c.BootTime.Seconds())
	sh("systemctl", "start", "readaheadd")
	require.Equal(t, "active", show()["ActiveState"])
	assert.Equal(t, orig, readKB(t, l), "device at its original after the start")
	journal = sh("journalctl", "--no-pager", "-o", "cat", "-b", "-u", "readaheadd")
	restored := strings.Index(journal, l.Name+": read_ahead_kb restored to "+strconv.Itoa(orig))
	running := strings.Index(journal, "readaheadd running")
	assert.True(t, restored >= 0 && running > restored, "ExecStartPre restored before the daemon ran:\n%s", journal)
	sh("systemctl", "stop", "readaheadd")
	assert.Equal(t, orig, readKB(t, l))
}

// taker does what the daemon's per-file actions do to a reader: resolves
// the reader's file beneath its allow-path with openat2 (RESOLVE_BENEATH,
// NO_SYMLINKS, NO_MAGICLINKS, NO_XDEV), takes the reader's open file with
// pidfd_getfd and sets its window with POSIX_FADV_SEQUENTIAL (twice the
// device's). x86_64 numbers: openat 257, openat2 437, pidfd_open 434,
// pidfd_getfd 438, fadvise64 221.
const taker = `my ($pid, $fd, $dir, $name) = @ARGV;
my $dfd = syscall(257, -100, $dir, 0x200000 | 0x10000 | 0x80000, 0);
die "open $dir: $!\n" if $dfd < 0;
my $how = pack("QQQ", 0x200000 | 0x80000 | 0x20000, 0, 0x0f);
syscall(437, $dfd, $name, $how, 24) >= 0 or die "openat2: $!\n";
my $pidfd = syscall(434, $pid + 0, 0);
die "pidfd_open: $!\n" if $pidfd < 0;
my $f = syscall(438, $pidfd, $fd + 0, 0);
die "pidfd_getfd: $!\n" if $f < 0;
syscall(221, $f, 0, 0, 2) == 0 or die "fadvise: $!\n";
print "window set\n";`

// sandbox returns the unit's [Service] settings (and the drop-in's) as
// systemd-run properties, without what starts, stops and restarts it.
func sandbox(t *testing.T, unit string, more ...string) []string {
	var props []string
	section := ""
	for _, l := range append(strings.Split(unit, "\n"), more...) {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "[") {
			section = l
			continue
		}
		k, _, ok := strings.Cut(l, "=")
		if !ok || section != "[Service]" || strings.HasPrefix(l, "#") {
			continue
		}
		switch {
		case strings.HasPrefix(k, "Exec"), strings.HasPrefix(k, "Restart"), strings.HasPrefix(k, "Timeout"),
			k == "Type", k == "NotifyAccess", k == "KillSignal":
			continue
		}
		props = append(props, "-p", l)
	}
	require.NotEmpty(t, props)
	return props
}

// perFileUnderSandbox: the unit's sandbox lets a process resolve a
// reader's file beneath the allow-path with openat2, take the reader's open
// file with pidfd_getfd and change its window, as the daemon's per-file
// actions do: a transient service with every sandboxing setting of the
// unit does it to a reader in the container, and fails with pidfd_getfd
// filtered out or with RestrictSUIDSGID= added.
func perFileUnderSandbox(t *testing.T, u *rig) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the system call numbers in the taker program are x86_64's")
	}
	b, err := os.ReadFile(unitPath)
	require.NoError(t, err)
	props := sandbox(t, string(b), "[Service]", "ReadWritePaths=-/sys/block/"+u.lab.Name+"/queue/read_ahead_kb")

	windows := u.windowsOf(t, u.files[0])

	u.sh(t, "systemd-run", "--unit=reader", "--collect", "perl", "-e", reader, "/data/"+filepath.Base(u.files[0]))
	pid := strings.TrimSpace(u.sh(t, "systemctl", "show", "reader", "-p", "MainPID", "--value"))
	var fd string
	for t0 := time.Now(); fd == "" && time.Since(t0) < 10*time.Second; time.Sleep(20 * time.Millisecond) {
		out, _ := u.c.Run("find", "/proc/"+pid+"/fd", "-lname", "/data/*", "-printf", "%f")
		fd = strings.TrimSpace(out)
	}
	require.NotEmpty(t, fd, "the reader (pid %s in the container) has its file open", pid)
	n, _ := strconv.Atoi(pid)
	host, err := u.c.HostPID(n)
	require.NoError(t, err)
	window := func() int { return windows()[uint32(host)] }
	require.Equal(t, labOrig, window(), "the reader's window before: the device's")

	run := func(extra ...string) (string, error) {
		args := append([]string{"systemd-run", "--wait", "--pipe", "--quiet", "--unit=taker", "--collect"}, props...)
		args = append(append(args, extra...), "perl", "-e", taker, pid, fd, "/data", filepath.Base(u.files[0]))
		return u.c.Run(args...)
	}
	// The controls: the unit's sandbox minus pidfd_getfd, and with
	// RestrictSUIDSGID= (which the unit must not set: it fails openat2).
	out, err := run("-p", "SystemCallFilter=~pidfd_getfd")
	assert.Error(t, err)
	assert.Contains(t, out, "pidfd_getfd: Operation not permitted", "the sandbox applies to the taker")
	out, err = run("-p", "RestrictSUIDSGID=yes")
	assert.Error(t, err)
	assert.Contains(t, out, "openat2: Function not implemented")
	assert.Equal(t, labOrig, window())

	out, err = run()
	require.NoError(t, err, out)
	assert.Contains(t, out, "window set")
	assert.Equal(t, 2*labOrig, window(), "the reader's window set through the descriptor taken under the unit's sandbox")
	u.sh(t, "systemctl", "stop", "reader")
}

// perFileActions: the daemon's own per-file actions under the unit, with
// the lab's file system as allow-path, on a reader that has the same pid in
// the container as on the host (testdata/sametid.c), so that the daemon
// finds it: the reader's file passes the allow-path check (openat2
// RESOLVE_BENEATH under the unit's sandbox), the daemon takes its open file
// with pidfd_getfd and sets its window (file_window actions, none failed),
// and `systemctl stop` and a kill -9 (ExecStopPost) leave the reader's
// window at the device's. The daemon's own pid still differs from its host
// pid, which makes it take its own descriptor for another reader's and
// reset the window it set (docs/systemd.md): the test counts the actions
// instead of waiting for a window to hold.
func perFileActions(t *testing.T, u *rig) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("needs gcc to build testdata/sametid.c")
	}
	helper := filepath.Join(t.TempDir(), "sametid")
	out, err := exec.Command(gcc, "-O2", "-Wall", "-o", helper, "testdata/sametid.c").CombinedOutput()
	require.NoError(t, err, "build sametid: %s", out)
	sh := func(args ...string) string { t.Helper(); return u.sh(t, args...) }

	require.NoError(t, os.WriteFile(u.config, []byte(u.conf+"allow-path: [/data]\n"), 0o644))
	t.Cleanup(func() { os.WriteFile(u.config, []byte(u.conf), 0o644) })
	sh("systemctl", "start", "readaheadd")

	var pid int
	windows := u.windowsOf(t, u.files[0])
	window := func() int { return windows()[uint32(pid)] }
	require.NoError(t, lab.DropFileCache(u.files[0]))
	pid = u.sameTIDReader(t, helper, "/data/"+filepath.Base(u.files[0]), func(pid int) bool { return windows()[uint32(pid)] > 0 })
	require.Equal(t, labOrig, window(), "the reader's window at open: the device's")
	acted := func(what string) {
		t.Helper()
		u.showCapacity(t)
		t0 := time.Now()
		most := 0
		for time.Since(t0) < 30*time.Second {
			most = max(most, window())
			m, err := get(u.addr, "/metrics")
			require.NoError(t, err)
			if n := sum(m, `^readaheadd_actions_total\{.*action="file_window".*result="(trial|kept|applied)"`); n > 0 {
				t.Logf("%s: %.0f file_window actions after %.1f s; the reader's window seen up to %d KB", what, n, time.Since(t0).Seconds(), most)
				assert.Zero(t, sum(m, `^readaheadd_actions_total\{.*result="failed"`), "no action failed under the sandbox")
				assert.Zero(t, sum(m, `^readaheadd_tuner_errors_total\{kind="(file_op|out_of_scope)"`), "no per-file operation failed or refused:\n%s",
					grep(m, "readaheadd_tuner_errors_total"))
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		m, _ := get(u.addr, "/metrics")
		t.Fatalf("%s: no per-file action in 30 s\n%s", what, grep(m, "readaheadd_actions_total|readaheadd_tuner_errors_total"))
	}
	acted("first run")
	time.Sleep(time.Second)
	j := grep(sh("journalctl", "--no-pager", "-o", "cat", "-b", "-u", "readaheadd"), `tuner: (action|files opened while)`)
	t.Logf("the tuner's per-file actions:\n%s", tail(j, 12))

	sh("systemctl", "stop", "readaheadd")
	assert.Equal(t, labOrig, window(), "the reader's window back after systemctl stop")
	assert.Equal(t, labOrig, readKB(t, u.lab))
	assert.NoFileExists(t, filepath.Join(u.state, "pins.json"))

	sh("systemctl", "start", "readaheadd")
	acted("second run")
	assert.Equal(t, "signal", u.killMain(t)["Result"])
	assert.Equal(t, labOrig, window(), "the reader's window back after kill -9 (ExecStopPost)")
	assert.Equal(t, labOrig, readKB(t, u.lab))
	assert.NoFileExists(t, filepath.Join(u.state, "pins.json"))
	sh("systemctl", "stop", "readaheadd")
}

// sameTIDReader starts the reader on path (in the container) with a pid it
// has both in the container and on the host, waits until open() is true,
// and returns the pid. It is killed when the test ends.
// showCapacity reads the fast file with direct I/O for a moment, while the
// daemon watches: the detector learns a device's capacity from the
// throughput it sees it reach, and slowed streams that together read near
// the highest throughput seen so far look like a busy device, not starved
// ones (a daemon with no saved baseline would wait for a burst). A real
// disk has shown its capacity long before; this lab device has not.
func (u *rig) showCapacity(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(u.fast, os.O_RDONLY|syscall.O_DIRECT, 0)
	require.NoError(t, err)
	defer f.Close()
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	defer unix.Munmap(buf)
	t0 := time.Now()
	var n int64
	for off := int64(0); time.Since(t0) < 1500*time.Millisecond; off += int64(len(buf)) {
		m, err := f.ReadAt(buf, off)
		n += int64(m)
		if errors.Is(err, io.EOF) || m == 0 {
			off = -int64(len(buf))
			continue
		}
		require.NoError(t, err)
	}
	t.Logf("showed the device its capacity: %.0f MB/s of direct reads for %.1f s", float64(n)/time.Since(t0).Seconds()/1e6, time.Since(t0).Seconds())
}

func (u *rig) sameTIDReader(t *testing.T, helper, path string, open func(pid int) bool) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	require.NoError(t, err)
	max, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	leader := strconv.Itoa(u.c.Leader)
tries:
	for try := 0; try < 20; try++ {
		pid := max/2 + rand.IntN(max/2-1)
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			continue
		}
		// Into the container's PID namespace only, so that the helper is
		// the host's file; the reader then enters the rest.
		cmd := exec.Command("nsenter", "--target", leader, "--pid", "--", helper, strconv.Itoa(pid),
			"nsenter", "--target", leader, "--mount", "--uts", "--ipc", "--net", "--cgroup", "--root", "--wd", "--",
			"perl", "-e", reader, path)
		var out daemontest.SyncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		c := u.c
		t.Cleanup(func() {
			// In the container: the pid names the reader there, or none.
			c.Run("/bin/sh", "-c", "kill -9 "+strconv.Itoa(pid))
			cmd.Process.Kill()
		})
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		for t0 := time.Now(); time.Since(t0) < 10*time.Second; time.Sleep(20 * time.Millisecond) {
			select {
			case err := <-done:
				var ee *exec.ExitError
				if errors.As(err, &ee) && ee.ExitCode() == 3 {
					continue tries // pid taken in the container
				}
				t.Fatalf("reader with pid %d: %v: %s", pid, err, out.String())
			default:
			}
			if open(pid) {
				t.Logf("reader runs with pid %d in the container and on the host", pid)
				return pid
			}
		}
		t.Fatalf("reader with pid %d did not open %s in 10 s: %s", pid, path, out.String())
	}
	t.Fatal("no pid free both in the container and on the host in 20 tries")
	return 0
}

// windowsOf returns a function that reads the windows of the open files
// of path (a host path) from the kernel, by host pid.
func (u *rig) windowsOf(t *testing.T, path string) func() map[uint32]int {
	it, err := fileras.Open()
	require.NoError(t, err)
	t.Cleanup(func() { it.Close() })
	key := fileKey(t, path)
	return func() map[uint32]int {
		fs, err := it.Files(fileras.Query{AllDevs: true})
		require.NoError(t, err)
		w := map[uint32]int{}
		for _, f := range fs {
			if f.Key == key {
				w[f.Tgid] = f.WindowKB()
			}
		}
		return w
	}
}

// sh runs a command in the container; it must succeed.
func (u *rig) sh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := u.c.Run(args...)
	require.NoError(t, err, out)
	return out
}

// killMain kills the daemon with SIGKILL and waits until systemd has run
// ExecStopPost (Restart=on-failure then waits RestartSec in auto-restart);
// it returns the unit's state then.
func (u *rig) killMain(t *testing.T) map[string]string {
	t.Helper()
	// The shell's kill: minbase has no procps.
	u.sh(t, "/bin/sh", "-c", "kill -9 "+u.show(t)["MainPID"])
	var st map[string]string
	for t0 := time.Now(); time.Since(t0) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
		if st = u.show(t); st["SubState"] == "auto-restart" || st["ActiveState"] == "failed" {
			break
		}
	}
	return st
}

// show returns the unit's state properties.
func (u *rig) show(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, l := range strings.Split(u.sh(t, "systemctl", "show", "readaheadd", "-p", "ActiveState,SubState,StatusText,MainPID,Result"), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// attached counts the BPF programs attached to the cgroup directory cg
// for at.
func attached(t *testing.T, cg string, at ebpf.AttachType) int {
	t.Helper()
	f, err := os.Open(cg)
	require.NoError(t, err)
	defer f.Close()
	r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
	require.NoError(t, err, "query the programs on %s", cg)
	return len(r.Programs)
}

func fileKey(t *testing.T, path string) probe.FileKey {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	return probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}
}

// readKB is the lab device's read_ahead_kb.
func readKB(t *testing.T, l *lab.Lab) int {
	t.Helper()
	kb, err := l.ReadAheadKB()
	require.NoError(t, err)
	return kb
}

func get(addr, path string) (string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// sum adds the samples of the exposition whose line matches re.
func sum(exposition, re string) float64 {
	rx := regexp.MustCompile(re)
	var s float64
	for _, l := range strings.Split(exposition, "\n") {
		if f := strings.Fields(l); len(f) == 2 && rx.MatchString(l) {
			v, _ := strconv.ParseFloat(f[1], 64)
			s += v
		}
	}
	return s
}

func grep(s, re string) string {
	rx := regexp.MustCompile(re)
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if rx.MatchString(l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
