package state

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPriorsRoundTripAndBounds(t *testing.T) {
	p := filepath.Join(t.TempDir(), PriorsName)
	got, err := LoadPriors(p)
	require.NoError(t, err, "a missing file is no priors")
	assert.Empty(t, got.Dirs)

	var in Priors
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < MaxPriorDirs+10; i++ {
		in.Dirs = append(in.Dirs, DirPrior{Dev: 7, Device: "sdb", Dir: fmt.Sprintf("/data/d%d", i), WindowKB: 1024, BaseKB: 128,
			BaseBPS: 60e6, KeptBPS: 150e6, Streams: 1, Updated: base.Add(time.Duration(i) * time.Second)})
	}
	in.Files = []SlowFile{{Dev: 7, Ino: 12, Device: "sdb", Path: "/data/d1/blk_1", WindowKB: 512, Updated: base}}
	in.Devices = []DeviceCapacity{{Device: "sdb", CapacityBPS: 80e6, Updated: base}, {Device: "sdc", CapacityBPS: -1, Updated: base},
		{Device: "sdd", FittedBPS: 150e6, Updated: base}, {Device: "sde", CapacityBPS: 80e6, FittedBPS: -1, Updated: base}}
	require.NoError(t, SavePriors(p, in))
	st, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	left, _ := filepath.Glob(p + ".tmp*")
	assert.Empty(t, left)

	got, err = LoadPriors(p)
	require.NoError(t, err)
	require.Len(t, got.Dirs, MaxPriorDirs, "bounded, newest kept")
	assert.Equal(t, fmt.Sprintf("/data/d%d", MaxPriorDirs+9), got.Dirs[0].Dir)
	require.Len(t, got.Files, 1)
	assert.Equal(t, uint64(12), got.Files[0].Ino)
	require.Len(t, got.Devices, 2, "a capacity that is not a rate is dropped")
	assert.Equal(t, DeviceCapacity{Device: "sdb", CapacityBPS: 80e6, Updated: base}, got.Devices[0])
	assert.Equal(t, DeviceCapacity{Device: "sdd", FittedBPS: 150e6, Updated: base}, got.Devices[1], "a fitted capacity alone")
}

func TestPriorsRejectsWhatIsNotAPriorsFile(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"garbage":   "{",
		"foreign":   `{"format":"x","version":1,"dirs":[],"files":[]}`,
		"version":   `{"format":"readaheadd-priors","version":2,"dirs":[],"files":[]}`,
		"unknown":   `{"format":"readaheadd-priors","version":1,"dirs":[],"files":[],"extra":1}`,
		"oversized": `{"format":"readaheadd-priors","version":1,"dirs":[],"files":[]}` + strings.Repeat(" ", MaxPriorsBytes),
	} {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		_, err := LoadPriors(p)
		assert.Error(t, err, name)
	}
	// Malformed entries are dropped, the rest kept.
	p := filepath.Join(dir, "entries")
	require.NoError(t, os.WriteFile(p, []byte(`{"format":"readaheadd-priors","version":1,"dirs":[
		{"dev":7,"device":"sdb","dir":"relative","window_kb":512,"base_kb":128},
		{"dev":7,"device":"sdb","dir":"/data","window_kb":-1,"base_kb":128},
		{"dev":7,"device":"sdb","dir":"/data/x/../y","window_kb":512,"base_kb":128}],"files":[{"dev":0,"ino":1,"device":"sdb","window_kb":512}]}`), 0o600))
	got, err := LoadPriors(p)
	require.NoError(t, err)
	require.Len(t, got.Dirs, 1)
	assert.Equal(t, "/data/y", got.Dirs[0].Dir)
	assert.Empty(t, got.Files)
}
