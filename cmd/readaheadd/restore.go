package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/config"
	"github.com/readaheadd/readaheadd/pkg/fileras"
	"github.com/readaheadd/readaheadd/pkg/scope"
	"github.com/readaheadd/readaheadd/pkg/state"
)

func newRestoreCmd(sys blockdev.SysFS) *cobra.Command {
	var dir, configPath string
	var flagCfg config.Config
	cmd := &cobra.Command{
		Use:   "restore",
		Short: "Put back every read_ahead_kb and per-file window recorded in the state directory (after a crash; also run by ExecStartPre)",
		Long: `Put back what a killed daemon left changed. The state directory is not
trusted: an original is written back only to a disk whose device number
still matches the record and that the configuration (--config, --device,
--allow-os-disk: the same rule as run) lets readaheadd tune, or, for any
other disk but the one holding the root filesystem, whose recorded diskseq
still matches (the same media readaheadd recorded). An open file's window is
reset only if the file is under an allow-path of the configuration. Each
record refused is printed on one line and kept.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" || !filepath.IsAbs(dir) {
				return usageErrorf("state-dir %q is not an absolute path", dir)
			}
			c := config.Default()
			if configPath != "" {
				var err error
				if c, err = config.LoadFile(configPath, c); err != nil {
					return usageError{err}
				}
			}
			if f := cmd.Flags().Lookup("device"); f.Changed {
				c.Devices = flagCfg.Devices
			}
			if f := cmd.Flags().Lookup("allow-os-disk"); f.Changed {
				c.AllowOSDisk = flagCfg.AllowOSDisk
			}
			if f := cmd.Flags().Lookup("allow-path"); f.Changed {
				c.AllowPaths = flagCfg.AllowPaths
			}
			out := cmd.OutOrStdout()
			fi, err := os.Stat(dir)
			if errors.Is(err, os.ErrNotExist) {
				// Nothing was ever recorded; do not create the directory.
				fmt.Fprintf(out, "nothing to restore: %s does not exist\n", dir)
				return nil
			}
			if err != nil {
				return fmt.Errorf("state directory: %w", err)
			}
			if !fi.IsDir() {
				return usageErrorf("state-dir %s is not a directory", dir)
			}
			tunable := map[string]bool{}
			disks, osDisk, derr := config.TunableDisks(c, sys)
			if derr != nil {
				// Records are still listed below, each refused on its line.
				fmt.Fprintf(out, "no disk may be tuned under this configuration: %v\n", derr)
			}
			var devices []string
			for _, d := range disks {
				tunable[d.Name] = true
				devices = append(devices, d.Name)
			}
			st, err := state.Open(dir, state.Options{
				DiskSeq: sys.DiskSeq, DevOf: state.DevOfSysfs(sys),
				Tunable: func(n string) bool { return tunable[n] }, Protected: func(n string) bool { return n == osDisk },
			})
			if err != nil {
				return err
			}
			defer st.Close()
			entries := st.Entries()
			if len(entries) == 0 && len(st.Pins()) == 0 {
				fmt.Fprintln(out, "nothing to restore")
				return nil
			}
			refused := map[string]error{}
			for _, e := range entries {
				if cerr := st.Check(e); cerr != nil {
					refused[e.Device] = cerr
				}
			}
			err = st.Restore(sys)
			if len(st.Pins()) > 0 {
				// After the devices: a reset open file takes its device's
				// window.
				// Through the Lowerer: a reader still streaming on the
				// window comes down too. Without the kernel's per-file
				// state each file gets a fixed break (Lowerer.Hold).
				scope, serr := scopeOf(c)
				if serr != nil {
					err = errors.Join(err, fmt.Errorf("per-file windows not reset (kept in %s): %w", st.PinsPath(), serr))
				} else {
					files := actuate.NewProcFileOps()
					low := &actuate.Lowerer{Sysfs: sys, Files: files}
					if it, ierr := fileras.Open(); ierr == nil {
						defer it.Close()
						low.States = fileras.States{It: it}
					} else {
						fmt.Fprintf(cmd.ErrOrStderr(), "warning: open files' readahead iterator not available (%v): each reset file pauses its readahead for %v, and none can be confirmed\n", ierr, actuate.DefaultHold)
					}
					res, perr := actuate.RestorePins(st, files, scope, devices, low)
					fmt.Fprintf(out, "open files: %d window(s) reset to their device's, %d not confirmed, %d reader(s) gone, %d record(s) refused (outside the allow-paths or the tuned disks)\n",
						res.Reset, len(res.Unconfirmed), res.Gone, res.Refused)
					// The kernel's own state is the proof: a file it still
					// shows above its device's window is named, and fails
					// the command.
					for _, u := range res.Unconfirmed {
						fmt.Fprintf(out, "  NOT confirmed: %s (record kept in %s)\n", u, st.PinsPath())
					}
					if perr != nil {
						err = errors.Join(err, fmt.Errorf("per-file windows not reset (kept in %s): %w", st.PinsPath(), perr))
					}
					if n := len(res.Unconfirmed); n > 0 {
						err = errors.Join(err, fmt.Errorf("%d open file(s) not confirmed at their device's window: run restore again, or restart their readers", n))
					}
				}
			}
			left := map[string]bool{}
			for _, e := range st.Entries() {
				left[e.Device] = true
			}
			notRestored := 0
			for _, e := range entries {
				switch {
				case refused[e.Device] != nil && left[e.Device]:
					fmt.Fprintf(out, "%s: refused, nothing written (%v; record kept in %s)\n", e.Device, refused[e.Device], st.Path())
				case refused[e.Device] != nil:
					fmt.Fprintf(out, "%s: refused, nothing written (%v; record dropped)\n", e.Device, refused[e.Device])
				case left[e.Device]:
					notRestored++
					fmt.Fprintf(out, "%s: NOT restored to %d KB (kept in %s)\n", e.Device, e.ReadAheadKB, st.Path())
				default:
					fmt.Fprintf(out, "%s: read_ahead_kb restored to %d\n", e.Device, e.ReadAheadKB)
				}
			}
			if err != nil {
				return err
			}
			if notRestored > 0 {
				return fmt.Errorf("%d device(s) not restored (gone?): their records are kept for a later restore", notRestored)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "state-dir", config.DefaultStateDir, "state directory of the daemon")
	cmd.Flags().StringVar(&configPath, "config", "", "the daemon's YAML config file: restore writes only to the disks and files it lets readaheadd tune")
	config.AddDeviceFlags(cmd.Flags(), &flagCfg)
	cmd.Flags().StringArrayVar(&flagCfg.AllowPaths, "allow-path", nil, "allow-path of the daemon (repeatable; as --config's): recorded per-file windows are reset only for files under one")
	return cmd
}

// scopeOf is the per-file scope of a configuration: its allow-paths,
// resolved and checked as run checks them.
func scopeOf(c config.Config) (*scope.Scope, error) {
	paths, err := config.ResolveAllowPaths(c)
	if err != nil {
		return nil, err
	}
	return scope.New(paths)
}
