package actuate

// Restarting the stream of a reader that does not move during a break.
//
// A break ends when the reader has read past its latest window (lower.go).
// A reader that pauses (a DataNode waiting on a slow client) does not, and
// when it resumes after the break, with ra_pages set back, it reaches the
// marker of that window and the asynchronous path keeps the old size
// (page_cache_async_ra: max of the previous size and the next one). So an
// idle reader's stream is restarted where it stands instead:
//
//  1. While ra_pages is still 0, POSIX_FADV_DONTNEED drops the pages from
//     the reader's position (f_ra.prev_pos, kept by read(2) and sendfile
//     alike) to the end of its latest window (f_ra.start+size), marker
//     included. Nothing reads ahead for an idle reader, so none of them is
//     locked under I/O. DONTNEED drops only folios wholly inside the range:
//     if the page at the position is still cached (a large folio begins
//     before it), the range is widened down to a 2 MB boundary, the largest
//     page-cache folio on x86-64; that takes pages behind the reader only.
//  2. ra_pages is set to the wanted window (as for any other file).
//  3. The page at the reader's position is read through our descriptor,
//     which shares the reader's open file and so its f_ra: a miss at a
//     sequential position takes the synchronous path, which starts a fresh
//     window from ra_pages (page_cache_sync_ra, get_init_ra_size).
//  4. The kernel's f_ra is read back: the window must be at most the
//     wanted one. Otherwise (pages mapped or locked, or the read failed)
//     the file is Unconfirmed.
//
// The reader resumes on the fresh window and reads again what was dropped
// ahead of it: at most the rest of its previous window and its latest one
// (LowerStats.Reread, measured with cachestat before and after the drop).

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
		// From its position, at most a window before the latest (a
		// reader that went back elsewhere is not followed there).
		pos := int64(f.s.Start) * pageBytes
		if f.s.PrevPos >= 0 {
			pos = max(min(pos, f.s.PrevPos&^(pageBytes-1)), int64(f.s.Start-min(f.s.Start, uint64(f.s.Size)))*pageBytes)
		}
		end := int64(f.s.Start+uint64(f.s.Size)) * pageBytes
		before, _ := pc.CachedBytes(pos, end-pos)
		from := pos
		for _, from = range []int64{pos, pos &^ (folioBytes - 1)} {
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
	for i, a := range arms {
		n, err := a.pc.ReadPage(a.pos)
		if err != nil {
			errs = append(errs, fmt.Errorf("pid %d fd %d: %w", a.f.Ref.Tgid, a.f.Ref.FD, err))
		}
		atEOF[i] = err == nil && n == 0
	}
	armedFiles := make([]LowerFile, len(arms))
	for i, a := range arms {
		armedFiles[i] = a.f
	}
	states, known := l.own(armedFiles)
	for i, a := range arms {
		s, ok := states[i]
		switch {
		case !known:
			st.unconfirmed(a.f, a.s, "the kernel's state could not be read back")
		case !ok || atEOF[i] || s.Size <= uint32(req.KB/pageKB):
			// Closed meanwhile, at its end (nothing to read ahead), or
			// restarted.
			st.Rearmed++
		default:
			st.unconfirmed(a.f, s, fmt.Sprintf("window still above %d KB after dropping it ahead of the idle reader", req.KB))
		}
	}
	return errors.Join(errs...)
}
