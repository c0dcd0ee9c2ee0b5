// Package fileras reads the kernel's own readahead state of open files
// (struct file_ra_state inside each struct file) with a BPF task_file
// iterator: which process holds which file on which device, and the window
// really in force on it, whoever set it.
package fileras

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// PageKB is the size of a page in KB: file_ra_state counts pages.
const PageKB = 4

// File is one descriptor on a regular file of a watched device, with its
// open file's readahead state as the kernel holds it.
type File struct {
	Tgid uint32
	FD   int
	Key  probe.FileKey
	// ID names the open file description (the struct file) while it is
	// open: descriptors of several processes, or one taken with
	// pidfd_getfd, on the same open file share it.
	ID   uint64
	Mode uint32 // f_mode (FMODE_RANDOM is 0x1000)
	// RAPages is the file's window (ra_pages), copied from the device's
	// read_ahead_kb at open or by POSIX_FADV_NORMAL/SEQUENTIAL.
	RAPages uint32
	// Start, Size and AsyncSize are the current readahead window in pages:
	// Size is what the next asynchronous readahead builds on (it does not
	// shrink when RAPages does); the marker that triggers it is page
	// Start+Size-AsyncSize.
	Start     uint64
	Size      uint32
	AsyncSize uint32
	PrevPos   int64 // byte offset of the last read(2)/sendfile
}

// WindowKB is the window in force (ra_pages) in KB.
func (f File) WindowKB() int { return int(f.RAPages) * PageKB }

// SizeKB is the size of the current readahead window in KB.
func (f File) SizeKB() int { return int(f.Size) * PageKB }

// InForceKB is the window the file's reader gets: its stream's current
// window when that is larger than ra_pages (asynchronous readahead keeps
// it when ra_pages comes down), else ra_pages.
func (f File) InForceKB() int { return int(max(f.RAPages, f.Size)) * PageKB }

// FModeRandom is f_mode's FMODE_RANDOM (POSIX_FADV_RANDOM).
const FModeRandom = 0x1000

// Iter is a loaded task_file iterator. Its methods are safe for
// concurrent use: walks with the same filter run side by side (a census of
// every process's files does not hold up the polls of a break, which walk
// the daemon's own), others wait for the filter.
type Iter struct {
	mu      sync.Mutex // the fields below
	idle    *sync.Cond // walking fell to 0
	walking int        // walks in progress with filter cur
	cur     *filerasFilerasFilter
	objs    filerasMaps
	prog    *ebpf.Program // dump_ra
	lnk     *link.Iter    // every task
	// self is bound to the daemon's own process, nil when the kernel
	// cannot bind an iterator to one task (then one process's walk visits
	// every task's files, the filter choosing what is written).
	self    *link.Iter
	selfPid uint32
	walks   uint64 // walks of every process's files
	// noteOpen is loaded when the kernel accepts it and the architecture's
	// system call numbers are known (see Arm); attached while armed.
	noteOpen *ebpf.Program
	armed    link.Link
	armedOn  []probe.Dev
}

// Open loads and attaches the iterator. It needs CAP_BPF and CAP_PERFMON
// (or CAP_SYS_ADMIN); reading it later needs no capability.
func Open() (*Iter, error) {
	it := &Iter{selfPid: uint32(os.Getpid())}
	it.idle = sync.NewCond(&it.mu)
	spec, err := loadFileras()
	if err != nil {
		return nil, fmt.Errorf("read the open-file readahead iterator's object: %w", err)
	}
	var base struct {
		filerasMaps
		DumpRa *ebpf.Program `ebpf:"dump_ra"`
	}
	if err := spec.LoadAndAssign(&base, nil); err != nil {
		return nil, fmt.Errorf("load the open-file readahead iterator: %w (needs root, or CAP_BPF and CAP_PERFMON, and a kernel with BTF)", err)
	}
	it.objs, it.prog = base.filerasMaps, base.DumpRa
	l, err := link.AttachIter(link.IterOptions{Program: it.prog})
	if err != nil {
		it.prog.Close()
		it.objs.Close()
		return nil, fmt.Errorf("attach the open-file readahead iterator: %w", err)
	}
	it.lnk = l
	// Without these the iterator still works, at the cost of walks of
	// every process's files.
	if self, err := attachTaskIter(it.prog, it.selfPid); err == nil {
		it.self = self
	}
	it.noteOpen = loadNoteOpen(spec, &it.objs)
	return it, nil
}

// Scoped reports whether a walk of one process visits only its files, and
// whether the files opened during a device write are found without walks
// of every process (the open hook).
func (it *Iter) Scoped() (perTask, openHook bool) { return it.self != nil, it.noteOpen != nil }

// Close releases the iterator.
func (it *Iter) Close() error {
	var errs []error
	for _, l := range []*link.Iter{it.lnk, it.self} {
		if l != nil {
			errs = append(errs, l.Close())
		}
	}
	if it.armed != nil {
		errs = append(errs, it.armed.Close())
	}
	if it.noteOpen != nil {
		errs = append(errs, it.noteOpen.Close())
	}
	errs = append(errs, it.prog.Close(), it.objs.Close())
	return errors.Join(errs...)
}

// Visited is the number of files the iterator has visited since Open,
// written or not: what the walks cost.
func (it *Iter) Visited() (uint64, error) {
	var n uint64
	if err := it.objs.Visited.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("read the readahead iterator's visit count: %w", err)
	}
	return n, nil
}

// Walks is the number of walks of every process's files since Open.
func (it *Iter) Walks() uint64 {
	it.mu.Lock()
	defer it.mu.Unlock()
	return it.walks
}

// Watch adds devices (filesystems' s_dev) whose files the iterator lists.
func (it *Iter) Watch(devs ...probe.Dev) error {
	for _, d := range devs {
		if err := it.objs.Watch.Put(uint32(d), uint8(1)); err != nil {
			return fmt.Errorf("watch device %s in the readahead iterator: %w", d, err)
		}
	}
	return nil
}

// Unwatch removes a device.
func (it *Iter) Unwatch(d probe.Dev) error {
	if err := it.objs.Watch.Delete(uint32(d)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unwatch device %s: %w", d, err)
	}
	return nil
}

// Query narrows a walk.
type Query struct {
	Tgid    uint32        // one process only; 0: every process
	AllDevs bool          // every device, not only the watched ones
	File    probe.FileKey // one file only (Ino 0: any)
}

// Files walks the open files of every process (or q.Tgid's) on watched
// devices and returns them sorted by (tgid, fd). A walk of one process
// visits only its files where the kernel can bind an iterator to one task
// (Linux 6.1 or later).
func (it *Iter) Files(q Query) ([]File, error) {
	bound := q.Tgid != 0 && it.self != nil
	flt := filerasFilerasFilter{Tgid: q.Tgid, Ino: q.File.Ino, Dev: uint32(q.File.Dev)}
	if bound {
		flt.Tgid = 0 // the link chooses the task
	}
	if q.AllDevs {
		flt.AllDevs = 1
	}
	if err := it.enter(flt, !bound); err != nil {
		return nil, err
	}
	defer it.leave()
	lnk := it.lnk
	switch {
	case !bound:
	case q.Tgid == it.selfPid:
		lnk = it.self
	default:
		// Attaching a loaded program is one system call, no verification.
		l, err := attachTaskIter(it.prog, q.Tgid)
		if err != nil {
			return nil, err
		}
		defer l.Close()
		lnk = l
	}
	rd, err := lnk.Open()
	if err != nil {
		return nil, fmt.Errorf("open the readahead iterator: %w", err)
	}
	defer rd.Close()
	raw, err := io.ReadAll(rd)
	if err != nil {
		return nil, fmt.Errorf("read the readahead iterator: %w", err)
	}
	return decode(raw)
}

// enter waits until no walk runs with another filter, sets flt and counts
// a walk in progress (and one of every process if whole).
func (it *Iter) enter(flt filerasFilerasFilter, whole bool) error {
	it.mu.Lock()
	defer it.mu.Unlock()
	for it.walking > 0 && *it.cur != flt {
		it.idle.Wait()
	}
	if it.cur == nil || *it.cur != flt {
		if err := it.objs.Filter.Put(uint32(0), flt); err != nil {
			return fmt.Errorf("set the readahead iterator's filter: %w", err)
		}
		it.cur = &flt
	}
	it.walking++
	if whole {
		it.walks++
	}
	return nil
}

func (it *Iter) leave() {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.walking--; it.walking == 0 {
		it.idle.Broadcast()
	}
}

// Self lists the daemon's own descriptors (taken with pidfd_getfd on
// other processes' open files), keyed by fd: a cheap walk of one process.
func (it *Iter) Self(tgid uint32) (map[int]File, error) {
	fs, err := it.Files(Query{Tgid: tgid, AllDevs: true})
	if err != nil {
		return nil, err
	}
	m := make(map[int]File, len(fs))
	for _, f := range fs {
		m[f.FD] = f
	}
	return m, nil
}

var recSize = int(unsafe.Sizeof(filerasRaFile{}))

func decode(raw []byte) ([]File, error) {
	if len(raw)%recSize != 0 {
		return nil, fmt.Errorf("readahead iterator returned %d bytes, not a multiple of its %d-byte record (object and bindings out of step: run make generate)", len(raw), recSize)
	}
	out := make([]File, 0, len(raw)/recSize)
	r := bytes.NewReader(raw)
	for r.Len() > 0 {
		var rec filerasRaFile
		if err := binary.Read(r, binary.NativeEndian, &rec); err != nil {
			return nil, fmt.Errorf("decode readahead iterator record: %w", err)
		}
		out = append(out, File{
			Tgid: rec.Tgid, FD: int(rec.Fd), Key: probe.FileKey{Dev: probe.Dev(rec.Dev), Ino: rec.Ino},
			ID: rec.File, Mode: rec.Mode, RAPages: rec.RaPages, Start: rec.Start, Size: rec.Size,
			AsyncSize: rec.AsyncSize, PrevPos: rec.PrevPos,
		})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tgid != out[j].Tgid {
			return out[i].Tgid < out[j].Tgid
		}
		return out[i].FD < out[j].FD
	})
	return out, nil
}

// Census counts open files per device and window (ra_pages, KB), whoever
// set it.
type Census map[probe.Dev]map[int]int

// Count builds a Census from a walk.
func Count(fs []File) Census {
	c := Census{}
	for _, f := range fs {
		if c[f.Key.Dev] == nil {
			c[f.Key.Dev] = map[int]int{}
		}
		c[f.Key.Dev][f.WindowKB()]++
	}
	return c
}
