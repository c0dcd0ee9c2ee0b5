package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// SeqBlock is the read size of the sequential reader (HDFS-like 64 KB).
const SeqBlock = 64 << 10

// SeqSample is the throughput of one interval of a sequential read.
type SeqSample struct {
	At    time.Duration // since the read started
	Bytes int64
	MBps  float64
}

// SeqResult is the outcome of a sequential read.
type SeqResult struct {
	Bytes   int64
	Elapsed time.Duration
	Samples []SeqSample
}

// MBps is the mean throughput in 10^6 bytes per second.
func (r SeqResult) MBps() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) / r.Elapsed.Seconds() / 1e6
}

// SeqReader reads a file sequentially with buffered 64 KB reads. Open it
// before a regime starts to test actions on already-open files: the file's
// readahead window is fixed when it is opened.
type SeqReader struct {
	f   *os.File
	buf []byte
}

// OpenSeq opens path for a sequential read.
func OpenSeq(path string) (*SeqReader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return &SeqReader{f: f, buf: make([]byte, SeqBlock)}, nil
}

// File is the open file (its descriptor is what the daemon acts on).
func (r *SeqReader) File() *os.File { return r.f }

// Close closes the file.
func (r *SeqReader) Close() error { return r.f.Close() }

// Read reads from the current position to EOF, or until ctx ends, and
// samples throughput every interval (0: no samples).
func (r *SeqReader) Read(ctx context.Context, interval time.Duration) (SeqResult, error) {
	var res SeqResult
	start := time.Now()
	lastT, lastB := start, int64(0)
	for {
		if ctx.Err() != nil {
			break
		}
		n, err := r.f.Read(r.buf)
		res.Bytes += int64(n)
		now := time.Now()
		if interval > 0 && now.Sub(lastT) >= interval {
			d := now.Sub(lastT)
			res.Samples = append(res.Samples, SeqSample{At: now.Sub(start), Bytes: res.Bytes - lastB,
				MBps: float64(res.Bytes-lastB) / d.Seconds() / 1e6})
			lastT, lastB = now, res.Bytes
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			res.Elapsed = time.Since(start)
			return res, fmt.Errorf("read %s: %w", r.f.Name(), err)
		}
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// ReadSeq reads a whole file sequentially and reports its throughput.
func ReadSeq(path string) (SeqResult, error) {
	r, err := OpenSeq(path)
	if err != nil {
		return SeqResult{}, err
	}
	defer r.Close()
	return r.Read(context.Background(), 0)
}

// RandomResult is the outcome of a random mmap reader.
type RandomResult struct {
	Touches  int
	Elapsed  time.Duration
	P50, P99 time.Duration
	Max      time.Duration
}

// PerSec is the page touches per second.
func (r RandomResult) PerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Touches) / r.Elapsed.Seconds()
}

// RandomMmapRead maps path and touches random 4 KB pages for d (or until
// ctx ends), like a service reading an index: every page fault reads
// around the faulting page with the file's readahead window, so an
// oversized window shows up here as fewer touches per second.
func RandomMmapRead(ctx context.Context, path string, d time.Duration, seed uint64) (RandomResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return RandomResult{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return RandomResult{}, err
	}
	pages := st.Size() / 4096
	if pages < 1 {
		return RandomResult{}, fmt.Errorf("%s is smaller than a page", path)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return RandomResult{}, fmt.Errorf("mmap %s: %w", path, err)
	}
	defer unix.Munmap(data)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var lat []time.Duration
	var sink byte
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil {
		off := rng.Int64N(pages) * 4096
		t := time.Now()
		sink ^= data[off]
		lat = append(lat, time.Since(t))
	}
	res := RandomResult{Touches: len(lat), Elapsed: time.Since(start)}
	_ = sink
	if len(lat) > 0 {
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		res.P50, res.P99, res.Max = Quantile(lat, 0.5), Quantile(lat, 0.99), lat[len(lat)-1]
	}
	return res, nil
}

// Quantile returns the q-quantile of sorted durations (nearest rank).
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}
