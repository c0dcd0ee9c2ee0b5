package tuner

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// mmapRig: a slowed sequential reader (pid 100) and a random mmap reader
// (pid 200, no readahead events: its faults read around without one) on
// the same device.
type mmapRig struct {
	*rig
	seq, rnd   probe.FileKey
	slowed     bool
	rndP50     func(kb int) time.Duration
	rndSeq     float64
	rndPresent bool
}

func newMmapRig(t *testing.T, cfg Config) *mmapRig { return newMmapRigWith(t, cfg, nil) }

// newMmapRigWith is newMmapRig with mutate applied to the rig before New.
func newMmapRigWith(t *testing.T, cfg Config, mutate func(*rig)) *mmapRig {
	cfg.DisablePrefetch = true
	m := &mmapRig{rig: newRig(t, cfg, mutate), slowed: true, rndSeq: 0.02, rndPresent: true}
	m.tput = slowedModel
	var p string
	p, m.seq = realFile(t, filepath.Join(m.dir, "data"), "blk_1")
	m.reader(100, 7, p, m.seq)
	p, m.rnd = realFile(t, filepath.Join(m.dir, "data"), "index")
	m.files.open(200, 9, p, m.rnd)
	// Each fault reads the whole window around the page; its wait is the
	// transfer of that window plus a fixed part.
	m.rndP50 = func(kb int) time.Duration { return time.Millisecond + time.Duration(kb)*7*time.Microsecond }
	return m
}

func (m *mmapRig) snapshot() detector.Snapshot {
	kind := detector.RegimeKind("")
	if m.slowed {
		kind = detector.FileLatencyShift
	}
	s := m.snap(kind, m.seq)
	if m.rndPresent {
		kb := m.files.window[m.rnd]
		fs := randomStats(m.rnd, s.Now, 200, m.rndP50(kb), 3*m.rndP50(kb)/2, uint64(kb)<<10)
		fs.Sequentiality = m.rndSeq
		s.Files = append(s.Files, fs)
	}
	return s
}

func (m *mmapRig) run(n int) []Action {
	return m.rig.run(n, m.snapshot)
}

func trimActs(acts []Action, key probe.FileKey) []Action {
	var out []Action
	for _, a := range acts {
		if a.File == key {
			out = append(out, a)
		}
	}
	return out
}

func TestTrimGivesARandomMmapReaderASmallWindowBesideAHelpedFile(t *testing.T) {
	m := newMmapRig(t, Config{})
	acts := m.run(1)
	require.Greater(t, m.files.window[m.seq], 128, "the slowed reader's window is raised")
	rnd := trimActs(acts, m.rnd)
	require.NotEmpty(t, rnd, "the random reader's open file is trimmed once the device serves a raised window")
	assert.Equal(t, KindTrim, rnd[0].Kind)
	assert.Equal(t, ResultTrial, rnd[0].Result)
	assert.Equal(t, 128, rnd[0].FromKB)
	assert.Equal(t, 16, rnd[0].ToKB)
	assert.Contains(t, rnd[0].Evidence, "read-around trim")
	assert.Equal(t, 16, m.files.window[m.rnd])
	assert.Equal(t, 128, m.sys.get("sdb"), "the device is back at its own window after the pin")
	assert.Equal(t, 1, m.files.scans, "its readers were found in the processes' descriptors")
	var recorded bool
	for _, p := range m.store.Pins() {
		if p.Ino == m.rnd.Ino && p.WindowKB == 16 {
			recorded = true
		}
	}
	assert.True(t, recorded, "a trimmed open file outlives a crash: recorded like any pin")

	// Its faults read 16 KB now and wait less: kept.
	rnd = trimActs(m.run(3), m.rnd)
	require.Len(t, rnd, 1)
	assert.Equal(t, ResultKept, rnd[0].Result)
	assert.Equal(t, 16, m.files.window[m.rnd])
	var st *FileStatus
	for _, f := range m.tn.Status().Files {
		if f.File == m.rnd {
			st = &f
		}
	}
	require.NotNil(t, st)
	assert.Equal(t, "trimmed", st.State)
	assert.Equal(t, 16, st.WindowKB)

	// The slowdown ends: the slowed file's window goes back after Grace,
	// then the trim a Settle later (it paid for that window; alone it only
	// trades the reader's faults for the stream's bytes).
	m.slowed = false
	var undone []Action
	var winBack time.Duration
	for _, a := range m.run(25) {
		if a.File == m.rnd && a.Kind == KindTrimUndo {
			undone = append(undone, a)
		}
		if a.File == m.seq && a.Kind == KindFileWindowUndo && a.Result == ResultUndone {
			winBack = a.Time
		}
	}
	require.Len(t, undone, 1)
	require.NotZero(t, winBack, "the slowed file's window went back")
	assert.LessOrEqual(t, undone[0].Time-winBack, 2*time.Second, "the trim ends a Settle after the window it paid for")
	assert.Equal(t, ResultUndone, undone[0].Result)
	assert.Equal(t, 128, undone[0].ToKB)
	assert.Equal(t, 128, m.files.window[m.rnd])
	assert.Equal(t, 128, m.files.window[m.seq])
	assert.Empty(t, m.store.Pins(), "nothing left recorded")
	assert.Empty(t, m.tn.Status().Files)
}

func TestNoTrimOnAHealthyDevice(t *testing.T) {
	m := newMmapRig(t, Config{})
	m.slowed = false
	acts := m.run(20)
	assert.Empty(t, acts, "no action while nothing is raised on the device")
	assert.Equal(t, 128, m.files.window[m.rnd])
	assert.Zero(t, m.files.scans, "no search through the processes either")
}

func TestNoTrimForReadsThatAreNotReadAround(t *testing.T) {
	for name, mutate := range map[string]func(m *mmapRig){
		"sequential": func(m *mmapRig) { m.rndSeq = 0.5 },
		"small reads": func(m *mmapRig) {
			m.files.window[m.rnd] = 32 // requests of 32 KB: what the reader asked for
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := newMmapRig(t, Config{})
			mutate(m)
			assert.Empty(t, trimActs(m.run(10), m.rnd))
		})
	}
}

func TestTrimUndoneWhenItDoesNotPay(t *testing.T) {
	m := newMmapRig(t, Config{})
	require.NotEmpty(t, trimActs(m.run(1), m.rnd))
	require.Equal(t, 16, m.files.window[m.rnd])
	// The reader's accesses had locality: the small window makes it fault
	// on the neighbouring pages, one request each.
	m.rndSeq = 0.6
	rnd := trimActs(m.run(1), m.rnd)
	require.Len(t, rnd, 1)
	assert.Equal(t, KindTrimUndo, rnd[0].Kind)
	assert.Equal(t, ResultUndone, rnd[0].Result)
	assert.Contains(t, rnd[0].Evidence, "did not pay")
	assert.Equal(t, 128, m.files.window[m.rnd])
	// Backed off: not tried again within the minute.
	m.rndSeq = 0.02
	assert.Empty(t, trimActs(m.run(50), m.rnd))
	assert.NotEmpty(t, trimActs(m.run(40), m.rnd), "tried again after the back-off")
}

// A reader that closes its trimmed descriptor and opens the file again
// reads around with the device's window on the new one: the trim's
// verdict says so, not that its reads are the ones it asks for.
func TestTrimUndoneOnAReaderThatReopensSaysSo(t *testing.T) {
	m := newMmapRig(t, Config{})
	m.files.closedFDs = true
	require.NotEmpty(t, trimActs(m.run(1), m.rnd))
	require.Equal(t, 16, m.files.window[m.rnd])
	p := m.files.fds[200][0].Path
	m.files.closeFD(200, 9)
	m.files.open(200, 10, p, m.rnd)
	m.files.window[m.rnd] = 128 // the new descriptor has the device's window
	rnd := trimActs(m.run(1), m.rnd)
	require.Len(t, rnd, 1)
	assert.Equal(t, KindTrimUndo, rnd[0].Kind)
	assert.Contains(t, rnd[0].Evidence, "every descriptor it trimmed is closed")
	assert.NotContains(t, rnd[0].Evidence, "the reads it asks for")
}

func TestTrimUndoneForBufferedRandomReads(t *testing.T) {
	m := newMmapRig(t, Config{})
	// 128 KB random read() calls: the window does not shape them.
	m.files.window[m.rnd] = 128
	big := func() detector.Snapshot {
		s := m.snapshot()
		fs := randomStats(m.rnd, s.Now, 200, m.rndP50(128), 3*m.rndP50(128)/2, 128<<10)
		fs.Sequentiality = m.rndSeq
		s.Files[1] = fs
		return s
	}
	acts := trimActs(m.rig.run(2, big), m.rnd)
	require.Len(t, acts, 2)
	assert.Equal(t, ResultTrial, acts[0].Result)
	assert.Equal(t, KindTrimUndo, acts[1].Kind)
	assert.Contains(t, acts[1].Evidence, "not read-around")
	assert.Empty(t, trimActs(m.rig.run(120, big), m.rnd), "not tried again soon")
}

func TestTrimReachesADescriptorOpenedLater(t *testing.T) {
	m := newMmapRig(t, Config{})
	m.run(31) // past the scan period of the first search
	require.Equal(t, 16, m.files.window[m.rnd])
	// The reader opens the file again: the new descriptor has the
	// device's window, and its faults read 128 KB again.
	p := m.files.fds[200][0].Path
	m.files.open(201, 4, p, m.rnd)
	m.files.window[m.rnd] = 128
	var applied []Action
	for _, a := range trimActs(m.run(31), m.rnd) {
		if a.Result == ResultApplied {
			applied = append(applied, a)
		}
	}
	require.Len(t, applied, 1, "the new descriptor is found within the scan period")
	assert.Equal(t, 16, applied[0].ToKB)
	assert.Contains(t, applied[0].Evidence, "2 open descriptor(s)")
	assert.Equal(t, 16, m.files.window[m.rnd])
	assert.Empty(t, trimActs(m.run(40), m.rnd), "nothing more while the requests stay small")
}

// A reader that closes its file and opens it again mostly gets the same
// descriptor number back, on a new open file with the device's window: it
// is trimmed again all the same. And a reader that does so again and again
// leaves the trim holding the descriptors open now, not one more per
// search.
func TestTrimReachesAReopenedDescriptorOfTheSameNumber(t *testing.T) {
	m := newMmapRig(t, Config{})
	m.run(31)
	require.Equal(t, 16, m.files.window[m.rnd])
	p := m.files.fds[200][0].Path
	for i := 0; i < 5; i++ {
		// Closed and opened again: the same number, the device's window
		// (one descriptor of a new number open beside it at times).
		m.files.fds[200] = nil
		m.files.open(200, 9, p, m.rnd)
		if i%2 == 1 {
			m.files.open(200, 10+i, p, m.rnd)
		}
		m.files.window[m.rnd] = 128
		var applied []Action
		for _, a := range trimActs(m.run(31), m.rnd) {
			if a.Result == ResultApplied {
				applied = append(applied, a)
			}
		}
		require.Len(t, applied, 1, "re-open %d: trimmed again within the scan period", i)
		assert.Equal(t, 16, m.files.window[m.rnd])
		m.tn.mu.Lock()
		td := m.tn.trims[m.rnd]
		require.NotNil(t, td)
		assert.Len(t, td.refs, len(m.files.fds[200]), "the trim holds the descriptors open now")
		m.tn.mu.Unlock()
	}
}

func TestTrimEndsAtShutdownAndWhenTheReaderGoes(t *testing.T) {
	m := newMmapRig(t, Config{})
	m.run(3)
	require.Equal(t, 16, m.files.window[m.rnd])
	require.NoError(t, m.tn.RestoreAll())
	assert.Equal(t, 128, m.files.window[m.rnd], "shutdown gives the open file the device's window again")
	assert.Equal(t, 128, m.sys.get("sdb"))
	assert.Empty(t, m.store.Pins())

	m = newMmapRig(t, Config{})
	m.run(3)
	require.Equal(t, 16, m.files.window[m.rnd])
	m.files.gone[200] = true
	m.rndPresent = false
	m.slowed = false
	var undone []Action
	for _, a := range m.run(25) {
		if a.File == m.rnd {
			undone = append(undone, a)
		}
	}
	require.Len(t, undone, 1)
	assert.Contains(t, undone[0].Evidence, "readers gone")
	assert.Empty(t, m.tn.Status().Files)
}

func TestTrimDisabledAndDryRun(t *testing.T) {
	m := newMmapRig(t, Config{DisableTrim: true})
	assert.Empty(t, trimActs(m.run(10), m.rnd))
	assert.Equal(t, 128, m.files.window[m.rnd])

	m = newMmapRig(t, Config{DryRun: true})
	rnd := trimActs(m.run(3), m.rnd)
	require.Len(t, rnd, 1)
	assert.Equal(t, ResultDryRun, rnd[0].Result)
	assert.Equal(t, 128, m.files.window[m.rnd], "nothing written in dry-run mode")
}

func TestTrimBookkeepingIsBounded(t *testing.T) {
	m := newMmapRig(t, Config{})
	m.run(1)
	m.rndSeq = 0.6
	m.run(1) // undone, backed off
	require.NotEmpty(t, m.tn.trimOffs)
	require.NotEmpty(t, m.tn.trimScanAt)
	// The random reader goes away for good: nothing about it stays.
	m.rndPresent = false
	m.run(7 * 60)
	assert.Empty(t, m.tn.trims)
	assert.Empty(t, m.tn.trimOffs)
	assert.Empty(t, m.tn.trimScanAt)
}

// A daemon restarted with saved priors gives a fresh open its directory's
// window before its first Step, when it has not yet seen the device's
// random readers: an mmap reader beside it reads its faults' read-around
// at the device's window until trimmed, and it is trimmed on the recent
// requests a quarter Settle later, not at the first Step.
func TestRandomReaderBesideAPriorGivenAtStartUpIsTrimmedBeforeTheFirstStep(t *testing.T) {
	r := newRig(t, Config{DisablePrefetch: true}, nil)
	tn, w := restartedWithPrior(t, r)

	keys, _ := tn.trimStreams()
	assert.Empty(t, keys, "no window raised: nothing to look for")

	rp, rnd := realFile(t, filepath.Join(r.dir, "data"), "index")
	r.files.open(200, 9, rp, rnd)
	p2, k2 := realFile(t, filepath.Join(r.dir, "data", "sub0"), "blk_2")
	r.files.open(300, 4, p2, k2)
	tn.ObserveReadahead(probe.ReadaheadEvent{Tgid: 300, File: k2, Device: sdb, RaPages: 32})
	require.Equal(t, w, r.files.window[k2], "the prior, given before any Step")

	r.clk.Advance(100 * time.Millisecond) // the daemon's next tick
	keys, span := tn.trimStreams()
	require.Equal(t, []probe.FileKey{k2}, keys, "the stream with the raised window names its device")
	require.Equal(t, 250*time.Millisecond, span)
	again, _ := tn.trimStreams()
	assert.Empty(t, again, "asked once a quarter Settle")

	now := r.clk.Now()
	recent := detector.Snapshot{Now: now, Devices: []detector.DeviceStats{{Device: sdb, BusyThroughput: 100e6, CapacityBPS: 400e6}}}
	recent.Files = append(recent.Files,
		detector.FileStats{Key: k2, Device: sdb, Requests: 40, Bytes: 40 << 19, MeanSize: 512 << 10, BusyThroughput: 80e6,
			Sequentiality: 1, LastSeen: now, P50: 3 * time.Millisecond},
		// 120 faults a second, each reading the device's 128 KB window.
		randomStats(rnd, now, 30, 2*time.Millisecond, 4*time.Millisecond, 128<<10))
	acts := tn.fastTrim(recent, span)
	logActs(t, acts)
	trims := trimActs(acts, rnd)
	require.Len(t, trims, 1, "trimmed between Steps")
	assert.Equal(t, KindTrim, trims[0].Kind)
	assert.Equal(t, ResultTrial, trims[0].Result)
	assert.Equal(t, 16, r.files.window[rnd])
	assert.Equal(t, w, r.files.window[k2], "the stream keeps its prior")
	// Its reference is what it read around at the device's window, less
	// the prior's cost for the 100 ms of the 250 ms span it was in force:
	// 2 ms - 0.4 x (w-128) KB x 1.25 at 400 MB/s (0.85 ms at 1024 KB,
	// against 0.5 ms, the floor, counted over the whole span). Referred
	// to its trimmed requests at the next Step instead, the account of the
	// trim's saving put it at a third of what the window gave it.
	ref := tn.randRefs[rnd]
	require.NotNil(t, ref, "referred to before its trim")
	assert.Equal(t, float64(128<<10), ref.svc.size)
	assert.False(t, ref.clean)
	want := 2e-3 - 0.4*float64(w-128)*1024*1.25/400e6
	assert.InDelta(t, want*1e3, ref.svc.mean.Seconds()*1e3, 0.01)

	// A second look finds it trimmed: nothing more.
	r.clk.Advance(250 * time.Millisecond)
	keys, span = tn.trimStreams()
	require.NotEmpty(t, keys)
	assert.Empty(t, tn.fastTrim(recent, span))
}

// A trim serves the window raised beside it: when the step it came with is
// undone at its verdict, the trim goes back in the same Step, never kept
// (kept, it stood a Settle longer for nothing, and read as a window kept
// where none paid).
func TestTrimUndoneWithTheStepItCameWith(t *testing.T) {
	m := newMmapRig(t, Config{})
	m.tput = func(int) float64 { return 60e6 } // no step pays
	acts := m.run(1)
	require.NotEmpty(t, trimActs(acts, m.rnd), "trimmed beside the step")
	require.Greater(t, m.files.window[m.seq], 128, "the step is under trial")
	var stepUndone time.Duration
	acts = m.run(1)
	for _, a := range acts {
		if a.File == m.seq && a.Kind == KindFileWindowUndo && a.Result == ResultUndone {
			stepUndone = a.Time
		}
	}
	require.NotZero(t, stepUndone, "the step did not pay and was undone")
	rnd := trimActs(acts, m.rnd)
	require.Len(t, rnd, 1, "the trim's verdict comes with its step's")
	assert.Equal(t, KindTrimUndo, rnd[0].Kind, "a trim kept with no window raised beside it: %s", rnd[0].Evidence)
	assert.Equal(t, stepUndone, rnd[0].Time)
	assert.Contains(t, rnd[0].Evidence, "taken back")
	assert.Equal(t, 128, m.files.window[m.rnd])
}
