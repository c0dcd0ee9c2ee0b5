package reliability

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/test/lab"
)

// slowedLab is a lab with a healthy and a permanently slowed file, read in
// loops until stop is called.
type slowedLab struct {
	*lab.Lab
	warm, slow string
	stop       context.CancelFunc
	g          *group
}

func newSlowedLab(t *testing.T) *slowedLab {
	t.Helper()
	l := lab.New(t, lab.Options{SizeBytes: 1 << 30})
	warm, err := l.WriteFile("warm", 128)
	require.NoError(t, err)
	slow, err := l.WriteFile("slow", 256)
	require.NoError(t, err)
	require.NoError(t, l.SetPermanent(6*time.Millisecond, slow))
	return &slowedLab{Lab: l, warm: warm, slow: slow}
}

func (s *slowedLab) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s.stop, s.g = cancel, &group{}
	var n atomic.Int64
	s.g.Go(func() error { return readLoop(ctx, s.warm, &n) })
	s.g.Go(func() error { return readLoop(ctx, s.slow, &n) })
	t.Cleanup(func() { cancel(); _ = s.g.Wait() })
}

func (s *slowedLab) halt() { s.stop(); _ = s.g.Wait() }

func waitMetric(t *testing.T, d *daemon, what string, timeout time.Duration, ok func(m string) bool) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m := d.metrics(t)
		if ok(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// burst reads 4 KiB O_DIRECT blocks at random offsets of path from n
// goroutines for d: many small requests, more ring records than a tiny
// ring holds between two polls.
func burst(t *testing.T, path string, n int, d time.Duration) int64 {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	size, err := f.Seek(0, 2) // a block device's size too
	require.NoError(t, err)
	f.Close()
	var total atomic.Int64
	var g group
	end := time.Now().Add(d)
	for i := 0; i < n; i++ {
		g.Go(func() error {
			fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
			if err != nil {
				return err
			}
			defer unix.Munmap(buf)
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for time.Now().Before(end) {
				off := rng.Int64N(size/4096) * 4096
				if _, err := unix.Pread(fd, buf, off); err != nil {
					return err
				}
				total.Add(1)
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	return total.Load()
}

// TestFaultsWhileRunning runs one daemon on two lab devices and, in turn:
// makes its state directory read-only (actions that would write a device
// fail without writing it, counted as failed, then work again once it is
// writable), overflows a deliberately tiny ring buffer (lost events
// counted, no crash), and tears one device down under it (the daemon keeps
// serving the other; at exit the other is restored and the gone device's
// record is not written onto whatever reuses its name). Every step checks
// that /healthz stays 200.
func TestFaultsWhileRunning(t *testing.T) {
	requireRoot(t, "BPF and the lab")
	a, b := newSlowedLab(t), newSlowedLab(t)
	const origA, origB = 96, 112
	require.NoError(t, a.SetReadAheadKB(origA))
	require.NoError(t, b.SetReadAheadKB(origB))

	// A plain loop device on a RAM-backed file serves small reads fast
	// enough to overflow the ring (the lab's FUSE server cannot).
	fast := newLoop(t, 64)
	stateDir := filepath.Join(t.TempDir(), "state")
	d := startDaemon(t, "--device", a.Name, "--device", b.Name, "--device", fast.Name, "--allow-path", a.Mount, "--allow-path", b.Mount,
		"--state-dir", stateDir, "--interval", "200ms", "--max-read-ahead-kb", "2048", "--probe-ring-kb", "4",
		// Every request streamed: the probe would otherwise sample the burst
		// down to a rate the ring holds.
		"--probe-sample-budget", "-1")
	healthy := func(what string) {
		t.Helper()
		code, body, err := d.get("/healthz")
		require.NoError(t, err, what)
		require.Equal(t, 200, code, "%s: %s", what, body)
	}

	// 1. The state directory turns read-only.
	out, err := exec.Command("mount", "--bind", stateDir, stateDir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	ro := true
	unmountRO := func() {
		if ro {
			_ = unix.Unmount(stateDir, 0)
			ro = false
		}
	}
	t.Cleanup(unmountRO)
	out, err = exec.Command("mount", "-o", "remount,bind,ro", stateDir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	a.start(t)
	m := waitMetric(t, d, "a failed action while the state dir is read-only", 30*time.Second, func(m string) bool {
		return sum(m, `^readaheadd_actions_total\{.*device="`+a.Name+`".*result="failed"`) > 0
	})
	assert.Equal(t, origA, readKB(t, a.Name), "no write without a recorded original")
	assert.Contains(t, d.Logs.String(), "read-only file system")
	healthy("state dir read-only")
	failed := sum(m, `^readaheadd_actions_total\{.*result="failed"`)
	t.Logf("state dir read-only: %.0f action(s) failed, device %s still at %d KB", failed, a.Name, readKB(t, a.Name))
	unmountRO()
	// The failed step is retried after its back-off; now the original is
	// recorded first, then the device written.
	require.Eventually(t, func() bool { return exists(filepath.Join(stateDir, "originals.json")) }, 30*time.Second, 100*time.Millisecond,
		"the original is recorded once the state dir is writable again")

	// 2. A burst overflows the 4 KiB ring.
	lost0 := sum(d.metrics(t), `^readaheadd_bpf_events_lost_total$`)
	reads := burst(t, fast.Path, 8, 2*time.Second)
	time.Sleep(300 * time.Millisecond)
	m = d.metrics(t)
	lost := sum(m, `^readaheadd_bpf_events_lost_total$`) - lost0
	t.Logf("burst: %d O_DIRECT 4 KiB reads in 2 s; events lost with a 4 KiB ring: %.0f", reads, lost)
	assert.Positive(t, lost, "lost events are counted")
	healthy("after the burst")

	// 3. Device b disappears while the daemon acts on it.
	b.start(t)
	waitMetric(t, d, "actions on "+b.Name, 30*time.Second, func(m string) bool {
		return sum(m, `^readaheadd_actions_total\{.*device="`+b.Name+`".*result="(trial|kept|applied)"`) > 0
	})
	b.halt()
	require.NoError(t, b.Down())
	t.Logf("%s torn down (unmounted, loop detached, FUSE server stopped)", b.Name)
	before := actionsTaken(d.metrics(t))
	time.Sleep(3 * time.Second)
	healthy("after the device went away")
	m = d.metrics(t)
	t.Logf("actions before/after the loss of %s: %.0f/%.0f; tuner errors: %.0f", b.Name, before, actionsTaken(m), sum(m, `^readaheadd_tuner_errors_total`))
	assert.True(t, d.running())

	// 4. SIGTERM: a is restored; b's record is not written onto a reused name.
	a.halt()
	code := d.stop(t)
	logs := d.Logs.String()
	assert.Equal(t, origA, readKB(t, a.Name), "device a back at its original")
	assert.Contains(t, []int{0, 1}, code)
	assert.Contains(t, logs, "was replaced since", "the detached loop device's record is recognised")
	t.Logf("exit code %d", code)
}
