package tuner

import (
	"path/filepath"
	"sort"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
)

// memory holds what the tuner learned about windows that paid: per
// filesystem and directory (a prior for files opened there next) and per
// slow file. It lets a fresh open (HDFS opens a block file per read) get the
// window that paid for its neighbours on its first readahead event, and a
// restarted daemon serve a file that is still slow at once. It knows
// nothing of devices or descriptors: the tuner asks it and tells it.
type memory struct {
	dirs  map[dirKey]*dirPrior
	files map[probe.FileKey]*slowFile
	// perDev counts priors and slow files per filesystem: the event path
	// asks it first, so a device with nothing learned costs one map lookup.
	perDev map[probe.Dev]int
	dirty  bool
	// caps: each device's learned capacity, by disk name (capacity.go).
	caps map[string]devCapacity
	// evicted counts entries dropped to keep the tables bounded.
	evicted uint64
}

type dirKey struct {
	dev probe.Dev
	dir string
}

// dirPrior is the window that paid for recent streams in one directory.
type dirPrior struct {
	device  string
	window  int     // KB
	base    int     // the device's window the gain was measured against
	baseBPS float64 // stream throughput at base (what a fresh open is judged against)
	keptBPS float64 // stream throughput at window
	streams int
	updated time.Duration // monotonic, for eviction and decay
	wall    time.Time     // for the file
	// Re-check of the prior itself (has the device recovered?): the next
	// fresh open after checkAt is left at base for one measurement.
	checkAt, checkEvery time.Duration
	checking            probe.FileKey // file measured at base, zero if none
	checkStart          time.Duration
	// The prior's own ladder (climb): the fresh open trying the step above
	// window and since when; no step above window before kneeUntil.
	climber   probe.FileKey
	climbAt   time.Duration
	kneeUntil time.Duration
	kneeN     int // climbs in a row that did not pay
}

type slowFile struct {
	device  string
	path    string
	window  int
	updated time.Duration
	wall    time.Time
}

func newMemory() *memory {
	return &memory{dirs: map[dirKey]*dirPrior{}, files: map[probe.FileKey]*slowFile{}, perDev: map[probe.Dev]int{}, caps: map[string]devCapacity{}}
}

// has reports whether anything was learned on a filesystem (cheap).
func (m *memory) has(dev probe.Dev) bool { return m.perDev[dev] > 0 }

// lookup returns the window for a file about to be read: its own memory
// first, then its directory's prior, then the nearest ancestor directory's
// (HDFS spreads block files over subdirectories of one data directory).
// The prior is nil when the directory has none.
func (m *memory) lookup(key probe.FileKey, path string) (int, *dirPrior) {
	if f := m.files[key]; f != nil {
		// The file's own window, or its directory's if that climbed
		// above it since.
		p := m.dirPrior(key.Dev, path)
		if p != nil && p.window > f.window {
			return p.window, p
		}
		return f.window, p
	}
	p := m.dirPrior(key.Dev, path)
	if p == nil {
		return 0, nil
	}
	return p.window, p
}

func (m *memory) dirPrior(dev probe.Dev, path string) *dirPrior {
	if path == "" {
		return nil
	}
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		if p := m.dirs[dirKey{dev, dir}]; p != nil {
			return p
		}
		if dir == "/" || dir == "." {
			return nil
		}
	}
}

// learn records that window paid for a stream of key in path's directory
// (throughput baseBPS at base, keptBPS at window).
func (m *memory) learn(key probe.FileKey, device, path string, window, base int, baseBPS, keptBPS float64, now time.Duration, wall time.Time, recheck time.Duration) {
	if path == "" {
		return
	}
	dk := dirKey{key.Dev, filepath.Dir(path)}
	p := m.dirs[dk]
	if p == nil {
		p = &dirPrior{checkEvery: recheck, checkAt: now + recheck}
		m.dirs[dk] = p
		m.perDev[key.Dev]++
	}
	p.device, p.base, p.updated, p.wall = device, base, now, wall
	if baseBPS > 0 {
		p.baseBPS = baseBPS
	}
	// A stream that kept less than the prior holds started from an older
	// prior (its open came before the prior climbed): it confirms the
	// prior, it does not lower it (a prior comes down by decay).
	if window >= p.window || p.streams == 0 {
		if window > p.window {
			p.kneeUntil, p.kneeN = 0, 0 // a new window: its own climb
		}
		p.window = window
		if keptBPS > 0 {
			p.keptBPS = keptBPS
		}
	}
	p.streams++
	f := m.files[key]
	if f == nil {
		f = &slowFile{}
		m.files[key] = f
		m.perDev[key.Dev]++
	}
	f.device, f.path, f.window, f.updated, f.wall = device, path, window, now, wall
	m.dirty = true
	m.bound()
}

// forgetFile drops a file's own memory (its window no longer pays).
func (m *memory) forgetFile(key probe.FileKey) {
	if m.files[key] != nil {
		delete(m.files, key)
		m.decDev(key.Dev)
		m.dirty = true
	}
}

// decay halves a directory's prior after a stream it was given did not pay
// (or the re-check found the device recovered: gone), and drops it once it
// is back at its base window.
func (m *memory) decay(p *dirPrior, gone bool) {
	if p == nil {
		return
	}
	p.window /= 2
	if gone || p.window <= p.base {
		for k, q := range m.dirs {
			if q == p {
				delete(m.dirs, k)
				m.decDev(k.dev)
			}
		}
	}
	m.dirty = true
}

func (m *memory) decDev(dev probe.Dev) {
	if m.perDev[dev]--; m.perDev[dev] <= 0 {
		delete(m.perDev, dev)
	}
}

// bound keeps the tables within state.MaxPriorDirs and state.MaxSlowFiles,
// dropping the least recently updated entries.
func (m *memory) bound() {
	for len(m.dirs) > state.MaxPriorDirs {
		var oldest dirKey
		first := true
		for k, p := range m.dirs {
			if first || p.updated < m.dirs[oldest].updated {
				oldest, first = k, false
			}
		}
		delete(m.dirs, oldest)
		m.decDev(oldest.dev)
		m.evicted++
	}
	for len(m.files) > state.MaxSlowFiles {
		var oldest probe.FileKey
		first := true
		for k, f := range m.files {
			if first || f.updated < m.files[oldest].updated {
				oldest, first = k, false
			}
		}
		delete(m.files, oldest)
		m.decDev(oldest.Dev)
		m.evicted++
	}
}

// export is what is saved in the state directory.
func (m *memory) export() state.Priors {
	var p state.Priors
	for k, d := range m.dirs {
		p.Dirs = append(p.Dirs, state.DirPrior{Dev: uint32(k.dev), Device: d.device, Dir: k.dir, WindowKB: d.window, BaseKB: d.base,
			BaseBPS: d.baseBPS, KeptBPS: d.keptBPS, Streams: d.streams, Updated: d.wall})
	}
	for k, f := range m.files {
		p.Files = append(p.Files, state.SlowFile{Dev: uint32(k.Dev), Ino: k.Ino, Device: f.device, Path: f.path, WindowKB: f.window, Updated: f.wall})
	}
	m.exportCaps(&p)
	sort.Slice(p.Devices, func(i, j int) bool { return p.Devices[i].Device < p.Devices[j].Device })
	sort.Slice(p.Dirs, func(i, j int) bool { return p.Dirs[i].Dir < p.Dirs[j].Dir })
	sort.Slice(p.Files, func(i, j int) bool { return p.Files[i].Ino < p.Files[j].Ino })
	return p
}

// admit decides whether a saved entry may be used: its directory must lie
// under an allow-path on that allow-path's filesystem, and its device must
// be the disk the system names for that filesystem now and one the tuner
// may act on. Nothing in the file can make the tuner act elsewhere.
type admit func(dev probe.Dev, device, dir string) bool

// load fills the memory from saved priors, keeping only admitted entries,
// windows clamped to maxKB. It returns how many entries were refused.
func (m *memory) load(p state.Priors, ok admit, maxKB int, now time.Duration, recheck time.Duration) (refused int) {
	for _, d := range p.Dirs {
		dev := probe.Dev(d.Dev)
		if !ok(dev, d.Device, d.Dir) || d.WindowKB <= d.BaseKB {
			refused++
			continue
		}
		k := dirKey{dev, d.Dir}
		if m.dirs[k] == nil {
			m.perDev[dev]++
		}
		// A saved prior is re-checked by the first fresh open after a
		// short while: the device may have recovered while the daemon
		// was down.
		m.dirs[k] = &dirPrior{device: d.Device, window: min(d.WindowKB, maxKB), base: d.BaseKB, baseBPS: d.BaseBPS, keptBPS: d.KeptBPS,
			streams: d.Streams, updated: now, wall: d.Updated, checkEvery: recheck, checkAt: now + recheck}
	}
	for _, f := range p.Files {
		dev := probe.Dev(f.Dev)
		if f.Path == "" || !ok(dev, f.Device, filepath.Dir(f.Path)) {
			refused++
			continue
		}
		k := probe.FileKey{Dev: dev, Ino: f.Ino}
		if m.files[k] == nil {
			m.perDev[dev]++
		}
		m.files[k] = &slowFile{device: f.Device, path: f.Path, window: min(f.WindowKB, maxKB), updated: now, wall: f.Updated}
	}
	m.bound()
	return refused
}

// checking reports whether a file is the stream a prior's re-check measures
// at the device's window (no trial may disturb it).
func (m *memory) checking(key probe.FileKey) bool {
	if !m.has(key.Dev) {
		return false
	}
	for _, p := range m.dirs {
		if p.checking == key {
			return true
		}
	}
	return false
}

// climb returns the window a fresh open of key should try above the
// prior's (0 for none) and records key as the prior's climber. Files of a
// directory that are each read in less than a second (a 128 MB block at
// 300 MB/s) end before any step above the prior's window can be judged on
// them: the prior itself climbs, one file at a time, each judged against
// the rate the prior's window gave its streams. One climber at a time (a
// climber not heard of for stale is replaced); none while the last climb
// that did not pay holds its knee.
func (m *memory) climb(p *dirPrior, key probe.FileKey, now time.Duration, growth, maxKB int, stale time.Duration) int {
	if p == nil || p.keptBPS <= 0 || p.window >= maxKB || now < p.kneeUntil {
		return 0
	}
	if !p.climber.IsZero() && now-p.climbAt < stale {
		return 0
	}
	p.climber, p.climbAt = key, now
	return min(p.window*growth, maxKB)
}

// climbed ends key's climb of p: a step that did not pay holds the prior
// at its window, for first the first time (one stream's measure may have
// been noise: the knee is confirmed once), then for again (one that paid
// was learned as the new window).
func (m *memory) climbed(p *dirPrior, key probe.FileKey, paid bool, first, again time.Duration) {
	if p == nil || p.climber != key {
		return
	}
	p.climber = probe.FileKey{}
	switch {
	case paid:
		p.kneeN = 0
	case p.kneeN == 0:
		p.kneeN, p.kneeUntil = 1, first
	default:
		p.kneeN++
		p.kneeUntil = again
	}
}

// unclimb ends key's climb of p with no verdict (the stream read too
// little): no knee, the next open climbs again.
func (m *memory) unclimb(p *dirPrior, key probe.FileKey) {
	if p != nil && p.climber == key {
		p.climber = probe.FileKey{}
	}
}
