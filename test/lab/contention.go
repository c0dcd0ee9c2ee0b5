package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Contention is a background reader competing for the lab device: it reads
// a file over and over with O_DIRECT (so the page cache never absorbs it).
type Contention struct {
	l     *Lab
	path  string
	stop  chan struct{}
	wg    sync.WaitGroup
	bytes atomic.Int64
	once  sync.Once
	err   error
	mu    sync.Mutex
}

// StartContention starts readers goroutines reading path with O_DIRECT in
// blockKB pieces (defaults: 1 reader, 1024 KB), and records it in the
// ground truth.
func (l *Lab) StartContention(path string, readers, blockKB int) (*Contention, error) {
	if readers <= 0 {
		readers = 1
	}
	if blockKB <= 0 {
		blockKB = 1024
	}
	path = l.path(path)
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() < int64(blockKB)<<10 {
		return nil, fmt.Errorf("contention file %s is smaller than one %d KB read", path, blockKB)
	}
	c := &Contention{l: l, path: path, stop: make(chan struct{})}
	if err := l.Mark("contention-start", fmt.Sprintf("%s readers=%d block_kb=%d", path, readers, blockKB)); err != nil {
		return nil, err
	}
	for i := 0; i < readers; i++ {
		f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("open %s with O_DIRECT: %w", path, err)
		}
		// O_DIRECT needs an aligned buffer: an anonymous mapping is.
		buf, err := unix.Mmap(-1, 0, blockKB<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			f.Close()
			c.Stop()
			return nil, err
		}
		// Readers start at different offsets so they do not move in lockstep.
		off := (st.Size() / int64(readers) * int64(i)) &^ (int64(blockKB)<<10 - 1)
		c.wg.Add(1)
		go c.loop(f, buf, off, st.Size())
	}
	l.mu.Lock()
	l.cont = append(l.cont, c)
	l.mu.Unlock()
	return c, nil
}

func (c *Contention) loop(f *os.File, buf []byte, off, size int64) {
	defer c.wg.Done()
	defer f.Close()
	defer unix.Munmap(buf)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		n, err := f.ReadAt(buf, off)
		c.bytes.Add(int64(n))
		off += int64(n)
		if errors.Is(err, io.EOF) || off >= size {
			off = 0
			continue
		}
		if err != nil {
			c.mu.Lock()
			c.err = fmt.Errorf("contention read of %s: %w", c.path, err)
			c.mu.Unlock()
			return
		}
	}
}

// Bytes is how much the background readers have read so far.
func (c *Contention) Bytes() int64 { return c.bytes.Load() }

// Stop ends the background readers (idempotent) and returns the first
// read error, if any.
func (c *Contention) Stop() error {
	c.once.Do(func() {
		close(c.stop)
		c.wg.Wait()
		if err := c.l.Mark("contention-stop", fmt.Sprintf("%s bytes=%d", c.path, c.bytes.Load())); err != nil && c.err == nil {
			c.err = err
		}
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
