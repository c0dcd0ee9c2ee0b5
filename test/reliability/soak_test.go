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

// detectorMaxFiles is the detector's default cap on tracked files
// (detector.DefaultConfig().MaxFiles), which the daemon uses.
const detectorMaxFiles = 4096

// TestSoak runs the daemon under 4 sequential readers over a churning set
// of files (created, read from the device, deleted), random mmap readers
// and a stream of small files (more distinct files than the detector's
// table holds), with the lab's regimes switching, for 75 s (10 minutes
// with READAHEADD_BENCH=full). It prints resident memory, goroutines,
// tracked files, lost events and actions over time, checks that the
// device really served what the readers read (its own sector counter),
// that memory, goroutines and tracked files stay bounded, and that the
// device ends at its original value.
func TestSoak(t *testing.T) {
	requireRoot(t, "BPF and the lab")
	dur, warm := 75*time.Second, 30*time.Second
	if lab.Full() {
		dur, warm = 10*time.Minute, 2*time.Minute
	}
	l := lab.New(t, lab.Options{SizeBytes: 2 << 30})
	const orig = 96
	require.NoError(t, l.SetReadAheadKB(orig))
	rnd, err := l.WriteFile("random", 128)
	require.NoError(t, err)
	stateDir := filepath.Join(t.TempDir(), "state")
	d := startDaemon(t, "--device", l.Name, "--allow-path", l.Mount, "--state-dir", stateDir, "--interval", "500ms")
	sectors0, err := sectorsRead(l.Name)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var g group
	var seqBytes, created, smallCreated, smallBytes, touches, rndBytes atomic.Int64
	for w := 0; w < 4; w++ {
		g.Go(func() error {
			for i := 0; ctx.Err() == nil; i++ {
				// WriteFile fsyncs the file and evicts it; readLoop evicts
				// it again before each pass: every pass reads the device.
				p, err := l.WriteFile(fmt.Sprintf("churn-%d-%d", w, i), 48)
				if err != nil {
					return err
				}
				created.Add(1)
				rctx, rc := context.WithTimeout(ctx, 4*time.Second)
				err = readLoop(rctx, p, &seqBytes)
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
			n, b, err := randomRead(ctx, rnd, 2*time.Second, i)
			if err != nil {
				return err
			}
			touches.Add(n)
			rndBytes.Add(b)
		}
		return nil
	})
	// Four writers of up to 100 new 8 KB files a second each: past the
	// detector's cap of 4096 tracked files within a minute (idle files age
	// out after one). Each batch waits for its syncfs behind the streams'
	// transfers on the saturated device, so the rate reached is well
	// below that (2800-3500 files in 75 s with two writers).
	for w := 0; w < 4; w++ {
		g.Go(func() error {
			return smallFiles(ctx, filepath.Join(l.Mount, fmt.Sprintf("small-%d", w)), 8, 100, 10000, &smallCreated, &smallBytes)
		})
	}
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
		at                     time.Duration
		rssKB                  int
		goroutines             float64
		tracked, evicted, lost float64
		missed                 float64
		acts, undone, failed   float64
		fileOpErrs             float64
		kb                     int
	}
	take := func(at time.Duration) sample {
		m := d.metrics(t)
		return sample{at: at, rssKB: rssKB(t, d.Pid()), goroutines: sum(m, `^go_goroutines$`),
			tracked: sum(m, `^readaheadd_detector_files_tracked$`), evicted: sum(m, `^readaheadd_detector_files_evicted_total$`),
			lost: sum(m, `^readaheadd_bpf_events_lost_total$`), missed: sum(m, `^readaheadd_bpf_missed_runs_total\{`),
			acts: actionsTaken(m), undone: sum(m, `^readaheadd_actions_total\{.*result="undone"`),
			failed: sum(m, `^readaheadd_actions_total\{.*result="failed"`), fileOpErrs: sum(m, `^readaheadd_tuner_errors_total\{kind="file_op"`),
			kb: int(sum(m, `^readaheadd_read_ahead_kb\{device="`+l.Name+`"`))}
	}
	start := time.Now()
	samples := []sample{take(0)}
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(dur / 10):
		}
		samples = append(samples, take(time.Since(start)))
		require.True(t, d.running(), "daemon alive")
		code, _, err := d.get("/healthz")
		require.NoError(t, err)
		assert.Equal(t, 200, code, "healthz at %s", time.Since(start).Round(time.Second))
	}
	require.NoError(t, g.Wait())
	elapsed := time.Since(start)
	_ = l.Clear()
	sectors1, err := sectorsRead(l.Name)
	require.NoError(t, err)
	devBytes := int64(sectors1-sectors0) * 512

	var b strings.Builder
	fmt.Fprintf(&b, "%6s %8s %10s %8s %8s %6s %6s %8s %7s %7s %8s %6s\n", "t", "RSS MiB", "goroutines", "tracked", "evicted", "lost", "missed", "actions", "undone", "failed", "file_op", "ra_kb")
	for _, s := range samples {
		fmt.Fprintf(&b, "%6s %8.1f %10.0f %8.0f %8.0f %6.0f %6.0f %8.0f %7.0f %7.0f %8.0f %6d\n", s.at.Round(time.Second), float64(s.rssKB)/1024,
			s.goroutines, s.tracked, s.evicted, s.lost, s.missed, s.acts, s.undone, s.failed, s.fileOpErrs, s.kb)
	}
	mb := func(n int64) float64 { return float64(n) / 1e6 }
	seqDev := devBytes - rndBytes.Load() - smallBytes.Load()
	ratio := float64(seqDev) / float64(max(seqBytes.Load(), 1))
	t.Logf("soak for %s: %d churn files (48 MiB) created, read and deleted; %d small files (8 KiB); %d random page touches\n"+
		"sequential readers read %.0f MB (%.1f MB/s); device read %.0f MB (%.1f MB/s): %.0f MB by the random reader's faults, "+
		"%.0f MB of small files, so %.0f MB for the sequential readers = %.2f of what they read\n%s",
		dur, created.Load(), smallCreated.Load(), touches.Load(),
		mb(seqBytes.Load()), mb(seqBytes.Load())/elapsed.Seconds(), mb(devBytes), mb(devBytes)/elapsed.Seconds(),
		mb(rndBytes.Load()), mb(smallBytes.Load()), mb(seqDev), ratio, b.String())

	var fails []string
	for _, ln := range strings.Split(d.Logs.String(), "\n") {
		if strings.Contains(ln, "result=failed") && len(fails) < 5 {
			fails = append(fails, ln)
		}
	}
	if len(fails) > 0 {
		t.Logf("first failed actions (each a step that could not be applied, retried after its back-off):\n%s", strings.Join(fails, "\n"))
	}
	require.Greater(t, len(samples), 2)
	// The readers loaded the device rather than the page cache.
	assert.GreaterOrEqual(t, ratio, 0.8, "device bytes for the sequential readers / bytes they read")
	// A leak shows as the peaks rising: a single sample is anywhere on the
	// collector's saw-tooth (the heap doubles between cycles), so the peak
	// RSS of the later half after warm-up is held to the earlier half's.
	var settled []sample
	for _, s := range samples {
		if s.at >= warm {
			settled = append(settled, s)
		}
	}
	require.GreaterOrEqual(t, len(settled), 2, "samples after warm-up")
	half := len(settled) / 2
	peak := func(ss []sample) int {
		p := 0
		for _, s := range ss {
			p = max(p, s.rssKB)
		}
		return p
	}
	early, late := peak(settled[:half]), peak(settled[half:])
	after, last := settled[0], settled[len(settled)-1]
	assert.LessOrEqual(t, late-early, 10*1024, "peak RSS grew by more than 10 MB after warm-up (%d -> %d KB)", early, late)
	assert.LessOrEqual(t, last.goroutines, after.goroutines+10, "goroutines grew")
	for _, s := range samples {
		assert.LessOrEqual(t, s.tracked, float64(detectorMaxFiles), "tracked files bounded by the detector's cap at %s", s.at)
	}
	assert.Positive(t, last.evicted, "files were evicted from the detector's table")
	assert.Greater(t, smallCreated.Load(), int64(detectorMaxFiles), "more distinct files than the cap")
	assert.Positive(t, created.Load())
	assert.Positive(t, last.acts, "the daemon acted")
	assert.Contains(t, d.metrics(t), `readaheadd_bpf_missed_runs_total{program="block_rq_complete"}`, "the kernel's skipped runs are exported")

	assert.Equal(t, 0, d.stop(t))
	assert.Equal(t, orig, readKB(t, l.Name), "device back at its original")
	assert.NoFileExists(t, filepath.Join(stateDir, "originals.json"))
}
