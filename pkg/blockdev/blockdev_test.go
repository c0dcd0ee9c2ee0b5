package blockdev

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// fakeSys builds a sysfs tree with one real disk (sda, with a partition),
// a loop device and a zram device.
func fakeSys(t *testing.T) SysFS {
	t.Helper()
	root := t.TempDir()
	write := func(p, v string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), []byte(v), 0o644))
	}
	devices := filepath.Join(root, "devices", "pci0000:00", "block")
	for name, dev := range map[string]string{"sda": "8:0", "loop3": "7:3", "zram0": "252:0"} {
		dir := filepath.Join(devices, name)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "queue"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "dev"), []byte(dev+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "queue", "read_ahead_kb"), []byte("128\n"), 0o644))
		require.NoError(t, os.MkdirAll(filepath.Join(root, "block"), 0o755))
		require.NoError(t, os.Symlink(dir, filepath.Join(root, "block", name)))
		require.NoError(t, os.MkdirAll(filepath.Join(root, "dev", "block"), 0o755))
		require.NoError(t, os.Symlink(dir, filepath.Join(root, "dev", "block", dev)))
	}
	part := filepath.Join(devices, "sda", "sda1")
	write(filepath.Join("devices", "pci0000:00", "block", "sda", "sda1", "dev"), "8:1\n")
	write(filepath.Join("devices", "pci0000:00", "block", "sda", "sda1", "partition"), "1\n")
	require.NoError(t, os.Symlink(part, filepath.Join(root, "dev", "block", "8:1")))
	return SysFS{Root: root}
}

func TestLookupAndList(t *testing.T) {
	s := fakeSys(t)
	d, err := s.Lookup("sda")
	require.NoError(t, err)
	assert.Equal(t, probe.MkDev(8, 0), d.Dev)

	_, err = s.Lookup("sdz")
	assert.ErrorIs(t, err, ErrNoDevice)

	all, err := s.Disks()
	require.NoError(t, err)
	assert.Equal(t, []string{"loop3", "sda", "zram0"}, names(all))

	def, err := s.DefaultDisks()
	require.NoError(t, err)
	assert.Equal(t, []string{"sda"}, names(def))

	byDev, err := s.ByDev(probe.MkDev(7, 3))
	require.NoError(t, err)
	assert.Equal(t, "loop3", byDev.Name)
}

func TestInvalidNames(t *testing.T) {
	s := fakeSys(t)
	for _, n := range []string{"", ".", "..", "../sda", "sda/queue", "a\x00b"} {
		_, err := s.Lookup(n)
		assert.Error(t, err, n)
		assert.Error(t, s.SetReadAheadKB(n, 256), n)
	}
}

func TestReadAheadRoundTrip(t *testing.T) {
	s := fakeSys(t)
	kb, err := s.ReadAheadKB("sda")
	require.NoError(t, err)
	assert.Equal(t, 128, kb)
	require.NoError(t, s.SetReadAheadKB("sda", 1024))
	kb, err = s.ReadAheadKB("sda")
	require.NoError(t, err)
	assert.Equal(t, 1024, kb)

	assert.ErrorIs(t, s.SetReadAheadKB("sdq", 256), ErrNoDevice)
	_, err = os.Stat(filepath.Join(s.Root, "block", "sdq"))
	assert.True(t, os.IsNotExist(err), "a write to a missing device must not create it")
	assert.Error(t, s.SetReadAheadKB("sda", -1))
}

func TestReadAheadGarbage(t *testing.T) {
	s := fakeSys(t)
	require.NoError(t, os.WriteFile(filepath.Join(s.Root, "block", "sda", "queue", "read_ahead_kb"), []byte("lots\n"), 0o644))
	_, err := s.ReadAheadKB("sda")
	assert.ErrorContains(t, err, "not a size")
}

func TestDiskOfPartition(t *testing.T) {
	s := fakeSys(t)
	d, err := s.DiskOf(probe.MkDev(8, 1))
	require.NoError(t, err)
	assert.Equal(t, "sda", d.Name)
	d, err = s.DiskOf(probe.MkDev(7, 3))
	require.NoError(t, err)
	assert.Equal(t, "loop3", d.Name)
	_, err = s.DiskOf(probe.MkDev(9, 9))
	assert.ErrorIs(t, err, ErrNoDevice)
}

func TestParseDev(t *testing.T) {
	d, err := ParseDev("259:1\n")
	require.NoError(t, err)
	assert.Equal(t, uint32(259), d.Major())
	assert.Equal(t, uint32(1), d.Minor())
	for _, bad := range []string{"", "8", "a:b", "8:"} {
		_, err := ParseDev(bad)
		assert.Error(t, err, bad)
	}
}

func names(ds []Disk) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Name)
	}
	return out
}
