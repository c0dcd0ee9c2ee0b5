package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/test/daemontest"
)

func TestTraceFlagValidation(t *testing.T) {
	for _, args := range [][]string{
		{"trace", "--interval", "0s"},
		{"trace", "--format", "xml"},
		{"trace", "--top", "-1"},
		{"trace", "--bogus"},
	} {
		root := newRootCmd()
		root.SetArgs(args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		err := root.Execute()
		var ue usageError
		assert.True(t, errors.As(err, &ue), "%v: want a usage error, got %v", args, err)
	}
	// An unknown device is a usage error too, found before anything is loaded.
	err := runTrace(context.Background(), traceOptions{devices: []string{"nosuchdisk0"}, interval: time.Second,
		format: "text", sysfs: t.TempDir()}, io.Discard)
	var ue usageError
	assert.True(t, errors.As(err, &ue), "got %v", err)
}

func traceSh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %v: %s", name, args, out)
	return strings.TrimSpace(string(out))
}

func TestTraceJSONOnLoopDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs and creates a loop device")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	require.NoError(t, os.WriteFile(img, nil, 0o600))
	require.NoError(t, os.Truncate(img, 128<<20))
	loop := traceSh(t, "losetup", "--find", "--show", "--direct-io=on", img)
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })
	traceSh(t, "mkfs.ext4", "-q", "-F", loop)
	mnt := filepath.Join(dir, "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	traceSh(t, "mount", loop, mnt)
	t.Cleanup(func() {
		if unix.Unmount(mnt, 0) != nil {
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	file := filepath.Join(mnt, "data")
	f, err := os.Create(file)
	require.NoError(t, err)
	_, err = io.CopyN(f, rand.Reader, 32<<20)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	var st unix.Stat_t
	require.NoError(t, unix.Stat(file, &st))
	key := probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}
	unix.Sync()
	require.NoError(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0))

	var out daemontest.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runTrace(ctx, traceOptions{devices: []string{filepath.Base(loop)}, interval: 200 * time.Millisecond,
			format: "json", top: 5, sysfs: "/sys"}, &out)
	}()
	time.Sleep(300 * time.Millisecond) // attached
	traceSh(t, "dd", "if="+file, "of=/dev/null", "bs=1M")
	time.Sleep(600 * time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	var bytesRead uint64
	var sawReader, sawPath bool
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		var rep struct {
			Files []struct {
				File     string `json:"file"`
				Disk     string `json:"disk"`
				Path     string `json:"path"`
				Bytes    uint64 `json:"bytes"`
				P99      float64
				MeanLat  float64                 `json:"mean_latency_ms"`
				Readers  []struct{ Comm string } `json:"readers"`
				Resolved bool                    `json:"path_resolved"`
			} `json:"files"`
			Devices []struct {
				Name string `json:"name"`
			} `json:"devices"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rep), sc.Text())
		for _, f := range rep.Files {
			if f.File != key.String() {
				continue
			}
			assert.Equal(t, filepath.Base(loop), f.Disk)
			assert.Greater(t, f.MeanLat, 0.0)
			bytesRead += f.Bytes
			for _, r := range f.Readers {
				sawReader = sawReader || r.Comm == "dd"
			}
			// dd has exited by the last report, so a path is best effort;
			// the fallback names the mount point.
			sawPath = sawPath || f.Path == file || strings.HasPrefix(f.Path, mnt)
		}
	}
	assert.GreaterOrEqual(t, float64(bytesRead), 0.99*float64(32<<20), "output:\n%s", out.String())
	assert.True(t, sawReader, "dd not reported as the reader")
	assert.True(t, sawPath, "no path or mount point for the file")
}
