package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/readaheadd/readaheadd/pkg/config"
	"github.com/readaheadd/readaheadd/pkg/metrics"
)

func newStatusCmd() *cobra.Command {
	var addr string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Summarise the running daemon: devices, windows, active regimes, recent actions",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if addr == "" {
				return usageErrorf("metrics-addr is empty: give the address the daemon serves on")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			st, err := fetchStatus(ctx, addr)
			if err != nil {
				return err
			}
			printStatus(cmd.OutOrStdout(), st)
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "metrics-addr", config.DefaultMetricsAddr, "HOST:PORT the daemon serves /debug/status on")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the daemon")
	return cmd
}

func fetchStatus(ctx context.Context, addr string) (metrics.Status, error) {
	var st metrics.Status
	url := addr
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/debug/status", nil)
	if err != nil {
		return st, usageErrorf("metrics-addr %q: %v", addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("daemon not reachable at %s: %w (is `readaheadd run` running with this --metrics-addr?)", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return st, fmt.Errorf("daemon at %s answered %s: %s", addr, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&st); err != nil {
		return st, fmt.Errorf("status from %s is not readaheadd's: %w", addr, err)
	}
	return st, nil
}

func printStatus(w io.Writer, st metrics.Status) {
	health := "healthy"
	if !st.Healthy {
		health = "UNHEALTHY: " + st.HealthReason
	}
	mode := ""
	if st.DryRun {
		mode = ", dry run (changes nothing)"
	}
	fmt.Fprintf(w, "readaheadd %s, up %s, %s%s\n", st.Version, time.Since(st.StartedAt).Round(time.Second), health, mode)
	fmt.Fprintf(w, "probe attached: %v, events lost: %d\n\n", st.ProbeAttached, st.EventsLost)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tDEV\tREAD_AHEAD_KB\tORIGINAL_KB\tFILES_ADJUSTED\tREQUESTS\tP50_MS\tP99_MS")
	for _, d := range st.Devices {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%.2f\t%.2f\n", d.Name, d.Dev, d.ReadAheadKB, d.OriginalKB, d.FilesAdjusted, d.Requests, d.P50ms, d.P99ms)
	}
	tw.Flush()

	if len(st.OpenFileWindows) > 0 {
		// The kernel's own per-file windows: what readers really get,
		// including windows readaheadd did not set.
		fmt.Fprintln(w, "\nopen files by window in force (kernel's f_ra):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  DEVICE\tWINDOW_KB\tOPEN_FILES")
		for _, o := range st.OpenFileWindows {
			fmt.Fprintf(tw, "  %s\t%d\t%d\n", o.Device, o.WindowKB, o.Files)
		}
		tw.Flush()
		// Above the device's own window: what readaheadd holds raised
		// now, or what a run left behind.
		if len(st.OpenFilesAbove) == 0 {
			fmt.Fprintln(w, "open files above their device's window: none")
		} else {
			fmt.Fprintln(w, "open files above their device's window (kernel's f_ra):")
			tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  DEVICE\tDEVICE_KB\tPID\tFD\tRA_PAGES_KB\tSTREAM_KB\tPATH")
			for _, o := range st.OpenFilesAbove {
				fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%s\n", o.Device, o.DeviceKB, o.PID, o.FD, o.RAPagesKB, o.StreamKB, o.Path)
			}
			tw.Flush()
		}
	}

	fmt.Fprintln(w)
	if len(st.Regimes) == 0 {
		fmt.Fprintln(w, "active regimes: none")
	} else {
		fmt.Fprintln(w, "active regimes:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  REGIME\tDEVICE\tFILE\tFOR\tCONFIDENCE\tEVIDENCE")
		for _, r := range st.Regimes {
			file := r.File
			if r.DeviceWide {
				file = "(whole device)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%.2f\t%s\n", r.Kind, r.Device, file,
				(time.Duration(r.ForSeconds * float64(time.Second))).Round(time.Second), r.Confidence, r.Evidence)
		}
		tw.Flush()
	}

	printFailSlow(w, st.FailSlow)

	fmt.Fprintln(w)
	if len(st.RecentActions) == 0 {
		fmt.Fprintln(w, "recent actions: none")
		return
	}
	fmt.Fprintln(w, "recent actions:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  TIME\tDEVICE\tACTION\tTARGET\tWINDOW_KB\tRESULT\tEFFECT")
	for _, a := range st.RecentActions {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d -> %d\t%s\t%s\n", a.Time.Local().Format("15:04:05"), a.Device, a.Action, a.Target, a.FromKB, a.ToKB, a.Result, a.Effect)
	}
	tw.Flush()
}

// printFailSlow names the disks readaheadd judges fail-slow and the files
// slower than their own disk (docs/operations.md, "Fail-slow disks and
// files").
func printFailSlow(w io.Writer, disks []metrics.SlowDiskStatus) {
	fmt.Fprintln(w)
	var slow []string
	for _, d := range disks {
		if d.Slow {
			slow = append(slow, d.Device)
		}
	}
	if len(slow) == 0 {
		fmt.Fprintln(w, "fail-slow disks: none")
	} else {
		fmt.Fprintf(w, "fail-slow disks: %s\n", strings.Join(slow, ", "))
	}
	if len(disks) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  DEVICE\tSLOW\tRATIO\tLAST_WINDOW\tREFERENCE\tREQUESTS\tFOR")
	for _, d := range disks {
		ratio, last, dur := "-", "-", "-"
		if d.HeldRatio > 0 {
			ratio = fmt.Sprintf("%.2fx", d.HeldRatio)
		}
		if d.Reference != "none" {
			last = fmt.Sprintf("%.2fx", d.Ratio)
		}
		if d.Slow {
			dur = (time.Duration(d.ForSeconds * float64(time.Second))).Round(time.Second).String()
		}
		verdict := "no"
		switch {
		case d.Slow:
			verdict = "YES"
		case d.Over > 0:
			verdict = fmt.Sprintf("over for %d", d.Over)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\t%s\n", d.Device, verdict, ratio, last, d.Reference, d.Requests, dur)
	}
	tw.Flush()
	var files int
	for _, d := range disks {
		files += len(d.SlowFiles)
	}
	if files == 0 {
		fmt.Fprintln(w, "files slower than their disk: none")
		return
	}
	fmt.Fprintln(w, "files slower than their disk:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  DEVICE\tFILE\tRATIO\tREQUESTS\tFOR")
	for _, d := range disks {
		for _, f := range d.SlowFiles {
			fmt.Fprintf(tw, "  %s\t%s\t%.2fx\t%d\t%s\n", d.Device, f.File, f.Ratio, f.Requests,
				(time.Duration(f.ForSeconds * float64(time.Second))).Round(time.Second))
		}
	}
	tw.Flush()
}
