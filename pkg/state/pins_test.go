package state

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPinsRoundTripAndClear(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	a := Pin{PID: 100, FD: 7, Dev: 7 << 20, Ino: 12, Device: "loop0", WindowKB: 1024, Path: "/data/blk_1"}
	b := Pin{PID: 101, FD: 3, Dev: 7 << 20, Ino: 13, Device: "loop0", WindowKB: 512}
	require.NoError(t, s.UpdatePins([]Pin{a, b}, nil))
	fi, err := os.Stat(s.PinsPath())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.NoError(t, s.Close())

	// A later start (after a crash) sees them.
	s2 := open(t, dir)
	got := s2.Pins()
	require.Len(t, got, 2)
	assert.Equal(t, a.Path, got[0].Path)
	assert.False(t, got[0].PinnedAt.IsZero())

	// Replacing by pid and fd, clearing, and the file goes when empty.
	a.WindowKB = 2048
	require.NoError(t, s2.UpdatePins([]Pin{a}, []Pin{b}))
	got = s2.Pins()
	require.Len(t, got, 1)
	assert.Equal(t, 2048, got[0].WindowKB)
	require.NoError(t, s2.UpdatePins(nil, []Pin{a}))
	assert.Empty(t, s2.Pins())
	_, err = os.Stat(s2.PinsPath())
	assert.True(t, os.IsNotExist(err), "no pins, no file")
}

func TestPinsFromAnotherBootOrUnusableAreDropped(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.UpdatePins([]Pin{{PID: 1, FD: 3, Dev: 7 << 20, Ino: 5, Device: "loop0", WindowKB: 512}}, nil))
	require.NoError(t, s.Close())
	s2, err := Open(dir, Options{BootID: "boot-b"})
	require.NoError(t, err)
	assert.Empty(t, s2.Pins(), "processes of another boot are gone")
	require.NoError(t, s2.Close())

	// Garbage is set aside with a warning; the daemon still starts.
	p := filepath.Join(dir, PinsName)
	require.NoError(t, os.WriteFile(p, []byte("{not json"), 0o600))
	s3 := open(t, dir)
	assert.Empty(t, s3.Pins())
	_, err = os.Stat(p + ".unusable")
	assert.NoError(t, err)
	assert.Empty(t, s3.Entries(), "device originals unaffected")
}

func TestPinsBounded(t *testing.T) {
	s := open(t, t.TempDir())
	pins := make([]Pin, MaxPins+5)
	for i := range pins {
		pins[i] = Pin{PID: uint32(i + 1), FD: 3, Dev: 7 << 20, Ino: uint64(i + 1), Device: "loop0", WindowKB: 512}
	}
	require.NoError(t, s.UpdatePins(pins, nil))
	assert.Len(t, s.Pins(), MaxPins)
}
