package detector_test

import (
	"cmp"
	"compress/gzip"
	"encoding/gob"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/test/lab"
)

// TruthEvent is one ground-truth event of the lab (a regime change), in
// CLOCK_MONOTONIC, as labfs wrote it.
type TruthEvent struct {
	Mono  time.Duration
	Event string // permanent, temporal, intrinsic, clear, contention-start, ...
	Label string // the files, or what a mark refers to
	What  string // for clear: permanent, temporal, intrinsic or all
}

// Recording is a lab run as the detector sees it: the probe's records of
// the lab device and the lab's ground truth, so that the run can be replayed
// through the detector offline, deterministically, with any configuration
// or evaluation interval.
type Recording struct {
	Name       string
	Device     probe.Dev
	Files      map[string]probe.FileKey // lab path -> file key (ground-truth labels name paths)
	Truth      []TruthEvent
	Records    []probe.Record // in completion order
	Start, End time.Duration  // CLOCK_MONOTONIC span of the run
}

func truthFromLab(evs []lab.Event) []TruthEvent {
	out := make([]TruthEvent, 0, len(evs))
	for _, e := range evs {
		te := TruthEvent{Mono: e.Mono, Event: e.Event, Label: e.Label}
		if w, ok := e.Raw["what"].(string); ok {
			te.What = w
		}
		out = append(out, te)
	}
	return out
}

// sortRecords orders records by completion time: the ring delivers them in
// completion order per CPU, nearly but not exactly globally.
func (r *Recording) sortRecords() {
	slices.SortStableFunc(r.Records, func(a, b probe.Record) int {
		return cmp.Compare(a.Complete(), b.Complete())
	})
}

// Save writes the recording as gzip-compressed gob.
func (r *Recording) Save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	zw, _ := gzip.NewWriterLevel(f, gzip.BestCompression)
	if err := gob.NewEncoder(zw).Encode(r); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("encode recording %s: %w", path, err)
	}
	if err := zw.Close(); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// LoadRecording reads a recording written by Save.
func LoadRecording(path string) (*Recording, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("recording %s: %w", path, err)
	}
	var r Recording
	if err := gob.NewDecoder(zr).Decode(&r); err != nil {
		return nil, fmt.Errorf("recording %s: %w (re-record it with `make bench-detector` as root)", path, err)
	}
	return &r, nil
}

// Episode is one interval during which the lab applied a regime to a
// target: the file (FileLatencyShift, ExtentStart) or the device
// (TailInflation, Contention).
type Episode struct {
	Kind       string // lab regime: permanent, temporal, intrinsic, contention
	Device     probe.Dev
	File       probe.FileKey // zero for device-wide regimes
	Path       string
	Onset, End time.Duration
}

// Episodes derives the regime episodes from the ground truth.
func (r *Recording) Episodes() ([]Episode, error) {
	var out []Episode
	open := map[string][]int{} // lab regime -> indexes of open episodes
	closeKind := func(kind string, at time.Duration) {
		for _, i := range open[kind] {
			out[i].End = at
		}
		delete(open, kind)
	}
	add := func(kind, path string, at time.Duration) error {
		ep := Episode{Kind: kind, Device: r.Device, Path: path, Onset: at}
		if path != "" {
			k, ok := r.Files[path]
			if !ok {
				return fmt.Errorf("ground truth names %s, which the recording has no file key for", path)
			}
			ep.File = k
		}
		out = append(out, ep)
		open[kind] = append(open[kind], len(out)-1)
		return nil
	}
	for _, e := range r.Truth {
		switch e.Event {
		case "permanent", "intrinsic":
			for _, p := range strings.Fields(e.Label) {
				if err := add(e.Event, p, e.Mono); err != nil {
					return nil, err
				}
			}
		case "temporal":
			closeKind("temporal", e.Mono) // a new temporal regime replaces the old one
			if err := add("temporal", "", e.Mono); err != nil {
				return nil, err
			}
		case "contention-start":
			if err := add("contention", "", e.Mono); err != nil {
				return nil, err
			}
		case "contention-stop":
			closeKind("contention", e.Mono)
		case "clear":
			if e.What == "all" || e.What == "" {
				for _, k := range []string{"permanent", "temporal", "intrinsic"} {
					closeKind(k, e.Mono)
				}
			} else {
				closeKind(e.What, e.Mono)
			}
		}
	}
	for k := range open {
		closeKind(k, r.End)
	}
	slices.SortFunc(out, func(a, b Episode) int { return cmp.Compare(a.Onset, b.Onset) })
	return out, nil
}
