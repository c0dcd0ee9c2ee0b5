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
// concurrent use (reads are serialised: the filter is shared).
type Iter struct {
	mu   sync.Mutex
	objs filerasObjects
	lnk  *link.Iter
}

// Open loads and attaches the iterator. It needs CAP_BPF and CAP_PERFMON
// (or CAP_SYS_ADMIN); reading it later needs no capability.
func Open() (*Iter, error) {
	it := &Iter{}
	if err := loadFilerasObjects(&it.objs, nil); err != nil {
		return nil, fmt.Errorf("load the open-file readahead iterator: %w (needs root, or CAP_BPF and CAP_PERFMON, and a kernel with BTF)", err)
	}
	l, err := link.AttachIter(link.IterOptions{Program: it.objs.DumpRa})
	if err != nil {
		it.objs.Close()
		return nil, fmt.Errorf("attach the open-file readahead iterator: %w", err)
	}
	it.lnk = l
	return it, nil
}

// Close releases the iterator.
func (it *Iter) Close() error {
	var errs []error
	if it.lnk != nil {
		errs = append(errs, it.lnk.Close())
	}
	errs = append(errs, it.objs.Close())
	return errors.Join(errs...)
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
	Tgid    uint32 // one process only; 0: every process
	AllDevs bool   // every device, not only the watched ones
}

// Files walks the open files of every process (or q.Tgid's) on watched
// devices and returns them sorted by (tgid, fd).
func (it *Iter) Files(q Query) ([]File, error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	flt := filerasFilerasFilter{Tgid: q.Tgid}
	if q.AllDevs {
		flt.AllDevs = 1
	}
	if err := it.objs.Filter.Put(uint32(0), flt); err != nil {
		return nil, fmt.Errorf("set the readahead iterator's filter: %w", err)
	}
	rd, err := it.lnk.Open()
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
