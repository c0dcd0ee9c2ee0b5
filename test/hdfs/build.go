package hdfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// buildTimeout bounds one Maven run; the first one downloads about 110 MB.
const buildTimeout = 20 * time.Minute

// stampName marks a successful build in target/; sources newer than it trigger a rebuild.
const stampName = ".built"

var (
	buildMu sync.Mutex
	builtCP string // cached classpath once a build succeeded in this process
)

// Build compiles the Java server and resolves its dependency classpath, once per process.
// It returns the classpath to run the server with (`java -cp CP io.readaheadd.hdfsbench.Server`).
//
// Maven runs only when target/ is missing or older than pom.xml or a source file; it tries
// offline first (-o) and goes online if that fails (first run: dependencies from Maven
// Central into ~/.m2). A file lock keeps concurrent test binaries from building at once.
func Build() (string, error) {
	return BuildContext(context.Background())
}

// BuildContext is Build with a context to cancel Maven.
func BuildContext(ctx context.Context) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if builtCP != "" {
		return builtCP, nil
	}
	dir, err := srcDir()
	if err != nil {
		return "", err
	}
	target := filepath.Join(dir, "target")
	if err := os.MkdirAll(target, 0o755); err != nil {
		return "", fmt.Errorf("hdfs: build: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(target, ".build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("hdfs: build lock: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("hdfs: build lock: %w", err)
	}
	defer func() { _ = unix.Flock(int(lock.Fd()), unix.LOCK_UN) }()

	if cp, ok := cachedClasspath(dir); ok {
		builtCP = cp
		return cp, nil
	}
	mvn, err := exec.LookPath("mvn")
	if err != nil {
		return "", fmt.Errorf("hdfs: build: mvn not found in PATH (install Maven 3.8+, e.g. apt-get install maven): %w", err)
	}
	cpFile := filepath.Join(target, "classpath.txt")
	_ = os.Remove(filepath.Join(target, stampName))
	goals := []string{"-q", "-B", "compile", "dependency:build-classpath", "-Dmdep.outputFile=" + cpFile}
	start := time.Now()
	out, err := runMaven(ctx, dir, mvn, append([]string{"-o"}, goals...))
	if err != nil {
		slog.Info("hdfs: offline Maven build failed, retrying online (downloads about 110 MB into ~/.m2 the first time)")
		out, err = runMaven(ctx, dir, mvn, goals)
	}
	if err != nil {
		return "", fmt.Errorf("hdfs: build: mvn in %s failed after %s: %w\n%s\n(needs Maven Central reachable once, or a filled ~/.m2)",
			dir, time.Since(start).Round(time.Second), err, tail(out, 4000))
	}
	slog.Info("hdfs: built", "dir", dir, "seconds", time.Since(start).Seconds())
	if err := os.WriteFile(filepath.Join(target, stampName), []byte(time.Now().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("hdfs: build stamp: %w", err)
	}
	cp, ok := cachedClasspath(dir)
	if !ok {
		return "", fmt.Errorf("hdfs: build: Maven succeeded but %s or the compiled classes are missing", cpFile)
	}
	builtCP = cp
	return cp, nil
}

func runMaven(ctx context.Context, dir, mvn string, args []string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, mvn, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// cachedClasspath returns the full classpath if a build stamp exists that is newer than
// pom.xml and every source file, and the compiled server and every dependency jar exist.
func cachedClasspath(dir string) (string, bool) {
	classes := filepath.Join(dir, "target", "classes")
	stamp, err := os.Stat(filepath.Join(dir, "target", stampName))
	if err != nil {
		return "", false
	}
	if _, err := os.Stat(filepath.Join(classes, "io", "readaheadd", "hdfsbench", "Server.class")); err != nil {
		return "", false
	}
	stale := errors.New("stale")
	check := func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		if st.ModTime().After(stamp.ModTime()) {
			return stale
		}
		return nil
	}
	if pom, err := os.Stat(filepath.Join(dir, "pom.xml")); err != nil || pom.ModTime().After(stamp.ModTime()) {
		return "", false
	}
	if err := filepath.WalkDir(filepath.Join(dir, "src"), check); err != nil {
		return "", false
	}
	raw, err := os.ReadFile(filepath.Join(dir, "target", "classpath.txt"))
	if err != nil {
		return "", false
	}
	deps := strings.Split(strings.TrimSpace(string(raw)), string(os.PathListSeparator))
	for _, j := range deps {
		if _, err := os.Stat(j); err != nil {
			return "", false
		}
	}
	return strings.Join(append([]string{classes}, deps...), string(os.PathListSeparator)), true
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}
