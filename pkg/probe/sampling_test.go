package probe

import (
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// With 1 in 8 small requests attributed, each file's share of the bytes
// estimated from the weighted records stays within a few percent of its
// exact share, the device's counts stay exact, and the latencies of the
// unsampled requests come from the kernel's own timestamps.
func TestSamplingIsUnbiasedOnLoopDevice(t *testing.T) {
	needRoot(t, "loads BPF programs and creates a loop device")
	l := newLab(t, 128)
	sizes := []int64{mb(6), mb(12), mb(18)}
	var paths []string
	var keys []FileKey
	for i, sz := range sizes {
		p, k := l.writeFile(t, string(rune('a'+i)), sz)
		paths, keys = append(paths, p), append(keys, k)
	}
	dropCaches(t)

	const every = 8
	p, c := startProbe(t, Config{Devices: []Dev{l.Dev}, Poll: 20 * time.Millisecond, SampleEvery: every})

	// Every page of the three files once, in random order, with readahead
	// off on each file (FADV_RANDOM): one 4 KiB request per read.
	type page struct {
		f   int
		off int64
	}
	var pages []page
	files := make([]*os.File, len(paths))
	for i, path := range paths {
		f, err := os.Open(path)
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM))
		files[i] = f
		for off := int64(0); off < sizes[i]; off += 4096 {
			pages = append(pages, page{i, off})
		}
	}
	var cached uint64
	for _, path := range paths {
		cached += residentBytes(t, path) / 4096
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(pages), func(i, j int) { pages[i], pages[j] = pages[j], pages[i] })
	buf := make([]byte, 4096)
	for _, pg := range pages {
		_, err := files[pg.f].ReadAt(buf, pg.off)
		require.NoError(t, err)
	}
	time.Sleep(100 * time.Millisecond)
	p.stop(t)

	c.mu.Lock()
	defer c.mu.Unlock()
	est := map[FileKey]float64{}
	var n int
	for _, r := range c.recs {
		require.Equal(t, uint32(4096), r.Bytes, "one page per read: %+v", r)
		require.Equal(t, uint32(every), r.Weight, "%+v", r)
		if r.Kind == KindFile {
			est[r.File] += float64(uint64(r.Bytes) * r.W())
			assert.Less(t, r.Offset, uint64(sizes[len(sizes)-1]), "%+v", r)
			assert.Zero(t, r.Offset%4096, "%+v", r)
			n++
		}
		assert.Greater(t, r.Latency, time.Duration(0))
	}
	total := float64(mb(36))
	for i, k := range keys {
		exact := float64(sizes[i]) / total
		got := est[k] / total
		t.Logf("file %c: exact share %.3f, from %d sampled records %.3f", 'a'+i, exact, n, got)
		// 1 in 8 of 9216 page reads, about 1150 records: the standard
		// error of a share of 0.5 is 0.015. Four of them (at least 0.04):
		// a sampler biased toward a file misses by far more.
		tol := max(0.04, 4*math.Sqrt(exact*(1-exact)/float64(n)))
		assert.InDelta(t, exact, got, tol, "byte share of file %c", 'a'+i)
	}

	s, err := p.Stats()
	require.NoError(t, err)
	ds := s.Devices[l.Dev]
	t.Logf("device: %d requests, %d sampled, %d timed from allocation, %d untimed; %d pages cached before the reads", ds.Requests, ds.Sampled, ds.AllocTimed, ds.Untimed, cached)
	// Counts are exact: every page read that was not cached is one
	// request (a few metadata reads come on top), up to unexplainedReads.
	assert.GreaterOrEqual(t, ds.Requests, uint64(len(pages))-cached-uint64(len(pages))/unexplainedReads)
	assert.Less(t, ds.Requests, uint64(len(pages))+64)
	assert.Equal(t, ds.Requests*4096, ds.Bytes)
	assert.Equal(t, uint64(len(c.recs)), ds.Sampled)
	assert.InDelta(t, float64(ds.Requests)/every, float64(ds.Sampled), 2)
	assert.Equal(t, uint32(every), ds.SampleEvery)
	assert.Zero(t, ds.Untimed, "every request has a latency")
	var histSum uint64
	for _, v := range ds.Hist {
		histSum += v
	}
	assert.Equal(t, ds.Requests, histSum)
	// In flight (the kernel's own count) comes back to zero once the file
	// system's own reads drain.
	var inflight int64
	assert.Eventually(t, func() bool {
		s, err := p.Stats()
		inflight = s.Devices[l.Dev].InFlight
		return err == nil && inflight == 0
	}, 2*time.Second, 20*time.Millisecond, "reads left in flight: %d", inflight)
	assert.Zero(t, s.Lost.Total(), "%+v", s.Lost)
	// Per-file kernel totals are the same weighted estimates.
	for _, k := range keys {
		assert.Equal(t, uint64(est[k]), s.Files[k].Bytes)
	}
}

// Above its budget a disk's small requests are sampled 1 in N, N following
// the rate; the device's counts stay exact.
func TestAdaptiveSamplingFollowsTheRate(t *testing.T) {
	needRoot(t, "loads BPF programs and creates a loop device")
	l := newLab(t, 64)
	path, key := l.writeFile(t, "r", mb(24))
	dropCaches(t)
	const budget = 200
	p, c := startProbe(t, Config{Devices: []Dev{l.Dev}, Poll: 20 * time.Millisecond, SampleBudget: budget})

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM))
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 4096)
	pages := rng.Perm(int(mb(24) / 4096))
	// A page already cached when it is read (left by drop_caches, or
	// brought in with a neighbour's folio) makes no request: CI saw 34 of
	// 6144 so. Each read looks first (mincore) and counts those.
	m, err := unix.Mmap(int(f.Fd()), 0, int(mb(24)), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(m)
	vec := make([]byte, 1)
	var cached uint64
	start := time.Now()
	var reads int
	for _, pg := range pages {
		mincore(t, m[pg*4096:pg*4096+4096], vec)
		if vec[0]&1 != 0 {
			cached++
		}
		_, err := f.ReadAt(buf, int64(pg)*4096)
		require.NoError(t, err)
		reads++
		if time.Since(start) > 1500*time.Millisecond {
			break
		}
	}
	rate := float64(reads) / time.Since(start).Seconds()
	s, err := p.Stats()
	require.NoError(t, err)
	time.Sleep(60 * time.Millisecond)
	p.stop(t)
	ds := s.Devices[l.Dev]
	missed := s.Programs["block_rq_complete"].Misses
	t.Logf("%d reads at %.0f/s (%d of them cached): %d requests, %d sampled, period %d; %d completions the kernel did not run the probe for", reads, rate, cached, ds.Requests, ds.Sampled, ds.SampleEvery, missed)
	require.Greater(t, rate, 4.0*budget, "the reads must outrun the budget for this test to mean anything")
	assert.Greater(t, ds.SampleEvery, uint32(1))
	assert.LessOrEqual(t, ds.SampleEvery, 2*SamplePeriod(rate, budget, 1))
	assert.GreaterOrEqual(t, ds.Requests+missed, uint64(reads)-cached-uint64(reads)/unexplainedReads, "counts stay exact")
	assert.Less(t, ds.Sampled, ds.Requests/2)

	c.mu.Lock()
	defer c.mu.Unlock()
	var est uint64
	weighted := 0
	for _, r := range c.recs {
		if r.Weight > 1 {
			weighted++
		}
		if r.File == key {
			est += uint64(r.Bytes) * r.W()
		}
	}
	assert.Positive(t, weighted, "records carry their weight")
	// Every request read this file: the weighted estimate is its byte count,
	// within the noise of the period changing on the way.
	assert.InDelta(t, float64(ds.Bytes), float64(est), 0.25*float64(ds.Bytes))
}

// unexplainedReads: one page read in this many may come without a request
// of its own. On 2026-11-25 runs on one host counted 9178-9216 requests for
// 9216 page reads with no page cached before them (mincore), every request
// 4 KiB, and a CI run 6110 for 6144: up to 0.55% of the reads were served
// without a request, cause not found. Not the probe's counting: its
// per-CPU count is added at every completion, before any sampling
// decision, and the kernel skipped no run of it (Misses 0). Sampling that
// lost counts would lose most of them.
const unexplainedReads = 100

// ddDirect starts dd reading p with O_DIRECT in bs blocks (its buffer is
// anonymous memory: the probe cannot name the file).
func ddDirect(t testing.TB, p, bs string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("dd", "if="+p, "of=/dev/null", "bs="+bs, "iflag=direct")
	require.NoError(t, cmd.Start())
	return cmd
}

// With 1 in 4 of the samplable requests streamed, a buffered reader's
// readahead requests (32 KiB or more, read for its file) are all streamed
// with weight 1 and attributed exactly, while a direct-I/O reader's large
// requests beside it (no file to name) are streamed 1 in 4 with weight 4;
// every request is one or the other (Requests = file reads of 32 KiB or
// more + Samplable), and the weighted records estimate the direct reads'
// bytes without bias: one request of each block of 4 at a random place, so
// that a 1 MiB read the device splits into a long and a short request is
// not always counted by its long half.
func TestSamplingStreamsDirectReadsOneInN(t *testing.T) {
	needRoot(t, "loads BPF programs and creates a loop device")
	l := newLab(t, 256)
	pathA, keyA := l.writeFile(t, "a", mb(48))
	pathB, _ := l.writeFile(t, "b", mb(64))
	dropCaches(t)

	const every = 4
	p, c := startProbe(t, Config{Devices: []Dev{l.Dev}, Poll: 20 * time.Millisecond, SampleEvery: every})

	cachedA := residentBytes(t, pathA)
	direct := ddDirect(t, pathB, "1M")
	readAll(t, pathA)
	require.NoError(t, direct.Wait())
	c.settle(3 * time.Second)
	p.stop(t)
	s, err := p.Stats()
	require.NoError(t, err)
	ds := s.Devices[l.Dev]

	c.mu.Lock()
	defer c.mu.Unlock()
	var fileLarge, fileBytes, unattrLarge, unattrEst, samplableW, allEst uint64
	var unattrSizes, samplableSizes []float64
	for _, r := range c.recs {
		allEst += uint64(r.Bytes) * r.W()
		switch {
		case r.Kind == KindFile && r.Bytes >= SampleBelow:
			require.Equal(t, uint32(1), r.Weight, "a file's readahead request is never sampled: %+v", r)
			require.False(t, r.Samplable, "the buffered reader's requests are readahead: %+v", r)
			fileLarge++
			if r.File == keyA {
				fileBytes += uint64(r.Bytes)
			}
		case r.Bytes >= SampleBelow:
			require.Equal(t, uint32(every), r.Weight, "a large request not read for a file is sampled: %+v", r)
			require.True(t, r.Samplable, "%+v", r)
			unattrLarge++
			unattrEst += uint64(r.Bytes) * r.W()
			samplableW += r.W()
			unattrSizes = append(unattrSizes, float64(r.Bytes))
			samplableSizes = append(samplableSizes, float64(r.Bytes))
		default:
			require.Equal(t, uint32(every), r.Weight, "%+v", r)
			samplableW += r.W()
			samplableSizes = append(samplableSizes, float64(r.Bytes))
		}
		assert.GreaterOrEqual(t, r.Depth, uint32(1), "%+v", r)
	}
	cpus, err := ebpf.PossibleCPU()
	require.NoError(t, err)
	t.Logf("%d records: %d file reads of 32 KiB or more (%s of a), %d large unattributed standing for %s; device: %d requests, %d samplable, %d streamed",
		len(c.recs), fileLarge, fmtMB(fileBytes), unattrLarge, fmtMB(unattrEst), ds.Requests, ds.Samplable, ds.Sampled)
	require.Positive(t, unattrLarge)

	// Attribution of the buffered reader stays exact.
	assert.GreaterOrEqual(t, float64(fileBytes), 0.99*float64(uint64(mb(48))-cachedA), "bytes attributed to a (%s of it cached before the read)", fmtMB(cachedA))
	assert.LessOrEqual(t, fileBytes, uint64(mb(48)))
	assert.Equal(t, fileBytes, s.Files[keyA].Bytes, "kernel per-file totals")
	// Every request is counted, and is either streamed whole or samplable.
	assert.Equal(t, uint64(len(c.recs)), ds.Sampled)
	assert.Equal(t, ds.Requests, fileLarge+ds.Samplable)
	// Each CPU streams one of every 4 of its samplable requests: the
	// weighted count misses at most each CPU's last, unfinished block.
	assert.InDelta(t, float64(ds.Samplable), float64(samplableW), float64(every*cpus))
	// The direct reads' bytes, estimated: within 4 standard errors of a
	// random pick per block (none when every request has one size) plus
	// each CPU's unfinished block of the largest request.
	edge := float64(every*cpus) * float64(mb(1))
	t.Logf("direct bytes: %s estimated for %s read (allowed ±%s)", fmtMB(unattrEst), fmtMB(uint64(mb(64))), fmtMB(uint64(edge+4*sampleErr(unattrSizes, every))))
	assert.InDelta(t, float64(mb(64)), float64(unattrEst), edge+4*sampleErr(unattrSizes, every))
	assert.InDelta(t, float64(ds.Bytes), float64(allEst), edge+4*sampleErr(samplableSizes, every))
	assert.Zero(t, s.Lost.Total(), "%+v", s.Lost)
}

// Above its budget, a disk's direct-I/O reads of any size are streamed
// 1 in N, N following their rate, while a file's readahead requests beside
// them are all streamed and attributed exactly.
func TestAdaptiveSamplingOfDirectReads(t *testing.T) {
	needRoot(t, "loads BPF programs and creates a loop device")
	l := newLab(t, 256)
	pathA, keyA := l.writeFile(t, "a", mb(32))
	pathB, _ := l.writeFile(t, "b", mb(128))
	dropCaches(t)
	const budget = 200
	p, c := startProbe(t, Config{Devices: []Dev{l.Dev}, Poll: 20 * time.Millisecond, SampleBudget: budget})

	sectors0 := readSectors(t, l.Loop)
	start := time.Now()
	direct := ddDirect(t, pathB, "64k")
	time.Sleep(300 * time.Millisecond) // the period adapts to the direct reads first
	cachedA := residentBytes(t, pathA)
	readAll(t, pathA)
	require.NoError(t, direct.Wait())
	elapsed := time.Since(start)
	c.settle(3 * time.Second)
	s, err := p.Stats()
	require.NoError(t, err)
	p.stop(t)
	ds := s.Devices[l.Dev]
	// Bytes the device read whose completion ran no BPF program at all
	// (docs/probe.md, "Completions the kernel runs no BPF program for"):
	// the disk's totals miss them as well as the file's, and no probe can
	// attribute them.
	devRead := (readSectors(t, l.Loop) - sectors0) * 512
	unseen := devRead - min(devRead, ds.Bytes)
	rate := float64(mb(128)/(64<<10)) / elapsed.Seconds()
	t.Logf("direct reads at about %.0f/s: %d requests, %d samplable, %d streamed, period %d at the end", rate, ds.Requests, ds.Samplable, ds.Sampled, ds.SampleEvery)
	require.Greater(t, rate, 4.0*budget, "the reads must outrun the budget for this test to mean anything")

	c.mu.Lock()
	defer c.mu.Unlock()
	var fileBytes, est uint64
	weighted := 0
	for _, r := range c.recs {
		if r.Kind == KindFile && r.Bytes >= SampleBelow {
			require.Equal(t, uint32(1), r.Weight, "%+v", r)
			if r.File == keyA {
				fileBytes += uint64(r.Bytes)
			}
			continue
		}
		if r.Weight > 1 {
			weighted++
		}
		if r.Bytes == 64<<10 {
			est += uint64(r.Bytes) * r.W()
		}
	}
	assert.Positive(t, weighted, "direct reads carry their weight")
	assert.Less(t, ds.Sampled, ds.Requests/2, "most direct reads are not streamed")
	assert.GreaterOrEqual(t, float64(fileBytes+unseen), 0.99*float64(uint64(mb(32))-cachedA), "bytes attributed to a (%s of it cached before the read; %s the kernel ran no program for)", fmtMB(cachedA), fmtMB(unseen))
	assert.Less(t, float64(unseen), 0.03*float64(devRead), "the probe saw the device's reads (%s of %s unseen)", fmtMB(unseen), fmtMB(devRead))
	assert.LessOrEqual(t, fileBytes, uint64(mb(32)))
	assert.Equal(t, fileBytes, s.Files[keyA].Bytes)
	// The direct reads' bytes, estimated through the period's changes.
	assert.InDelta(t, float64(mb(128)), float64(est), 0.25*float64(mb(128)))
}

// sampleErr is the standard error of n·Σx over records x picked one per
// block of n: at most n·sqrt(k)·sd(x) for k records.
func sampleErr(x []float64, n int) float64 {
	if len(x) < 2 {
		return 0
	}
	var sum, sq float64
	for _, v := range x {
		sum += v
	}
	mean := sum / float64(len(x))
	for _, v := range x {
		sq += (v - mean) * (v - mean)
	}
	sd := math.Sqrt(sq / float64(len(x)-1))
	return float64(n) * math.Sqrt(float64(len(x))) * sd
}
