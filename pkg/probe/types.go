package probe

import (
	"fmt"
	"time"
)

// Dev is a device number in the kernel's internal dev_t encoding
// (major<<20 | minor), the form block tracepoints and struct super_block use.
type Dev uint32

const minorBits = 20

// MkDev builds a Dev from a major and minor number.
func MkDev(major, minor uint32) Dev { return Dev(major<<minorBits | minor&(1<<minorBits-1)) }

// Major returns the major number.
func (d Dev) Major() uint32 { return uint32(d) >> minorBits }

// Minor returns the minor number.
func (d Dev) Minor() uint32 { return uint32(d) & (1<<minorBits - 1) }

// String formats the device as "major:minor", as /sys/block/*/dev does.
func (d Dev) String() string { return fmt.Sprintf("%d:%d", d.Major(), d.Minor()) }

// DevFromUnix converts a user-space device number (stat's st_dev, glibc's
// encoding) to the kernel's internal encoding.
func DevFromUnix(dev uint64) Dev {
	major := uint32((dev>>8)&0xfff) | uint32((dev>>32)&^0xfff)
	minor := uint32(dev&0xff) | uint32((dev>>12)&^0xff)
	return MkDev(major, minor)
}

// FileKey identifies a file by its filesystem's device (super_block s_dev)
// and its inode number.
type FileKey struct {
	Dev Dev
	Ino uint64
}

// String formats the key as "major:minor/inode".
func (k FileKey) String() string { return fmt.Sprintf("%s/%d", k.Dev, k.Ino) }

// IsZero reports whether k names no file.
func (k FileKey) IsZero() bool { return k.Dev == 0 && k.Ino == 0 }

// Kind tells what a read request was attributed to.
type Kind uint8

const (
	// KindFile: page-cache read of a regular file; Record.File is set.
	KindFile Kind = iota
	// KindAnon: the first page is anonymous (swap-in and the like).
	KindAnon
	// KindMeta: filesystem metadata, read through the block device's own inode.
	KindMeta
	// KindUnknown: no page to attribute (passthrough, or a bio the probe
	// could not walk).
	KindUnknown
	// KindDirect: direct I/O into the reader's own memory (the bio's pages
	// pinned for it, BIO_PAGE_PINNED: Linux 6.5 and later); no file named.
	// On older kernels such reads are KindAnon (an anonymous buffer) or
	// KindFile (a buffer mapped from a file: that file is named).
	KindDirect
)

func (k Kind) String() string {
	switch k {
	case KindFile:
		return "file"
	case KindAnon:
		return "anon"
	case KindMeta:
		return "meta"
	case KindDirect:
		return "direct"
	default:
		return "unknown"
	}
}

// Record is one completed block read request. Times are CLOCK_MONOTONIC,
// the clock of bpf_ktime_get_ns (see pkg/clock).
type Record struct {
	Device  Dev           // whole disk the request was issued to
	Sector  uint64        // first sector (512 bytes)
	Bytes   uint32        // request size
	Issue   time.Duration // when the driver got the request (allocation on queues without statistics: DeviceStats.AllocTimed)
	Latency time.Duration // issue to completion
	// Depth is the read requests in flight on the request's block device
	// at its completion, this one included: the kernel's own count (from
	// a request's start of accounting to its end, so requests waiting in
	// the I/O scheduler count too). Over a steady stream it has the same
	// distribution as the depth seen at issue. 0 when the kernel keeps no
	// such count: kernels that counted a request-based disk's requests in
	// flight by walking its tags (before about 6.16) leave these per-CPU
	// counters at zero, and a queue with iostats off counts nothing.
	Depth  uint32
	Kind   Kind
	File   FileKey // set when Kind == KindFile
	Offset uint64  // byte offset in File of the first page, when Kind == KindFile
	Error  bool    // the request completed with an error
	// Weight is how many requests of Device this record stands for: the
	// sampling period N when the disk is above Config.SampleBudget and the
	// request is samplable (Samplable), 1 otherwise. Records of one disk may so
	// carry different weights: counts and sums over them take each record
	// Weight times. 0 (a Record built by hand) means 1.
	Weight uint32
	// Samplable: the request was numbered among those streamed 1 in N:
	// smaller than SampleBelow, or no readahead for a file (direct I/O,
	// metadata, a folio read on its own). A file's readahead requests of
	// SampleBelow or more are always streamed. Records built by hand
	// (false) are taken as samplable when smaller than SampleBelow or not
	// KindFile.
	Samplable bool
}

// Complete returns the completion time.
func (r Record) Complete() time.Duration { return r.Issue + r.Latency }

// W returns the record's weight, 1 when Weight is unset.
func (r Record) W() uint64 {
	if r.Weight == 0 {
		return 1
	}
	return uint64(r.Weight)
}

// ReadaheadEvent says that the kernel ran readahead for File on behalf of
// process Tgid: the reader of a file, found without looking at file
// positions (sendfile at explicit offsets leaves those at zero). Page
// counts are in pages of PageSize bytes; the window fields are the open
// file's file_ra_state when readahead was entered.
type ReadaheadEvent struct {
	Time      time.Duration
	Tgid      uint32
	Comm      string
	Device    Dev // whole disk holding File's filesystem (0 if none)
	File      FileKey
	Index     uint64 // page index where readahead was triggered
	ReqCount  uint32 // pages the reader asked for
	Size      uint32 // current window
	AsyncSize uint32
	RaPages   uint32 // the open file's maximum window (from read_ahead_kb at open or fadvise)
	Async     bool   // page_cache_async_ra (a hit on the marked page) rather than sync
	// ReadAround: an mmap fault read around its page with this window, on
	// a file WatchReadAround named, by an open file whose window (RaPages)
	// is above the one asked for. Not a stream's readahead: Index is the
	// first page read around, ReqCount 0.
	ReadAround bool
}

// PageSize is the page size the readahead tracepoints count in.
const PageSize = 4096
