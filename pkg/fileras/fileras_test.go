package fileras

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

func TestDecodeRejectsTornRecord(t *testing.T) {
	_, err := decode(make([]byte, recSize+3))
	require.Error(t, err)
	fs, err := decode(nil)
	require.NoError(t, err)
	assert.Empty(t, fs)
}

func TestCount(t *testing.T) {
	d := probe.MkDev(7, 3)
	c := Count([]File{{Key: probe.FileKey{Dev: d}, RAPages: 32}, {Key: probe.FileKey{Dev: d}, RAPages: 32}, {Key: probe.FileKey{Dev: d}, RAPages: 256}})
	assert.Equal(t, map[int]int{128: 2, 1024: 1}, c[d])
}

// The window in force is the stream's when asynchronous readahead keeps it
// above ra_pages, else ra_pages (a file not read yet has no stream).
func TestInForceKB(t *testing.T) {
	assert.Equal(t, 2048, File{RAPages: 32, Size: 512}.InForceKB())
	assert.Equal(t, 128, File{RAPages: 32, Size: 4}.InForceKB())
	assert.Equal(t, 128, File{RAPages: 32}.InForceKB())
}

// TestIterSeesFadvise: the iterator reports the window the kernel holds for
// one of this process's own open files, and its change by fadvise.
func TestIterSeesFadvise(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF iterator)")
	}
	it, err := Open()
	require.NoError(t, err)
	defer it.Close()
	f, err := os.CreateTemp("", "fileras")
	require.NoError(t, err)
	defer os.Remove(f.Name())
	defer f.Close()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(int(f.Fd()), &st))
	require.NoError(t, it.Watch(probe.DevFromUnix(st.Dev)))

	before := findFD(t, it, int(f.Fd()))
	assert.Equal(t, probe.FileKey{Dev: probe.DevFromUnix(st.Dev), Ino: st.Ino}, before.Key)
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_SEQUENTIAL))
	after := findFD(t, it, int(f.Fd()))
	assert.Equal(t, 2*before.RAPages, after.RAPages, "FADV_SEQUENTIAL doubles the window")
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM))
	assert.NotZero(t, findFD(t, it, int(f.Fd())).Mode&FModeRandom)

	// A walk of every process sees the same open file.
	start := time.Now()
	all, err := it.Files(Query{})
	require.NoError(t, err)
	t.Logf("walk of every process's files on the watched device: %d files in %v", len(all), time.Since(start))
	found := false
	for _, x := range all {
		found = found || (x.Tgid == uint32(os.Getpid()) && x.FD == int(f.Fd()) && x.ID == after.ID)
	}
	assert.True(t, found)
}

func findFD(t *testing.T, it *Iter, fd int) File {
	t.Helper()
	m, err := it.Self(uint32(os.Getpid()))
	require.NoError(t, err)
	f, ok := m[fd]
	require.True(t, ok, "fd %d not listed", fd)
	return f
}
