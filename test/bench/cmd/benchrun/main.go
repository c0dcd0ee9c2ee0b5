// Command benchrun runs readaheadd's benchmark matrix on the lab (as root)
// and writes the report and plots: `make bench` runs it with -full.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/readaheadd/readaheadd/test/bench"
	"github.com/readaheadd/readaheadd/test/hdfs"
)

func main() {
	bench.NSStreamMain() // when this process is a matrix stream in its own mount namespace
	full := flag.Bool("full", false, "the full matrix (256 MB files, every static value, HDFS)")
	out := flag.String("out", "docs/results", "directory for README.md, results.json and the PNG plots")
	noHDFS := flag.Bool("no-hdfs", false, "skip the real-HDFS cases")
	onlyHDFS := flag.Bool("only-hdfs", false, "run the real-HDFS cases only")
	work := flag.String("work", "", "keep daemon logs here (default: a temporary directory)")
	from := flag.String("from", "", "only re-render the report and plots from a results.json of an earlier run")
	workload := flag.String("workload", "", "run only this workload's cases (seq, sendfile, seq+mmap), for a quick look; the report then holds only those")
	regimes := flag.String("regimes", "", "comma-separated regimes: run only these cases; permanent+<duration> (permanent+2ms, say) runs a permanent slowdown of that severity")
	starts := flag.Bool("starts", false, "also run readaheadd under the start conditions slow-before-open, slow-before-daemon and slow-before-daemon-saved (seq and sendfile cases)")
	reps := flag.Int("mixed-reps", -1, "run each seq+mmap row this many times, interleaved, and report the medians (default: 3 with -full, 1 otherwise)")
	reopen := flag.Bool("random-reopen", false, "the seq+mmap rows' random reader closes and re-opens its file at every eviction (every 250 ms), as a service that opens its index per batch")
	measure := flag.Duration("measure", 0, "how long readers read after each onset (default: 8s with -full, 5s otherwise): a longer one shows what a kept window does after the first seconds")
	matrix := flag.Bool("matrix", false, "run the scenario matrix instead (see -seed, -n); writes its table to -out (default docs/results/matrix)")
	seed := flag.Uint64("seed", 1, "matrix: the generator's seed")
	n := flag.Int("n", 10, "matrix: how many generated scenarios")
	named := flag.Bool("named", true, "matrix: run the named scenarios (lab.Named) before the generated ones")
	shortMatrix := flag.Bool("short-matrix", false, "matrix: CI's short set (two named scenarios, the default, 512 KB and readaheadd)")
	reportOnly := flag.Bool("report-only", false, "matrix: exit 0 on `not met` verdicts (still 1 on harness errors)")
	only := flag.String("only", "", "matrix: run only these scenarios (comma-separated names, of the named and generated set)")
	resume := flag.Bool("resume", false, "matrix: keep the rows of the table in -out (same seed, n, named) and run only the scenarios it lacks")
	redo := flag.String("redo", "", "matrix, with -resume: run again the rows of these runs of the table (comma-separated run numbers, 1 the first, as its `run` column shows)")
	list := flag.Bool("list", false, "matrix: print the scenarios and the classes they cover, run nothing")
	flag.Parse()
	if *matrix && *from != "" {
		if err := rerenderMatrix(*from, *out); err != nil {
			fmt.Fprintln(os.Stderr, "re-render:", err)
			os.Exit(1)
		}
		return
	}
	if *matrix {
		var redoRuns []int
		for _, f := range strings.FieldsFunc(*redo, func(r rune) bool { return r == ',' }) {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "-redo %s: %q is not a run number (1 the first)\n", *redo, f)
				os.Exit(1)
			}
			redoRuns = append(redoRuns, n)
		}
		if len(redoRuns) > 0 && !*resume {
			fmt.Fprintln(os.Stderr, "-redo runs rows of a table again: use it with -resume")
			os.Exit(1)
		}
		o := matrixOpts{redo: redoRuns, seed: *seed, n: *n, named: *named, short: *shortMatrix, reportOnly: *reportOnly,
			listOnly: *list, only: *only, out: *out, work: *work, measure: *measure, resume: *resume}
		if o.out == "docs/results" {
			o.out = "docs/results/matrix"
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		code := runMatrix(ctx, o)
		stop()
		os.Exit(code)
	}
	if *from != "" {
		b, err := os.ReadFile(*from)
		if err == nil {
			var rep bench.Report
			if err = json.Unmarshal(b, &rep); err == nil {
				rep.Rescore()
				err = bench.Write(&rep, *out)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "re-render:", err)
			os.Exit(1)
		}
		return
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "benchrun needs root: it creates a loop device and a FUSE mount and sets read_ahead_kb")
		os.Exit(2)
	}
	cfg := bench.ShortConfig()
	if *full {
		cfg = bench.FullConfig()
	}
	if hdfs.Enabled() {
		cfg.HDFS = true
	}
	cfg.RandomReopen = *reopen
	if *measure > 0 {
		cfg.Measure = *measure
	}
	if *noHDFS {
		cfg.HDFS = false
	}
	if *onlyHDFS {
		cfg.Cases, cfg.HDFS = nil, true
	}
	if *workload != "" {
		var keep []bench.Case
		for _, c := range cfg.Cases {
			if c.Workload == *workload {
				keep = append(keep, c)
			}
		}
		if len(keep) == 0 {
			fmt.Fprintf(os.Stderr, "no case of workload %q in this matrix\n", *workload)
			os.Exit(2)
		}
		cfg.Cases, cfg.HDFS = keep, false
	}
	if *regimes != "" {
		want := map[string]bool{}
		for _, r := range strings.Split(*regimes, ",") {
			want[strings.TrimSpace(r)] = true
		}
		var keep []bench.Case
		for _, c := range cfg.Cases {
			if want[c.Regime] {
				keep = append(keep, c)
			}
		}
		// A permanent slowdown of another severity (permanent+2ms, say)
		// runs in every workload the matrix runs permanent slowdowns in.
		for r := range want {
			if _, ok := bench.PermanentExtra(r); !ok || *onlyHDFS || slices.ContainsFunc(keep, func(c bench.Case) bool { return c.Regime == r }) {
				continue
			}
			if slices.ContainsFunc(bench.FullConfig().Cases, func(c bench.Case) bool { return c.Regime == r }) {
				continue // a regime of the matrix: its cases are the matrix's
			}
			for _, w := range []string{bench.WSeq, bench.WSendfile, bench.WMixed} {
				if *workload == "" || *workload == w {
					keep = append(keep, bench.Case{Workload: w, Regime: r})
				}
			}
		}
		if len(keep) == 0 && !cfg.HDFS {
			fmt.Fprintf(os.Stderr, "no case of regimes %q in this matrix\n", *regimes)
			os.Exit(2)
		}
		cfg.Cases = keep
		for r := range want {
			cfg.HDFSRegimes = append(cfg.HDFSRegimes, r)
		}
	}
	if *starts {
		cfg.Starts = bench.Starts
	}
	if *reps >= 0 {
		cfg.MixedReps = *reps
	}
	cfg.WorkDir = *work
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	// SIGINT/SIGTERM cancel the run; Run tears down daemons, clusters and labs.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, cfg)
	if rep != nil {
		rep.Short = !*full
		fmt.Print(rep.Summary())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmark failed:", err)
		os.Exit(1)
	}
	if err := bench.Write(rep, *out); err != nil {
		fmt.Fprintln(os.Stderr, "write report:", err)
		os.Exit(1)
	}
	fmt.Printf("report written to %s/README.md\n", *out)
}
