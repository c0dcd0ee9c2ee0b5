package main

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/pkg/config"
	"github.com/readaheadd/readaheadd/pkg/metrics"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
	"github.com/readaheadd/readaheadd/pkg/tuner"
)

func TestPipelineStatusAndActionCounts(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 256})
	c := config.Default()
	c.Devices = []string{"sdx"}
	c.StateDir = filepath.Join(t.TempDir(), "state")
	v, err := config.Validate(c, sys)
	require.NoError(t, err)
	st, err := state.Open(v.StateDir, state.Options{BootID: "b"})
	require.NoError(t, err)
	defer st.Close()
	clk := clock.NewFake(time.Hour)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctl, err := newController(controlDeps{cfg: v, sys: sys, clk: clk, store: st, log: log})
	require.NoError(t, err)
	p := ctl.(*pipeline)

	// Records reach the detector; a step produces a snapshot.
	_, ok := p.Snapshot()
	assert.False(t, ok, "no snapshot before the first step")
	dev := v.Disks[0].Dev
	for i := 0; i < 50; i++ {
		p.HandleRecord(probe.Record{Device: dev, Bytes: 131072, Issue: clk.Now() - time.Millisecond, Latency: 500 * time.Microsecond,
			Kind: probe.KindFile, File: probe.FileKey{Dev: dev, Ino: 7}, Offset: uint64(i) * 131072, Depth: 1})
	}
	p.Step(clk.Now())
	snap, ok := p.Snapshot()
	require.True(t, ok)
	require.NotEmpty(t, snap.Devices)
	assert.Equal(t, uint64(50), snap.Devices[0].Requests)

	// Undo actions count under their knob, with their result.
	p.count([]tuner.Action{
		{Device: "sdx", Kind: tuner.KindFileWindow, Result: tuner.ResultKept},
		{Device: "sdx", Kind: tuner.KindFileWindowUndo, Result: tuner.ResultUndone},
		{Device: "sdx", Kind: tuner.KindFileWindowUndo, Result: tuner.ResultUndone},
		{Device: "sdx", Kind: tuner.KindDeviceWindow, Result: tuner.ResultFailed},
	})
	ts := p.TunerStatus()
	assert.ElementsMatch(t, []metrics.ActionCount{
		{Device: "sdx", Action: "file_window", Result: "kept", Count: 1},
		{Device: "sdx", Action: "file_window", Result: "undone", Count: 2},
		{Device: "sdx", Action: "device_window", Result: "failed", Count: 1},
	}, ts.Actions)
	// An untouched device is exported at its current (= original) window.
	require.Len(t, ts.Devices, 1)
	assert.Equal(t, metrics.DeviceState{Name: "sdx", Dev: dev.String(), ReadAheadKB: 256, OriginalKB: 256}, ts.Devices[0])
	require.NoError(t, p.RestoreAll())
}

// The detector's baseline survives a restart through the state directory,
// and a corrupt baseline file only costs relearning.
func TestPipelineKeepsBaselineAcrossRestarts(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	c := config.Default()
	c.Devices = []string{"sdx"}
	c.StateDir = filepath.Join(t.TempDir(), "state")
	v, err := config.Validate(c, sys)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(v.StateDir, 0o700))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var st *state.Store
	start := func(clk *clock.Fake) *pipeline {
		if st != nil {
			require.NoError(t, st.Close()) // the previous daemon has exited
		}
		st, err = state.Open(v.StateDir, state.Options{BootID: "b"})
		require.NoError(t, err)
		ctl, err := newController(controlDeps{cfg: v, sys: sys, clk: clk, store: st, log: log})
		require.NoError(t, err)
		return ctl.(*pipeline)
	}

	clk := clock.NewFake(time.Hour)
	p := start(clk)
	dev := v.Disks[0].Dev
	// Two minutes of healthy sequential reads: enough windows to learn a baseline.
	for s := 0; s < 120; s++ {
		for i := 0; i < 200; i++ {
			at := clk.Now() + time.Duration(i)*5*time.Millisecond
			off := uint64(s*200+i) * 131072
			p.HandleRecord(probe.Record{Device: dev, Sector: off / 512, Bytes: 131072, Issue: at, Latency: 400 * time.Microsecond,
				Kind: probe.KindFile, File: probe.FileKey{Dev: dev, Ino: 7}, Offset: off, Depth: 1})
		}
		clk.Advance(time.Second)
		p.Step(clk.Now())
	}
	snap, _ := p.Snapshot()
	require.True(t, snap.Devices[0].BaselineLearned, "a healthy period teaches a baseline")
	path := filepath.Join(v.StateDir, BaselineFile)
	assert.FileExists(t, path, "saved periodically while running")
	require.NoError(t, p.RestoreAll())

	// A new daemon starts with the learned baseline before seeing any record.
	p2 := start(clock.NewFake(2 * time.Hour))
	p2.Step(2 * time.Hour)
	snap2, _ := p2.Snapshot()
	require.NotEmpty(t, snap2.Devices)
	assert.True(t, snap2.Devices[0].BaselineLearned)
	assert.Equal(t, snap.Devices[0].BaselineP50, snap2.Devices[0].BaselineP50)

	// A corrupt file is ignored (relearned), not fatal.
	require.NoError(t, os.WriteFile(path, []byte("{not json"), 0o600))
	p3 := start(clock.NewFake(3 * time.Hour))
	p3.Step(3 * time.Hour)
	snap3, _ := p3.Snapshot()
	for _, d := range snap3.Devices {
		assert.False(t, d.BaselineLearned)
	}
	require.NoError(t, st.Close())
}

func TestPipelineFastPathEntersAStrongShiftBetweenSteps(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 256})
	c := config.Default()
	c.Devices = []string{"sdx"}
	c.StateDir = filepath.Join(t.TempDir(), "state")
	v, err := config.Validate(c, sys)
	require.NoError(t, err)
	st, err := state.Open(v.StateDir, state.Options{BootID: "b"})
	require.NoError(t, err)
	defer st.Close()
	clk := clock.NewFake(time.Hour)
	var logBuf strings.Builder
	log := slog.New(slog.NewJSONHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctl, err := newController(controlDeps{cfg: v, sys: sys, clk: clk, store: st, log: log})
	require.NoError(t, err)
	p := ctl.(*pipeline)
	dev := v.Disks[0].Dev
	feed := func(ino uint64, n int, lat time.Duration, span time.Duration) {
		var next uint64
		for i := 0; i < n; i++ {
			clk.Advance(span / time.Duration(n))
			p.HandleRecord(probe.Record{Device: dev, Bytes: 131072, Issue: clk.Now() - lat, Latency: lat, Sector: ino<<24 + next*256,
				Kind: probe.KindFile, File: probe.FileKey{Dev: dev, Ino: ino}, Offset: next * 131072, Depth: 1})
			next++
		}
	}
	// A healthy baseline.
	for s := 0; s < 6; s++ {
		feed(7, 100, 500*time.Microsecond, time.Second)
		p.Step(clk.Now())
	}
	// A newly opened file read at three times the baseline latency.
	feed(9, 40, 1500*time.Microsecond, 300*time.Millisecond)
	fastAt := clk.Now()
	p.ApplyPending()
	clk.Advance(700 * time.Millisecond)
	p.Step(clk.Now())
	snap, ok := p.Snapshot()
	require.True(t, ok)
	var found bool
	for _, r := range snap.Regimes {
		if r.File.Ino == 9 {
			found = true
			assert.Equal(t, fastAt, r.Since, "entered between steps, by the fast path")
		}
	}
	assert.True(t, found, "regimes: %+v", snap.Regimes)
	// The entry is logged once, at INFO, with the fast path's evidence.
	assert.Equal(t, 1, strings.Count(logBuf.String(), `"msg":"detector: regime entered"`), logBuf.String())
	assert.Contains(t, logBuf.String(), `"evidence":"fast path: file`)
}

// /debug/files and /debug/status show no path outside the allow-paths: a
// file this process holds open outside them (its /proc/PID/fd names it)
// appears as device:inode only.
func TestDebugEndpointsShowNoPathOutsideScope(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 256})
	c := config.Default()
	c.Devices = []string{"sdx"}
	c.StateDir = filepath.Join(t.TempDir(), "state")
	c.AllowPaths = []string{t.TempDir()}
	v, err := config.Validate(c, sys)
	require.NoError(t, err)
	st, err := state.Open(v.StateDir, state.Options{BootID: "b"})
	require.NoError(t, err)
	defer st.Close()
	clk := clock.NewFake(time.Hour)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctl, err := newController(controlDeps{cfg: v, sys: sys, clk: clk, store: st, log: log})
	require.NoError(t, err)
	p := ctl.(*pipeline)

	secret := filepath.Join(t.TempDir(), "secret-outside-scope")
	require.NoError(t, os.WriteFile(secret, []byte("x"), 0o600))
	f, err := os.Open(secret)
	require.NoError(t, err)
	defer f.Close()
	var sst unix.Stat_t
	require.NoError(t, unix.Fstat(int(f.Fd()), &sst))
	key := probe.FileKey{Dev: probe.DevFromUnix(sst.Dev), Ino: sst.Ino}
	dev := v.Disks[0].Dev
	p.HandleReadahead(probe.ReadaheadEvent{Tgid: uint32(os.Getpid()), File: key, Device: dev, RaPages: 32})
	for i := 0; i < 50; i++ {
		p.HandleRecord(probe.Record{Device: dev, Bytes: 131072, Issue: clk.Now() - time.Millisecond, Latency: 500 * time.Microsecond,
			Kind: probe.KindFile, File: key, Offset: uint64(i) * 131072, Depth: 1})
	}
	p.Step(clk.Now())
	srv := metrics.NewServer(metrics.Sources{Detector: p.Snapshot, Tuner: p.TunerStatus, FilePath: p.FilePath}, nil, nil, "test", log)
	for _, path := range []string{"/debug/files", "/debug/status"} {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		require.Equal(t, 200, rec.Code)
		assert.NotContains(t, rec.Body.String(), "secret-outside-scope", path)
		if path == "/debug/files" {
			assert.Contains(t, rec.Body.String(), key.String())
		}
	}
	require.NoError(t, p.RestoreAll())
}

func TestInAllowPaths(t *testing.T) {
	allow := []string{"/data/1", "/srv"}
	for path, want := range map[string]bool{
		"/data/1/blk_1": true, "/data/1": true, "/data/10/blk": false, "/data/1/../2/x": false,
		"/etc/shadow": false, "": false, "relative/x": false, "/srv/a (deleted)": true,
	} {
		assert.Equal(t, want, inAllowPaths(path, allow), path)
	}
	assert.True(t, inAllowPaths("/anything", []string{"/"}))
}

// The baseline in the state directory is read and written like the other
// state files: a symlink planted under its name is neither read nor
// written through.
func TestBaselineFileIsNotFollowed(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	c := config.Default()
	c.Devices = []string{"sdx"}
	c.StateDir = filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.MkdirAll(c.StateDir, 0o700))
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious\n"), 0o644))
	require.NoError(t, os.Symlink(victim, filepath.Join(c.StateDir, BaselineFile)))
	v, err := config.Validate(c, sys)
	require.NoError(t, err)
	st, err := state.Open(v.StateDir, state.Options{BootID: "b"})
	require.NoError(t, err)
	defer st.Close()
	ctl, err := newController(controlDeps{cfg: v, sys: sys, clk: clock.NewFake(time.Hour), store: st, log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	p := ctl.(*pipeline)
	assert.ErrorIs(t, p.loadBaseline(), state.ErrUnsafeFile)
	require.NoError(t, p.RestoreAll()) // saves the baseline
	b, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "precious\n", string(b))
	fi, err := os.Lstat(filepath.Join(c.StateDir, BaselineFile))
	require.NoError(t, err)
	assert.True(t, fi.Mode().IsRegular(), "the link was replaced by the file")
}
