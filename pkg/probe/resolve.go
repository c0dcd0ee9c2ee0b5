package probe

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Resolver turns a FileKey into a path for display. The kernel side knows
// only (device, inode); the path comes from the open descriptors of the
// processes seen reading the file (readahead events name them), with
// fallbacks: the filesystem's mount point and the inode number, then the
// bare key. Paths are for people, never for acting on a file.
type Resolver struct {
	// ProcRoot is where procfs is mounted; "" means /proc.
	ProcRoot string

	mu      sync.Mutex
	cache   map[FileKey]string
	readers map[FileKey][]uint32
	mounts  map[Dev]string
}

// maxReadersPerFile bounds what a Resolver remembers per file.
const maxReadersPerFile = 4

// maxResolverFiles bounds how many files a Resolver remembers: a DataNode
// reads millions of block files over its life, and display names are worth
// keeping only for the recent ones.
const maxResolverFiles = 8192

// evictOne makes room in m by dropping an arbitrary entry (map iteration
// order is random, which spreads evictions without bookkeeping).
func evictOne[V any](m map[FileKey]V) {
	for k := range m {
		delete(m, k)
		return
	}
}

func (r *Resolver) proc(elem ...string) string {
	root := r.ProcRoot
	if root == "" {
		root = "/proc"
	}
	return filepath.Join(append([]string{root}, elem...)...)
}

// Observe notes that e.Tgid reads e.File.
func (r *Resolver) Observe(e ReadaheadEvent) {
	if e.File.IsZero() || e.Tgid == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.readers == nil {
		r.readers = map[FileKey][]uint32{}
	}
	rs := r.readers[e.File]
	for _, t := range rs {
		if t == e.Tgid {
			return
		}
	}
	if len(rs) >= maxReadersPerFile {
		rs = rs[1:]
	}
	if rs == nil && len(r.readers) >= maxResolverFiles {
		evictOne(r.readers)
	}
	r.readers[e.File] = append(rs, e.Tgid)
}

// Resolve returns a display name for k and whether it is a real path.
func (r *Resolver) Resolve(k FileKey) (string, bool) {
	r.mu.Lock()
	cached, ok := r.cache[k]
	tgids := append([]uint32(nil), r.readers[k]...)
	r.mu.Unlock()
	if ok && sameFile(cached, k) {
		return cached, true
	}
	for _, tgid := range tgids {
		if p, ok := r.fromFds(tgid, k); ok {
			r.mu.Lock()
			if r.cache == nil {
				r.cache = map[FileKey]string{}
			}
			if _, ok := r.cache[k]; !ok && len(r.cache) >= maxResolverFiles {
				evictOne(r.cache)
			}
			r.cache[k] = p
			r.mu.Unlock()
			return p, true
		}
	}
	if mnt, ok := r.mountOf(k.Dev); ok {
		return fmt.Sprintf("%s (inode %d)", mnt, k.Ino), false
	}
	return k.String(), false
}

// Forget drops what the resolver knows about k (e.g. it aged out).
func (r *Resolver) Forget(k FileKey) {
	r.mu.Lock()
	delete(r.cache, k)
	delete(r.readers, k)
	r.mu.Unlock()
}

func sameFile(p string, k FileKey) bool {
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil {
		return false
	}
	return DevFromUnix(st.Dev) == k.Dev && st.Ino == k.Ino
}

// fromFds looks through /proc/TGID/fd for a descriptor open on k.
func (r *Resolver) fromFds(tgid uint32, k FileKey) (string, bool) {
	dir := r.proc(strconv.FormatUint(uint64(tgid), 10), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", false
	}
	for _, e := range ents {
		fd := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		if unix.Stat(fd, &st) != nil { // follows the link to the open file
			continue
		}
		if DevFromUnix(st.Dev) != k.Dev || st.Ino != k.Ino {
			continue
		}
		p, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(p, "/") {
			continue
		}
		// A file deleted while open reads "/path (deleted)": still the best name.
		return p, true
	}
	return "", false
}

// mountOf finds a mount point of the filesystem with device dev.
func (r *Resolver) mountOf(dev Dev) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.mounts[dev]; ok {
		return m, true
	}
	f, err := os.Open(r.proc("self", "mountinfo"))
	if err != nil {
		return "", false
	}
	defer f.Close()
	mounts := map[Dev]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT ...
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		maj, min, ok := strings.Cut(fs[2], ":")
		if !ok {
			continue
		}
		ma, err1 := strconv.ParseUint(maj, 10, 32)
		mi, err2 := strconv.ParseUint(min, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		d := MkDev(uint32(ma), uint32(mi))
		if _, seen := mounts[d]; !seen {
			mounts[d] = unescapeMount(fs[4])
		}
	}
	r.mounts = mounts
	m, ok := mounts[dev]
	return m, ok
}

// unescapeMount undoes mountinfo's octal escapes (\040 for space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
