package reliability

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestScopeSymlinkAndBindMountThroughDaemon: the allow-path is lab A's
// file system. Inside it, a symlink points to a slowed file on lab B, and
// a directory of lab B is bind-mounted. Readers of the slowed files behind
// both, and of a slowed file really inside, run while the daemon manages
// both devices: only the file inside gets per-file actions; the two
// outside are refused (logged, counted in tuner_errors_total{kind=
// "out_of_scope"}) and no per-file action names them or lab B's device.
func TestScopeSymlinkAndBindMountThroughDaemon(t *testing.T) {
	requireRoot(t, "BPF, the lab and bind mounts")
	a, b := newSlowedLab(t), newSlowedLab(t)
	const origA, origB = 96, 112
	require.NoError(t, a.SetReadAheadKB(origA))
	require.NoError(t, b.SetReadAheadKB(origB))
	require.NoError(t, os.Mkdir(filepath.Join(b.Mount, "sub"), 0o755))
	s1, err := b.WriteFile("sub/s1", 256)
	require.NoError(t, err)
	s2, err := b.WriteFile("sub/s2", 256)
	require.NoError(t, err)
	require.NoError(t, b.SetPermanent(6*time.Millisecond, s1, s2))

	link := filepath.Join(a.Mount, "link")
	require.NoError(t, os.Symlink(s1, link))
	bind := filepath.Join(a.Mount, "bind")
	require.NoError(t, os.Mkdir(bind, 0o755))
	out, err := exec.Command("mount", "--bind", filepath.Join(b.Mount, "sub"), bind).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { _ = unix.Unmount(bind, unix.MNT_DETACH) })
	viaBind := filepath.Join(bind, "s2")

	d := startDaemon(t, "--device", a.Name, "--device", b.Name, "--allow-path", a.Mount,
		"--state-dir", filepath.Join(t.TempDir(), "state"), "--interval", "200ms")
	ctx, cancel := context.WithCancel(context.Background())
	var g group
	var n atomic.Int64
	for _, p := range []string{a.warm, a.slow, b.warm} {
		g.Go(func() error { return readLoop(ctx, p, &n) })
	}
	stop := func() { cancel(); _ = g.Wait() }
	t.Cleanup(stop)

	refusedLog := func(path string) bool {
		for _, l := range strings.Split(d.Logs.String(), "\n") {
			if strings.Contains(l, "outside the allow-paths") && strings.Contains(l, "path="+path) {
				return true
			}
		}
		return false
	}
	// One outside route at a time, so that the outside device has one
	// slowed file and a healthy peer, as the inside one has.
	for _, route := range []struct{ name, open, logged string }{
		{"symlink", link, s1},            // the descriptor names the symlink's target
		{"bind mount", viaBind, viaBind}, // under the allow-path, on lab B's file system
	} {
		rctx, rcancel := context.WithCancel(ctx)
		var rg group
		rg.Go(func() error { return readLoop(rctx, route.open, &n) })
		waitMetric(t, d, "the "+route.name+" route refused", 60*time.Second, func(m string) bool {
			return sum(m, `^readaheadd_tuner_errors_total\{kind="out_of_scope"`) > 0 && refusedLog(route.logged)
		})
		rcancel()
		require.NoError(t, rg.Wait())
		t.Logf("%s route (%s) refused", route.name, route.open)
	}
	m := waitMetric(t, d, "a per-file action inside", 30*time.Second, func(m string) bool {
		return sum(m, `^readaheadd_actions_total\{action="file_window",device="`+a.Name+`",result="(trial|kept|applied)"`) > 0
	})
	time.Sleep(2 * time.Second) // more steps on the refused files
	d.requireHealthy(t, "after refusals")
	m = d.metrics(t)
	perFileB := sum(m, `^readaheadd_actions_total\{action="(file_window|prefetch)",device="`+b.Name+`"`)
	t.Logf("file_window actions inside: %.0f; out_of_scope refusals: %.0f; per-file actions on %s: %.0f; device-wide on %s: %.0f",
		sum(m, `^readaheadd_actions_total\{action="file_window",device="`+a.Name+`"`), sum(m, `^readaheadd_tuner_errors_total\{kind="out_of_scope"`),
		b.Name, perFileB, b.Name, sum(m, `^readaheadd_actions_total\{action="device_window",device="`+b.Name+`"`))
	for _, l := range strings.Split(d.Logs.String(), "\n") {
		if strings.Contains(l, "outside the allow-paths") {
			t.Logf("refused: %s", l[strings.Index(l, "msg="):])
		}
	}
	assert.Zero(t, perFileB, "no per-file action on the outside device")
	var inside int
	for _, act := range d.recentActions(t) {
		if !strings.HasPrefix(act.Action, "file_window") && !strings.HasPrefix(act.Action, "prefetch") {
			continue
		}
		assert.NotEqual(t, b.Name, act.Device, "per-file action on the outside device: %+v", act)
		assert.False(t, strings.HasPrefix(act.Target, b.Mount) || strings.HasPrefix(act.Target, bind) || act.Target == link,
			"per-file action on a file outside the allow-path: %+v", act)
		if act.Target == a.slow {
			inside++
		}
	}
	assert.Positive(t, inside, "the slowed file inside the allow-path got per-file actions")

	stop()
	assert.Equal(t, 0, d.stop(t))
	assert.Equal(t, origA, readKB(t, a.Name))
	assert.Equal(t, origB, readKB(t, b.Name))
}
