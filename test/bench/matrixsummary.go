package bench

import (
	"fmt"
	"slices"
	"strings"

	"github.com/readaheadd/readaheadd/test/lab"
)

// SummaryClasses are the rows of the README's results table: the device
// classes of the matrix, then every scenario with a random reader beside
// its streams (whatever its device).
var SummaryClasses = []struct{ Class, Case string }{
	{lab.CHealthy, "healthy disk"},
	{lab.CSaturated, "disk the default window already fills"},
	{lab.CSlowFiles, "some files slowed (+0.5..8 ms)"},
	{lab.CWhole, "whole disk slowed, fail-slow (+0.5..8 ms)"},
	{lab.CTail, "periodic tail spikes"},
	{lab.CExtents, "slow extent starts"},
	{lab.CCombined, "several of these at once"},
	{"random-beside", "any of these with random or mmap readers beside the streams"},
}

// hasRandom: the scenario has a random reader beside its streams.
func hasRandom(r MatrixRow) bool { return len(r.Verdict.RandRate) > 0 }

func inClass(r MatrixRow, c string) bool {
	if c == "random-beside" {
		return hasRandom(r)
	}
	for _, x := range r.Classes {
		if x == c {
			return true
		}
	}
	return false
}

// medianWorst is the median and the smallest of xs ("-" without any).
func medianWorst(xs []float64, format string) string {
	if len(xs) == 0 {
		return "-"
	}
	return fmt.Sprintf(format+" ("+format+")", median(xs), slices.Min(xs))
}

// ClassSummary is the README's results table: per class, how many
// scenarios ran and met their verdict, the default's streams, readaheadd's
// and the best static window's as multiples of the default (median, and in
// brackets the worst for readaheadd), and readaheadd over the best
// admissible static window (median, worst). Rows without a scenario are
// left out; harness errors do not count.
func ClassSummary(rows []MatrixRow) string {
	var b strings.Builder
	b.WriteString("| case | scenarios (met) | default MB/s | readaheadd x default, median (worst) | best static window x default | readaheadd / best admissible window, median (worst) |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, c := range SummaryClasses {
		var n, met int
		var def, daemon, best, adm []float64
		for _, r := range rows {
			if r.Error != "" || !inClass(r, c.Class) {
				continue
			}
			v := r.Verdict
			n++
			if v.Verdict == "met" {
				met++
			}
			def = append(def, v.DefaultMBps)
			daemon = append(daemon, ratio(v.DaemonMBps, v.DefaultMBps))
			best = append(best, ratio(v.BestMBps, v.DefaultMBps))
			adm = append(adm, ratio(v.DaemonMBps, v.BestAdmMBps))
		}
		if n == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d (%d) | %.0f | %s | %.2fx | %s |\n", c.Case, n, met, median(def),
			medianWorst(daemon, "%.2fx"), median(best), medianWorst(adm, "%.2f"))
	}
	return b.String()
}
