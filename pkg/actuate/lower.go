package actuate

// Lowering a window that a stream is already using.
//
// POSIX_FADV_NORMAL copies read_ahead_kb into the file's ra_pages, but the
// async path (page_cache_async_ra) sizes the next window as max(previous,
// next under ra_pages): a window only grows (FMODE_RANDOM and dropping
// pages ahead do not reach it). With ra_pages 0 the async path returns at
// once, and a cache miss starts a fresh window from ra_pages on the sync
// path. So a break holds ra_pages at 0 until the reader is past its latest
// window (f_ra: prev_pos beyond start+size; just past the marker is not
// enough, a large marker folio is hit again), then sets the wanted window.
// Idle readers are restarted where they stand (rearm.go).
//
// ra_pages is set only through the device (write, NORMAL, write back):
// files opened in between are found and given the device's own value.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// pageKB is the size of a page in KB (file_ra_state counts pages).
const pageKB = probe.PageSize / 1024

// RAState is an open file's struct file_ra_state, in pages.
type RAState struct {
	ID        uint64 // the open file description, while it is open
	RAPages   uint32
	Start     uint64
	Size      uint32
	AsyncSize uint32
	PrevPos   int64 // byte offset of the last read, -1 before any
}

// passedWindow: the reader read beyond its latest window (or has none):
// with ra_pages 0 it took a cache miss and no marker is left.
func (s RAState) passedWindow() bool {
	return s.Size == 0 || s.PrevPos >= 0 && uint64(s.PrevPos)/probe.PageSize >= s.Start+uint64(s.Size)
}

// OpenFile is one descriptor any process holds, with its kernel state.
type OpenFile struct {
	Ref FileRef
	RA  RAState
}

// RAStates reads the kernel's per-file readahead state (fileras.Iter).
type RAStates interface {
	// Own returns the state of our descriptors fds (pidfd_getfd: the
	// readers' open files); missing fds are left out.
	Own(fds []int) (map[int]RAState, error)
	// WatchOpens notes files opened on devs from now on; opened stops and
	// lists those still open, one descriptor per open file.
	WatchOpens(devs []probe.Dev) (opened func() []OpenFile, err error)
}

// DeviceRW reads and writes a device's read_ahead_kb.
type DeviceRW interface {
	ReadAheadKB(name string) (int, error)
	SetReadAheadKB(name string, kb int) error
}

// fdHandle is a Handle that is a descriptor of this process.
type fdHandle interface{ FD() int }

// readerCheckAfter: a reader still this long is asked whether it holds the
// file; one that closed it or exited ends its break.
const readerCheckAfter = 5 * time.Millisecond

// Lowerer sets open files' windows so the change reaches a streaming
// reader. Sysfs and Files are required; without States every file gets a
// break of Hold and files opened meanwhile are not looked for.
type Lowerer struct {
	Sysfs  DeviceRW
	Files  FileOps
	States RAStates
	// Poll: progress read interval (1ms). A break lasts until the reader
	// passes its window, at most MaxHold (2s); a reader idle for IdleHold
	// (200ms) or still in at MaxHold is restarted (rearm.go). Hold: the
	// break without States (250ms).
	Poll, MaxHold, IdleHold, Hold time.Duration
	Sleep                         func(time.Duration) // default time.Sleep
	Now                           func() time.Duration
}

// DefaultMaxHold and DefaultHold are Lowerer.MaxHold's and Hold's defaults.
const (
	DefaultMaxHold = 2 * time.Second
	DefaultHold    = 250 * time.Millisecond
)

// LowerFile is the reader's descriptor and ours on the same open file.
type LowerFile struct {
	Ref FileRef
	H   Handle
}

// LowerReq sets the window KB on Files of disk Device, whose read_ahead_kb
// is DeviceKB before and after.
type LowerReq struct {
	Device   string
	DeviceKB int
	KB       int
	Files    []LowerFile
	// During, if set, runs each wait of a break (the tuner unlocks).
	During func(wait func())
	// NoBreak skips the break: for random readers just opened, whose next
	// fault reads around from ra_pages afresh and who never pass a window.
	NoBreak bool
}

// LowerStats is what a Lower cost.
type LowerStats struct {
	Set         int           // files given the window
	Broken      int           // files that needed a break (window above KB)
	Rearmed     int           // idle readers whose stream was restarted from their position (rearm.go)
	Unconfirmed int           // files whose kernel window could not be confirmed at most KB (listed in Left)
	Released    int           // broken files whose reader closed them or exited during the break
	Hold        time.Duration // longest break (ra_pages 0) of a file
	// Reread: bytes ahead of the readers that Rearmed dropped from cache.
	Reread int64
	// DeviceOff: longest time read_ahead_kb was not DeviceKB (0 in a break,
	// KB in a raise-pin-restore).
	DeviceOff time.Duration
	Strays    int           // files opened during such an instant, given the device's value
	Left      []Unconfirmed // the files Unconfirmed counts
}

// Unconfirmed is an open file a Lower could not confirm at its window.
type Unconfirmed struct {
	Ref FileRef
	RA  RAState // the kernel's state last read (zero when unreadable)
	Why string
}

// Confirmed reports whether ref is not among Left.
func (st LowerStats) Confirmed(ref FileRef) bool {
	return !slices.ContainsFunc(st.Left, func(u Unconfirmed) bool { return u.Ref == ref })
}

func (st *LowerStats) unconfirmed(f LowerFile, s RAState, why string) {
	st.Unconfirmed++
	st.Left = append(st.Left, Unconfirmed{Ref: f.Ref, RA: s, Why: why})
}

func (u Unconfirmed) String() string {
	return fmt.Sprintf("pid %d fd %d (%s): kernel ra_pages %d KB, window %d KB: %s",
		u.Ref.Tgid, u.Ref.FD, u.Ref.Path, int(u.RA.RAPages)*pageKB, int(u.RA.Size)*pageKB, u.Why)
}

// Lower gives each file the window req.KB, breaking those above it first.
// It returns the first error of each kind; failed files are not in Set.
func (l *Lowerer) Lower(req LowerReq) (LowerStats, error) {
	l.defaults()
	if req.During == nil {
		req.During = func(wait func()) { wait() }
	}
	var st LowerStats
	var errs []error
	var brk, plain []LowerFile
	states, known := l.own(req.Files) // nil when not known
	for i, f := range req.Files {
		if s, ok := states[i]; req.NoBreak || ok && s.Size <= uint32(req.KB/pageKB) {
			plain = append(plain, f)
			continue
		}
		brk = append(brk, f)
	}
	n, err := l.set(req, plain, &st)
	st.Set += n
	errs = append(errs, err)
	if len(brk) == 0 {
		return st, errors.Join(errs...)
	}
	st.Broken = len(brk)
	start := l.Now()
	zero := req
	zero.KB = 0
	if _, err := l.set(zero, brk, &st); err != nil {
		// A failed break leaves no file at 0 (set puts the device back).
		return st, errors.Join(append(errs, fmt.Errorf("break the readahead windows: %w", err))...)
	}
	// Each broken file waits until its reader passes its window, while it
	// makes progress.
	type wait struct {
		f         LowerFile
		pos       int64
		movedAt   time.Duration
		checkedAt time.Duration
		notFirst  bool
	}
	pending := make([]wait, len(brk))
	for i, f := range brk {
		pending[i] = wait{f: f, movedAt: start}
	}
	for len(pending) > 0 {
		now := l.Now()
		var done []LowerFile
		var idle []idleFile
		var left []wait
		var states map[int]RAState
		if known {
			fs := make([]LowerFile, len(pending))
			for i, w := range pending {
				fs[i] = w.f
			}
			states, _ = l.own(fs)
		}
		for i, w := range pending {
			s, ok := states[i]
			// Still long enough, and not checked since: does it hold the file?
			due := now-w.movedAt >= readerCheckAfter && now-w.checkedAt >= readerCheckAfter
			switch {
			// Without the kernel's state, a break of Hold.
			case !known && now-start < l.Hold:
				left = append(left, w)
			case !known:
				done = append(done, w.f)
				st.unconfirmed(w.f, RAState{}, "no kernel state to check the break against (iterator not loaded)")
			// Closed (gone from the iterator), or ra_pages reset by another.
			case !ok || s.RAPages != 0 || s.passedWindow():
				done = append(done, w.f)
			case now-start >= l.MaxHold || now-w.movedAt >= l.IdleHold:
				// Idle or too slow: restarted where it is (rearm.go).
				idle = append(idle, idleFile{w.f, s})
			case due && !l.Files.Holds(w.f.Ref):
				st.Released++
				done = append(done, w.f)
			default:
				if due {
					w.checkedAt = now
				}
				if w.notFirst && s.PrevPos != w.pos {
					w.movedAt = now
				}
				w.pos, w.notFirst = s.PrevPos, true
				left = append(left, w)
			}
		}
		if len(done) > 0 || len(idle) > 0 {
			n, err := l.set(req, done, &st)
			st.Set += n
			errs = append(errs, err, l.rearm(req, idle, &st))
			st.Hold = max(st.Hold, l.Now()-start)
		}
		pending = left
		if len(pending) > 0 {
			req.During(func() { l.Sleep(l.Poll) })
		}
	}
	return st, errors.Join(errs...)
}

// idleFile is a broken file whose reader did not move, with its state.
type idleFile struct {
	f LowerFile
	s RAState
}

func (l *Lowerer) defaults() {
	l.Poll = cmp.Or(l.Poll, time.Millisecond)
	l.MaxHold = cmp.Or(l.MaxHold, DefaultMaxHold)
	l.IdleHold = cmp.Or(l.IdleHold, 200*time.Millisecond)
	l.Hold = cmp.Or(l.Hold, DefaultHold)
	if l.Sleep == nil {
		l.Sleep = time.Sleep
	}
	if l.Now == nil {
		start := time.Now()
		l.Now = func() time.Duration { return time.Since(start) }
	}
}

// own reads each file's kernel state (by index); known: readable at all.
func (l *Lowerer) own(fs []LowerFile) (map[int]RAState, bool) {
	if l.States == nil {
		return nil, false
	}
	var fds []int
	fdOf := map[int]int{} // index in fs: our descriptor
	for i, f := range fs {
		if h, ok := f.H.(fdHandle); ok {
			fds = append(fds, h.FD())
			fdOf[i] = h.FD()
		}
	}
	byFD, err := l.States.Own(fds)
	if err != nil {
		return nil, false
	}
	out := map[int]RAState{}
	for i, fd := range fdOf {
		if s, ok := byFD[fd]; ok {
			out[i] = s
		}
	}
	return out, true
}

// set gives fs the window req.KB (AdviceFor; through the device when
// needed), then repairs files opened meanwhile.
func (l *Lowerer) set(req LowerReq, fs []LowerFile, st *LowerStats) (n int, err error) {
	if len(fs) == 0 {
		return 0, nil
	}
	advice, through := AdviceFor(req.KB, req.DeviceKB)
	var errs []error
	if through {
		opened := l.watchOpens(fs)
		t0 := l.Now()
		if err := l.Sysfs.SetReadAheadKB(req.Device, req.KB); err != nil {
			return 0, fmt.Errorf("set read_ahead_kb of %s to %d: %w", req.Device, req.KB, err)
		}
		defer func() {
			if werr := l.Sysfs.SetReadAheadKB(req.Device, req.DeviceKB); werr != nil {
				err = errors.Join(err, fmt.Errorf("%w: %s left at %d KB, want %d: %w", ErrDeviceNotBack, req.Device, req.KB, req.DeviceKB, werr))
				return
			}
			st.DeviceOff = max(st.DeviceOff, l.Now()-t0)
			if opened != nil {
				st.Strays += l.repair(opened(), req.KB)
			}
		}()
	}
	for _, f := range fs {
		if err := f.H.Fadvise(0, 0, advice); err != nil {
			errs = append(errs, fmt.Errorf("pid %d fd %d: %w", f.Ref.Tgid, f.Ref.FD, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// ErrDeviceNotBack: read_ahead_kb could not be written back after a
// raise-pin-restore or a break; the caller retries.
var ErrDeviceNotBack = errors.New("read_ahead_kb not put back")

// watchOpens notes files opened on fs's filesystems (nil: no state).
func (l *Lowerer) watchOpens(fs []LowerFile) func() []OpenFile {
	if l.States == nil {
		return nil
	}
	var devs []probe.Dev
	for _, f := range fs {
		if !slices.Contains(devs, f.Ref.Key.Dev) {
			devs = append(devs, f.Ref.Key.Dev)
		}
	}
	opened, err := l.States.WatchOpens(devs)
	if err != nil {
		return nil
	}
	return opened
}

// repair gives the device's window back to files opened with kb meanwhile.
func (l *Lowerer) repair(opened []OpenFile, kb int) int {
	n := 0
	for _, f := range opened {
		if int(f.RA.RAPages)*pageKB != kb {
			continue
		}
		h, err := l.Files.Dup(f.Ref)
		if err != nil {
			continue // closed meanwhile
		}
		if h.Fadvise(0, 0, AdviceNormal) == nil {
			n++
		}
		h.Close()
	}
	return n
}
