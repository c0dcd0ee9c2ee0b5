package fileras

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// ErrNoOpenHook: note_open is not available (a kernel that refuses it, or
// an architecture whose system call numbers it does not know); files opened
// during a device write are then found by walks of every process.
var ErrNoOpenHook = errors.New("open hook not available")

// loadNoteOpen loads note_open on the iterator's maps; nil when the kernel
// refuses it or the architecture is not one note_open knows.
func loadNoteOpen(spec *ebpf.CollectionSpec, m *filerasMaps) *ebpf.Program {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		return nil
	}
	var o struct {
		NoteOpen *ebpf.Program `ebpf:"note_open"`
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		"arm": m.Arm, "opens": m.Opens, "filter": m.Filter, "watch": m.Watch, "visited": m.Visited}}
	if err := spec.LoadAndAssign(&o, opts); err != nil {
		return nil
	}
	return o.NoteOpen
}

// Arm notes, until Opened, the regular files opened on devs by the open
// system calls (not by io_uring), with their descriptor and window. It
// attaches note_open to sys_exit only meanwhile: it runs at the exit of
// every system call on the machine.
func (it *Iter) Arm(devs ...probe.Dev) error {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.noteOpen == nil {
		return ErrNoOpenHook
	}
	if it.armed != nil {
		return fmt.Errorf("open hook already armed on %v", it.armedOn)
	}
	for _, d := range devs {
		if err := it.objs.Arm.Put(uint32(d), uint8(1)); err != nil {
			it.disarm()
			return fmt.Errorf("arm the open hook on device %s: %w", d, err)
		}
		it.armedOn = append(it.armedOn, d)
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: it.noteOpen})
	if err != nil {
		it.disarm()
		return fmt.Errorf("attach the open hook to sys_exit: %w", err)
	}
	it.armed = l
	return nil
}

func (it *Iter) disarm() error {
	var errs []error
	if it.armed != nil {
		errs = append(errs, it.armed.Close())
		it.armed = nil
	}
	for _, d := range it.armedOn {
		if err := it.objs.Arm.Delete(uint32(d)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("disarm the open hook on device %s: %w", d, err))
		}
	}
	it.armedOn = nil
	return errors.Join(errs...)
}

// Opened detaches the open hook and returns the files it noted since Arm,
// one per open file, with the window each had at open. A file may have
// been closed since (the caller checks its descriptor when it uses it).
func (it *Iter) Opened() ([]File, error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.noteOpen == nil {
		return nil, ErrNoOpenHook
	}
	errs := []error{it.disarm()}
	var (
		id   uint64
		rec  filerasOpened
		out  []File
		keys []uint64
	)
	iter := it.objs.Opens.Iterate()
	for iter.Next(&id, &rec) {
		keys = append(keys, id)
		out = append(out, File{Tgid: rec.Tgid, FD: int(rec.Fd), Key: probe.FileKey{Dev: probe.Dev(rec.Dev), Ino: rec.Ino}, ID: id, RAPages: rec.RaPages})
	}
	if err := iter.Err(); err != nil {
		errs = append(errs, fmt.Errorf("read the files the open hook noted: %w", err))
	}
	for _, k := range keys {
		if err := it.objs.Opens.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("forget a noted open: %w", err))
		}
	}
	return out, errors.Join(errs...)
}
