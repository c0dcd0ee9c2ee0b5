package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/trace"
)

type traceOptions struct {
	devices  []string
	interval time.Duration
	format   string
	top      int
	count    int
	sysfs    string
}

func newTraceCmd() *cobra.Command {
	o := traceOptions{}
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Live per-file view of block reads: top files by bytes read, with latency, size, depth and reader",
		Long: `trace attaches the BPF probe and prints, every interval, the files that
read the most bytes from the chosen disks, with their request count, mean and
p99 latency, mean request size, mean queue depth and reading process, and the
totals per disk. Ctrl-C stops it. Needs root (or CAP_BPF and CAP_PERFMON).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.interval <= 0 {
				return usageErrorf("--interval must be positive, got %s", o.interval)
			}
			if o.format != "text" && o.format != "json" {
				return usageErrorf("--format must be text or json, got %q", o.format)
			}
			if o.top < 0 {
				return usageErrorf("--top must not be negative, got %d", o.top)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runTrace(ctx, o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.devices, "device", nil, "disk to trace, by name as in /sys/block (repeatable; default: all disks)")
	f.DurationVar(&o.interval, "interval", time.Second, "reporting interval")
	f.StringVar(&o.format, "format", "text", "output format: text or json (one object per line and interval)")
	f.IntVar(&o.top, "top", 10, "files shown per interval (0: all)")
	f.IntVar(&o.count, "count", 0, "stop after this many intervals (0: until interrupted)")
	f.StringVar(&o.sysfs, "sysfs", blockdev.DefaultRoot, "sysfs mount point")
	_ = f.MarkHidden("sysfs")
	return cmd
}

func runTrace(ctx context.Context, o traceOptions, out io.Writer) error {
	sys := blockdev.SysFS{Root: o.sysfs}
	var devs []probe.Dev
	for _, name := range o.devices {
		d, err := sys.Lookup(name)
		if err != nil {
			return usageError{err}
		}
		devs = append(devs, d.Dev)
	}
	if len(devs) > probe.MaxDevices {
		return usageErrorf("at most %d --device flags; give none to trace every disk", probe.MaxDevices)
	}
	p, err := probe.Load(probe.Config{Devices: devs})
	if err != nil {
		return fmt.Errorf("start the BPF probe: %w", err)
	}
	defer p.Close()

	names := map[probe.Dev]string{}
	nameOf := func(d probe.Dev) string {
		if n, ok := names[d]; ok {
			return n
		}
		n := ""
		if disk, err := sys.ByDev(d); err == nil {
			n = disk.Name
		}
		names[d] = n
		return n
	}
	w := trace.NewWindow(time.Now())
	w.Names = nameOf
	w.Paths = &probe.Resolver{}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(runCtx, w) }()

	write := trace.WriteText
	if o.format == "json" {
		write = trace.WriteJSON
	}
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for n := 0; o.count == 0 || n < o.count; n++ {
		select {
		case <-ctx.Done():
			cancel()
			return <-runErr
		case err := <-runErr:
			return fmt.Errorf("BPF probe stopped: %w", err)
		case now := <-tick.C:
			rep := w.Flush(now, o.top)
			if st, err := p.Stats(); err == nil {
				rep.Lost = st.Lost.Total()
			} else {
				slog.Warn("read probe statistics", "err", err)
			}
			if err := write(out, rep); err != nil {
				if errors.Is(err, syscall.EPIPE) {
					cancel()
					<-runErr
					return nil
				}
				return fmt.Errorf("write trace output: %w", err)
			}
		}
	}
	cancel()
	return <-runErr
}
