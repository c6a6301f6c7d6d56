package log

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"
)

// SegmentFiles is one input segment of CleanSegments: a .log (local or a
// copy of an uploaded one) covering offsets [Base, Next).
type SegmentFiles struct {
	Base, Next int64
	Log        io.ReaderAt
	Size       int64 // bytes of whole batches in Log
}

// SegmentCleanConfig says what CleanSegments keeps.
type SegmentCleanConfig struct {
	// Map holds the latest offset of every key of the dirty range (nil: no
	// deduplication). A record whose key maps to a greater offset goes.
	Map *KeyMap
	// End: batches starting at or past it are copied untouched (the end of
	// the cleanable range; a batch boundary).
	End int64
	// NowMs and DeleteRetentionMs set and apply KIP-534 delete horizons.
	NowMs, DeleteRetentionMs int64
	// Aborted are the aborted transactions overlapping the inputs (their
	// entries may live in later segments' indexes).
	Aborted []AbortedTxn
	// TxnFloor: an ABORT marker of a transaction starting below it is kept
	// (its data may lie where this clean does not look, e.g. in object
	// storage below the local log); -1: none.
	TxnFloor int64
	// Retain holds the last offsets of batches kept even if no record of
	// theirs survives (each producer's last batches, so producer state
	// rebuilt from the log still sees them).
	Retain map[int64]bool
	// IndexIntervalBytes is the output's offset index spacing (default 4096).
	IndexIntervalBytes int64
	// Throttle, if set, is called with the bytes about to be read or
	// written.
	Throttle func(ctx context.Context, n int) error

	// tx, if set, is a tracker shared by the groups of one pass (so a
	// marker sees the batches of its transaction in earlier groups).
	tx *txnTracker
}

// CleanStats counts a clean's work.
type CleanStats struct {
	BytesRead, BytesWritten           int64
	BatchesIn, BatchesOut             int64
	RecordsIn, RecordsOut             int64
	BatchesRewritten, BatchesVerbatim int64
	// NextHorizonMs is the earliest delete horizon of a tombstone the
	// output keeps (0: none): a clean after it removes the tombstone even
	// with no new dirty data (Kafka's logsWithTombstonesExpired).
	NextHorizonMs int64
}

// Add adds o's counts to s (and keeps the earlier horizon).
func (s *CleanStats) Add(o CleanStats) {
	s.BytesRead += o.BytesRead
	s.BytesWritten += o.BytesWritten
	s.BatchesIn += o.BatchesIn
	s.BatchesOut += o.BatchesOut
	s.RecordsIn += o.RecordsIn
	s.RecordsOut += o.RecordsOut
	s.BatchesRewritten += o.BatchesRewritten
	s.BatchesVerbatim += o.BatchesVerbatim
	s.noteHorizon(o.NextHorizonMs)
}

func (s *CleanStats) noteHorizon(ms int64) {
	if ms > 0 && (s.NextHorizonMs == 0 || ms < s.NextHorizonMs) {
		s.NextHorizonMs = ms
	}
}

// CleanedSegment describes the output of CleanSegments: one segment
// covering [Base, Next) (its offsets may have gaps).
type CleanedSegment struct {
	Base, Next   int64
	Size         int64
	MaxTimestamp int64 // -1 if no batch
	// Aborted are the entries of its .txnindex: those of Aborted whose
	// marker it keeps.
	Aborted []AbortedTxn
	// Changed is false if the output is byte for byte its single input.
	Changed bool
	Stats   CleanStats
	index   *segmentIndex
}

// IndexFiles returns the output's .index and .timeindex files, flagged
// as a cleaned segment's.
func (c *CleanedSegment) IndexFiles() (index, timeIndex []byte) {
	m := indexMeta{base: c.Base, logSize: c.Size, next: c.Next, maxTs: c.MaxTimestamp, flags: indexFlagCleaned}
	return encodeIndex(indexKindOffset, m, c.index), encodeIndex(indexKindTime, m, c.index)
}

// txnTracker follows transactions through the batches of a clean, as
// Kafka's CleanedTransactionMetadata.
type txnTracker struct {
	pending   []AbortedTxn // by FirstOffset, not yet started
	aborted   map[int64]*abortedRun
	committed map[int64]bool
	floor     int64
}

type abortedRun struct {
	e    AbortedTxn
	seen bool // a batch of it was seen in this clean
}

// newTxnTracker tracks the transactions of batches read from offset from
// on: entries whose marker lies below it ended before.
func newTxnTracker(es []AbortedTxn, from, floor int64) *txnTracker {
	var p []AbortedTxn
	for _, e := range es {
		if e.LastOffset >= from {
			p = append(p, e)
		}
	}
	sort.SliceStable(p, func(i, j int) bool { return p[i].FirstOffset < p[j].FirstOffset })
	return &txnTracker{pending: p, aborted: map[int64]*abortedRun{}, committed: map[int64]bool{}, floor: floor}
}

func (t *txnTracker) upTo(off int64) {
	for len(t.pending) > 0 && t.pending[0].FirstOffset <= off {
		e := t.pending[0]
		t.aborted[e.ProducerID] = &abortedRun{e: e}
		t.pending = t.pending[1:]
	}
}

// onBatch reports whether the data batch h belongs to an aborted
// transaction.
func (t *txnTracker) onBatch(h *BatchHeader) bool {
	t.upTo(h.LastOffset())
	if !h.Transactional() {
		return false
	}
	if a := t.aborted[h.ProducerID]; a != nil {
		a.seen = true
		return true
	}
	t.committed[h.ProducerID] = true
	return false
}

// onControl reports whether the control batch h (type ct, -1 if it has no
// record) may go once its delete horizon passes: its transaction has no
// batch left in what this clean saw.
func (t *txnTracker) onControl(h *BatchHeader, ct int16) bool {
	t.upTo(h.LastOffset())
	if h.NumRecords == 0 {
		return true
	}
	switch ct {
	case ControlAbort:
		a := t.aborted[h.ProducerID]
		delete(t.aborted, h.ProducerID)
		return a == nil || !(a.seen || (t.floor >= 0 && a.e.FirstOffset < t.floor))
	case ControlCommit:
		c := t.committed[h.ProducerID]
		delete(t.committed, h.ProducerID)
		return !c
	}
	return false
}

// batchReader reads the batches of one input in large sequential reads.
type batchReader struct {
	in     SegmentFiles
	pos    int64
	next   int64
	buf    []byte
	bufPos int64
	n      int
	read   int64
}

func (r *batchReader) fill(ctx context.Context, need int64, th func(context.Context, int) error) error {
	if r.pos >= r.bufPos && r.pos+need <= r.bufPos+int64(r.n) {
		return nil
	}
	want := min(max(need, walkBufSize), r.in.Size-r.pos)
	if int64(cap(r.buf)) < want {
		r.buf = make([]byte, want)
	}
	if th != nil {
		if err := th(ctx, int(want)); err != nil {
			return err
		}
	}
	m, err := r.in.Log.ReadAt(r.buf[:want], r.pos)
	if int64(m) < want {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	r.read += want
	r.bufPos, r.n = r.pos, m
	return nil
}

// batch returns the next batch (nil at the end), checked: framing, CRC,
// ascending offsets inside [Base, Next).
func (r *batchReader) batch(ctx context.Context, th func(context.Context, int) error) ([]byte, BatchHeader, error) {
	if r.pos >= r.in.Size {
		return nil, BatchHeader{}, nil
	}
	bad := func(reason string) error {
		return &CorruptionError{Pos: r.pos, Reason: "clean input: " + reason}
	}
	if r.in.Size-r.pos < BatchHeaderSize {
		return nil, BatchHeader{}, bad("short batch header")
	}
	if err := r.fill(ctx, BatchHeaderSize, th); err != nil {
		return nil, BatchHeader{}, err
	}
	h, err := ParseBatchHeader(r.buf[r.pos-r.bufPos:])
	if err != nil {
		return nil, h, bad(err.Error())
	}
	if int64(h.Length) > r.in.Size-r.pos {
		return nil, h, bad("batch runs past the end")
	}
	if err := r.fill(ctx, int64(h.Length), th); err != nil {
		return nil, h, err
	}
	b := r.buf[r.pos-r.bufPos : r.pos-r.bufPos+int64(h.Length)]
	if !VerifyBatch(b, &h) {
		return nil, h, bad(fmt.Sprintf("crc mismatch in batch at offset %d", h.BaseOffset))
	}
	if err := checkCleanedFields(&h); err != nil {
		return nil, h, bad(err.Error())
	}
	if h.BaseOffset < r.next || h.NextOffset() > r.in.Next {
		return nil, h, bad(fmt.Sprintf("batch %d..%d out of order or outside [%d, %d)", h.BaseOffset, h.LastOffset(), r.next, r.in.Next))
	}
	r.next = h.NextOffset()
	r.pos += int64(h.Length)
	return b, h, nil
}

// batchWriter buffers the output's sequential writes.
type batchWriter struct {
	out     io.WriterAt
	buf     []byte
	pos     int64 // file position of buf[0]
	written int64
	th      func(context.Context, int) error
}

func (w *batchWriter) flush(ctx context.Context) error {
	if len(w.buf) == 0 {
		return nil
	}
	if w.th != nil {
		if err := w.th(ctx, len(w.buf)); err != nil {
			return err
		}
	}
	if _, err := w.out.WriteAt(w.buf, w.pos); err != nil {
		return err
	}
	w.pos += int64(len(w.buf))
	w.written += int64(len(w.buf))
	w.buf = w.buf[:0]
	return nil
}

func (w *batchWriter) write(ctx context.Context, b []byte) error {
	w.buf = append(w.buf, b...)
	if len(w.buf) >= walkBufSize {
		return w.flush(ctx)
	}
	return nil
}

// CleanSegments compacts inputs (consecutive segments, ascending) into one
// segment written to out from position 0, following Kafka's Cleaner and
// MemoryRecords.filterTo: for batches starting below cfg.End, records of
// aborted transactions go, a keyed record stays only if it is its key's
// latest (cfg.Map), a record without a key goes, a tombstone goes once its
// batch's delete horizon has passed, a control batch goes once its
// transaction has no batch left and its horizon has passed; a batch left
// with no records goes unless cfg.Retain holds it (then a bare header
// stays). Batches at or past End are copied as they are. A batch whose
// records all stay is copied byte for byte; one that changes keeps its
// base offset, last offset delta, producer fields and codec, and gets a
// new record count, max timestamp and CRC. A batch that holds a tombstone
// or a discardable marker and has no delete horizon gets one: NowMs +
// DeleteRetentionMs. It is the per-segment step of Partition.Clean, usable
// on any segment files (a bucket's copies too).
func CleanSegments(ctx context.Context, inputs []SegmentFiles, out io.WriterAt, cfg SegmentCleanConfig) (*CleanedSegment, error) {
	if len(inputs) == 0 {
		return nil, errors.New("log: clean of no segments")
	}
	c := newSegmentCleaner(inputs[0].Base, out, cfg)
	for _, in := range inputs {
		if err := c.add(ctx, in); err != nil {
			return nil, err
		}
	}
	return c.finish(ctx)
}

// segmentCleaner is CleanSegments one input at a time, so the caller can
// decide from the output's size whether the next segment joins it.
type segmentCleaner struct {
	cfg     SegmentCleanConfig
	res     *CleanedSegment
	tmp     *segment
	since   int64
	markers map[int64]AbortedTxn
	tx      *txnTracker
	w       *batchWriter
	inputs  int
}

func newSegmentCleaner(base int64, out io.WriterAt, cfg SegmentCleanConfig) *segmentCleaner {
	if cfg.IndexIntervalBytes <= 0 {
		cfg.IndexIntervalBytes = DefaultIndexIntervalBytes
	}
	c := &segmentCleaner{cfg: cfg, res: &CleanedSegment{Base: base, Next: base, MaxTimestamp: -1, index: &segmentIndex{}},
		tmp: newSegment("", base, time.Time{}), markers: map[int64]AbortedTxn{}, tx: newTxnTracker(cfg.Aborted, base, cfg.TxnFloor),
		w: &batchWriter{out: out, th: cfg.Throttle}}
	for _, e := range cfg.Aborted {
		c.markers[e.LastOffset] = e
	}
	if cfg.tx != nil {
		c.tx = cfg.tx
	}
	return c
}

// size is the output's size so far.
func (c *segmentCleaner) size() int64 { return c.w.pos + int64(len(c.w.buf)) }

func (c *segmentCleaner) emit(ctx context.Context, b []byte, h *BatchHeader) error {
	nh, err := ParseBatchHeader(b)
	if err != nil {
		return err
	}
	c.tmp.addToIndexLocked(c.res.index, &c.since, c.cfg.IndexIntervalBytes, c.size(), &nh)
	if nh.MaxTimestamp > c.tmp.maxTs.Load() {
		c.tmp.maxTs.Store(nh.MaxTimestamp)
	}
	if h.Control() {
		if e, ok := c.markers[h.LastOffset()]; ok {
			c.res.Aborted = append(c.res.Aborted, e)
		}
	}
	c.res.Stats.BatchesOut++
	c.res.Stats.RecordsOut += int64(nh.NumRecords)
	return c.w.write(ctx, b)
}

// add cleans the next input (it must start where the previous one ended).
func (c *segmentCleaner) add(ctx context.Context, in SegmentFiles) error {
	res, cfg := c.res, &c.cfg
	if in.Base != res.Next {
		return fmt.Errorf("log: clean input at %d does not follow %d", in.Base, res.Next)
	}
	c.inputs++
	res.Changed = res.Changed || c.inputs > 1
	r := &batchReader{in: in, next: in.Base, bufPos: -1}
	defer func() { res.Stats.BytesRead += r.read }()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, h, err := r.batch(ctx, cfg.Throttle)
		if err != nil {
			return err
		}
		if b == nil {
			break
		}
		res.Stats.BatchesIn++
		res.Stats.RecordsIn += int64(h.NumRecords)
		ct := int16(-1)
		if h.Control() && h.NumRecords > 0 && h.Codec() == CodecNone {
			ct = ControlType(b[BatchHeaderSize:])
		}
		if h.BaseOffset >= cfg.End {
			if h.Control() {
				c.tx.onControl(&h, ct)
			} else {
				c.tx.onBatch(&h)
			}
			res.Stats.BatchesVerbatim++
			if err := c.emit(ctx, b, &h); err != nil {
				return err
			}
			continue
		}
		nb, pending, err := cleanBatch(b, &h, ct, c.tx, cfg)
		if err != nil {
			return err
		}
		if nb != nil {
			res.Stats.noteHorizon(pending)
		}
		switch {
		case nb == nil:
			res.Changed = true
		case len(nb) == len(b) && &nb[0] == &b[0]:
			res.Stats.BatchesVerbatim++
			err = c.emit(ctx, b, &h)
		default:
			res.Changed = true
			res.Stats.BatchesRewritten++
			err = c.emit(ctx, nb, &h)
		}
		if err != nil {
			return err
		}
	}
	if r.pos != in.Size {
		return fmt.Errorf("log: clean input %d stopped at byte %d of %d", in.Base, r.pos, in.Size)
	}
	res.Next = in.Next
	return nil
}

// finish flushes the output and describes it.
func (c *segmentCleaner) finish(ctx context.Context) (*CleanedSegment, error) {
	if err := c.w.flush(ctx); err != nil {
		return nil, err
	}
	c.res.Size = c.w.written
	c.res.Stats.BytesWritten = c.w.written
	c.res.MaxTimestamp = c.tmp.maxTs.Load()
	var keep []AbortedTxn
	for _, e := range c.res.Aborted {
		if e.LastOffset >= c.res.Base && e.LastOffset < c.res.Next {
			keep = append(keep, e)
		}
	}
	c.res.Aborted = keep
	return c.res, nil
}

// cleanBatch decides one batch below the cleanable end: nil to drop it, b
// itself to keep it as it is, or its rewritten bytes; pending is the
// delete horizon of the tombstones it keeps, when a later clean can apply
// it (0: none).
func cleanBatch(b []byte, h *BatchHeader, ct int16, tx *txnTracker, cfg *SegmentCleanConfig) (_ []byte, pending int64, _ error) {
	var canDiscard bool
	if h.Control() {
		// Markers are kept for ever (Kafka removes them after
		// delete.retention.ms): a producer snapshot older than a removed
		// marker, or an ABORT whose transaction lies below the floor, would
		// reopen or misread its transaction at the next start. They cost a
		// batch header and one record each.
		tx.onControl(h, ct)
		return b, 0, nil
	}
	canDiscard = tx.onBatch(h)
	horizon, hasHorizon := h.DeleteHorizon()
	// Not while older data below the floor was not seen (tiered, or kept
	// by RewriteFrom): an older value of the key there would come back.
	horizonPassed := hasHorizon && horizon <= cfg.NowMs && cfg.TxnFloor < 0
	discardRecords := canDiscard
	if h.Control() {
		discardRecords = canDiscard && horizonPassed
	}
	retainEmpty := h.ProducerID >= 0 && cfg.Retain[h.LastOffset()]
	if discardRecords && !retainEmpty {
		return nil, 0, nil
	}
	recs, _, err := batchRecords(b, h)
	if err != nil {
		return nil, 0, err
	}
	kept := recs[:0:0]
	tombstones, mapped := false, false
	if !discardRecords {
		for _, r := range recs {
			keep := true
			if !h.Control() {
				off := h.BaseOffset + r.offDelta
				keep = r.key != nil && (cfg.Map == nil || off >= cfg.Map.Get(r.key)) && (r.hasValue || !horizonPassed)
				// A tombstone gets its horizon only from a clean that
				// mapped it: that clean removed every older value of its
				// key, wherever the log holds them. One that skipped the
				// key map (released before it was mapped) keeps no horizon
				// and stays.
				mapped = mapped || keep && !r.hasValue && cfg.Map != nil && cfg.Map.Get(r.key) == off
			}
			if keep {
				kept = append(kept, r)
				tombstones = tombstones || (!h.Control() && !r.hasValue)
			}
		}
	}
	needHorizon := !hasHorizon && (mapped || (canDiscard && h.Control()))
	hz := int64(-1)
	if needHorizon {
		hz = cfg.NowMs + cfg.DeleteRetentionMs
	}
	if tombstones && cfg.TxnFloor < 0 && (hasHorizon || needHorizon) {
		pending = max(hz, horizon, 1)
	}
	if len(kept) == int(h.NumRecords) && !needHorizon {
		return b, pending, nil
	}
	if len(kept) == 0 && !retainEmpty {
		return nil, 0, nil
	}
	nb, err := encodeCleanedBatch(b, h, kept, hz)
	return nb, pending, err
}
