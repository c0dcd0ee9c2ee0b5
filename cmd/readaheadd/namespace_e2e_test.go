package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/lab"
)

var ddRate = regexp.MustCompile(`(\d+) bytes .* copied, ([0-9.]+) s`)

// ddMBps runs argv (ending in a dd command) and returns the rate dd
// reports, in MB/s.
func ddMBps(argv ...string) (float64, string, error) {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return 0, string(out), fmt.Errorf("%v: %w: %s", argv, err, out)
	}
	m := ddRate.FindStringSubmatch(string(out))
	if m == nil {
		return 0, string(out), fmt.Errorf("no rate in dd's output: %s", out)
	}
	b, _ := strconv.ParseFloat(m[1], 64)
	s, _ := strconv.ParseFloat(m[2], 64)
	return b / s / 1e6, string(out), nil
}

// TestEndToEndReaderInItsOwnMountNamespace: two readers of equally slowed
// files run side by side while the daemon runs with the lab's file system
// as allow-path. One reads on the host; the other in a mount namespace of
// its own that sees the lab through a bind mount at another path, as a
// pod sees a hostPath volume. The namespaced reader must get at least 0.9
// of the host reader's throughput, and the daemon must not log it as
// outside the allow-paths.
func TestEndToEndReaderInItsOwnMountNamespace(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end lab test: skipped in -short mode")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1) (util-linux)")
	}
	l := lab.New(t, lab.Options{SizeBytes: 2 << 30})
	kb, err := l.ReadAheadKB()
	require.NoError(t, err)
	t.Logf("%s read_ahead_kb %d", l.Name, kb)
	const mb = 400
	warm, err := l.WriteFile("warm", 200)
	require.NoError(t, err)
	require.NoError(t, os.Mkdir(filepath.Join(l.Mount, "data"), 0o755))
	hostFile, err := l.WriteFile("data/host", mb)
	require.NoError(t, err)
	podFile, err := l.WriteFile("data/pod", mb)
	require.NoError(t, err)
	for _, p := range []string{warm, hostFile, podFile} {
		require.NoError(t, lab.DropFileCache(p))
	}

	d := startDaemon(t, "--device", l.Name, "--allow-path", filepath.Join(l.Mount, "data"),
		"--state-dir", filepath.Join(t.TempDir(), "state"), "--interval", "1s")
	for i := 0; i < 3; i++ {
		_, err := lab.ReadSeq(warm)
		require.NoError(t, err)
		require.NoError(t, lab.DropFileCache(warm))
	}
	require.NoError(t, l.SetPermanent(8*time.Millisecond, hostFile, podFile))

	// The pod's view: the lab's data directory at /pod/volume-like path.
	vol := filepath.Join(t.TempDir(), "volume")
	require.NoError(t, os.Mkdir(vol, 0o755))
	podPath := filepath.Join(vol, "pod")
	var (
		wg         sync.WaitGroup
		host, pod  float64
		herr, perr error
		pout       string
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		host, _, herr = ddMBps("dd", "if="+hostFile, "of=/dev/null", "bs=64k")
	}()
	go func() {
		defer wg.Done()
		pod, pout, perr = ddMBps("unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$0" "$1" && exec dd if="$1/pod" of=/dev/null bs=64k`, filepath.Join(l.Mount, "data"), vol)
	}()
	wg.Wait()
	require.NoError(t, herr)
	require.NoError(t, perr)
	t.Logf("side by side, +8 ms on both files: host reader %.0f MB/s, reader in its own mount namespace (sees %s) %.0f MB/s: %.2fx",
		host, podPath, pod, pod/host)
	t.Logf("namespaced dd: %s", strings.TrimSpace(pout))

	m := d.metrics(t)
	var acts []string
	for _, a := range actionLine.FindAllStringSubmatch(m, -1) {
		if a[4] != "0" {
			acts = append(acts, a[1]+"/"+a[3]+"="+a[4])
		}
	}
	t.Logf("actions: %v", acts)
	logs := d.logs.String()
	assert.NotContains(t, logs, "outside the allow-paths", "the namespaced reader's file is in scope")
	assert.Contains(t, logs, filepath.Join(l.Mount, "data", "pod"), "the daemon acted on the pod's file (logged with its host path)")
	assert.GreaterOrEqual(t, pod, 0.9*host, "the namespaced reader gets what the host reader gets")
	v, _ := sample(m, `readaheadd_tuner_errors_total{kind="out_of_scope"}`)
	assert.Zero(t, v)
}
