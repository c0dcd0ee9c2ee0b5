package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/test/lab"
)

// TestFreshBlockFiles measures the class HDFS DataNodes live in: block
// files each opened afresh and read whole once, back to back, every one of
// them slow before its open, on devices where a whole file takes from a
// quarter of a second to a few seconds. Per device model it reads the same
// files with every static window, then with readaheadd: a first pass from
// a daemon without state, a second pass of the same daemon, and a pass
// after a restart with the state the first daemon saved. It prints each
// pass's MB/s over all files and its ratio to the best static window and
// to the default, measured in the same run. Root, about 3 minutes with the
// defaults: `make bench-blocks`.
//
// READAHEADD_BLOCKS_MODELS: semicolon-separated device models
// "latency,MB/s,slots" (default "500us,400,32;150us,150,16": a fast device,
// whose files each read in a fraction of a second at the best window, and
// the lab's default); READAHEADD_BLOCKS_EXTRA: the files' added latency
// (default 3ms); READAHEADD_BLOCKS_FILES, _MB: how many files of how many
// MiB (6, 128); READAHEADD_BLOCKS_SENDFILE=1: read with sendfile(2).
func TestFreshBlockFiles(t *testing.T) {
	work, bin := benchDaemon(t, "blocks", "measure fresh block files")
	models := envOr("READAHEADD_BLOCKS_MODELS", "500us,400,32;150us,150,16")
	extra, err := time.ParseDuration(envOr("READAHEADD_BLOCKS_EXTRA", "3ms"))
	if err != nil {
		t.Fatalf("READAHEADD_BLOCKS_EXTRA: %v", err)
	}
	n := envInts(t, "READAHEADD_BLOCKS_FILES", "6")[0]
	mb := envInts(t, "READAHEADD_BLOCKS_MB", "128")[0]
	sendfile := os.Getenv("READAHEADD_BLOCKS_SENDFILE") == "1"
	reader := "read(2) 64 KB"
	if sendfile {
		reader = "sendfile(2)"
	}
	fmt.Printf("fresh block files: %d x %d MiB, each opened afresh and read once, back to back, every file +%v before its open; reader %s\n", n, mb, extra, reader)
	for _, spec := range strings.Split(models, ";") {
		m, err := parseModel(spec)
		if err != nil {
			t.Fatalf("READAHEADD_BLOCKS_MODELS: %v", err)
		}
		blocksModel(t, bin, work, m, extra, n, mb, sendfile)
	}
}

// benchDaemon skips a benchmark unless READAHEADD_BENCH names it and the
// lab is available, and builds the daemon into a fresh work directory
// (kept: the daemons' logs).
func benchDaemon(t *testing.T, name, what string) (work, bin string) {
	if os.Getenv("READAHEADD_BENCH") != name {
		t.Skipf("set READAHEADD_BENCH=%s (root) to %s (make bench-%s)", name, what, name)
	}
	if err := lab.Available(); err != nil {
		t.Skipf("lab unavailable: %v", err)
	}
	work, err := os.MkdirTemp("", "readaheadd-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	if bin, err = BuildDaemon(context.Background(), filepath.Join(work, "readaheadd")); err != nil {
		t.Fatal(err)
	}
	return work, bin
}

func blocksModel(t *testing.T, bin, work string, m lab.Model, extra time.Duration, n, mb int, sendfile bool) {
	l := upLab(t, lab.Options{SizeBytes: int64(n*mb+512) << 20, Model: m})
	must := fatalIf(t)
	must(os.MkdirAll(filepath.Join(l.Mount, "data", "subdir0"), 0o755))
	var files []string
	for i := 0; i < n; i++ {
		p, err := l.WriteFile(filepath.Join("data", "subdir0", fmt.Sprintf("blk_%d", 1000+i)), mb)
		must(err)
		files = append(files, p)
	}
	must(l.SetPermanent(extra, files...))
	pass := func() float64 {
		for _, f := range files {
			must(lab.DropFileCache(f))
		}
		start := time.Now()
		var total int64
		for _, f := range files {
			b, err := readWhole(f, sendfile)
			must(err)
			total += b
		}
		return float64(total) / time.Since(start).Seconds() / 1e6
	}
	fmt.Printf("\ndevice model: %v latency, %.0f MB/s, %d slots\n", m.Latency, m.BandwidthMBps, m.Slots)
	static := map[int]float64{}
	best, bestKB := 0.0, 0
	for _, kb := range []int{128, 256, 512, 1024, 2048, 4096} {
		must(l.SetReadAheadKB(kb))
		static[kb] = pass()
		if static[kb] > best {
			best, bestKB = static[kb], kb
		}
		fmt.Printf("  static %4d KB: %6.1f MB/s\n", kb, static[kb])
	}
	must(l.SetReadAheadKB(DefaultKB))
	state, err := os.MkdirTemp(work, "state-")
	must(err)
	ctx := context.Background()
	d, err := StartDaemonState(ctx, bin, l.Name, l.Mount, work, state)
	must(err)
	first, again := pass(), pass()
	must(d.Stop())
	d, err = StartDaemonState(ctx, bin, l.Name, l.Mount, work, state)
	must(err)
	saved := pass()
	acts, err := d.ActionsTotal()
	must(err)
	must(d.Stop())
	row := func(name string, v float64) {
		fmt.Printf("  readaheadd %-34s %6.1f MB/s  %.2f x best static (%d KB)  %.2f x default\n", name+":", v, v/best, bestKB, v/static[DefaultKB])
	}
	row("first pass, no state", first)
	row("second pass", again)
	row("after a restart with state", saved)
	fmt.Printf("  actions after the restart: %.0f; daemon logs in %s\n", acts, work)
	must(l.Down())
}

// upLab starts a lab device and takes it down when the test ends.
func upLab(t *testing.T, opts lab.Options) *lab.Lab {
	t.Helper()
	l, err := lab.Up(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

// fatalIf returns a function that ends the test on an error.
func fatalIf(t *testing.T) func(error) {
	return func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// readWhole opens path, reads it to its end (read(2) of lab.SeqBlock, or
// sendfile(2) to /dev/null) and closes it, as an HDFS DataNode serves a
// block: one open per read of the whole file.
func readWhole(path string, sendfile bool) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var total int64
	if sendfile {
		sink, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err != nil {
			return 0, err
		}
		defer sink.Close()
		var off int64
		for {
			n, err := unix.Sendfile(int(sink.Fd()), int(f.Fd()), &off, lab.SeqBlock)
			total += int64(n)
			if err != nil {
				return total, fmt.Errorf("sendfile %s: %w", path, err)
			}
			if n == 0 {
				return total, nil
			}
		}
	}
	buf := make([]byte, lab.SeqBlock)
	for {
		n, err := f.Read(buf)
		total += int64(n)
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, fmt.Errorf("read %s: %w", path, err)
		}
	}
}

// parseModel reads "latency,MB/s,slots".
func parseModel(s string) (lab.Model, error) {
	f := strings.Split(strings.TrimSpace(s), ",")
	if len(f) != 3 {
		return lab.Model{}, fmt.Errorf("%q: want latency,MB/s,slots", s)
	}
	lat, err := time.ParseDuration(f[0])
	if err != nil {
		return lab.Model{}, fmt.Errorf("%q: %w", s, err)
	}
	var bw float64
	var slots int
	if _, err := fmt.Sscanf(f[1]+" "+f[2], "%g %d", &bw, &slots); err != nil {
		return lab.Model{}, fmt.Errorf("%q: %w", s, err)
	}
	return lab.Model{Latency: lat, BandwidthMBps: bw, Slots: slots}, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
