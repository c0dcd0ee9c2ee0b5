package daemontest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestModuleRootAndBuild(t *testing.T) {
	root, err := ModuleRoot()
	require.NoError(t, err)
	assert.FileExists(t, filepath.Join(root, "cmd", "readaheadd", "main.go"))

	if testing.Short() {
		t.Skip("-short: skipping the build of cmd/readaheadd")
	}
	bin, cleanup, err := Build("readaheadd-daemontest-")
	require.NoError(t, err)
	out, err := exec.Command(bin, "version").CombinedOutput()
	require.NoError(t, err, string(out))
	assert.True(t, strings.HasPrefix(string(out), "readaheadd "), string(out))
	st, err := os.Stat(filepath.Dir(bin))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm(), "others must be able to run the binary")
	cleanup()
	_, err = os.Stat(bin)
	assert.True(t, os.IsNotExist(err), "cleanup removes the binary")
}

func TestFreeAddrIsBindable(t *testing.T) {
	a := FreeAddr(t)
	assert.True(t, strings.HasPrefix(a, "127.0.0.1:"))
	ln, err := net.Listen("tcp", a)
	require.NoError(t, err)
	require.NoError(t, ln.Close())
}

func TestSyncBufferConcurrentWrites(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				_, _ = b.Write([]byte("x"))
			}
		}()
	}
	wg.Wait()
	assert.Len(t, b.String(), 800)
}
