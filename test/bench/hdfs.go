package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/readaheadd/readaheadd/pkg/clock"
	"github.com/readaheadd/readaheadd/test/hdfs"
	"github.com/readaheadd/readaheadd/test/lab"
)

// runHDFS measures a real, unmodified MiniDFSCluster whose DataNode stores
// its blocks on a lab device: one client reading one 256 MB block, and
// several clients reading one block each at once. The DataNode opens the
// block file for each read, so the readaheadd arm acts on files opened
// after the regime's onset (per-file decisions reach new opens). With start
// conditions asked for, the single-client cases under a slowdown also run
// the readaheadd arm slowed during the read, before the daemon's start and
// before a restart with saved state (hdfsEnv.runStart).
func runHDFS(ctx context.Context, cfg Config, work string, rep *Report) (err error) {
	n := cfg.HDFSReaders
	l, err := lab.Up(lab.Options{SizeBytes: int64((n+1)*cfg.FileMB+1024) << 20})
	if err != nil {
		return fmt.Errorf("lab up for HDFS: %w", err)
	}
	defer func() {
		if e := l.Down(); e != nil && err == nil {
			err = fmt.Errorf("lab down: %w", e)
		}
	}()
	cfg.Log.Info("starting MiniDFSCluster on the lab", "dir", l.Mount)
	c, err := hdfs.StartWith(ctx, filepath.Join(l.Mount, "hdfs"), hdfs.Options{LogPath: filepath.Join(work, "hdfs.log")})
	if err != nil {
		return fmt.Errorf("start HDFS: %w", err)
	}
	defer func() {
		if e := c.Close(); e != nil && err == nil {
			err = fmt.Errorf("close HDFS: %w", e)
		}
	}()
	var paths, blocks []string
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("/bench/f%d", i)
		w, err := c.Write(ctx, p, cfg.FileMB)
		if err != nil {
			return err
		}
		paths = append(paths, p)
		blocks = append(blocks, w.Blocks...)
	}
	he := &hdfsEnv{cfg: cfg, l: l, c: c, work: work, paths: paths, blocks: blocks}
	drop := he.drop
	// JIT warm-up of the client and the DataNode.
	if err := drop(); err != nil {
		return err
	}
	if _, err := c.Read(ctx, 1, paths[0]); err != nil {
		return err
	}

	type hcase struct {
		workload, regime string
		extra            time.Duration
		readers          int
	}
	cases := []hcase{
		{WHDFS, RHealthy, 0, 1},
		{WHDFS, RPerm, 1500 * time.Microsecond, 1},
		{WHDFS, RPermSev, 3 * time.Millisecond, 1},
		{WHDFSConc, RPermSev, 3 * time.Millisecond, n},
	}
	for _, r := range cfg.HDFSRegimes {
		// Another severity than the matrix's: one client reads its block.
		if extra, ok := PermanentExtra(r); ok && !slices.ContainsFunc(cases, func(hc hcase) bool { return hc.regime == r }) {
			cases = append(cases, hcase{WHDFS, r, extra, 1})
		}
	}
	for _, hc := range cases {
		if len(cfg.HDFSRegimes) > 0 && !slices.Contains(cfg.HDFSRegimes, hc.regime) {
			continue
		}
		for _, arm := range cfg.Arms() {
			if err := ctx.Err(); err != nil {
				return err
			}
			cfg.Log.Info("run", "workload", hc.workload, "regime", hc.regime, "arm", arm.Name)
			r, err := func() (res Result, err error) {
				res = Result{Workload: hc.workload, Regime: hc.regime, Arm: arm.Name, KB: arm.KB}
				defer func() {
					if e := l.Clear(); e != nil && err == nil {
						err = e
					}
					if e := l.SetReadAheadKB(DefaultKB); e != nil && err == nil {
						err = e
					}
				}()
				if err := l.Clear(); err != nil {
					return res, err
				}
				if err := l.SetReadAheadKB(arm.KB); err != nil {
					return res, err
				}
				var d *Daemon
				if arm.Daemon {
					if d, err = StartDaemon(ctx, cfg.DaemonBin, l.Name, l.Mount, work); err != nil {
						return res, err
					}
					res.DaemonLog = d.LogPath
					defer func() {
						if e := d.Stop(); e != nil && err == nil {
							err = e
						}
					}()
					// Healthy reads first: the daemon learns its baselines.
					for t0 := time.Now(); time.Since(t0) < cfg.DaemonWarm; {
						if err := drop(); err != nil {
							return res, err
						}
						if _, err := c.Read(ctx, 1, paths[0]); err != nil {
							return res, err
						}
					}
				}
				if err := drop(); err != nil {
					return res, err
				}
				ev := &events{}
				onset := time.Now()
				onsetMono := clock.Monotonic{}.Now()
				if hc.extra > 0 {
					ev.add(onset, fmt.Sprintf("permanent +%s", hc.extra))
					if err := l.SetPermanent(hc.extra, blocks[:hc.readers]...); err != nil {
						return res, err
					}
				}
				capt, perr := startCapture(l.Dev)
				if perr != nil {
					res.Note = fmt.Sprintf("probe unavailable (%v)", perr)
				}
				defer capt.stop()
				smp := &sampler{}
				sctx, stop := context.WithCancel(ctx)
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					smp.run(sctx, cfg.Sample, l.Name, func() int64 { return int64(mustDev(l.Name)) })
				}()
				d0 := mustDev(l.Name)
				rr, err := c.Read(ctx, hc.readers, paths[:hc.readers]...)
				d1 := mustDev(l.Name)
				stop()
				wg.Wait()
				if err != nil {
					return res, err
				}
				res.MBps = rr.MBps
				res.ReaderMB = float64(rr.Bytes) / 1e6
				res.DevMB = float64(d1-d0) / 1e6
				res.Timeline = smp.points(onset)
				res.Events = ev.ev
				if capt != nil {
					ls := splitRecords(capt.stop(), onsetMono)
					res.P50ms, res.P99ms = ms(lab.Quantile(ls.post, 0.5)), ms(lab.Quantile(ls.post, 0.99))
					res.LatPostMs = thin(ls.post, 400)
				}
				if d != nil {
					res.Actions = d.Actions(onset)
					res.DaemonRegimes = d.Regimes()
					if res.ActionsTotal, err = d.ActionsTotal(); err != nil {
						return res, err
					}
					if res.Usage, err = d.Usage(); err != nil {
						return res, err
					}
				}
				return res, nil
			}()
			if err != nil {
				return fmt.Errorf("%s/%s/%s: %w", hc.workload, hc.regime, arm.Name, err)
			}
			cfg.Log.Info("result", "workload", hc.workload, "regime", hc.regime, "arm", arm.Name,
				"mbps", fmt.Sprintf("%.1f", r.MBps), "actions", len(r.Actions))
			rep.add(r)
		}
		if hc.workload != WHDFS || hc.extra == 0 {
			continue
		}
		for _, st := range hdfsStarts(cfg.Starts) {
			if err := ctx.Err(); err != nil {
				return err
			}
			cfg.Log.Info("run", "workload", hc.workload, "regime", hc.regime, "start", st)
			r, err := he.runStart(ctx, hc.regime, hc.extra, st)
			if err != nil {
				return fmt.Errorf("%s/%s/%s: %w", hc.workload, hc.regime, st, err)
			}
			cfg.Log.Info("result", "workload", hc.workload, "regime", hc.regime, "start", st,
				"mbps", fmt.Sprintf("%.1f", r.MBps), "first_action_s", fmt.Sprintf("%.2f", r.FirstActionSec))
			rep.Starts = append(rep.Starts, r)
		}
	}
	return nil
}
