package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/readaheadd/readaheadd/test/bench"
	"github.com/readaheadd/readaheadd/test/lab"
)

// matrixOpts are the -matrix mode's flags.
type matrixOpts struct {
	seed       uint64
	n          int
	named      bool
	short      bool
	reportOnly bool
	listOnly   bool
	out, work  string
	measure    time.Duration
	only       string // comma-separated scenario names
	resume     bool   // keep the rows of out's table, run the rest
	redo       []int  // with resume: the runs (1 the first) whose rows run again
}

// runMatrix runs the scenario matrix and returns the exit code: 0 when
// every verdict is met (or reportOnly), 1 on a harness error, 3 on a
// `not met`.
func runMatrix(ctx context.Context, o matrixOpts) int {
	cfg := bench.FullMatrixConfig()
	var scs []lab.MatrixScenario
	var names []string
	if o.short {
		cfg = bench.ShortMatrixConfig()
		scs = bench.ShortMatrixScenarios()
	} else {
		if o.named {
			scs = lab.Named()
		}
		scs = append(scs, lab.Generate(o.seed, o.n)...)
	}
	if o.only != "" {
		want := map[string]bool{}
		for _, n := range strings.Split(o.only, ",") {
			want[strings.TrimSpace(n)] = true
		}
		var keep []lab.MatrixScenario
		for _, s := range scs {
			if want[s.Name] {
				keep = append(keep, s)
			}
		}
		if len(keep) != len(want) {
			fmt.Fprintf(os.Stderr, "-only %s: %d of %d names are scenarios of this set\n", o.only, len(keep), len(want))
			return 1
		}
		scs = keep
	}
	for _, s := range scs {
		names = append(names, s.Name)
	}
	if o.measure > 0 {
		cfg.Measure = o.measure
	}
	fmt.Printf("matrix: %d scenarios (seed %d, n %d, named %v, short %v), arms %s, %v each\n",
		len(scs), o.seed, o.n, o.named, o.short, strings.Join(cfg.ArmNames(), ", "), cfg.Measure)
	fmt.Print(bench.CoverageText(scs))
	for _, s := range scs {
		fmt.Printf("  %s: %s [%s]\n", s.Name, s, strings.Join(s.Classes(), " "))
	}
	if o.listOnly {
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "the matrix needs root: it creates loop devices and FUSE mounts and sets read_ahead_kb")
		return 1
	}
	up, _ := exec.Command("uptime").Output()
	rep := &bench.MatrixReport{
		Started: time.Now(), Command: "benchrun " + strings.Join(os.Args[1:], " "),
		Seed: o.seed, N: o.n, Named: names, Arms: cfg.ArmNames(), Measure: cfg.Measure.Seconds(),
		Planned: len(scs), Uptime: strings.TrimSpace(string(up)),
		Device: fmt.Sprintf("a lab device per scenario: labfs %v latency, %.0f MB/s channel unless the scenario lowers it, %d slots",
			lab.DefaultModel.Latency, lab.DefaultModel.BandwidthMBps, lab.DefaultModel.Slots),
		Coverage: lab.Coverage(scs),
	}
	if o.resume {
		if err := resumeFrom(rep, o.out, &scs, o.redo); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("resumed %s: %d scenarios run already, %d to run\n", o.out, len(rep.Rows), len(scs))
	}
	cfg.WorkDir = o.work
	cfg.DaemonBin = os.Getenv("READAHEADD_BIN")
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	fmt.Println(bench.RowHeader)
	cfg.OnRow = func(r bench.MatrixRow) {
		if len(rep.Runs) > 0 {
			r.Run = len(rep.Runs) - 1
		}
		fmt.Println(bench.RowText(r))
		rep.Put(r, names)
		if o.out != "" {
			if err := bench.WriteMatrix(rep, o.out); err != nil {
				fmt.Fprintln(os.Stderr, "write table:", err)
			}
		}
	}
	_, err := bench.RunMatrix(ctx, cfg, scs)
	if err != nil {
		rep.Error = err.Error()
	}
	if o.out != "" {
		if werr := bench.WriteMatrix(rep, o.out); werr != nil {
			fmt.Fprintln(os.Stderr, "write table:", werr)
			return 1
		}
		fmt.Printf("table written to %s/README.md and matrix.json\n", o.out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "matrix failed:", err)
		return 1
	}
	notMet := 0
	for _, r := range rep.Rows {
		if r.Verdict.Verdict != bench.Met {
			notMet++
		}
	}
	fmt.Printf("%d scenarios: %d met, %d not met\n", len(rep.Rows), len(rep.Rows)-notMet, notMet)
	if notMet > 0 && !o.reportOnly {
		return 3
	}
	return 0
}

// resumeFrom continues the table in out: its rows are kept, and the
// scenarios they ran are taken out of scs.
func resumeFrom(rep *bench.MatrixReport, out string, scs *[]lab.MatrixScenario, redo []int) error {
	b, err := os.ReadFile(filepath.Join(out, "matrix.json"))
	if err != nil {
		return fmt.Errorf("resume: %w (run once without resume to start a table)", err)
	}
	var prev bench.MatrixReport
	if err := json.Unmarshal(b, &prev); err != nil {
		return fmt.Errorf("resume: %s/matrix.json: %w", out, err)
	}
	commit, _ := exec.Command("git", "describe", "--always", "--dirty").Output()
	done, err := rep.Resume(&prev, bench.MatrixRun{Started: time.Now(), Command: "benchrun " + strings.Join(os.Args[1:], " "),
		Commit: strings.TrimSpace(string(commit)), Uptime: rep.Uptime}, redo...)
	if err != nil {
		return err
	}
	var rest []lab.MatrixScenario
	for _, s := range *scs {
		if !done[s.Name] {
			rest = append(rest, s)
		}
	}
	*scs = rest
	return nil
}

// rerenderMatrix writes the table of an earlier run's matrix.json again,
// its descriptions and verdicts recomputed (no root).
func rerenderMatrix(from, out string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	var rep bench.MatrixReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	rep.Rescore()
	if out == "docs/results" {
		out = "docs/results/matrix"
	}
	return bench.WriteMatrix(&rep, out)
}
