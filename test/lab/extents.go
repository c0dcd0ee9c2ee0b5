package lab

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Extent is one FIEMAP extent: Length bytes of a file at Logical, stored at
// device byte Physical (the loop device maps 1:1 onto the labfs image).
type Extent struct {
	Logical, Physical, Length uint64
	Flags                     uint32
}

const (
	fsIocFiemap     = 0xC020660B
	fiemapFlagSync  = 0x1
	fiemapExtentLst = 0x1 // FIEMAP_EXTENT_LAST
	fiemapBatch     = 256
)

type fiemapHdr struct {
	Start, Length                                 uint64
	Flags, MappedExtents, ExtentCount, Reserved32 uint32
}

type fiemapExtent struct {
	Logical, Physical, Length uint64
	Reserved64                [2]uint64
	Flags                     uint32
	Reserved                  [3]uint32
}

// Extents maps a file to its physical extents with FIEMAP. It syncs the file
// first (FIEMAP_FLAG_SYNC): with ext4's delayed allocation a freshly written
// file has no physical blocks yet.
func Extents(path string) ([]Extent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	hdrSize := int(unsafe.Sizeof(fiemapHdr{}))
	extSize := int(unsafe.Sizeof(fiemapExtent{}))
	buf := make([]byte, hdrSize+fiemapBatch*extSize)
	var out []Extent
	var start uint64
	for {
		for i := range buf {
			buf[i] = 0
		}
		h := (*fiemapHdr)(unsafe.Pointer(&buf[0]))
		h.Start, h.Length, h.Flags, h.ExtentCount = start, ^uint64(0)-start, fiemapFlagSync, fiemapBatch
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			return nil, fmt.Errorf("FIEMAP %s: %w", path, errno)
		}
		n := int(h.MappedExtents)
		if n == 0 {
			return out, nil
		}
		last := false
		for i := 0; i < n; i++ {
			e := (*fiemapExtent)(unsafe.Pointer(&buf[hdrSize+i*extSize]))
			out = append(out, Extent{Logical: e.Logical, Physical: e.Physical, Length: e.Length, Flags: e.Flags})
			start = e.Logical + e.Length
			last = last || e.Flags&fiemapExtentLst != 0
		}
		if last || n < fiemapBatch {
			return out, nil
		}
	}
}
