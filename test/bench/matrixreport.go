package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/readaheadd/readaheadd/test/lab"
)

// MatrixReport is a matrix run: how it ran and its rows so far.
type MatrixReport struct {
	Started  time.Time      `json:"started"`
	Command  string         `json:"command"`
	Seed     uint64         `json:"seed"`
	N        int            `json:"n"`
	Named    []string       `json:"named,omitempty"`
	Arms     []string       `json:"arms"`
	Measure  float64        `json:"measure_s"`
	Planned  int            `json:"planned"`
	LoadAt   string         `json:"load_at_start"` // /proc/loadavg
	Uptime   string         `json:"uptime"`
	Device   string         `json:"device"`
	Coverage map[string]int `json:"coverage"`
	Rows     []MatrixRow    `json:"rows"`
	// Runs: the runs whose rows the table holds, when a later run resumed
	// an earlier one (-resume); a row's Run indexes it (0: the report's own).
	Runs []MatrixRun `json:"runs,omitempty"`
	// Error: the harness error that ended the run early, if any.
	Error string `json:"error,omitempty"`
}

// ArmNames lists the arms cfg runs, in order.
func (c MatrixConfig) ArmNames() []string {
	out := []string{Static(DefaultKB).Name}
	for _, kb := range c.StaticKB {
		if kb != DefaultKB {
			out = append(out, Static(kb).Name)
		}
	}
	out = append(out, Readaheadd.Name)
	if c.DefaultTwice {
		out = append(out, Static(DefaultKB).Name+" (again)")
	}
	return out
}

// CoverageText says which classes scs cover and which none does.
func CoverageText(scs []lab.MatrixScenario) string {
	cov := lab.Coverage(scs)
	var have, missing []string
	for _, c := range lab.AllClasses {
		if cov[c] > 0 {
			have = append(have, fmt.Sprintf("%s %d", c, cov[c]))
		} else {
			missing = append(missing, c)
		}
	}
	s := "classes covered: " + strings.Join(have, ", ") + "\n"
	if len(missing) > 0 {
		s += "classes not covered: " + strings.Join(missing, ", ") + "\n"
	} else {
		s += "every class covered\n"
	}
	return s
}

func kbName(kb int) string { return fmt.Sprintf("%d KB", kb) }

func ratios(xs []float64) string {
	var p []string
	for _, x := range xs {
		p = append(p, fmt.Sprintf("%.2f", x))
	}
	if len(p) == 0 {
		return "-"
	}
	return strings.Join(p, "/")
}

// RowHeader and RowText are the printed table's header and one row.
const RowHeader = "scenario | what | default MB/s (spread) | best static | best admissible | readaheadd | readers (rate; p99; worst s) | actions (kept), first, CPU | verdict"

// RowText formats one row (also the Markdown table's).
func RowText(r MatrixRow) string {
	v := r.Verdict
	var dm MatrixArm
	for _, a := range r.Arms {
		if a.Daemon {
			dm = a
		}
	}
	first := "-"
	if dm.FirstActionSec >= 0 {
		first = fmt.Sprintf("%.1f s", dm.FirstActionSec)
	}
	readers := "-"
	if len(v.RandRate) > 0 {
		readers = fmt.Sprintf("%s; %s; %.2f (default's %.2f)", ratios(v.RandRate), ratios(v.RandP99), v.WorstBucket, v.DefaultWorstBucket)
	}
	return fmt.Sprintf("%s | %s | %.1f (%.0f%%) | %s %.2fx | %s %.2fx | %.2f of best adm., %.2fx default, amp %.2fx | %s | %d (%d), %s, %.1f%% | %s",
		r.Scenario.Name, r.Desc, v.DefaultMBps, 100*v.Spread,
		kbName(v.BestKB), ratio(v.BestMBps, v.DefaultMBps),
		kbName(v.BestAdmKB), ratio(v.BestAdmMBps, v.DefaultMBps),
		ratio(v.DaemonMBps, v.BestAdmMBps), ratio(v.DaemonMBps, v.DefaultMBps), v.AmpRatio,
		readers, dm.Actions, dm.Kept, first, dm.CPUPct, v.Verdict)
}

// MatrixRun is one run of a table that a later run resumed.
type MatrixRun struct {
	Started time.Time `json:"started"`
	Command string    `json:"command"`
	Commit  string    `json:"commit,omitempty"` // the source the daemon was built from
	Uptime  string    `json:"uptime"`
	Error   string    `json:"error,omitempty"`
}

// Resume makes rep, a new run of the same scenario set, continue prev: it
// keeps prev's rows (their run recorded) and returns the names already
// run, which the new run skips. The rows of the runs numbered in redo (1
// the first, as the table numbers them) run again: rows measured on an
// older daemon, or on a host that was busy then. They stay in the table
// until their new row replaces them (Put), so a run stopped early leaves
// the rest as they were.
func (rep *MatrixReport) Resume(prev *MatrixReport, now MatrixRun, redo ...int) (done map[string]bool, err error) {
	if prev.Seed != rep.Seed || prev.N != rep.N || !subsequence(prev.Named, rep.Named) {
		return nil, fmt.Errorf("resume: the table holds seed %d, n %d, %d named scenarios; this run is seed %d, n %d, %d: run with the same SEED, N and NAMED, or without resume",
			prev.Seed, prev.N, len(prev.Named), rep.Seed, rep.N, len(rep.Named))
	}
	runs := prev.Runs
	if len(runs) == 0 {
		runs = []MatrixRun{{Started: prev.Started, Command: prev.Command, Uptime: prev.Uptime, Error: prev.Error}}
	} else {
		runs[len(runs)-1].Error = prev.Error
	}
	rep.Started, rep.Command, rep.Uptime, rep.LoadAt = prev.Started, prev.Command, prev.Uptime, prev.LoadAt
	rep.Runs = append(runs, now)
	done = map[string]bool{}
	for _, r := range prev.Rows {
		rep.Rows = append(rep.Rows, r)
		if !slices.Contains(redo, r.Run+1) {
			done[r.Scenario.Name] = true
		}
	}
	return done, nil
}

// Put adds row r, in place of an earlier row of its scenario if there is
// one, and keeps the rows in the order of names (the set's).
func (rep *MatrixReport) Put(r MatrixRow, names []string) {
	i := slices.IndexFunc(rep.Rows, func(o MatrixRow) bool { return o.Scenario.Name == r.Scenario.Name })
	if i >= 0 {
		rep.Rows[i] = r
	} else {
		rep.Rows = append(rep.Rows, r)
	}
	slices.SortStableFunc(rep.Rows, func(a, b MatrixRow) int {
		return slices.Index(names, a.Scenario.Name) - slices.Index(names, b.Scenario.Name)
	})
}

// subsequence reports whether every name of a is in b, in a's order. A
// table resumes in a run whose set has grown since (a scenario added to
// lab.Named): the new ones are among those it lacks.
func subsequence(a, b []string) bool {
	i := 0
	for _, n := range b {
		if i < len(a) && a[i] == n {
			i++
		}
	}
	return i == len(a)
}

// Rescore recomputes every row's description and verdict from its
// scenario and arms (after a change of the rules or of the table).
func (rep *MatrixReport) Rescore() {
	for i := range rep.Rows {
		r := &rep.Rows[i]
		r.Desc, r.Classes = r.Scenario.String(), r.Scenario.Classes()
		r.Verdict = Verdict(r.Arms)
	}
}

// WriteMatrix writes rep as README.md and matrix.json into dir.
func WriteMatrix(rep *MatrixReport, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "matrix.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(rep.Markdown()), 0o644)
}

// Markdown renders the report.
func (rep *MatrixReport) Markdown() string {
	var b strings.Builder
	met := 0
	for _, r := range rep.Rows {
		if r.Verdict.Verdict == Met {
			met++
		}
	}
	fmt.Fprintf(&b, "# Scenario matrix\n\n")
	fmt.Fprintf(&b, "`%s`, started %s. %d of %d planned scenarios run; **%d met, %d not met**.\n\n",
		rep.Command, rep.Started.UTC().Format("2006-01-02 15:04 UTC"), len(rep.Rows), rep.Planned, met, len(rep.Rows)-met)
	if rep.Error != "" {
		fmt.Fprintf(&b, "The run ended early: %s\n\n", rep.Error)
	}
	if len(rep.Runs) > 0 {
		fmt.Fprintf(&b, "The rows come from %d runs, each resuming the last (the run is a row's `run` column):\n\n", len(rep.Runs))
		for i, r := range rep.Runs {
			commit := r.Commit
			if commit == "" {
				commit = "not recorded"
			}
			fmt.Fprintf(&b, "%d. `%s`, started %s, source %s; `uptime` at its start: %s", i+1, r.Command, r.Started.UTC().Format("2006-01-02 15:04 UTC"), commit, r.Uptime)
			if r.Error != "" && i < len(rep.Runs)-1 {
				fmt.Fprintf(&b, "; ended early: %s", r.Error)
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "- Device: %s\n", rep.Device)
	fmt.Fprintf(&b, "- Arms, each measured %.0f s, one after another on the scenario's own lab: %s\n", rep.Measure, strings.Join(rep.Arms, ", "))
	fmt.Fprintf(&b, "- Machine load at the start (`uptime`): %s; each row's load at its end is in the last column. The machine has 2 cores shared with other work: the default's spread between its two runs is the noise floor of a row.\n", rep.Uptime)
	fmt.Fprintf(&b, "- Verdict (see docs/benchmarks.md): where a static window beats the default by %.0f%%, readaheadd's streams reach %.2f of the best admissible static window, every random reader keeps >= %.2fx its touches/s and <= %.2fx its p99, amplification <= %.2fx; where none does, streams >= %.2f of the default and nothing kept unless the streams gained %.0f%%; always no 1 s bucket of a random reader's p99 above %.0fx the default's p99 or the default's own worst second, whichever is higher.\n\n",
		100*(HelpGain-1), StreamsOfBest, RandomRate, RandomP99, AmpOfDefault, StreamsOfDefault, 100*(HelpGain-1), BucketP99)
	fmt.Fprintf(&b, "Columns: best static and best admissible as multiples of the default's streams; readaheadd as a share of the best admissible, a multiple of the default, and its read amplification over the default's; readers: each random reader's touches/s and p99 under readaheadd over the default's, and the worst 1 s p99 over the default's p99 (in brackets: the same for the default's own runs, the bucket rule's noise floor).\n\n")
	fmt.Fprintf(&b, "| %s | s | load | run |\n|%s\n", strings.ReplaceAll(RowHeader, " | ", " | "), strings.Repeat("---|", strings.Count(RowHeader, "|")+4))
	for _, r := range rep.Rows {
		fmt.Fprintf(&b, "| %s | %.0f | %s | %d |\n", RowText(r), r.Seconds, r.Load, r.Run+1)
	}
	fmt.Fprintf(&b, "\n## Why not met\n\n")
	for _, r := range rep.Rows {
		if r.Verdict.Verdict == Met {
			continue
		}
		fmt.Fprintf(&b, "- %s: %s\n", r.Scenario.Name, strings.Join(r.Verdict.Reasons, "; "))
	}
	fmt.Fprintf(&b, "\n## Coverage of the scenarios run\n\n")
	var scs []lab.MatrixScenario
	for _, r := range rep.Rows {
		scs = append(scs, r.Scenario)
	}
	cov := lab.Coverage(scs)
	keys := make([]string, 0, len(cov))
	for k := range cov {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %d · ", k, cov[k])
	}
	fmt.Fprintf(&b, "\n\n## Every arm\n\n| scenario | arm | streams MB/s | random readers (touches/s, p99 ms) | amp | actions (before onset, kept) | mem failcnt |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Rows {
		for _, a := range r.Arms {
			var rr []string
			for _, x := range a.Randoms {
				rr = append(rr, fmt.Sprintf("%.0f/s %.1f ms", x.TouchesPerSec, x.P99ms))
			}
			name := a.Arm
			if a.Run == 2 {
				name += " (again)"
			}
			fmt.Fprintf(&b, "| %s | %s | %.1f | %s | %.2f | %d (%d, %d) | %d |\n", r.Scenario.Name, name, a.StreamsMBps,
				strings.Join(rr, "; "), a.Amp, a.Actions, a.ActionsBefore, a.Kept, a.MemFailcnt)
		}
	}
	return b.String()
}
