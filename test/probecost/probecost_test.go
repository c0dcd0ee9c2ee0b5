// Package probecost measures what watching a fast device with readaheadd
// costs the reads on it: fio on a RAM-backed loop device, without and with
// the daemon in alternating arms, side by side in one run.
package probecost

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// workload is one fio job run in every arm.
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

// arm is one fio run and, with the daemon, what the daemon and its BPF
// programs cost during it.
type arm struct {
	kind      string // armOff, armOn or armEmpty
	daemon    bool
	iops, bps float64
	// With the daemon only:
	cpu        float64          // daemon CPU time / wall time (1 = one core)
	rssMB      float64          // daemon VmRSS at the end
	progNs     map[string]int64 // BPF ns per run, per program
	progRuns   map[string]uint64
	perRequest float64 // BPF ns of all block programs per completed request
	lost       float64 // readaheadd_bpf_events_lost_total at the end
	sampleN    float64 // readaheadd_probe_sample_every at the end
}

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
	rounds := envInt("READAHEADD_BENCH_ROUNDS", 3)
	secs := envInt("READAHEADD_BENCH_SECONDS", 5)
	statsSecs := envInt("READAHEADD_BENCH_STATS_SECONDS", 2)
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

	// Run-time statistics only in each arm's statistics window; the old
	// setting is restored afterwards.
	old, err := os.ReadFile(statsSysctl)
	require.NoError(t, err)
	setStats(t, false)
	t.Cleanup(func() { os.WriteFile(statsSysctl, old, 0o644) })

	// Warm-up, not counted: the first run after the device appears is slower.
	for _, w := range workloads {
		fio(t, w, loop, 2)
	}
	results := map[string][]arm{}
	for r := 0; r < rounds; r++ {
		for _, w := range workloads {
			// off, on, empty within each round, rotating between rounds so
			// that drift (other load on the host) cancels.
			kinds := []string{armOff, armOn, armEmpty}
			if beforeBin != "" {
				kinds = append(kinds, armBefore)
			}
			for i := range kinds {
				k := kinds[(i+r)%len(kinds)]
				b := bin
				if k == armBefore {
					b = beforeBin
				}
				a := runArm(t, w, loop, name, b, work, k, secs, statsSecs)
				results[w.name] = append(results[w.name], a)
				t.Logf("round %d %-18s %-5s IOPS %8.0f  MB/s %7.1f  cpu %.3f", r+1, w.name, k, a.iops, a.bps/1e6, a.cpu)
			}
		}
	}
	report(t, results, secs, statsSecs)
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

// runArm runs one arm: fio for secs seconds with run-time statistics off
// (as the daemon runs in production: the statistics cost two clock reads
// per program run, which would tax the arms with programs), its IOPS, and
// the daemon's CPU share and RSS over it; then, for arms with programs, a
// second fio run of statsSecs seconds with statistics on, for the ns per
// program run.
func runArm(t *testing.T, w workload, loop, name, bin, work string, kind string, secs, statsSecs int) (a arm) {
	on := kind == armOn || kind == armBefore
	a = arm{kind: kind, daemon: on}
	var d *daemon
	var empties []*ebpf.Program
	emptyNames := []string{probe.ProgBlockRqIssue, probe.ProgBlockRqComplete}
	if kind == armEmpty {
		for _, tp := range emptyNames {
			p, l := emptyProgram(t, tp)
			defer p.Close()
			defer l.Close()
			empties = append(empties, p)
		}
	}
	if on {
		var err error
		d, err = startDaemon(bin, name, work)
		require.NoError(t, err)
		defer d.stop()
	}
	// One second of the workload first, not measured, in every arm: the
	// daemon starts streaming every request (sampling period 1) and
	// reaches its period within a poll or two; what is measured is the
	// daemon watching a busy device, as it runs for days, not its start.
	fio(t, w, loop, 1)
	var cpu0 uint64
	if on {
		cpu0 = procCPU(t, d.cmd.Process.Pid)
	}
	t0 := time.Now()
	a.iops, a.bps = fio(t, w, loop, secs)
	wall := time.Since(t0)
	if on {
		a.cpu = float64(procCPU(t, d.cmd.Process.Pid)-cpu0) * 1e9 / float64(unixTicks()) / float64(wall)
		a.rssMB = procRSS(t, d.cmd.Process.Pid)
		m := d.metrics(t)
		a.lost = m["readaheadd_bpf_events_lost_total"]
		a.sampleN = m[`readaheadd_probe_sample_every{device="`+name+`"}`]
	}
	if kind == armOff {
		return a
	}

	// The statistics window.
	a.progNs, a.progRuns = map[string]int64{}, map[string]uint64{}
	setStats(t, true)
	defer setStats(t, false)
	if kind == armEmpty {
		before := make([]ebpf.ProgramStats, len(empties))
		for i, p := range empties {
			s, err := p.Stats()
			require.NoError(t, err)
			before[i] = *s
		}
		fio(t, w, loop, statsSecs)
		var total time.Duration
		for i, p := range empties {
			s, err := p.Stats()
			require.NoError(t, err)
			n := emptyNames[i]
			runs := s.RunCount - before[i].RunCount
			a.progRuns[n] = runs
			if runs > 0 {
				a.progNs[n] = int64(s.Runtime-before[i].Runtime) / int64(runs)
			}
			total += s.Runtime - before[i].Runtime
		}
		if r := a.progRuns[probe.ProgBlockRqComplete]; r > 0 {
			a.perRequest = float64(total) / float64(r)
		}
		return a
	}
	before := progStats(t, d.progIDs)
	fio(t, w, loop, statsSecs)
	after := progStats(t, d.progIDs)
	var blockNs time.Duration
	for id, s := range after {
		b := before[id]
		runs := s.RunCount - b.RunCount
		rt := s.Runtime - b.Runtime
		n := d.progNames[id]
		a.progRuns[n] = runs
		if runs > 0 {
			a.progNs[n] = int64(rt) / int64(runs)
		}
		if strings.HasPrefix(n, "block_rq") {
			blockNs += rt
		}
	}
	if reqs := a.progRuns["block_rq_complete"]; reqs > 0 {
		a.perRequest = float64(blockNs) / float64(reqs)
	}
	return a
}

// fio runs workload w on dev for secs seconds and returns IOPS and bytes/s.
func fio(t *testing.T, w workload, dev string, secs int) (float64, float64) {
	args := append([]string{"--name=" + w.name, "--filename=" + dev, "--time_based", "--runtime=" + strconv.Itoa(secs),
		"--output-format=json", "--numjobs=1", "--group_reporting"}, w.args...)
	out, err := exec.Command("fio", args...).Output()
	require.NoError(t, err, "fio %v", args)
	var res struct {
		Jobs []struct {
			Read struct {
				IOPS float64 `json:"iops"`
				BW   float64 `json:"bw_bytes"`
			} `json:"read"`
		} `json:"jobs"`
	}
	require.NoError(t, json.Unmarshal(out, &res))
	require.NotEmpty(t, res.Jobs)
	return res.Jobs[0].Read.IOPS, res.Jobs[0].Read.BW
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
			probe.ProgPageCacheSyncRa, probe.ProgPageCacheAsyncRa} {
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
	return d, nil
}

func (d *daemon) stop() {
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

// procCPU returns utime + stime of pid, in clock ticks.
func procCPU(t *testing.T, pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return u + st
}

func unixTicks() int64 { return 100 } // USER_HZ on Linux

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

// report prints, per workload and round, the three arms side by side and
// the ratios to the arm without anything attached.
func report(t *testing.T, results map[string][]arm, secs, statsSecs int) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nreadaheadd probe cost, fio on a RAM-backed loop device, %d s per arm (bpf_stats off), then %d s with bpf_stats on for ns/run, %s\n",
		secs, statsSecs, time.Now().UTC().Format(time.RFC3339))
	if l, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "load average at the end: %s", l)
	}
	names := make([]string, 0, len(results))
	for n := range results {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		arms := results[n]
		per := 3
		for _, a := range arms {
			if a.kind == armBefore {
				per = 4
			}
		}
		fmt.Fprintf(&b, "\n%s\n%-5s %9s %9s %6s %9s %6s | %7s %7s %5s %5s %6s %6s %6s %5s | %6s %6s %6s", n,
			"round", "IOPS off", "IOPS on", "on/off", "IOPS emp", "emp/of",
			"MB/s on", "cpu", "RSS", "N", "issue", "compl", "ns/req", "lost", "e.iss", "e.cmp", "e.req")
		if per == 4 {
			fmt.Fprintf(&b, " | %9s %6s %6s %6s %6s %7s", "IOPS bef", "bef/of", "b.iss", "b.cmp", "b.req", "b.cpu")
		}
		b.WriteString("\n")
		var offs, ons, emps, befs, rOn, rEmp, rBef, cpus, bcpus, rss, nsReq, eReq, bReq []float64
		var lost float64
		for i := 0; i+per <= len(arms); i += per {
			var off, on, emp, bef arm
			for _, a := range arms[i : i+per] {
				switch a.kind {
				case armOff:
					off = a
				case armOn:
					on = a
				case armEmpty:
					emp = a
				case armBefore:
					bef = a
				}
			}
			offs, ons, emps = append(offs, off.iops), append(ons, on.iops), append(emps, emp.iops)
			rOn, rEmp = append(rOn, on.iops/off.iops), append(rEmp, emp.iops/off.iops)
			cpus, rss = append(cpus, on.cpu), append(rss, on.rssMB)
			nsReq, eReq = append(nsReq, on.perRequest), append(eReq, emp.perRequest)
			lost = max(lost, on.lost)
			fmt.Fprintf(&b, "%-5d %9.0f %9.0f %6.3f %9.0f %6.3f | %7.0f %7.3f %5.1f %5.0f %6d %6d %6.0f %5.0f | %6d %6d %6.0f", i/per+1,
				off.iops, on.iops, on.iops/off.iops, emp.iops, emp.iops/off.iops,
				on.bps/1e6, on.cpu, on.rssMB, on.sampleN,
				on.progNs[probe.ProgBlockRqIssue], on.progNs[probe.ProgBlockRqComplete], on.perRequest, on.lost,
				emp.progNs[probe.ProgBlockRqIssue], emp.progNs[probe.ProgBlockRqComplete], emp.perRequest)
			if per == 4 {
				befs, rBef, bReq, bcpus = append(befs, bef.iops), append(rBef, bef.iops/off.iops), append(bReq, bef.perRequest), append(bcpus, bef.cpu)
				lost = max(lost, bef.lost)
				fmt.Fprintf(&b, " | %9.0f %6.3f %6d %6d %6.0f %7.3f", bef.iops, bef.iops/off.iops,
					bef.progNs[probe.ProgBlockRqIssue], bef.progNs[probe.ProgBlockRqComplete], bef.perRequest, bef.cpu)
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "%-5s %9.0f %9.0f %6.3f %9.0f %6.3f | %7s %7.3f %5.1f %5s %6s %6s %6.0f %5.0f | %6s %6s %6.0f", "mean",
			mean(offs), mean(ons), mean(ons)/mean(offs), mean(emps), mean(emps)/mean(offs),
			"", mean(cpus), mean(rss), "", "", "", mean(nsReq), lost, "", "", mean(eReq))
		if per == 4 {
			fmt.Fprintf(&b, " | %9.0f %6.3f %6s %6s %6.0f %7.3f", mean(befs), mean(befs)/mean(offs), "", "", mean(bReq), mean(bcpus))
		}
		fmt.Fprintf(&b, "\n%-5s %9s %9s %6.3f %9s %6.3f", "med", "", "", median(rOn), "", median(rEmp))
		if per == 4 {
			fmt.Fprintf(&b, " %60s %6.3f", "", median(rBef))
		}
		b.WriteString("   (median of the rounds' ratios)\n")
	}
	b.WriteString("\ncpu: daemon CPU time / wall time (1 = one core); RSS in MB; N: sampling period at the end;\n" +
		"issue, compl: ns per run from bpf_stats (in a separate window: IOPS, cpu are measured with bpf_stats off);\n" +
		"ns/req: all block programs' run time per completed request;\n" +
		"lost: readaheadd_bpf_events_lost_total; e.*: the same for the empty pair;\n" +
		"bef, b.*: the build in READAHEADD_BENCH_BEFORE_BIN, when set.\n")
	t.Log(b.String())
	if p := os.Getenv("READAHEADD_BENCH_OUT"); p != "" {
		require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
	}
}
