package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/lab"
)

// failSlowLong reports whether the long form runs (READAHEADD_BENCH=failslow,
// make bench-failslow): 10 minutes of two healthy disks under the same
// streaming load, then 3 minutes under different request sizes and queue
// depths, before the slowdown.
func failSlowLong() bool { return os.Getenv("READAHEADD_BENCH") == "failslow" }

// pacedReader re-reads a file sequentially (page cache dropped before each
// pass) with buffered 64 KiB reads at no more than mbps MB/s (0: as fast as
// it can), never catching up after a slow read, until ctx ends.
func pacedReader(ctx context.Context, path string, mbps float64) error {
	buf := make([]byte, lab.SeqBlock)
	for ctx.Err() == nil {
		if err := lab.DropFileCache(path); err != nil {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		next := time.Now()
		for ctx.Err() == nil {
			n, err := f.Read(buf)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				f.Close()
				return err
			}
			if mbps > 0 {
				next = next.Add(time.Duration(float64(n) / (mbps * 1e6) * float64(time.Second)))
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				} else {
					next = time.Now()
				}
			}
		}
		f.Close()
	}
	return nil
}

// failSlowWatch scrapes the daemon every second and keeps every fail-slow
// sample per device.
type failSlowWatch struct {
	mu     sync.Mutex
	named  map[string]int       // scrapes with readaheadd_disk_slow 1
	files  map[string]int       // scrapes with readaheadd_disk_slow_files > 0
	ratios map[string][]float64 // every ratio seen
	refs   map[string]map[string]int
}

var slowRatioLine = regexp.MustCompile(`(?m)^readaheadd_disk_slow_ratio\{device="([^"]+)",reference="([^"]+)"\} (\S+)$`)

func (w *failSlowWatch) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.named, w.files, w.ratios, w.refs = map[string]int{}, map[string]int{}, map[string][]float64{}, map[string]map[string]int{}
}

func (w *failSlowWatch) scrape(d *daemonProc, t *testing.T, devs []string) {
	m := d.metrics(t)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, dev := range devs {
		if v, ok := sample(m, `readaheadd_disk_slow{device="`+dev+`"}`); ok && v == 1 {
			w.named[dev]++
		}
		if v, ok := sample(m, `readaheadd_disk_slow_files{device="`+dev+`"}`); ok && v > 0 {
			w.files[dev]++
		}
	}
	for _, r := range slowRatioLine.FindAllStringSubmatch(m, -1) {
		v, _ := strconv.ParseFloat(r[3], 64)
		w.ratios[r[1]] = append(w.ratios[r[1]], v)
		if w.refs[r[1]] == nil {
			w.refs[r[1]] = map[string]int{}
		}
		w.refs[r[1]][r[2]]++
	}
}

// summary prints each device's ratios: count, median, p99, max.
func (w *failSlowWatch) summary(devs []string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b bytes.Buffer
	for _, dev := range devs {
		rs := append([]float64(nil), w.ratios[dev]...)
		sort.Float64s(rs)
		q := func(p float64) float64 {
			if len(rs) == 0 {
				return math.NaN()
			}
			return rs[min(len(rs)-1, int(math.Ceil(p*float64(len(rs))))-1)]
		}
		fmt.Fprintf(&b, "%s: %d ratios (references %v), median %.2f, p99 %.2f, max %.2f; named in %d scrapes, slow files in %d\n",
			dev, len(rs), w.refs[dev], q(0.5), q(0.99), q(1), w.named[dev], w.files[dev])
	}
	return b.String()
}

// TestFailSlowDiskLab runs the daemon on two lab disks read alike by paced
// sequential readers: healthy, nothing may be named (30 s here; 10 minutes
// plus 3 minutes at different request sizes and queue depths with
// READAHEADD_BENCH=failslow); then every read of one disk waits 3 ms more
// and it must be named within a minute, the other disk not, while a file
// slowed on the other disk is named as slower than its disk, by path.
func TestFailSlowDiskLab(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end lab test: skipped in -short mode")
	}
	start := time.Now()
	a := lab.New(t, lab.Options{SizeBytes: 1 << 30})
	b := lab.New(t, lab.Options{SizeBytes: 1 << 30})
	devs := []string{a.Name, b.Name}
	var files [2][2]string
	for i, l := range []*lab.Lab{a, b} {
		for j := range 2 {
			p, err := l.WriteFile(fmt.Sprintf("stream%d", j), 256)
			require.NoError(t, err)
			files[i][j] = p
		}
	}
	args := []string{"--device", a.Name, "--device", b.Name, "--allow-path", a.Mount, "--allow-path", b.Mount,
		"--state-dir", filepath.Join(t.TempDir(), "state"), "--interval", "1s"}
	// The signal under test is the detector's and the judge's. With the
	// tuner acting, streams get windows of up to 4 MiB: disks are still
	// named on their unqueued reads, but a slowed file's requests grow to
	// 1-2 MiB, where its ratio is diluted (docs/operations.md, "Fail-slow
	// disks and files"). READAHEADD_FAILSLOW_TUNER=1 runs it acting.
	if os.Getenv("READAHEADD_FAILSLOW_TUNER") != "1" {
		args = append(args, "--dry-run")
	}
	if lv := os.Getenv("READAHEADD_FAILSLOW_LOG"); lv != "" {
		// debug: every verdict with the latency profile it was judged on
		args = append(args, "--log-level", lv)
	}
	d := startDaemon(t, args...)
	if dir := os.Getenv("READAHEADD_FAILSLOW_LOGDIR"); dir != "" {
		// keep the daemon's log of a passing run too
		t.Cleanup(func() { _ = os.WriteFile(filepath.Join(dir, "daemon.log"), []byte(d.logs.String()), 0o644) })
	}
	t.Logf("two labs and the daemon up in %.1f s (uptime: %s)", time.Since(start).Seconds(), loadAvg())

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	readErr := make(chan error, 8)
	reader := func(rctx context.Context, path string, mbps float64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pacedReader(rctx, path, mbps); err != nil && rctx.Err() == nil {
				readErr <- err
			}
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	const rate = 30 // MB/s per stream: two streams keep a lab disk about 40% busy
	for i := range 2 {
		for j := range 2 {
			reader(ctx, files[i][j], rate)
		}
	}

	w := &failSlowWatch{}
	watchFor := func(d0 time.Duration, until func() bool) time.Duration {
		t0 := time.Now()
		for time.Since(t0) < d0 {
			time.Sleep(time.Second)
			w.scrape(d, t, devs)
			select {
			case err := <-readErr:
				require.NoError(t, err, "a reader failed")
			default:
			}
			if until != nil && until() {
				break
			}
		}
		return time.Since(t0)
	}

	healthy := 30 * time.Second
	if failSlowLong() {
		healthy = 10 * time.Minute
	}
	w.reset()
	watchFor(healthy, nil)
	sum := w.summary(devs)
	t.Logf("healthy, the same load on both disks for %s:\n%s", healthy, sum)
	for _, dev := range devs {
		assert.Zero(t, w.named[dev], "healthy %s named fail-slow", dev)
		assert.Zero(t, w.files[dev], "healthy %s has files named slower than the disk", dev)
		assert.NotEmpty(t, w.ratios[dev], "%s got a verdict", dev)
	}

	if failSlowLong() {
		// Different request sizes and queue depths: disk a read by two
		// unpaced streams at a 1 MiB window, disk b as before.
		require.NoError(t, a.SetReadAheadKB(1024))
		actx, acancel := context.WithCancel(ctx)
		reader(actx, files[0][0], 0)
		reader(actx, files[0][1], 0)
		w.reset()
		watchFor(3*time.Minute, nil)
		acancel()
		t.Logf("healthy, disk %s unpaced at a 1 MiB window, %s paced at 128 KiB, 3 min:\n%s", a.Name, b.Name, w.summary(devs))
		for _, dev := range devs {
			assert.Zero(t, w.named[dev], "healthy %s named fail-slow at different request sizes and depths", dev)
		}
		require.NoError(t, a.SetReadAheadKB(128))
	}

	// Every read of disk a waits 3 ms more.
	m := lab.DefaultModel
	m.Latency += 3 * time.Millisecond
	require.NoError(t, a.SetModel(m))
	w.reset()
	took := watchFor(time.Minute, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.named[a.Name] > 0
	})
	var status bytes.Buffer
	st, err := fetchStatus(context.Background(), d.addr)
	require.NoError(t, err)
	printStatus(&status, st)
	t.Logf("+3 ms on every read of %s: named after %.0f s\n%s\nreadaheadd status:\n%s", a.Name, took.Seconds(), w.summary(devs), failSlowSection(status.String()))
	assert.Positive(t, w.named[a.Name], "%s, 3 ms slower on every read, named fail-slow within a minute", a.Name)
	assert.Zero(t, w.named[b.Name], "%s named fail-slow beside a slower disk", b.Name)
	assert.Zero(t, w.files[a.Name], "files of a disk slow as a whole named slower than their disk")
	assert.Contains(t, status.String(), "fail-slow disks: "+a.Name)

	// Then one file of disk b reads 3 ms slower than the rest of b.
	require.NoError(t, b.SetPermanent(3*time.Millisecond, files[1][1]))
	w.reset()
	took = watchFor(30*time.Second, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.files[b.Name] > 0
	})
	status.Reset()
	st, err = fetchStatus(context.Background(), d.addr)
	require.NoError(t, err)
	printStatus(&status, st)
	t.Logf("+3 ms on %s of %s: named after %.0f s\n%s\nreadaheadd status:\n%s", filepath.Base(files[1][1]), b.Name, took.Seconds(), w.summary(devs), failSlowSection(status.String()))
	assert.Positive(t, w.files[b.Name], "the slowed file on %s named", b.Name)
	assert.Contains(t, status.String(), files[1][1], "status names the slowed file by its path (under the allow-paths)")
	assert.NotContains(t, failSlowSection(status.String()), files[1][0], "the healthy file beside it is not named")
	t.Logf("total %.0f s", time.Since(start).Seconds())
	require.NoError(t, b.Clear())
	require.NoError(t, a.SetModel(lab.DefaultModel))
}

// failSlowSection is status output from "fail-slow disks:" to the next
// blank line after the files.
func failSlowSection(s string) string {
	i := strings.Index(s, "fail-slow disks:")
	if i < 0 {
		return ""
	}
	s = s[i:]
	if j := strings.Index(s, "\n\n"); j >= 0 {
		s = s[:j]
	}
	return s
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return string(bytes.TrimSpace(b))
}
