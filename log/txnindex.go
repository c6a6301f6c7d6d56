package log

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// The aborted-transaction index of a segment (Kafka's .txnindex): one
// entry per ABORT marker in the segment, in marker (LastOffset) order,
// each the same 34 big-endian bytes as Kafka's:
//
//	 0  version          int16 (0)
//	 2  producerId       int64
//	10  firstOffset      int64  first offset of the aborted transaction
//	18  lastOffset       int64  offset of its ABORT marker (in this segment)
//	26  lastStableOffset int64  the partition's LSO once the marker was written
//
// No header, no checksum: a file whose length is not a multiple of 34, or
// whose entries stop making sense (version, order, range), is cut after its
// last good entry. The file exists only for segments with an aborted
// transaction; which ones is known from the directory listing at open.
// Unlike .index/.timeindex it is not derived from the .log alone (the first
// offset needs the producer state): the broker rebuilds what may be missing
// after a crash by replaying the log from its producer-state snapshot
// (RebuildAborted).
const (
	txnIndexExt     = ".txnindex"
	txnEntrySize    = 34
	txnIndexVersion = 0
)

// AbortedTxn is one entry of a segment's aborted-transaction index (Kafka's
// .txnindex: the same 34-byte big-endian record: version int16 = 0,
// producer id int64, first offset int64, last offset int64, last stable
// offset int64).
type AbortedTxn struct {
	ProducerID       int64
	FirstOffset      int64 // first offset of the aborted transaction in this partition
	LastOffset       int64 // offset of its ABORT marker
	LastStableOffset int64 // the partition's last stable offset once the marker was written
}

// ControlAbort / ControlCommit are Kafka's control record types (the key of
// a control batch's record: version int16, type int16).
const (
	ControlAbort  int16 = 0
	ControlCommit int16 = 1
)

// segTxn is one segment's aborted-transaction index in memory.
type segTxn struct {
	// entries is nil until the file is loaded; then the entries in
	// ascending LastOffset order. Readers load it without a lock: a new
	// entry at the end is written into spare capacity past every published
	// length (readers never look there) before the longer slice is
	// published; any other change publishes a fresh array.
	entries atomic.Pointer[[]AbortedTxn]

	mu    sync.Mutex // loading and every change of the file
	disk  int64      // bytes the file is known to hold (mu)
	dirty bool       // written since its last fsync (mu)
}

// EncodeAbortedTxns appends the .txnindex encoding of es to dst.
func EncodeAbortedTxns(dst []byte, es []AbortedTxn) []byte {
	for _, e := range es {
		dst = binary.BigEndian.AppendUint16(dst, txnIndexVersion)
		dst = binary.BigEndian.AppendUint64(dst, uint64(e.ProducerID))
		dst = binary.BigEndian.AppendUint64(dst, uint64(e.FirstOffset))
		dst = binary.BigEndian.AppendUint64(dst, uint64(e.LastOffset))
		dst = binary.BigEndian.AppendUint64(dst, uint64(e.LastStableOffset))
	}
	return dst
}

func decodeTxnEntry(b []byte) (AbortedTxn, int16) {
	be := binary.BigEndian
	return AbortedTxn{
		ProducerID:       int64(be.Uint64(b[2:])),
		FirstOffset:      int64(be.Uint64(b[10:])),
		LastOffset:       int64(be.Uint64(b[18:])),
		LastStableOffset: int64(be.Uint64(b[26:])),
	}, int16(be.Uint16(b))
}

// decodeTxnIndex decodes the good prefix of a segment's .txnindex: whole
// entries of version 0 with FirstOffset <= LastOffset, LastOffset in
// [base, next) and ascending. good is the length of that prefix in bytes;
// reason says why the rest was refused ("" if nothing was).
func decodeTxnIndex(b []byte, base, next int64) (es []AbortedTxn, good int, reason string) {
	last := int64(-1)
	for good+txnEntrySize <= len(b) {
		e, v := decodeTxnEntry(b[good:])
		switch {
		case v != txnIndexVersion:
			reason = fmt.Sprintf("entry %d: version %d", good/txnEntrySize, v)
		case e.FirstOffset < 0 || e.FirstOffset > e.LastOffset:
			reason = fmt.Sprintf("entry %d: first offset %d after last offset %d", good/txnEntrySize, e.FirstOffset, e.LastOffset)
		case e.LastOffset < base || e.LastOffset >= next:
			reason = fmt.Sprintf("entry %d: last offset %d outside the segment's [%d, %d)", good/txnEntrySize, e.LastOffset, base, next)
		case e.LastOffset == 0 && e.LastStableOffset == 0:
			// Zeros where the data never landed: a marker at offset 0
			// leaves the LSO at 1.
			reason = fmt.Sprintf("entry %d: zeroed", good/txnEntrySize)
		case e.LastOffset <= last:
			reason = fmt.Sprintf("entry %d: last offset %d not after %d", good/txnEntrySize, e.LastOffset, last)
		}
		if reason != "" {
			return es, good, reason
		}
		es = append(es, e)
		last = e.LastOffset
		good += txnEntrySize
	}
	if good < len(b) {
		reason = fmt.Sprintf("%d bytes past the last whole entry", len(b)-good)
	}
	return es, good, reason
}

// CollectAbortedTxns appends to dst the entries of an encoded .txnindex
// (such as a segment's uploaded copy) whose range overlaps [from, upper):
// LastOffset >= from && FirstOffset < upper. complete reports that it
// stopped at an entry with LastStableOffset >= upper: no later segment can
// hold an entry overlapping the range (Kafka's
// TransactionIndex.collectAbortedTxns). Bytes past the last whole entry are
// ignored.
func CollectAbortedTxns(dst []AbortedTxn, index []byte, from, upper int64) (out []AbortedTxn, complete bool) {
	for pos := 0; pos+txnEntrySize <= len(index); pos += txnEntrySize {
		e, _ := decodeTxnEntry(index[pos:])
		if e.LastOffset >= from && e.FirstOffset < upper {
			dst = append(dst, e)
		}
		if e.LastStableOffset >= upper {
			return dst, true
		}
	}
	return dst, false
}

// collectEntries is CollectAbortedTxns over decoded entries.
func collectEntries(dst []AbortedTxn, es []AbortedTxn, from, upper int64) ([]AbortedTxn, bool) {
	for i := range es {
		e := &es[i]
		if e.LastOffset >= from && e.FirstOffset < upper {
			dst = append(dst, *e)
		}
		if e.LastStableOffset >= upper {
			return dst, true
		}
	}
	return dst, false
}

// AbortedTxns appends to dst the entries whose range overlaps [from,
// upper): LastOffset >= from && FirstOffset < upper, looking at the local
// segments from the one holding from (the first local segment if from is
// below the local start) onward, in file order, and stopping (as Kafka's
// collectAbortedTransactions) at an entry with LastStableOffset >= upper.
// Segments without a .txnindex cost nothing (no I/O, no allocation); a
// segment's file is loaded the first time it is needed, then kept in
// memory.
func (p *Partition) AbortedTxns(dst []AbortedTxn, from, upper int64) ([]AbortedTxn, error) {
	segs := p.segments()
	i := sort.Search(len(segs), func(i int) bool { return segs[i].next.Load() > from })
	for ; i < len(segs); i++ {
		seg := segs[i]
		st := seg.txn.Load()
		if st == nil {
			continue
		}
		es, err := p.txnEntries(seg, st)
		if err != nil {
			return dst, err
		}
		var complete bool
		if dst, complete = collectEntries(dst, es, from, upper); complete {
			break
		}
	}
	return dst, nil
}

// SegmentAbortedTxns returns a copy of the aborted-transaction entries of
// the local segment starting at base (nil if it has none): what tiering
// uploads beside the segment.
func (p *Partition) SegmentAbortedTxns(base int64) ([]AbortedTxn, error) {
	for _, seg := range p.segments() {
		if seg.base != base {
			continue
		}
		st := seg.txn.Load()
		if st == nil {
			return nil, nil
		}
		es, err := p.txnEntries(seg, st)
		if err != nil || len(es) == 0 {
			return nil, err
		}
		return append([]AbortedTxn(nil), es...), nil
	}
	return nil, fmt.Errorf("%w: no local segment starts at %d", ErrOffsetOutOfRange, base)
}

// txnEntries returns seg's entries, loading its file the first time.
func (p *Partition) txnEntries(seg *segment, st *segTxn) ([]AbortedTxn, error) {
	if es := st.entries.Load(); es != nil {
		return *es, nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return p.loadTxnLocked(seg, st)
}

// loadTxnLocked loads seg's .txnindex if it is not loaded yet, cutting what
// does not decode (a torn tail, entries past the segment's end: after a
// crash those of the active segment beyond the recovered log end). A
// missing file is an empty index. st.mu held.
func (p *Partition) loadTxnLocked(seg *segment, st *segTxn) ([]AbortedTxn, error) {
	if es := st.entries.Load(); es != nil {
		return *es, nil
	}
	path := seg.txnIndexPath()
	b, err := readWholeFile(p.store.fs, path)
	if errors.Is(err, fs.ErrNotExist) {
		b, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("log: read %s: %w", filepath.Base(path), err)
	}
	es, good, reason := decodeTxnIndex(b, seg.base, seg.next.Load())
	st.disk = int64(len(b))
	if good < len(b) {
		p.logger.Warn("cutting aborted-transaction index", zap.String("file", filepath.Base(path)),
			zap.Int("entries_kept", len(es)), zap.Int("bytes_dropped", len(b)-good), zap.String("reason", reason))
		if f, err := p.store.fs.OpenFile(path, os.O_RDWR, 0); err == nil {
			if f.Truncate(int64(good)) == nil {
				st.disk = int64(good)
				st.dirty = true
			}
			f.Close()
		}
	}
	if es == nil {
		es = []AbortedTxn{}
	}
	st.entries.Store(&es)
	return es, nil
}

// readWholeFile reads a whole file through fsys.
func readWholeFile(fsys FS, name string) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && !(errors.Is(err, io.EOF) && size == 0) {
		return nil, err
	}
	return b, nil
}

// writeTxnLocked makes seg's file hold its first n entries as they are
// (cutting anything after them) followed by add. st.mu held.
func (p *Partition) writeTxnLocked(seg *segment, st *segTxn, n int, add []AbortedTxn) error {
	f, err := p.store.fs.OpenFile(seg.txnIndexPath(), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	pos := int64(n) * txnEntrySize
	if st.disk != pos {
		err = f.Truncate(pos)
	}
	if err == nil {
		st.disk = pos
		st.dirty = true
		if len(add) > 0 {
			var buf [txnEntrySize * 4]byte
			_, err = f.WriteAt(EncodeAbortedTxns(buf[:0], add), pos)
			st.disk = -1 // unknown until the write is known whole
			if err == nil {
				st.disk = pos + int64(len(add))*txnEntrySize
			}
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// AddAborted records a, whose ABORT marker the caller has just appended at
// a.LastOffset, in the index of the segment holding a.LastOffset (the
// active one, unless a roll came in between). The entry is written to
// <segment base>.txnindex (created on first entry) and kept in memory. The
// file is fsync'd when the segment rolls and by Close/CloseBatch, not per
// entry: after a crash the caller replays the log and calls RebuildAborted.
// Adding an entry equal to one there is a no-op; entries may come out of
// LastOffset order (the file is then rewritten from the new entry on).
func (p *Partition) AddAborted(a AbortedTxn) error {
	if a.FirstOffset < 0 || a.FirstOffset > a.LastOffset {
		return fmt.Errorf("log: aborted transaction with first offset %d and last offset %d", a.FirstOffset, a.LastOffset)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	if leo := p.leo.Load(); a.LastOffset >= leo {
		return fmt.Errorf("%w: abort marker offset %d at or past the log end %d", ErrOffsetOutOfRange, a.LastOffset, leo)
	}
	segs := *p.segs.Load()
	i := sort.Search(len(segs), func(i int) bool { return segs[i].next.Load() > a.LastOffset })
	if i == len(segs) || segs[i].base > a.LastOffset {
		return fmt.Errorf("%w: abort marker offset %d in no local segment", ErrOffsetOutOfRange, a.LastOffset)
	}
	seg := segs[i]
	st := p.txnForWriteLocked(seg)
	st.mu.Lock()
	defer st.mu.Unlock()
	cur, err := p.loadTxnLocked(seg, st)
	if err != nil {
		return err
	}
	j := sort.Search(len(cur), func(j int) bool { return cur[j].LastOffset >= a.LastOffset })
	if j < len(cur) && cur[j].LastOffset == a.LastOffset {
		if cur[j] == a {
			return nil
		}
		return fmt.Errorf("log: an aborted transaction of producer %d already ends at offset %d", cur[j].ProducerID, a.LastOffset)
	}
	var next []AbortedTxn
	if j == len(cur) {
		next = append(cur, a) // past every published length: see segTxn
	} else {
		next = make([]AbortedTxn, 0, len(cur)+1)
		next = append(append(append(next, cur[:j]...), a), cur[j:]...)
	}
	if err := p.writeTxnLocked(seg, st, j, next[j:]); err != nil {
		return fmt.Errorf("log: write %s: %w", filepath.Base(seg.txnIndexPath()), err)
	}
	st.entries.Store(&next)
	return nil
}

// txnForWriteLocked returns seg's index, making an empty, loaded one if it
// has none (the file is created by the first write). p.mu held.
func (p *Partition) txnForWriteLocked(seg *segment) *segTxn {
	if st := seg.txn.Load(); st != nil {
		return st
	}
	st := &segTxn{}
	es := []AbortedTxn{}
	st.entries.Store(&es)
	seg.txn.Store(st)
	return st
}

// RebuildAborted drops every entry with LastOffset >= from (in every
// segment) and then adds entries (ascending LastOffset, all >= from and
// below the log end). The broker calls it at open after replaying the log
// from from (its producer-state snapshot point), so entries a crash lost or
// tore are whole again. Segments whose entries do not change are not
// written; a changed file keeps its unchanged prefix and is cut and
// appended to from there. Entries in no local segment (below the local log
// start) are ignored.
func (p *Partition) RebuildAborted(from int64, entries []AbortedTxn) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	leo := p.leo.Load()
	for i, e := range entries {
		if e.LastOffset < from || e.LastOffset >= leo || e.FirstOffset < 0 || e.FirstOffset > e.LastOffset ||
			(i > 0 && e.LastOffset <= entries[i-1].LastOffset) {
			return fmt.Errorf("log: rebuild of aborted transactions from %d: entry %d (first %d, last %d) out of order or range (log end %d)",
				from, i, e.FirstOffset, e.LastOffset, leo)
		}
	}
	segs := *p.segs.Load()
	j := 0
	for _, seg := range segs {
		for j < len(entries) && entries[j].LastOffset < seg.base {
			j++ // below the local log
		}
		next := seg.next.Load()
		k := j
		for k < len(entries) && entries[k].LastOffset < next {
			k++
		}
		mine := entries[j:k]
		j = k
		if next <= from && len(mine) == 0 {
			continue
		}
		st := seg.txn.Load()
		if st == nil {
			if len(mine) == 0 {
				continue
			}
			st = p.txnForWriteLocked(seg)
		}
		st.mu.Lock()
		err := p.rebuildSegLocked(seg, st, from, mine)
		st.mu.Unlock()
		if err != nil {
			return fmt.Errorf("log: rebuild %s: %w", filepath.Base(seg.txnIndexPath()), err)
		}
	}
	return nil
}

// rebuildSegLocked is RebuildAborted for one segment: its entries below
// from, then mine. st.mu held.
func (p *Partition) rebuildSegLocked(seg *segment, st *segTxn, from int64, mine []AbortedTxn) error {
	cur, err := p.loadTxnLocked(seg, st)
	if err != nil {
		return err
	}
	keep := sort.Search(len(cur), func(i int) bool { return cur[i].LastOffset >= from })
	c := 0
	for c < len(mine) && keep+c < len(cur) && cur[keep+c] == mine[c] {
		c++
	}
	if keep+c == len(cur) && c == len(mine) {
		return nil // unchanged
	}
	n := keep + c
	want := make([]AbortedTxn, 0, n+len(mine)-c)
	want = append(append(want, cur[:n]...), mine[c:]...)
	if len(want) == 0 {
		if err := p.store.fs.Remove(seg.txnIndexPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		st.disk, st.dirty = 0, false
	} else if err := p.writeTxnLocked(seg, st, n, mine[c:]); err != nil {
		return err
	}
	st.entries.Store(&want)
	return nil
}

// syncTxnLocked fsyncs seg's .txnindex if it was written since its last
// fsync. p.mu held.
func (p *Partition) syncTxnLocked(seg *segment) error {
	st := seg.txn.Load()
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.dirty {
		return nil
	}
	f, err := p.store.fs.OpenFile(seg.txnIndexPath(), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		st.dirty = false
		return nil
	}
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		st.dirty = false
	}
	return err
}

// syncAllTxnLocked fsyncs every segment's .txnindex written since its last
// fsync (Close). p.mu held.
func (p *Partition) syncAllTxnLocked() error {
	for _, seg := range p.segments() {
		if err := p.syncTxnLocked(seg); err != nil {
			return err
		}
	}
	return nil
}

// openTxn is open's part: seg has a .txnindex (from the directory
// listing); the active segment's is loaded now, which drops entries past
// the recovered log end.
func (p *Partition) openTxn(seg *segment, active bool) error {
	st := &segTxn{}
	seg.txn.Store(st)
	if !active {
		return nil // loaded when first needed
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	_, err := p.loadTxnLocked(seg, st)
	return err
}

// ScanBatches calls fn with the header of every batch from the one
// containing offset up to the log end, reading only headers, and with each
// control batch's control type (ControlAbort, ControlCommit, …), read from
// the key of the batch's first record a few bytes after the header (control
// batches are never compressed); -1 for other batches or when the key
// cannot be read. fn returning false stops the scan. Used to rebuild state
// kept beside the log (producer sequences, open transactions) after a
// restart.
func (p *Partition) ScanBatches(offset int64, fn func(h *BatchHeader, control int16) bool) error {
	for {
		err := p.scanBatches(&offset, fn)
		if !errors.Is(err, errSegmentReplaced) {
			return err
		}
		runtime.Gosched() // the cleaner swapped segments: go on from offset in the new ones
	}
}

// scanBatches is ScanBatches over one segment list, advancing *from past
// every batch delivered.
func (p *Partition) scanBatches(from *int64, fn func(h *BatchHeader, control int16) bool) error {
	offset := *from
	for _, seg := range p.segments() {
		if seg.next.Load() <= offset {
			continue
		}
		h, err := p.store.cache.acquire(seg, mayWait)
		if err != nil {
			return err
		}
		limit := seg.size.Load()
		sc := newHeaderScanner(h.f, seg.logPath, limit)
		pos := int64(0)
		if offset > seg.base {
			if ix, err := p.segmentIndex(seg, h); err == nil {
				seg.mu.RLock()
				pos = ix.lookup(seg.base, offset)
				seg.mu.RUnlock()
			}
		}
		stop := false
		for pos < limit && !stop {
			hdr, err := sc.header(pos)
			if err != nil {
				sc.close()
				p.store.cache.release(h)
				return err
			}
			at := pos
			pos += int64(hdr.Length)
			if hdr.LastOffset() < offset {
				continue
			}
			ct := int16(-1)
			if hdr.Control() {
				ct = sc.controlType(at, &hdr)
			}
			stop = !fn(&hdr, ct)
			*from = max(*from, hdr.NextOffset())
		}
		sc.close()
		p.store.cache.release(h)
		if stop {
			return nil
		}
	}
	return nil
}

// controlRecordMax is the most bytes from a batch's records start to the
// end of a control record's key: length varint (5), attributes (1),
// timestamp delta varlong (10), offset delta varint (5), key length varint
// (5), key version and type (4).
const controlRecordMax = 5 + 1 + 10 + 5 + 5 + 4

// controlType reads the control type of the control batch h at pos (-1 if
// it cannot be read).
func (s *headerScanner) controlType(pos int64, h *BatchHeader) int16 {
	if h.NumRecords < 1 || h.Codec() != CodecNone {
		return -1
	}
	start := pos + BatchHeaderSize
	end := min(pos+int64(h.Length), start+controlRecordMax, s.limit)
	if end <= start {
		return -1
	}
	if s.bufPos < 0 || start < s.bufPos || end > s.bufPos+int64(s.bufLen) {
		n := min(int64(len(s.buf)), s.limit-pos)
		m, err := s.r.ReadAt(s.buf[:n], pos)
		if int64(m) < end-pos && err != nil {
			s.bufPos = -1
			return -1
		}
		s.bufPos, s.bufLen = pos, m
	}
	return ControlType(s.buf[start-s.bufPos : end-s.bufPos])
}

// ControlType returns the control type in the key of the first record of
// records (the bytes of a control batch after its header); -1 if it cannot
// be read.
func ControlType(records []byte) int16 {
	b := records
	_, n := binary.Varint(b) // record length
	if n <= 0 {
		return -1
	}
	b = b[n:]
	if len(b) < 1 {
		return -1
	}
	b = b[1:]     // attributes
	for range 2 { // timestamp delta, offset delta
		if _, n = binary.Varint(b); n <= 0 {
			return -1
		}
		b = b[n:]
	}
	kl, n := binary.Varint(b)
	if n <= 0 || kl < 4 || len(b)-n < 4 {
		return -1
	}
	b = b[n:]
	if version := int16(binary.BigEndian.Uint16(b)); version < 0 {
		return -1
	}
	return int16(binary.BigEndian.Uint16(b[2:]))
}

// DumpTxnIndex decodes a .txnindex file for the inspect tools: its good
// entries, and why the rest (if any) does not decode. base and next bound
// the segment's offsets (next < 0: unbounded).
func DumpTxnIndex(fsys FS, path string, base, next int64) ([]AbortedTxn, string, error) {
	b, err := readWholeFile(fsys, path)
	if err != nil {
		return nil, "", err
	}
	if next < 0 {
		next = 1<<63 - 1
	}
	es, _, reason := decodeTxnIndex(b, base, next)
	return es, reason, nil
}

// verifyTxnIndex is VerifyDir's check of a segment's .txnindex: whole
// entries of version 0, FirstOffset <= LastOffset, LastOffset inside the
// segment, ascending. A torn tail, and entries of the last segment past its
// end, are what a crash leaves (cut at open, rebuilt by the broker's
// replay): notes. Anything else is damage.
func verifyTxnIndex(fsys FS, seg *segment, res walkResult, size int64, last bool, rep *VerifyReport) {
	name := filepath.Base(seg.txnIndexPath())
	b, err := readWholeFile(fsys, seg.txnIndexPath())
	if err != nil {
		rep.Damage = append(rep.Damage, fmt.Sprintf("%s: unreadable: %v", name, err))
		return
	}
	next := res.next
	if res.end != size {
		next = 1<<63 - 1 // unknown past the damage (reported already)
	}
	es, good, reason := decodeTxnIndex(b, seg.base, next)
	if good == len(b) {
		return
	}
	msg := fmt.Sprintf("%s: %d good entries, then %s", name, len(es), reason)
	torn := len(b)-good < txnEntrySize
	if !torn && last {
		// Entries of the last segment past the log end (its tail torn
		// off by a crash) are dropped at open; so is anything after them.
		e, v := decodeTxnEntry(b[good:])
		torn = v == txnIndexVersion && e.FirstOffset <= e.LastOffset && e.LastOffset >= next
	}
	if torn {
		rep.Notes = append(rep.Notes, msg+": cut on next open")
	} else {
		rep.Damage = append(rep.Damage, msg)
	}
}

// SyncAborted fsyncs every aborted-transaction index written since its
// last fsync, so a producer snapshot taken after it may vouch for the
// entries below its point (the broker's replay rebuilds only above it).
func (p *Partition) SyncAborted() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.syncAllTxnLocked()
}
