package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/test/lab"
)

// mreader is one reader of a matrix scenario, started with run and
// stopped by cancelling its context.
type mreader interface {
	run(ctx context.Context) error
	// delivered is the bytes it got so far.
	delivered() int64
	// touches is its touch or request log; nil for a stream.
	touches() *touchLog
}

// newMReader makes the reader for spec r reading files (one, or a DataNode
// reader's blocks).
func newMReader(r lab.MatrixReader, files []string, seed uint64) mreader {
	rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	switch r.Kind {
	case lab.KRead, lab.KSendfile, lab.KMmapSeq:
		if r.OwnMountNS {
			return newNSStream(r, files[0], seed)
		}
		return &mStream{kind: r.Kind, path: files[0], afresh: r.Afresh, pause: r.Pause, rng: rng}
	case lab.KMmap:
		return &mMmap{path: files[0], seed: seed}
	case lab.KMmapBurst:
		return &mBurst{path: files[0], rng: rng}
	case lab.KPread:
		return &mPread{paths: files, reqKB: r.ReqKB, clients: 1, rng: rng}
	case lab.KDataNode:
		return &mPread{paths: files, reqKB: r.ReqKB, clients: r.Clients, perRequest: true, rng: rng}
	}
	panic("unknown matrix reader kind " + r.Kind) // Validate rejects these
}

// mStream reads its file from start to end over and over: read(2),
// sendfile(2) at explicit offsets, or page touches of a mapping. A
// long-lived stream keeps one descriptor (its pages dropped between
// passes); an afresh one opens the file anew for every pass (a block file),
// so each pass starts with the device's window.
type mStream struct {
	kind   string
	path   string
	afresh bool
	pause  bool
	rng    *rand.Rand
	bytes  atomic.Int64
	sink   atomic.Uint64
}

func (s *mStream) delivered() int64   { return s.bytes.Load() }
func (s *mStream) touches() *touchLog { return nil }

func (s *mStream) run(ctx context.Context) error {
	f, err := os.Open(s.path)
	if err != nil {
		return err
	}
	defer func() { f.Close() }()
	nextPause := time.Now().Add(s.pauseEvery())
	for ctx.Err() == nil {
		if err := s.pass(ctx, f, &nextPause); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		if err := lab.DropFileCache(s.path); err != nil {
			return err
		}
		if s.afresh {
			f.Close()
			if f, err = os.Open(s.path); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *mStream) pauseEvery() time.Duration {
	return time.Duration(2000+s.rng.IntN(3000)) * time.Millisecond
}

// maybePause sleeps 0.3-1 s when a pausing stream is due.
func (s *mStream) maybePause(ctx context.Context, next *time.Time) {
	if !s.pause || time.Now().Before(*next) {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(300+s.rng.IntN(700)) * time.Millisecond):
	}
	*next = time.Now().Add(s.pauseEvery())
}

// pass reads f once from offset 0 to its end (or until ctx ends).
func (s *mStream) pass(ctx context.Context, f *os.File, nextPause *time.Time) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	switch s.kind {
	case lab.KMmapSeq:
		data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return fmt.Errorf("mmap %s: %w", s.path, err)
		}
		defer unix.Munmap(data)
		for off := 0; off < len(data) && ctx.Err() == nil; off += 4096 {
			s.sink.Add(uint64(data[off]))
			s.bytes.Add(4096)
			if off%(1<<20) == 0 {
				s.maybePause(ctx, nextPause)
			}
		}
		return nil
	case lab.KSendfile:
		sink, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer sink.Close()
		for off := int64(0); off < size && ctx.Err() == nil; {
			o := off
			n, err := unix.Sendfile(int(sink.Fd()), int(f.Fd()), &o, lab.SeqBlock)
			if err != nil {
				return fmt.Errorf("sendfile %s: %w", s.path, err)
			}
			if n == 0 {
				break
			}
			off += int64(n)
			s.bytes.Add(int64(n))
			s.maybePause(ctx, nextPause)
		}
		return nil
	default:
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		buf := make([]byte, lab.SeqBlock)
		for ctx.Err() == nil {
			n, err := f.Read(buf)
			s.bytes.Add(int64(n))
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", s.path, err)
			}
			s.maybePause(ctx, nextPause)
		}
		return nil
	}
}

// mMmap is the service-like mmap random reader of the other benchmarks
// (mmapRandom: a long-lived mapping, random page touches, its file
// evicted every 250 ms).
type mMmap struct {
	path string
	seed uint64
	m    *mmapRandom
	mu   sync.Mutex
}

func (r *mMmap) delivered() int64 {
	if l := r.touches(); l != nil {
		l.mu.Lock()
		defer l.mu.Unlock()
		return int64(len(l.ts)) * 4096
	}
	return 0
}

func (r *mMmap) touches() *touchLog {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		return &touchLog{}
	}
	return &r.m.touchLog
}

func (r *mMmap) run(ctx context.Context) error {
	m, err := openMmapRandom(r.path)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.m = m
	r.mu.Unlock()
	defer m.Close()
	return m.run(ctx, r.seed)
}

// burstEvery and burstTouches: a service that opens its index, looks up a
// batch and closes it again.
const (
	burstEvery   = 200 * time.Millisecond
	burstTouches = 100
)

// mBurst opens its file every 200 ms, maps it, touches 100 random pages and
// closes it. Each open takes the device's window at that moment, so a
// trial that raises the device window reaches it; before each burst the
// file's pages are dropped (the index is larger than memory).
type mBurst struct {
	path string
	rng  *rand.Rand
	sink atomic.Uint64
	log  touchLog
}

func (b *mBurst) delivered() int64 {
	b.log.mu.Lock()
	defer b.log.mu.Unlock()
	return int64(len(b.log.ts)) * 4096
}

func (b *mBurst) touches() *touchLog { return &b.log }

func (b *mBurst) run(ctx context.Context) error {
	next := time.Now()
	for ctx.Err() == nil {
		if err := b.burst(ctx); err != nil {
			return err
		}
		next = next.Add(burstEvery)
		if now := time.Now(); next.Before(now) {
			next = now // late: no catching up
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(next)):
		}
	}
	return nil
}

func (b *mBurst) burst(ctx context.Context) error {
	f, err := os.Open(b.path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return err
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap %s: %w", b.path, err)
	}
	defer unix.Munmap(data)
	pages := int64(len(data) / 4096)
	for i := 0; i < burstTouches && ctx.Err() == nil; i++ {
		off := b.rng.Int64N(pages) * 4096
		t := time.Now()
		b.sink.Add(uint64(data[off]))
		b.log.add(t, time.Since(t))
	}
	return nil
}

// mPread issues reqKB preads at random 4 KB-aligned offsets, from clients
// goroutines. One client on one long-lived descriptor is a pread reader; a
// DataNode reader (perRequest) picks one of its block files for every
// request and opens it for that request only. The files' pages are dropped
// every 250 ms (evictEvery), as for the mmap reader.
type mPread struct {
	paths      []string
	reqKB      int
	clients    int
	perRequest bool
	rng        *rand.Rand
	rngMu      sync.Mutex
	bytes      atomic.Int64
	log        touchLog
}

func (p *mPread) delivered() int64   { return p.bytes.Load() }
func (p *mPread) touches() *touchLog { return &p.log }

func (p *mPread) pick(n int64) int64 {
	p.rngMu.Lock()
	defer p.rngMu.Unlock()
	return p.rng.Int64N(n)
}

func (p *mPread) run(ctx context.Context) error {
	sizes := make([]int64, len(p.paths))
	for i, path := range p.paths {
		st, err := os.Stat(path)
		if err != nil {
			return err
		}
		sizes[i] = st.Size()
	}
	var long *os.File
	if !p.perRequest {
		f, err := os.Open(p.paths[0])
		if err != nil {
			return err
		}
		defer f.Close()
		long = f
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, p.clients+1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(evictEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for _, path := range p.paths {
				if err := lab.DropFileCache(path); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}
	}()
	req := int64(p.reqKB) << 10
	for c := 0; c < p.clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, req)
			for ctx.Err() == nil {
				i := 0
				if p.perRequest {
					i = int(p.pick(int64(len(p.paths))))
				}
				off := p.pick((sizes[i]-req)/4096+1) * 4096
				t := time.Now()
				f := long
				if f == nil {
					var err error
					if f, err = os.Open(p.paths[i]); err != nil {
						errs <- err
						cancel()
						return
					}
				}
				n, err := f.ReadAt(buf, off)
				if f != long {
					f.Close()
				}
				if err != nil && !errors.Is(err, io.EOF) {
					errs <- fmt.Errorf("pread %s: %w", p.paths[i], err)
					cancel()
					return
				}
				p.log.add(t, time.Since(t))
				p.bytes.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
