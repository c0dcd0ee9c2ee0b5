// Package daemontest holds what the tests that run readaheadd as a separate
// process share: building the binary, a free loopback address for its
// metrics endpoint, and a buffer that collects its output safely.
package daemontest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// ModuleRoot finds the directory of readaheadd's go.mod, walking up from the
// working directory (go test runs a package's tests in its own directory).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/readaheadd/readaheadd\n")) {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("go.mod of readaheadd not found above the working directory")
		}
		dir = up
	}
}

// Build compiles cmd/readaheadd into a new temporary directory that every
// user may enter (tests also run the binary as an unprivileged user), and
// returns the binary's path and a function that removes the directory.
func Build(prefix string) (bin string, cleanup func(), err error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	if err := os.Chmod(dir, 0o755); err != nil {
		cleanup()
		return "", nil, err
	}
	bin = filepath.Join(dir, "readaheadd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/readaheadd")
	cmd.Dir = root
	// As make build and the image build it (a static binary); a cgo build
	// drops its capabilities as well (cmd/readaheadd's caps test).
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build ./cmd/readaheadd: %w\n%s", err, out)
	}
	return bin, cleanup, nil
}

// FreeAddr returns a loopback TCP address that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free loopback port: %v", err)
	}
	a := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatalf("release loopback port %s: %v", a, err)
	}
	return a
}

// OK reports whether a GET of url answers 200: for require.Eventually while
// a daemon (or a server beside it) starts.
func OK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// SyncBuffer is a bytes.Buffer safe for a child's stdout and stderr writers
// and a reading test at once.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
