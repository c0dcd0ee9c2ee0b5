// Package prior is the tuner's memory of windows that paid (per directory,
// slow file, and device capacity), saved as priors.json (pkg/state), so a
// fresh open gets its neighbours' window at once and a restart remembers.
package prior

import (
	"iter"
	"maps"
	"path/filepath"
	"sort"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
)

// Recheck is how soon a directory's prior is first re-checked (a fresh open
// left at base for a Settle); each confirmation doubles it, to BackoffMax.
const Recheck = 30 * time.Second

// saveEvery bounds how often the priors file is rewritten.
const saveEvery = 5 * time.Second

// Memory holds the priors, the slow files and the learned capacities.
type Memory struct {
	dirs  map[dirKey]*Dir
	files map[probe.FileKey]*slowFile
	// perDev counts entries per filesystem: the event path's one lookup.
	perDev  map[probe.Dev]int
	dirty   bool
	savedAt time.Duration
	// caps: each device's learned capacity, by disk name.
	caps map[string]capacity
}

type dirKey struct {
	dev probe.Dev
	dir string
}

// Dir is the window that paid for recent streams in one directory.
type Dir struct {
	Device  string
	Window  int     // KB
	base    int     // the device's window the gain was measured against
	BaseBPS float64 // stream throughput at base (what a fresh open is judged against)
	KeptBPS float64 // stream throughput at Window
	Streams int
	updated time.Duration // monotonic, for eviction and decay
	wall    time.Time     // for the file
	// Re-check (has the device recovered?): the next fresh open after
	// checkAt is left at base for one measurement.
	checkAt, checkEvery time.Duration
	checking            probe.FileKey // file measured at base, zero if none
	checkStart          time.Duration
	// The prior's own ladder (Climb): the climber and since when; no
	// step above Window before KneeUntil.
	climber   probe.FileKey
	climbAt   time.Duration
	KneeUntil time.Duration
	kneeN     int // climbs in a row that did not pay
}

type slowFile struct {
	device  string
	path    string
	window  int
	updated time.Duration
	wall    time.Time
}

// capacity: learned capacity (bytes/s), when, and fitted capacity (0: none).
type capacity struct {
	bps  float64
	wall time.Time
	fit  float64
}

// New returns an empty memory.
func New() *Memory {
	return &Memory{dirs: map[dirKey]*Dir{}, files: map[probe.FileKey]*slowFile{}, perDev: map[probe.Dev]int{}, caps: map[string]capacity{}}
}

// Has reports whether anything was learned on a filesystem (cheap).
func (m *Memory) Has(dev probe.Dev) bool { return m.perDev[dev] > 0 }

// Dirs lists the directory priors (one may be decayed away meanwhile).
func (m *Memory) Dirs() iter.Seq[*Dir] { return maps.Values(m.dirs) }

// Len counts the directory priors, slow files and learned capacities.
func (m *Memory) Len() (dirs, files, caps int) { return len(m.dirs), len(m.files), len(m.caps) }

// Lookup returns the window for a file about to be read: its own, else its
// directory's or nearest ancestor's prior (nil if none).
func (m *Memory) Lookup(key probe.FileKey, path string) (kb int, p *Dir) {
	if p = m.Dir(key.Dev, path); p != nil {
		kb = p.Window
	}
	if f := m.files[key]; f != nil {
		kb = max(kb, f.window) // the file's own, or its directory's if that climbed above it since
	}
	return kb, p
}

// Dir is the prior of path's directory or of its nearest ancestor, nil if none.
func (m *Memory) Dir(dev probe.Dev, path string) *Dir {
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

// Learn records that window paid for key's stream in path's directory
// (baseBPS at base, keptBPS at window).
func (m *Memory) Learn(key probe.FileKey, device, path string, window, base int, baseBPS, keptBPS float64, now time.Duration, wall time.Time) {
	if path == "" {
		return
	}
	dk := dirKey{key.Dev, filepath.Dir(path)}
	p := m.dirs[dk]
	if p == nil {
		p = &Dir{checkEvery: Recheck, checkAt: now + Recheck}
		m.dirs[dk] = p
		m.perDev[key.Dev]++
	}
	p.Device, p.base, p.updated, p.wall = device, base, now, wall
	if baseBPS > 0 {
		p.BaseBPS = baseBPS
	}
	// A stream kept below the prior began under an older one: it confirms,
	// never lowers, the prior (priors come down by decay).
	if window >= p.Window || p.Streams == 0 {
		if window > p.Window {
			p.KneeUntil, p.kneeN = 0, 0 // a new window: its own climb
		}
		p.Window = window
		if keptBPS > 0 {
			p.KeptBPS = keptBPS
		}
	}
	p.Streams++
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

// ForgetFile drops a file's own memory (its window no longer pays).
func (m *Memory) ForgetFile(key probe.FileKey) {
	if m.files[key] != nil {
		delete(m.files, key)
		m.decDev(key.Dev)
		m.dirty = true
	}
}

// Decay halves a directory's prior after a given stream did not pay (gone
// if the re-check found the device recovered), dropping it at its base.
func (m *Memory) Decay(p *Dir, gone bool) {
	if p == nil {
		return
	}
	p.Window /= 2
	if gone || p.Window <= p.base {
		for k, q := range m.dirs {
			if q == p {
				delete(m.dirs, k)
				m.decDev(k.dev)
			}
		}
	}
	m.dirty = true
}

func (m *Memory) decDev(dev probe.Dev) {
	if m.perDev[dev]--; m.perDev[dev] <= 0 {
		delete(m.perDev, dev)
	}
}

// bound keeps the tables within state.MaxPriorDirs and state.MaxSlowFiles.
func (m *Memory) bound() {
	evict(m.dirs, state.MaxPriorDirs, func(p *Dir) time.Duration { return p.updated }, func(k dirKey) { m.decDev(k.dev) })
	evict(m.files, state.MaxSlowFiles, func(f *slowFile) time.Duration { return f.updated }, func(k probe.FileKey) { m.decDev(k.Dev) })
}

// evict drops the least recently updated entries of a table beyond max.
func evict[K comparable, V any](t map[K]V, max int, updated func(V) time.Duration, gone func(K)) {
	for len(t) > max {
		var oldest K
		first := true
		for k, v := range t {
			if first || updated(v) < updated(t[oldest]) {
				oldest, first = k, false
			}
		}
		delete(t, oldest)
		gone(oldest)
	}
}

// Capacity is the learned capacity (bytes/s) of a disk, 0 if none.
func (m *Memory) Capacity(device string) float64 { return m.caps[device].bps }

// SetCapacity records a disk's learned capacity; 0 forgets it.
func (m *Memory) SetCapacity(device string, bps float64, wall time.Time) {
	c := m.caps[device]
	c.bps, c.wall = bps, wall
	m.setCap(device, c)
}

// Fitted is a disk's fitted transfer capacity (bytes/s), 0 if none.
func (m *Memory) Fitted(device string) float64 { return m.caps[device].fit }

// SetFitted records a disk's fitted transfer capacity; 0 forgets it.
func (m *Memory) SetFitted(device string, bps float64, wall time.Time) {
	c := m.caps[device]
	c.fit, c.wall = bps, wall
	m.setCap(device, c)
}

func (m *Memory) setCap(device string, c capacity) {
	m.caps[device] = c
	if c.bps == 0 && c.fit == 0 {
		delete(m.caps, device)
	}
	m.dirty = true
}

// Save writes a changed memory to path, at most every saveEvery unless forced.
func (m *Memory) Save(path string, now time.Duration, force bool) error {
	if !m.dirty || !force && now-m.savedAt < saveEvery {
		return nil
	}
	if err := state.SavePriors(path, m.export()); err != nil {
		return err
	}
	m.dirty, m.savedAt = false, now
	return nil
}

// export is what is saved in the state directory.
func (m *Memory) export() state.Priors {
	var p state.Priors
	for k, d := range m.dirs {
		p.Dirs = append(p.Dirs, state.DirPrior{Dev: uint32(k.dev), Device: d.Device, Dir: k.dir, WindowKB: d.Window, BaseKB: d.base,
			BaseBPS: d.BaseBPS, KeptBPS: d.KeptBPS, Streams: d.Streams, Updated: d.wall})
	}
	for k, f := range m.files {
		p.Files = append(p.Files, state.SlowFile{Dev: uint32(k.Dev), Ino: k.Ino, Device: f.device, Path: f.path, WindowKB: f.window, Updated: f.wall})
	}
	for name, c := range m.caps {
		p.Devices = append(p.Devices, state.DeviceCapacity{Device: name, CapacityBPS: c.bps, FittedBPS: c.fit, Updated: c.wall})
	}
	sort.Slice(p.Devices, func(i, j int) bool { return p.Devices[i].Device < p.Devices[j].Device })
	sort.Slice(p.Dirs, func(i, j int) bool { return p.Dirs[i].Dir < p.Dirs[j].Dir })
	sort.Slice(p.Files, func(i, j int) bool { return p.Files[i].Ino < p.Files[j].Ino })
	return p
}

// Load fills the memory from saved priors, windows clamped to maxKB. Only
// entries on devices the tuner may act on (device) and directories under an
// allow-path on its filesystem (dir) are admitted; returns the refused count.
func (m *Memory) Load(p state.Priors, device func(name string) bool, dir func(dir string, dev probe.Dev) bool, maxKB int, now time.Duration) (refused int) {
	for _, d := range p.Dirs {
		dev := probe.Dev(d.Dev)
		if !device(d.Device) || !dir(d.Dir, dev) || d.WindowKB <= d.BaseKB {
			refused++
			continue
		}
		k := dirKey{dev, d.Dir}
		if m.dirs[k] == nil {
			m.perDev[dev]++
		}
		// Re-checked soon: the device may have recovered while down.
		m.dirs[k] = &Dir{Device: d.Device, Window: min(d.WindowKB, maxKB), base: d.BaseKB, BaseBPS: d.BaseBPS, KeptBPS: d.KeptBPS,
			Streams: d.Streams, updated: now, wall: d.Updated, checkEvery: Recheck, checkAt: now + Recheck}
	}
	for _, f := range p.Files {
		dev := probe.Dev(f.Dev)
		if f.Path == "" || !device(f.Device) || !dir(filepath.Dir(f.Path), dev) {
			refused++
			continue
		}
		k := probe.FileKey{Dev: dev, Ino: f.Ino}
		if m.files[k] == nil {
			m.perDev[dev]++
		}
		m.files[k] = &slowFile{device: f.Device, path: f.Path, window: min(f.WindowKB, maxKB), updated: now, wall: f.Updated}
	}
	for _, d := range p.Devices {
		if !device(d.Device) {
			refused++
			continue
		}
		m.caps[d.Device] = capacity{bps: d.CapacityBPS, wall: d.Updated, fit: d.FittedBPS}
	}
	m.bound()
	return refused
}

// Checking: file is a re-check's stream (no trial may disturb it).
func (m *Memory) Checking(key probe.FileKey) bool {
	if !m.Has(key.Dev) {
		return false
	}
	for _, p := range m.dirs {
		if p.checking == key {
			return true
		}
	}
	return false
}

// Check starts a re-check of p on key when one is due.
func (p *Dir) Check(key probe.FileKey, now time.Duration) bool {
	if !p.checking.IsZero() || now < p.checkAt {
		return false
	}
	p.checking, p.checkStart = key, now
	return true
}

// Checked is the stream p's re-check measures (zero: none), for how long.
func (p *Dir) Checked(now time.Duration) (probe.FileKey, time.Duration) {
	return p.checking, now - p.checkStart
}

// EndCheck ends p's re-check; a confirmed prior waits twice as long (to max).
func (p *Dir) EndCheck(confirmed bool, now, max time.Duration) {
	p.checking = probe.FileKey{}
	if confirmed {
		p.checkEvery = min(2*p.checkEvery, max)
		p.checkAt = now + p.checkEvery
	}
}

// Climb returns the window above the prior key's fresh open should try (0:
// none) and records key as the one climber (replaced after stale); none
// under a knee. Files read in under a second end before their own step is
// judged, so the prior climbs instead.
func (m *Memory) Climb(p *Dir, key probe.FileKey, now time.Duration, growth, maxKB int, stale time.Duration) int {
	if p == nil || p.KeptBPS <= 0 || p.Window >= maxKB || now < p.KneeUntil {
		return 0
	}
	if !p.climber.IsZero() && now-p.climbAt < stale {
		return 0
	}
	p.climber, p.climbAt = key, now
	return min(p.Window*growth, maxKB)
}

// Climbed ends key's climb of p: one that did not pay holds the prior for
// first the first time (the knee is confirmed once), then for again.
func (m *Memory) Climbed(p *Dir, key probe.FileKey, paid bool, first, again time.Duration) {
	if p == nil || p.climber != key {
		return
	}
	p.climber = probe.FileKey{}
	switch {
	case paid:
		p.kneeN = 0
	case p.kneeN == 0:
		p.kneeN, p.KneeUntil = 1, first
	default:
		p.kneeN++
		p.KneeUntil = again
	}
}

// Unclimb ends key's climb with no verdict: no knee.
func (m *Memory) Unclimb(p *Dir, key probe.FileKey) {
	if p != nil && p.climber == key {
		p.climber = probe.FileKey{}
	}
}
