package actuate

// Restarting the stream of a reader that does not move during a break.
//
// A paused reader (a DataNode waiting on a slow client) never passes its
// window; resuming after the break it hits the marker and the async path
// keeps the old size. So its stream is restarted where it stands, in order:
//
//  1. While ra_pages is still 0, DONTNEED drops the pages from f_ra.prev_pos
//     to the end of the latest window, marker included (nothing reads ahead
//     for an idle reader, so none is locked under I/O). DONTNEED drops only
//     whole folios: if the position's page stays cached, the range widens
//     down to a 2 MB boundary, which takes only pages behind the reader.
//  2. ra_pages is set to the wanted window.
//  3. The position's page is read through our descriptor (sharing f_ra): a
//     miss at a sequential position starts a fresh window from ra_pages
//     (page_cache_sync_ra, get_init_ra_size).
//  4. f_ra is read back; a window above the wanted one is Unconfirmed.
//
// The reader re-reads what was dropped ahead (LowerStats.Reread, cachestat).

import (
	"errors"
	"fmt"
)

// pageCache is a Handle that reaches the file's page cache (procHandle).
type pageCache interface {
	// CachedBytes is how much of [off, off+length) is in the page cache.
	CachedBytes(off, length int64) (int64, error)
	// ReadPage reads the page at off through the shared open file; 0
	// bytes at end of file.
	ReadPage(off int64) (int, error)
}

const (
	pageBytes  = pageKB << 10
	folioBytes = 2 << 20 // the largest page-cache folio (PMD order on x86-64)
)

// rearm restarts idle readers' streams at req.KB; their ra_pages is 0.
func (l *Lowerer) rearm(req LowerReq, idle []idleFile, st *LowerStats) error {
	var errs []error
	type armed struct {
		idleFile
		pc  pageCache
		pos int64
	}
	var arms []armed
	fs := make([]LowerFile, 0, len(idle))
	for _, f := range idle {
		fs = append(fs, f.f)
		pc, ok := f.f.H.(pageCache)
		if !ok {
			st.unconfirmed(f.f, f.s, "its reader did not move during the break and its page cache cannot be reached")
			continue
		}
		// From its position, at most a window before the latest.
		pos := int64(f.s.Start) * pageBytes
		if f.s.PrevPos >= 0 {
			pos = max(min(pos, f.s.PrevPos&^(pageBytes-1)), int64(f.s.Start-min(f.s.Start, uint64(f.s.Size)))*pageBytes)
		}
		end := int64(f.s.Start+uint64(f.s.Size)) * pageBytes
		before, _ := pc.CachedBytes(pos, end-pos)
		for _, from := range []int64{pos, pos &^ (folioBytes - 1)} {
			if err := f.f.H.Fadvise(from, end-from, AdviceDontNeed); err != nil {
				errs = append(errs, fmt.Errorf("pid %d fd %d: drop the window ahead of an idle reader: %w", f.f.Ref.Tgid, f.f.Ref.FD, err))
				break
			}
			if c, err := pc.CachedBytes(pos, pageBytes); err != nil || c == 0 {
				break
			}
		}
		after, _ := pc.CachedBytes(pos, end-pos)
		st.Reread += max(before-after, 0)
		arms = append(arms, armed{f, pc, pos})
	}
	n, err := l.set(req, fs, st)
	st.Set += n
	errs = append(errs, err)
	if len(arms) == 0 {
		return errors.Join(errs...)
	}
	atEOF := map[int]bool{}
	armedFiles := make([]LowerFile, len(arms))
	for i, a := range arms {
		n, err := a.pc.ReadPage(a.pos)
		if err != nil {
			errs = append(errs, fmt.Errorf("pid %d fd %d: %w", a.f.Ref.Tgid, a.f.Ref.FD, err))
		}
		atEOF[i] = err == nil && n == 0
		armedFiles[i] = a.f
	}
	states, known := l.own(armedFiles)
	for i, a := range arms {
		s, ok := states[i]
		switch {
		case !known:
			st.unconfirmed(a.f, a.s, "the kernel's state could not be read back")
		case !ok || atEOF[i] || s.Size <= uint32(req.KB/pageKB):
			// Closed meanwhile, at EOF, or restarted.
			st.Rearmed++
		default:
			st.unconfirmed(a.f, s, fmt.Sprintf("window still above %d KB after dropping it ahead of the idle reader", req.KB))
		}
	}
	return errors.Join(errs...)
}
