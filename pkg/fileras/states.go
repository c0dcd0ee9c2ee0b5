package fileras

import (
	"os"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// States adapts an Iter to the actuator's view of the kernel's per-file
// readahead state (actuate.RAStates).
type States struct{ It *Iter }

var _ actuate.RAStates = States{}

// Own implements actuate.RAStates.
func (s States) Own(fds []int) (map[int]actuate.RAState, error) {
	self, err := s.It.Self(uint32(os.Getpid()))
	if err != nil {
		return nil, err
	}
	out := make(map[int]actuate.RAState, len(fds))
	for _, fd := range fds {
		if f, ok := self[fd]; ok {
			out[fd] = f.RA()
		}
	}
	return out, nil
}

// WatchOpens implements actuate.RAStates; it watches devs from then on.
// With the open hook (Arm) no process's files are walked. Without it, the
// files opened meanwhile are those whose open file (by ID) a walk of every
// process finds after and not before: two walks of every process's files.
// (fentry, fexit and BPF LSM programs on the open path are refused on a
// locked-down kernel, hence a hook on sys_exit.)
func (s States) WatchOpens(devs []probe.Dev) (func() []actuate.OpenFile, error) {
	if err := s.It.Watch(devs...); err != nil {
		return nil, err
	}
	if err := s.It.Arm(devs...); err == nil {
		return func() []actuate.OpenFile {
			fs, _ := s.It.Opened() // what was noted
			return openFiles(fs)
		}, nil
	}
	before, err := s.It.Files(Query{})
	if err != nil {
		return nil, err
	}
	old := map[uint64]bool{}
	for _, f := range before {
		old[f.ID] = true
	}
	want := map[probe.Dev]bool{}
	for _, d := range devs {
		want[d] = true
	}
	return func() []actuate.OpenFile {
		after, err := s.It.Files(Query{})
		if err != nil {
			return nil
		}
		var fresh []File
		for _, f := range after {
			if want[f.Key.Dev] && !old[f.ID] {
				fresh = append(fresh, f)
			}
		}
		return openFiles(fresh)
	}, nil
}

// openFiles converts files to the actuator's view, one descriptor per open
// file.
func openFiles(fs []File) []actuate.OpenFile {
	var out []actuate.OpenFile
	seen := map[uint64]bool{}
	for _, f := range fs {
		if seen[f.ID] {
			continue
		}
		seen[f.ID] = true
		out = append(out, actuate.OpenFile{Ref: actuate.FileRef{Tgid: f.Tgid, FD: f.FD, Key: f.Key}, RA: f.RA()})
	}
	return out
}

// RA is the file's state as the actuator reads it.
func (f File) RA() actuate.RAState {
	return actuate.RAState{ID: f.ID, RAPages: f.RAPages, Start: f.Start, Size: f.Size, AsyncSize: f.AsyncSize, PrevPos: f.PrevPos}
}
