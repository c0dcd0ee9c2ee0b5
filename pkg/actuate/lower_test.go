package actuate

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// kfile models one open file's readahead as mm/readahead.c runs it for a
// sequential reader (pages): at the marker (the start of the latest
// window) the asynchronous path moves the window on and never shrinks it,
// unless ra_pages is 0 (then it does nothing); past the window's end a
// cache miss takes the synchronous path, which starts afresh at ra_pages
// (with ra_pages 0 it reads single pages and leaves the state alone).
type kfile struct {
	id                     uint64
	raPages, size, markers uint32
	start, pos             uint64
	hitMarker              bool
	// Pages [dropFrom, dropTo) were dropped from the page cache; folio
	// (pages, default 1) is the size of the folios, which DONTNEED drops
	// only whole.
	dropFrom, dropTo, folio uint64
	mapped                  bool // the pages are mapped: DONTNEED drops nothing
}

func (k *kfile) dropped(p uint64) bool { return p >= k.dropFrom && p < k.dropTo }

// miss is the synchronous path at page p: a fresh window from ra_pages
// (nothing with ra_pages 0).
func (k *kfile) miss(p uint64) {
	if k.raPages == 0 {
		return
	}
	k.start, k.size, k.hitMarker = p, min(4, k.raPages), false
	k.dropFrom, k.dropTo = 0, 0
}

func (k *kfile) advance(pages uint64) {
	for i := uint64(0); i < pages; i++ {
		k.pos++
		if k.dropped(k.pos) {
			k.miss(k.pos)
			continue
		}
		if k.pos == k.start && !k.hitMarker {
			k.hitMarker = true
			if k.raPages != 0 {
				k.start += uint64(k.size)
				k.size = max(k.size, min(2*k.size, k.raPages))
				k.hitMarker = false
				k.markers++
			}
		}
		if k.pos >= k.start+uint64(k.size) && k.raPages != 0 {
			k.start, k.size, k.hitMarker = k.pos+1, k.raPages, false
		}
	}
}

func (k *kfile) state() RAState {
	return RAState{ID: k.id, RAPages: k.raPages, Start: k.start, Size: k.size, AsyncSize: k.size, PrevPos: int64(k.pos) << 12}
}

// kernel is a fake device and the open files on it.
type kernel struct {
	devKB  int
	writes []int
	files  map[int]*kfile // by our fd (the reader's open file)
	others []OpenFile     // other processes' files on the device
	rate   uint64         // pages each reader reads per Sleep
	now    time.Duration
	dups   []FileRef
	onSet  func(kb int)     // runs while read_ahead_kb holds kb
	closed map[FileRef]bool // descriptors their reader closed
}

func (k *kernel) Holds(ref FileRef) bool { return !k.closed[ref] }

func (k *kernel) ReadAheadKB(string) (int, error) { return k.devKB, nil }
func (k *kernel) SetReadAheadKB(_ string, kb int) error {
	k.devKB = kb
	k.writes = append(k.writes, kb)
	if k.onSet != nil {
		k.onSet(kb)
	}
	return nil
}
func (k *kernel) Own(fds []int) (map[int]RAState, error) {
	out := map[int]RAState{}
	for _, fd := range fds {
		if f, ok := k.files[fd]; ok {
			out[fd] = f.state()
		}
	}
	return out, nil
}

// WatchOpens: the others appended meanwhile were opened meanwhile.
func (k *kernel) WatchOpens([]probe.Dev) (func() []OpenFile, error) {
	n := len(k.others)
	return func() []OpenFile { return append([]OpenFile(nil), k.others[n:]...) }, nil
}
func (k *kernel) Find(uint32, probe.FileKey) ([]FileRef, error) { return nil, nil }
func (k *kernel) FindAll(probe.FileKey) ([]FileRef, error)      { return nil, nil }
func (k *kernel) Dup(ref FileRef) (Handle, error) {
	k.dups = append(k.dups, ref)
	for i := range k.others {
		if k.others[i].Ref == ref {
			return &kOther{k: k, i: i}, nil
		}
	}
	return nil, ErrFDGone
}
func (k *kernel) sleep(d time.Duration) {
	k.now += d
	for _, f := range k.files {
		f.advance(k.rate)
	}
}

type kHandle struct {
	k  *kernel
	fd int
}

func (h kHandle) FD() int { return h.fd }
func (h kHandle) Fadvise(off, n int64, a Advice) error {
	f := h.k.files[h.fd]
	if a == AdviceDontNeed {
		fo := max(f.folio, 1)
		from, to := (uint64(off)>>12+fo-1)/fo*fo, uint64(off+n)>>12
		if !f.mapped && from < to {
			f.dropFrom, f.dropTo = from, to
		}
		return nil
	}
	f.raPages = uint32(h.k.devKB / 4)
	if a == AdviceSequential {
		f.raPages *= 2
	}
	return nil
}
func (h kHandle) Close() error { return nil }

func (h kHandle) CachedBytes(off, n int64) (int64, error) {
	f := h.k.files[h.fd]
	var c int64
	for p := uint64(off) >> 12; p < uint64(off+n+4095)>>12; p++ {
		if p < f.start+uint64(f.size) && !f.dropped(p) {
			c += 4096
		}
	}
	return c, nil
}

func (h kHandle) ReadPage(off int64) (int, error) {
	f := h.k.files[h.fd]
	if p := uint64(off) >> 12; f.dropped(p) {
		f.miss(p)
	}
	return 4096, nil
}

type kOther struct {
	k *kernel
	i int
}

func (h *kOther) Fadvise(_, _ int64, a Advice) error {
	h.k.others[h.i].RA.RAPages = uint32(h.k.devKB / 4)
	return nil
}
func (h *kOther) Close() error { return nil }

func newKernel() (*kernel, *Lowerer) {
	k := &kernel{devKB: 128, files: map[int]*kfile{}, rate: 16}
	return k, &Lowerer{Sysfs: k, Files: k, States: k, Sleep: k.sleep, Now: func() time.Duration { return k.now }}
}

// streaming adds a reader streaming on a window of kb.
func (k *kernel) streaming(fd int, kb int) LowerFile {
	p := uint32(kb / 4)
	k.files[fd] = &kfile{id: uint64(1000 + fd), raPages: p, size: p, start: 10 * uint64(p), pos: 10*uint64(p) - 3}
	return LowerFile{Ref: FileRef{Tgid: 100, FD: fd, Key: probe.FileKey{Dev: 7, Ino: uint64(fd)}}, H: kHandle{k: k, fd: fd}}
}

func TestModelPlainFadviseDoesNotLower(t *testing.T) {
	k, _ := newKernel()
	f := k.streaming(3, 1024)
	require.NoError(t, f.H.Fadvise(0, 0, AdviceNormal))
	k.sleep(0)
	for i := 0; i < 100; i++ {
		k.sleep(time.Millisecond)
	}
	assert.EqualValues(t, 32, k.files[3].raPages)
	assert.EqualValues(t, 256, k.files[3].size, "the asynchronous path keeps the larger window")
}

func TestLowerBreaksAStreamingReader(t *testing.T) {
	k, l := newKernel()
	f := k.streaming(3, 1024)
	st, err := l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 128, Files: []LowerFile{f}})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 128}, k.writes, "one break through 0, device back at once")
	assert.Equal(t, LowerStats{Set: 1, Broken: 1, Hold: st.Hold}, st)
	assert.Greater(t, st.Hold, time.Duration(0))
	assert.LessOrEqual(t, st.Hold, 50*time.Millisecond, "the break ends once the reader is past its window")
	for i := 0; i < 100; i++ {
		k.sleep(time.Millisecond)
	}
	kf := k.files[3]
	assert.EqualValues(t, 32, kf.raPages)
	assert.EqualValues(t, 32, kf.size, "the stream runs on the lowered window")
}

func TestLowerBelowTheDeviceGoesThroughIt(t *testing.T) {
	k, l := newKernel()
	f := k.streaming(3, 1024)
	_, err := l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 16, Files: []LowerFile{f}})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 128, 16, 128}, k.writes)
	for i := 0; i < 100; i++ {
		k.sleep(time.Millisecond)
	}
	assert.EqualValues(t, 4, k.files[3].size)
}

func TestLowerNeedsNoBreakBelowTheWindow(t *testing.T) {
	k, l := newKernel()
	f := k.streaming(3, 128)
	st, err := l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 1024, Files: []LowerFile{f}})
	require.NoError(t, err)
	assert.Equal(t, []int{1024, 128}, k.writes, "a raise is a plain raise-pin-restore")
	assert.Zero(t, st.Broken)
	assert.EqualValues(t, 256, k.files[3].raPages)

	k.writes = nil
	st, err = l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 256, Files: []LowerFile{f}})
	require.NoError(t, err)
	assert.Empty(t, k.writes, "twice the device's window is POSIX_FADV_SEQUENTIAL")
	assert.Zero(t, st.Broken)
}

// NoBreak (a random reader's descriptor just opened): set at once, however
// large its window state.
func TestLowerWithoutBreak(t *testing.T) {
	k, l := newKernel()
	k.rate = 0
	f := k.streaming(3, 1024)
	st, err := l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 16, Files: []LowerFile{f}, NoBreak: true})
	require.NoError(t, err)
	assert.Equal(t, []int{16, 128}, k.writes, "a plain raise-pin-restore, no break through 0")
	assert.Zero(t, st.Broken)
	assert.Zero(t, st.Hold)
	assert.EqualValues(t, 4, k.files[3].raPages)
}

// A reader that pauses through the break is restarted where it stands:
// its window ahead dropped, a page read at its position, and its kernel
// window is the wanted one before it reads again.
func TestLowerRestartsAnIdleReader(t *testing.T) {
	for _, folio := range []uint64{1, 16} {
		k, l := newKernel()
		k.rate = 0
		f := k.streaming(3, 1024)
		kf := k.files[3]
		kf.folio = folio
		kf.pos = kf.start - 8 // in the middle of a 16-page folio of its previous window
		st, err := l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 128, Files: []LowerFile{f}})
		require.NoError(t, err)
		assert.Equal(t, 1, st.Rearmed, "folio %d", folio)
		assert.Zero(t, st.Unconfirmed)
		assert.Equal(t, l.IdleHold, st.Hold, "a reader that does not move ends its break after IdleHold")
		assert.EqualValues(t, 32, kf.raPages)
		assert.LessOrEqual(t, kf.size, uint32(32), "the kernel window is the device's before the reader reads again")
		assert.EqualValues(t, (8+256)*4096, st.Reread, "what is read again: the rest of its window and the next one")
		k.rate = 16
		for i := 0; i < 100; i++ {
			k.sleep(time.Millisecond)
		}
		assert.EqualValues(t, 32, kf.size, "the resumed stream runs on the device's window")
	}
}

// A reader whose window ahead cannot be dropped (mapped) is reported.
func TestLowerReportsAnIdleReaderItCannotRestart(t *testing.T) {
	k, l := newKernel()
	k.rate = 0
	f := k.streaming(3, 1024)
	k.files[3].mapped = true
	st, err := l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 128, Files: []LowerFile{f}})
	require.NoError(t, err)
	assert.Zero(t, st.Rearmed)
	assert.Equal(t, 1, st.Unconfirmed)
	require.Len(t, st.Left, 1)
	assert.Equal(t, f.Ref, st.Left[0].Ref)
	assert.EqualValues(t, 256, st.Left[0].RA.Size)
	assert.EqualValues(t, 32, k.files[3].raPages, "never left at 0")
}

// A reader that closed its file (or exited) during the break will never
// read past its window: the break ends at the first check, not after
// IdleHold, since it holds the tuner's lock meanwhile.
func TestLowerEndsTheBreakOfAReaderThatClosedItsFile(t *testing.T) {
	k, l := newKernel()
	k.rate = 0
	f := k.streaming(3, 1024)
	g := k.streaming(4, 1024) // idle, still open
	k.closed = map[FileRef]bool{f.Ref: true}
	st, err := l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 128, Files: []LowerFile{f, g}})
	require.NoError(t, err)
	assert.Equal(t, 1, st.Released)
	assert.Equal(t, 1, st.Rearmed, "the reader that still holds its file waits IdleHold")
	assert.EqualValues(t, 32, k.files[3].raPages)
	assert.EqualValues(t, 32, k.files[4].raPages)

	k.files = map[int]*kfile{}
	f = k.streaming(3, 1024)
	k.closed = map[FileRef]bool{f.Ref: true}
	st, err = l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 128, Files: []LowerFile{f}})
	require.NoError(t, err)
	assert.Equal(t, 1, st.Released)
	assert.LessOrEqual(t, st.Hold, readerCheckAfter+2*l.Poll, "ended at the first check")
}

// Holds tells a descriptor still open on its file from a closed one.
func TestProcFileOpsHolds(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	require.NoError(t, err)
	var fst unix.Stat_t
	require.NoError(t, unix.Fstat(int(f.Fd()), &fst))
	key := probe.FileKey{Dev: probe.DevFromUnix(fst.Dev), Ino: fst.Ino}
	ops := NewProcFileOps()
	ref := FileRef{Tgid: uint32(os.Getpid()), FD: int(f.Fd()), Key: key}
	assert.True(t, ops.Holds(ref))
	assert.False(t, ops.Holds(FileRef{Tgid: ref.Tgid, FD: ref.FD, Key: probe.FileKey{Dev: key.Dev, Ino: key.Ino + 1}}), "another file")
	require.NoError(t, f.Close())
	assert.False(t, ops.Holds(ref), "closed")
	assert.False(t, ops.Holds(FileRef{Tgid: 1 << 30, FD: 3, Key: key}), "no such process")
}

func TestLowerResetsFilesOpenedDuringTheBreak(t *testing.T) {
	k, l := newKernel()
	f := k.streaming(3, 1024)
	// An unrelated file already at 1024 KB (an earlier pin) is left alone.
	k.others = []OpenFile{{Ref: FileRef{Tgid: 200, FD: 9}, RA: RAState{ID: 1, RAPages: 256}}}
	k.onSet = func(kb int) {
		if kb != 128 {
			// A process opens a file while the device holds kb.
			k.others = append(k.others, OpenFile{Ref: FileRef{Tgid: 300, FD: len(k.others)}, RA: RAState{ID: uint64(10 + len(k.others)), RAPages: uint32(kb / 4)}})
		}
	}
	st, err := l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 1024, Files: []LowerFile{k.streaming(4, 128)}})
	require.NoError(t, err)
	assert.Equal(t, 1, st.Strays)
	st, err = l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 128, Files: []LowerFile{f}})
	require.NoError(t, err)
	assert.Equal(t, 1, st.Strays)
	assert.EqualValues(t, 256, k.others[0].RA.RAPages)
	for _, o := range k.others[1:] {
		assert.EqualValues(t, 32, o.RA.RAPages, "file opened while the device held another value: %+v", o.Ref)
	}
}

func TestLowerWithoutStatesHoldsAFixedBreak(t *testing.T) {
	k, l := newKernel()
	l.States = nil
	l.Hold = 40 * time.Millisecond
	f := k.streaming(3, 1024)
	st, err := l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 128, Files: []LowerFile{f}})
	require.NoError(t, err)
	assert.Equal(t, 40*time.Millisecond, st.Hold)
	assert.Equal(t, 1, st.Unconfirmed, "without the kernel's state nothing is confirmed")
	for i := 0; i < 100; i++ {
		k.sleep(time.Millisecond)
	}
	assert.EqualValues(t, 32, k.files[3].size)
}

func TestLowerWaitsForASlowReader(t *testing.T) {
	k, l := newKernel()
	k.rate = 1 // 4 MB/s
	f := k.streaming(3, 1024)
	st, err := l.Lower(LowerReq{Device: "sdb", DeviceKB: 128, KB: 128, Files: []LowerFile{f}})
	require.NoError(t, err)
	assert.Zero(t, st.Unconfirmed)
	assert.Greater(t, st.Hold, 250*time.Millisecond, "a slow reader takes longer to get past its window")
	for i := 0; i < 1000; i++ {
		k.sleep(time.Millisecond)
	}
	assert.EqualValues(t, 32, k.files[3].size)
}
