// Package probecost measures what watching a fast device with readaheadd
// costs the reads on it: fio on a RAM-backed loop device, without and with
// the daemon in alternating arms, side by side in one run.
package probecost

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// workload is one fio job, run without a break while the arms take turns.
type workload struct {
	name string
	args []string
}

// Arms: no daemon; the daemon; no daemon but an empty tp_btf program on
// block_rq_issue and one on block_rq_complete (the floor of any design that
// runs a program per request at issue and at completion); and, when
// READAHEADD_BENCH_BEFORE_BIN names another build of the daemon (e.g. of an
// earlier commit), that build, to compare two designs in one run.
const (
	armOff    = "off"
	armOn     = "on"
	armEmpty  = "empty"
	armBefore = "before"
)

var workloads = []workload{
	{"4k-randread-qd32", []string{"--rw=randread", "--bs=4k", "--iodepth=32", "--ioengine=io_uring", "--direct=1"}},
	{"1m-seqread-qd4", []string{"--rw=read", "--bs=1M", "--iodepth=4", "--ioengine=io_uring", "--direct=1"}},
}

// segment is one measured stretch of the running workload in one arm.
type segment struct {
	kind      string
	iops, bps float64
	// With a daemon:
	cpuNs    float64 // daemon CPU time in the segment, ns
	wallNs   float64
	rssMB    float64
	lost     float64 // readaheadd_bpf_events_lost_total at the end
	sampleN  float64 // readaheadd_probe_sample_every at the end
	streamed float64 // records streamed per second (the probe's per-disk count)
}

// progCost is one arm's BPF cost from a window with run-time statistics on.
type progCost struct {
	ns         map[string]int64 // ns per run, per program
	perRequest float64          // all block programs' ns per completed request
}

// TestIOPSCost measures what watching a fast device costs the reads on it.
//
// Design: fio runs each workload without a break (no job start or end in
// any measurement) while the arms take turns: off, A, A, off, B, B, off,
// ... in segments of READAHEADD_BENCH_SECONDS (default 1.5), the arms'
// order rotating between READAHEADD_BENCH_CYCLES cycles (default 10). IOPS
// are the loop device's own completed reads (/sys/block/loopN/stat) over
// exactly the segment. A turn (off, arm, arm, off) gives one ratio, the
// arm's IOPS over the off segments' beside it: a linear drift of the host
// cancels, and the turn is short (about 5 s), so that the other load of a
// shared host changes within few turns; turns whose two off segments
// disagree (it changed mid-turn) are reported apart. The figures are the
// turns' mean, median, spread and a 95% confidence interval of the mean.
// After each change of arm the next segment waits until it settled: the
// daemon 0.7 s after it is healthy (its sampler starts at period 1 and
// adapts within a poll or two), the empty programs 0.2 s, the arm without
// anything 0.3 s after the daemon exited. BPF run-time statistics stay off
// in the measured segments, as deployed (they add two clock reads to every
// program run); ns per program run come from a separate window per
// workload and arm with statistics on (READAHEADD_BENCH_STATS_SECONDS,
// default 3). READAHEADD_BENCH_WORKLOADS (comma-separated names) runs only
// those workloads: a long run of one, to narrow its interval.
func TestIOPSCost(t *testing.T) {
	if os.Getenv("READAHEADD_BENCH") == "" {
		t.Skip("benchmark: set READAHEADD_BENCH=1 (make bench-iops)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop device, BPF, bpf_stats_enabled")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("needs fio (apt-get install fio)")
	}
	cycles := envInt("READAHEADD_BENCH_CYCLES", 10)
	segSecs := envFloat("READAHEADD_BENCH_SECONDS", 1.5)
	statsSecs := envFloat("READAHEADD_BENCH_STATS_SECONDS", 3)
	bin := os.Getenv("READAHEADD_BIN")
	beforeBin := os.Getenv("READAHEADD_BENCH_BEFORE_BIN")
	work := t.TempDir()
	if bin == "" {
		bin = filepath.Join(work, "readaheadd")
		out, err := exec.Command("go", "build", "-o", bin, "../../cmd/readaheadd").CombinedOutput()
		require.NoError(t, err, "build readaheadd: %s", out)
	}

	// A 1 GiB file in tmpfs behind a loop device: the device is as fast as
	// memory, so what the probe costs shows in full.
	img := filepath.Join("/dev/shm", fmt.Sprintf("readaheadd-probecost-%d.img", os.Getpid()))
	t.Cleanup(func() { os.Remove(img) })
	out, err := exec.Command("dd", "if=/dev/urandom", "of="+img, "bs=1M", "count=1024", "status=none").CombinedOutput()
	require.NoError(t, err, "fill image: %s", out)
	o, err := exec.Command("losetup", "--find", "--show", img).Output()
	require.NoError(t, err, "losetup")
	loop := strings.TrimSpace(string(o))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	name := filepath.Base(loop)

	// Run-time statistics only in the statistics windows; the old setting
	// is restored afterwards.
	old, err := os.ReadFile(statsSysctl)
	require.NoError(t, err)
	setStats(t, false)
	t.Cleanup(func() { os.WriteFile(statsSysctl, old, 0o644) })

	arms := []string{armOn, armEmpty}
	bins := map[string]string{armOn: bin}
	if beforeBin != "" {
		arms = append(arms, armBefore)
		bins[armBefore] = beforeBin
	}
	start := time.Now()
	results := map[string][]segment{}
	costs := map[string]map[string]progCost{}
	only := os.Getenv("READAHEADD_BENCH_WORKLOADS") // comma-separated names; empty: all
	for _, w := range workloads {
		if only != "" && !slices.Contains(strings.Split(only, ","), w.name) {
			continue
		}
		b := &bench{t: t, w: w, loop: loop, name: name, work: work, bins: bins, seg: secs(segSecs)}
		b.startFio()
		time.Sleep(2 * time.Second) // the first seconds of a job are slower
		var order []string
		for c := 0; c < cycles; c++ {
			for i := range arms {
				order = append(order, arms[(i+c)%len(arms)])
			}
		}
		segs := []segment{b.measure(armOff)}
		for _, a := range order {
			b.set(a)
			segs = append(segs, b.measure(a), b.measure(a))
			b.set(armOff)
			segs = append(segs, b.measure(armOff))
		}
		results[w.name] = segs
		costs[w.name] = map[string]progCost{}
		for _, a := range arms {
			costs[w.name][a] = b.cost(a, secs(statsSecs))
		}
		b.stopFio()
	}
	report(t, results, costs, segSecs, time.Since(start))
}

// statsSysctl switches kernel.bpf_stats_enabled.
const statsSysctl = "/proc/sys/kernel/bpf_stats_enabled"

func setStats(t *testing.T, on bool) {
	v := "0"
	if on {
		v = "1"
	}
	require.NoError(t, os.WriteFile(statsSysctl, []byte(v), 0o644))
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// bench drives one workload: fio in the background and the arms' states.
type bench struct {
	t          *testing.T
	w          workload
	loop, name string
	work       string
	bins       map[string]string
	seg        time.Duration

	fio     *exec.Cmd
	fioDone chan error
	state   string
	d       *daemon
	empties []*ebpf.Program
	links   []link.Link
}

// startFio runs the workload for far longer than needed; stopFio ends it.
func (b *bench) startFio() {
	args := append([]string{"--name=" + b.w.name, "--filename=" + b.loop, "--time_based", "--runtime=3600",
		"--numjobs=1", "--output=/dev/null"}, b.w.args...)
	b.fio = exec.Command("fio", args...)
	require.NoError(b.t, b.fio.Start(), "fio %v", args)
	b.fioDone = make(chan error, 1)
	go func() { b.fioDone <- b.fio.Wait() }()
	b.state = armOff
	b.t.Cleanup(b.stopFio)
}

func (b *bench) stopFio() {
	if b.fio == nil {
		return
	}
	b.set(armOff)
	b.fio.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.fioDone:
	case <-time.After(10 * time.Second):
		b.fio.Process.Kill()
		<-b.fioDone
	}
	b.fio = nil
}

// set moves to arm a and waits until the change settled.
func (b *bench) set(a string) {
	if a == b.state {
		return
	}
	switch b.state {
	case armOn, armBefore:
		b.d.stop()
		b.d = nil
	case armEmpty:
		for _, l := range b.links {
			l.Close()
		}
		for _, p := range b.empties {
			p.Close()
		}
		b.links, b.empties = nil, nil
	}
	switch a {
	case armOn, armBefore:
		d, err := startDaemon(b.bins[a], b.name, b.work)
		require.NoError(b.t, err)
		b.d = d
		time.Sleep(700 * time.Millisecond)
	case armEmpty:
		for _, tp := range []string{probe.ProgBlockRqIssue, probe.ProgBlockRqComplete} {
			p, l := emptyProgram(b.t, tp)
			b.empties, b.links = append(b.empties, p), append(b.links, l)
		}
		time.Sleep(200 * time.Millisecond)
	default:
		time.Sleep(300 * time.Millisecond)
	}
	b.state = a
}

// measure measures one segment of the running workload in the current arm.
func (b *bench) measure(kind string) segment {
	require.Equal(b.t, kind, b.state)
	select {
	case err := <-b.fioDone:
		b.t.Fatalf("fio ended early: %v", err)
	default:
	}
	s := segment{kind: kind}
	var cpu0 float64
	var st0 devCounts
	if b.d != nil {
		cpu0 = b.d.cpuNs(b.t)
		st0 = b.d.devCounts(b.t)
	}
	r0, sec0, t0 := loopStat(b.t, b.name)
	time.Sleep(b.seg)
	r1, sec1, t1 := loopStat(b.t, b.name)
	wall := t1.Sub(t0).Seconds()
	s.iops, s.bps = float64(r1-r0)/wall, float64(sec1-sec0)*512/wall
	if b.d != nil {
		s.cpuNs, s.wallNs = b.d.cpuNs(b.t)-cpu0, wall*1e9
		st1 := b.d.devCounts(b.t)
		s.streamed = float64(st1.sampled-st0.sampled) / wall
		s.rssMB = procRSS(b.t, b.d.cmd.Process.Pid)
		m := b.d.metrics(b.t)
		s.lost = m["readaheadd_bpf_events_lost_total"]
		s.sampleN = m[`readaheadd_probe_sample_every{device="`+b.name+`"}`]
	}
	return s
}

// cost runs arm a for a window with run-time statistics on and returns
// its BPF ns per program run and per request.
func (b *bench) cost(a string, window time.Duration) progCost {
	b.set(a)
	defer b.set(armOff)
	c := progCost{ns: map[string]int64{}}
	type prog struct {
		name string
		p    *ebpf.Program
	}
	var progs []prog
	if a == armEmpty {
		for i, p := range b.empties {
			progs = append(progs, prog{[]string{probe.ProgBlockRqIssue, probe.ProgBlockRqComplete}[i], p})
		}
	} else {
		for _, id := range b.d.progIDs {
			p, err := ebpf.NewProgramFromID(id)
			require.NoError(b.t, err)
			defer p.Close()
			progs = append(progs, prog{b.d.progNames[id], p})
		}
	}
	setStats(b.t, true)
	before := make([]ebpf.ProgramStats, len(progs))
	for i, p := range progs {
		s, err := p.p.Stats()
		require.NoError(b.t, err)
		before[i] = *s
	}
	time.Sleep(window)
	var blockNs time.Duration
	var completions uint64
	for i, p := range progs {
		s, err := p.p.Stats()
		require.NoError(b.t, err)
		runs, rt := s.RunCount-before[i].RunCount, s.Runtime-before[i].Runtime
		if runs > 0 {
			c.ns[p.name] = int64(rt) / int64(runs)
		}
		if strings.HasPrefix(p.name, "block_rq") {
			blockNs += rt
		}
		if p.name == probe.ProgBlockRqComplete {
			completions = runs
		}
	}
	setStats(b.t, false)
	if completions > 0 {
		c.perRequest = float64(blockNs) / float64(completions)
	}
	return c
}

// loopStat returns the loop device's completed reads and sectors read
// (/sys/block/NAME/stat) and when they were read.
func loopStat(t *testing.T, name string) (reads, sectors uint64, at time.Time) {
	b, err := os.ReadFile("/sys/block/" + name + "/stat")
	at = time.Now()
	require.NoError(t, err)
	f := strings.Fields(string(b))
	require.GreaterOrEqual(t, len(f), 3)
	reads, err = strconv.ParseUint(f[0], 10, 64)
	require.NoError(t, err)
	sectors, err = strconv.ParseUint(f[2], 10, 64)
	require.NoError(t, err)
	return reads, sectors, at
}

// emptyProgram attaches a tp_btf program that returns at once.
func emptyProgram(t *testing.T, tp string) (*ebpf.Program, link.Link) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "empty_" + tp[9:], Type: ebpf.Tracing, AttachType: ebpf.AttachTraceRawTp, AttachTo: tp,
		License: "GPL", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	require.NoError(t, err)
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	require.NoError(t, err)
	return prog, l
}

type daemon struct {
	cmd       *exec.Cmd
	addr      string
	progIDs   []ebpf.ProgramID
	progNames map[ebpf.ProgramID]string
	devstats  *ebpf.Map // the probe's per-disk per-CPU totals
	done      chan struct{}
}

// startDaemon runs `readaheadd run` on device name, as an operator would,
// and waits until it is healthy.
// Its programs are the block and readahead programs loaded after the start.
func startDaemon(bin, name, work string) (*daemon, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	state, err := os.MkdirTemp(work, "state-")
	if err != nil {
		return nil, err
	}
	first := maxProgID()
	log, err := os.Create(filepath.Join(work, "readaheadd.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(bin, "run", "--device", name, "--allow-path", work, "--state-dir", state,
		"--metrics-addr", addr, "--interval", "1s")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	d := &daemon{cmd: cmd, addr: addr, done: make(chan struct{}), progNames: map[ebpf.ProgramID]string{}}
	go func() { cmd.Wait(); close(d.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-d.done:
			b, _ := os.ReadFile(log.Name())
			return nil, fmt.Errorf("readaheadd exited during start: %s", b)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, errors.New("readaheadd not healthy within 30 s")
		}
	}
	for id := first + 1; ; {
		next, err := ebpf.ProgramGetNextID(id - 1)
		if err != nil {
			break
		}
		id = next + 1
		p, err := ebpf.NewProgramFromID(next)
		if err != nil {
			continue
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			continue
		}
		// The kernel keeps 15 characters of a program's name.
		for _, n := range []string{probe.ProgBlockRqIssue, probe.ProgBlockRqComplete, probe.ProgBlockRqRequeue,
			probe.ProgPageCacheSyncRa, probe.ProgPageCacheAsyncRa, probe.ProgPageCacheRaOrder} {
			if info.Name != "" && strings.HasPrefix(n, info.Name) {
				d.progIDs = append(d.progIDs, next)
				d.progNames[next] = n
			}
		}
	}
	if len(d.progIDs) == 0 {
		d.stop()
		return nil, errors.New("readaheadd is healthy but none of its BPF programs was found")
	}
	for _, id := range d.progIDs {
		if d.progNames[id] != probe.ProgBlockRqComplete {
			continue
		}
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			break
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			break
		}
		ids, _ := info.MapIDs()
		for _, mid := range ids {
			m, err := ebpf.NewMapFromID(mid)
			if err != nil {
				continue
			}
			if mi, err := m.Info(); err == nil && mi.Name == "devstats" {
				d.devstats = m
				break
			}
			m.Close()
		}
	}
	return d, nil
}

// devCounts are the probe's totals of the daemon's one disk (slot 0).
type devCounts struct{ requests, sampled uint64 }

// devCounts reads the daemon's per-disk totals from its map (struct
// dev_stats: requests, bytes, latency, errors, 28 histogram buckets, then
// sampled, ...; older builds' layouts too, for READAHEADD_BENCH_BEFORE_BIN),
// zero when the map was not found.
func (d *daemon) devCounts(t *testing.T) devCounts {
	if d.devstats == nil {
		return devCounts{}
	}
	const sampledAt = 4 + 28
	var out devCounts
	add := func(v []uint64) {
		out.requests += v[0]
		out.sampled += v[sampledAt]
	}
	switch d.devstats.ValueSize() {
	case 37 * 8:
		var percpu [][37]uint64
		require.NoError(t, d.devstats.Lookup(uint32(0), &percpu))
		for _, v := range percpu {
			add(v[:])
		}
	case 36 * 8:
		var percpu [][36]uint64
		require.NoError(t, d.devstats.Lookup(uint32(0), &percpu))
		for _, v := range percpu {
			add(v[:])
		}
	case 35 * 8:
		var percpu [][35]uint64
		require.NoError(t, d.devstats.Lookup(uint32(0), &percpu))
		for _, v := range percpu {
			add(v[:])
		}
	default:
		t.Fatalf("struct dev_stats of %d bytes: teach devCounts its layout", d.devstats.ValueSize())
	}
	return out
}

// cpuNs returns the daemon's CPU time so far, in ns, summed over its
// threads (/proc/PID/task/*/schedstat: nanoseconds, where /proc/PID/stat
// counts 10 ms ticks).
func (d *daemon) cpuNs(t *testing.T) float64 {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", d.cmd.Process.Pid))
	require.NoError(t, err)
	var sum float64
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that just ended
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			v, _ := strconv.ParseFloat(f[0], 64)
			sum += v
		}
	}
	return sum
}

func (d *daemon) stop() {
	if d.devstats != nil {
		d.devstats.Close()
		d.devstats = nil
	}
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// metrics returns the daemon's Prometheus samples by "name{labels}".
func (d *daemon) metrics(t *testing.T) map[string]float64 {
	resp, err := http.Get("http://" + d.addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err == nil {
			out[l[:i]] = v
		}
	}
	return out
}

func maxProgID() ebpf.ProgramID {
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			return id
		}
		id = next
	}
}

func progStats(t *testing.T, ids []ebpf.ProgramID) map[ebpf.ProgramID]ebpf.ProgramStats {
	out := map[ebpf.ProgramID]ebpf.ProgramStats{}
	for _, id := range ids {
		p, err := ebpf.NewProgramFromID(id)
		require.NoError(t, err)
		s, err := p.Stats()
		p.Close()
		require.NoError(t, err)
		out[id] = *s
	}
	return out
}

func procRSS(t *testing.T, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envFloat(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil && v > 0 {
		return v
	}
	return def
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	if len(xs) == 0 {
		return 0
	}
	return s / float64(len(xs))
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	c := append([]float64(nil), xs...)
	sort.Float64s(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

// block is one turn of an arm: off, arm, arm, off.
type block struct {
	offBefore, offAfter segment
	arm                 [2]segment
}

// ratio is the arm's IOPS over the off segments' around it (each arm
// segment beside its own: a linear drift cancels).
func (b block) ratio() float64 {
	return (b.arm[0].iops + b.arm[1].iops) / (b.offBefore.iops + b.offAfter.iops)
}

// offDrift is how much the off segments around the arm differ: a host
// whose other load changed in the middle of the block.
func (b block) offDrift() float64 {
	return math.Abs(b.afterBefore() - 1)
}

// afterBefore is the off segment after the arm over the one before it.
// Averaged over an arm's turns it is 1 unless leaving the arm (a daemon's
// exit, its programs' and maps' teardown) slows the segment after it: that
// would lift the arm's ratio by about half the shortfall.
func (b block) afterBefore() float64 {
	return b.offAfter.iops / b.offBefore.iops
}

// blocks returns arm a's turns in time order.
func blocks(segs []segment, a string) []block {
	var out []block
	for i := 1; i+2 < len(segs); i++ {
		if segs[i].kind == a && segs[i+1].kind == a && segs[i-1].kind == armOff && segs[i+2].kind == armOff {
			out = append(out, block{offBefore: segs[i-1], offAfter: segs[i+2], arm: [2]segment{segs[i], segs[i+1]}})
		}
	}
	return out
}

func stdev(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	m := mean(xs)
	var ss float64
	for _, x := range xs {
		ss += (x - m) * (x - m)
	}
	return math.Sqrt(ss / float64(len(xs)-1))
}

// meanCI is xs's mean and the half-width of its 95% confidence interval
// (Student's t).
func meanCI(xs []float64) (m, half float64) {
	return mean(xs), tQuantile975(len(xs)-1) * stdev(xs) / math.Sqrt(float64(len(xs)))
}

// tQuantile975 is Student's t at 0.975 for df degrees of freedom.
func tQuantile975(df int) float64 {
	table := []float64{0, 12.71, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if df < 1 {
		return math.Inf(1)
	}
	if df < len(table) {
		return table[df]
	}
	return 1.96 + 2.4/float64(df) // within 0.002 above 30
}

// report prints, per workload, each arm's ratios to the arm without
// anything attached (per turn off, arm, arm, off: mean, median, spread,
// 95% confidence interval of the mean; over all turns and over the turns
// whose two off segments agree within READAHEADD_BENCH_STABLE, default
// 3%: the host's other load did not change in the middle), the daemon's
// CPU share, RSS, records streamed and events lost, and the BPF ns per
// program run and per request.
func report(t *testing.T, results map[string][]segment, costs map[string]map[string]progCost, segSecs float64, took time.Duration) {
	stable := envFloat("READAHEADD_BENCH_STABLE", 0.03)
	var b strings.Builder
	fmt.Fprintf(&b, "\nreadaheadd probe cost, fio running without a break on a RAM-backed loop device; arms in turns of off, arm, arm, off (%.1f s segments), orders rotating; bpf_stats off while measuring; %s, %s in all\n",
		segSecs, time.Now().UTC().Format(time.RFC3339), took.Round(time.Second))
	if l, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "load average at the end: %s", l)
	}
	names := make([]string, 0, len(results))
	for n := range results {
		names = append(names, n)
	}
	sort.Strings(names)
	stats := func(rs []float64) string {
		if len(rs) == 0 {
			return fmt.Sprintf("%5d %7s %7s %7s %7s %15s", 0, "", "", "", "", "")
		}
		m, half := meanCI(rs)
		return fmt.Sprintf("%5d %7.4f %7.4f %7.4f %7.4f %7.4f-%-7.4f", len(rs), m, median(rs), stdev(rs), minOf(rs), m-half, m+half)
	}
	for _, n := range names {
		segs := results[n]
		var offs []float64
		for _, s := range segs {
			if s.kind == armOff {
				offs = append(offs, s.iops)
			}
		}
		fmt.Fprintf(&b, "\n%s: off %.0f IOPS (%.0f MB/s), mean of %d segments, spread between segments %.1f%% (sd)\n", n, mean(offs), mean(offs)*avgSize(segs)/1e6, len(offs), 100*stdev(offs)/mean(offs))
		fmt.Fprintf(&b, "%-6s | %5s %7s %7s %7s %7s %15s | %5s %7s %7s %7s %7s %15s | %9s %6s %5s %5s %7s %4s | %s\n",
			"arm", "turns", "mean", "median", "sd", "min", "95% CI of mean", "st.", "mean", "median", "sd", "min", "95% CI of mean",
			"IOPS", "cpu", "RSS", "N", "rec/s", "lost", "BPF ns/run per program; ns/req")
		for _, a := range []string{armOn, armEmpty, armBefore} {
			bs := blocks(segs, a)
			if len(bs) == 0 {
				continue
			}
			var all, st, armIOPS, cpu, wall, rss, period, rec, lost []float64
			for _, bl := range bs {
				all = append(all, bl.ratio())
				if bl.offDrift() <= stable {
					st = append(st, bl.ratio())
				}
				for _, s := range bl.arm {
					armIOPS = append(armIOPS, s.iops)
					if s.wallNs > 0 {
						cpu, wall = append(cpu, s.cpuNs), append(wall, s.wallNs)
						rss, period, rec = append(rss, s.rssMB), append(period, s.sampleN), append(rec, s.streamed)
						lost = append(lost, s.lost)
					}
				}
			}
			fmt.Fprintf(&b, "%-6s | %s | %s | %9.0f", a, stats(all), stats(st), mean(armIOPS))
			if len(cpu) > 0 {
				fmt.Fprintf(&b, " %6.4f %5.1f %5.0f %7.0f %4.0f", sum(cpu)/sum(wall), maxOf(rss), median(period), mean(rec), maxOf(lost))
			} else {
				fmt.Fprintf(&b, " %6s %5s %5s %7s %4s", "", "", "", "", "")
			}
			if c, ok := costs[n][a]; ok {
				b.WriteString(" | ")
				progs := make([]string, 0, len(c.ns))
				for p := range c.ns {
					progs = append(progs, p)
				}
				sort.Strings(progs)
				for _, p := range progs {
					fmt.Fprintf(&b, "%s %d; ", p, c.ns[p])
				}
				fmt.Fprintf(&b, "%.0f ns/req", c.perRequest)
			}
			b.WriteString("\n")
		}
		b.WriteString("off segment after each arm over the one before it (mean [95% CI]; 1 unless leaving the arm slows the next segment):")
		for _, a := range []string{armOn, armEmpty, armBefore} {
			bs := blocks(segs, a)
			if len(bs) == 0 {
				continue
			}
			var ab []float64
			for _, bl := range bs {
				ab = append(ab, bl.afterBefore())
			}
			m, half := meanCI(ab)
			fmt.Fprintf(&b, " %s %.4f [%.4f-%.4f];", a, m, m-half, m+half)
		}
		b.WriteString("\n")
		b.WriteString("ratio of each turn in time order (* off segments differ by more than the stable bound):\n")
		for _, a := range []string{armOn, armEmpty, armBefore} {
			bs := blocks(segs, a)
			if len(bs) == 0 {
				continue
			}
			fmt.Fprintf(&b, "  %-6s", a)
			for _, bl := range bs {
				mark := ""
				if bl.offDrift() > stable {
					mark = "*"
				}
				fmt.Fprintf(&b, " %.3f%s", bl.ratio(), mark)
			}
			b.WriteString("\n")
		}
	}
	fmt.Fprintf(&b, "\nturns: off, arm, arm, off; ratio of a turn: the arm's two segments' IOPS over the two off segments'; mean, median, sd, min of the turns' ratios;\n"+
		"95%% CI: Student's t over the turns; st.: the same over the stable turns, whose off segments agree within %.0f%% (the host's other load did not change mid-turn);\n"+
		"IOPS: the arm's mean; cpu: daemon CPU time / wall time in its segments (1 = one core); RSS: MB, the largest; N: sampling period (median of the segments' ends);\n"+
		"rec/s: records the probe streamed to the daemon per second; lost: readaheadd_bpf_events_lost_total; BPF ns: a separate window with bpf_stats on;\n"+
		"empty: an empty tp_btf program on block_rq_issue and on block_rq_complete; before: the build in READAHEADD_BENCH_BEFORE_BIN, when set.\n", 100*stable)
	t.Log(b.String())
	if p := os.Getenv("READAHEADD_BENCH_OUT"); p != "" {
		require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
	}
}

// avgSize is the mean request size over segs.
func avgSize(segs []segment) float64 {
	var bps, iops float64
	for _, s := range segs {
		bps, iops = bps+s.bps, iops+s.iops
	}
	if iops == 0 {
		return 0
	}
	return bps / iops
}

func sum(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}

func minOf(xs []float64) float64 {
	m := math.Inf(1)
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxOf(xs []float64) float64 {
	m := math.Inf(-1)
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
