package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/readaheadd/readaheadd/test/hdfs"
	"github.com/readaheadd/readaheadd/test/lab"
)

// A matrix scenario's real DataNode (lab.KHDFS): one MiniDFSCluster per
// scenario, its storage on the scenario's lab device, its files written
// through HDFS once and shared by the arms (each arm evicts the block files
// first, as every other file, so that it starts from a cold page cache).

// checkHDFS fails when a scenario has a real DataNode reader and HDFS cannot
// run here (no Maven to build the server, no java), before any lab is made.
func checkHDFS(ctx context.Context, scs []lab.MatrixScenario) error {
	for _, s := range scs {
		for _, r := range s.Readers {
			if r.Kind != lab.KHDFS {
				continue
			}
			if err := hdfs.Check(ctx); err != nil {
				return fmt.Errorf("scenario %s has a real HDFS DataNode reader, which cannot run here: %w", s.Name, err)
			}
			return nil
		}
	}
	return nil
}

// hdfsBlockPath is the HDFS path of reader j's block k.
func hdfsBlockPath(j, k int) string { return fmt.Sprintf("/matrix/r%d-b%d", j, k) }

// startHDFS starts the scenario's DataNode on the lab device, writes reader
// j's blocks through HDFS and returns their block files on the device. The
// clients read every file once (unmeasured), so that the client's and the
// DataNode's code is compiled before the first arm. The caller closes
// e.hdfs.
func (e *mEnv) startHDFS(ctx context.Context, j int, r lab.MatrixReader) ([]string, error) {
	c, err := hdfs.StartWith(ctx, filepath.Join(e.l.Mount, "hdfs"),
		hdfs.Options{LogPath: filepath.Join(e.work, e.sc.Name+"-hdfs.log")})
	if err != nil {
		return nil, fmt.Errorf("start HDFS: %w", err)
	}
	e.hdfs = c
	var blocks []string
	for k := 0; k < r.Blocks; k++ {
		p := hdfsBlockPath(j, k)
		w, err := c.Write(ctx, p, r.FileMB)
		if err != nil {
			return nil, err
		}
		if len(w.Blocks) != 1 {
			return nil, fmt.Errorf("HDFS wrote %s (%d MB) as %d blocks, want one", p, r.FileMB, len(w.Blocks))
		}
		e.hdfsPaths = append(e.hdfsPaths, p)
		blocks = append(blocks, w.Blocks...)
	}
	if _, err := c.Read(ctx, r.Clients, e.hdfsPaths...); err != nil {
		return nil, fmt.Errorf("HDFS warm-up read: %w", err)
	}
	return blocks, nil
}

// hdfsPoll is how often a DataNode reader asks its clients' byte count: a
// measured period's ends are off by at most this much of its bytes.
const hdfsPoll = 100 * time.Millisecond

// hdfsCommandTimeout bounds one stream command. Not the reader's context:
// a command cut short kills the cluster, which the next arms need.
const hdfsCommandTimeout = 2 * time.Minute

// mHDFS is a real DataNode reader: the cluster's clients stream the blocks
// (hdfs.Cluster.StreamStart) until the reader's context ends; delivered is
// their bytes as last polled.
type mHDFS struct {
	c       *hdfs.Cluster
	paths   []string
	clients int
	bytes   atomic.Int64
}

func (h *mHDFS) delivered() int64   { return h.bytes.Load() }
func (h *mHDFS) touches() *touchLog { return nil }

func (h *mHDFS) run(ctx context.Context) (err error) {
	cmd := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), hdfsCommandTimeout)
	}
	cctx, cancel := cmd()
	err = h.c.StreamStart(cctx, h.clients, h.paths...)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := cmd()
		defer cancel()
		p, e := h.c.StreamStop(cctx)
		if e != nil && err == nil {
			err = e
		}
		if e == nil {
			h.bytes.Store(p.Bytes)
		}
	}()
	t := time.NewTicker(hdfsPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cctx, cancel := cmd()
		p, err := h.c.StreamProgress(cctx)
		cancel()
		if err != nil {
			return err
		}
		h.bytes.Store(p.Bytes)
	}
}
