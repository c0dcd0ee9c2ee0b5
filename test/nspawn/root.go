// Package nspawn boots a minimal Debian with systemd as PID 1 under
// systemd-nspawn, so that tests run deployment files under a real systemd:
// a debootstrapped root cached between runs, a container started from it
// with a throw-away overlay, commands run inside it through nsenter, and a
// teardown that leaves no process, cgroup or mount behind.
package nspawn

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// CacheDir holds the debootstrapped roots, one directory per package list.
const CacheDir = "/var/cache/readaheadd-nspawn"

// Suite and Packages define the root: Debian minbase plus what booting
// systemd needs. perl-base (essential, in minbase) serves as the tests'
// reader program.
const Suite = "bookworm"

// Packages are added to debootstrap's minbase variant.
var Packages = []string{"systemd", "systemd-sysv", "dbus"}

// Available reports what this machine lacks to boot a container, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: systemd-nspawn, loop devices and BPF")
	}
	for _, tool := range []struct{ name, pkg string }{
		{"systemd-nspawn", "systemd-container"}, {"debootstrap", "debootstrap"}, {"nsenter", "util-linux"},
	} {
		if _, err := exec.LookPath(tool.name); err != nil {
			return fmt.Errorf("needs %s (Debian package %s)", tool.name, tool.pkg)
		}
	}
	return nil
}

// key names a root by what it is built from.
func key() string {
	h := sha256.Sum256([]byte(strings.Join(append([]string{Suite, "minbase", runtime.GOARCH}, Packages...), "\n")))
	return hex.EncodeToString(h[:6])
}

// Root returns a debootstrapped root directory for Suite with Packages,
// building it (about 30-60 s) when the cache has none. It skips the test
// when the root cannot be built here: no tool, or no reachable Debian
// mirror (READAHEADD_NSPAWN_MIRROR overrides the one apt uses).
func Root(t testing.TB) string {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("nspawn: %v", err)
	}
	dir := filepath.Join(CacheDir, key())
	root := filepath.Join(dir, "root")
	if _, err := os.Stat(filepath.Join(dir, "complete")); err == nil {
		return root
	}
	mirror, err := Mirror()
	if err != nil {
		t.Skipf("nspawn: no Debian root cached in %s and none can be built: %v", dir, err)
	}
	if err := os.MkdirAll(CacheDir, 0o755); err != nil {
		t.Fatalf("nspawn: create %s: %v", CacheDir, err)
	}
	// One build at a time; a second caller waits and then finds it done.
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("nspawn: %v", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("nspawn: lock %s: %v", lock.Name(), err)
	}
	if _, err := os.Stat(filepath.Join(dir, "complete")); err == nil {
		return root
	}
	// A half-built root from an interrupted run is not trusted.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("nspawn: remove the incomplete root %s: %v", dir, err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include="+strings.Join(Packages, ","), Suite, root, mirror)
	out, err := cmd.CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("nspawn: debootstrap %s from %s: %v\n%s", Suite, mirror, err, tail(string(out), 30))
	}
	if err := os.WriteFile(filepath.Join(dir, "complete"), []byte(mirror+"\n"), 0o644); err != nil {
		t.Fatalf("nspawn: %v", err)
	}
	t.Logf("nspawn: debootstrapped %s (%s) into %s in %.1f s", Suite, strings.Join(Packages, " "), root, time.Since(start).Seconds())
	return root
}

// Mirror returns the Debian mirror apt uses for Suite (or
// READAHEADD_NSPAWN_MIRROR), once its Release file answers.
func Mirror() (string, error) {
	m := os.Getenv("READAHEADD_NSPAWN_MIRROR")
	if m == "" {
		var err error
		if m, err = aptMirror(Suite); err != nil {
			return "", err
		}
	}
	m = strings.TrimSuffix(m, "/")
	c := http.Client{Timeout: 5 * time.Second}
	url := m + "/dists/" + Suite + "/Release"
	resp, err := c.Get(url)
	if err != nil {
		return "", fmt.Errorf("Debian mirror not reachable: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("Debian mirror: GET %s: %s", url, resp.Status)
	}
	return m, nil
}

// aptDir is where apt's sources lists are.
var aptDir = "/etc/apt"

// aptMirror finds the URI of suite in sources.list and sources.list.d
// (one-line and deb822 forms).
func aptMirror(suite string) (string, error) {
	files, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*"))
	files = append([]string{filepath.Join(aptDir, "sources.list")}, files...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if strings.HasSuffix(f, ".sources") {
			for _, stanza := range strings.Split(string(b), "\n\n") {
				fields := map[string][]string{}
				sc := bufio.NewScanner(strings.NewReader(stanza))
				for sc.Scan() {
					if k, v, ok := strings.Cut(sc.Text(), ":"); ok && !strings.HasPrefix(k, "#") {
						fields[strings.ToLower(strings.TrimSpace(k))] = strings.Fields(v)
					}
				}
				if has(fields["types"], "deb") && has(fields["suites"], suite) && len(fields["uris"]) > 0 {
					return fields["uris"][0], nil
				}
			}
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			w := strings.Fields(l)
			if len(w) < 3 || w[0] != "deb" {
				continue
			}
			w = w[1:]
			if strings.HasPrefix(w[0], "[") { // options
				for len(w) > 0 && !strings.HasSuffix(w[0], "]") {
					w = w[1:]
				}
				if len(w) == 0 {
					continue
				}
				w = w[1:]
			}
			if len(w) >= 2 && w[1] == suite {
				return w[0], nil
			}
		}
	}
	return "", fmt.Errorf("no Debian mirror for %s in /etc/apt/sources.list*; set READAHEADD_NSPAWN_MIRROR", suite)
}

func has(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
