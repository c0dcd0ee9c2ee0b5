package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// PinsName is the file, inside the state directory, that lists the open
// files of other processes whose readahead window readaheadd set.
const PinsName = "pins.json"

// MaxPins bounds the record: beyond it the oldest entries are dropped (their
// windows end when their readers close the files, as they would anyway).
const MaxPins = 16384

// Pin is one descriptor of another process whose open file readaheadd gave
// a window other than its device's. The window belongs to the open file
// description, not to the device: it outlives a daemon killed with SIGKILL
// until the reader closes the file, so the next start (or `readaheadd
// restore`) puts it back to the device's window.
type Pin struct {
	PID uint32 `json:"pid"`
	FD  int    `json:"fd"`
	// Dev and Ino name the file (Dev in the kernel's dev_t encoding): a
	// descriptor that now names another file is not touched.
	Dev      uint32    `json:"dev"`
	Ino      uint64    `json:"ino"`
	Device   string    `json:"device"` // disk, for the operator
	WindowKB int       `json:"window_kb"`
	Path     string    `json:"path,omitempty"`
	PinnedAt time.Time `json:"pinned_at"`
}

type pinID struct {
	pid uint32
	fd  int
}

func (p Pin) id() pinID { return pinID{p.PID, p.FD} }

type pinsFormat struct {
	Version int    `json:"version"`
	BootID  string `json:"boot_id,omitempty"`
	Pins    []Pin  `json:"pins"`
}

// PinsPath is the pins file's path.
func (s *Store) PinsPath() string { return filepath.Join(s.dir, PinsName) }

// loadPins reads the pins file. Pins are best effort (a window left behind
// ends when its file is closed), so a file that cannot be used is reported
// and set aside rather than stopping the daemon.
func (s *Store) loadPins() {
	p := s.PinsPath()
	removeTemps(p)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var pf pinsFormat
	if err == nil {
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		err = dec.Decode(&pf)
		if err == nil && pf.Version != Version {
			err = fmt.Errorf("format version %d, this readaheadd reads version %d", pf.Version, Version)
		}
	}
	if err != nil {
		aside := p + ".unusable"
		_ = os.Rename(p, aside)
		s.log.Warn("state: the record of per-file windows is unusable and was set aside; windows it listed end when their readers close the files",
			"file", p, "moved_to", aside, "err", err)
		return
	}
	if pf.BootID != "" && s.bootID != "" && pf.BootID != s.bootID {
		_ = os.Remove(p) // those processes are gone with the boot
		return
	}
	for _, pin := range pf.Pins {
		s.pins[pin.id()] = pin
	}
}

// Pins returns the recorded per-file windows, oldest first.
func (s *Store) Pins() []Pin {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sortedPinsLocked()
}

func (s *Store) sortedPinsLocked() []Pin {
	out := make([]Pin, 0, len(s.pins))
	for _, p := range s.pins {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].PinnedAt.Equal(out[j].PinnedAt) {
			return out[i].PinnedAt.Before(out[j].PinnedAt)
		}
		if out[i].PID != out[j].PID {
			return out[i].PID < out[j].PID
		}
		return out[i].FD < out[j].FD
	})
	return out
}

// UpdatePins records set (replacing entries of the same pid and fd) and
// forgets clear, then writes the pins file if anything changed. The file is
// replaced atomically but not fsynced: it only matters while the processes
// it names run, and none survives a power loss.
func (s *Store) UpdatePins(set, clear []Pin) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for _, p := range clear {
		if _, ok := s.pins[p.id()]; ok {
			delete(s.pins, p.id())
			changed = true
		}
	}
	for _, p := range set {
		if p.PinnedAt.IsZero() {
			p.PinnedAt = time.Now().UTC()
		}
		if old, ok := s.pins[p.id()]; ok && old.Dev == p.Dev && old.Ino == p.Ino && old.WindowKB == p.WindowKB {
			continue
		}
		s.pins[p.id()] = p
		changed = true
	}
	if len(s.pins) > MaxPins {
		all := s.sortedPinsLocked()
		for _, p := range all[:len(all)-MaxPins] {
			delete(s.pins, p.id())
		}
		s.log.Warn("state: too many per-file windows recorded; the oldest were dropped from the record", "max", MaxPins)
		changed = true
	}
	if !changed {
		return nil
	}
	return s.persistPinsLocked()
}

func (s *Store) persistPinsLocked() error {
	p := s.PinsPath()
	if len(s.pins) == 0 {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", p, err)
		}
		return nil
	}
	b, err := json.MarshalIndent(pinsFormat{Version: Version, BootID: s.bootID, Pins: s.sortedPinsLocked()}, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.dir, PinsName+".tmp*")
	if err != nil {
		return fmt.Errorf("record per-file windows in %s: %w", s.dir, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("record per-file windows in %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("record per-file windows: %w", err)
	}
	return nil
}
