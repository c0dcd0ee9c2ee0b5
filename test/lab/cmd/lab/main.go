// Command lab starts, drives and removes the readaheadd lab device: a loop
// device with an ext4 file system on a labfs image whose latency regimes
// (permanent, temporal, intrinsic, device, contention) are switched at run time.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/readaheadd/readaheadd/test/lab"
)

func main() {
	if err := root().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	u := strings.ToUpper(strings.TrimSuffix(strings.ToUpper(s), "B"))
	switch {
	case strings.HasSuffix(u, "G"):
		mult, u = 1<<30, strings.TrimSuffix(u, "G")
	case strings.HasSuffix(u, "M"):
		mult, u = 1<<20, strings.TrimSuffix(u, "M")
	}
	v, err := strconv.ParseFloat(u, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("size %q: give e.g. 2G or 512M", s)
	}
	return int64(v*float64(mult)) &^ 4095, nil
}

func root() *cobra.Command {
	var dir string
	r := &cobra.Command{
		Use:           "lab",
		Short:         "Emulated slow block device for readaheadd tests, benchmarks and the demo",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	r.PersistentFlags().StringVar(&dir, "dir", "", "mount directory of the lab's file system (which lab to act on)")

	var size string
	var model lab.Model
	var reqlog bool
	var fs string
	up := &cobra.Command{
		Use:   "up",
		Short: "Create the lab and leave it running (until `lab down`)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := parseSize(size)
			if err != nil {
				return err
			}
			l, err := lab.Up(lab.Options{Dir: dir, SizeBytes: n, Model: model, Detach: true, RequestLog: reqlog, FS: fs})
			if err != nil {
				return err
			}
			st := l.State()
			fmt.Printf("device /dev/%s (%s)\nmount %s\nground truth %s\ncontrol %s\nlabfs pid %d\n",
				l.Name, l.Dev, l.Mount, st.Truth, st.Control, st.PID)
			return nil
		},
	}
	up.Flags().StringVar(&size, "size", "2G", "image size")
	up.Flags().DurationVar(&model.Latency, "latency", lab.DefaultModel.Latency, "base latency per read")
	up.Flags().Float64Var(&model.BandwidthMBps, "bandwidth", lab.DefaultModel.BandwidthMBps, "transfer channel bandwidth, MB/s")
	up.Flags().IntVar(&model.Slots, "slots", lab.DefaultModel.Slots, "internal parallelism")
	up.Flags().BoolVar(&reqlog, "request-log", false, "log every read request labfs serves")
	up.Flags().StringVar(&fs, "fs", "ext4", "file system on the device: ext4 or xfs")

	down := &cobra.Command{
		Use:   "down",
		Short: "Remove the lab at --dir, or every detached lab and crash leftover (never a running test's lab)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir != "" {
				l, err := lab.Attach(dir)
				if err != nil {
					return err
				}
				return l.Down()
			}
			removed, err := lab.Cleanup(true)
			for _, r := range removed {
				fmt.Println("removed", r)
			}
			if len(removed) == 0 && err == nil {
				fmt.Println("nothing to remove")
			}
			return err
		},
	}

	status := &cobra.Command{
		Use:   "status",
		Short: "Show the lab's device, model and regime counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := lab.Attach(dir)
			if err != nil {
				return err
			}
			s, err := l.Stats()
			if err != nil {
				return err
			}
			ra, _ := l.ReadAheadKB()
			fmt.Printf("device /dev/%s (%s) mount %s read_ahead_kb %d\n", l.Name, l.Dev, l.Mount, ra)
			b, _ := json.MarshalIndent(s, "", "  ")
			fmt.Println(string(b))
			return nil
		},
	}

	r.AddCommand(up, down, status, regime(&dir), scenario(&dir))
	return r
}

func regime(dir *string) *cobra.Command {
	c := &cobra.Command{Use: "regime", Short: "Switch a latency regime on the running lab"}
	var extra time.Duration
	perm := &cobra.Command{
		Use:   "permanent FILE...",
		Short: "Add --extra latency to every read of the files' extents",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := lab.Attach(*dir)
			if err != nil {
				return err
			}
			return l.SetPermanent(extra, args...)
		},
	}
	perm.Flags().DurationVar(&extra, "extra", 1500*time.Microsecond, "added latency")

	var t lab.Temporal
	temp := &cobra.Command{
		Use:   "temporal",
		Short: "Periodic windows in which a fraction of all reads wait --extra more",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := lab.Attach(*dir)
			if err != nil {
				return err
			}
			_, err = l.SetTemporal(t)
			return err
		},
	}
	temp.Flags().DurationVar(&t.Period, "period", 10*time.Second, "window period")
	temp.Flags().DurationVar(&t.Duration, "duration", 3*time.Second, "window length")
	temp.Flags().Float64Var(&t.Fraction, "fraction", 0.05, "share of reads slowed in a window")
	temp.Flags().DurationVar(&t.Extra, "extra", 20*time.Millisecond, "added latency")

	var firstN int
	var iextra time.Duration
	intr := &cobra.Command{
		Use:   "intrinsic FILE...",
		Short: "Slow the first --first-n reads after a read enters a new extent of the files",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := lab.Attach(*dir)
			if err != nil {
				return err
			}
			return l.SetIntrinsic(firstN, iextra, args...)
		},
	}
	intr.Flags().IntVar(&firstN, "first-n", 4, "slowed requests per extent")
	intr.Flags().DurationVar(&iextra, "extra", 2*time.Millisecond, "added latency")

	var readers, blockKB int
	var dur time.Duration
	cont := &cobra.Command{
		Use:   "contention FILE",
		Short: "Read FILE with O_DIRECT in the background for --for (or until interrupted)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := lab.Attach(*dir)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if dur > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, dur)
				defer cancel()
			}
			c, err := l.StartContention(args[0], readers, blockKB)
			if err != nil {
				return err
			}
			<-ctx.Done()
			err = c.Stop()
			fmt.Printf("background read %d MB\n", c.Bytes()>>20)
			return err
		},
	}
	cont.Flags().IntVar(&readers, "readers", 1, "parallel O_DIRECT readers")
	cont.Flags().IntVar(&blockKB, "block-kb", 1024, "read size")
	cont.Flags().DurationVar(&dur, "for", 0, "how long (0: until interrupted)")

	var dextra time.Duration
	dev := &cobra.Command{
		Use:   "device",
		Short: "Add --extra latency to every read of the whole device (a fail-slow drive)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := lab.Attach(*dir)
			if err != nil {
				return err
			}
			return l.SetDevice(dextra)
		},
	}
	dev.Flags().DurationVar(&dextra, "extra", 3*time.Millisecond, "added latency")

	clear := &cobra.Command{
		Use:   "clear [permanent|temporal|intrinsic|device]",
		Short: "End regimes (all when none is named)",
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := lab.Attach(*dir)
			if err != nil {
				return err
			}
			return l.Clear(args...)
		},
	}
	c.AddCommand(perm, temp, intr, dev, cont, clear)
	return c
}

func scenario(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "scenario FILE",
		Short: "Run a scenario file on the running lab and print its readers' samples",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, err := lab.LoadScenario(args[0])
			if err != nil {
				return err
			}
			l, err := lab.Attach(*dir)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			samples, err := sc.Run(ctx, l)
			for _, s := range samples {
				if s.Kind == "seq" {
					fmt.Printf("%7.1fs %-10s %-16s %7.1f MB/s\n", s.At.Seconds(), s.Phase, s.File, s.MBps)
				} else {
					fmt.Printf("%7.1fs %-10s %-16s %7.0f touches/s p99 %s\n", s.At.Seconds(), s.Phase, s.File, s.Rate, s.P99)
				}
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			fmt.Println("ground truth:", l.TruthFile())
			return nil
		},
	}
}
