package lab

import (
	"os"
	"testing"
)

// New starts a lab for a test, or skips the test when the machine cannot
// run one (not root, no /dev/fuse). The lab is torn down when the test
// ends, whether it passed or not.
func New(t testing.TB, opts Options) *Lab {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("lab: %v", err)
	}
	l, err := Up(opts)
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Down(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

// Full reports whether the long benchmark forms run (READAHEADD_BENCH=full).
func Full() bool { return os.Getenv("READAHEADD_BENCH") == "full" }
