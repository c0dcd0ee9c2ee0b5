package scope

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

func keyOf(t *testing.T, p string) probe.FileKey {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Stat(p, &st))
	return probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}
}

func write(t *testing.T, p string) probe.FileKey {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(p), 0o644))
	return keyOf(t, p)
}

// fakeProc is a /proc tree: the daemon's mountinfo, and per reader its
// mountinfo and the mnt_id of one descriptor.
type fakeProc struct {
	t    *testing.T
	root string
}

func (f fakeProc) file(rel, content string) {
	p := filepath.Join(f.root, rel)
	require.NoError(f.t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(f.t, os.WriteFile(p, []byte(content), 0o644))
}

// reader gives pid a descriptor fd on mount id, whose table is lines.
func (f fakeProc) reader(pid, fd, id int, lines ...string) {
	f.file(fmt.Sprintf("%d/fdinfo/%d", pid, fd), fmt.Sprintf("pos:\t0\nflags:\t0100000\nmnt_id:\t%d\nino:\t1\n", id))
	f.file(fmt.Sprintf("%d/mountinfo", pid), strings.Join(lines, "\n")+"\n")
}

// TestScopeThroughReadersMountTables: the allowed directory seen by pods
// at other paths is served, an outside directory mounted at a path that
// looks allowed is refused, disks mounted below the allowed directory are
// served, symlinks and `..` do not escape.
func TestScopeThroughReadersMountTables(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	data := filepath.Join(tmp, "data")
	inKey := write(t, filepath.Join(data, "sub", "f"))
	decoy := write(t, filepath.Join(data, "f"))
	outKey := write(t, filepath.Join(tmp, "outside", "f"))
	diskKey := write(t, filepath.Join(data, "disk1", "x"))
	sibKey := write(t, filepath.Join(tmp, "data2", "f"))
	require.NoError(t, os.Symlink(filepath.Join(tmp, "outside"), filepath.Join(data, "link")))

	id, err := pathMountID(tmp)
	require.NoError(t, err)
	dev := inKey.Dev.String()
	f := fakeProc{t, t.TempDir()}
	// The daemon sees the temporary directory's file system at /, and a
	// disk (0:999) mounted below the allowed directory, and a bind mount
	// of a directory from elsewhere below it.
	f.file("self/mountinfo", strings.Join([]string{
		fmt.Sprintf("%d 1 %s / / rw - ext4 /dev/x rw", id, dev),
		fmt.Sprintf("900 %d 0:999 / %s rw - ext4 /dev/y rw", id, filepath.Join(data, "disk1")),
		fmt.Sprintf("901 %d %s %s %s rw - ext4 /dev/x rw", id, dev, filepath.Join(tmp, "outside"), filepath.Join(data, "bindout")),
	}, "\n")+"\n")
	sc, err := NewAt(f.root, []string{data})
	require.NoError(t, err)

	// A pod: the data directory is its volume at /hadoop/dfs.
	f.reader(100, 3, 50, fmt.Sprintf("50 40 %s %s /hadoop/dfs rw - ext4 /dev/x rw", dev, data))
	// A pod whose volume at the allowed path is an outside directory.
	f.reader(101, 3, 51, fmt.Sprintf("51 40 %s %s %s rw - ext4 /dev/x rw", dev, filepath.Join(tmp, "outside"), data))
	// A pod with the disk mounted below the data directory as its volume.
	f.reader(102, 3, 52, "52 40 0:999 / /vol\\040one rw - ext4 /dev/y rw")
	// A pod seeing the whole file system, reading through a symlink.
	f.reader(103, 3, 53, fmt.Sprintf("53 40 %s / / rw - ext4 /dev/x rw", dev))
	// A pod whose volume is a sibling directory sharing the prefix.
	f.reader(104, 3, 54, fmt.Sprintf("54 40 %s %s /vol rw - ext4 /dev/x rw", dev, filepath.Join(tmp, "data2")))

	for _, c := range []struct {
		name string
		pid  uint32
		path string
		key  probe.FileKey
		want string // path in the daemon's namespace; "" = refused
	}{
		{"pod volume at another path", 100, "/hadoop/dfs/sub/f", inKey, filepath.Join(data, "sub", "f")},
		{"outside directory at the allowed path", 101, filepath.Join(data, "f"), outKey, ""},
		{"the decoy really at the allowed path is another file", 101, filepath.Join(data, "f"), decoy, filepath.Join(data, "f")},
		{"disk mounted below, at a path with a space", 102, "/vol one/x", diskKey, filepath.Join(data, "disk1", "x")},
		{"symlink inside the allowed directory", 103, filepath.Join(data, "link", "f"), outKey, ""},
		{"dot-dot", 103, filepath.Join(data, "..", "outside", "f"), outKey, ""},
		{"dot-dot kept in the string", 103, data + "/../outside/f", outKey, ""},
		{"sibling with a common prefix", 104, "/vol/f", sibKey, ""},
		{"the host path of a file another pod sees", 103, filepath.Join(data, "sub", "f"), inKey, filepath.Join(data, "sub", "f")},
		{"reader gone: the daemon's view still decides", 4242, filepath.Join(data, "sub", "f"), inKey, filepath.Join(data, "sub", "f")},
		{"reader gone, outside file", 4242, filepath.Join(tmp, "outside", "f"), outKey, ""},
		{"deleted", 100, "/hadoop/dfs/sub/f (deleted)", inKey, ""},
		{"the path names another file than the open one", 100, "/hadoop/dfs/sub/f", outKey, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := sc.Check(c.pid, 3, c.path, c.key)
			if c.want == "" {
				assert.Error(t, err)
				assert.Empty(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestNewRefusesWhatIsNoDirectory(t *testing.T) {
	tmp := t.TempDir()
	write(t, filepath.Join(tmp, "file"))
	_, err := New([]string{filepath.Join(tmp, "file")})
	assert.ErrorContains(t, err, "not a directory")
	_, err = New([]string{"relative"})
	assert.ErrorContains(t, err, "absolute")
	_, err = New([]string{filepath.Join(tmp, "missing")})
	assert.ErrorContains(t, err, "existing directories")
	sc, err := New(nil)
	require.NoError(t, err)
	assert.True(t, sc.Empty())
	_, err = sc.Check(1, 0, "/x", probe.FileKey{})
	assert.Error(t, err)
}

func TestMountinfoParse(t *testing.T) {
	ms, err := parseMountinfo(strings.NewReader("36 35 98:0 /mnt\\0401 /mnt\\1342 rw,noatime master:1 - ext3 /dev/root rw\n"))
	require.NoError(t, err)
	require.Len(t, ms, 1)
	assert.Equal(t, Mount{ID: 36, Dev: probe.MkDev(98, 0), Root: "/mnt 1", Point: `/mnt\2`}, ms[0])
	_, err = parseMountinfo(strings.NewReader("x 35 98:0 / / rw - ext3 /dev/root rw\n"))
	assert.Error(t, err)
}
