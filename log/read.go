package log

import (
	"errors"
	"io"
	"io/fs"
	"math"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
)

// Chunk is a byte range of a segment file holding whole batches. Its file
// stays open until the ReadResult is released, so it can be sent with
// sendfile(2) at an explicit offset (the file position is never used).
type Chunk struct {
	h           *handle
	mem         memFile // the bytes themselves, when h is nil (a small read under descriptor pressure)
	Pos, Len    int64
	FirstOffset int64 // base offset of the first batch in the chunk
	NextOffset  int64 // offset after the last batch in the chunk
}

// File returns the open segment file. If it implements OSFile, the chunk can
// go to a socket without passing through user memory.
func (c Chunk) File() File {
	if c.h == nil {
		return c.mem
	}
	return c.h.f
}

// memFile is a chunk's bytes held in memory: a read-only File.
type memFile []byte

func (m memFile) ReadAt(b []byte, off int64) (int, error) {
	if off < 0 || off > int64(len(m)) {
		return 0, io.EOF
	}
	n := copy(b, m[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}
func (memFile) WriteAt([]byte, int64) (int, error) { return 0, errors.ErrUnsupported }
func (memFile) Sync() error                        { return nil }
func (memFile) Truncate(int64) error               { return errors.ErrUnsupported }
func (m memFile) Size() (int64, error)             { return int64(len(m)), nil }
func (memFile) Close() error                       { return nil }

// smallRead is the largest chunk a read copies into memory (releasing its
// file at once) while descriptors are short: a fetch of thousands of
// partitions then pins no file for each, and serves them all.
const smallRead = 64 << 10

// ReadResult is what Read returns: whole batches as file ranges, plus the
// partition's offsets as of the read. Release it when the bytes are sent.
type ReadResult struct {
	Chunks         []Chunk
	Bytes          int64
	NextOffset     int64 // offset after the last batch returned (= the offset read if none)
	HighWatermark  int64
	LogStartOffset int64
	LogEndOffset   int64
	store          *Store
	inline         [2]Chunk
}

var readResultPool = sync.Pool{New: func() any { return new(ReadResult) }}

// Release lets the chunks' files be closed. The result must not be used
// after.
func (r *ReadResult) Release() {
	for _, c := range r.Chunks {
		if c.h != nil {
			r.store.cache.release(c.h)
		}
	}
	*r = ReadResult{}
	readResultPool.Put(r)
}

// AppendTo copies the chunks' bytes to dst (the copy path, for callers that
// cannot use sendfile).
func (r *ReadResult) AppendTo(dst []byte) ([]byte, error) {
	for _, c := range r.Chunks {
		n := len(dst)
		dst = append(dst, make([]byte, c.Len)...)
		if _, err := c.File().ReadAt(dst[n:], c.Pos); err != nil && !(errors.Is(err, io.EOF) && int64(len(dst)-n) == c.Len) {
			return dst[:n], err
		}
	}
	return dst, nil
}

// WriteTo copies the chunks to w.
func (r *ReadResult) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for _, c := range r.Chunks {
		n, err := io.Copy(w, io.NewSectionReader(c.File(), c.Pos, c.Len))
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// Read returns whole batches starting with the batch that contains offset,
// up to maxBytes (but always the first batch, however large, as Kafka's
// KIP-74), never past the high watermark. Reading at the high watermark
// returns no chunks; reading below the log start or above the log end is
// ErrOffsetOutOfRange. Bytes are CRC-checked the first time this process
// serves them (appended ones were checked on append), so corruption on disk
// is an error, never garbage handed to a client.
func (p *Partition) Read(offset int64, maxBytes int64) (*ReadResult, error) {
	return p.read(offset, maxBytes, true, math.MaxInt64)
}

// ReadAtMost is Read without the first-batch exception: it returns no
// chunks when the first batch does not fit in maxBytes. A fetch uses it for
// every partition after the first that returned data (Kafka's KIP-74).
func (p *Partition) ReadAtMost(offset int64, maxBytes int64) (*ReadResult, error) {
	return p.read(offset, maxBytes, false, math.MaxInt64)
}

// read reads from offset, never past the high watermark nor past the batch
// starting at stop (stable.go).
func (p *Partition) read(offset int64, maxBytes int64, minOne bool, stop int64) (*ReadResult, error) {
	return p.readTo(&p.hw, offset, maxBytes, minOne, stop)
}

// readTo is read bounded by the mark in upto (the high watermark, or the
// durable end for a replica).
func (p *Partition) readTo(upto *atomic.Pointer[mark], offset int64, maxBytes int64, minOne bool, stop int64) (*ReadResult, error) {
	for i := 0; ; i++ {
		res, err := p.readOnce(upto, offset, maxBytes, minOne, stop)
		if !errors.Is(err, errSegmentReplaced) {
			return res, err
		}
		if i > 2 {
			runtime.Gosched()
		}
	}
}

// readOnce is read over one segment list; errSegmentReplaced means the
// cleaner swapped segments under it: read again.
func (p *Partition) readOnce(upto *atomic.Pointer[mark], offset int64, maxBytes int64, minOne bool, stop int64) (*ReadResult, error) {
	if e := p.failed.Load(); e != nil {
		return nil, e
	}
	hw := upto.Load()
	bound := hw
	if stop < hw.off {
		m, err := p.markAt(stop)
		if err != nil {
			return nil, err
		}
		bound = &m
	}
	res := readResultPool.Get().(*ReadResult)
	vis := hw.off
	if upto != &p.hw {
		vis = p.hw.Load().off
	}
	*res = ReadResult{store: p.store, NextOffset: offset, HighWatermark: vis, LogStartOffset: p.logStart.Load(), LogEndOffset: p.leo.Load()}
	res.Chunks = res.inline[:0]
	if offset < res.LogStartOffset || offset > res.LogEndOffset {
		res.Release()
		return nil, ErrOffsetOutOfRange
	}
	if offset >= bound.off {
		return res, nil
	}
	segs := p.segments()
	if bound.seg != nil && bound.seg.replaced.Load() {
		res.Release()
		return nil, errSegmentReplaced
	}
	i := sort.Search(len(segs), func(i int) bool { return segs[i].base > offset }) - 1
	if i < 0 || offset < segs[0].base {
		res.Release()
		if offset >= p.logStart.Load() {
			return nil, ErrNotLocal
		}
		return nil, ErrOffsetOutOfRange // deleted under us by retention
	}
	first := minOne
	for ; i < len(segs) && segs[i].base <= bound.seg.base; i++ {
		seg := segs[i]
		limit := seg.size.Load()
		if seg == bound.seg {
			limit = bound.pos
		}
		if !first && (maxBytes <= 0 || limit == 0) {
			break
		}
		c, err := p.readSegment(seg, offset, limit, maxBytes, first)
		if err != nil && len(res.Chunks) > 0 && (errors.Is(err, ErrResource) || errors.Is(err, errSegmentReplaced)) {
			return res, nil // no descriptor for the next segment: serve what there is
		}
		if err != nil {
			res.Release()
			if errors.Is(err, fs.ErrNotExist) && offset < p.LocalStartOffset() {
				if offset >= p.logStart.Load() {
					return nil, ErrNotLocal // offloaded and deleted locally under us
				}
				return nil, ErrOffsetOutOfRange // deleted by retention under us
			}
			return nil, err
		}
		if c.Len == 0 {
			p.store.cache.release(c.h)
			if res.Bytes == 0 && c.Pos >= limit {
				continue // offset is at this segment's end: take the next one
			}
			break
		}
		inside := c.Pos+c.Len < limit // the budget ended inside this segment
		if c.Len <= smallRead && p.store.cache.budget.Pressed() {
			// Short of descriptors: hand over the bytes, not the file.
			buf := make([]byte, c.Len)
			if _, err := c.h.f.ReadAt(buf, c.Pos); err == nil {
				p.store.cache.release(c.h)
				c.h, c.mem, c.Pos = nil, buf, 0
			}
		}
		first = false
		res.Chunks = append(res.Chunks, c)
		res.Bytes += c.Len
		res.NextOffset = c.NextOffset
		maxBytes -= c.Len
		if inside {
			break // budget exhausted inside this segment
		}
		offset = seg.next.Load()
	}
	return res, nil
}

// readSegment finds the chunk of seg for a read at offset, bounded by limit
// (a batch boundary) and maxBytes. When first, the batch containing offset is
// returned whatever its size.
func (p *Partition) readSegment(seg *segment, offset, limit, maxBytes int64, first bool) (Chunk, error) {
	h, err := p.store.cache.acquire(seg, refusable)
	if err != nil {
		return Chunk{}, err
	}
	c := Chunk{h: h}
	ix, err := p.segmentIndex(seg, h)
	if err != nil {
		p.store.cache.release(h)
		return c, err
	}
	seg.mu.RLock()
	corruptAt := seg.corruptAt
	seg.mu.RUnlock()
	if corruptAt >= 0 && corruptAt < limit {
		limit = corruptAt
	}
	sc := newHeaderScanner(h.f, seg.logPath, limit)
	defer sc.close()

	// Start: the batch that contains offset.
	pos := int64(0)
	if offset > seg.base {
		seg.mu.RLock()
		pos = ix.lookup(seg.base, offset)
		seg.mu.RUnlock()
	}
	var hdr BatchHeader
	for {
		if pos >= limit {
			if corruptAt >= 0 && pos == corruptAt {
				p.store.cache.release(h)
				return c, &CorruptionError{Path: seg.logPath, Pos: pos, Reason: "unreadable batch"}
			}
			c.Pos = pos
			return c, nil // offset not in this segment below limit
		}
		if hdr, err = sc.header(pos); err != nil {
			p.store.cache.release(h)
			return c, err
		}
		if hdr.LastOffset() >= offset {
			break
		}
		pos += int64(hdr.Length)
	}
	c.Pos, c.FirstOffset = pos, hdr.BaseOffset
	end, endOff := pos, hdr.BaseOffset
	if first || int64(hdr.Length) <= maxBytes {
		end, endOff = pos+int64(hdr.Length), hdr.NextOffset()
	}
	want := limit
	if maxBytes < limit-pos {
		want = pos + maxBytes
	}
	if end > pos && end < want {
		// Jump by the index to the last indexed batch start inside the
		// budget, then walk headers to the budget's edge.
		seg.mu.RLock()
		j, rel := ix.lookupPos(want)
		seg.mu.RUnlock()
		if j > end {
			end, endOff = j, seg.base+int64(rel)
		}
		for end < want {
			if hdr, err = sc.header(end); err != nil {
				p.store.cache.release(h)
				return c, err
			}
			if end+int64(hdr.Length) > want {
				break
			}
			end, endOff = end+int64(hdr.Length), hdr.NextOffset()
		}
	}
	if end > pos {
		good, err := verifyRange(seg, h.f, pos, end)
		if err != nil && good == pos {
			p.store.cache.release(h)
			return c, err
		}
		if good != end { // serve the good batches; the next read reports the bad one
			end = good
			if endOff, err = offsetAt(&sc, pos, end); err != nil {
				p.store.cache.release(h)
				return c, err
			}
		}
	}
	c.Len, c.NextOffset = end-pos, endOff
	return c, nil
}

// offsetAt returns the offset of the batch boundary at end by walking
// headers from pos (a boundary before it).
func offsetAt(sc *headerScanner, pos, end int64) (int64, error) {
	off := int64(-1)
	for pos < end {
		h, err := sc.header(pos)
		if err != nil {
			return 0, err
		}
		off = h.NextOffset()
		pos += int64(h.Length)
	}
	return off, nil
}

// segmentIndex returns seg's index, loading it from the index files (or
// rebuilding it from the log) on first use.
func (p *Partition) segmentIndex(seg *segment, h *handle) (*segmentIndex, error) {
	seg.mu.RLock()
	ix := seg.idx
	seg.mu.RUnlock()
	if ix != nil {
		return ix, nil
	}
	size := seg.size.Load()
	_, ix, err := loadIndexes(p.store.fs, seg, size)
	if err != nil {
		ix = &segmentIndex{}
		var since int64
		interval := p.cfg.Load().IndexIntervalBytes
		res, werr := walkSegment(h.f, 0, size, seg.base, seg.cleaned.Load(), func(pos int64, hd *BatchHeader) {
			seg.addToIndexLocked(ix, &since, interval, pos, hd)
		})
		if werr != nil {
			return nil, werr
		}
		seg.mu.Lock()
		if res.end != size {
			seg.corruptAt = res.end
		}
		seg.markVerifiedLocked(0, res.end)
		seg.mu.Unlock()
	}
	seg.mu.Lock()
	if seg.idx == nil {
		seg.idx = ix
	}
	ix = seg.idx
	seg.mu.Unlock()
	return ix, nil
}

// verifyRange CRC-checks the batches in [a, b) of seg unless this process
// already did. It returns the end of the good prefix and, if that is short of
// b, a CorruptionError for the first bad batch.
func verifyRange(seg *segment, f File, a, b int64) (int64, error) {
	seg.mu.RLock()
	ok := seg.coveredLocked(a, b)
	seg.mu.RUnlock()
	if ok {
		return b, nil
	}
	res, err := walkSegment(f, a, b, -1, seg.cleaned.Load(), nil)
	if err != nil {
		return a, err
	}
	if res.end > a {
		seg.mu.Lock()
		seg.markVerifiedLocked(a, res.end)
		seg.mu.Unlock()
	}
	if res.end != b {
		return res.end, &CorruptionError{Path: seg.logPath, Pos: res.end, Reason: res.reason}
	}
	return b, nil
}

// OffsetForTimestamp returns the base offset of the first batch whose max
// timestamp is >= ts, with that batch's max timestamp, below the high
// watermark. ok is false if there is none.
func (p *Partition) OffsetForTimestamp(ts int64) (offset, batchMaxTs int64, ok bool, err error) {
	for {
		offset, batchMaxTs, ok, err = p.offsetForTimestamp(ts)
		if !errors.Is(err, errSegmentReplaced) {
			return offset, batchMaxTs, ok, err
		}
		runtime.Gosched()
	}
}

func (p *Partition) offsetForTimestamp(ts int64) (offset, batchMaxTs int64, ok bool, err error) {
	hw := p.hw.Load()
	ls := p.logStart.Load()
	for _, seg := range p.segments() {
		if seg.base > hw.seg.base {
			break
		}
		if seg.next.Load() <= ls || seg.maxTs.Load() < ts {
			continue
		}
		limit := seg.size.Load()
		if seg == hw.seg {
			limit = hw.pos
		}
		h, err := p.store.cache.acquire(seg, mayWait)
		if err != nil {
			return 0, 0, false, err
		}
		off, mts, found, err := p.findTimestamp(seg, h, ts, limit, ls)
		p.store.cache.release(h)
		if err != nil || found {
			return off, mts, found, err
		}
	}
	return 0, 0, false, nil
}

func (p *Partition) findTimestamp(seg *segment, h *handle, ts, limit, ls int64) (int64, int64, bool, error) {
	ix, err := p.segmentIndex(seg, h)
	if err != nil {
		return 0, 0, false, err
	}
	seg.mu.RLock()
	pos := ix.lookupTime(seg.base, ts)
	seg.mu.RUnlock()
	sc := newHeaderScanner(h.f, seg.logPath, limit)
	defer sc.close()
	for pos < limit {
		hdr, err := sc.header(pos)
		if err != nil {
			return 0, 0, false, err
		}
		if hdr.MaxTimestamp >= ts && hdr.LastOffset() >= ls {
			return max(hdr.BaseOffset, ls), hdr.MaxTimestamp, true, nil
		}
		pos += int64(hdr.Length)
	}
	return 0, 0, false, nil
}

// ScanHeaders calls fn with the header of every batch from the one
// containing offset up to the log end, reading only headers (ScanBatches
// without the control types). fn returning false stops the scan.
func (p *Partition) ScanHeaders(offset int64, fn func(h *BatchHeader) bool) error {
	return p.ScanBatches(offset, func(h *BatchHeader, _ int16) bool { return fn(h) })
}
