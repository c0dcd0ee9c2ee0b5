package fileras

import (
	"os"

	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/tuner"
)

// States adapts an Iter to the tuner's view of the kernel's per-file
// readahead state (tuner.RAStates).
type States struct{ It *Iter }

var _ tuner.RAStates = States{}

// Own implements tuner.RAStates.
func (s States) Own(fds []int) (map[int]tuner.RAState, error) {
	self, err := s.It.Self(uint32(os.Getpid()))
	if err != nil {
		return nil, err
	}
	out := make(map[int]tuner.RAState, len(fds))
	for _, fd := range fds {
		if f, ok := self[fd]; ok {
			out[fd] = f.RA()
		}
	}
	return out, nil
}

// WatchOpens implements tuner.RAStates; it watches devs from then on.
// With the open hook (Arm) no process's files are walked. Without it, the
// files opened meanwhile are those whose open file (by ID) a walk of every
// process finds after and not before: two walks of every process's files.
// (fentry, fexit and BPF LSM programs on the open path are refused on a
// locked-down kernel, hence a hook on sys_exit.)
func (s States) WatchOpens(devs []probe.Dev) (func() []tuner.OpenFile, error) {
	if err := s.It.Watch(devs...); err != nil {
		return nil, err
	}
	if err := s.It.Arm(devs...); err == nil {
		return func() []tuner.OpenFile {
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
	return func() []tuner.OpenFile {
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

// openFiles converts files to the tuner's view, one descriptor per open
// file.
func openFiles(fs []File) []tuner.OpenFile {
	var out []tuner.OpenFile
	seen := map[uint64]bool{}
	for _, f := range fs {
		if seen[f.ID] {
			continue
		}
		seen[f.ID] = true
		out = append(out, tuner.OpenFile{Ref: tuner.FileRef{Tgid: f.Tgid, FD: f.FD, Key: f.Key}, RA: f.RA()})
	}
	return out
}

// RA is the file's state as the tuner reads it.
func (f File) RA() tuner.RAState {
	return tuner.RAState{ID: f.ID, RAPages: f.RAPages, Start: f.Start, Size: f.Size, AsyncSize: f.AsyncSize, PrevPos: f.PrevPos}
}
