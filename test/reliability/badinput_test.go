package reliability

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each bad input gives one clear line, the documented exit code, and
// changes nothing: no state directory, no sysfs write. The flag and YAML
// cases (sizes, device names, allow-paths, addresses) are covered in
// cmd/readaheadd and pkg/config; these are the ones that need the real
// binary, a real device or other privileges.

// corruptStates are state files `restore` and `run` must refuse, leaving
// the file and every device as they are.
func corruptStates(dev string) map[string]string {
	return map[string]string{
		"empty":           "",
		"truncated":       `{"version":1,"devices":[{"device":"` + dev + `","read_ahe`,
		"not JSON":        "\x00\x01garbage",
		"unknown version": `{"version":7,"devices":[{"device":"` + dev + `","dev":"7:0","read_ahead_kb":4096}]}`,
		"no version":      `{"devices":[{"device":"` + dev + `","dev":"7:0","read_ahead_kb":4096}]}`,
		"unknown field":   `{"version":1,"devices":[{"device":"` + dev + `","dev":"7:0","read_ahead_kb":4096,"extra":1}]}`,
		"device slash":    `{"version":1,"devices":[{"device":"../../kernel/mm/x","dev":"7:0","read_ahead_kb":4096}]}`,
		"device dotdot":   `{"version":1,"devices":[{"device":"..","dev":"7:0","read_ahead_kb":4096}]}`,
		"absurd size":     `{"version":1,"devices":[{"device":"` + dev + `","dev":"7:0","read_ahead_kb":99999999999}]}`,
		"negative size":   `{"version":1,"devices":[{"device":"` + dev + `","dev":"7:0","read_ahead_kb":-4}]}`,
	}
}

func TestRestoreRefusesCorruptStateFile(t *testing.T) {
	dev := "nosuchdisk0"
	var ld loopDev
	if os.Geteuid() == 0 {
		ld = newLoop(t, 16)
		dev = ld.Name
	}
	for name, body := range corruptStates(dev) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "originals.json")
			require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
			var before int
			if ld.Name != "" {
				before = readKB(t, ld.Name)
			}
			r := runBin(t, nil, "restore", "--state-dir", dir)
			assert.Equal(t, 1, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
			assert.Contains(t, r.stderr, "is unusable", r.stderr)
			assert.Contains(t, r.stderr, p, "names the file")
			assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			assert.Equal(t, body, string(b), "the file is left for the operator")
			if ld.Name != "" {
				assert.Equal(t, before, readKB(t, ld.Name), "no sysfs write")
			}
		})
	}
}

func TestRunRefusesCorruptStateFile(t *testing.T) {
	requireRoot(t, "run gets past the capability check and the probe only as root")
	ld := newLoop(t, 16)
	for _, name := range []string{"truncated", "unknown version", "device dotdot", "absurd size"} {
		body := corruptStates(ld.Name)[name]
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			require.NoError(t, os.MkdirAll(dir, 0o700))
			p := filepath.Join(dir, "originals.json")
			require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
			before := readKB(t, ld.Name)
			r := runBin(t, nil, "run", "--device", ld.Name, "--state-dir", dir, "--metrics-addr", "")
			assert.Equal(t, 1, r.code, r.stderr)
			assert.Contains(t, r.stderr, "is unusable")
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			assert.Equal(t, body, string(b))
			assert.Equal(t, before, readKB(t, ld.Name))
		})
	}
}

func TestRunMetricsAddressTakenBinary(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	args := []string{"run", "--metrics-addr", ln.Addr().String()}
	if os.Geteuid() == 0 {
		args = append(args, "--device", newLoop(t, 16).Name)
	}
	state := filepath.Join(t.TempDir(), "state")
	r := runBin(t, nil, append(args, "--state-dir", state)...)
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Contains(t, r.stderr, ln.Addr().String())
	assert.Contains(t, r.stderr, "--metrics-addr")
	assert.False(t, exists(state), "no state dir")
}

// setprivNobody drops to uid/gid 65534 with no capabilities at all.
var setprivNobody = []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--"}

func TestRunWithoutRootNamesCapabilities(t *testing.T) {
	var wrapper []string
	args := []string{"run", "--metrics-addr", "127.0.0.1:0"}
	if os.Geteuid() == 0 {
		wrapper = setprivNobody
		args = append(args, "--device", newLoop(t, 16).Name)
	}
	// A directory nobody may create things in would hide the point: use
	// one nobody could write, so that only the capability check stops it.
	parent, err := os.MkdirTemp("", "readaheadd-nobody-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(parent) })
	require.NoError(t, os.Chmod(parent, 0o777))
	state := filepath.Join(parent, "state")
	r := runBin(t, wrapper, append(args, "--state-dir", state)...)
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Contains(t, r.stderr, "missing CAP_BPF and CAP_PERFMON")
	assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
	assert.False(t, exists(state), "no state dir")
}

func TestRunWithReducedCapabilitiesNamesTheMissingOne(t *testing.T) {
	requireRoot(t, "setpriv --bounding-set")
	ld := newLoop(t, 16)
	for drop, want := range map[string]string{
		"bpf":     "missing CAP_BPF:",
		"perfmon": "missing CAP_PERFMON:",
	} {
		t.Run(drop, func(t *testing.T) {
			keep := []string{}
			for _, c := range []string{"bpf", "perfmon", "sys_ptrace", "dac_read_search"} {
				if c != drop {
					keep = append(keep, "+"+c)
				}
			}
			wrapper := []string{"setpriv", "--bounding-set=-all," + strings.Join(keep, ","), "--inh-caps=-all", "--"}
			state := filepath.Join(t.TempDir(), "state")
			before := readKB(t, ld.Name)
			r := runBin(t, wrapper, "run", "--device", ld.Name, "--state-dir", state, "--metrics-addr", "")
			assert.Equal(t, 1, r.code, r.stderr)
			assert.Contains(t, r.stderr, want)
			assert.False(t, exists(state))
			assert.Equal(t, before, readKB(t, ld.Name))

			r = runBin(t, wrapper, "check", "--device", ld.Name)
			assert.Equal(t, 1, r.code, r.stdout)
			assert.Contains(t, r.stdout, "FAIL BPF tracing needs CAP_BPF and CAP_PERFMON")
		})
	}
}

// hideBTF runs the command in a private mount namespace where
// /sys/kernel/btf/vmlinux is empty: a kernel without BTF, as far as the
// process can tell. The host's mounts are not affected.
func hideBTF(t *testing.T) []string {
	t.Helper()
	requireRoot(t, "mount namespaces")
	if !exists("/sys/kernel/btf/vmlinux") {
		t.Skip("this kernel has no BTF to hide")
	}
	return []string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
		`mount --bind /dev/null /sys/kernel/btf/vmlinux && exec "$0" "$@"`}
}

func TestCheckAndRunWithoutBTF(t *testing.T) {
	w := hideBTF(t)
	ld := newLoop(t, 16)
	r := runBin(t, w, "check", "--device", ld.Name)
	assert.Equal(t, 1, r.code, r.stdout+r.stderr)
	assert.Contains(t, r.stdout, "FAIL kernel BTF: the kernel exposes no BTF at /sys/kernel/btf/vmlinux")
	assert.Contains(t, r.stdout, "CONFIG_DEBUG_INFO_BTF")
	assert.NotContains(t, r.stdout, "readaheadd can run here")

	state := filepath.Join(t.TempDir(), "state")
	before := readKB(t, ld.Name)
	r = runBin(t, w, "run", "--device", ld.Name, "--state-dir", state, "--metrics-addr", "")
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Contains(t, r.stderr, "no BTF")
	assert.Contains(t, r.stderr, "readaheadd check")
	assert.False(t, exists(state), "no state dir")
	assert.Equal(t, before, readKB(t, ld.Name))
	// The host still has its BTF.
	fi, err := os.Stat("/sys/kernel/btf/vmlinux")
	require.NoError(t, err)
	assert.Positive(t, fi.Size(), fmt.Sprint("host BTF untouched"))
}
