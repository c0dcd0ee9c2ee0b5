package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// checkProbe loads and attaches the probe and reports what works; it is a
// variable so that a more detailed check can replace it.
var checkProbe = func(w io.Writer) error {
	p, err := probe.Load(probe.Config{})
	if err != nil {
		fmt.Fprintf(w, "FAIL load and attach BPF programs: %v\n", err)
		return fmt.Errorf("this kernel or these privileges cannot run readaheadd: %w", err)
	}
	defer p.Close()
	st, err := p.Stats()
	if err != nil {
		fmt.Fprintf(w, "FAIL read BPF statistics: %v\n", err)
		return err
	}
	for _, name := range []string{probe.ProgBlockRqIssue, probe.ProgBlockRqComplete, probe.ProgPageCacheSyncRa, probe.ProgPageCacheAsyncRa} {
		if _, ok := st.Programs[name]; ok {
			fmt.Fprintf(w, "ok   %s attached\n", name)
		} else {
			fmt.Fprintf(w, "FAIL %s not attached\n", name)
			return fmt.Errorf("program %s did not attach", name)
		}
	}
	return nil
}

func newCheckCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Load and attach the BPF programs and report what works on this kernel (exit 0 or 1)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkProbe(cmd.OutOrStdout()); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "readaheadd can run on this kernel")
			return nil
		},
	}
}
