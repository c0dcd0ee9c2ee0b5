package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/lab"
)

// A stream in a mount namespace of its own reads its file through the bind
// mount, reports its bytes while it reads, stops on its context, and leaves
// no mount on the host.
func TestStreamInItsOwnMountNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: unshare(1) --mount")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1) (util-linux)")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "blk")
	require.NoError(t, os.WriteFile(path, make([]byte, 8<<20), 0o644))
	s := newNSStream(lab.MatrixReader{Kind: lab.KRead, FileMB: 8, OwnMountNS: true}, path, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()
	require.Eventually(t, func() bool { return s.delivered() >= 16<<20 }, 20*time.Second, 20*time.Millisecond,
		"two passes of the file reported")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the namespaced stream did not stop with its context")
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	require.NoError(t, err)
	assert.NotContains(t, string(mounts), "readaheadd-ns-volume-", "the bind mount stayed in the stream's namespace")
	vols, _ := filepath.Glob(filepath.Join(os.TempDir(), "readaheadd-ns-volume-*"))
	assert.Empty(t, vols, "the volume's mount point is removed")
}
