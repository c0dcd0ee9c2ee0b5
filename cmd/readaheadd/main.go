// Command readaheadd watches block read latency with BPF and adapts the
// kernel's readahead windows, per open file first and per device when a
// whole device needs it.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
)

// Exit codes: 1 for a failure while running, 2 for a bad command line or
// configuration (nothing has been changed on the machine when 2 is returned).
const (
	exitFailure = 1
	exitUsage   = 2
)

// usageError marks errors in flags or configuration.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "readaheadd",
		Short:         "Adaptive readahead for storage servers, driven by BPF block-read latency",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newVersionCmd())
	root.AddCommand(newTraceCmd())
	root.AddCommand(newRunCmd(defaultRunEnv()), newRestoreCmd(blockdev.SysFS{}), newStatusCmd(), newCheckCmd())
	return root
}

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "readaheadd:", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(exitUsage)
		}
		os.Exit(exitFailure)
	}
}
