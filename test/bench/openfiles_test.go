package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/readaheadd/readaheadd/test/holder"
	"github.com/readaheadd/readaheadd/test/lab"
)

func TestMain(m *testing.M) {
	holder.Main()
	NSStreamMain()
	os.Exit(m.Run())
}

// TestManyOpenFiles: what the daemon costs, and how soon it acts, when
// other processes hold many files open on the data disk. One file turns
// slow (+3 ms per read) before its open; a reader streams it for 6 s while
// the daemon runs, without and with 102,000 idle descriptors held by six
// other processes (17,000 each: the hard RLIMIT_NOFILE here is 20,000).
// Prints the daemon's CPU share over those 6 s, its first action after the
// open, and the stream's MB/s beside the static windows'.
func TestManyOpenFiles(t *testing.T) {
	if os.Getenv("READAHEADD_BENCH") != "openfiles" {
		t.Skip("set READAHEADD_BENCH=openfiles (root) to measure the daemon beside many open files (make bench-openfiles)")
	}
	if err := lab.Available(); err != nil {
		t.Skipf("lab unavailable: %v", err)
	}
	procs := envInts(t, "READAHEADD_OPENFILES_PROCS", "6")[0]
	perProc := envInts(t, "READAHEADD_OPENFILES_EACH", "17000")[0]
	runs := envInts(t, "READAHEADD_OPENFILES_RUNS", "2")[0]
	const stream = 6 * time.Second
	work, err := os.MkdirTemp("", "readaheadd-openfiles-") // kept: the daemons' logs
	if err != nil {
		t.Fatal(err)
	}
	bin := os.Getenv("READAHEADD_BIN") // another build, to compare
	if bin == "" {
		if bin, err = BuildDaemon(context.Background(), filepath.Join(work, "readaheadd")); err != nil {
			t.Fatal(err)
		}
	}
	l := upLab(t, lab.Options{SizeBytes: 3 << 30})
	must := fatalIf(t)
	slow, err := l.WriteFile("slow", 1536)
	must(err)
	held, err := l.WriteFile("held", 1)
	must(err)
	must(l.SetPermanent(3*time.Millisecond, slow))
	// read streams slow from its open for the run and returns MB/s.
	read := func() (float64, time.Time) {
		must(lab.DropFileCache(slow))
		f, err := os.Open(slow)
		must(err)
		defer f.Close()
		opened := time.Now()
		buf := make([]byte, lab.SeqBlock)
		var n int64
		for time.Since(opened) < stream {
			k, err := f.Read(buf)
			n += int64(k)
			if err == io.EOF {
				break
			}
			must(err)
		}
		return float64(n) / time.Since(opened).Seconds() / 1e6, opened
	}
	// holding runs f with the other processes' files open, or none.
	holding := func(files bool, f func()) {
		if files {
			_, stop, err := holder.Start(procs, perProc, held)
			defer stop()
			must(err)
		}
		f()
	}
	// The static windows with and without the files: holding them slows
	// the stream by itself here (a 1024 KB window: 138 -> 93 MB/s).
	type static struct {
		mbps map[int]float64
		best float64
		kb   int
	}
	statics := map[bool]*static{}
	for _, files := range []bool{false, true} {
		st := &static{mbps: map[int]float64{}}
		holding(files, func() {
			for _, kb := range []int{DefaultKB, 1024, 2048} {
				must(l.SetReadAheadKB(kb))
				st.mbps[kb], _ = read()
				if st.mbps[kb] > st.best {
					st.best, st.kb = st.mbps[kb], kb
				}
			}
		})
		statics[files] = st
	}
	must(l.SetReadAheadKB(DefaultKB))

	type result struct {
		cpu, mbps float64
		first     time.Duration // -1: none
		acts      int
	}
	arm := func() result {
		d, err := StartDaemon(context.Background(), bin, l.Name, l.Mount, work)
		must(err)
		defer d.Stop()
		time.Sleep(2 * time.Second) // past its start
		resume := d.Quiet()
		u0, err := d.Usage()
		must(err)
		mbps, opened := read()
		u1, err := d.Usage()
		must(err)
		resume()
		r := result{cpu: 100 * (u1.CPUSeconds - u0.CPUSeconds) / (u1.WallSec - u0.WallSec), mbps: mbps, first: -1}
		time.Sleep(200 * time.Millisecond) // the last status poll
		for _, a := range d.Actions(opened) {
			if a.At < 0 || a.At > stream {
				continue
			}
			if r.first < 0 {
				r.first = a.At
			}
			r.acts++
		}
		must(d.Stop())
		return r
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("many open files: a stream of a file slowed +3 ms before its open, read for %v from its open; daemon --interval 1s\n", stream)
	fmt.Printf("other processes' files: none, or %d x %d = %d descriptors on the data disk (idle); load average %s", procs, perProc, procs*perProc, load)
	name := func(files bool) string {
		if files {
			return strconv.Itoa(procs * perProc)
		}
		return "none"
	}
	for _, files := range []bool{false, true} {
		st := statics[files]
		fmt.Printf("static windows, other processes' files %s: %d KB %.1f MB/s, 1024 KB %.1f MB/s, 2048 KB %.1f MB/s\n",
			name(files), DefaultKB, st.mbps[DefaultKB], st.mbps[1024], st.mbps[2048])
	}
	fmt.Printf("\n%-4s %-22s %9s %14s %8s %9s %12s\n", "run", "other processes' files", "CPU %", "first action", "actions", "MB/s", "x best")
	for run := 1; run <= runs; run++ {
		for _, files := range []bool{false, true} {
			var r result
			holding(files, func() { r = arm() })
			first := "none"
			if r.first >= 0 {
				first = fmt.Sprintf("%.2f s", r.first.Seconds())
			}
			fmt.Printf("%-4d %-22s %9.2f %14s %8d %9.1f %12.2f\n", run, name(files), r.cpu, first, r.acts, r.mbps, r.mbps/statics[files].best)
		}
	}
	fmt.Printf("\nx best: to the best static window with the same files held (%d KB without, %d KB with); daemon logs in %s\n",
		statics[false].kb, statics[true].kb, work)
}
