package probe

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The hand-written decoder must agree with the layout bpf2go generated
// from the C structs.
func TestDecodeRecordMatchesBPFLayout(t *testing.T) {
	in := probeRec{Type: eventRead, Kind: uint8(KindFile), Error: 1, Samplable: 1, Dev: uint32(MkDev(7, 3)),
		Sector: 123456, Bytes: 131072, Depth: 4, IssueNs: 5e9, LatencyNs: 1500000,
		FileDev: uint32(MkDev(7, 3)), Ino: 12, Offset: 1 << 30, Weight: 16}
	var buf bytes.Buffer
	require.NoError(t, binary.Write(&buf, binary.LittleEndian, in))
	require.Equal(t, recSize, buf.Len())
	r, err := decodeRecord(buf.Bytes())
	require.NoError(t, err)
	assert.Equal(t, Record{Device: MkDev(7, 3), Sector: 123456, Bytes: 131072, Issue: 5 * time.Second,
		Latency: 1500 * time.Microsecond, Depth: 4, Kind: KindFile, File: FileKey{MkDev(7, 3), 12},
		Offset: 1 << 30, Error: true, Weight: 16, Samplable: true}, r)

	// Non-file kinds carry no file even if the words are set.
	in.Kind = uint8(KindMeta)
	buf.Reset()
	require.NoError(t, binary.Write(&buf, binary.LittleEndian, in))
	r, err = decodeRecord(buf.Bytes())
	require.NoError(t, err)
	assert.True(t, r.File.IsZero())
	assert.Equal(t, KindMeta, r.Kind)

	in.Kind = uint8(KindDirect)
	buf.Reset()
	require.NoError(t, binary.Write(&buf, binary.LittleEndian, in))
	r, err = decodeRecord(buf.Bytes())
	require.NoError(t, err)
	assert.True(t, r.File.IsZero())
	assert.Equal(t, KindDirect, r.Kind)
	assert.Equal(t, "direct", r.Kind.String())

	_, err = decodeRecord(buf.Bytes()[:10])
	assert.ErrorIs(t, err, errShort)
	bad := append([]byte(nil), buf.Bytes()...)
	bad[1] = 9
	_, err = decodeRecord(bad)
	assert.Error(t, err)
}

func TestDecodeReadaheadMatchesBPFLayout(t *testing.T) {
	in := probeRaEvent{Type: eventReadahead, Async: 1, Tgid: 4242, Dev: uint32(MkDev(8, 0)),
		FileDev: uint32(MkDev(8, 1)), Ino: 99, Index: 256, TimeNs: 7e9, ReqCount: 32,
		Size: 64, AsyncSize: 32, RaPages: 512}
	copy(in.Comm[:], []int8{'j', 'a', 'v', 'a'})
	var buf bytes.Buffer
	require.NoError(t, binary.Write(&buf, binary.LittleEndian, in))
	require.Equal(t, raEventSize, buf.Len())
	e, err := decodeReadahead(buf.Bytes())
	require.NoError(t, err)
	assert.Equal(t, ReadaheadEvent{Time: 7 * time.Second, Tgid: 4242, Comm: "java", Device: MkDev(8, 0),
		File: FileKey{MkDev(8, 1), 99}, Index: 256, ReqCount: 32, Size: 64, AsyncSize: 32,
		RaPages: 512, Async: true}, e)

	var got []any
	h := HandlerFuncs{Record: func(r Record) { got = append(got, r) }, Readahead: func(e ReadaheadEvent) { got = append(got, e) }}
	require.NoError(t, dispatch(buf.Bytes(), h))
	require.Len(t, got, 1)
	assert.Error(t, dispatch([]byte{77, 0, 0}, h))
	assert.Error(t, dispatch(nil, h))
}

func TestHistBuckets(t *testing.T) {
	assert.Equal(t, 0, HistBucket(0))
	assert.Equal(t, 0, HistBucket(999*time.Nanosecond))
	assert.Equal(t, 0, HistBucket(time.Microsecond))
	assert.Equal(t, 1, HistBucket(2*time.Microsecond))
	assert.Equal(t, 1, HistBucket(3*time.Microsecond))
	assert.Equal(t, 10, HistBucket(1500*time.Microsecond)) // 1500 us in [1024, 2048)
	assert.Equal(t, HistBuckets-1, HistBucket(time.Hour))
	assert.Equal(t, 2*time.Microsecond, HistUpperBound(0))
	assert.Equal(t, 2048*time.Microsecond, HistUpperBound(10))
	// Every latency is below its bucket's upper bound and at or above the previous one.
	for _, d := range []time.Duration{0, 1500, 2 * time.Microsecond, 3 * time.Millisecond, 5 * time.Second} {
		b := HistBucket(d)
		assert.Less(t, d, HistUpperBound(b))
		if b > 0 {
			assert.GreaterOrEqual(t, d, HistUpperBound(b-1))
		}
	}
}

func TestAggregatorAndTopFiles(t *testing.T) {
	d := MkDev(7, 0)
	a, b, c := FileKey{d, 11}, FileKey{d, 12}, FileKey{d, 13}
	var agg Aggregator
	for _, r := range []Record{
		{Device: d, Bytes: 4096, Latency: time.Millisecond, Depth: 1, Kind: KindFile, File: a, Issue: time.Second},
		{Device: d, Bytes: 8192, Latency: 3 * time.Millisecond, Depth: 3, Kind: KindFile, File: a, Issue: 2 * time.Second},
		{Device: d, Bytes: 65536, Latency: time.Millisecond, Depth: 2, Kind: KindFile, File: b},
		{Device: d, Bytes: 4096, Latency: time.Millisecond, Depth: 2, Kind: KindFile, File: c},
		{Device: d, Bytes: 4096, Latency: 10 * time.Microsecond, Depth: 1, Kind: KindMeta, Error: true},
	} {
		agg.Add(r)
	}
	s := agg.Stats()
	ds := s.Devices[d]
	assert.Equal(t, uint64(5), ds.Requests)
	assert.Equal(t, uint64(4096*3+8192+65536), ds.Bytes)
	assert.Equal(t, uint64(1), ds.Errors)
	assert.Equal(t, uint64(3), ds.Hist[HistBucket(time.Millisecond)])
	assert.Len(t, s.Files, 3, "metadata is not a file")
	fa := s.Files[a]
	assert.Equal(t, uint64(2), fa.Requests)
	assert.Equal(t, uint64(12288), fa.Bytes)
	assert.Equal(t, 4*time.Millisecond, fa.LatencySum)
	assert.Equal(t, uint64(4), fa.DepthSum)
	assert.Equal(t, 2*time.Second+3*time.Millisecond, fa.Last)

	top := s.TopFiles(2)
	require.Len(t, top, 2)
	assert.Equal(t, b, top[0].File)
	assert.Equal(t, a, top[1].File)
	all := s.TopFiles(0)
	require.Len(t, all, 3)
	assert.Equal(t, c, all[2].File)
	// Ties by bytes break by key, so the order is stable.
	s.Files[c] = FileStats{File: c, Bytes: fa.Bytes}
	all = s.TopFiles(0)
	assert.Equal(t, []FileKey{b, a, c}, []FileKey{all[0].File, all[1].File, all[2].File})
}

func TestReplaySource(t *testing.T) {
	d := MkDev(8, 0)
	rp := NewReplay(Record{Device: d, Bytes: 4096, Kind: KindFile, File: FileKey{d, 5}})
	rp.Events = append(rp.Events, Event{Readahead: &ReadaheadEvent{Tgid: 7, File: FileKey{d, 5}}})
	var recs, ras int
	var src Source = rp
	require.NoError(t, src.Run(context.Background(), HandlerFuncs{
		Record: func(Record) { recs++ }, Readahead: func(ReadaheadEvent) { ras++ }}))
	assert.Equal(t, 1, recs)
	assert.Equal(t, 1, ras)
	s, err := src.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(4096), s.Files[FileKey{d, 5}].Bytes)

	// Hold: blocks until the context ends, like a live probe.
	rp.Hold = true
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.NoError(t, rp.Run(ctx, HandlerFuncs{}))
	require.NoError(t, rp.Close())
	assert.ErrorIs(t, rp.Run(context.Background(), HandlerFuncs{}), ErrClosed)
}

func TestConfigValidation(t *testing.T) {
	_, err := Config{RingBytes: 1000}.withDefaults()
	assert.ErrorContains(t, err, "power of two")
	_, err = Config{Devices: make([]Dev, MaxDevices+1)}.withDefaults()
	assert.ErrorContains(t, err, "at most")
	c, err := Config{}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, 4<<20, c.RingBytes)
	assert.Equal(t, 100*time.Millisecond, c.Poll)
	assert.Positive(t, c.FileEntries)
	assert.Equal(t, 16384, defaultFileEntries(2))
	assert.Equal(t, 8192, defaultFileEntries(64)) // 8192 x 64 x 48 B = 24 MiB
	assert.Equal(t, 1024, defaultFileEntries(4096))
	assert.Equal(t, fileStatsBytes, binary.Size(probeFileStats{}))
}

func TestClassifyErrors(t *testing.T) {
	assert.ErrorIs(t, classify("load", fmt.Errorf("x: %w", unix.EPERM)), ErrPermission)
	assert.ErrorIs(t, classify("attach", fmt.Errorf("x: %w", os.ErrNotExist)), ErrTracepointMissing)
	assert.ErrorContains(t, classify("load", fmt.Errorf("find target for block_rq_issue")), "lacks a tracepoint")
	other := classify("load", fmt.Errorf("boom"))
	assert.NotErrorIs(t, other, ErrPermission)
	assert.ErrorContains(t, other, "load: boom")
}

// fakeProc builds a procfs-like tree: /PID/fd/N symlinks to real files and
// self/mountinfo.
func fakeProc(t *testing.T, mountinfo string) string {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "self"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "self", "mountinfo"), []byte(mountinfo), 0o644))
	return root
}

func keyOf(t *testing.T, p string) FileKey {
	var st unix.Stat_t
	require.NoError(t, unix.Stat(p, &st))
	return FileKey{Dev: DevFromUnix(st.Dev), Ino: st.Ino}
}

func TestResolverFallbacks(t *testing.T) {
	data := t.TempDir()
	target := filepath.Join(data, "blk_1073741825")
	other := filepath.Join(data, "other")
	require.NoError(t, os.WriteFile(target, []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(other, []byte("y"), 0o644))
	k := keyOf(t, target)

	mountinfo := fmt.Sprintf("22 1 %d:%d / /data rw,relatime - ext4 /dev/sdb1 rw\n"+
		"23 1 8:1 / /with\\040space rw - ext4 /dev/sda1 rw\n"+
		"garbage line\n", k.Dev.Major(), k.Dev.Minor())
	proc := fakeProc(t, mountinfo)
	fd := filepath.Join(proc, "4242", "fd")
	require.NoError(t, os.MkdirAll(fd, 0o755))
	require.NoError(t, os.Symlink(other, filepath.Join(fd, "3")))
	require.NoError(t, os.Symlink("socket:[1234]", filepath.Join(fd, "4")))
	require.NoError(t, os.Symlink(target, filepath.Join(fd, "5")))

	r := &Resolver{ProcRoot: proc}
	// No reader known yet: the mount point and inode.
	name, ok := r.Resolve(k)
	assert.False(t, ok)
	assert.Equal(t, fmt.Sprintf("/data (inode %d)", k.Ino), name)

	// A reader seen in a readahead event: its descriptors give the path.
	r.Observe(ReadaheadEvent{Tgid: 4242, File: k})
	name, ok = r.Resolve(k)
	assert.True(t, ok)
	assert.Equal(t, target, name)

	// Cached while the path still names the file, even after the reader
	// closed it.
	require.NoError(t, os.RemoveAll(filepath.Join(proc, "4242")))
	name, ok = r.Resolve(k)
	assert.True(t, ok)
	assert.Equal(t, target, name)

	// Renamed away: the cache no longer matches, back to the mount point.
	require.NoError(t, os.Rename(target, target+".moved"))
	name, ok = r.Resolve(k)
	assert.False(t, ok)
	assert.Equal(t, fmt.Sprintf("/data (inode %d)", k.Ino), name)

	// Unknown filesystem: the bare key.
	unknown := FileKey{Dev: MkDev(250, 9), Ino: 77}
	name, ok = r.Resolve(unknown)
	assert.False(t, ok)
	assert.Equal(t, "250:9/77", name)

	// Escaped mount points are unescaped.
	name, _ = r.Resolve(FileKey{Dev: MkDev(8, 1), Ino: 5})
	assert.Equal(t, "/with space (inode 5)", name)

	// Readers are bounded per file.
	for i := range 10 {
		r.Observe(ReadaheadEvent{Tgid: uint32(100 + i), File: unknown})
	}
	assert.Len(t, r.readers[unknown], maxReadersPerFile)
	r.Forget(unknown)
	assert.Empty(t, r.readers[unknown])
}

// The resolver forgets old files rather than growing with every file a
// long-running DataNode ever reads.
func TestResolverIsBounded(t *testing.T) {
	r := &Resolver{ProcRoot: t.TempDir()}
	for i := 0; i < 3*maxResolverFiles; i++ {
		r.Observe(ReadaheadEvent{Tgid: 42, File: FileKey{Dev: MkDev(7, 0), Ino: uint64(i + 1)}})
	}
	r.mu.Lock()
	n := len(r.readers)
	r.mu.Unlock()
	assert.LessOrEqual(t, n, maxResolverFiles)
	// The newest file is still known.
	r.mu.Lock()
	_, ok := r.readers[FileKey{Dev: MkDev(7, 0), Ino: uint64(3 * maxResolverFiles)}]
	r.mu.Unlock()
	assert.True(t, ok)
}

func TestSamplePeriod(t *testing.T) {
	const budget = 10000
	for _, c := range []struct {
		rate float64
		cur  uint32
		want uint32
	}{
		{0, 1, 1},
		{budget, 1, 1},
		{budget + 1, 1, 2},
		{295000, 1, 32},  // 9219 a second attributed
		{295000, 64, 64}, // 9219 fits the budget but not 3/4 of it: 64 holds
		{200000, 32, 32}, // 6250 <= 7500: 32 is enough even with the margin
		{200000, 1, 32},
		{1e12, 1, maxSampleEvery},
		{7000, 4, 1}, // well under the budget: straight down
		{9000, 4, 2}, // under the budget, but not by the margin: one step
	} {
		assert.Equal(t, c.want, SamplePeriod(c.rate, budget, c.cur), "rate %.0f from %d", c.rate, c.cur)
	}
	assert.Equal(t, uint32(1), SamplePeriod(1e9, 0, 8), "no budget: no sampling")
}

// BIO_PAGE_PINNED is bit 0 of bio->bi_flags from Linux 6.5 on; before, bit
// 0 meant something else and the probe must not read it.
func TestBioPinnedMask(t *testing.T) {
	for rel, want := range map[string]uint16{
		"6.18.0-1-cloud-amd64": 1, "6.5.0": 1, "6.5": 1, "7.0.1": 1,
		"6.4.16": 0, "5.15.0-91-generic": 0, "4.19.0": 0, "": 0, "garbage": 0,
	} {
		assert.Equal(t, want, bioPinnedMask(rel), "release %q", rel)
	}
}

// Every request is either a file read of SampleBelow or more, streamed
// whole, or samplable and streamed 1 in N: the Aggregator (the kernel's
// totals rebuilt from records) counts the samplable ones with their
// weights and reports the period of the latest.
func TestAggregatorCountsSamplableRequests(t *testing.T) {
	d := MkDev(7, 1)
	file := FileKey{Dev: d, Ino: 5}
	var a Aggregator
	a.Add(Record{Device: d, Bytes: 128 << 10, Kind: KindFile, File: file, Weight: 1})
	a.Add(Record{Device: d, Bytes: 1 << 20, Kind: KindDirect, Weight: 8})
	a.Add(Record{Device: d, Bytes: 4096, Kind: KindFile, File: file, Weight: 8})
	a.Add(Record{Device: d, Bytes: 128 << 10, Kind: KindFile, File: file, Weight: 1})
	// A large file read that was no readahead: samplable as the probe says.
	a.Add(Record{Device: d, Bytes: 64 << 10, Kind: KindFile, File: file, Weight: 8, Samplable: true})
	ds := a.Stats().Devices[d]
	assert.Equal(t, uint64(2+8+8+8), ds.Requests)
	assert.Equal(t, uint64(2*128<<10+8<<20+8*4096+8*64<<10), ds.Bytes)
	assert.Equal(t, uint64(24), ds.Samplable)
	assert.Equal(t, uint64(5), ds.Sampled)
	assert.Equal(t, uint32(8), ds.SampleEvery, "the period of the latest samplable record")
	f := a.Stats().Files[file]
	assert.Equal(t, uint64(2+8+8), f.Requests)
	assert.Equal(t, uint64(2*128<<10+8*4096+8*64<<10), f.Bytes)
}
