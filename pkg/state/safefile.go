package state

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The state directory is untrusted input (docs/security.md): anyone who can
// put a symlink, a FIFO, a hard link or a huge file in it must not make the
// daemon write through the link, block, or run out of memory. Every file in
// it is therefore reached with openat relative to a descriptor on the
// directory, never following a link in the last component, and read with a
// size bound.

// ErrUnsafeFile is returned (wrapped) for a state file that is a symlink,
// not a regular file, hard-linked elsewhere, or larger than its bound.
var ErrUnsafeFile = errors.New("not a plain regular file of bounded size")

// openDir opens dir itself without following a symlink in its last
// component.
func openDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("state directory %s is a symlink or not a directory: %w", dir, ErrUnsafeFile)
		}
		return -1, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return fd, nil
}

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("state file name %q is not a plain file name", name)
	}
	return nil
}

// openAtNoFollow opens name in the directory dirfd with flags plus
// O_NOFOLLOW, and checks the result is a regular file with one link.
func openAtNoFollow(dirfd int, dir, name string, flags int, mode uint32) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	p := filepath.Join(dir, name)
	// O_NONBLOCK: opening a FIFO planted under the name must not hang.
	fd, err := unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, mode)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%s is a symlink: %w", p, ErrUnsafeFile)
		}
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a regular file: %w", p, ErrUnsafeFile)
	}
	// A hard link to a file elsewhere would be truncated or read through.
	if st.Nlink > 1 {
		unix.Close(fd)
		return nil, fmt.Errorf("%s has %d hard links: %w", p, st.Nlink, ErrUnsafeFile)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), p), nil
}

// ReadFileBounded reads the regular file name in dir without following
// symlinks (in name; dir's own last component must not be one either) and
// fails if it holds more than max bytes. A missing file is an error
// satisfying errors.Is(err, os.ErrNotExist).
func ReadFileBounded(dir, name string, max int64) ([]byte, error) {
	dfd, err := openDir(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	f, err := openAtNoFollow(dfd, dir, name, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes: %w", f.Name(), max, ErrUnsafeFile)
	}
	return b, nil
}

// WriteFileAtomic replaces name in dir with data (mode 0600): a new file
// created exclusively under a random name, written, renamed over name. A
// symlink at name is replaced, never followed. With durable, the file and
// the directory are fsynced so that the new content survives a power loss.
func WriteFileAtomic(dir, name string, data []byte, durable bool) error {
	if err := checkName(name); err != nil {
		return err
	}
	dfd, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := name + ".tmp" + hex.EncodeToString(rnd[:])
	f, err := openAtNoFollow(dfd, dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", filepath.Join(dir, tmp), err)
	}
	fail := func(err error) error {
		f.Close()
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("write %s: %w (check the state directory is writable and not full)", filepath.Join(dir, name), err)
	}
	if err := f.Chmod(0o600); err != nil { // whatever the umask
		return fail(err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			return fail(err)
		}
	}
	if err := f.Close(); err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("replace %s: %w", filepath.Join(dir, name), err)
	}
	if durable {
		if err := unix.Fsync(dfd); err != nil {
			return fmt.Errorf("sync state directory %s: %w", dir, err)
		}
	}
	return nil
}

// RemoveFile removes name from dir (a symlink is removed, not its target);
// a missing file is not an error.
func RemoveFile(dir, name string, durable bool) error {
	if err := checkName(name); err != nil {
		return err
	}
	dfd, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s: %w", filepath.Join(dir, name), err)
	}
	if durable {
		if err := unix.Fsync(dfd); err != nil {
			return fmt.Errorf("sync state directory %s: %w", dir, err)
		}
	}
	return nil
}

// removeTemps drops the temporary files a crash mid-write left for name:
// they never replaced the record. Unlinking removes a link itself, never
// what it points to.
func removeTemps(dir, name string) {
	dfd, err := openDir(dir)
	if err != nil {
		return
	}
	d := os.NewFile(uintptr(dfd), dir) // owns dfd from here
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), name+".tmp") {
			_ = unix.Unlinkat(dfd, e.Name(), 0)
		}
	}
}
