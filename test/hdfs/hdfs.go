// Package hdfs runs a real, unmodified HDFS (a MiniDFSCluster from Apache Hadoop's
// hadoop-client-minicluster: one NameNode and one DataNode in one JVM) with its storage in a
// given directory, and drives its client from Go: write files, read them back through the
// HDFS client (the DataNode sends block data with sendfile over local TCP, short-circuit
// reads off), and find the DataNode's local block files.
//
// The Java side lives next to this file (pom.xml, src/main/java). Build compiles it with
// Maven once and caches the compiled classes and the dependency classpath under target/;
// Start then runs `java -cp ...` directly. See docs/hdfs.md.
package hdfs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults for Options.
const (
	DefaultStartTimeout   = 3 * time.Minute
	DefaultCommandTimeout = 10 * time.Minute
	DefaultHeapMB         = 2048
	DefaultReadBuffer     = 1 << 20
	// stderrTail is how much of the JVM's log is kept for error messages.
	stderrTail = 16 << 10
)

// closeGrace is how long Close waits for a clean shutdown before killing the JVM.
var closeGrace = 30 * time.Second

// Options tune Start. The zero value is usable.
type Options struct {
	// StartTimeout bounds the time from exec to the cluster's "ready" line.
	StartTimeout time.Duration
	// CommandTimeout bounds each command unless the caller's context is shorter.
	CommandTimeout time.Duration
	// HeapMB is the JVM's maximum heap (-Xmx).
	HeapMB int
	// ReadBuffer is the client's read buffer in bytes (FSDataInputStream.read size).
	ReadBuffer int
	// LogPath, if set, receives the JVM's whole stderr (Hadoop's logs).
	LogPath string
}

func (o Options) withDefaults() Options {
	if o.StartTimeout <= 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.CommandTimeout <= 0 {
		o.CommandTimeout = DefaultCommandTimeout
	}
	if o.HeapMB <= 0 {
		o.HeapMB = DefaultHeapMB
	}
	if o.ReadBuffer <= 0 {
		o.ReadBuffer = DefaultReadBuffer
	}
	return o
}

// Cluster is a running MiniDFSCluster controlled through its stdin/stdout.
type Cluster struct {
	// PID is the JVM's process id. The NameNode and the DataNode run in this one JVM, so
	// it is also the tgid under which the DataNode reads block files.
	PID int
	// URI is the NameNode's address, e.g. hdfs://localhost:37925.
	URI string
	// DataDir is the DataNode's data directory (block files live below it).
	DataDir string
	// StartSeconds is the JVM-side time to build the cluster and wait until it is active.
	StartSeconds float64

	opts    Options
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string // stdout, one answer per line; closed at EOF
	stderr  *tailBuffer
	logFile *os.File
	exited  chan struct{} // closed when the process has been waited for
	waitErr error

	mu        sync.Mutex // serialises commands: the protocol is strictly request/answer
	closeOnce sync.Once
	closeErr  error
}

// Start builds the server if needed and starts a cluster with its storage under baseDir
// (hdfs.minidfs.basedir). MiniDFSCluster formats, i.e. wipes, baseDir/data and baseDir/name*.
func Start(ctx context.Context, baseDir string) (*Cluster, error) {
	return StartWith(ctx, baseDir, Options{})
}

// StartWith is Start with options.
func StartWith(ctx context.Context, baseDir string, opts Options) (*Cluster, error) {
	opts = opts.withDefaults()
	cp, err := BuildContext(ctx)
	if err != nil {
		return nil, err
	}
	java, err := lookJava()
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(baseDir)
	if err != nil {
		return nil, fmt.Errorf("hdfs: base dir %q: %w", baseDir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("hdfs: create base dir: %w", err)
	}
	args := []string{
		"-Xmx" + strconv.Itoa(opts.HeapMB) + "m",
		"-XX:+ExitOnOutOfMemoryError",
		"-Djava.net.preferIPv4Stack=true",
		"-cp", cp,
		"io.readaheadd.hdfsbench.Server", abs, strconv.Itoa(opts.ReadBuffer),
	}
	// Not CommandContext: the JVM outlives Start's context and is ended by Close.
	cmd := exec.Command(java, args...)
	cmd.Dir = abs
	return startProcess(ctx, cmd, opts)
}

// Check reports what is missing to start a cluster here: Maven (to build the server, unless
// an earlier build is cached) or java. It builds the server if needed.
func Check(ctx context.Context) error {
	if _, err := BuildContext(ctx); err != nil {
		return err
	}
	_, err := lookJava()
	return err
}

func lookJava() (string, error) {
	java, err := exec.LookPath("java")
	if err != nil {
		return "", fmt.Errorf("hdfs: java not found in PATH (install a Java 17 JDK, e.g. apt-get install openjdk-17-jdk-headless): %w", err)
	}
	return java, nil
}

// startProcess runs cmd as a command server and waits for its ready line. Separate from
// StartWith so the protocol handling is testable with a stand-in process.
func startProcess(ctx context.Context, cmd *exec.Cmd, opts Options) (*Cluster, error) {
	opts = opts.withDefaults()
	c := &Cluster{
		opts:   opts,
		cmd:    cmd,
		lines:  make(chan string, 16),
		stderr: &tailBuffer{max: stderrTail},
		exited: make(chan struct{}),
	}
	// Own process group, so Close can kill the JVM and anything it forked (Hadoop runs du/df);
	// SIGKILL if the thread that started it dies (best effort; EOF on stdin covers the rest).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stderr io.Writer = c.stderr
	if opts.LogPath != "" {
		f, err := os.Create(opts.LogPath)
		if err != nil {
			return nil, fmt.Errorf("hdfs: create log %s: %w", opts.LogPath, err)
		}
		c.logFile = f
		stderr = io.MultiWriter(c.stderr, f)
	}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		c.closeLog()
		return nil, fmt.Errorf("hdfs: stdin pipe: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.closeLog()
		return nil, fmt.Errorf("hdfs: stdout pipe: %w", err)
	}
	c.stdin = stdin
	if err := cmd.Start(); err != nil {
		c.closeLog()
		return nil, fmt.Errorf("hdfs: start %s: %w", cmd.Path, err)
	}
	c.PID = cmd.Process.Pid
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	go func() {
		// Wait closes the pipes only after the copy goroutines are done, so the stdout
		// scanner above sees every line before EOF.
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()

	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	var ready struct {
		OK           bool    `json:"ok"`
		Event        string  `json:"event"`
		Error        string  `json:"error"`
		PID          int     `json:"pid"`
		URI          string  `json:"uri"`
		DataDir      string  `json:"data_dir"`
		StartSeconds float64 `json:"start_seconds"`
	}
	if err := c.await(sctx, &ready); err != nil {
		c.kill()
		return nil, fmt.Errorf("hdfs: cluster did not become ready within %s (%v); JVM log tail:\n%s",
			time.Since(start).Round(time.Millisecond), err, c.stderr.String())
	}
	if !ready.OK || ready.Event != "ready" {
		c.kill()
		return nil, fmt.Errorf("hdfs: cluster failed to start: %s; JVM log tail:\n%s", ready.Error, c.stderr.String())
	}
	if ready.PID != c.PID {
		c.kill()
		return nil, fmt.Errorf("hdfs: server reports pid %d but exec started %d (is java a wrapper script?)", ready.PID, c.PID)
	}
	c.URI, c.DataDir, c.StartSeconds = ready.URI, ready.DataDir, ready.StartSeconds
	slog.Info("hdfs cluster ready", "pid", c.PID, "uri", c.URI, "data_dir", c.DataDir,
		"start_s", c.StartSeconds, "wall_s", time.Since(start).Seconds())
	return c, nil
}

// await decodes the next answer line into v.
func (c *Cluster) await(ctx context.Context, v any) error {
	select {
	case line, ok := <-c.lines:
		if !ok {
			<-c.exited
			return fmt.Errorf("server exited (%v) without answering", c.waitErr)
		}
		if err := json.Unmarshal([]byte(line), v); err != nil {
			return fmt.Errorf("bad answer %q: %w", line, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// do sends one command and decodes its answer into v. An answer with ok=false becomes an
// error. If the context ends first, the cluster is killed: a late answer would be taken as
// the next command's.
func (c *Cluster) do(ctx context.Context, v any, command string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.exited:
		return fmt.Errorf("hdfs: %s: cluster is not running (%v)", command, c.waitErr)
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.CommandTimeout)
	defer cancel()
	if _, err := io.WriteString(c.stdin, command+"\n"); err != nil {
		return fmt.Errorf("hdfs: send %q: %w", command, err)
	}
	var raw json.RawMessage
	if err := c.await(ctx, &raw); err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			c.kill()
			return fmt.Errorf("hdfs: %s: no answer (%w); cluster killed; JVM log tail:\n%s", command, err, c.stderr.String())
		}
		return fmt.Errorf("hdfs: %s: %w; JVM log tail:\n%s", command, err, c.stderr.String())
	}
	var status struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(raw, &status); err != nil {
		return fmt.Errorf("hdfs: %s: bad answer %s: %w", command, raw, err)
	}
	if !status.OK {
		return fmt.Errorf("hdfs: %s: %s", command, status.Error)
	}
	if v != nil {
		if err := json.Unmarshal(raw, v); err != nil {
			return fmt.Errorf("hdfs: %s: decode %s: %w", command, raw, err)
		}
	}
	return nil
}

// WriteResult describes a file written by Write.
type WriteResult struct {
	Path    string  `json:"path"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	// Blocks are the DataNode's local block files (blk_ID, no .meta), in file order,
	// already fsynced so FIEMAP reports their physical extents.
	Blocks []string `json:"blocks"`
}

// Write creates (or overwrites) an HDFS file of sizeMB MiB of pseudo-random bytes through
// the HDFS client, with 256 MiB blocks and one replica.
func (c *Cluster) Write(ctx context.Context, path string, sizeMB int) (WriteResult, error) {
	if err := checkPath(path); err != nil {
		return WriteResult{}, err
	}
	var r WriteResult
	err := c.do(ctx, &r, fmt.Sprintf("write %s %d", path, sizeMB))
	return r, err
}

// ReaderResult is one concurrent reader's figures.
type ReaderResult struct {
	Path    string  `json:"path"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	MBps    float64 `json:"mbps"`
}

// ReadResult is the outcome of one Read. MBps is decimal MB (1e6 bytes) per second, the
// unit dd and fio print, over all readers from the common start to the last one's end.
type ReadResult struct {
	Bytes   int64          `json:"bytes"`
	Seconds float64        `json:"seconds"`
	MBps    float64        `json:"mbps"`
	Readers []ReaderResult `json:"readers"`
}

// Read reads whole files through the HDFS client on threads concurrent readers, which
// start together; reader i reads paths[i % len(paths)]. threads <= 0 means one per path.
func (c *Cluster) Read(ctx context.Context, threads int, paths ...string) (ReadResult, error) {
	if len(paths) == 0 {
		return ReadResult{}, errors.New("hdfs: read: no paths")
	}
	for _, p := range paths {
		if err := checkPath(p); err != nil {
			return ReadResult{}, err
		}
		if strings.Contains(p, ",") {
			return ReadResult{}, fmt.Errorf("hdfs: read: path %q contains a comma", p)
		}
	}
	if threads <= 0 {
		threads = len(paths)
	}
	var r ReadResult
	err := c.do(ctx, &r, fmt.Sprintf("read %s %d", strings.Join(paths, ","), threads))
	return r, err
}

// StreamProgress is a stream's figures so far: the bytes its clients have read and the
// whole passes over a file they have made.
type StreamProgress struct {
	Bytes  int64 `json:"bytes"`
	Passes int64 `json:"passes"`
}

// StreamStart starts clients HDFS clients streaming paths in the background until
// StreamStop: of N clients, client c owns files c, c+N, ... and reads them whole, one after
// another, over and over, each through a new input stream (the DataNode opens the block file
// anew); no two clients read one file (the second would follow the first through the page
// cache). A client evicts a file's block files from the page cache after each whole pass over
// it, so every pass reads the device. One stream at a time; other commands (StreamProgress)
// answer meanwhile.
func (c *Cluster) StreamStart(ctx context.Context, clients int, paths ...string) error {
	if len(paths) == 0 || clients < 1 || clients > len(paths) {
		return fmt.Errorf("hdfs: stream: %d clients on %d paths, want at least one client and a path for each", clients, len(paths))
	}
	for _, p := range paths {
		if err := checkPath(p); err != nil {
			return err
		}
		if strings.Contains(p, ",") {
			return fmt.Errorf("hdfs: stream: path %q contains a comma", p)
		}
	}
	return c.do(ctx, nil, fmt.Sprintf("stream %s %d", strings.Join(paths, ","), clients))
}

// StreamProgress reports the running stream's figures; an error if a client failed.
func (c *Cluster) StreamProgress(ctx context.Context) (StreamProgress, error) {
	var p StreamProgress
	err := c.do(ctx, &p, "progress")
	return p, err
}

// StreamStop stops the running stream (its clients finish the read call they are in) and
// returns its figures; an error if a client failed.
func (c *Cluster) StreamStop(ctx context.Context) (StreamProgress, error) {
	var p StreamProgress
	err := c.do(ctx, &p, "stop")
	return p, err
}

// Blocks returns the DataNode's local block files of an HDFS file, in file order.
func (c *Cluster) Blocks(ctx context.Context, path string) ([]string, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	var r struct {
		Blocks []string `json:"blocks"`
	}
	err := c.do(ctx, &r, "blocks "+path)
	return r.Blocks, err
}

// Delete removes an HDFS file or directory (recursively).
func (c *Cluster) Delete(ctx context.Context, path string) error {
	if err := checkPath(path); err != nil {
		return err
	}
	return c.do(ctx, nil, "delete "+path)
}

// checkPath rejects paths the line protocol cannot carry.
func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, " \t\r\n") {
		return fmt.Errorf("hdfs: path %q must be absolute and contain no whitespace", p)
	}
	return nil
}

// Exited is closed once the JVM has exited.
func (c *Cluster) Exited() <-chan struct{} { return c.exited }

// Close shuts the cluster down cleanly (quit), and kills the JVM's process group if it has
// not exited within 30 s. Safe to call more than once and after a failure; suitable for
// t.Cleanup. Returns an error if a clean shutdown was not possible.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock() // wait for a running command; do() kills on its own timeout
		defer c.mu.Unlock()
		defer c.closeLog()
		select {
		case <-c.exited:
			c.kill() // reap any children left in the group
			return
		default:
		}
		_, werr := io.WriteString(c.stdin, "quit\n")
		_ = c.stdin.Close()
		timer := time.NewTimer(closeGrace)
		defer timer.Stop()
		var answer struct {
			OK    bool   `json:"ok"`
			Error string `json:"error"`
		}
		ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
		defer cancel()
		aerr := c.await(ctx, &answer)
		select {
		case <-c.exited:
		case <-timer.C:
		}
		c.kill()
		switch {
		case werr != nil:
			c.closeErr = fmt.Errorf("hdfs: send quit: %w (JVM killed)", werr)
		case aerr != nil:
			c.closeErr = fmt.Errorf("hdfs: shutdown: %w (JVM killed); log tail:\n%s", aerr, c.stderr.String())
		case !answer.OK:
			c.closeErr = fmt.Errorf("hdfs: shutdown: %s (JVM killed)", answer.Error)
		}
	})
	return c.closeErr
}

// kill sends SIGKILL to the server's process group and waits until the server is reaped.
func (c *Cluster) kill() {
	if c.cmd.Process == nil {
		return
	}
	// Negative pid: the whole group (Setpgid made the server its leader). ESRCH once empty.
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		slog.Error("hdfs: server not reaped 10 s after SIGKILL", "pid", c.cmd.Process.Pid)
	}
}

func (c *Cluster) closeLog() {
	if c.logFile != nil {
		_ = c.logFile.Close()
		c.logFile = nil
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}

// srcDir is this package's directory, where pom.xml and the Java sources are.
func srcDir() (string, error) {
	if d := os.Getenv("READAHEADD_HDFS_SRC"); d != "" {
		return d, nil
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("hdfs: cannot locate the package source; set READAHEADD_HDFS_SRC to test/hdfs")
	}
	return filepath.Dir(file), nil
}
