package hdfs

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeEnv makes the test binary act as a stand-in command server, so the Go side's
// protocol, timeouts and teardown are tested without Java.
const fakeEnv = "READAHEADD_HDFS_FAKE_SERVER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeEnv); mode != "" {
		os.Exit(fakeServer(mode))
	}
	os.Exit(m.Run())
}

func fakeServer(mode string) int {
	out := os.Stdout
	switch mode {
	case "silent":
		time.Sleep(time.Hour)
		return 0
	case "fail":
		fmt.Fprintln(os.Stderr, "java.net.BindException: Address already in use")
		fmt.Fprintln(out, `{"ok":false,"error":"start: java.net.BindException: Address already in use"}`)
		return 1
	}
	fmt.Fprintf(out, `{"ok":true,"event":"ready","pid":%d,"uri":"hdfs://localhost:1","data_dir":"/x/data","start_seconds":1.5}`+"\n", os.Getpid())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case f[0] == "quit" && mode == "stubborn":
			continue
		case f[0] == "quit":
			fmt.Fprintln(out, `{"ok":true,"event":"shutdown","seconds":0.1}`)
			return 0
		case f[0] == "write":
			fmt.Fprintf(out, `{"ok":true,"path":%q,"bytes":%s,"seconds":0.5,"blocks":["/x/data/blk_1"]}`+"\n", f[1], f[2]+"048576")
		case f[0] == "read" && mode == "hang":
			time.Sleep(time.Hour)
		case f[0] == "read":
			fmt.Fprintf(out, `{"ok":true,"bytes":200,"seconds":2,"mbps":0.0001,"readers":[{"path":%q,"bytes":100,"seconds":1,"mbps":0.0001},{"path":%q,"bytes":100,"seconds":2,"mbps":0.00005}],"cmd":%q}`+"\n", f[1], f[1], sc.Text())
		case f[0] == "stream":
			fmt.Fprintf(out, `{"ok":true,"bytes":0,"passes":0,"cmd":%q}`+"\n", sc.Text())
		case f[0] == "progress":
			fmt.Fprintln(out, `{"ok":true,"bytes":1048576,"passes":1}`)
		case f[0] == "stop" && mode == "streamfail":
			fmt.Fprintln(out, `{"ok":false,"error":"stream client failed: java.io.IOException: evict /x/data/blk_1"}`)
		case f[0] == "stop":
			fmt.Fprintln(out, `{"ok":true,"bytes":2097152,"passes":2}`)
		case f[0] == "blocks":
			fmt.Fprintln(out, `{"ok":true,"blocks":["/x/data/blk_1","/x/data/blk_2"]}`)
		default:
			fmt.Fprintf(out, `{"ok":false,"error":"unknown command %s"}`+"\n", f[0])
		}
	}
	if mode == "stubborn" {
		time.Sleep(time.Hour) // ignores the end of stdin as well
	}
	return 0
}

func startFake(t *testing.T, mode string, opts Options) (*Cluster, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fakeEnv+"="+mode)
	c, err := startProcess(context.Background(), cmd, opts)
	if c != nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

// gone reports whether no process with pid exists any more.
func gone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}

func TestProtocolRoundTrip(t *testing.T) {
	c, err := startFake(t, "ok", Options{})
	require.NoError(t, err)
	assert.Equal(t, "hdfs://localhost:1", c.URI)
	assert.Equal(t, "/x/data", c.DataDir)
	assert.InDelta(t, 1.5, c.StartSeconds, 1e-9)
	ctx := context.Background()

	w, err := c.Write(ctx, "/a", 2)
	require.NoError(t, err)
	assert.Equal(t, int64(2048576), w.Bytes, "the stand-in echoes SIZE_MB followed by 048576")
	assert.Equal(t, []string{"/x/data/blk_1"}, w.Blocks)

	r, err := c.Read(ctx, 2, "/a")
	require.NoError(t, err)
	assert.Equal(t, int64(200), r.Bytes)
	require.Len(t, r.Readers, 2)
	assert.Equal(t, "/a", r.Readers[1].Path)
	assert.InDelta(t, 2.0, r.Readers[1].Seconds, 1e-9)

	b, err := c.Blocks(ctx, "/a")
	require.NoError(t, err)
	assert.Equal(t, []string{"/x/data/blk_1", "/x/data/blk_2"}, b)

	err = c.Delete(ctx, "/a")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unknown command delete", "a server-side error reaches the caller")

	_, err = c.Read(ctx, 1, "relative")
	assert.Error(t, err, "relative paths are refused before sending")
	_, err = c.Read(ctx, 1, "/a b")
	assert.Error(t, err, "whitespace would split the command line")

	require.NoError(t, c.Close())
	<-c.Exited()
	assert.True(t, gone(c.PID))
	assert.NoError(t, c.Close(), "Close is idempotent")
	_, err = c.Blocks(ctx, "/a")
	assert.ErrorContains(t, err, "not running")
}

func TestReadSendsPathsAndThreads(t *testing.T) {
	c, err := startFake(t, "ok", Options{})
	require.NoError(t, err)
	var raw struct {
		Cmd string `json:"cmd"`
	}
	require.NoError(t, c.do(context.Background(), &raw, "read /a,/b 4"))
	assert.Equal(t, "read /a,/b 4", raw.Cmd)
	_, err = c.Read(context.Background(), 0, "/a,b")
	assert.ErrorContains(t, err, "comma")
}

func TestStreamCommands(t *testing.T) {
	c, err := startFake(t, "ok", Options{})
	require.NoError(t, err)
	ctx := context.Background()
	var raw struct {
		Cmd string `json:"cmd"`
	}
	require.NoError(t, c.do(ctx, &raw, "stream /a,/b 3"))
	assert.Equal(t, "stream /a,/b 3", raw.Cmd)
	require.NoError(t, c.StreamStart(ctx, 2, "/a", "/b"))
	p, err := c.StreamProgress(ctx)
	require.NoError(t, err)
	assert.Equal(t, StreamProgress{Bytes: 1 << 20, Passes: 1}, p)
	p, err = c.StreamStop(ctx)
	require.NoError(t, err)
	assert.Equal(t, StreamProgress{Bytes: 2 << 20, Passes: 2}, p)
	assert.ErrorContains(t, c.StreamStart(ctx, 0, "/a"), "at least one")
	assert.ErrorContains(t, c.StreamStart(ctx, 1), "at least one")
	assert.ErrorContains(t, c.StreamStart(ctx, 3, "/a", "/b"), "a path for each", "no two clients on one file")
	assert.ErrorContains(t, c.StreamStart(ctx, 1, "/a,b"), "comma")
	assert.Error(t, c.StreamStart(ctx, 1, "rel"), "relative paths are refused")

	f, err := startFake(t, "streamfail", Options{})
	require.NoError(t, err)
	_, err = f.StreamStop(ctx)
	assert.ErrorContains(t, err, "stream client failed", "a client's failure reaches the caller")
}

func TestStartTimeoutKillsServer(t *testing.T) {
	start := time.Now()
	c, err := startFake(t, "silent", Options{StartTimeout: 300 * time.Millisecond})
	require.Error(t, err)
	assert.Nil(t, c)
	assert.Contains(t, err.Error(), "did not become ready")
	assert.Less(t, time.Since(start), 5*time.Second)
}

func TestStartFailureReportsServerError(t *testing.T) {
	_, err := startFake(t, "fail", Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "BindException", "the server's error and log tail are in the message")
}

func TestCommandTimeoutKillsServer(t *testing.T) {
	c, err := startFake(t, "hang", Options{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = c.Read(ctx, 1, "/a")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cluster killed")
	select {
	case <-c.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("server still running after a timed-out command")
	}
	assert.True(t, gone(c.PID))
}

func TestCloseKillsServerThatIgnoresQuit(t *testing.T) {
	old := closeGrace
	closeGrace = 300 * time.Millisecond
	t.Cleanup(func() { closeGrace = old })
	c, err := startFake(t, "stubborn", Options{})
	require.NoError(t, err)
	err = c.Close()
	require.Error(t, err, "an unclean shutdown is reported")
	assert.Contains(t, err.Error(), "killed")
	<-c.Exited()
	assert.True(t, gone(c.PID))
}

func TestTailBufferKeepsEnd(t *testing.T) {
	tb := &tailBuffer{max: 8}
	_, _ = tb.Write([]byte("0123456789"))
	_, _ = tb.Write([]byte("ab"))
	assert.Equal(t, "456789ab", tb.String())
}
