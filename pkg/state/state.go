// Package state keeps the read_ahead_kb value each block device had before
// readaheadd first changed it, so that a clean exit, a later start after a
// crash, or `readaheadd restore` can put every device back.
//
// The record is one JSON file written atomically (temp file, rename) with
// mode 0600. It is not fsynced: it outlives a crash of the daemon in the
// page cache, and after a reboot, when the kernel has reset every device,
// it is discarded (boot id); an fsync would only put a journal commit on
// the path of a file's first window. An exclusive flock on a lock file
// in the same directory keeps two daemons (or a daemon and `readaheadd
// restore`) from fighting over it.
//
// The directory's content is untrusted: every file is opened without
// following symlinks and read with a size bound, every field is checked,
// and a recorded original is written back only to a device the caller's
// configuration tunes and whose identity (dev_t, diskseq) still matches.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
)

// Version is the format version this package writes and reads.
const Version = 1

// MaxReadAheadKB bounds a recorded original (1 GiB, far above any window a
// kernel is given); a larger value marks the file as corrupt.
const MaxReadAheadKB = 1 << 20

// MaxEntries bounds the devices in the record (a machine has far fewer
// disks), and MaxStateBytes the file's size: more means it was not written
// by readaheadd.
const (
	MaxEntries    = 1024
	MaxStateBytes = 1 << 20
)

const (
	// FileName is the state file inside the state directory.
	FileName = "originals.json"
	// LockName is the lock file inside the state directory.
	LockName   = "originals.lock"
	bootIDPath = "/proc/sys/kernel/random/boot_id"
)

// Entry is one device's original setting.
type Entry struct {
	Device      string    `json:"device"` // name in /sys/block
	Dev         string    `json:"dev"`    // major:minor when recorded, for the operator
	ReadAheadKB int       `json:"read_ahead_kb"`
	RecordedAt  time.Time `json:"recorded_at"`
	// DiskSeq is the disk's /sys/block/NAME/diskseq when recorded (0:
	// unknown). A different value later means the name now belongs to
	// other media (a loop device detached and reused, a disk replaced),
	// whose setting the original is not for.
	DiskSeq uint64 `json:"diskseq,omitempty"`
}

type fileFormat struct {
	Version int     `json:"version"`
	BootID  string  `json:"boot_id,omitempty"`
	Devices []Entry `json:"devices"`
}

// Sysfs is the part of blockdev.SysFS the store needs to restore settings.
type Sysfs interface {
	ReadAheadKB(name string) (int, error)
	SetReadAheadKB(name string, kb int) error
}

// ErrLocked is returned (wrapped) by Open when another process holds the lock.
var ErrLocked = errors.New("state directory is locked by another readaheadd")

// CorruptError reports a state file that cannot be trusted. Nothing is
// written over it: the operator decides.
type CorruptError struct {
	Path   string
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("state file %s is unusable (%s): it records the original read_ahead_kb of devices readaheadd changed. "+
		"Inspect it, set any values it still shows by hand (echo KB > /sys/block/DEV/queue/read_ahead_kb), "+
		"then move it aside and start readaheadd again", e.Path, e.Reason)
}

// Options adjust Open for tests.
type Options struct {
	// BootID overrides the kernel's boot id (read from /proc when empty).
	BootID string
	Logger *slog.Logger
	// DiskSeq reads a disk's media sequence number (blockdev.SysFS.DiskSeq);
	// nil records none.
	DiskSeq func(device string) (uint64, error)
	// DevOf reads a disk's current major:minor (blockdev.SysFS.Lookup).
	DevOf func(device string) (string, error)
	// Tunable reports whether the configuration lets readaheadd tune
	// device, and Protected whether it must never be written unless
	// tunable (the OS disk). An original loaded from the file is written
	// back to a tunable device whose dev_t (and diskseq, when both are
	// known) still match the record, or to a device that is not protected
	// whose dev_t and non-zero diskseq both match; nil Tunable allows only
	// the second, nil Protected protects nothing.
	Tunable   func(device string) bool
	Protected func(device string) bool
}

// Store is an open, locked state directory.
type Store struct {
	dir       string
	bootID    string
	log       *slog.Logger
	lock      *os.File
	seq       func(string) (uint64, error)
	devOf     func(string) (string, error)
	tunable   func(string) bool
	protected func(string) bool

	mu      sync.Mutex
	entries map[string]Entry
	pins    map[pinID]Pin
	// mine: devices this Store recorded itself (this process changed them).
	mine map[string]bool
}

// Open creates dir if needed (mode 0700), takes its lock and loads the
// record. A record from a previous boot is discarded (the kernel reset every
// device at boot); a truncated, corrupt or newer-version file is an error of
// type *CorruptError and is left untouched.
func Open(dir string, opt Options) (*Store, error) {
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	if dir == "" {
		return nil, errors.New("state directory not set: give --state-dir (for example /var/lib/readaheadd)")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", dir, err)
	}
	lockPath := filepath.Join(dir, LockName)
	dfd, err := openDir(dir)
	if err != nil {
		return nil, err
	}
	// Not following links: a symlink named like the lock must not get its
	// target truncated below.
	lf, err := openAtNoFollow(dfd, dir, LockName, unix.O_RDWR|unix.O_CREAT, 0o600)
	unix.Close(dfd)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w (move it aside; readaheadd creates its own)", err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := make([]byte, 32)
		n, _ := lf.ReadAt(holder, 0)
		holder = holder[:n]
		lf.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s (lock %s, holder pid %s): stop the running daemon first; it restores the devices itself on SIGTERM: %w",
				ErrLocked.Error(), lockPath, strings.TrimSpace(string(holder)), ErrLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", lockPath, err)
	}
	// Record our pid for the error message another process would print.
	if err := lf.Truncate(0); err == nil {
		_, _ = lf.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	boot := opt.BootID
	if boot == "" {
		if b, err := os.ReadFile(bootIDPath); err == nil {
			boot = strings.TrimSpace(string(b))
		}
	}
	s := &Store{dir: dir, bootID: boot, log: log, lock: lf, seq: opt.DiskSeq, devOf: opt.DevOf, tunable: opt.Tunable, protected: opt.Protected,
		entries: map[string]Entry{}, pins: map[pinID]Pin{}, mine: map[string]bool{}}
	if err := s.load(); err != nil {
		s.Close()
		return nil, err
	}
	s.loadPins()
	return s, nil
}

// Path is the state file's path.
func (s *Store) Path() string { return filepath.Join(s.dir, FileName) }

// Close releases the lock. The record stays on disk.
func (s *Store) Close() error {
	if s.lock == nil {
		return nil
	}
	err := s.lock.Close() // closing drops the flock
	s.lock = nil
	return err
}

func (s *Store) load() error {
	p := s.Path()
	removeTemps(s.dir, FileName)
	b, err := ReadFileBounded(s.dir, FileName, MaxStateBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if errors.Is(err, ErrUnsafeFile) {
		return &CorruptError{Path: p, Reason: err.Error()}
	}
	if err != nil {
		return fmt.Errorf("read state file %s: %w", p, err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return &CorruptError{Path: p, Reason: "empty or truncated"}
	}
	var probeVer struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(b, &probeVer); err != nil {
		return &CorruptError{Path: p, Reason: "not valid JSON: " + err.Error()}
	}
	if probeVer.Version == nil {
		return &CorruptError{Path: p, Reason: "no version field"}
	}
	if *probeVer.Version != Version {
		return &CorruptError{Path: p, Reason: fmt.Sprintf("format version %d, this readaheadd reads version %d", *probeVer.Version, Version)}
	}
	var ff fileFormat
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ff); err != nil {
		return &CorruptError{Path: p, Reason: "unexpected content: " + err.Error()}
	}
	if len(ff.Devices) > MaxEntries {
		return &CorruptError{Path: p, Reason: fmt.Sprintf("%d devices recorded, more than the %d readaheadd ever records", len(ff.Devices), MaxEntries)}
	}
	seen := map[string]bool{}
	for i, e := range ff.Devices {
		// Restore writes these names and values into sysfs: a name that is
		// not a plain device name, or a value no kernel had, means the file
		// was not written by readaheadd.
		if blockdev.ValidName(e.Device) != nil || e.ReadAheadKB < 0 || e.ReadAheadKB > MaxReadAheadKB || !validDevNum(e.Dev) || seen[e.Device] {
			return &CorruptError{Path: p, Reason: fmt.Sprintf("entry %d (%q, dev %q, %d KB) is not a valid device setting", i, e.Device, e.Dev, e.ReadAheadKB)}
		}
		seen[e.Device] = true
	}
	if ff.BootID != "" && s.bootID != "" && ff.BootID != s.bootID {
		s.log.Info("state: originals were recorded before the last reboot; the kernel has reset every device since, so they are discarded",
			"file", p, "recorded_boot", ff.BootID, "devices", len(ff.Devices))
		return s.persistLocked()
	}
	for _, e := range ff.Devices {
		s.entries[e.Device] = e
	}
	return nil
}

// Entries returns the recorded originals, sorted by device name.
func (s *Store) Entries() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Entry, 0, len(s.entries))
	for _, e := range s.entries {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Device < out[j].Device })
	return out
}

// Original returns the recorded original of device, if any.
func (s *Store) Original(device string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[device]
	return e.ReadAheadKB, ok
}

// Record durably records device's original value. It must be called before
// the first write to the device. If an original is already recorded it is
// kept: the first value seen is the one to restore.
func (s *Store) Record(device, dev string, kb int) error {
	// What Record accepts, load must accept back.
	if err := blockdev.ValidName(device); err != nil {
		return fmt.Errorf("record original: %w", err)
	}
	if kb < 0 || kb > MaxReadAheadKB {
		return fmt.Errorf("record original of %s: %d KB is not a read_ahead_kb value", device, kb)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.entries[device]; ok {
		return nil
	}
	if !validDevNum(dev) {
		return fmt.Errorf("record original of %s: %q is not MAJOR:MINOR", device, dev)
	}
	e := Entry{Device: device, Dev: dev, ReadAheadKB: kb, RecordedAt: time.Now().UTC()}
	if s.seq != nil {
		if seq, err := s.seq(device); err == nil {
			e.DiskSeq = seq
		}
	}
	s.entries[device] = e
	if err := s.persistLocked(); err != nil {
		delete(s.entries, device)
		return err
	}
	s.mine[device] = true
	return nil
}

// Forget drops device's record (after the caller put its original back).
func (s *Store) Forget(device string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[device]
	if !ok {
		return nil
	}
	delete(s.entries, device)
	if err := s.persistLocked(); err != nil {
		s.entries[device] = e
		return err
	}
	return nil
}

// errReplaced marks a record whose device name now belongs to other media.
var errReplaced = errors.New("replaced")

// Check tells whether Restore may write e back: nil if so, else why not.
// An original this Store recorded itself is for a device this process
// changed. One loaded from the file (untrusted) must name a device whose
// dev_t still matches the record, and then either a device the
// configuration tunes (its diskseq matching too when both are known), or
// any device but a protected one (the OS disk) whose recorded non-zero
// diskseq matches: the disk readaheadd recorded, still holding the same
// media.
func (s *Store) Check(e Entry) error {
	s.mu.Lock()
	mine := s.mine[e.Device]
	s.mu.Unlock()
	if e.DiskSeq != 0 && s.seq != nil {
		if seq, err := s.seq(e.Device); err == nil && seq != 0 && seq != e.DiskSeq {
			return fmt.Errorf("the disk was replaced since (diskseq %d, recorded %d): %w", seq, e.DiskSeq, errReplaced)
		}
	}
	if mine {
		return nil
	}
	tunable := s.tunable != nil && s.tunable(e.Device)
	if !tunable && s.protected != nil && s.protected(e.Device) {
		return errors.New("it holds the root filesystem and this configuration does not tune it (allow-os-disk)")
	}
	if s.devOf == nil || e.Dev == "" {
		return errors.New("no device number to check the record against")
	}
	dev, err := s.devOf(e.Device)
	if err != nil {
		return err
	}
	if dev != e.Dev {
		return fmt.Errorf("the name now belongs to device %s (recorded %s): %w", dev, e.Dev, errReplaced)
	}
	var seq uint64
	if s.seq != nil {
		if seq, err = s.seq(e.Device); err != nil {
			return err
		}
	}
	switch {
	case tunable && (seq == 0 || e.DiskSeq != 0):
		return nil
	case tunable:
		return errors.New("the record has no diskseq to check the disk against")
	case e.DiskSeq == 0 || seq == 0:
		return errors.New("not a device this configuration tunes, and no diskseq to show it is the disk readaheadd recorded (add it with --device if readaheadd changed it)")
	}
	return nil // seq == e.DiskSeq: a mismatch was refused above
}

// Restore writes recorded originals back and clears their records. Only
// entries that pass Check are written; each refused one is logged on one
// line and its record kept (or dropped, when its name now belongs to other
// media). A device that no longer exists keeps its record (it is logged) so
// a later restore can still put it back; other failures are returned, also
// keeping the record.
func (s *Store) Restore(sys Sysfs) error {
	var errs []error
	for _, e := range s.Entries() {
		if cerr := s.Check(e); cerr != nil {
			switch {
			case errors.Is(cerr, errReplaced):
				// The name now belongs to other media, which the kernel
				// set up with its own default: writing the old value would
				// change a device readaheadd never touched.
				s.log.Warn("state: not writing a recorded original to a device that was replaced since; dropping the record",
					"device", e.Device, "dev", e.Dev, "original_kb", e.ReadAheadKB, "reason", cerr.Error())
				if err := s.Forget(e.Device); err != nil {
					errs = append(errs, err)
				}
			case isNoDevice(cerr):
				s.log.Warn("state: device of a recorded original is gone; keeping its record for a later restore",
					"device", e.Device, "dev", e.Dev, "original_kb", e.ReadAheadKB, "file", s.Path())
			default:
				s.log.Warn("state: refusing to restore a recorded original; record kept, nothing written",
					"device", e.Device, "dev", e.Dev, "original_kb", e.ReadAheadKB, "reason", cerr.Error(), "file", s.Path())
			}
			continue
		}
		if err := sys.SetReadAheadKB(e.Device, e.ReadAheadKB); err != nil {
			if isNoDevice(err) {
				s.log.Warn("state: device of a recorded original is gone; keeping its record for a later restore",
					"device", e.Device, "dev", e.Dev, "original_kb", e.ReadAheadKB, "file", s.Path())
				continue
			}
			errs = append(errs, fmt.Errorf("restore read_ahead_kb of %s to %d: %w", e.Device, e.ReadAheadKB, err))
			continue
		}
		s.log.Info("state: restored original read_ahead_kb", "device", e.Device, "kb", e.ReadAheadKB)
		if err := s.Forget(e.Device); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// validDevNum accepts "" (not recorded) or MAJOR:MINOR in decimal.
func validDevNum(d string) bool {
	if d == "" {
		return true
	}
	maj, min, ok := strings.Cut(d, ":")
	if !ok {
		return false
	}
	for _, part := range []string{maj, min} {
		if len(part) == 0 || len(part) > 10 {
			return false
		}
		if _, err := strconv.ParseUint(part, 10, 32); err != nil {
			return false
		}
	}
	return true
}

func isNoDevice(err error) bool {
	return errors.Is(err, blockdev.ErrNoDevice) || errors.Is(err, os.ErrNotExist)
}

// persistLocked writes the record atomically; with no entries it removes
// the file. s.mu is held.
func (s *Store) persistLocked() error {
	p := s.Path()
	if len(s.entries) == 0 {
		if err := RemoveFile(s.dir, FileName, false); err != nil {
			return fmt.Errorf("remove state file %s: %w", p, err)
		}
		return nil
	}
	ff := fileFormat{Version: Version, BootID: s.bootID}
	for _, e := range s.entries {
		ff.Devices = append(ff.Devices, e)
	}
	sort.Slice(ff.Devices, func(i, j int) bool { return ff.Devices[i].Device < ff.Devices[j].Device })
	b, err := json.MarshalIndent(ff, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	b = append(b, '\n')
	return WriteFileAtomic(s.dir, FileName, b, false)
}

// DevOfSysfs reads a disk's current MAJOR:MINOR from sysfs, for
// Options.DevOf.
func DevOfSysfs(sys blockdev.SysFS) func(string) (string, error) {
	return func(name string) (string, error) {
		d, err := sys.Lookup(name)
		if err != nil {
			return "", err
		}
		return d.Dev.String(), nil
	}
}
