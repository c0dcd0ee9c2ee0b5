package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/readaheadd/readaheadd/test/hdfs"
	"github.com/readaheadd/readaheadd/test/lab"
)

// hdfsEnv is a running MiniDFSCluster on its lab device and the files
// written to it.
type hdfsEnv struct {
	cfg    Config
	l      *lab.Lab
	c      *hdfs.Cluster
	work   string
	paths  []string // HDFS files
	blocks []string // their block files on the lab device
}

// drop evicts every block file from the page cache, so the next read
// reaches the device.
func (h *hdfsEnv) drop() error {
	for _, b := range h.blocks {
		if err := lab.DropFileCache(b); err != nil {
			return err
		}
	}
	return nil
}

// hdfsOnsetAfter is how far into the client's read the block file slows
// down in the onset start condition.
const hdfsOnsetAfter = 500 * time.Millisecond

// hdfsStarts returns the start conditions the single-client HDFS cases run
// the readaheadd arm in besides their main arm, which already is
// SBeforeOpen (the DataNode opens the block file per read, after the
// slowdown began). SOnset is the slowdown beginning during the read; none
// run when starts is empty.
func hdfsStarts(starts []string) []string {
	if len(starts) == 0 {
		return nil
	}
	out := []string{SOnset}
	for _, s := range starts {
		if s != SBeforeOpen && s != SOnset {
			out = append(out, s)
		}
	}
	return out
}

// runStart runs the readaheadd arm of the single-client HDFS case (the
// first file, one block, slowed by extra) under start condition start. The
// measured period is the client's whole read of the file, as in the main
// arm; its throughput is the client's.
func (h *hdfsEnv) runStart(ctx context.Context, regime string, extra time.Duration, start string) (res StartResult, err error) {
	res = StartResult{Workload: WHDFS, Regime: regime, Start: start, FirstActionSec: -1}
	l, cfg := h.l, h.cfg
	path, block := h.paths[0], h.blocks[0]
	if err := l.Clear(); err != nil {
		return res, err
	}
	if err := l.SetReadAheadKB(DefaultKB); err != nil {
		return res, err
	}
	defer func() {
		if e := l.Clear(); e != nil && err == nil {
			err = e
		}
		if e := l.SetReadAheadKB(DefaultKB); e != nil && err == nil {
			err = e
		}
	}()
	stop := func(d *Daemon) error {
		if e := d.Stop(); e != nil {
			return e
		}
		if kb, e := l.ReadAheadKB(); e == nil && kb != DefaultKB {
			return fmt.Errorf("readaheadd left read_ahead_kb at %d after SIGTERM (want %d restored)", kb, DefaultKB)
		}
		return nil
	}
	slow := func() error { return l.SetPermanent(extra, block) }
	// readFor reads the file whole, from the device, until dur has passed
	// (at least once).
	readFor := func(dur time.Duration) error {
		for t0 := time.Now(); ; {
			if err := h.drop(); err != nil {
				return err
			}
			if _, err := h.c.Read(ctx, 1, path); err != nil {
				return err
			}
			if time.Since(t0) >= dur {
				return nil
			}
		}
	}
	var d *Daemon
	defer func() {
		if d != nil {
			if e := stop(d); e != nil && err == nil {
				err = e
			}
		}
	}()
	stateDir := ""
	switch start {
	case SOnset:
		// As the main arm: the daemon learns on healthy reads first.
		if d, err = StartDaemon(ctx, cfg.DaemonBin, l.Name, l.Mount, h.work); err != nil {
			return res, err
		}
		if err := readFor(cfg.DaemonWarm); err != nil {
			return res, err
		}
	case SBeforeDaemon:
		if err := slow(); err != nil {
			return res, err
		}
	case SBeforeDaemonSaved:
		if stateDir, err = os.MkdirTemp(h.work, "state-saved-"); err != nil {
			return res, err
		}
		if err := slow(); err != nil {
			return res, err
		}
		// The earlier run: a daemon with a fresh state directory watches
		// reads of the slow block, then SIGTERM saves its state.
		teach, err := StartDaemonState(ctx, cfg.DaemonBin, l.Name, l.Mount, h.work, stateDir)
		if err != nil {
			return res, err
		}
		if err := readFor(teachFor); err != nil {
			teach.Stop()
			return res, err
		}
		if err := stop(teach); err != nil {
			return res, err
		}
		res.Note = fmt.Sprintf("earlier run's log %s; state it saved: %s", teach.LogPath, stateFiles(stateDir))
	default:
		return res, fmt.Errorf("unknown HDFS start condition %q", start)
	}
	if d == nil {
		// No warm-up: the client's read follows the daemon's start at once.
		if d, err = StartDaemonState(ctx, cfg.DaemonBin, l.Name, l.Mount, h.work, stateDir); err != nil {
			return res, err
		}
	}
	res.DaemonLog = d.LogPath
	if err := h.drop(); err != nil {
		return res, err
	}
	mStart := time.Now()
	var rr hdfs.ReadResult
	if start == SOnset {
		type out struct {
			rr  hdfs.ReadResult
			err error
		}
		done := make(chan out, 1)
		go func() {
			r, err := h.c.Read(ctx, 1, path)
			done <- out{r, err}
		}()
		select {
		case o := <-done:
			if o.err != nil {
				return res, o.err
			}
			return res, fmt.Errorf("the read ended %s after its start, before the onset at %s", time.Since(mStart).Round(time.Millisecond), hdfsOnsetAfter)
		case <-time.After(hdfsOnsetAfter):
		}
		serr := slow()
		onset, d0 := time.Now(), mustDev(l.Name)
		o := <-done
		end, d1 := time.Now(), mustDev(l.Name)
		if serr != nil {
			return res, serr
		}
		if o.err != nil {
			return res, o.err
		}
		rr = o.rr
		res.Note = fmt.Sprintf("slowed %.2f s into the read; the device read %.1f MB/s from the onset to the read's end (%.0f MB)",
			onset.Sub(mStart).Seconds(), float64(d1-d0)/end.Sub(onset).Seconds()/1e6, float64(d1-d0)/1e6)
	} else if rr, err = h.c.Read(ctx, 1, path); err != nil {
		return res, err
	}
	res.Actions = d.Actions(mStart)
	res.DaemonRegimes = d.Regimes()
	err = stop(d)
	d = nil
	if err != nil {
		return res, err
	}
	res.MBps = rr.MBps
	res.FirstActionSec = firstFileAction(res.Actions, block, fileIno(block))
	return res, nil
}

// stateFiles lists a state directory's files with their sizes.
func stateFiles(dir string) string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	var out []string
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && !e.IsDir() {
			out = append(out, fmt.Sprintf("%s (%d B)", e.Name(), fi.Size()))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}
