package reliability

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/lab"
)

// actionsTaken sums the tuner's actions that wrote something (trials,
// kept decisions, new readers reached, undos).
func actionsTaken(m string) float64 {
	return sum(m, `^readaheadd_actions_total\{.*result="(trial|kept|applied|undone)"`)
}

// TestSIGKILLDuringActionsThenRestore kills the daemon with SIGKILL at
// random moments while it acts on a lab device (per-file windows by
// raise-pin-restore and device-wide raises both write read_ahead_kb), then
// runs `readaheadd restore`: the device must be back at its original value
// every time.
func TestSIGKILLDuringActionsThenRestore(t *testing.T) {
	requireRoot(t, "BPF and the lab")
	iterations := 20
	if lab.Full() {
		iterations = 50
	}
	l := lab.New(t, lab.Options{SizeBytes: 2 << 30})
	// An original no default produces, so a value left behind shows.
	const orig = 96
	require.NoError(t, l.SetReadAheadKB(orig))
	warm, err := l.WriteFile("warm", 256)
	require.NoError(t, err)
	slow, err := l.WriteFile("slow", 512)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	var g group
	var rd atomic.Int64
	g.Go(func() error { return readLoop(ctx, warm, &rd) })
	g.Go(func() error { return readLoop(ctx, slow, &rd) })
	t.Cleanup(func() { cancel(); _ = g.Wait() })
	require.NoError(t, l.SetPermanent(6*time.Millisecond, slow))
	_, err = l.SetTemporal(lab.Temporal{Period: 2 * time.Second, Duration: time.Second, Fraction: 0.1, Extra: 25 * time.Millisecond})
	require.NoError(t, err)

	stateDir := filepath.Join(t.TempDir(), "state")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var acted, leftChanged, restoredSomething, pinsLeft, pinsReset int
	for i := 0; i < iterations; i++ {
		d := startDaemon(t, "--device", l.Name, "--allow-path", l.Mount, "--state-dir", stateDir,
			"--interval", "200ms", "--max-read-ahead-kb", "2048")
		// Wait for the first action (or a few seconds), then kill at a
		// random point among the actions that follow.
		deadline := time.Now().Add(6 * time.Second)
		n := 0.0
		for time.Now().Before(deadline) {
			if n = actionsTaken(d.metrics(t)); n > 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if n > 0 {
			acted++
		}
		time.Sleep(time.Duration(rng.Int64N(int64(1500 * time.Millisecond))))
		d.kill(t)
		at := readKB(t, l.Name)
		if exists(filepath.Join(stateDir, "pins.json")) {
			pinsLeft++
		}
		if at != orig {
			leftChanged++
		}
		r := runBin(t, nil, "restore", "--state-dir", stateDir)
		require.Equal(t, 0, r.code, "iteration %d: restore failed: %s%s", i, r.stdout, r.stderr)
		if strings.Contains(r.stdout, "restored to") {
			restoredSomething++
		}
		require.Equal(t, orig, readKB(t, l.Name), "iteration %d: device not back at its original after restore (at kill: %d KB)\n%s", i, at, r.stdout)
		_, err := os.Stat(filepath.Join(stateDir, "originals.json"))
		require.True(t, os.IsNotExist(err), "iteration %d: record left after restore", i)
		// The readers (this process) still hold their files open: each
		// window the killed daemon pinned was reset, none left recorded.
		require.False(t, exists(filepath.Join(stateDir, "pins.json")), "iteration %d: per-file windows left after restore: %s", i, r.stdout)
		if strings.Contains(r.stdout, "window(s) reset") {
			pinsReset++
		}
		t.Logf("iteration %2d: %3.0f actions before the kill, device at %4d KB when killed, restore: %s", i, n, at, strings.TrimSpace(r.stdout))
	}
	t.Logf("%d SIGKILLs: daemon had acted before %d, device left changed by %d, restore wrote an original back %d times; device back at %d KB every time; "+
		"per-file windows recorded at %d kills, reset by restore %d times",
		iterations, acted, leftChanged, restoredSomething, orig, pinsLeft, pinsReset)
	assert.Positive(t, pinsLeft, "some kill left pinned open files to reset")
	assert.Equal(t, pinsLeft, pinsReset, "restore reset them every time")
	assert.GreaterOrEqual(t, acted, iterations/2, "the daemon acted on the device before most kills")
	assert.Positive(t, restoredSomething, "some kill left a recorded original to restore")
}
