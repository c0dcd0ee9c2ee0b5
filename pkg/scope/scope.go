// Package scope decides which open files readaheadd may act on: files that
// lie under an allowed directory, whatever path and mount namespace a
// reader sees them through.
//
// A directory is identified by the file system it lives on (the mount's
// device) and its path within that file system (the mount's root plus the
// rest of the path), not by a path string: a pod that sees a host data
// directory through a volume at another path names the same directory,
// and an unrelated directory bind-mounted at a path that looks allowed
// does not. Every answer is then verified on the daemon's side: the open
// file must be reachable beneath the allowed directory, without symlinks,
// `..` or crossing a mount, as the very inode the reader has open.
package scope

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// refreshEvery bounds how often the daemon's mount table is re-read when a
// file lies on a device no allowed directory is known on (a disk mounted
// below an allow-path after the start).
const refreshEvery = 10 * time.Second

// Scope is the set of allowed directories. Its methods are safe for
// concurrent use.
type Scope struct {
	proc  string
	paths []string // allowed directories, symlinks resolved

	mu      sync.Mutex
	roots   []root
	builtAt time.Time
}

// root is one allowed directory: a directory of a file system, and where
// the daemon reaches it.
type root struct {
	dev    probe.Dev // the mount's device, as mountinfo gives it
	fsPath string    // the directory within its file system
	path   string    // the same directory in the daemon's mount namespace
}

// New resolves each allowed directory (symlinks included) in the daemon's
// mount namespace, with /proc as procfs.
func New(paths []string) (*Scope, error) { return NewAt("/proc", paths) }

// NewAt is New with another procfs root (tests use a fake tree).
func NewAt(proc string, paths []string) (*Scope, error) {
	s := &Scope{proc: proc}
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("allow-path %q must be absolute", p)
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil, fmt.Errorf("allow-path %s: %w (give existing directories, such as the DataNode's data directories)", p, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(real, &st); err != nil {
			return nil, fmt.Errorf("allow-path %s: %w", p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return nil, fmt.Errorf("allow-path %s is not a directory (give the data directories themselves)", p)
		}
		s.paths = append(s.paths, filepath.Clean(real))
	}
	if len(s.paths) > 0 {
		if err := s.build(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// build maps each allowed directory, and every whole file system mounted
// at or below it, to (device, directory within the file system).
func (s *Scope) build() error {
	mounts, err := readMountinfo(filepath.Join(s.proc, "self", "mountinfo"))
	if err != nil {
		return fmt.Errorf("read the daemon's mount table: %w (readaheadd needs procfs at %s)", err, s.proc)
	}
	byID := map[int]Mount{}
	for _, m := range mounts {
		byID[m.ID] = m
	}
	var roots []root
	for _, p := range s.paths {
		id, err := pathMountID(p)
		if err != nil {
			return fmt.Errorf("allow-path %s: find its mount: %w", p, err)
		}
		m, ok := byID[id]
		if !ok || !under(p, m.Point) {
			return fmt.Errorf("allow-path %s: its mount %d is not in %s/self/mountinfo as a parent of it (is procfs the daemon's own?)", p, id, s.proc)
		}
		roots = append(roots, root{dev: m.Dev, fsPath: filepath.Join(m.Root, rel(p, m.Point)), path: p})
		// Disks mounted below the allowed directory (/data/1, /data/2
		// under /data) are in scope as whole file systems. A bind mount of
		// some directory (root other than "/") is not: it brings in
		// whatever that directory is, and counts only if it is itself
		// under an allowed directory.
		for _, sub := range mounts {
			if sub.Point != p && under(sub.Point, p) && sub.Root == "/" {
				roots = append(roots, root{dev: sub.Dev, fsPath: "/", path: sub.Point})
			}
		}
	}
	s.mu.Lock()
	s.roots, s.builtAt = roots, time.Now()
	s.mu.Unlock()
	return nil
}

// pathMountID returns the id of the mount a path lies on (statx's
// STATX_MNT_ID, Linux 5.8 or later).
func pathMountID(p string) (int, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_STATX_SYNC_AS_STAT, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, fmt.Errorf("statx %s: %w", p, err)
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		return 0, errors.New("the kernel gives no mount id (Linux 5.8 or later is needed)")
	}
	return int(stx.Mnt_id), nil
}

// Empty reports whether no directory is allowed.
func (s *Scope) Empty() bool { return s == nil || len(s.paths) == 0 }

// Paths returns the allowed directories as resolved.
func (s *Scope) Paths() []string { return append([]string(nil), s.paths...) }

// Check decides whether the file descriptor fd of process tgid, whose link
// target is path (as /proc/TGID/fd/FD names it, in the reader's mount
// namespace) and which is the open file file, lies under an allowed
// Covers reports whether dir, a directory in the daemon's mount namespace,
// lies under an allowed directory and on that directory's file system (dev):
// what the tuner asks of a directory a remembered window was learned in.
func (s *Scope) Covers(dir string, dev probe.Dev) bool {
	if s.Empty() || !filepath.IsAbs(dir) {
		return false
	}
	dir = filepath.Clean(dir)
	s.mu.Lock()
	roots := s.roots
	s.mu.Unlock()
	for _, r := range roots {
		if r.dev == dev && under(dir, r.path) {
			return true
		}
	}
	return false
}

// directory. It returns the file's path in the daemon's namespace.
func (s *Scope) Check(tgid uint32, fd int, path string, file probe.FileKey) (string, error) {
	if s.Empty() {
		return "", errors.New("no allow-path configured")
	}
	if !filepath.IsAbs(path) || strings.HasSuffix(path, " (deleted)") || filepath.Clean(path) != path {
		return "", fmt.Errorf("%q is not a path readaheadd can check (deleted, or not a file of a mounted file system)", path)
	}
	found, where := s.check(tgid, fd, path, file)
	if found != "" {
		return found, nil
	}
	s.mu.Lock()
	stale := time.Since(s.builtAt) > refreshEvery
	s.mu.Unlock()
	if stale && s.build() == nil {
		if found, where = s.check(tgid, fd, path, file); found != "" {
			return found, nil
		}
	}
	return "", fmt.Errorf("%s is outside every allow-path (%s)", path, where)
}

// check tries the reader's view first (its mount of the descriptor), then
// the path as the daemon sees it. It returns the file's path in the
// daemon's namespace, or where it was looked for when it is not in scope.
func (s *Scope) check(tgid uint32, fd int, path string, file probe.FileKey) (found, where string) {
	s.mu.Lock()
	roots := s.roots
	s.mu.Unlock()
	var tried []string
	type cand struct {
		r    root
		rest string
	}
	var cands []cand
	if m, err := s.readerMount(tgid, fd); err != nil {
		tried = append(tried, err.Error())
	} else if !under(path, m.Point) {
		tried = append(tried, fmt.Sprintf("pid %d's mount %d at %s does not hold its path", tgid, m.ID, m.Point))
	} else {
		fsPath := filepath.Join(m.Root, rel(path, m.Point))
		tried = append(tried, fmt.Sprintf("in pid %d's namespace: %s of the file system on %s", tgid, fsPath, m.Dev))
		for _, r := range roots {
			if r.dev == m.Dev && under(fsPath, r.fsPath) {
				cands = append(cands, cand{r, rel(fsPath, r.fsPath)})
			}
		}
	}
	for _, r := range roots {
		if under(path, r.path) {
			cands = append(cands, cand{r, rel(path, r.path)})
		}
	}
	for _, c := range cands {
		ok, err := sameFile(c.r.path, c.rest, file)
		if ok {
			return filepath.Join(c.r.path, c.rest), ""
		}
		if err != nil {
			tried = append(tried, err.Error())
		}
	}
	return "", strings.Join(tried, "; ")
}

func (s *Scope) readerMount(tgid uint32, fd int) (Mount, error) {
	id, err := mountID(s.proc, tgid, fd)
	if err != nil {
		return Mount{}, fmt.Errorf("mount of %d/%d: %w", tgid, fd, err)
	}
	mounts, err := readMountinfo(filepath.Join(s.proc, strconv.FormatUint(uint64(tgid), 10), "mountinfo"))
	if err != nil {
		return Mount{}, fmt.Errorf("mount table of pid %d: %w", tgid, err)
	}
	for _, m := range mounts {
		if m.ID == id {
			return m, nil
		}
	}
	return Mount{}, fmt.Errorf("mount %d of %d/%d is not in its mount table", id, tgid, fd)
}

// sameFile reports whether rest, resolved beneath dir without symlinks,
// `..` or mount crossings, is file.
func sameFile(dir, rest string, file probe.FileKey) (bool, error) {
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(d)
	if rest == "" {
		rest = "."
	}
	f, err := unix.Openat2(d, rest, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return false, fmt.Errorf("%s beneath %s: %w", rest, dir, err)
	}
	defer unix.Close(f)
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil {
		return false, fmt.Errorf("fstat %s/%s: %w", dir, rest, err)
	}
	if probe.DevFromUnix(st.Dev) != file.Dev || st.Ino != file.Ino {
		return false, fmt.Errorf("%s/%s is not the open file %s", dir, rest, file)
	}
	return true, nil
}
