package log

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Config is a partition's configuration, under Kafka's topic config names.
// Zero fields take the defaults shown.
type Config struct {
	SegmentBytes       int64 // segment.bytes, default 128 MiB (max 1 GiB)
	SegmentMs          int64 // segment.ms, default 1 h
	IndexIntervalBytes int64 // index.interval.bytes, default 4096
	MaxMessageBytes    int   // max.message.bytes, default 1048588 (Kafka's)
	RetentionBytes     int64 // retention.bytes, default -1 (no limit)
	RetentionMs        int64 // retention.ms, default 7 days; -1 = forever
	// ExactRetention takes RetentionBytes and RetentionMs as given: 0 is a
	// bound (Kafka's retention.ms=0 and retention.bytes=0 keep only the
	// active segment), not "the default".
	ExactRetention bool
}

// Defaults of Config, as Kafka's.
const (
	DefaultSegmentBytes       = 128 << 20
	DefaultSegmentMs          = int64(time.Hour / time.Millisecond)
	DefaultIndexIntervalBytes = 4096
	DefaultMaxMessageBytes    = 1048588
	DefaultRetentionMs        = int64(7 * 24 * time.Hour / time.Millisecond)
	maxSegmentBytes           = 1 << 30
)

func (c Config) withDefaults() Config {
	if c.SegmentBytes <= 0 {
		c.SegmentBytes = DefaultSegmentBytes
	}
	c.SegmentBytes = min(c.SegmentBytes, maxSegmentBytes)
	if c.SegmentMs <= 0 {
		c.SegmentMs = DefaultSegmentMs
	}
	// As a Duration (nanoseconds) it must not overflow: Long.MaxValue ms,
	// a valid segment.ms, would wrap negative and roll on every append.
	c.SegmentMs = min(c.SegmentMs, int64(math.MaxInt64/time.Millisecond))
	if c.IndexIntervalBytes <= 0 {
		c.IndexIntervalBytes = DefaultIndexIntervalBytes
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.RetentionBytes == 0 && !c.ExactRetention {
		c.RetentionBytes = -1
	}
	if c.RetentionMs == 0 && !c.ExactRetention {
		c.RetentionMs = DefaultRetentionMs
	}
	return c
}

// mark is a position in the log: an offset and where it lies on disk.
type mark struct {
	off int64
	seg *segment
	pos int64
}

// Partition is one partition's log: a directory of segments.
//
// Appends are serialized by mu (a single writer); readers never take mu: they
// use the atomically published segment list, high watermark and segment
// sizes, and read with pread at explicit positions.
type Partition struct {
	store  *Store
	dir    string
	logger *zap.Logger
	cfg    atomic.Pointer[Config]

	segs atomic.Pointer[[]*segment] // ascending by base; last is active
	leo  atomic.Int64
	// hw is the high watermark: what readers see. dur is the durable end;
	// the two are the same mark unless the partition is replicated
	// (replica.go), where hw is also bounded by the committed offset.
	hw  atomic.Pointer[mark]
	dur atomic.Pointer[mark]
	rep replicaState // replica.go
	// stableMark caches the position of the last read bound (stable.go).
	stableMark atomic.Pointer[mark]
	logStart   atomic.Int64
	failed     atomic.Pointer[StorageError]
	syncMu     sync.Mutex // one fsync of the active file at a time (fsyncActive)
	notify     atomic.Pointer[chan struct{}]
	waiting    atomic.Bool  // someone holds the current notify channel
	wokeAt     atomic.Int64 // when wake last closed a notify channel: nanoseconds since clockStart

	mu         sync.Mutex
	active     *segment
	activeH    *handle // pinned while the active segment has unsynced bytes
	sinceIndex int64
	dirty      bool // registered with the syncer
	closed     bool

	// ds is the store's syncfs handle on the file system holding dir (nil:
	// none); syncEpoch its error epoch as of p's last verified sync.
	ds        *devSync
	syncEpoch atomic.Uint64

	cleaner cleanerState // cleaner.go

	// During a batch open (OpenPartitions): fsyncs left for the batch.
	deferSync     bool
	pendingDirs   []string
	pendingActive bool
}

// AppendResult describes an appended batch.
type AppendResult struct {
	BaseOffset     int64
	LastOffset     int64
	LogStartOffset int64
	Header         BatchHeader // as stored (BaseOffset patched)
}

// Dir returns the partition directory.
func (p *Partition) Dir() string { return p.dir }

// Config returns the current configuration (defaults applied).
func (p *Partition) Config() Config { return *p.cfg.Load() }

// SetConfig replaces the configuration; it applies to later appends and
// retention passes.
func (p *Partition) SetConfig(c Config) {
	c = c.withDefaults()
	p.cfg.Store(&c)
}

// LogStartOffset is the first offset readable.
func (p *Partition) LogStartOffset() int64 { return p.logStart.Load() }

// LogEndOffset is the offset the next append gets.
func (p *Partition) LogEndOffset() int64 { return p.leo.Load() }

// HighWatermark is the end of what readers may see: the durable end under the
// durable policy, the log end under the interval policy.
func (p *Partition) HighWatermark() int64 { return p.hw.Load().off }

// Err returns the latched storage error, or nil while the partition is online.
func (p *Partition) Err() error {
	if e := p.failed.Load(); e != nil {
		return e
	}
	return nil
}

// Notify returns a channel closed the next time the high watermark moves (or
// the partition fails or closes). Load it before checking the state it
// guards, then wait on it.
func (p *Partition) Notify() <-chan struct{} {
	p.waiting.Store(true)
	return *p.notify.Load()
}

// wake closes the notify channel if anyone took it. The state change it
// announces must be stored before wake is called: a Notify that misses this
// wake then sees the new state.
func (p *Partition) wake() {
	if !p.waiting.Swap(false) {
		return
	}
	ch := make(chan struct{})
	old := p.notify.Swap(&ch)
	p.wokeAt.Store(int64(time.Since(clockStart)))
	close(*old)
}

// clockStart anchors wokeAt to the monotonic clock.
var clockStart = time.Now()

// WokeAt is when the last wake-up closed a notify channel (for measuring how
// long a waiter took to run again); the zero time if none has.
func (p *Partition) WokeAt() time.Time {
	n := p.wokeAt.Load()
	if n == 0 {
		return time.Time{}
	}
	return clockStart.Add(time.Duration(n))
}

// setHWLocked publishes a new high watermark and wakes waiters. p.mu held.
func (p *Partition) setHWLocked(m mark) {
	if d := p.dur.Load(); d != nil && m.off <= d.off {
		return
	}
	if p.rep.on.Load() {
		p.dur.Store(&m)
		p.publishLocked()
		p.wake() // replica fetches wait on the durable end
		return
	}
	// The high watermark first: a WaitDurable that sees the durable end
	// returns, and its caller (a transaction's end, answered once its
	// markers are durable) must find them below the high watermark too.
	p.hw.Store(&m)
	p.dur.Store(&m)
	p.wake()
}

// setMarksLocked sets both the durable end and the high watermark to m
// (open, rebase, truncation). p.mu held or p not yet shared.
func (p *Partition) setMarksLocked(m mark) {
	p.dur.Store(&m)
	p.hw.Store(&m)
	p.rep.leoMark.Store(&m)
}

// failLocked latches a storage error: the partition goes offline.
func (p *Partition) failLocked(op string, err error) error {
	se := p.latch(op, err)
	if se.Op == "fsync" { // the latched failure: a trim's fsync latches as "fsync" first
		p.markUnsyncedLocked()
	}
	p.wake()
	return se
}

// markUnsyncedLocked records, after a failed fsync, how much of the active
// segment is known durable (see partitionState.Unsynced). Best effort: the
// restart that needs it reads through the same page cache.
func (p *Partition) markUnsyncedLocked() {
	size := int64(0)
	if d := p.dur.Load(); d.seg == p.active {
		size = d.pos
	}
	st := partitionState{LogStartOffset: p.logStart.Load(), Unsynced: &durableEnd{Base: p.active.base, Size: size}}
	if err := writeState(p.store.fs, p.dir, st); err != nil {
		p.logger.Error("record the durable end after a failed fsync", zap.Error(err))
	}
}

// latch records the partition's storage error (the first one stays) and
// returns the one recorded. It needs no lock: fsyncActive latches before
// anyone else can fsync.
func (p *Partition) latch(op string, err error) *StorageError {
	se := &StorageError{Op: op, Err: err}
	if !p.failed.CompareAndSwap(nil, se) {
		return p.failed.Load()
	}
	p.logger.Error("partition offline", zap.String("op", op), zap.Error(err))
	return se
}

// fsyncActive fsyncs the active segment's file f, one caller at a time,
// and latches a failure before the next caller's fsync can run. Linux
// reports a writeback error to one fsync only: a second one running beside
// it (the syncer's and a roll's, or Close's) would return success for pages
// that never reached the disk, and advance the high watermark over them.
// Lock order: p.mu (if held) before syncMu.
func (p *Partition) fsyncActive(f File) error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	if e := p.failed.Load(); e != nil {
		return e
	}
	if err := f.Sync(); err != nil {
		return p.latch("fsync", err)
	}
	return nil
}

// Append validates one v2 RecordBatch (bytes exactly as a client sent them),
// assigns its offsets by patching baseOffset in place and writes it with one
// write. It does not wait for durability: call WaitDurable with
// res.LastOffset+1 for that. batch is modified (baseOffset) and must not be
// changed by the caller while Append runs.
func (p *Partition) Append(batch []byte) (AppendResult, error) {
	cfg := p.cfg.Load()
	h, err := CheckBatch(batch, cfg.MaxMessageBytes)
	if err != nil {
		return AppendResult{}, err
	}
	return p.appendChecked(batch, h, cfg, false)
}

// AppendReplica appends a batch of another replica's log (a cluster
// follower copying its leader) at the offset it has there: its baseOffset,
// at or past the log end. A cleaned leader's batches may start past the
// end of the one before and hold fewer records than their offset range
// (none at all: a header kept for producer state), as the cleaner writes
// them. The first such batch in a segment marks the segment as one with
// gaps before it is written (the cleaner checkpoint, fsync'd), so a
// recovery walks it as it walks a cleaned segment. max.message.bytes is
// the leader's to apply: the batch is not held to it here.
func (p *Partition) AppendReplica(batch []byte) (AppendResult, error) {
	h, err := checkBatch(batch, 0, checkCleanedFields)
	if err != nil {
		return AppendResult{}, err
	}
	return p.appendChecked(batch, h, p.cfg.Load(), true)
}

// errReplicaOverlap: AppendReplica of a batch below the log end.
var errReplicaOverlap = errors.New("log: replicated batch starts below the log end")

func (p *Partition) appendChecked(batch []byte, h BatchHeader, cfg *Config, replica bool) (AppendResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return AppendResult{}, ErrClosed
	}
	if e := p.failed.Load(); e != nil {
		return AppendResult{}, e
	}
	seg := p.active
	base := p.leo.Load()
	gap := false
	if replica {
		if h.BaseOffset < base {
			return AppendResult{}, fmt.Errorf("%w: batch at %d, log end %d", errReplicaOverlap, h.BaseOffset, base)
		}
		gap = h.BaseOffset > base || int64(h.NumRecords) != int64(h.LastOffsetDelta)+1
		base = h.BaseOffset
	}
	if base > math.MaxInt64-int64(h.LastOffsetDelta)-1 {
		return AppendResult{}, fmt.Errorf("%w: offsets exhausted", ErrInvalidBatch)
	}
	size := seg.size.Load()
	if size > 0 && (size+int64(len(batch)) > cfg.SegmentBytes ||
		p.store.now().Sub(seg.created) >= time.Duration(cfg.SegmentMs)*time.Millisecond ||
		base+int64(h.LastOffsetDelta)-seg.base > math.MaxUint32-1) {
		if err := p.rollLocked(); err != nil {
			return AppendResult{}, err
		}
		seg, size = p.active, 0
	}
	if replica && base+int64(h.LastOffsetDelta)-seg.base > math.MaxUint32-1 {
		return AppendResult{}, fmt.Errorf("%w: replicated batch at %d is too far past its segment's base %d", ErrInvalidBatch, base, seg.base)
	}
	if gap && !seg.cleaned.Load() {
		if err := p.writeCleanerCheckpoint(p.cleaner.firstDirty.Load(), seg.base+1); err != nil {
			if re := asResource("write cleaner checkpoint", err); re != nil {
				return AppendResult{}, re
			}
			return AppendResult{}, p.failLocked("write cleaner checkpoint", err)
		}
		seg.cleaned.Store(true)
	}
	if p.activeH == nil {
		hd, err := p.store.cache.acquire(seg, mayWait)
		if err != nil {
			if re := asResource("open segment", err); re != nil {
				return AppendResult{}, re // short of descriptors: nothing written, retriable
			}
			return AppendResult{}, p.failLocked("open segment", err)
		}
		p.activeH = hd
	}
	if p.store.opts.Preallocate {
		p.preallocateLocked(seg, size+int64(len(batch)), cfg.SegmentBytes)
	}
	PatchBaseOffset(batch, base)
	h.BaseOffset = base
	if _, err := p.activeH.f.WriteAt(batch, size); err != nil {
		if re := asResource("write", err); re != nil {
			// Disk full (or short of memory): cut back whatever part of
			// the batch landed, so the file ends where the log does, and
			// refuse this batch only. If the cut fails, the bytes past
			// size are unknown: offline, as for any failed write.
			if terr := p.activeH.f.Truncate(size); terr == nil {
				return AppendResult{}, re
			}
		}
		// The bytes on disk past size are unknown now; recovery on the next
		// open truncates them. Nothing is retried.
		return AppendResult{}, p.failLocked("write", err)
	}
	end := size + int64(len(batch))
	if len(batch) >= writebackMin && p.store.Durable() {
		startWriteback(p.activeH.f, size, int64(len(batch)))
	}
	seg.mu.Lock()
	seg.addToIndexLocked(seg.idx, &p.sinceIndex, cfg.IndexIntervalBytes, size, &h)
	seg.markVerifiedLocked(size, end)
	seg.mu.Unlock()
	next := h.NextOffset()
	if h.MaxTimestamp > seg.maxTs.Load() {
		seg.maxTs.Store(h.MaxTimestamp)
	}
	seg.next.Store(next)
	seg.size.Store(end)
	p.leo.Store(next)
	if p.rep.on.Load() {
		p.rep.leoMark.Store(&mark{off: next, seg: seg, pos: end})
		p.wakeReplicas()
	}
	if !p.store.Durable() {
		p.setHWLocked(mark{off: next, seg: seg, pos: end})
	}
	if !p.dirty {
		p.dirty = true
		p.store.syncer.markDirty(p)
	}
	return AppendResult{BaseOffset: base, LastOffset: h.LastOffset(), LogStartOffset: p.logStart.Load(), Header: h}, nil
}

// writebackMin is the smallest append whose writeback starts at once
// (startWriteback) under the durable policy: a large batch is mostly on
// the disk by the time its group commit's fdatasync runs.
const writebackMin = 128 << 10

// Preallocation steps: a segment is preallocated after preallocAfter
// appends, by steps that double from preallocMin to preallocMax (so the
// space reserved ahead is at most about what was written, and at most
// preallocMax per partition).
const (
	preallocAfter = 8
	preallocMin   = 1 << 20
	preallocMax   = 16 << 20
)

// preallocateLocked makes sure seg's file is allocated past end (the end of
// the batch about to be written). A failure (disk full, unsupported) only
// means no preallocation: the append grows the file as it would anyway.
// p.mu held.
func (p *Partition) preallocateLocked(seg *segment, end, segmentBytes int64) {
	seg.appends++
	if end <= seg.alloc || seg.appends < preallocAfter || seg.noPrealloc {
		return
	}
	want := min(end+min(max(seg.alloc, preallocMin), preallocMax), max(segmentBytes, end))
	// Even a failed fallocate may have extended the file: trimming must
	// look at want either way.
	seg.alloc = want
	if err := allocate(p.activeH.f, want); err != nil {
		seg.noPrealloc = true // unsupported or no space: not again for this segment
	}
}

// trimLocked cuts seg's file back to its batches if it was preallocated
// past them, before the segment is sealed or its partition closed (a
// sealed file, an uploaded object and a clean close's size all end at the
// last batch), and fsyncs the cut if sync. seg is the active segment. p.mu
// held.
func (p *Partition) trimLocked(seg *segment, sync bool) error {
	if seg.alloc <= seg.size.Load() {
		return nil
	}
	h, err := p.store.cache.acquire(seg, mayWait)
	if err != nil {
		return err
	}
	defer p.store.cache.release(h)
	if err := h.f.Truncate(seg.size.Load()); err != nil {
		return err
	}
	if sync {
		if err := p.fsyncActive(h.f); err != nil {
			return err
		}
	}
	seg.alloc = 0
	return nil
}

// WaitDurable blocks until every offset below off is durable (fsync'd, and
// the segment's directory entry too), sharing fsyncs with concurrent callers.
// Under the interval policy it returns at once. It returns the latched
// storage error if the partition fails first.
func (p *Partition) WaitDurable(off int64) error {
	for {
		if p.dur.Load().off >= off {
			return nil
		}
		// Checked at every turn: a truncation or a reset (another
		// goroutine's) may cut the log below off while this waits, and
		// no round would ever make off durable.
		if leo := p.leo.Load(); off > leo {
			return fmt.Errorf("%w: wait for %d beyond log end %d", ErrOffsetOutOfRange, off, leo)
		}
		if e := p.failed.Load(); e != nil {
			return e
		}
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return ErrClosed
		}
		if p.store.syncer.commit() && p.wokeAt.Load() != 0 && time.Since(p.WokeAt()) < time.Millisecond {
			// This round woke readers waiting at the log end (a tail
			// consumer's long poll): let them run before this producer's
			// answer is written, so the record reaches the consumer as
			// soon as it is durable.
			runtime.Gosched()
		}
	}
}

// syncNow is one group-commit step for p: fsync what was written so far
// (outside the lock), then advance the high watermark to it.
func (p *Partition) syncNow() {
	var epoch uint64
	if p.ds != nil {
		epoch = p.ds.epoch.Load()
	}
	p.sync(false)
	if p.ds != nil && p.failed.Load() == nil {
		p.syncEpoch.Store(epoch) // verified by its own fsync as of epoch
	}
}

// sync implements syncNow; final is Close's last flush, which runs after
// closed is set (so no append can race it).
func (p *Partition) sync(final bool) {
	st, ok := p.syncBegin(final)
	if !ok {
		return
	}
	var err error
	if st.h != nil {
		err = p.fsyncActive(st.h.f)
	}
	p.syncEnd(st, err)
}

// syncStep is what one sync of a partition makes durable: the log end as
// of its start, and the active file (nil if nothing is unsynced).
type syncStep struct {
	target mark
	h      *handle
	truncs uint64 // p.rep.truncs at the start
}

// syncBegin snapshots what a sync covers, taking a reference on the active
// file; ok is false if there is nothing to do (closed or offline).
func (p *Partition) syncBegin(final bool) (syncStep, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dirty = false
	if (p.closed && !final) || p.failed.Load() != nil {
		return syncStep{}, false
	}
	st := syncStep{target: mark{off: p.leo.Load(), seg: p.active, pos: p.active.size.Load()}, h: p.activeH, truncs: p.rep.truncs.Load()}
	if st.h != nil {
		p.store.cache.ref(st.h)
	}
	// The active segment's directory entry is durable already: open and
	// every roll fsync the directory before a segment takes writes.
	return st, true
}

// syncEnd publishes a sync's outcome: err is the fsync's (or nil once the
// bytes are known durable another way, syncfs).
func (p *Partition) syncEnd(st syncStep, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err != nil:
		p.failLocked("fsync", err)
	case p.failed.Load() != nil:
		// Another fsync of this file failed meanwhile (this one's success
		// may cover pages that one lost): no high watermark move.
		p.wake()
	case st.truncs != p.rep.truncs.Load():
		// Truncated meanwhile: the target may lie in the part cut away.
	default:
		p.setHWLocked(st.target)
	}
	if h := st.h; h != nil {
		p.store.cache.release(h)
		if p.activeH == h && p.leo.Load() == st.target.off {
			p.store.cache.release(h) // fully synced: unpin
			p.activeH = nil
		}
	}
}

// rollLocked seals the active segment and starts a new one at the log end.
// The old segment is fsync'd first, so every segment but the last is always
// wholly durable: recovery only ever has to scan the last one. The new
// segment's directory entry is made durable before the roll returns (one
// SyncDir covering it, the old segment's and the index files'): a segment
// reported sealed (SealedSegments: tiering uploads it and commits it to a
// manifest) must still be sealed after a power loss, not come back as the
// active segment and grow past what the bucket holds of it.
func (p *Partition) rollLocked() error {
	old := p.active
	if err := p.trimLocked(old, true); err != nil {
		if re := asResource("trim segment", err); re != nil {
			return re
		}
		return p.failLocked("trim segment", err)
	}
	if p.activeH != nil {
		if err := p.fsyncActive(p.activeH.f); err != nil {
			return p.failLocked("fsync", err)
		}
	}
	// The aborted-transaction index is not derived from the log alone: a
	// failed fsync of it is a failed fsync of the log.
	if err := p.syncTxnLocked(old); err != nil {
		return p.failLocked("fsync", err)
	}
	// Index files are derived data, validated on open and rebuilt if torn;
	// they are fsync'd here (their directory entries with the new segment's)
	// so that opening after a crash does not have to rebuild them.
	if err := writeIndexes(p.store.fs, old, true); err != nil {
		p.logger.Warn("write index", zap.Int64("base_offset", old.base), zap.Error(err))
	}
	seg := newSegment(p.dir, p.leo.Load(), p.store.now())
	seg.idx = &segmentIndex{}
	// Short of a resource here, nothing has changed yet: the old segment
	// stays active (fsync'd, indexes written) and the roll is tried again
	// by the next append. A new segment file left behind empty is truncated
	// by that retry, or found empty at the log end after a crash.
	f, err := p.store.fs.OpenFile(seg.logPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		if re := asResource("create segment", err); re != nil {
			return re
		}
		return p.failLocked("create segment", err)
	}
	f.Close()
	if err := p.store.fs.SyncDir(p.dir); err != nil {
		if re := openRefused("fsync dir", err); re != nil {
			// Nothing refers to the new file yet: remove it, or a later
			// roll at another offset would leave it behind as a segment
			// that does not join up.
			p.store.fs.Remove(seg.logPath)
			return re
		}
		return p.failLocked("fsync dir", err)
	}
	p.setHWLocked(mark{off: old.next.Load(), seg: old, pos: old.size.Load()})
	old.sealed.Store(true)
	if p.activeH != nil {
		p.store.cache.release(p.activeH)
		p.activeH = nil
	}
	segs := append(append([]*segment(nil), *p.segs.Load()...), seg)
	p.segs.Store(&segs)
	p.active = seg
	p.sinceIndex = 0
	if p.store.opts.OnSeal != nil {
		p.store.opts.OnSeal()
	}
	return nil
}

// writeIndexes writes seg's offset and time index files from memory,
// fsync'ing them if sync is set.
func writeIndexes(fs FS, seg *segment, sync bool) error {
	seg.mu.RLock()
	ix := seg.idx
	seg.mu.RUnlock()
	if ix == nil {
		return nil
	}
	m := indexMeta{base: seg.base, logSize: seg.size.Load(), next: seg.next.Load(), maxTs: seg.maxTs.Load()}
	if seg.cleaned.Load() {
		m.flags = indexFlagCleaned
	}
	for _, w := range []struct {
		path string
		kind byte
	}{{seg.indexPath(), indexKindOffset}, {seg.timeIndexPath(), indexKindTime}} {
		f, err := fs.OpenFile(w.path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		_, err = f.WriteAt(encodeIndex(w.kind, m, ix), 0)
		if err == nil && sync {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Sync fsyncs everything appended so far and advances the high watermark, as
// a group-commit round would.
func (p *Partition) Sync() error {
	p.syncNow()
	return p.Err()
}

// Close flushes and closes the partition: fsync, write the active segment's
// indexes and a clean-shutdown record so the next open skips the tail scan.
// Appends and durability waits that race Close get ErrClosed.
func (p *Partition) Close() error { return p.closeWith(nil) }

// closeWith is Close; with a batch (Store.CloseBatch) nothing is fsync'd
// here and the clean-close record is staged in it, to be made durable with
// the batch's.
func (p *Partition) closeWith(b *closeBatch) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	p.mu.Unlock()
	if b == nil {
		p.sync(true)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.store.forget(p)
	defer func() {
		p.waiting.Store(true) // wake unconditionally: nobody may sleep on a closed partition
		p.wake()
	}()
	if p.activeH != nil {
		p.store.cache.release(p.activeH)
		p.activeH = nil
	}
	segs := *p.segs.Load()
	defer func() {
		for _, seg := range segs {
			p.store.cache.drop(seg)
		}
	}()
	if e := p.failed.Load(); e != nil {
		return e
	}
	seg := p.active
	if err := p.trimLocked(seg, b == nil); err != nil {
		// No clean-close record: the next open scans the segment and
		// cuts the preallocated zeros.
		return err
	}
	if err := writeIndexes(p.store.fs, seg, b == nil); err != nil {
		return err
	}
	if b == nil { // a batch's syncfs covers them
		if err := p.syncAllTxnLocked(); err != nil {
			return err
		}
	}
	st := partitionState{LogStartOffset: p.logStart.Load(), Clean: &cleanState{
		Base: seg.base, Size: seg.size.Load(), Next: seg.next.Load(), MaxTimestamp: seg.maxTs.Load()}}
	if b != nil {
		st.Version = 1
		data, err := json.Marshal(st)
		if err != nil {
			return err
		}
		b.add(filepath.Join(p.dir, stateFile), data, p)
		return nil
	}
	return writeState(p.store.fs, p.dir, st)
}
