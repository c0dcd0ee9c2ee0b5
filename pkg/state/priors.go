package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// PriorsName is the file, inside the state directory, that keeps what the
// tuner learned about windows that paid: per device and directory, and per
// slow file. It lets a restarted daemon serve the first open of a file that
// is still slow at once, instead of learning it again.
const PriorsName = "priors.json"

// PriorsFormat names the file's kind, so a JSON file of something else put
// at that path is told apart from a damaged one.
const PriorsFormat = "readaheadd-priors"

// PriorsVersion is the format version of the priors file.
const PriorsVersion = 1

// Bounds of the priors file: entries beyond them are dropped, oldest first,
// and a larger file is not read at all.
const (
	MaxPriorDirs   = 1024
	MaxSlowFiles   = 4096
	MaxDevices     = 256
	MaxPriorsBytes = 2 << 20
)

// DirPrior is the window that paid for recent streams in one directory of
// one filesystem (Dev in the kernel's dev_t encoding of the file's s_dev).
type DirPrior struct {
	Dev      uint32    `json:"dev"`
	Device   string    `json:"device"` // whole disk in /sys/block
	Dir      string    `json:"dir"`
	WindowKB int       `json:"window_kb"`
	BaseKB   int       `json:"base_kb"`  // the device's window the gain was measured against
	BaseBPS  float64   `json:"base_bps"` // stream throughput at BaseKB
	KeptBPS  float64   `json:"kept_bps"` // stream throughput at WindowKB
	Streams  int       `json:"streams"`  // streams it paid for
	Updated  time.Time `json:"updated"`
}

// SlowFile is one file whose reads needed a larger window.
type SlowFile struct {
	Dev      uint32    `json:"dev"`
	Ino      uint64    `json:"ino"`
	Device   string    `json:"device"`
	Path     string    `json:"path,omitempty"`
	WindowKB int       `json:"window_kb"`
	Updated  time.Time `json:"updated"`
}

// DeviceCapacity is a disk's capacity as the tuner learned it: the rate at
// which more bytes in flight stopped adding throughput (a step that raised
// them and left the device's total where it was), not the best rate seen;
// and its transfer capacity fitted on its latencies (FittedBPS, 0: none).
type DeviceCapacity struct {
	Device      string    `json:"device"` // whole disk in /sys/block
	CapacityBPS float64   `json:"capacity_bps"`
	FittedBPS   float64   `json:"fitted_bps,omitempty"`
	Updated     time.Time `json:"updated"`
}

// Priors is the content of the priors file.
type Priors struct {
	Dirs    []DirPrior       `json:"dirs"`
	Files   []SlowFile       `json:"files"`
	Devices []DeviceCapacity `json:"devices,omitempty"`
}

type priorsFile struct {
	Format  string           `json:"format"`
	Version int              `json:"version"`
	Dirs    []DirPrior       `json:"dirs"`
	Files   []SlowFile       `json:"files"`
	Devices []DeviceCapacity `json:"devices,omitempty"`
}

// PriorsPath is the priors file's path in the store's directory.
func (s *Store) PriorsPath() string { return filepath.Join(s.dir, PriorsName) }

// LoadPriors reads a priors file. A missing file is empty priors and no
// error. A file that is too large, not JSON, of another format or version
// returns an error saying so (the caller ignores it with a warning and
// starts with no priors; the next save replaces it). Entries that are not
// well-formed are dropped, and the rest bounded.
func LoadPriors(path string) (Priors, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Priors{}, nil
	}
	if err != nil {
		return Priors{}, fmt.Errorf("open priors file %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxPriorsBytes+1))
	if err != nil {
		return Priors{}, fmt.Errorf("read priors file %s: %w", path, err)
	}
	if len(b) > MaxPriorsBytes {
		return Priors{}, fmt.Errorf("priors file %s is larger than %d bytes; not read", path, MaxPriorsBytes)
	}
	var pf priorsFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&pf); err != nil {
		return Priors{}, fmt.Errorf("priors file %s is not a readaheadd priors file: %w", path, err)
	}
	if pf.Format != PriorsFormat {
		return Priors{}, fmt.Errorf("priors file %s has format %q, want %q", path, pf.Format, PriorsFormat)
	}
	if pf.Version != PriorsVersion {
		return Priors{}, fmt.Errorf("priors file %s has version %d, this readaheadd reads version %d", path, pf.Version, PriorsVersion)
	}
	var p Priors
	for _, d := range pf.Dirs {
		if d.Dev != 0 && d.Device != "" && filepath.IsAbs(d.Dir) && d.WindowKB > 0 && d.BaseKB > 0 && d.BaseBPS >= 0 && d.KeptBPS >= 0 {
			d.Dir = filepath.Clean(d.Dir)
			p.Dirs = append(p.Dirs, d)
		}
	}
	for _, sf := range pf.Files {
		if sf.Dev != 0 && sf.Ino != 0 && sf.Device != "" && sf.WindowKB > 0 {
			p.Files = append(p.Files, sf)
		}
	}
	for _, d := range pf.Devices {
		if d.Device != "" && finiteRate(d.CapacityBPS) && finiteRate(d.FittedBPS) && d.CapacityBPS+d.FittedBPS > 0 {
			p.Devices = append(p.Devices, d)
		}
	}
	p.bound()
	return p, nil
}

// bound keeps the newest MaxPriorDirs and MaxSlowFiles entries.
func (p *Priors) bound() {
	sort.SliceStable(p.Dirs, func(i, j int) bool { return p.Dirs[i].Updated.After(p.Dirs[j].Updated) })
	if len(p.Dirs) > MaxPriorDirs {
		p.Dirs = p.Dirs[:MaxPriorDirs]
	}
	sort.SliceStable(p.Files, func(i, j int) bool { return p.Files[i].Updated.After(p.Files[j].Updated) })
	if len(p.Files) > MaxSlowFiles {
		p.Files = p.Files[:MaxSlowFiles]
	}
	if len(p.Devices) > MaxDevices {
		p.Devices = p.Devices[:MaxDevices]
	}
}

// SavePriors writes the priors atomically (temporary file, rename). Not
// fsynced: losing the latest priors in a power loss only costs relearning.
func SavePriors(path string, p Priors) error {
	p.bound()
	pf := priorsFile{Format: PriorsFormat, Version: PriorsVersion, Dirs: p.Dirs, Files: p.Files, Devices: p.Devices}
	if pf.Dirs == nil {
		pf.Dirs = []DirPrior{}
	}
	if pf.Files == nil {
		pf.Files = []SlowFile{}
	}
	b, err := json.MarshalIndent(pf, "", "  ")
	if err != nil {
		return fmt.Errorf("encode priors: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write priors file %s: %w", path, err)
	}
	name := tmp.Name()
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr, os.Chmod(name, 0o600)); err != nil {
		_ = os.Remove(name)
		return fmt.Errorf("write priors file %s: %w", path, err)
	}
	if err := os.Rename(name, path); err != nil {
		_ = os.Remove(name)
		return fmt.Errorf("replace priors file %s: %w", path, err)
	}
	return nil
}

// finiteRate reports whether a rate read from a file is a rate: finite and
// not negative (NaN is neither).
func finiteRate(bps float64) bool { return bps >= 0 && !math.IsInf(bps, 0) }
