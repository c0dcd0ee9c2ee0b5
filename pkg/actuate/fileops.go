// Package actuate changes readahead windows and carries no decision: it
// reaches other processes' open files (pidfd_getfd), sets their windows
// with posix_fadvise (through read_ahead_kb when needed), lowers a window
// in use (lower.go, rearm.go) and resets a crashed run's pins (restore.go).
package actuate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Advice is a posix_fadvise advice value.
type Advice int

const (
	AdviceNormal     Advice = unix.FADV_NORMAL
	AdviceSequential Advice = unix.FADV_SEQUENTIAL
	AdviceWillNeed   Advice = unix.FADV_WILLNEED
	AdviceDontNeed   Advice = unix.FADV_DONTNEED
)

func (a Advice) String() string {
	switch a {
	case AdviceNormal:
		return "NORMAL"
	case AdviceSequential:
		return "SEQUENTIAL"
	case AdviceWillNeed:
		return "WILLNEED"
	case AdviceDontNeed:
		return "DONTNEED"
	}
	return strconv.Itoa(int(a))
}

// AdviceFor is how a file gets window kb on a device at deviceKB: NORMAL
// copies the device's value, SEQUENTIAL twice it; others need the device to
// hold kb while NORMAL is given (through).
func AdviceFor(kb, deviceKB int) (a Advice, through bool) {
	switch {
	case kb == deviceKB:
		return AdviceNormal, false
	case kb == 2*deviceKB:
		return AdviceSequential, false
	}
	return AdviceNormal, true
}

// FileRef names one descriptor a process holds on a file.
type FileRef struct {
	Tgid uint32
	FD   int
	Key  probe.FileKey
	Path string // link target of /proc/TGID/fd/FD
}

// Handle is our own descriptor on another process's open file description.
type Handle interface {
	Fadvise(off, length int64, advice Advice) error
	Close() error
}

// FileOps reaches other processes' open files.
type FileOps interface {
	// Find lists the descriptors process tgid holds on file.
	Find(tgid uint32, file probe.FileKey) ([]FileRef, error)
	// Dup takes a descriptor on the same open file description as ref
	// (pidfd_open + pidfd_getfd) and checks it still is ref.Key.
	Dup(ref FileRef) (Handle, error)
	// FindAll lists the descriptors any process holds on file, for
	// readers no event names (mmap faults).
	FindAll(file probe.FileKey) ([]FileRef, error)
	// Holds reports whether process ref.Tgid still has descriptor ref.FD
	// open on ref.Key; true when that cannot be told.
	Holds(ref FileRef) bool
}

var (
	// ErrProcessGone: the process exited.
	ErrProcessGone = errors.New("process exited")
	// ErrFDGone: the descriptor was closed, or now names another file.
	ErrFDGone = errors.New("descriptor closed or reused")
)

// ProcFileOps implements FileOps with /proc, pidfd_open and pidfd_getfd
// (Linux 5.6+; needs ptrace-attach rights over the reader).
type ProcFileOps struct {
	Proc string // procfs mount, normally /proc
}

// NewProcFileOps returns FileOps on /proc.
func NewProcFileOps() *ProcFileOps { return &ProcFileOps{Proc: "/proc"} }

// Find implements FileOps.
func (p *ProcFileOps) Find(tgid uint32, file probe.FileKey) ([]FileRef, error) {
	dir := filepath.Join(p.Proc, strconv.FormatUint(uint64(tgid), 10), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("list descriptors of pid %d: %w", tgid, ErrProcessGone)
		}
		return nil, fmt.Errorf("list descriptors of pid %d: %w (readaheadd needs root to look into other processes)", tgid, err)
	}
	var refs []FileRef
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		link := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		// stat follows the magic link whatever the mount namespace.
		if unix.Stat(link, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if probe.DevFromUnix(st.Dev) != file.Dev || st.Ino != file.Ino {
			continue
		}
		target, err := os.Readlink(link)
		if err != nil {
			continue // closed meanwhile
		}
		refs = append(refs, FileRef{Tgid: tgid, FD: fd, Key: file, Path: target})
	}
	return refs, nil
}

// FindAll implements FileOps by walking every process: call it rarely.
func (p *ProcFileOps) FindAll(file probe.FileKey) ([]FileRef, error) {
	ents, err := os.ReadDir(p.Proc)
	if err != nil {
		return nil, fmt.Errorf("list processes in %s: %w", p.Proc, err)
	}
	self := uint64(os.Getpid())
	var refs []FileRef
	for _, e := range ents {
		tgid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || tgid == self {
			continue
		}
		found, _ := p.Find(uint32(tgid), file) // none if exited meanwhile, or a kernel thread
		refs = append(refs, found...)
	}
	return refs, nil
}

// Holds implements FileOps with one stat of the magic link.
func (p *ProcFileOps) Holds(ref FileRef) bool {
	var st unix.Stat_t
	link := filepath.Join(p.Proc, strconv.FormatUint(uint64(ref.Tgid), 10), "fd", strconv.Itoa(ref.FD))
	if err := unix.Stat(link, &st); err != nil {
		// Gone (ENOENT, ESRCH); any other failure is not proof that it is.
		return !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ESRCH)
	}
	return probe.DevFromUnix(st.Dev) == ref.Key.Dev && st.Ino == ref.Key.Ino
}

// Dup implements FileOps.
func (p *ProcFileOps) Dup(ref FileRef) (Handle, error) {
	pidfd, err := unix.PidfdOpen(int(ref.Tgid), 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("pidfd_open %d: %w", ref.Tgid, ErrProcessGone)
		}
		return nil, fmt.Errorf("pidfd_open %d: %w", ref.Tgid, err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, ref.FD, 0)
	if err != nil {
		switch {
		case errors.Is(err, unix.ESRCH):
			return nil, fmt.Errorf("pidfd_getfd %d/%d: %w", ref.Tgid, ref.FD, ErrProcessGone)
		case errors.Is(err, unix.EBADF):
			return nil, fmt.Errorf("pidfd_getfd %d/%d: %w", ref.Tgid, ref.FD, ErrFDGone)
		case errors.Is(err, unix.EPERM):
			return nil, fmt.Errorf("pidfd_getfd %d/%d: %w (needs ptrace rights over the reader: run as root, without a restrictive Yama ptrace_scope)", ref.Tgid, ref.FD, err)
		}
		return nil, fmt.Errorf("pidfd_getfd %d/%d: %w", ref.Tgid, ref.FD, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fstat descriptor of %d/%d: %w", ref.Tgid, ref.FD, err)
	}
	// The fd number may have been closed and reused since Find.
	if probe.DevFromUnix(st.Dev) != ref.Key.Dev || st.Ino != ref.Key.Ino {
		unix.Close(fd)
		return nil, fmt.Errorf("descriptor %d/%d now names another file: %w", ref.Tgid, ref.FD, ErrFDGone)
	}
	return procHandle(fd), nil
}

type procHandle int

func (h procHandle) Fadvise(off, length int64, advice Advice) error {
	if err := unix.Fadvise(int(h), off, length, int(advice)); err != nil {
		return fmt.Errorf("posix_fadvise %s: %w", advice, err)
	}
	return nil
}

func (h procHandle) Close() error { return unix.Close(int(h)) }

// CachedBytes implements pageCache with cachestat(2) (Linux 6.5).
func (h procHandle) CachedBytes(off, length int64) (int64, error) {
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(h), &unix.CachestatRange{Off: uint64(off), Len: uint64(length)}, &cs, 0); err != nil {
		return 0, fmt.Errorf("cachestat: %w", err)
	}
	return int64(cs.Cache) * int64(os.Getpagesize()), nil
}

// ReadPage implements pageCache: one page read through the shared open
// file, moving the reader's readahead state.
func (h procHandle) ReadPage(off int64) (int, error) {
	buf := make([]byte, os.Getpagesize())
	n, err := unix.Pread(int(h), buf, off)
	if err != nil {
		return n, fmt.Errorf("read a page at %d: %w", off, err)
	}
	return n, nil
}

// FD is our descriptor's number (the kernel's per-file state is read by it).
func (h procHandle) FD() int { return int(h) }
