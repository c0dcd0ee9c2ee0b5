// Package blockdev reads and writes the block-device settings readaheadd
// cares about under a sysfs root (normally /sys), so that everything above
// it can be tested against a fake tree.
package blockdev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// DefaultRoot is where sysfs is mounted.
const DefaultRoot = "/sys"

// SysFS is a sysfs tree rooted at Root.
type SysFS struct {
	Root string
}

// Disk is a whole block device as listed in /sys/block.
type Disk struct {
	Name string
	Dev  probe.Dev
}

// ErrNoDevice is returned (wrapped) when a named device does not exist.
var ErrNoDevice = errors.New("no such block device")

// ValidName reports whether name can be a block device name: non-empty,
// no path separators, not "." or "..".
func ValidName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("invalid block device name %q: give a name from /sys/block, such as sda or nvme0n1", name)
	}
	return nil
}

func (s SysFS) root() string {
	if s.Root == "" {
		return DefaultRoot
	}
	return s.Root
}

func (s SysFS) blockPath(name string, elem ...string) string {
	return filepath.Join(append([]string{s.root(), "block", name}, elem...)...)
}

// Lookup returns the disk called name, or an error wrapping ErrNoDevice.
func (s SysFS) Lookup(name string) (Disk, error) {
	if err := ValidName(name); err != nil {
		return Disk{}, err
	}
	b, err := os.ReadFile(s.blockPath(name, "dev"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Disk{}, fmt.Errorf("block device %q: %w (see /sys/block for the names on this machine)", name, ErrNoDevice)
		}
		return Disk{}, fmt.Errorf("read device number of %q: %w", name, err)
	}
	dev, err := ParseDev(string(b))
	if err != nil {
		return Disk{}, fmt.Errorf("device number of %q: %w", name, err)
	}
	return Disk{Name: name, Dev: dev}, nil
}

// Disks lists every disk in /sys/block, sorted by name.
func (s SysFS) Disks() ([]Disk, error) {
	entries, err := os.ReadDir(filepath.Join(s.root(), "block"))
	if err != nil {
		return nil, fmt.Errorf("list block devices: %w", err)
	}
	var disks []Disk
	for _, e := range entries {
		d, err := s.Lookup(e.Name())
		if err != nil {
			continue // vanished while listing
		}
		disks = append(disks, d)
	}
	sort.Slice(disks, func(i, j int) bool { return disks[i].Name < disks[j].Name })
	return disks, nil
}

// IsVirtual reports whether a disk is a loop, RAM or zram device: the kinds
// readaheadd leaves alone unless told otherwise.
func IsVirtual(name string) bool {
	for _, p := range []string{"loop", "ram", "zram", "nbd", "dm-", "md"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// DefaultDisks lists the disks readaheadd watches when no device is given:
// every disk that is not virtual.
func (s SysFS) DefaultDisks() ([]Disk, error) {
	all, err := s.Disks()
	if err != nil {
		return nil, err
	}
	var out []Disk
	for _, d := range all {
		if !IsVirtual(d.Name) {
			out = append(out, d)
		}
	}
	return out, nil
}

// ByDev finds the disk with device number dev.
func (s SysFS) ByDev(dev probe.Dev) (Disk, error) {
	disks, err := s.Disks()
	if err != nil {
		return Disk{}, err
	}
	for _, d := range disks {
		if d.Dev == dev {
			return d, nil
		}
	}
	return Disk{}, fmt.Errorf("block device %s: %w", dev, ErrNoDevice)
}

// ReadAheadKB reads /sys/block/NAME/queue/read_ahead_kb.
func (s SysFS) ReadAheadKB(name string) (int, error) {
	if err := ValidName(name); err != nil {
		return 0, err
	}
	b, err := os.ReadFile(s.blockPath(name, "queue", "read_ahead_kb"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("read_ahead_kb of %q: %w", name, ErrNoDevice)
		}
		return 0, fmt.Errorf("read read_ahead_kb of %q: %w", name, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v < 0 {
		return 0, fmt.Errorf("read_ahead_kb of %q is %q, not a size in KiB", name, strings.TrimSpace(string(b)))
	}
	return v, nil
}

// SetReadAheadKB writes /sys/block/NAME/queue/read_ahead_kb. Files opened
// afterwards start with this window; files already open keep theirs.
func (s SysFS) SetReadAheadKB(name string, kb int) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if kb < 0 {
		return fmt.Errorf("set read_ahead_kb of %q: negative value %d", name, kb)
	}
	p := s.blockPath(name, "queue", "read_ahead_kb")
	// O_WRONLY without O_CREAT: a device that vanished must not leave a
	// regular file behind in a fake tree, and sysfs rejects creation anyway.
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("set read_ahead_kb of %q: %w", name, ErrNoDevice)
		}
		return fmt.Errorf("set read_ahead_kb of %q: %w (readaheadd needs write access to this file: run as root; under the systemd unit, list it in ReadWritePaths= with a drop-in)", name, err)
	}
	_, werr := f.WriteString(strconv.Itoa(kb) + "\n")
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("set read_ahead_kb of %q to %d: %w", name, kb, werr)
	}
	if cerr != nil {
		return fmt.Errorf("set read_ahead_kb of %q to %d: %w", name, kb, cerr)
	}
	return nil
}

// DiskSeq reads /sys/block/NAME/diskseq, the kernel's sequence number of
// the media in a disk (Linux >= 5.15): it changes when a loop device is
// detached or attached and when a disk is replaced, even if the name and
// device number are reused. 0 with a nil error: this kernel has no diskseq.
func (s SysFS) DiskSeq(name string) (uint64, error) {
	if err := ValidName(name); err != nil {
		return 0, err
	}
	if _, err := os.Stat(s.blockPath(name)); err != nil {
		return 0, fmt.Errorf("block device %q: %w", name, ErrNoDevice)
	}
	b, err := os.ReadFile(s.blockPath(name, "diskseq"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read diskseq of %q: %w", name, err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("diskseq of %q is %q, not a number", name, strings.TrimSpace(string(b)))
	}
	return v, nil
}

// DiskOf returns the whole disk that holds dev, which may be a partition
// (the s_dev of a filesystem on sda1 is sda1's number, not sda's).
func (s SysFS) DiskOf(dev probe.Dev) (Disk, error) {
	link := filepath.Join(s.root(), "dev", "block", dev.String())
	target, err := filepath.EvalSymlinks(link)
	if err != nil {
		return Disk{}, fmt.Errorf("block device %s: %w", dev, ErrNoDevice)
	}
	// A partition's directory holds a "partition" file and sits inside its disk's.
	if _, err := os.Stat(filepath.Join(target, "partition")); err == nil {
		return s.Lookup(filepath.Base(filepath.Dir(target)))
	}
	return s.Lookup(filepath.Base(target))
}

// ParseDev parses "major:minor".
func ParseDev(s string) (probe.Dev, error) {
	s = strings.TrimSpace(s)
	maj, min, ok := strings.Cut(s, ":")
	if !ok {
		return 0, fmt.Errorf("device number %q is not major:minor", s)
	}
	ma, err1 := strconv.ParseUint(maj, 10, 32)
	mi, err2 := strconv.ParseUint(min, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("device number %q is not major:minor", s)
	}
	return probe.MkDev(uint32(ma), uint32(mi)), nil
}
