package log

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sort"
)

// Index files (.index and .timeindex) are derived data, rebuilt from the .log
// whenever they disagree with it. Both share one header:
//
//	 0  magic        "SYNX"
//	 4  version      uint8 (1)
//	 5  kind         uint8 (1 = offset index, 2 = time index)
//	 6  flags        uint8   bit 0: segment written by the cleaner (offset gaps allowed)
//	 7  reserved     uint8
//	 8  baseOffset   int64   segment base offset
//	16  logSize      int64   size of the .log the index was built for
//	24  nextOffset   int64   offset after the segment's last batch
//	32  maxTimestamp int64   greatest batch maxTimestamp in the segment (-1 none)
//	40  count        uint32  number of entries
//	44  crc          uint32  CRC-32C of header bytes 0..43 and all entries
//	48  entries
//
// Offset index entry (8 bytes): relOffset uint32 | position uint32. One entry
// for the first batch that starts after indexInterval bytes since the last
// entry. relOffset is the batch's base offset minus the segment base.
// Time index entry (12 bytes): maxTimestamp int64 | relOffset uint32; an entry
// is added with each offset-index entry whose batch raised the segment's
// maximum timestamp.
const (
	indexMagic       = "SYNX"
	indexVersion     = 1
	indexKindOffset  = 1
	indexKindTime    = 2
	indexHeaderSize  = 48
	offsetEntrySize  = 8
	timeEntrySize    = 12
	maxIndexFileSize = 64 << 20 // an index larger than this is not ours
)

type offsetEntry struct {
	rel uint32
	pos uint32
}

type timeEntry struct {
	ts  int64
	rel uint32
}

// segmentIndex is the in-memory sparse index of one segment.
type segmentIndex struct {
	offsets []offsetEntry
	times   []timeEntry
}

// lookup returns the position of the last indexed batch whose base offset is
// <= off (0 if none): scanning from there finds the batch containing off.
func (ix *segmentIndex) lookup(base, off int64) int64 {
	rel := off - base
	i := sort.Search(len(ix.offsets), func(i int) bool { return int64(ix.offsets[i].rel) > rel })
	if i == 0 {
		return 0
	}
	return int64(ix.offsets[i-1].pos)
}

// lookupPos returns the greatest indexed batch start <= pos and that batch's
// relative offset (0, 0 if none).
func (ix *segmentIndex) lookupPos(pos int64) (int64, uint32) {
	i := sort.Search(len(ix.offsets), func(i int) bool { return int64(ix.offsets[i].pos) > pos })
	if i == 0 {
		return 0, 0
	}
	return int64(ix.offsets[i-1].pos), ix.offsets[i-1].rel
}

// lookupTime returns the position to start scanning for the first batch whose
// max timestamp is >= ts: the entry before the first time entry reaching ts.
func (ix *segmentIndex) lookupTime(base, ts int64) int64 {
	i := sort.Search(len(ix.times), func(i int) bool { return ix.times[i].ts >= ts })
	if i == 0 {
		return 0
	}
	return ix.lookup(base, base+int64(ix.times[i-1].rel))
}

// indexMeta is what an index header records about its segment.
type indexMeta struct {
	base, logSize, next, maxTs int64
	flags                      byte
}

// indexFlagCleaned marks the indexes of a segment the cleaner wrote.
const indexFlagCleaned = 1

func encodeIndex(kind byte, m indexMeta, ix *segmentIndex) []byte {
	var n int
	if kind == indexKindOffset {
		n = len(ix.offsets)
	} else {
		n = len(ix.times)
	}
	size := offsetEntrySize
	if kind == indexKindTime {
		size = timeEntrySize
	}
	b := make([]byte, indexHeaderSize, indexHeaderSize+n*size)
	be := binary.BigEndian
	copy(b, indexMagic)
	b[4], b[5], b[6] = indexVersion, kind, m.flags
	be.PutUint64(b[8:], uint64(m.base))
	be.PutUint64(b[16:], uint64(m.logSize))
	be.PutUint64(b[24:], uint64(m.next))
	be.PutUint64(b[32:], uint64(m.maxTs))
	be.PutUint32(b[40:], uint32(n))
	if kind == indexKindOffset {
		for _, e := range ix.offsets {
			b = be.AppendUint32(b, e.rel)
			b = be.AppendUint32(b, e.pos)
		}
	} else {
		for _, e := range ix.times {
			b = be.AppendUint64(b, uint64(e.ts))
			b = be.AppendUint32(b, e.rel)
		}
	}
	crc := crc32.Update(crc32.Checksum(b[:44], castagnoli), castagnoli, b[indexHeaderSize:])
	be.PutUint32(b[44:], crc)
	return b
}

var errBadIndex = errors.New("index does not match")

// decodeIndex parses an index file. It checks magic, version, kind, base
// offset and CRC, and that entries are increasing and inside logSize; the
// caller compares logSize with the real .log size.
func decodeIndex(b []byte, kind byte, base int64) (indexMeta, *segmentIndex, error) {
	var m indexMeta
	if len(b) < indexHeaderSize || string(b[:4]) != indexMagic || b[4] != indexVersion || b[5] != kind {
		return m, nil, fmt.Errorf("%w: bad header", errBadIndex)
	}
	be := binary.BigEndian
	m.flags = b[6]
	m.base = int64(be.Uint64(b[8:]))
	m.logSize = int64(be.Uint64(b[16:]))
	m.next = int64(be.Uint64(b[24:]))
	m.maxTs = int64(be.Uint64(b[32:]))
	n := int(be.Uint32(b[40:]))
	size := offsetEntrySize
	if kind == indexKindTime {
		size = timeEntrySize
	}
	if m.base != base || m.next < base || m.logSize < 0 || m.logSize > maxBatchSize*2 || len(b) != indexHeaderSize+n*size {
		return m, nil, fmt.Errorf("%w: header fields", errBadIndex)
	}
	crc := crc32.Update(crc32.Checksum(b[:44], castagnoli), castagnoli, b[indexHeaderSize:])
	if crc != be.Uint32(b[44:]) {
		return m, nil, fmt.Errorf("%w: crc", errBadIndex)
	}
	ix := &segmentIndex{}
	e := b[indexHeaderSize:]
	if kind == indexKindOffset {
		ix.offsets = make([]offsetEntry, n)
		for i := range ix.offsets {
			oe := offsetEntry{rel: be.Uint32(e[i*8:]), pos: be.Uint32(e[i*8+4:])}
			if int64(oe.pos) >= m.logSize || int64(oe.rel) >= m.next-base ||
				(i > 0 && (oe.rel <= ix.offsets[i-1].rel || oe.pos <= ix.offsets[i-1].pos)) {
				return m, nil, fmt.Errorf("%w: entry %d", errBadIndex, i)
			}
			ix.offsets[i] = oe
		}
	} else {
		ix.times = make([]timeEntry, n)
		for i := range ix.times {
			te := timeEntry{ts: int64(be.Uint64(e[i*12:])), rel: be.Uint32(e[i*12+8:])}
			if int64(te.rel) >= m.next-base || (i > 0 && (te.ts <= ix.times[i-1].ts || te.rel <= ix.times[i-1].rel)) {
				return m, nil, fmt.Errorf("%w: entry %d", errBadIndex, i)
			}
			ix.times[i] = te
		}
	}
	return m, ix, nil
}

// readIndexFile reads a whole index file, refusing anything implausibly big.
func readIndexFile(fs FS, name string) ([]byte, error) {
	f, err := fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	if size > maxIndexFileSize {
		return nil, fmt.Errorf("%w: %d bytes", errBadIndex, size)
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && !(errors.Is(err, io.EOF) && size == 0) {
		return nil, err
	}
	return b, nil
}

// TimeIndexLookup returns the position in a segment's .log from which to
// scan for the first batch whose max timestamp is >= ts, using the bytes of
// that segment's .timeindex and .index files (as uploaded to object
// storage). Indexes that do not decode give position 0: always correct,
// only slower.
func TimeIndexLookup(timeIndexFile, indexFile []byte, base, ts int64) int64 {
	_, tix, err := decodeIndex(timeIndexFile, indexKindTime, base)
	if err != nil {
		return 0
	}
	_, oix, err := decodeIndex(indexFile, indexKindOffset, base)
	if err != nil {
		return 0
	}
	return (&segmentIndex{offsets: oix.offsets, times: tix.times}).lookupTime(base, ts)
}

// IndexLookup returns the position in a segment's .log from which to scan
// for offset, using the bytes of that segment's .index file (as uploaded to
// object storage). An index that does not decode gives position 0: always
// correct, only slower.
func IndexLookup(indexFile []byte, base, offset int64) int64 {
	_, ix, err := decodeIndex(indexFile, indexKindOffset, base)
	if err != nil {
		return 0
	}
	return ix.lookup(base, offset)
}
