package log

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// segment is one .log file and its derived indexes. The active (last)
// segment grows under Partition.mu; its size, next offset and max timestamp
// are published through atomics so readers never take the append lock.
type segment struct {
	base    int64
	logPath string

	size   atomic.Int64 // bytes of whole, written batches
	next   atomic.Int64 // offset after the last batch
	maxTs  atomic.Int64 // greatest batch maxTimestamp, -1 if none
	sealed atomic.Bool
	// cleaned: written by the log cleaner (cleaner.go), so offsets may have
	// gaps inside it and at its end; replaced: swapped out by the cleaner,
	// its path now names another file (never open it again).
	cleaned  atomic.Bool
	replaced atomic.Bool
	created  time.Time // when this process created or opened it (segment.ms)

	mu        sync.RWMutex
	idx       *segmentIndex // nil until loaded (sealed segments load lazily)
	lastTime  int64         // ts of the last time index entry (active only)
	verified  []span        // byte ranges whose CRCs were checked in this process
	corruptAt int64         // first corrupt byte found by an index rebuild, -1 none

	// txn is the segment's aborted-transaction index (.txnindex, txnindex.go);
	// nil: the segment has none, which costs readers nothing.
	txn atomic.Pointer[segTxn]

	// Preallocation (Options.Preallocate), guarded by the partition's mu:
	// the file size fallocate set (0: none; the file ends at size) and
	// the appends so far.
	alloc      int64
	appends    int
	noPrealloc bool // a fallocate failed: no more for this segment

	fh      *handle // guarded by fileCache.mu
	dropped bool    // deleted or closed: never cache a handle again; fileCache.mu
}

func segmentName(dir string, base int64, ext string) string {
	return filepath.Join(dir, fmt.Sprintf("%020d%s", base, ext))
}

func newSegment(dir string, base int64, now time.Time) *segment {
	seg := &segment{base: base, logPath: segmentName(dir, base, ".log"), created: now, corruptAt: -1, lastTime: -1}
	seg.next.Store(base)
	seg.maxTs.Store(-1)
	return seg
}

func (seg *segment) indexPath() string     { return seg.logPath[:len(seg.logPath)-4] + ".index" }
func (seg *segment) timeIndexPath() string { return seg.logPath[:len(seg.logPath)-4] + ".timeindex" }
func (seg *segment) txnIndexPath() string  { return seg.logPath[:len(seg.logPath)-4] + txnIndexExt }

// span is a half-open byte range [start, end).
type span struct{ start, end int64 }

// covered reports whether [a, b) lies in one verified span. seg.mu held (R).
func (seg *segment) coveredLocked(a, b int64) bool {
	i := sort.Search(len(seg.verified), func(i int) bool { return seg.verified[i].end >= b })
	return i < len(seg.verified) && seg.verified[i].start <= a
}

// markVerifiedLocked adds [a, b) to the verified spans, merging neighbours.
// seg.mu held.
func (seg *segment) markVerifiedLocked(a, b int64) {
	v := seg.verified
	if n := len(v); n > 0 && v[n-1].end >= a && v[n-1].start <= a { // the common case: extend the tail
		if b > v[n-1].end {
			v[n-1].end = b
		}
		return
	}
	v = append(v, span{a, b})
	sort.Slice(v, func(i, j int) bool { return v[i].start < v[j].start })
	out := v[:1]
	for _, s := range v[1:] {
		last := &out[len(out)-1]
		if s.start <= last.end {
			last.end = max(last.end, s.end)
		} else {
			out = append(out, s)
		}
	}
	seg.verified = out
}

// addToIndex maintains the sparse indexes while batches are appended or
// scanned in order. since counts bytes since the last offset entry.
func (seg *segment) addToIndexLocked(ix *segmentIndex, since *int64, interval int64, pos int64, h *BatchHeader) {
	if *since >= interval && pos > 0 {
		rel := uint32(h.BaseOffset - seg.base)
		ix.offsets = append(ix.offsets, offsetEntry{rel: rel, pos: uint32(pos)})
		*since = 0
		ms := max(seg.maxTs.Load(), h.MaxTimestamp)
		if ms > seg.lastTime {
			ix.times = append(ix.times, timeEntry{ts: ms, rel: rel})
			seg.lastTime = ms
		}
	}
	*since += int64(h.Length)
}

// walkResult is where a walk over stored batches stopped.
type walkResult struct {
	end    int64  // position after the last good batch
	next   int64  // offset after the last good batch
	maxTs  int64  // greatest maxTimestamp among good batches, -1 if none
	reason string // why the walk stopped before limit, "" if it reached it
}

const walkBufSize = 1 << 20

var walkBufPool = sync.Pool{New: func() any { b := make([]byte, walkBufSize); return &b }}

// walkSegment reads the batches in [start, limit) of r in large sequential
// reads, checking each one's framing, magic, CRC-32C and offset continuity
// (next < 0 takes the first batch's base offset as given). fn, if not nil, is
// called for every good batch. It stops at the first bad batch; the result
// says where and why. I/O errors other than a short file are returned.
//
// walkSegment is that walk; with gaps (a cleaned segment) a batch may
// start past the offset after the previous one and hold fewer records than
// its offset range (none at all: a header kept for producer state).
func walkSegment(r io.ReaderAt, start, limit, next int64, gaps bool, fn func(pos int64, h *BatchHeader)) (walkResult, error) {
	bp := walkBufPool.Get().(*[]byte)
	defer walkBufPool.Put(bp)
	buf := *bp
	res := walkResult{end: start, next: next, maxTs: -1}
	pos := start
	for pos < limit {
		n := min(int64(len(buf)), limit-pos)
		m, err := r.ReadAt(buf[:n], pos)
		if err != nil && !errors.Is(err, io.EOF) {
			return res, err
		}
		b := buf[:m]
		off := 0
		for {
			if len(b)-off < BatchHeaderSize {
				if off == 0 {
					res.reason = fmt.Sprintf("%d bytes left, short of a batch header", limit-pos)
					return res, nil
				}
				break
			}
			h, perr := ParseBatchHeader(b[off:])
			if perr != nil {
				res.reason = perr.Error()
				return res, nil
			}
			if res.next >= 0 && (h.BaseOffset != res.next && !gaps || h.BaseOffset < res.next) {
				res.reason = fmt.Sprintf("batch base offset %d, expected %d", h.BaseOffset, res.next)
				return res, nil
			}
			check := checkFields
			if gaps {
				check = checkCleanedFields
			}
			if ferr := check(&h); ferr != nil {
				res.reason = ferr.Error()
				return res, nil
			}
			blen := int64(h.Length)
			if pos+int64(off)+blen > limit {
				res.reason = fmt.Sprintf("batch of %d bytes runs past the end (%d bytes left)", blen, limit-pos-int64(off))
				return res, nil
			}
			var ok bool
			if int64(off)+blen <= int64(len(b)) {
				ok = VerifyBatch(b[off:int64(off)+blen], &h)
			} else if off == 0 {
				// Bigger than the buffer: stream the CRC.
				ok, err = streamCRC(r, buf, pos, &h)
				if err != nil {
					return res, err
				}
			} else {
				break // refill from this batch
			}
			if !ok {
				res.reason = fmt.Sprintf("crc mismatch in batch at offset %d", h.BaseOffset)
				return res, nil
			}
			if fn != nil {
				fn(pos+int64(off), &h)
			}
			res.next = h.NextOffset()
			res.maxTs = max(res.maxTs, h.MaxTimestamp)
			off += int(blen)
			res.end = pos + int64(off)
			if int64(off) >= int64(len(b)) {
				break
			}
		}
		pos += int64(off)
	}
	return res, nil
}

func streamCRC(r io.ReaderAt, buf []byte, pos int64, h *BatchHeader) (bool, error) {
	var crc uint32
	for p, end := pos+crcStart, pos+int64(h.Length); p < end; {
		n := min(int64(len(buf)), end-p)
		m, err := r.ReadAt(buf[:n], p)
		if int64(m) < n {
			if err == nil || errors.Is(err, io.EOF) {
				return false, nil
			}
			return false, err
		}
		crc = crc32.Update(crc, castagnoli, buf[:n])
		p += n
	}
	return crc == h.CRC, nil
}

// headerScanner reads batch headers at successive positions of one file,
// serving them from a small window so a scan over many small batches costs
// one pread per window, not one per batch.
type headerScanner struct {
	r      io.ReaderAt
	path   string
	limit  int64
	bp     *[]byte
	buf    []byte
	bufPos int64
	bufLen int
}

const scanWindow = 8 << 10

var scanBufPool = sync.Pool{New: func() any { b := make([]byte, scanWindow); return &b }}

func newHeaderScanner(r io.ReaderAt, path string, limit int64) headerScanner {
	bp := scanBufPool.Get().(*[]byte)
	return headerScanner{r: r, path: path, limit: limit, bp: bp, buf: *bp, bufPos: -1}
}

func (s *headerScanner) close() {
	scanBufPool.Put(s.bp)
	s.bp, s.buf = nil, nil
}

// header returns the batch header at pos, which must be a batch boundary
// below limit. A header that does not parse, or a batch that runs past limit,
// is corruption.
func (s *headerScanner) header(pos int64) (BatchHeader, error) {
	if pos+BatchHeaderSize > s.limit {
		return BatchHeader{}, &CorruptionError{Path: s.path, Pos: pos, Reason: "batch header past the end of the data"}
	}
	if s.bufPos < 0 || pos < s.bufPos || pos+BatchHeaderSize > s.bufPos+int64(s.bufLen) {
		n := min(int64(len(s.buf)), s.limit-pos)
		m, err := s.r.ReadAt(s.buf[:n], pos)
		if int64(m) < BatchHeaderSize {
			if err == nil || errors.Is(err, io.EOF) {
				return BatchHeader{}, &CorruptionError{Path: s.path, Pos: pos, Reason: "file shorter than expected"}
			}
			return BatchHeader{}, err
		}
		s.bufPos, s.bufLen = pos, m
	}
	h, err := ParseBatchHeader(s.buf[pos-s.bufPos:])
	if err != nil {
		return h, &CorruptionError{Path: s.path, Pos: pos, Reason: err.Error()}
	}
	if pos+int64(h.Length) > s.limit {
		return h, &CorruptionError{Path: s.path, Pos: pos, Reason: "batch runs past the end of the data"}
	}
	return h, nil
}
