package lab_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/test/lab"
)

var raSweep = []int{128, 256, 512, 1024, 2048, 4096}

// fileMB is the size of the file the throughput tests read: one HDFS block
// in the full form, half of one in the short form CI runs.
func fileMB() int {
	if lab.Full() {
		return 256
	}
	return 128
}

func passes() int {
	if lab.Full() {
		return 3
	}
	return 2
}

// sweep reads path once per read_ahead_kb value, the file's cache dropped
// before each read, and returns MB/s per value.
func sweep(t *testing.T, l *lab.Lab, path string, kbs []int) map[int]float64 {
	t.Helper()
	out := map[int]float64{}
	// Other work on this machine can only slow a pass down: keep the best
	// of several interleaved passes per setting.
	for pass := 0; pass < passes(); pass++ {
		for _, kb := range kbs {
			require.NoError(t, l.SetReadAheadKB(kb))
			require.NoError(t, lab.DropFileCache(path))
			res, err := lab.ReadSeq(path)
			require.NoError(t, err)
			out[kb] = max(out[kb], res.MBps())
		}
	}
	require.NoError(t, l.SetReadAheadKB(128))
	return out
}

func best(m map[int]float64) (int, float64) {
	bk, bv := 0, 0.0
	for k, v := range m {
		if v > bv || (v == bv && k < bk) {
			bk, bv = k, v
		}
	}
	return bk, bv
}

func line(m map[int]float64) string {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	var b strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&b, " %d:%.0f", k, m[k])
	}
	return strings.TrimSpace(b.String())
}

// TestLabHealthyAndPermanent checks the device model: healthy, the default
// window is within 20% of the best static one; a permanent +1.5 ms slowdown
// on the file costs the default window >= 30% and +3 ms more than half
// (against the best healthy default read of the run, defaultKeep),
// while the best static window recovers >= 90% of healthy. It also checks
// that the block layer sees the injected latency (/proc/diskstats). The lab
// is a user space server on a shared host: when the host takes its CPU for
// the length of a sweep (a CI run read single 128 KB requests in 2.3 ms
// healthy against 1.3 ms, and the default window at 71% of the best) the
// model is measured on a slower device than it is. A run that misses is run
// once more on a fresh lab, and the second must meet every figure.
func TestLabHealthyAndPermanent(t *testing.T) {
	lab.RunTwice(t, "the lab's device model", labModelRun)
}

// labModelRun measures the model on a fresh lab and returns the figures it
// missed; what does not depend on the host's speed is asserted.
func labModelRun(t *testing.T) (missed []string) {
	miss := func(ok bool, format string, args ...any) {
		if !ok {
			missed = append(missed, fmt.Sprintf(format, args...))
		}
	}
	l := lab.New(t, lab.Options{})
	p, err := l.WriteFile("block.dat", fileMB())
	require.NoError(t, err)

	healthy := sweep(t, l, p, raSweep)
	_, hBest := best(healthy)
	t.Logf("healthy %d MB, MB/s by read_ahead_kb: %s", fileMB(), line(healthy))
	// The default window keeps two requests of about a millisecond in
	// flight, so a late wake-up of the lab's threads costs it most: on one
	// host it read 63-148 MB/s in passes of one run, where 1 MB and larger
	// windows read 148-150. The model is judged on the best of every
	// healthy default read of the run (the sweep's and defaultKeep's).
	hDefault := healthy[128]

	// Block-layer latency of single 128 KB requests, one in flight (the
	// thesis' method, below): the channel never queues, so any rise is the
	// regime's.

	for _, c := range []struct {
		extra   time.Duration
		maxKeep float64 // default window keeps at most this share of healthy
	}{{1500 * time.Microsecond, 0.70}, {3 * time.Millisecond, 0.50}} {
		require.NoError(t, l.Clear())
		require.NoError(t, l.SetPermanent(c.extra, p))
		slow := sweep(t, l, p, raSweep)
		bk, bv := best(slow)
		slowed, h := defaultKeep(t, l, p, c.extra)
		hDefault = max(hDefault, h)
		keep := slowed / hDefault
		t.Logf("permanent +%s, MB/s by read_ahead_kb: %s; default keeps %.0f%% of healthy; best %d KB recovers %.0f%%",
			c.extra, line(slow), 100*keep, bk, 100*bv/hBest)
		miss(keep < c.maxKeep, "permanent +%s: default window must lose enough (keeps %.2f, at most %.2f)", c.extra, keep, c.maxKeep)
		miss(bv >= 0.9*hBest, "permanent +%s: best static window recovers >= 90%% of healthy (%.0f of %.0f)", c.extra, bv, hBest)

		// The rise, healthy and slowed measured back to back three times
		// (the median of the three): on a shared host a single pair
		// strays by a few hundred microseconds.
		var rises []time.Duration
		for i := 0; i < 3; i++ {
			require.NoError(t, l.Clear())
			base := singleLatency(t, l, p)
			require.NoError(t, l.SetPermanent(c.extra, p))
			sLat := singleLatency(t, l, p)
			rises = append(rises, sLat-base)
			t.Logf("permanent +%s: block-layer median latency of single 128 KB reads %s healthy -> %s (+%s)", c.extra, base, sLat, sLat-base)
		}
		slices.Sort(rises)
		miss(math.Abs(float64(rises[1]-c.extra)) <= 0.15*float64(c.extra),
			"block-layer latency increase should match the injected +%s (rises %v)", c.extra, rises)
	}
	miss(hDefault >= 0.8*hBest, "healthy: default 128 KB (best %.0f MB/s) within 20%% of the best window (%.0f)", hDefault, hBest)
	st, err := l.Stats()
	require.NoError(t, err)
	assert.NotZero(t, st.HitsPermanent)
	ev, err := l.GroundTruth()
	require.NoError(t, err)
	var perms int
	for _, e := range ev {
		if e.Event == "permanent" {
			perms++
			assert.Equal(t, p, e.Label)
		}
	}
	// Each of the two regimes is set for its sweep, for each of the three
	// throughput pairs and for each of the three latency pairs.
	assert.Equal(t, 2*(1+3+3), perms, "ground truth records every permanent regime set")
	return missed
}

// defaultKeep reads path with the default window under a permanent +extra
// on it, three times, each just after a healthy read, and returns the
// median slowed rate and the best healthy one. The share is taken of the
// best healthy default read of the run: a stretch in which the host takes
// the lab's CPU slows the healthy read (two requests of about a millisecond
// in flight: a late wake-up costs it most) far more than the slowed one,
// whose added latency absorbs it (a CI run: 0.71 and 0.60 of their pairs'
// healthy reads, where a quiet host reads 0.62 and 0.40). The slowdown is
// left set.
func defaultKeep(t *testing.T, l *lab.Lab, path string, extra time.Duration) (slowed, healthy float64) {
	t.Helper()
	require.NoError(t, l.SetReadAheadKB(128))
	read := func() float64 {
		require.NoError(t, lab.DropFileCache(path))
		res, err := lab.ReadSeq(path)
		require.NoError(t, err)
		return res.MBps()
	}
	var rates []float64
	for range 3 {
		require.NoError(t, l.Clear())
		h := read()
		require.NoError(t, l.SetPermanent(extra, path))
		s := read()
		rates = append(rates, s)
		healthy = max(healthy, h)
		t.Logf("permanent +%s: default window %.0f MB/s healthy -> %.0f slowed (%.2f of the pair's healthy read)", extra, h, s, s/h)
	}
	slices.Sort(rates)
	return rates[1], healthy
}

// singleLatency reads path with O_DIRECT in 128 KB requests, one at a
// time (the thesis' method: the channel never queues, so any rise is the
// regime's), and returns the median latency the block layer saw (probe).
func singleLatency(t *testing.T, l *lab.Lab, path string) time.Duration {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	require.NoError(t, err)
	defer f.Close()
	buf, err := unix.Mmap(-1, 0, 128<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(buf)
	stop := capture(t, l)
	for off := int64(0); off < 32<<20; off += int64(len(buf)) {
		_, err := f.ReadAt(buf, off)
		require.NoError(t, err)
	}
	ls := lats(stop(), func(r probe.Record) bool { return r.Bytes == 128<<10 })
	require.GreaterOrEqual(t, len(ls), 200, "the probe must see the 128 KB reads")
	return lab.Quantile(ls, 0.5)
}

// capture records what the block layer sees on the lab device with the
// probe; it returns a stop function giving the records.
func capture(t *testing.T, l *lab.Lab) func() []probe.Record {
	t.Helper()
	p, err := probe.Load(probe.Config{Devices: []probe.Dev{l.Dev}, Poll: 20 * time.Millisecond})
	if err != nil {
		t.Skipf("probe unavailable (%v): block-layer latency not checked", err)
	}
	var mu sync.Mutex
	var recs []probe.Record
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, probe.HandlerFuncs{Record: func(r probe.Record) {
			mu.Lock()
			recs = append(recs, r)
			mu.Unlock()
		}})
	}()
	var once sync.Once
	stop := func() []probe.Record {
		once.Do(func() {
			time.Sleep(100 * time.Millisecond) // let the last records drain
			cancel()
			require.NoError(t, <-done)
			require.NoError(t, p.Close())
		})
		mu.Lock()
		defer mu.Unlock()
		return recs
	}
	t.Cleanup(func() { stop() })
	return stop
}

func lats(recs []probe.Record, keep func(probe.Record) bool) []time.Duration {
	var out []time.Duration
	for _, r := range recs {
		if r.Error || (keep != nil && !keep(r)) {
			continue
		}
		out = append(out, r.Latency)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// TestLabTemporal: periodic windows in which 5% of reads wait 20 ms more
// raise the p99 the block layer sees, not the median.
func TestLabTemporal(t *testing.T) {
	l := lab.New(t, lab.Options{})
	p, err := l.WriteFile("t.dat", 64)
	require.NoError(t, err)
	read := func(d time.Duration) []probe.Record {
		stop := capture(t, l)
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			require.NoError(t, lab.DropFileCache(p))
			_, err := lab.ReadSeq(p)
			require.NoError(t, err)
		}
		return stop()
	}
	d := 3 * time.Second
	if lab.Full() {
		d = 10 * time.Second
	}
	base := lats(read(d), nil)
	require.NotEmpty(t, base)
	bm, b99 := lab.Quantile(base, 0.5), lab.Quantile(base, 0.99)
	// The stall is sized by the device's own tail: on a busy host the
	// lab's healthy p99 reaches 10 ms and more, and a stall within it
	// moves no percentile. Three times the healthy p99, 20 ms at the least.
	extra := max(20*time.Millisecond, (3 * b99).Round(time.Millisecond))
	// Windows cover the whole run (duration = period) so that the
	// comparison is between regimes, not diluted by time outside windows.
	_, err = l.SetTemporal(lab.Temporal{Period: time.Second, Duration: time.Second, Fraction: 0.05, Extra: extra})
	require.NoError(t, err)
	slow := lats(read(d), nil)
	require.NoError(t, l.Clear("temporal"))
	require.NotEmpty(t, slow)
	sm, s99 := lab.Quantile(slow, 0.5), lab.Quantile(slow, 0.99)
	t.Logf("temporal (5%% of reads +%s): block-layer latency p50 %s -> %s, p99 %s -> %s (%d / %d requests)",
		extra, bm, sm, b99, s99, len(base), len(slow))
	assert.Greater(t, s99, b99+extra/2, "temporal: p99 must rise by most of the extra latency")
	assert.Less(t, float64(sm), 1.5*float64(bm), "temporal: the median must stay about the same")
}

// TestLabIntrinsic: in a file fragmented on purpose, the first reads of
// each extent are slower than the rest, as the block layer sees them.
func TestLabIntrinsic(t *testing.T) {
	l := lab.New(t, lab.Options{})
	a, _, err := l.WriteFragmented("frag-a.dat", "frag-b.dat", 64, 4)
	require.NoError(t, err)
	exts, err := lab.Extents(a)
	require.NoError(t, err)
	t.Logf("fragmented file: %d extents", len(exts))
	require.GreaterOrEqual(t, len(exts), 8, "interleaved fsynced writes must fragment the file")

	const firstN, extra = 2, 3 * time.Millisecond
	require.NoError(t, l.SetIntrinsic(firstN, extra, a))
	stop := capture(t, l)
	require.NoError(t, lab.DropFileCache(a))
	res, err := lab.ReadSeq(a)
	require.NoError(t, err)
	recs := stop()

	// Classify each request by where it falls in its extent: the first
	// firstN requests after the read enters an extent are "starts".
	sort.Slice(recs, func(i, j int) bool { return recs[i].Issue < recs[j].Issue })
	cur, seen := -1, 0
	var starts, rest []time.Duration
	for _, r := range recs {
		off := r.Sector * 512
		e := -1
		for i, x := range exts {
			if off >= x.Physical && off < x.Physical+x.Length {
				e = i
			}
		}
		if e < 0 {
			continue // metadata
		}
		if e != cur {
			cur, seen = e, 0
		}
		seen++
		if seen <= firstN {
			starts = append(starts, r.Latency)
		} else {
			rest = append(rest, r.Latency)
		}
	}
	require.NotEmpty(t, starts)
	require.NotEmpty(t, rest)
	sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
	sort.Slice(rest, func(i, j int) bool { return rest[i] < rest[j] })
	ms, mr := lab.Quantile(starts, 0.5), lab.Quantile(rest, 0.5)
	t.Logf("intrinsic (first %d requests of each extent +%s): block-layer median %s at extent starts (%d requests) vs %s elsewhere (%d); file read at %.0f MB/s",
		firstN, extra, ms, len(starts), mr, len(rest), res.MBps())
	assert.Greater(t, ms, mr+extra/2, "intrinsic: extent-start requests must be slower by most of the extra latency")
}

// TestLabContentionAndCleanup: a background reader takes device bandwidth
// from a sequential reader; Down leaves no loop device, mount or process.
func TestLabContentionAndCleanup(t *testing.T) {
	if err := lab.Available(); err != nil {
		t.Skipf("lab: %v", err)
	}
	l, err := lab.Up(lab.Options{})
	require.NoError(t, err)
	st := l.State()
	downed := false
	t.Cleanup(func() {
		if !downed {
			_ = l.Down()
		}
	})
	p, err := l.WriteFile("fg.dat", 64)
	require.NoError(t, err)
	_, err = l.WriteFile("bg.dat", 64)
	require.NoError(t, err)
	alone, err := lab.ReadSeq(p)
	require.NoError(t, err)
	c, err := l.StartContention("bg.dat", 2, 1024)
	require.NoError(t, err)
	require.NoError(t, lab.DropFileCache(p))
	shared, err := lab.ReadSeq(p)
	require.NoError(t, err)
	require.NoError(t, c.Stop())
	t.Logf("contention: foreground %.0f MB/s alone, %.0f MB/s against 2 O_DIRECT readers (%d MB read in background)",
		alone.MBps(), shared.MBps(), c.Bytes()>>20)
	assert.Less(t, shared.MBps(), 0.8*alone.MBps(), "contention must take bandwidth")

	ev, err := l.GroundTruth()
	require.NoError(t, err)
	var names []string
	for _, e := range ev {
		names = append(names, e.Event)
	}
	assert.Subset(t, names, []string{"start", "contention-start", "contention-stop"})

	// An already-open reader keeps working across Down's preparations.
	require.NoError(t, l.Down())
	downed = true
	require.NoError(t, l.Down(), "Down is idempotent")

	losetup, _ := os.ReadFile("/proc/self/mounts")
	assert.NotContains(t, string(losetup), st.Mount)
	assert.NotContains(t, string(losetup), st.FuseDir)
	_, err = os.Stat("/sys/block/" + l.Name + "/loop/backing_file")
	if err == nil {
		b, _ := os.ReadFile("/sys/block/" + l.Name + "/loop/backing_file")
		assert.NotEqual(t, st.Image, strings.TrimSpace(string(b)), "loop device still attached to the lab image")
	}
	// Down returns once labfs has exited; the lab's own wait reaps it a
	// moment later (until then /proc keeps a zombie).
	gone := func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", st.PID))
		return os.IsNotExist(err)
	}
	for deadline := time.Now().Add(2 * time.Second); !gone() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	assert.True(t, gone(), "labfs process %d still exists", st.PID)
	_, err = os.Stat(st.WorkDir)
	assert.True(t, os.IsNotExist(err), "work directory remains")
	_, err = os.Stat(lab.StateDir + "/" + st.ID + ".json")
	assert.True(t, os.IsNotExist(err), "state file remains")
}

// TestLabScenario runs the short scenario file and checks that its steps
// are in the ground truth in order, and the reader saw the permanent phase.
func TestLabScenario(t *testing.T) {
	l := lab.New(t, lab.Options{})
	sc, err := lab.LoadScenario("scenarios/short.yaml")
	require.NoError(t, err)
	samples, err := sc.Run(context.Background(), l)
	require.NoError(t, err)
	byPhase := map[string][]float64{}
	for _, s := range samples {
		byPhase[s.Phase] = append(byPhase[s.Phase], s.MBps)
	}
	for ph, v := range byPhase {
		t.Logf("scenario phase %-10s %d samples, MB/s %v", ph, len(v), v)
	}
	assert.NotEmpty(t, byPhase["permanent"], "the reader ran during the permanent phase")
	ev, err := l.GroundTruth()
	require.NoError(t, err)
	var seq []string
	for _, e := range ev {
		seq = append(seq, e.Event)
	}
	want := []string{"scenario-start", "permanent", "clear", "temporal", "clear", "intrinsic", "clear", "contention-start", "contention-stop", "clear", "scenario-end"}
	assert.Equal(t, want, seq[1:], "ground truth in scenario order")
	for i := 1; i < len(ev); i++ {
		assert.GreaterOrEqual(t, ev[i].Mono, ev[i-1].Mono)
	}
}

// TestLabCleanupFindsLeftovers: a lab whose owner "crashed" (state file
// claims a dead owner) is removed by Cleanup.
func TestLabCleanupFindsLeftovers(t *testing.T) {
	l := lab.New(t, lab.Options{})
	st := l.State()
	// Pretend the owner died: rewrite the state file with a dead pid.
	b, err := os.ReadFile(lab.StateDir + "/" + st.ID + ".json")
	require.NoError(t, err)
	dead := strings.Replace(string(b), fmt.Sprintf(`"owner": %d`, st.Owner), `"owner": 999999999`, 1)
	require.NotEqual(t, string(b), dead)
	require.NoError(t, os.WriteFile(lab.StateDir+"/"+st.ID+".json", []byte(dead), 0o600))
	removed, err := lab.Cleanup(false)
	require.NoError(t, err)
	t.Logf("cleanup removed %v", removed)
	assert.Contains(t, removed, "lab "+st.ID)
	mounts, _ := os.ReadFile("/proc/self/mounts")
	assert.NotContains(t, string(mounts), st.WorkDir)
	_, err = os.Stat(fmt.Sprintf("/proc/%d", st.PID))
	assert.True(t, os.IsNotExist(err), "labfs still running")
	_, err = os.Stat(st.WorkDir)
	assert.True(t, os.IsNotExist(err))
}
