// Command demo shows what readaheadd does, on the lab (root): a reader of
// a file that turns slow while it reads (+3 ms on every read of the file)
// with the kernel's default window, with readaheadd running, and with the
// best static window, as a short table, the actions readaheadd took, and
// a PNG timeline. `make demo` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/readaheadd/readaheadd/test/bench"
)

func main() {
	out := flag.String("out", "demo-out", "directory for the PNG timeline and the daemon's log")
	verbose := flag.Bool("v", false, "log the benchmark's progress")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "the demo needs root: it creates a slow loop device (FUSE), runs readaheadd (BPF) and sets read_ahead_kb on that device only")
		os.Exit(2)
	}
	if err := run(*out, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(out string, verbose bool) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	logOut := io.Discard
	if verbose {
		logOut = os.Stderr
	}
	// The lab logs through the default logger.
	slog.SetDefault(slog.New(slog.NewTextHandler(logOut, nil)))
	cfg := bench.Config{
		FileMB: 256, RandomMB: 256,
		StaticKB: []int{128, 512, 1024, 2048},
		Warm:     time.Second, DaemonWarm: 5 * time.Second, Measure: 6 * time.Second,
		Sample:  100 * time.Millisecond,
		Cases:   []bench.Case{{Workload: bench.WSeq, Regime: bench.RPermSev}},
		WorkDir: filepath.Join(abs, "work"),
		Log:     slog.New(slog.NewTextHandler(logOut, nil)),
	}
	fmt.Printf("readaheadd demo: a sequential reader of a %d MB file on a lab SSD (150 us, 150 MB/s);\n", cfg.FileMB)
	fmt.Printf("after %v the file turns slow (+3 ms on every read of its extents), as a worn SSD region does.\n", cfg.Warm)
	fmt.Printf("Measuring %d static windows and readaheadd (about a minute)...\n\n", len(cfg.StaticKB))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	g, ok := rep.Group(bench.WSeq, bench.RPermSev)
	if !ok || g.Default() == nil || g.Daemon() == nil || g.Oracle() == nil {
		return fmt.Errorf("the run produced no complete comparison")
	}
	def, dae, best := g.Default(), g.Daemon(), g.Oracle()

	// The worst 0.3 s after the onset and the end of the last dip, so that
	// the table shows what the timeline shows, a late dip included.
	const dipWindow = 300 * time.Millisecond
	worst := func(r *bench.Result) string {
		mbps, at := bench.Worst(r.Timeline, dipWindow, cfg.Sample)
		if at < 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f MB/s at %+.1f s", mbps, at)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\tafter the slowdown\tvs default\tworst 0.3 s\tlast below 90% of best\t")
	fmt.Fprintf(w, "default window (%d KB)\t%.0f MB/s\t1.00x\t%s\t-\t\n", def.KB, def.MBps, worst(def))
	rec := "ends below"
	switch settled := bench.Settled(dae.Timeline, best.MBps, 0.9, cfg.Sample); {
	case settled == 0:
		rec = "never"
	case settled > 0:
		rec = fmt.Sprintf("until %+.1f s", settled)
	}
	fmt.Fprintf(w, "readaheadd (from %d KB)\t%.0f MB/s\t%.2fx\t%s\t%s\t\n", dae.KB, dae.MBps, dae.MBps/def.MBps, worst(dae), rec)
	fmt.Fprintf(w, "best static window (%d KB)\t%.0f MB/s\t%.2fx\t%s\t-\t\n", best.KB, best.MBps, best.MBps/def.MBps, worst(best))
	w.Flush()
	fmt.Printf("\nreadaheadd reached %.0f%% of the best static window without being told the value", 100*dae.MBps/best.MBps)
	device := false
	for _, a := range dae.Actions {
		device = device || strings.HasPrefix(a.Action, "device_window")
	}
	if device {
		fmt.Println(".")
	} else {
		fmt.Println(",\nonly on the slow file's open descriptors: the device's read_ahead_kb stayed where it was.")
	}

	fmt.Println("\nActions readaheadd took (time since the slowdown):")
	n := 0
	for _, a := range bench.DedupeActions(dae.Actions) {
		if a.Result == "applied" {
			continue // the same decision reaching a new descriptor
		}
		n++
		fmt.Printf("  %+6.1f s  %-16s %5d -> %-5d KB  %-8s %s\n", a.At.Seconds(), a.Action, a.FromKB, a.ToKB, a.Result, short(a.Evidence))
	}
	if n == 0 {
		fmt.Println("  none")
	}

	plots, err := bench.Plots(rep, abs)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	for _, p := range plots {
		if strings.HasPrefix(p, "timeline-") {
			fmt.Printf("\nTimeline (throughput per 100 ms, the three runs): %s\n", filepath.Join(abs, p))
		} else {
			_ = os.Remove(filepath.Join(abs, p))
		}
	}
	fmt.Printf("Daemon log: %s\n", filepath.Join(abs, "work"))
	return nil
}

// short keeps an action's evidence to one terminal line.
func short(s string) string {
	const max = 70
	if i := strings.IndexAny(s, ";\n"); i > 0 {
		s = s[:i]
	}
	if len(s) > max {
		s = s[:max-3] + "..."
	}
	return s
}
