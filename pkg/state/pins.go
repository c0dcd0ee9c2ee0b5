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

	"github.com/readaheadd/readaheadd/pkg/blockdev"
)

// PinsName is the file, inside the state directory, that lists the open
// files of other processes whose readahead window readaheadd set.
const PinsName = "pins.json"

// MaxPins bounds the record: beyond it the oldest entries are dropped (their
// windows end when their readers close the files, as they would anyway).
const MaxPins = 16384

// MaxPinsBytes bounds the pins file: MaxPins entries of a few hundred bytes
// each (paths included).
const MaxPinsBytes = 8 << 20

// maxPID is the kernel's PID_MAX_LIMIT on 64-bit machines.
const maxPID = 1 << 22

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

// Validate checks each field of a pin against what readaheadd records:
// restore hands the pid and fd to pidfd_getfd, so nothing else may pass.
func (p Pin) Validate() error {
	switch {
	case p.PID == 0 || p.PID > maxPID:
		return fmt.Errorf("pid %d is not a process id", p.PID)
	case p.FD < 0 || p.FD > 1<<30:
		return fmt.Errorf("fd %d is not a descriptor number", p.FD)
	case p.Dev == 0 || p.Ino == 0:
		return fmt.Errorf("file %d:%d is not a device and inode", p.Dev, p.Ino)
	case blockdev.ValidName(p.Device) != nil:
		return fmt.Errorf("device %q is not a block device name", p.Device)
	case p.WindowKB < 0 || p.WindowKB > MaxReadAheadKB:
		return fmt.Errorf("window %d KB is out of range", p.WindowKB)
	case p.Path != "" && (!filepath.IsAbs(p.Path) || len(p.Path) > 4096 || strings.ContainsRune(p.Path, 0)):
		return fmt.Errorf("path %q is not an absolute path", p.Path)
	}
	return nil
}

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
	removeTemps(s.dir, PinsName)
	b, err := ReadFileBounded(s.dir, PinsName, MaxPinsBytes)
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
		if err == nil && len(pf.Pins) > MaxPins {
			err = fmt.Errorf("%d entries, more than the %d readaheadd ever records", len(pf.Pins), MaxPins)
		}
		if err == nil {
			for i, pin := range pf.Pins {
				if verr := pin.Validate(); verr != nil {
					err = fmt.Errorf("entry %d: %w", i, verr)
					break
				}
			}
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
		_ = RemoveFile(s.dir, PinsName, false) // those processes are gone with the boot
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
		if err := p.Validate(); err != nil {
			return fmt.Errorf("record per-file window of pid %d fd %d: %w", p.PID, p.FD, err)
		}
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
	if len(s.pins) == 0 {
		return RemoveFile(s.dir, PinsName, false)
	}
	b, err := json.MarshalIndent(pinsFormat{Version: Version, BootID: s.bootID, Pins: s.sortedPinsLocked()}, "", "  ")
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(s.dir, PinsName, append(b, '\n'), false); err != nil {
		return fmt.Errorf("record per-file windows: %w", err)
	}
	return nil
}
