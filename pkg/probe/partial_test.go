package probe

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A driver may complete a request in parts: a loop device whose backing
// file is shorter than the read completes what it read, requeues the rest,
// and ends that with an error. The bytes completed first were read: they
// are a record of their own (from the request's head), not dropped with
// the call that did not end the request. (Dropping them once left 1.5-3.8
// MB of a 190 MB test read unrecorded, with nothing lost.)
func TestPartialCompletionIsRecorded(t *testing.T) {
	needRoot(t, "loads BPF programs and creates a loop device")
	img := filepath.Join(t.TempDir(), "short.img")
	f, err := os.Create(img)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(8<<20))
	require.NoError(t, f.Close())
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	require.NoError(t, err, "losetup: %s", out)
	loop := string(out[:len(out)-1])
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", loop).CombinedOutput(); err != nil {
			t.Errorf("detach %s: %v: %s", loop, err, out)
		}
	})
	var st unix.Stat_t
	require.NoError(t, unix.Stat(loop, &st))
	dev := DevFromUnix(st.Rdev)

	p, c := startProbe(t, Config{Devices: []Dev{dev}, Poll: 20 * time.Millisecond, SampleBudget: -1})

	// The device keeps its 8 MB; its backing file ends 64 KB into the
	// read at 4 MB.
	const at, short = 4 << 20, 64 << 10
	require.NoError(t, os.Truncate(img, at+short))
	fd, err := unix.Open(loop, unix.O_RDONLY|unix.O_DIRECT, 0)
	require.NoError(t, err)
	buf := alignedBuf(128 << 10)
	n, rerr := unix.Pread(fd, buf, at)
	require.NoError(t, unix.Close(fd))
	t.Logf("read at 4 MB: %d bytes, %v", n, rerr)
	require.True(t, rerr != nil || n < len(buf), "the read ran past the backing file's end")

	c.settle(3 * time.Second)
	p.stop(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	var head, failed uint64
	for _, r := range c.recs {
		t.Logf("%+v", r)
		switch {
		case r.Sector == at/512 && !r.Error:
			head += uint64(r.Bytes)
		case r.Error:
			failed += uint64(r.Bytes)
		}
	}
	assert.Equal(t, uint64(short), head, "the part read before the backing file's end is recorded, from the request's first sector")
	assert.Equal(t, uint64(len(buf)-short), failed, "the rest ended with an error")
}

// alignedBuf returns n bytes aligned for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := 4096 - int(uintptr(unsafe.Pointer(&b[0]))&4095)
	return b[off : off+n]
}
