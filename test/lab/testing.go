package lab

import (
	"fmt"
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

// RunTwice runs run as subtest run1 and, if it missed anything (the
// figures it returns), once more as run2 on whatever fresh lab run makes:
// the lab is a user space server on a shared host, and a stretch in which
// the host takes its CPU measures a slower device than the lab meant. The
// test fails only if the second run misses too; what names what run checks.
func RunTwice(t *testing.T, what string, run func(t *testing.T) (missed []string)) {
	t.Helper()
	RunUpTo(t, 2, what, run)
}

// RunUpTo is RunTwice with up to n runs: the test fails only if every run
// misses something.
func RunUpTo(t *testing.T, n int, what string, run func(t *testing.T) (missed []string)) {
	t.Helper()
	for attempt := 1; attempt <= n; attempt++ {
		var missed []string
		t.Run(fmt.Sprintf("run%d", attempt), func(t *testing.T) { missed = run(t) })
		switch {
		case len(missed) == 0:
			return
		case attempt < n:
			t.Logf("run %d missed %d of %s (first: %s): once more on a fresh lab", attempt, len(missed), what, missed[0])
		default:
			t.Errorf("%s missed in %d runs; the last missed: %v", what, n, missed)
		}
	}
}
