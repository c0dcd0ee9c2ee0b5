package reliability

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/lab"
)

// TestSoak runs the daemon under 4 sequential readers over a churning set
// of files (created, read, deleted) plus random mmap readers, with the
// lab's regimes switching, for about a minute (ten with
// READAHEADD_BENCH=full), and prints resident memory, goroutines, tracked
// files, lost events and actions; the device ends at its original value.
func TestSoak(t *testing.T) {
	requireRoot(t, "BPF and the lab")
	dur := 75 * time.Second
	if lab.Full() {
		dur = 10 * time.Minute
	}
	l := lab.New(t, lab.Options{SizeBytes: 2 << 30})
	const orig = 96
	require.NoError(t, l.SetReadAheadKB(orig))
	rnd, err := l.WriteFile("random", 128)
	require.NoError(t, err)
	stateDir := filepath.Join(t.TempDir(), "state")
	d := startDaemon(t, "--device", l.Name, "--allow-path", l.Mount, "--state-dir", stateDir, "--interval", "500ms")

	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var g group
	var bytes, created atomic.Int64
	for w := 0; w < 4; w++ {
		g.Go(func() error {
			for i := 0; ctx.Err() == nil; i++ {
				name := fmt.Sprintf("churn-%d-%d", w, i)
				p, err := l.WriteFile(name, 48)
				if err != nil {
					return err
				}
				created.Add(1)
				rctx, rc := context.WithTimeout(ctx, 4*time.Second)
				err = readLoop(rctx, p, &bytes)
				rc()
				if err != nil {
					return err
				}
				if err := os.Remove(p); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		for i := uint64(0); ctx.Err() == nil; i++ {
			if _, err := lab.RandomMmapRead(ctx, rnd, 2*time.Second, i); err != nil {
				return err
			}
			_ = lab.DropFileCache(rnd)
		}
		return nil
	})
	// Regimes switch: permanent on the whole device, temporal tails, none.
	g.Go(func() error {
		for i := 0; ctx.Err() == nil; i++ {
			var err error
			switch i % 3 {
			case 0:
				err = l.SetPermanentRanges(4*time.Millisecond, []lab.Range{{Off: 0, Len: 2 << 30}}, "device")
			case 1:
				_ = l.Clear()
				_, err = l.SetTemporal(lab.Temporal{Period: 2 * time.Second, Duration: time.Second, Fraction: 0.1, Extra: 20 * time.Millisecond})
			case 2:
				err = l.Clear()
			}
			if err != nil {
				return err
			}
			select {
			case <-ctx.Done():
			case <-time.After(8 * time.Second):
			}
		}
		return nil
	})

	type sample struct {
		at               time.Duration
		rssKB            int
		goroutines       float64
		tracked          int
		lost, acts, undo float64
	}
	take := func(at time.Duration) sample {
		m := d.metrics(t)
		_, files, _ := d.get("/debug/files?n=100000")
		return sample{at: at, rssKB: rssKB(t, d.Pid()), goroutines: sum(m, `^go_goroutines$`),
			tracked: strings.Count(files, `"file"`), lost: sum(m, `^readaheadd_bpf_events_lost_total$`),
			acts: actionsTaken(m), undo: sum(m, `^readaheadd_actions_total\{.*result="undone"`)}
	}
	start := time.Now()
	var samples []sample
	warm := 20 * time.Second
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(dur / 10):
		}
		samples = append(samples, take(time.Since(start)))
		require.True(t, d.running(), "daemon alive")
	}
	require.NoError(t, g.Wait())
	_ = l.Clear()

	var b strings.Builder
	fmt.Fprintf(&b, "%8s %9s %10s %8s %8s %8s %8s\n", "t", "RSS MiB", "goroutines", "tracked", "lost", "actions", "undone")
	for _, s := range samples {
		fmt.Fprintf(&b, "%8s %9.1f %10.0f %8d %8.0f %8.0f %8.0f\n", s.at.Round(time.Second), float64(s.rssKB)/1024, s.goroutines, s.tracked, s.lost, s.acts, s.undo)
	}
	t.Logf("soak for %s: %d files created, read and deleted, %.0f MB read by the sequential readers\n%s",
		dur, created.Load(), float64(bytes.Load())/1e6, b.String())
	require.NotEmpty(t, samples)
	var after *sample
	for i := range samples {
		if samples[i].at >= warm {
			after = &samples[i]
			break
		}
	}
	last := samples[len(samples)-1]
	if after != nil {
		assert.LessOrEqual(t, last.rssKB-after.rssKB, 10*1024, "RSS grew by more than 10 MB after warm-up")
		assert.LessOrEqual(t, last.goroutines, after.goroutines+10, "goroutines grew")
	}
	assert.Less(t, last.tracked, 1000, "tracked files bounded")
	assert.Positive(t, created.Load())

	assert.Equal(t, 0, d.stop(t))
	assert.Equal(t, orig, readKB(t, l.Name), "device back at its original")
	assert.NoFileExists(t, filepath.Join(stateDir, "originals.json"))
}
