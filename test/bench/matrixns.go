package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/readaheadd/readaheadd/test/lab"
)

// nsStreamEnv carries a namespaced stream's spec (nsStreamSpec, JSON) to
// the process that reads it: a copy of the running binary, whose main (or
// TestMain) calls NSStreamMain first.
const nsStreamEnv = "READAHEADD_MATRIX_NS_STREAM"

type nsStreamSpec struct {
	Kind   string `json:"kind"`
	Path   string `json:"path"`
	Afresh bool   `json:"afresh"`
	Pause  bool   `json:"pause"`
	Seed   uint64 `json:"seed"`
}

// nsReportEvery: how often the namespaced stream reports its bytes.
const nsReportEvery = 50 * time.Millisecond

// NSStreamMain makes this process a namespaced matrix stream when
// mNSStream started it: it reads its file as mStream does, prints the bytes
// it got every nsReportEvery, and exits on SIGTERM. Otherwise it returns.
func NSStreamMain() {
	env := os.Getenv(nsStreamEnv)
	if env == "" {
		return
	}
	var sp nsStreamSpec
	if err := json.Unmarshal([]byte(env), &sp); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", nsStreamEnv, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	s := &mStream{kind: sp.Kind, path: sp.Path, afresh: sp.Afresh, pause: sp.Pause, rng: rand.New(rand.NewPCG(sp.Seed, sp.Seed^0x5bd1e995))}
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()
	t := time.NewTicker(nsReportEvery)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			fmt.Println(s.delivered())
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			os.Exit(0)
		case <-t.C:
			fmt.Println(s.delivered())
		}
	}
}

// mNSStream is a stream in a mount namespace of its own (unshare(1)), which
// sees the lab's data directory bind-mounted at another path: the daemon
// meets its descriptor under a path it cannot resolve in its own
// namespace, as with a pod's hostPath volume.
type mNSStream struct {
	spec  nsStreamSpec
	bytes atomic.Int64
}

func newNSStream(r lab.MatrixReader, path string, seed uint64) *mNSStream {
	return &mNSStream{spec: nsStreamSpec{Kind: r.Kind, Path: path, Afresh: r.Afresh, Pause: r.Pause, Seed: seed}}
}

func (s *mNSStream) delivered() int64   { return s.bytes.Load() }
func (s *mNSStream) touches() *touchLog { return nil }

func (s *mNSStream) run(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// The volume's mount point exists on the host too, empty: the bind
	// mount is the namespace's alone and goes with it.
	vol, err := os.MkdirTemp("", "readaheadd-ns-volume-")
	if err != nil {
		return err
	}
	defer os.Remove(vol)
	sp := s.spec
	sp.Path = filepath.Join(vol, filepath.Base(s.spec.Path))
	env, err := json.Marshal(sp)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$0" "$1" && exec "$2"`, filepath.Dir(s.spec.Path), vol, exe)
	cmd.Env = append(os.Environ(), nsStreamEnv+"="+string(env))
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start a stream in its own mount namespace (needs unshare(1) and root): %w", err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if n, err := strconv.ParseInt(sc.Text(), 10, 64); err == nil {
			s.bytes.Store(n)
		}
	}
	err = cmd.Wait()
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stream in its own mount namespace (%s): %w: %s", sp.Path, err, stderr.String())
	}
	return nil
}
