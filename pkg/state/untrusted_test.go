package state

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
)

// fakeDisks builds a sysfs tree with the given disks (name -> dev, diskseq)
// at read_ahead_kb 128.
func fakeDisks(t *testing.T, disks map[string][2]string) blockdev.SysFS {
	root := t.TempDir()
	for name, id := range disks {
		q := filepath.Join(root, "block", name, "queue")
		require.NoError(t, os.MkdirAll(q, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(q, "read_ahead_kb"), []byte("128\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(root, "block", name, "dev"), []byte(id[0]+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(root, "block", name, "diskseq"), []byte(id[1]+"\n"), 0o644))
	}
	return blockdev.SysFS{Root: root}
}

func tunableOnly(names ...string) func(string) bool {
	return func(n string) bool {
		for _, x := range names {
			if x == n {
				return true
			}
		}
		return false
	}
}

func writeOriginals(t *testing.T, dir string, entries ...Entry) {
	b, err := json.Marshal(fileFormat{Version: Version, BootID: "b", Devices: entries})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, FileName), b, 0o600))
}

func TestForgedOriginalsWriteOnlyToConfiguredDisksWithMatchingIdentity(t *testing.T) {
	sys := fakeDisks(t, map[string][2]string{
		"vda": {"253:0", "1"}, "loop5": {"7:5", "9"}, "loop6": {"7:6", "10"}, "loop7": {"7:7", "11"}, "sdb": {"8:16", "12"},
		"loop8": {"7:8", "13"}, "sdc": {"8:32", "14"}, "sdd": {"8:48", "15"},
	})
	dir := t.TempDir()
	writeOriginals(t, dir,
		// The OS disk, with its true identity (anyone can read it from sysfs).
		Entry{Device: "vda", Dev: "253:0", ReadAheadKB: 1 << 20, DiskSeq: 1},
		// Configured, identity matches: restored.
		Entry{Device: "loop5", Dev: "7:5", ReadAheadKB: 256, DiskSeq: 9},
		// Configured, but no diskseq recorded on a kernel that has them.
		Entry{Device: "loop6", Dev: "7:6", ReadAheadKB: 512},
		// Configured, but the name now has another device number.
		Entry{Device: "loop7", Dev: "7:99", ReadAheadKB: 768, DiskSeq: 11},
		// Configured, no device number recorded.
		Entry{Device: "sdb", ReadAheadKB: 1024, DiskSeq: 12},
		// Not configured (a configuration changed since): the same disk,
		// shown by its dev_t and non-zero diskseq, gets its original back.
		Entry{Device: "loop8", Dev: "7:8", ReadAheadKB: 64, DiskSeq: 13},
		// Not configured and no diskseq recorded: refused.
		Entry{Device: "sdc", Dev: "8:32", ReadAheadKB: 2048},
		// Not configured, identity of other media: dropped.
		Entry{Device: "sdd", Dev: "8:48", ReadAheadKB: 2048, DiskSeq: 99},
	)
	st, err := Open(dir, Options{BootID: "b", DiskSeq: sys.DiskSeq, DevOf: DevOfSysfs(sys),
		Tunable: tunableOnly("loop5", "loop6", "loop7", "sdb"), Protected: tunableOnly("vda")})
	require.NoError(t, err)
	defer st.Close()
	require.NoError(t, st.Restore(sys))
	for name, want := range map[string]int{"vda": 128, "loop5": 256, "loop6": 128, "loop7": 128, "sdb": 128, "loop8": 64, "sdc": 128, "sdd": 128} {
		kb, err := sys.ReadAheadKB(name)
		require.NoError(t, err)
		assert.Equal(t, want, kb, name)
	}
	var left []string
	for _, e := range st.Entries() {
		left = append(left, e.Device)
	}
	// Refused records stay for the operator; the one whose name belongs to
	// another device now is dropped like a replaced disk's.
	assert.Equal(t, []string{"loop6", "sdb", "sdc", "vda"}, left)
	assert.ErrorContains(t, st.Check(Entry{Device: "vda", Dev: "253:0", DiskSeq: 1}), "holds the root filesystem")
	assert.ErrorContains(t, st.Check(Entry{Device: "sdc", Dev: "8:32"}), "not a device this configuration tunes")
}

// Without a way to read a disk's identity, nothing loaded is written.
func TestOriginalsLoadedWithoutPolicyAreNeverWritten(t *testing.T) {
	sys := fakeDisks(t, map[string][2]string{"loop5": {"7:5", "9"}})
	dir := t.TempDir()
	writeOriginals(t, dir, Entry{Device: "loop5", Dev: "7:5", ReadAheadKB: 4096, DiskSeq: 9})
	st, err := Open(dir, Options{BootID: "b", DiskSeq: sys.DiskSeq})
	require.NoError(t, err)
	defer st.Close()
	require.NoError(t, st.Restore(sys))
	kb, _ := sys.ReadAheadKB("loop5")
	assert.Equal(t, 128, kb)
}

func TestSymlinkedLockIsNotFollowedOrTruncated(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious\n"), 0o644))
	require.NoError(t, os.Symlink(victim, filepath.Join(dir, LockName)))
	_, err := Open(dir, Options{BootID: "b"})
	require.ErrorIs(t, err, ErrUnsafeFile)
	assert.Contains(t, err.Error(), "symlink")
	b, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "precious\n", string(b))

	// A hard link to a file elsewhere is refused as well.
	dir2 := t.TempDir()
	require.NoError(t, os.Link(victim, filepath.Join(dir2, LockName)))
	_, err = Open(dir2, Options{BootID: "b"})
	require.ErrorIs(t, err, ErrUnsafeFile)
	b, _ = os.ReadFile(victim)
	assert.Equal(t, "precious\n", string(b))
}

func TestSymlinkedStateDirectoryIsRefused(t *testing.T) {
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.Symlink(real, link))
	_, err := Open(link, Options{BootID: "b"})
	require.ErrorIs(t, err, ErrUnsafeFile)
}

func TestStateFilesThatAreLinksFifosOrHugeAreRefused(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "elsewhere.json")
	valid := `{"version":1,"devices":[{"device":"sdb","dev":"8:16","read_ahead_kb":128}]}`
	require.NoError(t, os.WriteFile(outside, []byte(valid), 0o600))
	cases := map[string]func(p string){
		"symlink": func(p string) { require.NoError(t, os.Symlink(outside, p)) },
		"fifo":    func(p string) { require.NoError(t, syscall.Mkfifo(p, 0o600)) },
		"oversized": func(p string) {
			require.NoError(t, os.WriteFile(p, []byte(valid+strings.Repeat(" ", MaxStateBytes)), 0o600))
		},
		"too many entries": func(p string) {
			var es []string
			for i := 0; i < MaxEntries+1; i++ {
				es = append(es, fmt.Sprintf(`{"device":"sd%d","read_ahead_kb":128}`, i))
			}
			require.NoError(t, os.WriteFile(p, []byte(`{"version":1,"devices":[`+strings.Join(es, ",")+`]}`), 0o600))
		},
		"bad dev": func(p string) {
			require.NoError(t, os.WriteFile(p, []byte(`{"version":1,"devices":[{"device":"sdb","dev":"../8","read_ahead_kb":128}]}`), 0o600))
		},
		"duplicate device": func(p string) {
			require.NoError(t, os.WriteFile(p, []byte(`{"version":1,"devices":[{"device":"sdb","read_ahead_kb":128},{"device":"sdb","read_ahead_kb":4096}]}`), 0o600))
		},
	}
	for name, make := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			make(filepath.Join(dir, FileName))
			_, err := Open(dir, Options{BootID: "b"})
			var ce *CorruptError
			require.ErrorAs(t, err, &ce)
		})
	}
}

func TestWritesReplaceASymlinkInsteadOfFollowingIt(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious\n"), 0o644))
	require.NoError(t, os.Symlink(victim, filepath.Join(dir, "priors.json")))
	require.NoError(t, WriteFileAtomic(dir, "priors.json", []byte("{}\n"), true))
	b, _ := os.ReadFile(victim)
	assert.Equal(t, "precious\n", string(b))
	got, err := ReadFileBounded(dir, "priors.json", 16)
	require.NoError(t, err)
	assert.Equal(t, "{}\n", string(got))
	_, err = ReadFileBounded(dir, "priors.json", 2)
	assert.ErrorIs(t, err, ErrUnsafeFile)
	_, err = ReadFileBounded(dir, "../x", 2)
	assert.Error(t, err)
	_, err = ReadFileBounded(dir, "missing", 2)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestForgedPinsAreSetAside(t *testing.T) {
	good := Pin{PID: 100, FD: 7, Dev: 7 << 20, Ino: 12, Device: "loop0", WindowKB: 1024, Path: "/data/blk_1"}
	bad := map[string]func(p *Pin){
		"negative fd":   func(p *Pin) { p.FD = -5 },
		"device path":   func(p *Pin) { p.Device = "../x" },
		"pid 0":         func(p *Pin) { p.PID = 0 },
		"no inode":      func(p *Pin) { p.Ino = 0 },
		"huge window":   func(p *Pin) { p.WindowKB = MaxReadAheadKB + 1 },
		"relative path": func(p *Pin) { p.Path = "etc/passwd" },
	}
	write := func(dir string, pins []Pin) {
		b, err := json.Marshal(pinsFormat{Version: Version, BootID: "boot-a", Pins: pins})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, PinsName), b, 0o600))
	}
	for name, mutate := range bad {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := good
			mutate(&p)
			write(dir, []Pin{good, p})
			s := open(t, dir)
			assert.Empty(t, s.Pins())
			_, err := os.Stat(filepath.Join(dir, PinsName+".unusable"))
			assert.NoError(t, err)
			assert.Error(t, s.UpdatePins([]Pin{p}, nil), "what load refuses, update refuses")
		})
	}
	t.Run("more than MaxPins", func(t *testing.T) {
		dir := t.TempDir()
		pins := make([]Pin, MaxPins+1)
		for i := range pins {
			pins[i] = good
			pins[i].PID = uint32(i + 1)
		}
		write(dir, pins)
		s := open(t, dir)
		assert.Empty(t, s.Pins())
	})
	t.Run("oversized", func(t *testing.T) {
		dir := t.TempDir()
		b, _ := json.Marshal(pinsFormat{Version: Version, BootID: "boot-a", Pins: []Pin{good}})
		require.NoError(t, os.WriteFile(filepath.Join(dir, PinsName), append(b, []byte(strings.Repeat(" ", MaxPinsBytes))...), 0o600))
		s := open(t, dir)
		assert.Empty(t, s.Pins())
	})
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		other := t.TempDir()
		write(other, []Pin{good})
		require.NoError(t, os.Symlink(filepath.Join(other, PinsName), filepath.Join(dir, PinsName)))
		s := open(t, dir)
		assert.Empty(t, s.Pins())
	})
	t.Run("valid", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, []Pin{good})
		s := open(t, dir)
		assert.Len(t, s.Pins(), 1)
	})
}
