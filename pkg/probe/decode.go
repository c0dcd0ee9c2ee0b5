package probe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Ring record layout (bpf/probe.bpf.c struct rec and struct ra_event).
const (
	eventRead      = 1
	eventReadahead = 2
	recSize        = 64
	raEventSize    = 72
)

var errShort = errors.New("short ring record")

// decodeRecord decodes a struct rec.
func decodeRecord(b []byte) (Record, error) {
	if len(b) < recSize || b[0] != eventRead {
		return Record{}, fmt.Errorf("decode read record (%d bytes, type %d): %w", len(b), first(b), errShort)
	}
	le := binary.LittleEndian
	r := Record{
		Kind:      Kind(b[1]),
		Error:     b[2] != 0,
		Samplable: b[3] != 0,
		Device:    Dev(le.Uint32(b[4:])),
		Sector:    le.Uint64(b[8:]),
		Bytes:     le.Uint32(b[16:]),
		Depth:     le.Uint32(b[20:]),
		Issue:     time.Duration(le.Uint64(b[24:])),
		Latency:   time.Duration(le.Uint64(b[32:])),
		Weight:    max(le.Uint32(b[44:]), 1),
	}
	if r.Kind > KindDirect {
		return Record{}, fmt.Errorf("decode read record: kind %d out of range", b[1])
	}
	if r.Kind == KindFile {
		r.File = FileKey{Dev: Dev(le.Uint32(b[40:])), Ino: le.Uint64(b[48:])}
		r.Offset = le.Uint64(b[56:])
	}
	return r, nil
}

// decodeReadahead decodes a struct ra_event.
func decodeReadahead(b []byte) (ReadaheadEvent, error) {
	if len(b) < raEventSize || b[0] != eventReadahead {
		return ReadaheadEvent{}, fmt.Errorf("decode readahead event (%d bytes, type %d): %w", len(b), first(b), errShort)
	}
	le := binary.LittleEndian
	comm := b[56:72]
	if i := bytes.IndexByte(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	return ReadaheadEvent{
		Async:      b[1] != 0,
		ReadAround: b[2] != 0,
		Tgid:       le.Uint32(b[4:]),
		Device:     Dev(le.Uint32(b[8:])),
		File:       FileKey{Dev: Dev(le.Uint32(b[12:])), Ino: le.Uint64(b[16:])},
		Index:      le.Uint64(b[24:]),
		Time:       time.Duration(le.Uint64(b[32:])),
		ReqCount:   le.Uint32(b[40:]),
		Size:       le.Uint32(b[44:]),
		AsyncSize:  le.Uint32(b[48:]),
		RaPages:    le.Uint32(b[52:]),
		Comm:       string(comm),
	}, nil
}

func first(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	return int(b[0])
}

// dispatch decodes one ring sample and hands it to h.
func dispatch(b []byte, h Handler) error {
	if len(b) == 0 {
		return errShort
	}
	switch b[0] {
	case eventRead:
		r, err := decodeRecord(b)
		if err != nil {
			return err
		}
		h.HandleRecord(r)
	case eventReadahead:
		e, err := decodeReadahead(b)
		if err != nil {
			return err
		}
		h.HandleReadahead(e)
	default:
		return fmt.Errorf("ring record of unknown type %d", b[0])
	}
	return nil
}
