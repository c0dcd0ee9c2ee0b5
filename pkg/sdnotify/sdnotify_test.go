package sdnotify

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func recv(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, err := c.Read(buf)
	require.NoError(t, err)
	return string(buf[:n])
}

func TestNotifyPathSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c := listen(t, path)
	t.Setenv("NOTIFY_SOCKET", path)
	sent, err := Notify(Ready + "\n" + Status("watching %d devices", 2))
	require.NoError(t, err)
	assert.True(t, sent)
	assert.Equal(t, "READY=1\nSTATUS=watching 2 devices", recv(t, c))
}

func TestNotifyAbstractSocket(t *testing.T) {
	name := "readaheadd-test-" + time.Now().Format("150405.000000000")
	c := listen(t, "\x00"+name)
	sent, err := NotifySocket("@"+name, Stopping)
	require.NoError(t, err)
	assert.True(t, sent)
	assert.Equal(t, "STOPPING=1", recv(t, c))
}

func TestNotifyWithoutManager(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	sent, err := Notify(Ready)
	assert.NoError(t, err)
	assert.False(t, sent)
}

func TestNotifyDeadSocket(t *testing.T) {
	sent, err := NotifySocket(filepath.Join(t.TempDir(), "gone"), Ready)
	assert.Error(t, err)
	assert.False(t, sent)
	assert.Contains(t, err.Error(), "sd_notify: connect")
}
