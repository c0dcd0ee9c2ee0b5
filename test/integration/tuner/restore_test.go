package tuner

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/daemontest"
	"github.com/readaheadd/readaheadd/test/lab"
)

// provokeDeviceWindow makes the daemon change the device's own
// read_ahead_kb: a temporal slowdown (a share of every read on the device
// waits 50 ms more) is a device-wide regime, so the tuner tries a
// device-wide window. The readers are random buffered readers (pread): a
// file in a per-file regime (a starved sequential stream, say) is left out
// of the device's tail statistics, and a device-wide window is not taken
// beside a random mmap reader (each of its faults would read the larger
// window around it); a buffered random read reads only what it asks for.
// It returns the value seen once the device left 128.
func provokeDeviceWindow(t *testing.T, l *lab.Lab, d *daemon, files []string) int {
	t.Helper()
	for _, f := range files {
		require.NoError(t, lab.DropFileCache(f))
		startChild(t, "pread", f).goRead(t)
	}
	// Healthy reads first: the tail is judged against a p99 learned over
	// DeviceRegimeMinWindows (8) healthy intervals; 6 s left it to luck
	// on a busy host (no regime in 45 s).
	time.Sleep(10 * time.Second)
	// 50 ms, not 20: on a busy host the lab's own healthy p99 reaches 10 ms
	// and more, and a tail regime is a tail over twice the device's p99.
	_, err := l.SetTemporal(lab.Temporal{Period: time.Hour, Duration: time.Hour, Fraction: 0.05, Extra: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Clear() })
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		kb, err := l.ReadAheadKB()
		require.NoError(t, err)
		if kb != 128 {
			return kb
		}
		select {
		case <-d.done:
			t.Fatalf("daemon exited:\n%s", d.logs.String())
		default:
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("the daemon never changed read_ahead_kb of %s under a device-wide slowdown:\n%s", l.Name, d.logs.String())
	return 0
}

type originals struct {
	Version int `json:"version"`
	Devices []struct {
		Device      string `json:"device"`
		ReadAheadKB int    `json:"read_ahead_kb"`
	} `json:"devices"`
}

func readOriginals(t *testing.T, dir string) (originals, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "originals.json"))
	if os.IsNotExist(err) {
		return originals{}, false
	}
	require.NoError(t, err)
	var o originals
	require.NoError(t, json.Unmarshal(b, &o), "originals.json: %s", b)
	return o, true
}

// TestRestore: after the daemon changed the device's read_ahead_kb,
// SIGTERM puts it back and exits 0; after SIGKILL, `readaheadd restore`
// puts it back, and so does the next plain `readaheadd run` before it acts.
func TestRestore(t *testing.T) {
	needRoot(t)
	l := newLab(t)
	var files []string
	for i := 0; i < 2; i++ {
		p, err := l.WriteFile(fmt.Sprintf("blk_%d", i), 256)
		require.NoError(t, err)
		files = append(files, p)
	}
	daemonBin(t)

	stopReaders := func() {
		require.NoError(t, l.Clear())
	}

	t.Run("SIGTERM", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		d := runDaemon(t, l, dir)
		kb := provokeDeviceWindow(t, l, d, files)
		o, ok := readOriginals(t, dir)
		require.True(t, ok, "the original is recorded before the device is written")
		require.Len(t, o.Devices, 1)
		assert.Equal(t, l.Name, o.Devices[0].Device)
		assert.Equal(t, 128, o.Devices[0].ReadAheadKB)
		t.Logf("daemon set %s to %d KB; original recorded: %+v", l.Name, kb, o.Devices)
		assert.Equal(t, 0, d.signal(t, syscall.SIGTERM), "SIGTERM exits 0:\n%s", d.logs.String())
		after, err := l.ReadAheadKB()
		require.NoError(t, err)
		assert.Equal(t, 128, after, "SIGTERM restores read_ahead_kb")
		_, ok = readOriginals(t, dir)
		assert.False(t, ok, "the record is cleared after a clean stop")
		stopReaders()
	})

	t.Run("SIGKILL then restore", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		d := runDaemon(t, l, dir)
		provokeDeviceWindow(t, l, d, files)
		require.Equal(t, -1, d.signal(t, syscall.SIGKILL))
		left, err := l.ReadAheadKB()
		require.NoError(t, err)
		require.NotEqual(t, 128, left, "the kill left the device changed (else this test shows nothing)")
		_, ok := readOriginals(t, dir)
		require.True(t, ok, "the killed daemon's record survives")
		stopReaders()

		code, out := runCLI(t, "restore", "--state-dir", dir)
		t.Logf("readaheadd restore (device left at %d KB): exit %d\n%s", left, code, out)
		assert.Equal(t, 0, code)
		kb, err := l.ReadAheadKB()
		require.NoError(t, err)
		assert.Equal(t, 128, kb, "restore puts the original back")
		_, ok = readOriginals(t, dir)
		assert.False(t, ok, "restore clears the record")
		// A second restore has nothing to do.
		code, out = runCLI(t, "restore", "--state-dir", dir)
		assert.Equal(t, 0, code, out)
	})

	t.Run("SIGKILL then run", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		d := runDaemon(t, l, dir)
		provokeDeviceWindow(t, l, d, files)
		require.Equal(t, -1, d.signal(t, syscall.SIGKILL))
		left, err := l.ReadAheadKB()
		require.NoError(t, err)
		require.NotEqual(t, 128, left, "the kill left the device changed")
		stopReaders()

		// The next start restores before anything else: healthy means it
		// is already running its loop, so the value must be back by then.
		d2 := runDaemon(t, l, dir)
		kb, err := l.ReadAheadKB()
		require.NoError(t, err)
		assert.Equal(t, 128, kb, "a plain start restores the killed run's changes first")
		assert.Contains(t, d2.logs.String(), "restored original read_ahead_kb", "the start says what it restored")
		// The original it now holds is the true one, not the value the
		// killed run left.
		assert.Equal(t, 0, d2.signal(t, syscall.SIGTERM))
		kb, err = l.ReadAheadKB()
		require.NoError(t, err)
		assert.Equal(t, 128, kb)
		_, ok := readOriginals(t, dir)
		assert.False(t, ok)
		t.Logf("device left at %d KB by the killed run; the next start put %d KB back", left, kb)
	})
}

// TestCorruptStateFile: a state file that cannot be read is reported,
// naming the file, with exit code 1, and nothing is written to sysfs, by
// `run` and by `restore`.
func TestCorruptStateFile(t *testing.T) {
	needRoot(t)
	l := newLab(t)
	// A value the corrupt record would overwrite if it were trusted.
	require.NoError(t, l.SetReadAheadKB(384))
	t.Cleanup(func() { _ = l.SetReadAheadKB(128) })
	dir := filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	path := filepath.Join(dir, "originals.json")
	corrupt := fmt.Sprintf(`{"version":1,"boot_id":"x","devices":[{"device":%q,"dev":%q,"read_ahead_kb":128`, l.Name, l.Dev.String())
	require.NoError(t, os.WriteFile(path, []byte(corrupt), 0o600))

	for _, args := range [][]string{
		{"run", "--device", l.Name, "--allow-path", l.Mount, "--state-dir", dir, "--metrics-addr", daemontest.FreeAddr(t)},
		{"restore", "--state-dir", dir},
	} {
		code, out := runCLI(t, args...)
		t.Logf("readaheadd %s with a truncated state file: exit %d\n%s", args[0], code, strings.TrimSpace(out))
		assert.Equal(t, 1, code, "readaheadd %s exits 1", args[0])
		assert.Contains(t, out, path, "the message names the file")
		kb, err := l.ReadAheadKB()
		require.NoError(t, err)
		assert.Equal(t, 384, kb, "nothing written to sysfs by %s", args[0])
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, corrupt, string(b), "the corrupt file is left for the operator")
	}
}
