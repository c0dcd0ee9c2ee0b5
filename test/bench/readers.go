package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/test/lab"
)

// seqStream reads one open file over and over until ctx ends: buffered
// 64 KB read(2) calls (dd-like) or sendfile(2) of 64 KB at explicit
// offsets into /dev/null (the DataNode's path: its file position stays 0).
// Between passes the file's pages are dropped from the page cache so that
// every pass reads the device; the open file, and with it its readahead
// state, stays the same, which is what an action on an already-open file
// must change.
type seqStream struct {
	path     string
	sendfile bool
	f        *os.File
	sink     *os.File
	bytes    atomic.Int64
	passes   int
}

func openSeqStream(path string, sendfile bool) (*seqStream, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	s := &seqStream{path: path, sendfile: sendfile, f: f}
	if sendfile {
		if s.sink, err = os.OpenFile(os.DevNull, os.O_WRONLY, 0); err != nil {
			f.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *seqStream) Close() {
	s.f.Close()
	if s.sink != nil {
		s.sink.Close()
	}
}

func (s *seqStream) run(ctx context.Context) error {
	buf := make([]byte, lab.SeqBlock)
	var off int64
	for ctx.Err() == nil {
		var n int
		var err error
		if s.sendfile {
			o := off
			n, err = unix.Sendfile(int(s.sink.Fd()), int(s.f.Fd()), &o, lab.SeqBlock)
			if err == nil && n == 0 {
				err = io.EOF
			}
		} else {
			n, err = s.f.Read(buf)
		}
		off += int64(n)
		s.bytes.Add(int64(n))
		if errors.Is(err, io.EOF) {
			s.passes++
			if err := lab.DropFileCache(s.path); err != nil {
				return err
			}
			off = 0
			if !s.sendfile {
				if _, err := s.f.Seek(0, io.SeekStart); err != nil {
					return err
				}
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", s.path, err)
		}
	}
	return nil
}

// mmapRandom is a service-like reader: it keeps a large file mapped (opened
// before the run, so it has the window the device had then) and touches
// random 4 KB pages; every fault reads around the page with the file's
// window, which an oversized window turns into waste and latency.
type mmapRandom struct {
	f    *os.File
	data []byte
	// reopen: at every eviction the file is closed and opened again (a
	// new descriptor, with the device's window), not only mapped again.
	reopen  bool
	reopens int // how many times it did (read after run returns)
	// sink keeps the page touch: a load whose value is never used is
	// removed by the compiler, and then nothing faults.
	sink atomic.Uint64
	touchLog
}

// touchLog records a random reader's touches (or requests): when each
// started and how long it took.
type touchLog struct {
	mu  sync.Mutex
	ts  []time.Time
	lat []time.Duration
}

func (m *touchLog) add(t time.Time, d time.Duration) {
	m.mu.Lock()
	m.ts = append(m.ts, t)
	m.lat = append(m.lat, d)
	m.mu.Unlock()
}

func openMmapRandom(path string) (*mmapRandom, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return &mmapRandom{f: f, data: data}, nil
}

func (m *mmapRandom) Close() {
	if m.data != nil {
		_ = unix.Munmap(m.data)
	}
	m.f.Close()
}

// evictEvery is how often the random reader's file leaves the page cache.
// A service's index is much larger than memory; without this, the file
// would be cached after a few thousand faults and every later touch would
// be a hit, hiding the window's cost.
const evictEvery = 250 * time.Millisecond

func (m *mmapRandom) run(ctx context.Context, seed uint64) error {
	pages := int64(len(m.data) / 4096)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	last := time.Now()
	for ctx.Err() == nil {
		if time.Since(last) >= evictEvery {
			// Mapped pages are not evicted: unmap, drop, map again (the
			// open file, and so its readahead state, stays).
			if err := unix.Munmap(m.data); err != nil {
				return err
			}
			m.data = nil
			if err := unix.Fadvise(int(m.f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
				return err
			}
			if m.reopen {
				f, err := os.Open(m.f.Name())
				if err != nil {
					return fmt.Errorf("open again: %w", err)
				}
				m.f.Close()
				m.f = f
				m.reopens++
			}
			data, err := unix.Mmap(int(m.f.Fd()), 0, int(pages*4096), unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				return fmt.Errorf("mmap again: %w", err)
			}
			m.data = data
			last = time.Now()
		}
		off := rng.Int64N(pages) * 4096
		t := time.Now()
		m.sink.Add(uint64(m.data[off]))
		m.add(t, time.Since(t))
	}
	return nil
}

// since returns the touches from t on: their count and sorted latencies.
func (m *touchLog) since(t time.Time) []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := sort.Search(len(m.ts), func(i int) bool { return !m.ts[i].Before(t) })
	out := append([]time.Duration(nil), m.lat[i:]...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// p99PerSecond is the p99 touch latency in each second from t on (the last
// one partial), in ms: where in a run the random reader's tail came from.
func (m *touchLog) p99PerSecond(t time.Time) []float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []float64
	var sec []time.Duration
	flush := func() {
		sort.Slice(sec, func(i, j int) bool { return sec[i] < sec[j] })
		out = append(out, ms(lab.Quantile(sec, 0.99)))
		sec = sec[:0]
	}
	next := t.Add(time.Second)
	for i := sort.Search(len(m.ts), func(i int) bool { return !m.ts[i].Before(t) }); i < len(m.ts); i++ {
		for !m.ts[i].Before(next) {
			flush()
			next = next.Add(time.Second)
		}
		sec = append(sec, m.lat[i])
	}
	if len(sec) > 0 {
		flush() // the last, partial second
	}
	return out
}

// devReadBytes is the bytes read from device dev (/sys/block/DEV/stat,
// sectors read).
func devReadBytes(dev string) (uint64, error) {
	s, err := lab.ReadDiskStats(dev)
	if err != nil {
		return 0, err
	}
	return s.Sectors * 512, nil
}

// Point is one timeline sample.
type Point struct {
	T       float64 `json:"t"`        // seconds since onset
	MBps    float64 `json:"mbps"`     // the measured reader(s)
	DevMBps float64 `json:"dev_mbps"` // everything the device read
}

// sampler records the throughput of a byte counter and of the device
// every interval.
type sampler struct {
	mu  sync.Mutex
	pts []Point
	t0  time.Time // onset, set later: points carry absolute times until then
	abs []time.Time
}

func (s *sampler) run(ctx context.Context, every time.Duration, dev string, count func() int64) {
	t := time.NewTicker(every)
	defer t.Stop()
	last := time.Now()
	lb := count()
	ld, _ := devReadBytes(dev)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			b := count()
			d, _ := devReadBytes(dev)
			sec := now.Sub(last).Seconds()
			s.mu.Lock()
			s.abs = append(s.abs, now)
			s.pts = append(s.pts, Point{MBps: float64(b-lb) / sec / 1e6, DevMBps: float64(d-ld) / sec / 1e6})
			s.mu.Unlock()
			last, lb, ld = now, b, d
		}
	}
}

// points returns the timeline with T relative to onset.
func (s *sampler) points(onset time.Time) []Point {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Point, len(s.pts))
	for i, p := range s.pts {
		p.T = s.abs[i].Sub(onset).Seconds()
		out[i] = p
	}
	return out
}
