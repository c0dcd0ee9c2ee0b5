package reliability

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"

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
		_ = lab.DropFileCache(path)
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
