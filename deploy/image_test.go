package deploy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/readaheadd/readaheadd/test/daemontest"
	"github.com/readaheadd/readaheadd/test/lab"
)

// podman is the container engine of the image test: no daemon, its own
// storage under a temporary directory (vfs works on any file system),
// cgroupfs (no systemd here), events in a file.
type podman struct {
	t    *testing.T
	root string
	// hybrid: cgroup v1 with a cgroup2 hierarchy beside it, which crun
	// refuses when that hierarchy holds controllers; podman then runs in
	// a mount namespace of its own without the cgroup2 mount.
	hybrid bool
}

func (p podman) args(tool string, args ...string) []string {
	base := []string{tool, "--root", filepath.Join(p.root, "storage"), "--runroot", filepath.Join(p.root, "run"), "--storage-driver", "vfs"}
	if tool == "podman" {
		base = append(base, "--cgroup-manager", "cgroupfs", "--events-backend", "file", "--tmpdir", filepath.Join(p.root, "tmp"))
	}
	argv := append(base, args...)
	if tool == "podman" && p.hybrid {
		q := make([]string, len(argv))
		for i, a := range argv {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		return []string{"unshare", "--mount", "--propagation", "private", "sh", "-c", "umount /sys/fs/cgroup/unified && exec " + strings.Join(q, " ")}
	}
	return argv
}

func (p podman) cmd(tool string, args ...string) *exec.Cmd {
	a := p.args(tool, args...)
	return exec.Command(a[0], a[1:]...)
}

func (p podman) run(tool string, args ...string) string {
	p.t.Helper()
	out, err := p.cmd(tool, args...).CombinedOutput()
	require.NoError(p.t, err, "%s %v:\n%s", tool, args, out)
	return string(out)
}

// daemonSetCapabilities returns what the DaemonSet's readaheadd container
// adds (it drops all others).
func daemonSetCapabilities(t *testing.T) string {
	t.Helper()
	var ds appsv1.DaemonSet
	require.NoError(t, yaml.Unmarshal(read(t, "kubernetes/daemonset.yaml"), &ds))
	c := ds.Spec.Template.Spec.Containers[0]
	require.NotNil(t, c.SecurityContext)
	require.NotNil(t, c.SecurityContext.Capabilities)
	assert.Contains(t, c.SecurityContext.Capabilities.Drop, corev1Capability("ALL"))
	var caps []string
	for _, a := range c.SecurityContext.Capabilities.Add {
		caps = append(caps, string(a))
	}
	require.True(t, ds.Spec.Template.Spec.HostPID, "the DaemonSet runs with hostPID")
	return strings.Join(caps, ",")
}

// TestImageBuildsAndRunsWithTheDaemonSetsPrivileges builds the image with
// buildah from deploy/kubernetes/Dockerfile (the static binary on
// scratch: no base image to pull), then runs it with podman as the
// DaemonSet does: its capabilities only, its seccomp profile, host pids,
// the host's /sys/devices writable under a read-only /sys, read-only root. `check` passes; `run` serves /metrics and acts on a lab device for
// a reader on the host, which sees the data directory at another path
// than the container's volume.
func TestImageBuildsAndRunsWithTheDaemonSetsPrivileges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("image test: needs root (podman with host pids and /sys)")
	}
	for _, tool := range []string{"buildah", "podman", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("image test: %s not installed (Debian: apt-get install buildah podman crun)", tool)
		}
	}
	if testing.Short() {
		t.Skip("image test: skipped in -short mode")
	}
	caps := daemonSetCapabilities(t)
	// podman wants its runroot short (50 characters).
	dir, err := os.MkdirTemp("", "rd-img")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	p := podman{t: t, root: dir}
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers"); err == nil {
		b, _ := os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")
		p.hybrid = strings.TrimSpace(string(b)) != ""
	}
	t.Cleanup(func() {
		// vfs layers are plain directories; podman's own removal first,
		// so that nothing stays mounted.
		_ = p.cmd("podman", "rm", "-f", "-a").Run()
		_ = p.cmd("buildah", "rm", "-a").Run()
	})

	// Build: the static binary into the context, the Dockerfile as is.
	root, err := daemontest.ModuleRoot()
	require.NoError(t, err)
	ctxDir := filepath.Join(dir, "context")
	require.NoError(t, os.Mkdir(ctxDir, 0o755))
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(ctxDir, "readaheadd"), "./cmd/readaheadd")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	start := time.Now()
	p.run("buildah", "bud", "--layers=false", "--build-arg", "BINARY=context", "--build-arg", "BASE_IMAGE=scratch",
		"-f", filepath.Join(root, "deploy/kubernetes/Dockerfile"), "-t", "localhost/readaheadd:test", ctxDir)
	t.Logf("image built in %.1f s", time.Since(start).Seconds())

	// The pod's system call filter, as the kubelet would load it from the
	// node's seccomp directory.
	profile := filepath.Join(root, "deploy/kubernetes/seccomp/readaheadd.json")
	runArgs := func(name string, extra ...string) []string {
		a := []string{"run", "--rm", "--name", name, "--network", "host", "--pid", "host",
			"--cap-drop", "ALL", "--cap-add", caps,
			// allowPrivilegeEscalation: false is no_new_privs, which also
			// lets the runtime load the filter after its own setresgid.
			"--security-opt", "seccomp=" + profile, "--security-opt", "no-new-privileges", "--security-opt", "apparmor=unconfined",
			// The engine's /sys is read-only; only the device tree, where
			// /sys/block/NAME/queue/read_ahead_kb resolves to, is the
			// host's and writable, as in the DaemonSet.
			"--read-only", "-v", "/sys/devices:/sys/devices",
			// The engine's default limits exceed what this process may
			// grant (no CAP_SYS_RESOURCE in some sandboxes).
			"--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"}
		return append(a, extra...)
	}
	checkOut := p.run("podman", append(runArgs("readaheadd-check"), "localhost/readaheadd:test", "check")...)
	t.Logf("readaheadd check in the container:\n%s", checkOut)
	assert.Contains(t, checkOut, "readaheadd can run here")
	assert.Contains(t, checkOut, "ok   host PID namespace", "hostPID: readers' pids are the kernel's")

	// Run against a lab: the container sees the lab's data directory at
	// /data, the reader on the host at the lab's mount point.
	l := lab.New(t, lab.Options{SizeBytes: 1 << 30})
	data := filepath.Join(l.Mount, "hdfs")
	require.NoError(t, os.Mkdir(data, 0o755))
	warm, err := l.WriteFile("hdfs/warm", 150)
	require.NoError(t, err)
	target, err := l.WriteFile("hdfs/blk_1", 500)
	require.NoError(t, err)
	state := filepath.Join(dir, "state")
	require.NoError(t, os.Mkdir(state, 0o700))
	addr := daemontest.FreeAddr(t)
	logs := &daemontest.SyncBuffer{}
	d := p.cmd("podman", append(runArgs("readaheadd-run", "-v", data+":/data", "-v", state+":/var/lib/readaheadd"),
		"localhost/readaheadd:test", "run", "--device", l.Name, "--allow-path", "/data",
		"--state-dir", "/var/lib/readaheadd", "--metrics-addr", addr, "--interval", "1s",
		"--nice", "0")...) // as the DaemonSet's config.yaml: its profile denies setpriority
	d.Stdout, d.Stderr = logs, logs
	require.NoError(t, d.Start())
	done := make(chan error, 1)
	go func() { done <- d.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = p.cmd("podman", "stop", "-t", "20", "readaheadd-run").Run()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = d.Process.Kill()
			<-done
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("daemon in the container:\n%s", logs.String())
		}
	})
	require.Eventually(t, func() bool {
		return daemontest.OK("http://" + addr + "/healthz")
	}, 60*time.Second, 200*time.Millisecond, "the daemon in the container did not become healthy:\n%s", logs)
	// The filter is in force on the daemon (seccomp mode 2, no_new_privs),
	// seen from the host.
	pid := strings.TrimSpace(p.run("podman", "inspect", "-f", "{{.State.Pid}}", "readaheadd-run"))
	status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	require.NoError(t, err, "the daemon's process %q", pid)
	assert.Regexp(t, `(?m)^Seccomp:\s+2$`, string(status), "the daemon runs under the profile")
	assert.Regexp(t, `(?m)^NoNewPrivs:\s+1$`, string(status))
	m := scrape(t, addr)
	for _, s := range []string{
		`readaheadd_probe_attached 1`,
		`readaheadd_read_requests_total{device="` + l.Name + `"}`,
		`readaheadd_read_bytes_total{device="` + l.Name + `"} 0`,
		`readaheadd_read_latency_seconds_bucket{device="` + l.Name + `",le="0.001024"} 0`,
		`readaheadd_read_latency_seconds_bucket{device="` + l.Name + `",le="+Inf"} 0`,
		`readaheadd_actions_total{action="file_window",device="` + l.Name + `",result="kept"} 0`,
	} {
		assert.Contains(t, m, s, "served from the start")
	}

	for i := 0; i < 3; i++ {
		_, err := lab.ReadSeq(warm)
		require.NoError(t, err)
		require.NoError(t, lab.DropFileCache(warm))
	}
	rd, err := lab.OpenSeq(target)
	require.NoError(t, err)
	defer rd.Close()
	require.NoError(t, l.SetPermanent(8*time.Millisecond, target))
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	res, err := rd.Read(rctx, 500*time.Millisecond)
	cancel()
	require.NoError(t, err)
	n := len(res.Samples)
	require.GreaterOrEqual(t, n, 6)
	t.Logf("host reader of %s (the container's /data/blk_1), +8 ms: %.0f MB/s in its first half second, %.0f MB/s in its last 1.5 s",
		target, res.Samples[0].MBps, (res.Samples[n-1].MBps+res.Samples[n-2].MBps+res.Samples[n-3].MBps)/3)

	m = scrape(t, addr)
	acted := 0.0
	for _, r := range []string{"trial", "kept", "applied"} {
		acted += value(m, `readaheadd_actions_total{action="file_window",device="`+l.Name+`",result="`+r+`"}`)
	}
	assert.Positive(t, acted, "per-file actions on the lab device for the host reader")
	assert.Zero(t, value(m, `readaheadd_tuner_errors_total{kind="out_of_scope"}`), "the reader's file is in scope")
	// Under the pod's system call filter: the reader's descriptor taken
	// and advised, the device's window written through /sys/devices.
	assert.Zero(t, value(m, `readaheadd_tuner_errors_total{kind="file_op"}`), "no per-file operation failed under the profile:\n%s", logs)
	for _, refused := range []string{"operation not permitted", "read-only file system"} {
		assert.NotContains(t, logs.String(), refused, "nothing the profile or the mounts refused")
	}
	assert.Contains(t, logs.String(), "/data/blk_1", "the daemon names the file by its path in the container")
	stop()
	assert.Contains(t, logs.String(), "restored; exiting")
}

func corev1Capability(s string) corev1.Capability { return corev1.Capability(s) }

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// value returns the sample of the series named exactly, or 0.
func value(exposition, series string) float64 {
	sc := bufio.NewScanner(strings.NewReader(exposition))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
