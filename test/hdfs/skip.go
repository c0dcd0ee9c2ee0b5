package hdfs

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// EnvVar opts a test run into the real-HDFS tests and benchmarks ("1"). They are off by
// default because the first run downloads about 110 MB from Maven Central and each cluster
// takes seconds to start.
const EnvVar = "READAHEADD_HDFS"

// Enabled reports whether EnvVar is set to 1.
func Enabled() bool { return os.Getenv(EnvVar) == "1" }

// Skip skips tb unless the real HDFS can run here and was asked for: EnvVar=1, root (the
// tests drop caches and use loop devices), java and mvn in PATH.
func Skip(tb testing.TB) {
	tb.Helper()
	if reason := skipReason(); reason != "" {
		tb.Skip(reason)
	}
}

func skipReason() string {
	if !Enabled() {
		return fmt.Sprintf("real HDFS is opt-in: set %s=1 (first run downloads about 110 MB of Hadoop jars with Maven)", EnvVar)
	}
	if os.Geteuid() != 0 {
		return "needs root: drops caches and uses loop devices under the HDFS DataNode"
	}
	for _, tool := range []string{"java", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("needs %s in PATH for the real HDFS (Java 17 JDK and Maven 3.8+)", tool)
		}
	}
	return ""
}

// DropCaches writes back dirty pages and empties the page cache, so the next read of a
// block file goes to its device.
func DropCaches() error {
	if err := exec.Command("sync").Run(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o644); err != nil {
		return fmt.Errorf("drop caches (needs root): %w", err)
	}
	return nil
}
