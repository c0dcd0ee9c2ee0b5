// Package tuner holds the tuner's acceptance and restore tests on the lab,
// run against the built readaheadd binary. They need root (BPF, loop
// devices, FUSE, sysfs writes) and skip otherwise.
package tuner

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/test/daemontest"
	"github.com/readaheadd/readaheadd/test/lab"
)

// childEnv makes the test binary a reader process: "seq:PATH",
// "sendfile:PATH" (sequential, at explicit offsets: a DataNode's sender),
// "random:PATH" (mmap) or "pread:PATH" (buffered random 4 KB reads). The daemon must reach a separate process's open file
// (pidfd_getfd), as it reaches a DataNode's.
const childEnv = "READAHEADD_TUNER_IT_CHILD"

var (
	binOnce    sync.Once
	binPath    string
	binErr     error
	binCleanup func()
)

func TestMain(m *testing.M) {
	if c := os.Getenv(childEnv); c != "" {
		os.Exit(childMain(c))
	}
	code := m.Run()
	if binCleanup != nil {
		binCleanup()
	}
	os.Exit(code)
}

var touchSink atomic.Uint32

func monoNow() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// childMain opens the file, says "ready", waits for "go" on stdin, then
// reads until stdin closes, printing "MONO_NS COUNT READ_BYTES" every 100
// ms (COUNT: bytes read for seq, page touches for random; READ_BYTES: this
// process's read_bytes from /proc/self/io, what it caused the device to read).
func childMain(spec string) int {
	mode, path, ok := strings.Cut(spec, ":")
	if !ok {
		fmt.Println("error bad spec", spec)
		return 2
	}
	f, err := os.Open(path)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	var data []byte
	var size int64
	if st, err := f.Stat(); err == nil {
		size = st.Size()
	}
	if mode == "random" || mode == "reopen" {
		st, err := f.Stat()
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		if data, err = unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED); err != nil {
			fmt.Println("error mmap", err)
			return 1
		}
	}
	fmt.Println("ready", os.Getpid())
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		return 0
	}
	stop := make(chan struct{})
	// "pause MS" on stdin: the reader stops reading for MS milliseconds
	// (a DataNode's sender waiting on a slow client), its file open.
	var pauseUntil atomic.Int64
	go func() {
		for in.Scan() {
			var ms int64
			if _, err := fmt.Sscanf(in.Text(), "pause %d", &ms); err == nil {
				now := monoNow()
				pauseUntil.Store(int64(now) + ms*int64(time.Millisecond))
				fmt.Printf("paused %d\n", now)
			}
		}
		close(stop)
	}()
	var mu sync.Mutex
	var count int64
	var out sync.WaitGroup
	out.Add(1)
	go func() {
		defer out.Done()
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				mu.Lock()
				c := count
				mu.Unlock()
				fmt.Printf("%d %d %d\n", monoNow(), c, selfReadBytes())
			}
		}
	}()
	buf := make([]byte, lab.SeqBlock)
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 7))
	lastDrop := time.Now()
	var sink byte
	var null *os.File // sendfile's destination
	var sendOff int64
	// touch16 reads one byte of 16 random pages of the mapping.
	touch16 := func() {
		for i := 0; i < 16; i++ {
			sink ^= data[rng.Int64N(int64(len(data)/4096))*4096]
		}
		// Publish the loads, or the compiler drops them and nothing faults.
		touchSink.Store(uint32(sink))
		mu.Lock()
		count += 16
		mu.Unlock()
	}
	for {
		select {
		case <-stop:
			out.Wait()
			touchSink.Store(uint32(sink))
			return 0
		default:
		}
		if d := time.Duration(pauseUntil.Load()) - monoNow(); d > 0 {
			time.Sleep(min(d, 10*time.Millisecond))
			continue
		}
		switch mode {
		case "seq":
			n, err := f.Read(buf)
			mu.Lock()
			count += int64(n)
			mu.Unlock()
			if errors.Is(err, io.EOF) {
				// Read the file again from the device: the open file, and
				// its readahead state, stay the same.
				_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
				_, err = f.Seek(0, io.SeekStart)
			}
			if err != nil {
				fmt.Println("error", err)
				return 1
			}
		case "sendfile":
			// As a DataNode sends a block: sendfile at explicit offsets,
			// the file position left at 0.
			if null == nil {
				if null, err = os.OpenFile(os.DevNull, os.O_WRONLY, 0); err != nil {
					fmt.Println("error", err)
					return 1
				}
			}
			n, err := unix.Sendfile(int(null.Fd()), int(f.Fd()), &sendOff, lab.SeqBlock)
			mu.Lock()
			count += int64(n)
			mu.Unlock()
			if err == nil && n == 0 {
				_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
				sendOff = 0
			}
			if err != nil {
				fmt.Println("error", err)
				return 1
			}
		case "pread":
			// Buffered random 4 KB reads, every one a miss.
			for i := 0; i < 16; i++ {
				if _, err := f.ReadAt(buf[:4096], rng.Int64N(size/4096)*4096); err != nil {
					fmt.Println("error", err)
					return 1
				}
			}
			mu.Lock()
			count += 16
			mu.Unlock()
			if time.Since(lastDrop) > 500*time.Millisecond {
				_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
				lastDrop = time.Now()
			}
		case "random":
			touch16()
			// Keep every touch a miss, so bytes per touch is the size of
			// the read around each fault.
			// Mapped pages stay cached: unmap them first.
			if time.Since(lastDrop) > 500*time.Millisecond {
				_ = unix.Madvise(data, unix.MADV_DONTNEED)
				_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
				lastDrop = time.Now()
			}
		case "reopen":
			// A service that opens its index per batch of lookups: the
			// random touches of "random", on a new open file (the
			// device's window) every 250 ms.
			touch16()
			if time.Since(lastDrop) > 250*time.Millisecond {
				_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
				_ = unix.Munmap(data)
				f.Close()
				if f, err = os.Open(path); err == nil {
					data, err = unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
				}
				if err != nil {
					fmt.Println("error re-open", err)
					return 1
				}
				lastDrop = time.Now()
			}
		}
	}
}

func selfReadBytes() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "read_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

// point is one report of a child reader.
type point struct {
	At        time.Duration // CLOCK_MONOTONIC
	Count     int64
	ReadBytes int64
}

// child is a reader process.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	Pid  int
	mu   sync.Mutex
	pts  []point
	errs []string
	done chan struct{}
	// pausedAt: when the reader took its latest pause (CLOCK_MONOTONIC).
	pausedAt atomic.Int64
}

func startChild(t *testing.T, mode, path string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode+":"+path)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	outp, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, in: in, Pid: cmd.Process.Pid, done: make(chan struct{})}
	t.Cleanup(func() { c.stop() })
	sc := bufio.NewScanner(outp)
	require.True(t, sc.Scan(), "%s reader of %s did not start", mode, path)
	require.True(t, strings.HasPrefix(sc.Text(), "ready"), "reader: %s", sc.Text())
	go func() {
		defer close(c.done)
		for sc.Scan() {
			var p point
			var at int64
			if _, err := fmt.Sscanf(sc.Text(), "paused %d", &at); err == nil {
				c.pausedAt.Store(at)
				continue
			}
			if _, err := fmt.Sscanf(sc.Text(), "%d %d %d", &at, &p.Count, &p.ReadBytes); err != nil {
				c.mu.Lock()
				c.errs = append(c.errs, sc.Text())
				c.mu.Unlock()
				continue
			}
			p.At = time.Duration(at)
			c.mu.Lock()
			c.pts = append(c.pts, p)
			c.mu.Unlock()
		}
	}()
	return c
}

// pause makes the reader stop reading for d, its file open, and returns
// when it resumes (CLOCK_MONOTONIC) once it has taken the pause.
func (c *child) pause(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	before := c.pausedAt.Load()
	_, err := fmt.Fprintf(c.in, "pause %d\n", d.Milliseconds())
	require.NoError(t, err)
	require.Eventually(t, func() bool { return c.pausedAt.Load() != before }, 5*time.Second, time.Millisecond, "the reader took its pause")
	return time.Duration(c.pausedAt.Load()) + d
}

func (c *child) goRead(t *testing.T) {
	t.Helper()
	_, err := io.WriteString(c.in, "go\n")
	require.NoError(t, err)
}

// stop ends the reader (closing its stdin) and waits for it.
func (c *child) stop() {
	if c.cmd.ProcessState != nil {
		return
	}
	c.in.Close()
	w := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(w) }()
	select {
	case <-w:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-w
	}
}

func (c *child) alive() bool {
	return c.cmd.ProcessState == nil && syscall.Kill(c.Pid, 0) == nil
}

func (c *child) points() []point {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]point(nil), c.pts...)
}

func (c *child) failures() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.errs...)
}

// window is the rate of one window of a reader's reports.
type window struct {
	Start, End time.Duration // CLOCK_MONOTONIC
	Rate       float64       // count per second (MB/s for seq: bytes/1e6)
	PerCount   float64       // read_bytes per count (bytes per touch for random)
}

// windows cuts pts[from..to) into windows of length w.
func windows(pts []point, from, to, w time.Duration) []window {
	var out []window
	at := func(t time.Duration) (point, bool) {
		i := sort.Search(len(pts), func(i int) bool { return pts[i].At >= t })
		if i >= len(pts) {
			return point{}, false
		}
		return pts[i], true
	}
	for s := from; s+w <= to; s += w {
		a, ok1 := at(s)
		b, ok2 := at(s + w)
		if !ok1 || !ok2 || b.At <= a.At {
			continue
		}
		x := window{Start: a.At, End: b.At, Rate: float64(b.Count-a.Count) / (b.At - a.At).Seconds()}
		if n := b.Count - a.Count; n > 0 && a.ReadBytes >= 0 {
			x.PerCount = float64(b.ReadBytes-a.ReadBytes) / float64(n)
		}
		out = append(out, x)
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func rates(ws []window, f func(window) float64) []float64 {
	out := make([]float64, 0, len(ws))
	for _, w := range ws {
		out = append(out, f(w))
	}
	return out
}

// needRoot skips unless the tests can build labs and load BPF.
func needRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("lab integration test: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop devices, FUSE, BPF and sysfs writes")
	}
	if err := lab.Available(); err != nil {
		t.Skipf("needs the lab: %v", err)
	}
}

// newLab brings up a lab whose device starts at read_ahead_kb 128 (loop
// devices keep the value a previous user left).
func newLab(t *testing.T) *lab.Lab {
	t.Helper()
	return newModelLab(t, lab.Model{})
}

// newModelLab is a 2 GiB lab of device model m (zero fields take the
// default model's) at the device's 128 KB window.
func newModelLab(t *testing.T, m lab.Model) *lab.Lab {
	t.Helper()
	l := lab.New(t, lab.Options{SizeBytes: 2 << 30, Model: m})
	require.NoError(t, l.SetReadAheadKB(128))
	return l
}

// newBandwidthBoundLab is a lab whose healthy stream reaches the device's
// bandwidth at the device's 128 KB window on any host: 80 MB/s instead of
// the default 150. At 150 MB/s a host whose FUSE round trip is slow leaves
// a 128 KB stream window-bound (121-131 of 148 MB/s), where a larger
// window pays and keeping it is right; the tests of what happens when no
// window pays need a device where none does.
func newBandwidthBoundLab(t *testing.T) *lab.Lab {
	t.Helper()
	return newModelLab(t, lab.Model{BandwidthMBps: 80})
}

// daemonBin builds cmd/readaheadd once per test binary run.
func daemonBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binPath, binCleanup, binErr = daemontest.Build("readaheadd-tuner-it-")
	})
	require.NoError(t, binErr)
	return binPath
}

// daemon is `readaheadd run` as a subprocess of the built binary.
type daemon struct {
	cmd  *exec.Cmd
	addr string
	logs *daemontest.SyncBuffer
	done chan struct{}
}

func runDaemon(t *testing.T, l *lab.Lab, stateDir string, extra ...string) *daemon {
	t.Helper()
	d := &daemon{addr: daemontest.FreeAddr(t), logs: &daemontest.SyncBuffer{}, done: make(chan struct{})}
	args := append([]string{"run", "--device", l.Name, "--allow-path", l.Mount, "--state-dir", stateDir,
		"--metrics-addr", d.addr}, extra...)
	d.cmd = exec.Command(daemonBin(t), args...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	require.NoError(t, d.cmd.Start())
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.done:
			case <-time.After(20 * time.Second):
				_ = d.cmd.Process.Kill()
				<-d.done
			}
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.logs.String())
		}
	})
	require.Eventually(t, func() bool {
		select {
		case <-d.done:
			return true
		default:
		}
		return daemontest.OK("http://" + d.addr + "/healthz")
	}, 30*time.Second, 100*time.Millisecond, "daemon did not become healthy")
	select {
	case <-d.done:
		t.Fatalf("daemon exited at start (code %d):\n%s", d.cmd.ProcessState.ExitCode(), d.logs.String())
	default:
	}
	return d
}

// signal sends sig and waits for the exit code.
func (d *daemon) signal(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(sig))
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("daemon did not exit within 30 s of %v", sig)
	}
	return d.cmd.ProcessState.ExitCode()
}

type fileEntry struct {
	File       string  `json:"file"`
	Path       string  `json:"path"`
	Requests   uint64  `json:"requests"`
	Bytes      uint64  `json:"bytes"`
	MeanSizeKB float64 `json:"mean_size_kb"`
	LastSeen   float64 `json:"last_seen_monotonic_seconds"`
	Regimes    []string
}

func (d *daemon) files(ctx context.Context) ([]fileEntry, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.addr+"/debug/files?n=50", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	// The endpoint returns a list, or an object holding one.
	var fs []fileEntry
	if err := json.Unmarshal(b, &fs); err == nil {
		return fs, nil
	}
	var wrap struct {
		Files []fileEntry `json:"files"`
	}
	if err := json.Unmarshal(b, &wrap); err != nil {
		return nil, fmt.Errorf("decode /debug/files: %w: %.200s", err, b)
	}
	return wrap.Files, nil
}

type regimeEntry struct {
	Kind     string  `json:"kind"`
	File     string  `json:"file"` // path, or major:minor/inode
	Since    float64 `json:"since_monotonic_seconds"`
	Evidence string  `json:"evidence"`
}

func (d *daemon) regimes() []regimeEntry {
	resp, err := http.Get("http://" + d.addr + "/debug/status")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st struct {
		Regimes []regimeEntry `json:"regimes"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st.Regimes
}

type actionEntry struct {
	Time     time.Time `json:"time"`
	Action   string    `json:"action"`
	Target   string    `json:"target"`
	FromKB   int       `json:"from_kb"`
	ToKB     int       `json:"to_kb"`
	Result   string    `json:"result"`
	Evidence string    `json:"evidence"`
}

func (d *daemon) actions() []actionEntry {
	resp, err := http.Get("http://" + d.addr + "/debug/status")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st struct {
		Recent []actionEntry `json:"recent_actions"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st.Recent
}

// runCLI runs the binary to completion and returns its exit code and output.
func runCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, daemonBin(t), args...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		require.NoError(t, err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// capacityLearned waits until the daemon logs that it learned its device's
// capacity (a trial that raised the bytes in flight and not the
// throughput) and returns when it saw it.
func (d *daemon) capacityLearned(t *testing.T, within time.Duration) time.Time {
	t.Helper()
	learned := func() bool { return strings.Contains(d.logs.String(), "device capacity learned") }
	require.Eventually(t, learned, within, 100*time.Millisecond, "a trial on the healthy stream teaches the device's capacity")
	at := time.Now()
	d.logCapacity(t)
	return at
}

// logCapacity logs the daemon's lines about its devices' capacity.
func (d *daemon) logCapacity(t *testing.T) {
	for _, line := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(line, "device capacity") {
			t.Logf("%s", line)
		}
	}
}
