package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/config"
	"github.com/readaheadd/readaheadd/pkg/fileras"
	"github.com/readaheadd/readaheadd/pkg/state"
	"github.com/readaheadd/readaheadd/pkg/tuner"
)

func newRestoreCmd(sys blockdev.SysFS) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "restore",
		Short: "Put back every read_ahead_kb and per-file window recorded in the state directory (after a crash; also run by ExecStartPre)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" || !filepath.IsAbs(dir) {
				return usageErrorf("state-dir %q is not an absolute path", dir)
			}
			fi, err := os.Stat(dir)
			if errors.Is(err, os.ErrNotExist) {
				// Nothing was ever recorded; do not create the directory.
				fmt.Fprintf(cmd.OutOrStdout(), "nothing to restore: %s does not exist\n", dir)
				return nil
			}
			if err != nil {
				return fmt.Errorf("state directory: %w", err)
			}
			if !fi.IsDir() {
				return usageErrorf("state-dir %s is not a directory", dir)
			}
			st, err := state.Open(dir, state.Options{DiskSeq: sys.DiskSeq})
			if err != nil {
				return err
			}
			defer st.Close()
			entries := st.Entries()
			if len(entries) == 0 && len(st.Pins()) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "nothing to restore")
				return nil
			}
			err = st.Restore(sys)
			if len(st.Pins()) > 0 {
				// After the devices: a reset open file takes its device's
				// window.
				// Through the Lowerer: a reader still streaming on the
				// window comes down too. Without the kernel's per-file
				// state each file gets a fixed break (Lowerer.Hold).
				files := tuner.NewProcFileOps()
				low := &tuner.Lowerer{Sysfs: sys, Files: files}
				if it, ierr := fileras.Open(); ierr == nil {
					defer it.Close()
					low.States = fileras.States{It: it}
				} else {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: open files' readahead iterator not available (%v): each reset file pauses its readahead for %v\n", ierr, tuner.DefaultHold)
				}
				reset, gone, perr := tuner.RestorePins(st, files, low)
				fmt.Fprintf(cmd.OutOrStdout(), "open files: %d window(s) reset to their device's, %d reader(s) gone\n", reset, gone)
				if perr != nil {
					err = errors.Join(err, fmt.Errorf("per-file windows not reset (kept in %s): %w", st.PinsPath(), perr))
				}
			}
			left := map[string]bool{}
			for _, e := range st.Entries() {
				left[e.Device] = true
			}
			for _, e := range entries {
				if left[e.Device] {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: NOT restored to %d KB (kept in %s)\n", e.Device, e.ReadAheadKB, st.Path())
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: read_ahead_kb restored to %d\n", e.Device, e.ReadAheadKB)
				}
			}
			if err != nil {
				return err
			}
			if len(left) > 0 {
				return fmt.Errorf("%d device(s) not restored (gone?): their records are kept for a later restore", len(left))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "state-dir", config.DefaultStateDir, "state directory of the daemon")
	return cmd
}
