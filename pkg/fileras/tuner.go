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

// OnDevices implements tuner.RAStates; it watches devs from then on.
func (s States) OnDevices(devs []probe.Dev) ([]tuner.OpenFile, error) {
	if err := s.It.Watch(devs...); err != nil {
		return nil, err
	}
	fs, err := s.It.Files(Query{})
	if err != nil {
		return nil, err
	}
	want := map[probe.Dev]bool{}
	for _, d := range devs {
		want[d] = true
	}
	var out []tuner.OpenFile
	for _, f := range fs {
		if want[f.Key.Dev] {
			out = append(out, tuner.OpenFile{Ref: tuner.FileRef{Tgid: f.Tgid, FD: f.FD, Key: f.Key}, RA: f.RA()})
		}
	}
	return out, nil
}

// RA is the file's state as the tuner reads it.
func (f File) RA() tuner.RAState {
	return tuner.RAState{ID: f.ID, RAPages: f.RAPages, Start: f.Start, Size: f.Size, AsyncSize: f.AsyncSize, PrevPos: f.PrevPos}
}
