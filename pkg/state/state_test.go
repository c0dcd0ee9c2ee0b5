package state

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
)

// fakeSys is a minimal fake sysfs: a map of device name to read_ahead_kb.
type fakeSys map[string]int

func (f fakeSys) ReadAheadKB(name string) (int, error) {
	v, ok := f[name]
	if !ok {
		return 0, blockdev.ErrNoDevice
	}
	return v, nil
}

func (f fakeSys) SetReadAheadKB(name string, kb int) error {
	if _, ok := f[name]; !ok {
		return blockdev.ErrNoDevice
	}
	f[name] = kb
	return nil
}

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, Options{BootID: "boot-a"})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRecordIsDurableAndFirstValueWins(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.Record("sdb", "8:16", 128))
	require.NoError(t, s.Record("sdb", "8:16", 4096)) // a later value is not an original
	fi, err := os.Stat(s.Path())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	var ff fileFormat
	b, err := os.ReadFile(s.Path())
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &ff))
	assert.Equal(t, Version, ff.Version)
	require.Len(t, ff.Devices, 1)
	assert.Equal(t, 128, ff.Devices[0].ReadAheadKB)
	require.NoError(t, s.Close())

	s2 := open(t, dir)
	kb, ok := s2.Original("sdb")
	require.True(t, ok)
	assert.Equal(t, 128, kb)
	left, _ := filepath.Glob(filepath.Join(dir, FileName+".tmp*"))
	assert.Empty(t, left)
}

func TestLockKeepsSecondOpenerOut(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	_, err := Open(dir, Options{BootID: "boot-a"})
	require.ErrorIs(t, err, ErrLocked)
	assert.Contains(t, err.Error(), "stop the running daemon")
	require.NoError(t, s.Close())
	s2, err := Open(dir, Options{BootID: "boot-a"})
	require.NoError(t, err)
	s2.Close()
}

func TestRestorePutsBackAndKeepsMissingDevices(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.Record("sdb", "8:16", 128))
	require.NoError(t, s.Record("sdc", "8:32", 256))
	sys := fakeSys{"sdb": 2048} // sdc is gone
	require.NoError(t, s.Restore(sys))
	assert.Equal(t, 128, sys["sdb"])
	_, ok := s.Original("sdb")
	assert.False(t, ok, "a restored device's record is cleared")
	kb, ok := s.Original("sdc")
	require.True(t, ok, "a missing device's record is kept for later")
	assert.Equal(t, 256, kb)

	// The device comes back: a later restore finishes the job and removes the file.
	sys["sdc"] = 1024
	require.NoError(t, s.Restore(sys))
	assert.Equal(t, 256, sys["sdc"])
	assert.Empty(t, s.Entries())
	_, err := os.Stat(s.Path())
	assert.True(t, os.IsNotExist(err))
}

func TestCorruptFilesAreReportedAndLeftAlone(t *testing.T) {
	cases := map[string]string{
		"truncated":       `{"version":1,"devices":[{"device":"sdb","read_ahe`,
		"empty":           ``,
		"not json":        `read_ahead_kb=128`,
		"no version":      `{"devices":[]}`,
		"unknown version": `{"version":7,"devices":[]}`,
		"bad entry":       `{"version":1,"devices":[{"device":"../etc","read_ahead_kb":1}]}`,
		"unknown field":   `{"version":1,"devices":[],"extra":true}`,
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, FileName)
			require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
			_, err := Open(dir, Options{BootID: "boot-a"})
			var ce *CorruptError
			require.ErrorAs(t, err, &ce)
			assert.Contains(t, err.Error(), p)
			assert.Contains(t, err.Error(), "move it aside")
			b, rerr := os.ReadFile(p)
			require.NoError(t, rerr)
			assert.Equal(t, content, string(b), "a corrupt file is never overwritten")
			// The lock was released: a fixed file can be opened at once.
			require.NoError(t, os.Remove(p))
			s, err := Open(dir, Options{BootID: "boot-a"})
			require.NoError(t, err)
			s.Close()
		})
	}
}

func TestRecordFromPreviousBootIsDiscarded(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.Record("sdb", "8:16", 128))
	require.NoError(t, s.Close())
	s2, err := Open(dir, Options{BootID: "boot-b"})
	require.NoError(t, err)
	defer s2.Close()
	assert.Empty(t, s2.Entries())
}

func TestStaleTempFileIsIgnored(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.Record("sdb", "8:16", 128))
	require.NoError(t, s.Close())
	// A crash between create and rename leaves a partial temp file.
	require.NoError(t, os.WriteFile(filepath.Join(dir, FileName+".tmp123"), []byte(`{"ver`), 0o600))
	s2 := open(t, dir)
	kb, ok := s2.Original("sdb")
	require.True(t, ok)
	assert.Equal(t, 128, kb)
}

func TestLoadRejectsEntriesRestoreCouldNotWriteSafely(t *testing.T) {
	for name, body := range map[string]string{
		"dotdot":      `{"version":1,"devices":[{"device":"..","dev":"7:0","read_ahead_kb":128}]}`,
		"dot":         `{"version":1,"devices":[{"device":".","dev":"7:0","read_ahead_kb":128}]}`,
		"absurd size": `{"version":1,"devices":[{"device":"sdb","dev":"8:16","read_ahead_kb":99999999999}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, FileName), []byte(body), 0o600))
			_, err := Open(dir, Options{BootID: "b"})
			var ce *CorruptError
			require.ErrorAs(t, err, &ce)
		})
	}
	st, err := Open(t.TempDir(), Options{BootID: "b"})
	require.NoError(t, err)
	defer st.Close()
	assert.Error(t, st.Record("..", "7:0", 128))
	assert.Error(t, st.Record("sdb", "8:16", MaxReadAheadKB+1))
	assert.Empty(t, st.Entries())
}

func TestRestoreSkipsReplacedDevice(t *testing.T) {
	root := t.TempDir()
	for name, seq := range map[string]string{"loop7": "40", "sdb": "12"} {
		q := filepath.Join(root, "block", name, "queue")
		require.NoError(t, os.MkdirAll(q, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(q, "read_ahead_kb"), []byte("128\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(root, "block", name, "diskseq"), []byte(seq+"\n"), 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, "block", "loop7", "dev"), []byte("7:7\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "block", "sdb", "dev"), []byte("8:16\n"), 0o644))
	sys := blockdev.SysFS{Root: root}
	dir := t.TempDir()
	st, err := Open(dir, Options{BootID: "b", DiskSeq: sys.DiskSeq})
	require.NoError(t, err)
	require.NoError(t, st.Record("loop7", "7:7", 96))
	require.NoError(t, st.Record("sdb", "8:16", 256))
	assert.Equal(t, uint64(40), st.Entries()[0].DiskSeq)
	require.NoError(t, st.Close())
	require.NoError(t, sys.SetReadAheadKB("loop7", 1024))
	require.NoError(t, sys.SetReadAheadKB("sdb", 1024))

	// loop7 was detached and attached to other media: diskseq moved on.
	require.NoError(t, os.WriteFile(filepath.Join(root, "block", "loop7", "diskseq"), []byte("42\n"), 0o644))
	st, err = Open(dir, Options{BootID: "b", DiskSeq: sys.DiskSeq, DevOf: DevOfSysfs(sys), Tunable: func(string) bool { return true }})
	require.NoError(t, err)
	defer st.Close()
	require.NoError(t, st.Restore(sys))
	kb, _ := sys.ReadAheadKB("loop7")
	assert.Equal(t, 1024, kb, "the new media's setting is not touched")
	kb, _ = sys.ReadAheadKB("sdb")
	assert.Equal(t, 256, kb, "the same media gets its original back")
	assert.Empty(t, st.Entries(), "the replaced device's record is dropped")
}
