package reliability

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/test/lab"
)

// readLoop reads path sequentially with 64 KB reads, again and again (a
// new open per pass, as a DataNode opens a block file per read, with the
// file evicted first so every pass reads the device), until ctx ends.
// Errors from files that vanished are expected under churn and end the
// loop quietly.
func readLoop(ctx context.Context, path string, bytes *atomic.Int64) error {
	buf := make([]byte, lab.SeqBlock)
	for ctx.Err() == nil {
		if err := lab.DropFileCache(path); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		for ctx.Err() == nil {
			n, err := f.Read(buf)
			bytes.Add(int64(n))
			if err == io.EOF {
				break
			}
			if err != nil {
				f.Close()
				return err
			}
		}
		f.Close()
	}
	return nil
}

var sinkByte atomic.Uint32

// randomRead evicts path, maps it, touches random pages for d (a service
// reading an index), and returns the touches and the bytes the faults
// brought into the page cache (mincore after minus before: what this reader
// made the device read).
func randomRead(ctx context.Context, path string, d time.Duration, seed uint64) (touches, deviceBytes int64, err error) {
	if err := lab.DropFileCache(path); err != nil {
		return 0, 0, err
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	size := int(st.Size())
	data, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, fmt.Errorf("mmap %s: %w", path, err)
	}
	defer unix.Munmap(data)
	before, err := resident(data)
	if err != nil {
		return 0, 0, fmt.Errorf("mincore %s: %w", path, err)
	}
	rng := rand.New(rand.NewPCG(seed, 11))
	pages := int64(size / 4096)
	var sink byte
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; touches++ {
		sink ^= data[rng.Int64N(pages)*4096]
	}
	sinkByte.Store(uint32(sink)) // keeps the loads from being optimised away
	after, err := resident(data)
	if err != nil {
		return touches, 0, fmt.Errorf("mincore %s: %w", path, err)
	}
	return touches, after - before, nil
}

// resident is how many bytes of the mapping are in the page cache.
func resident(data []byte) (int64, error) {
	vec := make([]byte, (len(data)+4095)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, e
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n += 4096
		}
	}
	return n, nil
}

// smallFiles writes batches of small files in dir, each batch synced at
// once and evicted, then reads every file once from the device: many
// distinct files, as block files accumulate on a DataNode, so the
// detector's file table reaches its cap. It keeps at most keep files
// (the oldest are deleted) and returns how many it created.
func smallFiles(ctx context.Context, dir string, kb, perSec, keep int, created, bytes *atomic.Int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data := make([]byte, kb<<10)
	var live []string
	const batch = 50
	tick := time.NewTicker(time.Second * batch / time.Duration(perSec))
	defer tick.Stop()
	for n := 0; ; {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		var paths []string
		for i := 0; i < batch; i++ {
			p := filepath.Join(dir, fmt.Sprintf("s%07d", n))
			n++
			data[0], data[1], data[2] = byte(n), byte(n>>8), byte(n>>16)
			if err := os.WriteFile(p, data, 0o644); err != nil {
				return err
			}
			paths = append(paths, p)
		}
		d, err := os.Open(dir)
		if err != nil {
			return err
		}
		err = unix.Syncfs(int(d.Fd()))
		d.Close()
		if err != nil {
			return fmt.Errorf("syncfs %s: %w", dir, err)
		}
		for _, p := range paths {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
				f.Close()
				return err
			}
			m, err := io.Copy(io.Discard, f)
			f.Close()
			if err != nil {
				return err
			}
			bytes.Add(m)
			created.Add(1)
		}
		live = append(live, paths...)
		for len(live) > keep {
			if err := os.Remove(live[0]); err != nil {
				return err
			}
			live = live[1:]
		}
	}
}

// sectorsRead is field 3 of /sys/block/DEV/stat: 512-byte sectors read.
func sectorsRead(dev string) (uint64, error) {
	b, err := os.ReadFile("/sys/block/" + dev + "/stat")
	if err != nil {
		return 0, err
	}
	var reads, merged, sectors uint64
	if _, err := fmt.Sscan(string(b), &reads, &merged, &sectors); err != nil {
		return 0, fmt.Errorf("parse /sys/block/%s/stat: %w", dev, err)
	}
	return sectors, nil
}

// group runs functions until Wait.
type group struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func (g *group) Go(f func() error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := f(); err != nil && !errors.Is(err, context.Canceled) {
			g.mu.Lock()
			g.errs = append(g.errs, err)
			g.mu.Unlock()
		}
	}()
}

func (g *group) Wait() error {
	g.wg.Wait()
	return errors.Join(g.errs...)
}
