package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// inodePaths finds the paths of files named slower than their disk that
// the tuner has not resolved (it resolves the files it acts on): a walk of
// the allow-paths only, bounded in entries and in how often it runs, off
// the evaluation loop. Files found nowhere under the allow-paths stay
// major:minor/inode.
type inodePaths struct {
	allow  []string
	budget int           // entries visited per walk
	every  time.Duration // at most one walk per this
	now    func() time.Time

	mu      sync.Mutex
	found   map[probe.FileKey]string
	walking bool
	last    time.Time
	tried   map[probe.FileKey]bool // looked for in a finished walk
}

// inodeWalkBudget bounds a walk: a DataNode's data directories hold a
// file per block (a million is not rare), and a path is a convenience.
const inodeWalkBudget = 200_000

func newInodePaths(allow []string) *inodePaths {
	return &inodePaths{allow: allow, budget: inodeWalkBudget, every: time.Minute, now: time.Now,
		found: map[probe.FileKey]string{}, tried: map[probe.FileKey]bool{}}
}

// Path is the path found for k, "" if none (yet).
func (ip *inodePaths) Path(k probe.FileKey) string {
	ip.mu.Lock()
	defer ip.mu.Unlock()
	return ip.found[k]
}

// Want starts a walk for the keys not found yet, unless one runs or ran
// within every and every key was looked for already. It returns at once;
// done (optional) is called when the walk ends.
func (ip *inodePaths) Want(keys []probe.FileKey, done func()) bool {
	ip.mu.Lock()
	var want []probe.FileKey
	fresh := false
	for _, k := range keys {
		if _, ok := ip.found[k]; ok {
			continue
		}
		want = append(want, k)
		if !ip.tried[k] {
			fresh = true
		}
	}
	if len(want) == 0 || ip.walking || (!fresh && ip.now().Sub(ip.last) < ip.every) || len(ip.allow) == 0 {
		ip.mu.Unlock()
		return false
	}
	ip.walking, ip.last = true, ip.now()
	ip.mu.Unlock()
	go func() {
		got := walkInodes(ip.allow, want, ip.budget)
		ip.mu.Lock()
		for k, p := range got {
			ip.found[k] = p
		}
		for _, k := range want {
			ip.tried[k] = true
		}
		ip.walking = false
		ip.mu.Unlock()
		if done != nil {
			done()
		}
	}()
	return true
}

// errWalkDone ends a walk early.
var errWalkDone = errors.New("walk done")

// walkInodes looks for regular files with the wanted (device, inode)
// under the roots, without following symbolic links, visiting at most
// budget entries.
func walkInodes(roots []string, want []probe.FileKey, budget int) map[probe.FileKey]string {
	wanted := map[probe.FileKey]bool{}
	for _, k := range want {
		wanted[k] = true
	}
	out := map[probe.FileKey]string{}
	visited := 0
	for _, root := range roots {
		if len(out) == len(wanted) || visited >= budget {
			break
		}
		_ = filepath.WalkDir(filepath.Clean(root), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil // unreadable: skip it, keep walking
			}
			visited++
			if visited > budget {
				return errWalkDone
			}
			if !d.Type().IsRegular() {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			st, ok := info.Sys().(*syscall.Stat_t)
			if !ok {
				return nil
			}
			k := probe.FileKey{Dev: probe.DevFromUnix(uint64(st.Dev)), Ino: st.Ino}
			if wanted[k] {
				out[k] = p
				if len(out) == len(wanted) {
					return errWalkDone
				}
			}
			return nil
		})
	}
	return out
}

// statKey is the FileKey of path (for tests).
func statKey(path string) (probe.FileKey, error) {
	info, err := os.Stat(path)
	if err != nil {
		return probe.FileKey{}, err
	}
	st := info.Sys().(*syscall.Stat_t)
	return probe.FileKey{Dev: probe.DevFromUnix(uint64(st.Dev)), Ino: st.Ino}, nil
}
