package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Errors Load and Check wrap, so that callers can tell the causes apart.
var (
	ErrPermission        = errors.New("not allowed to load BPF programs: run as root, or grant CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE (systemd: AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_SYS_RESOURCE)")
	ErrNoBTF             = errors.New("the kernel exposes no BTF at /sys/kernel/btf/vmlinux: readaheadd needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (Linux >= 5.8)")
	ErrTracepointMissing = errors.New("the kernel lacks a tracepoint the probe attaches to: block:block_rq_complete needs BTF tracepoints (Linux >= 5.5), readahead:page_cache_sync_ra/page_cache_async_ra are recent; list what this kernel has with `bpftool btf dump file /sys/kernel/btf/vmlinux | grep btf_trace_`; run `readaheadd check` to see which program fails")
	ErrClosed            = errors.New("probe closed")
)

// MaxDevices is how many disks Config.Devices may name.
const MaxDevices = 16

// Config configures Load.
type Config struct {
	// Devices are the whole disks to trace; empty traces every disk.
	Devices []Dev
	// RingBytes is the ring buffer size (a power of two multiple of the
	// page size); 0 means 4 MiB (65536 records).
	RingBytes int
	// PollerWait: wait for the ring buffer in the Go runtime's poller
	// (ringWaiter) rather than in the reader's blocking epoll_wait, whose
	// every poll woke the runtime's monitor thread into its fastest loop.
	// The daemon sets it; off keeps the reader's own wait.
	PollerWait bool
	// Poll is how often Run collects records the kernel submitted without
	// waking it; 0 means 100 ms. The kernel wakes Run early when a quarter
	// of the ring is used.
	Poll time.Duration
	// FileEntries is how many files the kernel keeps per-file totals for
	// (least recently read files are evicted). The map is per CPU, so it
	// takes FileEntries x CPUs x 48 bytes; 0 means 16384, or fewer so that
	// the map stays under 32 MiB.
	FileEntries int
	// EnableStats holds a BPF_ENABLE_STATS descriptor while the probe is
	// loaded, so that Stats().Programs has run times even when the sysctl
	// kernel.bpf_stats_enabled is 0. It costs two clock reads per run of
	// every BPF program on the machine.
	EnableStats bool
	// SampleBudget is how many samplable requests per second and disk
	// (DeviceStats.Samplable: those smaller than SampleBelow, and those of
	// any size that are no readahead for a file, such as direct I/O and
	// metadata) the
	// probe streams as records; above it, 1 in N of them is (N a power of
	// two, adapted every Poll to the disk's rate of samplable requests,
	// reported as DeviceStats.SampleEvery and Record.Weight), while the
	// per-disk counts, bytes and latency histogram stay exact. Requests of
	// SampleBelow or more read ahead for a file are always streamed. 0 means
	// DefaultSampleBudget; negative never samples.
	SampleBudget int
	// SampleEvery, when non-zero, fixes the sampling period instead
	// (a power of two; 1 attributes every request).
	SampleEvery uint32
}

// DefaultSampleBudget is Config.SampleBudget's default. The daemon spends
// about 3 us of CPU per record (measured: 3% of a core at 9200 records/s),
// so 4096 records/s keeps it near 1% of a core on a disk doing 300k IOPS,
// while the slow-device workloads it tunes issue a few thousand requests
// per second at most, all readahead-sized file reads, never sampled.
const DefaultSampleBudget = 4096

// SampleBelow: readahead requests of this size or more for a file are
// always streamed (bpf/probe.bpf.c SAMPLE_BELOW): the detector follows
// streams request by request. Smaller requests (random reads come by the
// hundred thousand per second) and requests that are no readahead for a
// file (direct I/O, metadata: no stream to follow; the kernel's REQ_RAHEAD
// tells, before the request's pages are walked) are samplable.
const SampleBelow = 32 << 10

// maxCPUs is how many CPUs' in-flight counters the kernel side sums
// (bpf/probe.bpf.c MAX_CPUS).
const maxCPUs = 1024

// maxSampleEvery bounds the sampling period.
const maxSampleEvery = 1 << 15

// Probe is the loaded and attached BPF probe. It implements Source.
type Probe struct {
	cfg   Config
	objs  probeObjects
	links []link.Link
	ring  *ringbuf.Reader
	wake  *ringWaiter // nil: wait in the reader's own epoll
	stats io.Closer

	sysfs string // root of sysfs, for the kernel's in-flight counts

	// around: the read-around program is attached (the kernel has
	// page_cache_ra_order's tracepoint).
	around bool

	mu        sync.Mutex
	closed    bool
	undecoded atomic.Uint64

	// Flushes asked for (Flush): each is closed once Run has delivered
	// what the ring held when it was asked; guarded by flushMu.
	flushMu sync.Mutex
	flushes []chan struct{}

	// Sampling state, per disk slot; guarded by mu.
	sampler map[uint32]*slotSampler
}

// slotSampler is one disk slot's sampling state.
type slotSampler struct {
	every    uint32
	requests uint64 // at the last adjustment
	at       time.Time
}

var _ Source = (*Probe)(nil)

func (c Config) withDefaults() (Config, error) {
	if c.RingBytes == 0 {
		c.RingBytes = 4 << 20
	}
	ps := os.Getpagesize()
	if c.RingBytes < ps || c.RingBytes&(c.RingBytes-1) != 0 {
		return c, fmt.Errorf("probe ring size %d: must be a power of two and at least %d bytes", c.RingBytes, ps)
	}
	if c.Poll == 0 {
		c.Poll = 100 * time.Millisecond
	}
	if c.Poll < 0 {
		return c, fmt.Errorf("probe poll interval %s: must be positive", c.Poll)
	}
	if c.FileEntries < 0 {
		return c, fmt.Errorf("probe file entries %d: must not be negative", c.FileEntries)
	}
	if c.FileEntries == 0 {
		c.FileEntries = defaultFileEntries(runtime.NumCPU())
	}
	if c.SampleEvery != 0 && (c.SampleEvery&(c.SampleEvery-1) != 0 || c.SampleEvery > maxSampleEvery) {
		return c, fmt.Errorf("probe sampling period %d: must be a power of two up to %d", c.SampleEvery, maxSampleEvery)
	}
	if c.SampleBudget == 0 {
		c.SampleBudget = DefaultSampleBudget
	}
	if len(c.Devices) > MaxDevices {
		return c, fmt.Errorf("probe: %d devices given, at most %d can be filtered in the kernel; give none to trace all", len(c.Devices), MaxDevices)
	}
	return c, nil
}

// fileStatsBytes is the size of one per-CPU struct file_stats value.
const fileStatsBytes = 48

func defaultFileEntries(cpus int) int {
	n := 16384
	for n > 1024 && n*cpus*fileStatsBytes > 32<<20 {
		n /= 2
	}
	return n
}

// spec returns the collection spec with cfg's constants and sizes set.
func (c Config) spec() (*ebpf.CollectionSpec, error) {
	spec, err := loadProbe()
	if err != nil {
		return nil, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	if err := c.configure(spec); err != nil {
		return nil, err
	}
	if !hasTracepoint(ProgPageCacheRaOrder) {
		// The read-around program is optional. A tp_btf program is bound
		// to its tracepoint when it is loaded, and the generated objects
		// load every program: on a kernel without this one it is bound to
		// page_cache_async_ra, whose first three arguments are the same,
		// and never attached.
		spec.Programs[ProgPageCacheRaOrder].AttachTo = ProgPageCacheAsyncRa
	}
	return spec, nil
}

// hasTracepoint reports whether the running kernel has the BTF tracepoint
// name (its btf_trace_ typedef).
func hasTracepoint(name string) bool {
	ks, err := btf.LoadKernelSpec()
	if err != nil {
		return false
	}
	_, err = ks.AnyTypeByName("btf_trace_" + name)
	return err == nil
}

// configure sets cfg's constants and sizes in spec (the embedded object, or
// another build of bpf/probe.bpf.c compared with it in the benchmark).
func (c Config) configure(spec *ebpf.CollectionSpec) error {
	var devs [MaxDevices]uint32
	for i, d := range c.Devices {
		devs[i] = uint32(d)
	}
	if err := spec.Variables["filter_devs"].Set(devs); err != nil {
		return fmt.Errorf("set device filter: %w", err)
	}
	if err := spec.Variables["n_filter_devs"].Set(uint32(len(c.Devices))); err != nil {
		return fmt.Errorf("set device filter: %w", err)
	}
	if err := spec.Variables["wakeup_bytes"].Set(uint64(c.RingBytes / 4)); err != nil {
		return fmt.Errorf("set wake-up threshold: %w", err)
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("count possible CPUs for the in-flight sum: %w", err)
	}
	if err := spec.Variables["nr_cpus"].Set(uint32(min(cpus, maxCPUs))); err != nil {
		return fmt.Errorf("set CPU count: %w", err)
	}
	if v, ok := spec.Variables["bio_pinned_mask"]; ok {
		if err := v.Set(bioPinnedMask(kernelRelease())); err != nil {
			return fmt.Errorf("set direct I/O flag: %w", err)
		}
	}
	spec.Maps["events"].MaxEntries = uint32(c.RingBytes)
	if m, ok := spec.Maps["filestats"]; ok {
		m.MaxEntries = uint32(c.FileEntries)
	}
	return nil
}

// bioPinnedMask is bio->bi_flags' BIO_PAGE_PINNED bit on kernel release
// rel ("6.18.0-..."), 0 when unknown. The flag is bit 0 since Linux 6.5,
// which marks the pages of a direct-I/O bio pinned from the reader's
// memory; before, bit 0 was BIO_NO_PAGE_REF, with another meaning. (The
// enumerator is in an anonymous enum, which CO-RE cannot relocate, and
// finding it among the kernel's BTF types takes about 0.3 s.)
func bioPinnedMask(rel string) uint16 {
	var major, minor int
	if _, err := fmt.Sscanf(rel, "%d.%d", &major, &minor); err != nil {
		return 0
	}
	if major > 6 || major == 6 && minor >= 5 {
		return 1 << 0
	}
	return 0
}

// kernelRelease returns uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// checkBTF fails with ErrNoBTF when the kernel has no BTF.
func checkBTF() error {
	if _, err := btf.LoadKernelSpec(); err != nil {
		return fmt.Errorf("%w (%v)", ErrNoBTF, err)
	}
	return nil
}

// classify wraps a load or attach error with the sentinel that says what
// to do about it.
func classify(what string, err error) error {
	if err == nil {
		return nil
	}
	// The verifier reports rejections as EACCES: not a privilege problem.
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("%s: the kernel's verifier rejected the program (please report with this log): %+v", what, ve)
	}
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: %w (%v)", what, ErrPermission, err)
	case errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) ||
		strings.Contains(err.Error(), "find target") || strings.Contains(err.Error(), "attach target"):
		return fmt.Errorf("%s: %w (%v)", what, ErrTracepointMissing, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Load loads the BPF programs, attaches them and opens the ring buffer.
func Load(cfg Config) (*Probe, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkBTF(); err != nil {
		return nil, err
	}
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, classify("raise RLIMIT_MEMLOCK for BPF maps", err)
	}
	spec, err := cfg.spec()
	if err != nil {
		return nil, err
	}
	p := &Probe{cfg: cfg, sysfs: "/sys", sampler: map[uint32]*slotSampler{}, around: hasTracepoint(ProgPageCacheRaOrder)}
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		return nil, classify("load BPF programs", err)
	}
	// With a device list, disk i has slot i: name it before attaching.
	for i, d := range cfg.Devices {
		if err := p.objs.Devslots.Update(uint32(i), probeDevSlot{Dev: uint64(d)}, ebpf.UpdateAny); err != nil {
			p.Close()
			return nil, fmt.Errorf("initialise BPF disk slot of %s: %w", d, err)
		}
	}
	if cfg.SampleEvery > 1 {
		for i := range uint32(1 << 6) {
			if err := p.objs.Sampling.Update(i, cfg.SampleEvery-1, ebpf.UpdateAny); err != nil {
				p.Close()
				return nil, fmt.Errorf("set BPF sampling period: %w", err)
			}
		}
	}
	for _, a := range p.attachments() {
		l, err := link.AttachTracing(link.TracingOptions{Program: a.prog})
		if err != nil {
			p.Close()
			return nil, classify("attach "+a.name, err)
		}
		p.links = append(p.links, l)
	}
	p.ring, err = ringbuf.NewReader(p.objs.Events)
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("open BPF ring buffer: %w", err)
	}
	// Off by default: with it the lab's healthy detector test saw extent
	// starts (post-jump medians 1.6x) 3 runs in 4; see docs/probe.md.
	if !cfg.PollerWait {
		p.wake = nil
	} else if p.wake, err = newRingWaiter(p.objs.Events.FD()); err != nil {
		// Correct either way; only the idle daemon's cost differs.
		slog.Warn("waiting for the ring buffer in a blocking call", "err", err)
		p.wake = nil
	}
	if cfg.EnableStats {
		p.stats, err = ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			p.Close()
			return nil, classify("enable BPF run-time statistics", err)
		}
	}
	return p, nil
}

type attachment struct {
	name string
	prog *ebpf.Program
}

func (p *Probe) attachments() []attachment {
	as := []attachment{
		{ProgBlockRqComplete, p.objs.BlockRqComplete},
		{ProgPageCacheSyncRa, p.objs.PageCacheSyncRa},
		{ProgPageCacheAsyncRa, p.objs.PageCacheAsyncRa},
	}
	if p.around {
		as = append(as, attachment{ProgPageCacheRaOrder, p.objs.PageCacheRaOrder})
	}
	return as
}

// ErrNoReadAround: the kernel has no page_cache_ra_order tracepoint
// (before Linux 6.10), so WatchReadAround cannot report read-arounds.
var ErrNoReadAround = errors.New("the kernel has no page_cache_ra_order tracepoint (Linux 6.10 or later): mmap read-arounds are not reported")

// MaxReadAroundFiles bounds the files WatchReadAround watches at once.
const MaxReadAroundFiles = 1024

// WatchReadAround asks for a ReadaheadEvent with ReadAround set when an
// mmap fault on file reads around with a window above kb: an open file
// the caller has not given its window yet. At most one per file every
// 10 ms. Watching a file again replaces its kb.
func (p *Probe) WatchReadAround(file FileKey, kb int) error {
	if !p.around {
		return ErrNoReadAround
	}
	k := probeFileKey{Dev: uint32(file.Dev), Ino: file.Ino}
	v := probeAroundVal{RaPages: uint32(max(kb, 0) * 1024 / PageSize)}
	if err := p.objs.Around.Update(&k, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("watch read-arounds of %s: %w (at most %d files)", file, err, MaxReadAroundFiles)
	}
	return nil
}

// UnwatchReadAround ends WatchReadAround on file; a file not watched is
// no error.
func (p *Probe) UnwatchReadAround(file FileKey) error {
	k := probeFileKey{Dev: uint32(file.Dev), Ino: file.Ino}
	if err := p.objs.Around.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("stop watching read-arounds of %s: %w", file, err)
	}
	return nil
}

// Run implements Source: it delivers records until ctx is done, then
// delivers what the kernel had submitted by then and returns nil. The
// kernel submits without waking the reader, so Run waits at most
// Config.Poll before collecting what is there. One Run at a time.
func (p *Probe) Run(ctx context.Context, h Handler) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	rd, wake := p.ring, p.wake
	p.mu.Unlock()
	if wake != nil {
		defer context.AfterFunc(ctx, wake.interrupt)()
	}
	var rec ringbuf.Record
	n := 0
	for {
		p.adjustSampling(time.Now())
		deadline := time.Now().Add(p.cfg.Poll)
		stop := ctx.Err() != nil
		if stop {
			// Deliver what was submitted before ctx ended, then return.
			deadline = time.Now()
		}
		// The flushes asked for before this drain are answered after it.
		flushes := p.takeFlushes()
		if len(flushes) > 0 {
			deadline = time.Now()
		}
		if wake != nil && !stop && len(flushes) == 0 {
			// Sleep in the runtime's poller, then drain without blocking.
			if err := wake.wait(deadline, p.flushPending); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if errors.Is(err, os.ErrClosed) {
					return ErrClosed
				}
				return err
			}
			rd.SetDeadline(time.Now())
		} else {
			rd.SetDeadline(deadline)
		}
		for {
			err := rd.ReadInto(&rec)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				for _, f := range flushes {
					close(f)
				}
				if stop {
					return nil
				}
				break
			}
			if errors.Is(err, ringbuf.ErrClosed) || errors.Is(err, os.ErrClosed) {
				if ctx.Err() != nil {
					return nil
				}
				return ErrClosed
			}
			if err != nil {
				return fmt.Errorf("read BPF ring buffer: %w", err)
			}
			if err := dispatch(rec.RawSample, h); err != nil {
				p.undecoded.Add(1)
			}
			// Under a steady stream the deadline is reached late: adapt
			// the sampling rate on the way.
			if n++; n&1023 == 0 && time.Now().After(deadline) {
				p.adjustSampling(time.Now())
				deadline = time.Now().Add(p.cfg.Poll)
			}
			if !stop && ctx.Err() != nil {
				// Under a steady stream the deadline is never reached: drain
				// what is there now and stop.
				stop = true
				rd.SetDeadline(time.Now())
			}
		}
	}
}

// Flush asks Run to deliver now what the kernel has submitted, and waits
// until it has (or ctx ends, or Run is not running and the wait times out
// with ctx): a caller about to evaluate sees every record up to the call,
// while Run itself sleeps a whole Config.Poll between collections.
func (p *Probe) Flush(ctx context.Context) error {
	done := make(chan struct{})
	p.flushMu.Lock()
	p.flushes = append(p.flushes, done)
	p.flushMu.Unlock()
	p.mu.Lock()
	wake, closed := p.wake, p.closed
	p.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if wake != nil {
		wake.interrupt()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flushPending reports whether a flush was asked for since the last drain.
func (p *Probe) flushPending() bool {
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	return len(p.flushes) > 0
}

// takeFlushes returns the flushes asked for so far and forgets them.
func (p *Probe) takeFlushes() []chan struct{} {
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	f := p.flushes
	p.flushes = nil
	return f
}

// Stats implements Source.
func (p *Probe) Stats() (Stats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Stats{}, ErrClosed
	}
	s := Stats{Devices: map[Dev]DeviceStats{}, Files: map[FileKey]FileStats{}, Programs: map[string]ProgramStats{}}
	// Disk identities are shared; totals are per CPU.
	var dk uint32
	var slot probeDevSlot
	slots := map[uint32]probeDevSlot{}
	every := p.sampleEvery()
	it := p.objs.Devslots.Iterate()
	for it.Next(&dk, &slot) {
		if slot.Dev != 0 {
			slots[dk] = slot
		}
	}
	if err := it.Err(); err != nil {
		return Stats{}, fmt.Errorf("read per-device BPF slots: %w", err)
	}
	for k, slot := range slots {
		var percpu []probeDevStats
		if err := p.objs.Devstats.Lookup(k, &percpu); err != nil {
			return Stats{}, fmt.Errorf("read per-device BPF stats: %w", err)
		}
		d := DeviceStats{InFlight: readInFlight(p.sysfs, Dev(uint32(slot.Dev))), SampleEvery: 1}
		if e, ok := every[k]; ok {
			d.SampleEvery = e
		}
		for _, v := range percpu {
			d.Requests += v.Requests
			d.Bytes += v.Bytes
			d.Errors += v.Errors
			d.Sampled += v.Sampled
			d.Untimed += v.Untimed
			d.AllocTimed += v.AllocTimed
			d.Samplable += v.Samplable
			d.LatencySum += time.Duration(v.LatencyNs)
			for i := range d.Hist {
				d.Hist[i] += v.Hist[i]
			}
		}
		s.Devices[Dev(uint32(slot.Dev))] = d
	}
	var fk probeFileKey
	var fv []probeFileStats
	fit := p.objs.Filestats.Iterate()
	for fit.Next(&fk, &fv) {
		k := FileKey{Dev: Dev(fk.Dev), Ino: fk.Ino}
		f := FileStats{File: k}
		for _, v := range fv {
			if v.Requests == 0 {
				continue
			}
			f.Disk = Dev(v.Disk)
			f.Requests += v.Requests
			f.Bytes += v.Bytes
			f.LatencySum += time.Duration(v.LatencyNs)
			f.DepthSum += v.DepthSum
			f.Last = max(f.Last, time.Duration(v.LastNs))
		}
		s.Files[k] = f
	}
	if err := fit.Err(); err != nil {
		return Stats{}, fmt.Errorf("read per-file BPF stats: %w", err)
	}
	// Each CPU's requests for the file it saw last are not in filestats yet.
	var pending []probeFileCache
	if err := p.objs.Filecache.Lookup(uint32(0), &pending); err != nil {
		return Stats{}, fmt.Errorf("read per-CPU file cache: %w", err)
	}
	for _, cpu := range pending {
		for _, c := range cpu.E {
			addPending(s.Files, c)
		}
	}
	var lost [8]uint64
	for i := range lost {
		var percpu []uint64
		if err := p.objs.Lost.Lookup(uint32(i), &percpu); err != nil {
			return Stats{}, fmt.Errorf("read lost-event counters: %w", err)
		}
		for _, v := range percpu {
			lost[i] += v
		}
	}
	s.Lost = Lost{Records: lost[0], Inflight: lost[1], DeviceMap: lost[2], FileMap: lost[3],
		Readahead: lost[4], Undecoded: p.undecoded.Load(), Stale: lost[5]}
	for _, a := range p.attachments() {
		ps, err := a.prog.Stats()
		if err != nil {
			return Stats{}, fmt.Errorf("read run-time statistics of %s: %w", a.name, err)
		}
		s.Programs[a.name] = ProgramStats{Runs: ps.RunCount, RunTime: ps.Runtime, Misses: ps.RecursionMisses}
	}
	return s, nil
}

// Close detaches and unloads everything; a Run in progress returns.
func (p *Probe) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	if p.wake != nil {
		errs = append(errs, p.wake.close())
	}
	if p.ring != nil {
		errs = append(errs, p.ring.Close())
	}
	for _, l := range p.links {
		errs = append(errs, l.Close())
	}
	if p.stats != nil {
		errs = append(errs, p.stats.Close())
	}
	errs = append(errs, p.objs.Close())
	return errors.Join(errs...)
}

// addPending adds one per-CPU cached delta to files.
func addPending(files map[FileKey]FileStats, c probeFileCacheEntry) {
	if c.Delta.Requests == 0 {
		return
	}
	k := FileKey{Dev: Dev(c.Key.Dev), Ino: c.Key.Ino}
	f, ok := files[k]
	if !ok {
		f = FileStats{File: k, Disk: Dev(c.Delta.Disk)}
	}
	f.Requests += c.Delta.Requests
	f.Bytes += c.Delta.Bytes
	f.LatencySum += time.Duration(c.Delta.LatencyNs)
	f.DepthSum += c.Delta.DepthSum
	f.Last = max(f.Last, time.Duration(c.Delta.LastNs))
	files[k] = f
}

// sampleEvery returns the sampling period of each disk slot whose period
// is not 1. Called with mu held.
func (p *Probe) sampleEvery() map[uint32]uint32 {
	out := map[uint32]uint32{}
	if p.cfg.SampleEvery > 1 {
		for i := range uint32(1 << 6) {
			out[i] = p.cfg.SampleEvery
		}
		return out
	}
	for k, s := range p.sampler {
		out[k] = s.every
	}
	return out
}

// adjustSampling sets each disk's sampling period from its request rate
// since the last adjustment (Config.SampleBudget).
func (p *Probe) adjustSampling(now time.Time) {
	if p.cfg.SampleEvery != 0 || p.cfg.SampleBudget < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for k := range p.devSlots() {
		// Every samplable read request completed, streamed or not, summed
		// over CPUs: the budget is theirs (file reads of SampleBelow or
		// more are always streamed, whatever the period).
		var percpu []probeDevStats
		if err := p.objs.Devstats.Lookup(k, &percpu); err != nil {
			continue // the next adjustment retries
		}
		var reqs uint64
		for _, v := range percpu {
			reqs += v.Samplable
		}
		s := p.sampler[k]
		if s == nil {
			p.sampler[k] = &slotSampler{every: 1, requests: reqs, at: now}
			continue
		}
		dt := now.Sub(s.at)
		if dt < p.cfg.Poll/2 {
			continue
		}
		rate := float64(reqs-s.requests) / dt.Seconds()
		s.requests, s.at = reqs, now
		e := SamplePeriod(rate, float64(p.cfg.SampleBudget), s.every)
		if e == s.every {
			continue
		}
		if err := p.objs.Sampling.Update(k, e-1, ebpf.UpdateAny); err != nil {
			continue // the next adjustment retries
		}
		s.every = e
	}
}

// devSlots returns the claimed disk slots: with a device list, only its
// slots are read (one lookup each, ten times a second), else all 64.
func (p *Probe) devSlots() map[uint32]probeDevSlot {
	out := map[uint32]probeDevSlot{}
	var slot probeDevSlot
	if n := len(p.cfg.Devices); n > 0 {
		for k := range uint32(n) {
			if err := p.objs.Devslots.Lookup(k, &slot); err == nil && slot.Dev != 0 {
				out[k] = slot
			}
		}
		return out
	}
	var k uint32
	it := p.objs.Devslots.Iterate()
	for it.Next(&k, &slot) {
		if slot.Dev != 0 {
			out[k] = slot
		}
	}
	return out
}

// SamplePeriod returns the sampling period for a disk completing rate
// samplable requests per second, with at most budget of them streamed per
// second: the smallest power
// of two N with rate/N <= budget. Coming down from cur, it keeps a quarter
// of the budget as margin, so that a rate near a boundary does not flap.
func SamplePeriod(rate, budget float64, cur uint32) uint32 {
	if budget <= 0 {
		return 1
	}
	need := period(rate, budget)
	if need >= cur {
		return need
	}
	return min(cur, period(rate, budget*0.75))
}

func period(rate, budget float64) uint32 {
	n := uint32(1)
	for n < maxSampleEvery && rate/float64(n) > budget {
		n *= 2
	}
	return n
}

// readInFlight returns the read requests the kernel counts in flight on
// disk d (/sys/dev/block/MAJ:MIN/inflight, first field), 0 when it cannot
// be read (the disk is gone).
func readInFlight(sysfs string, d Dev) int64 {
	b, err := os.ReadFile(fmt.Sprintf("%s/dev/block/%d:%d/inflight", sysfs, d.Major(), d.Minor()))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0
	}
	return n
}
