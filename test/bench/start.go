package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/readaheadd/readaheadd/test/lab"
)

// Start conditions: when the slowdown began relative to the reader's open
// and the daemon's start. The lab cases (Result) are all SOnset: the
// reader opened the file on a healthy device, the daemon watching.
const (
	SOnset = lab.StartOnset
	// SBeforeOpen: the daemon runs, the file is slow, then the reader
	// opens it (HDFS opens a block file per read).
	SBeforeOpen = lab.StartBeforeOpen
	// SBeforeDaemon: the file is slow and being read when the daemon
	// starts, with no saved state.
	SBeforeDaemon = lab.StartBeforeDaemon
	// SBeforeDaemonSaved: as SBeforeDaemon, with the state directory an
	// earlier run of the daemon on the slow file left behind.
	SBeforeDaemonSaved = lab.StartSaved
)

// Starts lists the start conditions other than SOnset, in report order.
var Starts = []string{SBeforeOpen, SBeforeDaemon, SBeforeDaemonSaved}

// StartResult is the readaheadd arm of one (workload, regime) under one
// start condition. Static windows do not depend on the start condition:
// the report compares it with the static arms of the onset case.
type StartResult struct {
	Workload string `json:"workload"`
	Regime   string `json:"regime"`
	Start    string `json:"start"`
	// MBps over the measured period, which starts at the open
	// (SBeforeOpen) or the daemon's start (the others).
	MBps float64 `json:"mbps"`
	// FirstActionSec: from the start of the measured period to the
	// daemon's first window action on the file; -1 if none.
	FirstActionSec float64 `json:"first_action_s"`
	// The mmap random reader beside the stream (seq+mmap), over the
	// measured period.
	RandP99ms         float64        `json:"rand_p99_ms,omitempty"`
	RandTouchesPerSec float64        `json:"rand_touches_per_s,omitempty"`
	RandP99PerSec     []float64      `json:"rand_p99_per_s_ms,omitempty"`
	DaemonRegimes     []string       `json:"daemon_regimes,omitempty"`
	Actions           []ActionRecord `json:"actions,omitempty"`
	DaemonLog         string         `json:"daemon_log,omitempty"`
	// Note says what else the run saw (the state an earlier run saved, the
	// onset's time).
	Note string `json:"note,omitempty"`
	// Runs: each run's figures when the row is the median of several.
	Runs []RunFigures `json:"runs,omitempty"`
}

// teachFor is how long the earlier run of SBeforeDaemonSaved reads the slow
// file before it is stopped (its state saved).
const teachFor = 6 * time.Second

// runStart runs the readaheadd arm of case c under start condition start.
func (e *labEnv) runStart(ctx context.Context, c Case, start string) (res StartResult, err error) {
	res = StartResult{Workload: c.Workload, Regime: c.Regime, Start: start, FirstActionSec: -1}
	if err := e.reset(); err != nil {
		return res, err
	}
	if err := e.l.SetReadAheadKB(DefaultKB); err != nil {
		return res, err
	}
	var cont *lab.Contention
	defer func() {
		if cont != nil {
			if e2 := cont.Stop(); e2 != nil && err == nil {
				err = e2
			}
		}
		if e2 := e.l.Clear(); e2 != nil && err == nil {
			err = e2
		}
		if e2 := e.l.SetReadAheadKB(DefaultKB); e2 != nil && err == nil {
			err = e2
		}
	}()
	file := e.seq
	if c.Regime == RIntrinsic {
		file = e.fragA
	}
	stop := func(d *Daemon) error {
		if e2 := d.Stop(); e2 != nil {
			return e2
		}
		if kb, e2 := e.l.ReadAheadKB(); e2 == nil && kb != DefaultKB {
			return fmt.Errorf("readaheadd left read_ahead_kb at %d after SIGTERM (want %d restored)", kb, DefaultKB)
		}
		return nil
	}
	slow := func() error {
		c2, err := e.regime(ctx, c.Regime, file, time.Now(), &events{})
		if c2 != nil {
			cont = c2
		}
		return err
	}
	// The mixed device's random reader is a service that runs all along:
	// opened at the default window before anything else, it reads beside
	// the stream through every phase (the earlier run of a saved state
	// too).
	var rnd *mmapRandom
	rctxR, stopRandom := context.WithCancel(ctx)
	defer stopRandom()
	var wgR sync.WaitGroup
	var rndErr error
	if c.Workload == WMixed {
		if rnd, err = openMmapRandom(e.rnd); err != nil {
			return res, err
		}
		rnd.reopen = e.cfg.RandomReopen
		defer rnd.Close()
		wgR.Add(1)
		go func() {
			defer wgR.Done()
			if err := rnd.run(rctxR, 42); err != nil {
				rndErr = fmt.Errorf("random reader: %w", err)
			}
		}()
		defer wgR.Wait()
		defer stopRandom()
	}
	stateDir := ""
	if start == SBeforeDaemonSaved {
		// The earlier run: the daemon on the slow file, then SIGTERM.
		if stateDir, err = os.MkdirTemp(e.work, "state-saved-"); err != nil {
			return res, err
		}
		if err := slow(); err != nil {
			return res, err
		}
		d, err := StartDaemonState(ctx, e.cfg.DaemonBin, e.l.Name, e.l.Mount, e.work, stateDir)
		if err != nil {
			return res, err
		}
		if _, err := e.read(ctx, file, c.Workload == WSendfile, teachFor); err != nil {
			d.Stop()
			return res, err
		}
		if err := stop(d); err != nil {
			return res, err
		}
		if err := lab.DropFileCache(file); err != nil {
			return res, err
		}
	}

	var d *Daemon
	var mStart time.Time
	var b0 int64 // reader's bytes at the start of the measured period
	var s *seqStream
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	rctx, stopReader := context.WithCancel(ctx)
	defer stopReader()
	var wg sync.WaitGroup
	var readErr error
	startReader := func() error {
		var err error
		if s, err = openSeqStream(file, c.Workload == WSendfile); err != nil {
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); readErr = s.run(rctx) }()
		return nil
	}
	switch start {
	case SBeforeOpen:
		if d, err = StartDaemon(ctx, e.cfg.DaemonBin, e.l.Name, e.l.Mount, e.work); err != nil {
			return res, err
		}
		if err := slow(); err != nil {
			d.Stop()
			return res, err
		}
		time.Sleep(time.Second)
		mStart = time.Now()
		if err := startReader(); err != nil {
			d.Stop()
			return res, err
		}
	case SBeforeDaemon, SBeforeDaemonSaved:
		if start == SBeforeDaemon { // the saved run's regime is still on
			if err := slow(); err != nil {
				return res, err
			}
		}
		if err := startReader(); err != nil {
			return res, err
		}
		time.Sleep(time.Second)
		mStart, b0 = time.Now(), s.bytes.Load()
		if d, err = StartDaemonState(ctx, e.cfg.DaemonBin, e.l.Name, e.l.Mount, e.work, stateDir); err != nil {
			return res, err
		}
	default:
		return res, fmt.Errorf("unknown start condition %q", start)
	}
	res.DaemonLog = d.LogPath
	select {
	case <-ctx.Done():
	case <-time.After(e.cfg.Measure):
	}
	elapsed := time.Since(mStart)
	b1 := s.bytes.Load()
	stopReader()
	wg.Wait()
	if rnd != nil {
		stopRandom()
		wgR.Wait()
		if rndErr != nil {
			return res, rndErr
		}
		lat := rnd.since(mStart)
		res.RandP99ms = ms(lab.Quantile(lat, 0.99))
		res.RandP99PerSec = rnd.p99PerSecond(mStart)
		res.RandTouchesPerSec = float64(len(lat)) / elapsed.Seconds()
	}
	res.Actions = d.Actions(mStart)
	res.DaemonRegimes = d.Regimes()
	if err := stop(d); err != nil {
		return res, err
	}
	if readErr != nil {
		return res, readErr
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	res.MBps = float64(b1-b0) / elapsed.Seconds() / 1e6
	res.FirstActionSec = firstFileAction(res.Actions, file, fileIno(file))
	return res, nil
}

// fileIno is "/INO" for file's inode number (how the daemon names a file
// whose path it did not resolve), "" if file cannot be read.
func fileIno(file string) string {
	if st, err := os.Stat(file); err == nil {
		return fmt.Sprintf("/%d", st.Sys().(*syscall.Stat_t).Ino)
	}
	return ""
}

// firstFileAction is the At, in seconds, of the daemon's first window
// decision on file (named by its path or ending in ino) in the measured
// period (At >= 0; a daemon warmed up on the same file acted before it), -1
// if none. A decision re-applied to a later descriptor ("applied") is not a
// new one.
func firstFileAction(acts []ActionRecord, file, ino string) float64 {
	for _, a := range acts {
		if a.At >= 0 && a.Action == "file_window" && a.Result != "applied" && (a.Target == file || ino != "" && strings.HasSuffix(a.Target, ino)) {
			return a.At.Seconds()
		}
	}
	return -1
}

// read reads file for dur with a fresh open and returns the bytes read.
func (e *labEnv) read(ctx context.Context, file string, sendfile bool, dur time.Duration) (int64, error) {
	s, err := openSeqStream(file, sendfile)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	rctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	err = s.run(rctx)
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	_ = err // the deadline ends the read
	return s.bytes.Load(), nil
}
