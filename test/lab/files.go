package lab

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

const mib = 1 << 20

func (l *Lab) path(name string) string {
	if filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(l.Mount, name)
}

func randomChunk() []byte {
	b := make([]byte, mib)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// WriteFile writes a file of mb MiB in the lab's file system (name relative
// to Mount), syncs it so that its extents are allocated, and drops its
// pages from the page cache so that the next read comes from the device.
// It returns the file's path.
func (l *Lab) WriteFile(name string, mb int) (string, error) {
	p := l.path(name)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return "", err
	}
	chunk := randomChunk()
	for i := 0; i < mb; i++ {
		chunk[0], chunk[1] = byte(i), byte(i>>8) // no two MiB alike
		if _, err := f.Write(chunk); err != nil {
			f.Close()
			return "", fmt.Errorf("write %s: %w", p, err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", fmt.Errorf("sync %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return p, DropFileCache(p)
}

// WriteFragmented writes files a and b of mb MiB each, interleaved in
// chunkMB pieces with an fsync after each piece, so that ext4 allocates
// them in alternating extents of about chunkMB each. It returns both paths.
func (l *Lab) WriteFragmented(a, b string, mb, chunkMB int) (string, string, error) {
	if chunkMB < 1 || mb < chunkMB {
		return "", "", fmt.Errorf("fragmented files: need 1 <= chunk (%d MiB) <= size (%d MiB)", chunkMB, mb)
	}
	pa, pb := l.path(a), l.path(b)
	// ext4 gives every large file its own preallocation, which keeps a
	// file contiguous however its writes interleave. Treating all files as
	// small ("stream" threshold raised) makes them share one allocation
	// stream, so interleaved fsynced pieces alternate on the device.
	knob := filepath.Join("/sys/fs/ext4", l.Name, "mb_stream_req")
	old, err := os.ReadFile(knob)
	if err != nil {
		return "", "", fmt.Errorf("read %s: %w", knob, err)
	}
	if err := os.WriteFile(knob, []byte("1000000000\n"), 0); err != nil {
		return "", "", fmt.Errorf("set %s: %w", knob, err)
	}
	defer os.WriteFile(knob, old, 0)
	var files [2]*os.File
	for i, p := range []string{pa, pb} {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			return "", "", err
		}
		defer f.Close()
		files[i] = f
	}
	chunk := randomChunk()
	for done := 0; done < mb; done += chunkMB {
		for _, f := range files {
			for i := 0; i < chunkMB && done+i < mb; i++ {
				chunk[0], chunk[1] = byte(done+i), byte((done+i)>>8)
				if _, err := f.Write(chunk); err != nil {
					return "", "", fmt.Errorf("write %s: %w", f.Name(), err)
				}
			}
			// fsync allocates this piece now, before the other file's.
			if err := f.Sync(); err != nil {
				return "", "", fmt.Errorf("sync %s: %w", f.Name(), err)
			}
		}
	}
	for _, p := range []string{pa, pb} {
		if err := DropFileCache(p); err != nil {
			return "", "", err
		}
	}
	return pa, pb, nil
}

// DropFileCache syncs a file and evicts its pages from the page cache, so
// that its next read goes to the device. It touches nothing else on the
// machine (unlike DropCaches).
func DropFileCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("fdatasync %s: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("evict %s from the page cache: %w", path, err)
	}
	return nil
}

// DropCaches syncs and drops the whole machine's clean page cache (echo 3 >
// /proc/sys/vm/drop_caches). Prefer DropFileCache in tests.
func DropCaches() error {
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		return fmt.Errorf("drop caches: %w (needs root)", err)
	}
	return nil
}
