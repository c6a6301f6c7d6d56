package log

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"
)

// The log cleaner (compaction, cleanup.policy=compact): see doc.go for the
// rules and the crash-safe swap.

const (
	cleanerCheckpointFile = "cleaner.checkpoint"
	cleanedExt            = ".cleaned"
	swapExt               = ".swap"
	// DefaultDeleteRetention is Kafka's delete.retention.ms.
	DefaultDeleteRetention = 24 * time.Hour
)

// errSegmentReplaced: the segment was swapped out by the cleaner; the
// caller takes the segment list again.
var errSegmentReplaced = errors.New("log: segment replaced by the cleaner")

// ErrCleanRaced means the segments changed while a clean ran (retention,
// an upload's local deletion, a new aborted transaction): nothing was
// swapped; clean again.
var ErrCleanRaced = errors.New("log: segments changed during the clean")

// cleanerCheckpoint is the partition's cleaner-offset checkpoint
// (cleaner.checkpoint, written by WriteFileAtomic).
type cleanerCheckpoint struct {
	Version int `json:"version"`
	// FirstDirty is the offset the next clean starts its key map at (Kafka's
	// cleaner-offset-checkpoint), written after a clean's swaps.
	FirstDirty int64 `json:"first_dirty"`
	// CleanedBelow: segments starting below it may have been written by
	// the cleaner (offset gaps allowed). Raised before a swap commits, so
	// it covers every cleaned segment even if index files are lost.
	CleanedBelow int64 `json:"cleaned_below"`
	// NextHorizonMs is the earliest delete horizon of a tombstone the last
	// clean kept (0: none): once it passes, a clean runs even with no new
	// dirty data, so tombstones go on time.
	NextHorizonMs int64 `json:"next_horizon_ms,omitempty"`
}

type cleanerState struct {
	mu           sync.Mutex // one clean at a time
	ckMu         sync.Mutex // one checkpoint write at a time
	firstDirty   atomic.Int64
	cleanedBelow atomic.Int64
	horizon      atomic.Int64 // the checkpoint's NextHorizonMs
	last         atomic.Pointer[CleanResult]
}

func readCleanerCheckpoint(fsys FS, dir string) (cleanerCheckpoint, error) {
	var ck cleanerCheckpoint
	b, err := readIndexFile(fsys, filepath.Join(dir, cleanerCheckpointFile))
	if errors.Is(err, fs.ErrNotExist) {
		return ck, nil
	}
	if err != nil {
		return ck, err
	}
	if err := json.Unmarshal(b, &ck); err != nil || ck.Version != 1 {
		return cleanerCheckpoint{}, &CorruptionError{Path: filepath.Join(dir, cleanerCheckpointFile), Reason: "unreadable cleaner checkpoint"}
	}
	return ck, nil
}

// writeCleanerCheckpoint writes the checkpoint. cleaned_below never goes
// down: a clean and a replica's append with a gap (AppendReplica) may both
// raise it.
func (p *Partition) writeCleanerCheckpoint(firstDirty, cleanedBelow int64) error {
	p.cleaner.ckMu.Lock()
	defer p.cleaner.ckMu.Unlock()
	cleanedBelow = max(cleanedBelow, p.cleaner.cleanedBelow.Load())
	b, err := json.Marshal(cleanerCheckpoint{Version: 1, FirstDirty: firstDirty, CleanedBelow: cleanedBelow, NextHorizonMs: p.cleaner.horizon.Load()})
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(p.store.fs, filepath.Join(p.dir, cleanerCheckpointFile), b); err != nil {
		return err
	}
	p.cleaner.firstDirty.Store(firstDirty)
	p.cleaner.cleanedBelow.Store(cleanedBelow)
	return nil
}

// CleanConfig configures Partition.Clean.
type CleanConfig struct {
	// Now is the clock (default: the store's).
	Now func() time.Time
	// DeleteRetention is delete.retention.ms: how long a tombstone, or a
	// transaction marker with nothing left of its transaction, stays after
	// the clean that first saw it (its KIP-534 delete horizon). 0 takes
	// DefaultDeleteRetention; negative means none.
	DeleteRetention time.Duration
	// MinCompactionLag is min.compaction.lag.ms: the cleanable range ends
	// at the first segment holding a batch younger than it.
	MinCompactionLag time.Duration
	// KeyMap is the dedupe buffer to use (a cleaner thread's, reused); nil
	// allocates one of KeyMapBytes (default DefaultKeyMapBytes, Kafka's
	// log.cleaner.dedupe.buffer.size).
	KeyMap      *KeyMap
	KeyMapBytes int
	// Throttle, if set, is called with the bytes about to be read or
	// written (see RateThrottle).
	Throttle func(ctx context.Context, n int) error
	// SegmentBytes caps a merged segment (default: the partition's
	// segment.bytes).
	SegmentBytes int64
	// StableOffset returns the last stable offset (the first offset of the
	// oldest open transaction): nothing at or past it is cleaned. nil: the
	// high watermark.
	StableOffset func() int64
	// RewriteFrom, if positive, keeps local segments starting below it as
	// they are (the tier's: segments the bucket already holds). Their keys
	// still count, and the checkpoint moves past them.
	RewriteFrom int64
	// Below, if set, cleans what lies below the local log (the tier's
	// segments) with the same key map, after the map is built and before
	// any local segment is rewritten: end is where the map stops, retain
	// the batches producers need. With it the clean sees the whole log, so
	// tombstones may go from local segments too (without it, an older
	// value below could outlive its tombstone). Its error ends the clean.
	Below func(ctx context.Context, km *KeyMap, end int64, retain map[int64]bool) (CleanStats, error)
}

// RateThrottle adapts a limiter (bytes per second) to CleanConfig.Throttle.
func RateThrottle(l *rate.Limiter) func(ctx context.Context, n int) error {
	return func(ctx context.Context, n int) error {
		for n > 0 {
			k := min(n, max(l.Burst(), 1))
			if err := l.WaitN(ctx, k); err != nil {
				return err
			}
			n -= k
		}
		return nil
	}
}

// CleanResult reports a clean.
type CleanResult struct {
	// FirstDirty and End bound the dirty range whose keys were mapped;
	// everything below End is clean afterwards.
	FirstDirty, End int64
	// Partial: the key map filled before the cleanable end (End is where).
	Partial                 bool
	SegmentsIn, SegmentsOut int
	Stats                   CleanStats
	DirtyRatioBefore        float64
	DirtyRatioAfter         float64
	Start, Finish           time.Time
}

// DeleteHorizonDue reports whether a tombstone the last clean kept has
// reached its delete horizon: a clean now removes it, dirty data or not.
func (p *Partition) DeleteHorizonDue(now time.Time) bool {
	hz := p.cleaner.horizon.Load()
	return hz > 0 && hz <= now.UnixMilli()
}

// LastClean returns the result of the last clean that swapped anything
// or moved the checkpoint (nil if none in this process).
func (p *Partition) LastClean() *CleanResult { return p.cleaner.last.Load() }

// FirstDirtyOffset is the cleaner checkpoint clamped to the local log.
func (p *Partition) FirstDirtyOffset() int64 {
	segs := p.segments()
	if len(segs) == 0 {
		return p.leo.Load()
	}
	return max(p.cleaner.firstDirty.Load(), segs[0].base, p.logStart.Load())
}

// CleanableDirtyRatio is Kafka's cleanable ratio: dirty bytes (from the
// checkpoint to the active segment) over the bytes of the whole cleanable
// range (the local log start to the active segment). A segment holding the
// checkpoint counts pro rata by offsets.
func (p *Partition) CleanableDirtyRatio() (ratio float64, dirtyBytes, cleanableBytes int64) {
	segs := p.segments()
	if len(segs) < 2 {
		return 0, 0, 0
	}
	first := p.FirstDirtyOffset()
	for _, seg := range segs[:len(segs)-1] {
		size, next := seg.size.Load(), seg.next.Load()
		cleanableBytes += size
		switch {
		case seg.base >= first:
			dirtyBytes += size
		case next > first:
			dirtyBytes += int64(float64(size) * float64(next-first) / float64(next-seg.base))
		}
	}
	if cleanableBytes == 0 {
		return 0, 0, 0
	}
	return float64(dirtyBytes) / float64(cleanableBytes), dirtyBytes, cleanableBytes
}

// Clean compacts the partition's sealed segments (Kafka's Cleaner.clean):
// it maps the latest offset of every key in the dirty range [checkpoint,
// end) (end: the active segment, the stable offset, min.compaction.lag;
// earlier if the key map fills), then rewrites every local segment below
// end, grouped so that a group's bytes stay within SegmentBytes, each
// group into one new segment swapped in crash-safely (doc.go), and moves
// the checkpoint to end. Offsets never change. Reads in flight keep the
// old files. The partition stays online when a clean fails before a swap
// commits; a failure after (removing or renaming files) takes it offline
// and the next open completes the swap.
func (p *Partition) Clean(ctx context.Context, cfg CleanConfig) (CleanResult, error) {
	p.cleaner.mu.Lock()
	defer p.cleaner.mu.Unlock()
	if cfg.Now == nil {
		cfg.Now = p.store.now
	}
	switch {
	case cfg.DeleteRetention == 0:
		cfg.DeleteRetention = DefaultDeleteRetention
	case cfg.DeleteRetention < 0:
		cfg.DeleteRetention = 0
	}
	if cfg.SegmentBytes <= 0 {
		cfg.SegmentBytes = p.cfg.Load().SegmentBytes
	}
	now := cfg.Now()
	res := CleanResult{Start: now}
	res.DirtyRatioBefore, _, _ = p.CleanableDirtyRatio()

	p.mu.Lock()
	if err := p.usableLocked(); err != nil {
		p.mu.Unlock()
		return res, err
	}
	segs := *p.segs.Load()
	hw := p.hw.Load().off
	p.mu.Unlock()
	sealed := segs[:len(segs)-1]
	first := p.FirstDirtyOffset()
	end := min(segs[len(segs)-1].base, hw)
	if cfg.StableOffset != nil {
		end = min(end, cfg.StableOffset())
	}
	if cfg.MinCompactionLag > 0 {
		lagTs := now.Add(-cfg.MinCompactionLag).UnixMilli()
		for _, seg := range sealed {
			if seg.next.Load() > first && seg.maxTs.Load() > lagTs {
				end = min(end, seg.base)
				break
			}
		}
	}
	res.FirstDirty, res.End = first, end
	// No new dirty data, but a kept tombstone's horizon has passed: a pass
	// over the clean range (an empty key map) removes it.
	horizonDue := false
	if hz := p.cleaner.horizon.Load(); end <= first && hz > 0 && hz <= now.UnixMilli() && (len(sealed) > 0 || cfg.Below != nil) {
		horizonDue, end, res.End = true, first, first
	}
	if !horizonDue && (end <= first || len(sealed) == 0) {
		res.End = first
		res.DirtyRatioAfter = res.DirtyRatioBefore
		return res, nil
	}
	// Aborted transactions of the whole cleanable range.
	aborted, err := p.AbortedTxns(nil, segs[0].base, segs[len(segs)-1].base)
	if err != nil {
		return res, err
	}
	km := cfg.KeyMap
	if km == nil {
		if cfg.KeyMapBytes <= 0 {
			cfg.KeyMapBytes = DefaultKeyMapBytes
		}
		km = NewKeyMap(cfg.KeyMapBytes)
	} else {
		km.Clear()
	}
	mapEnd, read, err := end, int64(0), error(nil)
	if !horizonDue {
		mapEnd, read, err = p.buildKeyMap(ctx, sealed, first, end, aborted, km, cfg.Throttle)
	}
	res.Stats.BytesRead += read
	if err != nil {
		return res, err
	}
	if mapEnd < end {
		res.Partial, end, res.End = true, mapEnd, mapEnd
	}
	retain, err := p.producerLastBatches()
	if err != nil {
		return res, err
	}
	floor := int64(-1)
	if p.logStart.Load() < segs[0].base {
		floor = segs[0].base // data below the local log (tiered) was not seen
	}
	if cfg.Below != nil {
		st, err := cfg.Below(ctx, km, end, retain)
		res.Stats.Add(st)
		if err != nil {
			return res, err
		}
		floor = -1 // it was: cleaned with this map
	}
	// Groups: consecutive sealed segments starting below end, merged
	// while the cleaned output and the next input fit in SegmentBytes.
	var cands []*segment
	for _, seg := range sealed {
		if seg.base < end && seg.base >= cfg.RewriteFrom {
			cands = append(cands, seg)
		}
	}
	if len(cands) == 0 {
		p.cleaner.horizon.Store(res.Stats.NextHorizonMs)
		if err := p.writeCleanerCheckpoint(end, p.cleaner.cleanedBelow.Load()); err != nil {
			return res, err
		}
		res.Finish = cfg.Now()
		res.DirtyRatioAfter, _, _ = p.CleanableDirtyRatio()
		r := res
		p.cleaner.last.Store(&r)
		return res, nil
	}
	if cands[0].base > segs[0].base {
		floor = max(floor, cands[0].base) // segments kept by RewriteFrom are not seen either
	}
	spec := SegmentCleanConfig{Map: km, End: end, NowMs: now.UnixMilli(), DeleteRetentionMs: cfg.DeleteRetention.Milliseconds(),
		Aborted: aborted, TxnFloor: floor, Retain: retain, IndexIntervalBytes: p.cfg.Load().IndexIntervalBytes, Throttle: cfg.Throttle,
		tx: newTxnTracker(aborted, cands[0].base, floor)}
	for i := 0; i < len(cands); {
		n, st, swapped, err := p.cleanGroup(ctx, cands[i:], spec, cfg.SegmentBytes)
		res.Stats.Add(st)
		res.SegmentsIn += n
		if err != nil {
			return res, err
		}
		if swapped {
			res.SegmentsOut++
		} else {
			res.SegmentsOut += n
		}
		i += n
	}
	p.cleaner.horizon.Store(res.Stats.NextHorizonMs)
	if err := p.writeCleanerCheckpoint(end, p.cleaner.cleanedBelow.Load()); err != nil {
		return res, err
	}
	res.Finish = cfg.Now()
	res.DirtyRatioAfter, _, _ = p.CleanableDirtyRatio()
	r := res
	p.cleaner.last.Store(&r)
	return res, nil
}

// buildKeyMap maps the keys of [first, end) into km (Kafka's
// buildOffsetMap), skipping control batches and aborted transactions. It
// returns where it stopped: end, or the first batch that did not fit.
func (p *Partition) buildKeyMap(ctx context.Context, sealed []*segment, first, end int64, aborted []AbortedTxn, km *KeyMap, th func(context.Context, int) error) (int64, int64, error) {
	var tx *txnTracker
	var read int64
	for _, seg := range sealed {
		if seg.next.Load() <= first {
			continue
		}
		if seg.base >= end {
			break
		}
		if tx == nil {
			tx = newTxnTracker(aborted, seg.base, -1)
		}
		h, err := p.store.cache.acquire(seg, mayWait)
		if err != nil {
			return first, read, err
		}
		r := &batchReader{in: SegmentFiles{Base: seg.base, Next: seg.next.Load(), Log: h.f, Size: seg.size.Load()}, next: seg.base, bufPos: -1}
		stop, err := func() (int64, error) {
			defer p.store.cache.release(h)
			defer func() { read += r.read }()
			for {
				if err := ctx.Err(); err != nil {
					return 0, err
				}
				b, bh, err := r.batch(ctx, th)
				if err != nil {
					if ce, ok := err.(*CorruptionError); ok {
						ce.Path = seg.logPath
					}
					return 0, err
				}
				if b == nil || bh.BaseOffset >= end {
					return -1, nil
				}
				if bh.Control() {
					tx.onControl(&bh, ControlType(b[BatchHeaderSize:]))
					continue
				}
				if tx.onBatch(&bh) || bh.LastOffset() < first {
					continue
				}
				if km.Len()+int(bh.NumRecords) > km.Capacity() {
					if bh.BaseOffset <= first {
						return 0, fmt.Errorf("log: the cleaner's key map (%d keys) cannot hold the %d records of batch %d", km.Capacity(), bh.NumRecords, bh.BaseOffset)
					}
					return bh.BaseOffset, nil
				}
				recs, _, err := batchRecords(b, &bh)
				if err != nil {
					return 0, err
				}
				for _, rec := range recs {
					if rec.key != nil {
						km.Put(rec.key, bh.BaseOffset+rec.offDelta)
					}
				}
			}
		}()
		if err != nil || stop >= 0 {
			return stop, read, err
		}
	}
	return end, read, nil
}

// producerLastBatches returns the last offsets of the batches each
// producer id must keep: its last data batch and, if its last batch is a
// control batch, that one too (Kafka keeps the batch of a producer's last
// sequence and its last marker so producer state survives cleaning).
func (p *Partition) producerLastBatches() (map[int64]bool, error) {
	type last struct{ data, ctl int64 }
	m := map[int64]*last{}
	segs := p.segments()
	if len(segs) == 0 {
		return nil, nil
	}
	err := p.ScanHeaders(segs[0].base, func(h *BatchHeader) bool {
		if h.ProducerID < 0 {
			return true
		}
		l := m[h.ProducerID]
		if l == nil {
			l = &last{data: -1, ctl: -1}
			m[h.ProducerID] = l
		}
		if h.Control() {
			l.ctl = h.LastOffset()
		} else {
			l.data, l.ctl = h.LastOffset(), -1
		}
		return true
	})
	out := make(map[int64]bool, 2*len(m))
	for _, l := range m {
		if l.data >= 0 {
			out[l.data] = true
		}
		if l.ctl >= 0 {
			out[l.ctl] = true
		}
	}
	return out, err
}

// cleanGroup cleans the first segments of cands, as many as fit in
// segBytes, into one and swaps it in. n is how many it took; swapped is
// false if nothing changed (they stay as they are).
func (p *Partition) cleanGroup(ctx context.Context, cands []*segment, spec SegmentCleanConfig, segBytes int64) (n int, _ CleanStats, swapped bool, _ error) {
	fsys := p.store.fs
	base := cands[0].base
	stem := segmentName(p.dir, base, "")
	var hs []*handle
	defer func() {
		for _, h := range hs {
			p.store.cache.release(h)
		}
	}()
	removeCleaned := func() {
		for _, ext := range []string{".log", ".index", ".timeindex", txnIndexExt} {
			fsys.Remove(stem + ext + cleanedExt)
		}
	}
	f, err := fsys.OpenFile(stem+".log"+cleanedExt, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 1, CleanStats{}, false, err
	}
	c := newSegmentCleaner(base, f, spec)
	var g []*segment
	err = func() error {
		for _, seg := range cands {
			if len(g) > 0 && (c.size()+seg.size.Load() > segBytes || seg.next.Load()-base > math.MaxUint32-1) {
				break
			}
			h, err := p.store.cache.acquire(seg, mayWait)
			if err != nil {
				return err
			}
			hs = append(hs, h)
			g = append(g, seg)
			// Readers holding the old segment must not load its index or
			// aborted-transaction files by path after the swap: load now.
			if _, err := p.segmentIndex(seg, h); err != nil {
				return err
			}
			if st := seg.txn.Load(); st != nil {
				if _, err := p.txnEntries(seg, st); err != nil {
					return err
				}
			}
			if err := c.add(ctx, SegmentFiles{Base: seg.base, Next: seg.next.Load(), Log: h.f, Size: seg.size.Load()}); err != nil {
				if ce, ok := err.(*CorruptionError); ok {
					ce.Path = seg.logPath
				}
				return err
			}
		}
		return nil
	}()
	n = max(len(g), 1)
	var out *CleanedSegment
	if err == nil {
		out, err = c.finish(ctx)
	}
	if err == nil && out.Changed {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil || !out.Changed {
		removeCleaned()
		if err != nil {
			return n, CleanStats{}, false, err
		}
		return n, out.Stats, false, nil
	}
	next := out.Next
	var aborted []AbortedTxn
	for _, e := range spec.Aborted {
		if e.LastOffset >= base && e.FirstOffset < next {
			aborted = append(aborted, e)
		}
	}
	ix, tix := out.IndexFiles()
	files := []struct {
		ext  string
		data []byte
	}{{".index", ix}, {".timeindex", tix}}
	if len(out.Aborted) > 0 {
		files = append(files, struct {
			ext  string
			data []byte
		}{txnIndexExt, EncodeAbortedTxns(nil, out.Aborted)})
	}
	for _, w := range files {
		if err := writeFileSync(fsys, stem+w.ext+cleanedExt, w.data); err != nil {
			removeCleaned()
			return n, out.Stats, false, err
		}
	}
	// Segments starting below cleaned_below may have gaps: raised before
	// the commit, so a recovery that must rebuild indexes knows.
	if cb := p.cleaner.cleanedBelow.Load(); cb < next {
		if err := p.writeCleanerCheckpoint(p.cleaner.firstDirty.Load(), next); err != nil {
			removeCleaned()
			return n, out.Stats, false, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.swapLocked(g, out, len(out.Aborted) > 0, aborted); err != nil {
		removeCleaned()
		return n, out.Stats, false, err
	}
	p.logger.Info("cleaned segments", zap.Int64("base_offset", base), zap.Int64("next_offset", next),
		zap.Int("segments", len(g)), zap.Int64("bytes_in", out.Stats.BytesRead), zap.Int64("bytes_out", out.Size))
	return n, out.Stats, true, nil
}

func writeFileSync(fsys FS, name string, data []byte) error {
	f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(data, 0)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// swapLocked replaces the segments g by the cleaned one whose files are
// <base>.*.cleaned. p.mu held. Before the commit (the rename of the .log to
// .swap and its directory fsync) a failure changes nothing; after it, a
// failure takes the partition offline (the next open completes the swap).
func (p *Partition) swapLocked(g []*segment, out *CleanedSegment, hasTxn bool, aborted []AbortedTxn) error {
	if err := p.usableLocked(); err != nil {
		return err
	}
	segs := *p.segs.Load()
	i := sort.Search(len(segs), func(i int) bool { return segs[i].base >= g[0].base })
	if i+len(g) >= len(segs) {
		return ErrCleanRaced
	}
	for k, seg := range g {
		if segs[i+k] != seg {
			return ErrCleanRaced
		}
	}
	now, err := p.AbortedTxns(nil, out.Base, segs[len(segs)-1].base)
	if err != nil {
		return err
	}
	var mine []AbortedTxn
	for _, e := range now {
		if e.LastOffset >= out.Base && e.FirstOffset < out.Next {
			mine = append(mine, e)
		}
	}
	if len(mine) != len(aborted) {
		return ErrCleanRaced
	}
	for k := range mine {
		if mine[k] != aborted[k] {
			return ErrCleanRaced
		}
	}
	fsys := p.store.fs
	stem := segmentName(p.dir, out.Base, "")
	exts := []string{".index", ".timeindex"}
	if hasTxn {
		exts = append(exts, txnIndexExt)
	}
	undo := func() {
		for _, ext := range exts {
			fsys.Remove(stem + ext + swapExt)
		}
	}
	for _, ext := range exts {
		if err := fsys.Rename(stem+ext+cleanedExt, stem+ext+swapExt); err != nil {
			undo()
			return err
		}
	}
	if err := fsys.SyncDir(p.dir); err != nil {
		undo()
		return err
	}
	// The commit point.
	if err := fsys.Rename(stem+".log"+cleanedExt, stem+".log"+swapExt); err != nil {
		undo()
		return err
	}
	if err := fsys.SyncDir(p.dir); err != nil {
		// Either state is a valid log for the next open; this one cannot
		// tell which it will find.
		return p.failLocked("fsync dir", err)
	}
	// The new segment, served from the .swap file until it has its name.
	ns := newSegment(p.dir, out.Base, p.store.now())
	ns.size.Store(out.Size)
	ns.next.Store(out.Next)
	ns.maxTs.Store(out.MaxTimestamp)
	ns.idx = out.index
	ns.sealed.Store(true)
	ns.cleaned.Store(true)
	if out.Size > 0 {
		ns.markVerifiedLocked(0, out.Size)
	}
	if hasTxn {
		st := &segTxn{disk: int64(len(out.Aborted)) * txnEntrySize}
		es := append([]AbortedTxn(nil), out.Aborted...)
		st.entries.Store(&es)
		ns.txn.Store(st)
	}
	f, err := p.store.cache.openFile(stem+".log"+swapExt, os.O_RDONLY, false)
	if err != nil {
		return p.failLocked("open cleaned segment", err)
	}
	nh := p.store.cache.install(ns, f)
	defer p.store.cache.release(nh)
	rest := append(append(append([]*segment(nil), segs[:i]...), ns), segs[i+len(g):]...)
	p.segs.Store(&rest)
	p.stableMark.Store(nil)
	for _, m := range []*atomic.Pointer[mark]{&p.hw, &p.dur, &p.rep.leoMark} {
		if cur := m.Load(); cur.seg != nil && cur.seg.base >= out.Base && cur.seg.base < out.Next {
			m.Store(&mark{off: cur.off, seg: ns, pos: out.Size})
		}
	}
	for _, seg := range g {
		seg.replaced.Store(true)
		p.store.cache.drop(seg)
	}
	// Old files out, new names in: .log last (recovery keys on it).
	var paths []string
	for _, seg := range g[1:] {
		paths = append(paths, seg.indexPath(), seg.timeIndexPath(), seg.txnIndexPath(), seg.logPath)
	}
	if !hasTxn {
		paths = append(paths, g[0].txnIndexPath())
	}
	for _, path := range paths {
		if err := fsys.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return p.failLocked("remove cleaned segment", err)
		}
	}
	// The removals durable before the renames: recovery takes a missing
	// .index.swap to mean the old segments are gone.
	if err := fsys.SyncDir(p.dir); err != nil {
		return p.failLocked("fsync dir", err)
	}
	for _, ext := range append(exts, ".log") {
		if err := fsys.Rename(stem+ext+swapExt, stem+ext); err != nil {
			return p.failLocked("rename cleaned segment", err)
		}
	}
	if err := fsys.SyncDir(p.dir); err != nil {
		return p.failLocked("fsync dir", err)
	}
	return nil
}

// recoverCleaner finishes or undoes an interrupted swap at open: .cleaned
// files were never committed and go; a <base>.log.swap is a committed
// swap, completed (the segments it replaces removed, then the .swap files
// renamed); index .swap files without their .log.swap go. It reports
// whether it changed the directory.
func (p *Partition) recoverCleaner(names []string) (bool, error) {
	fsys := p.store.fs
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	committed := map[string]bool{} // stems with a .log.swap
	for _, n := range names {
		if stem, ok := strings.CutSuffix(n, ".log"+swapExt); ok {
			if _, ok := parseSegmentName(stem+".log", ".log"); ok {
				committed[stem] = true
			}
		}
	}
	changed := false
	remove := func(name string) error {
		if err := fsys.Remove(filepath.Join(p.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		changed = true
		return nil
	}
	for _, n := range names {
		if strings.HasSuffix(n, cleanedExt) {
			if err := remove(n); err != nil {
				return changed, err
			}
		} else if stem, ok := strings.CutSuffix(n, swapExt); ok && !strings.HasSuffix(stem, ".log") {
			if !committed[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(stem, ".index"), ".timeindex"), txnIndexExt)] {
				if err := remove(n); err != nil {
					return changed, err
				}
			}
		}
	}
	stems := make([]string, 0, len(committed))
	for s := range committed {
		stems = append(stems, s)
	}
	sort.Strings(stems)
	for _, stem := range stems {
		base, _ := parseSegmentName(stem+".log", ".log")
		if have[stem+".index"+swapExt] {
			// The old segments may not all be gone yet.
			next, err := p.swapNext(stem, base)
			if err != nil {
				return changed, err
			}
			for _, n := range names {
				if b, ok := parseSegmentName(n, ".log"); ok && b > base && b < next {
					s := strings.TrimSuffix(n, ".log")
					for _, ext := range []string{".index", ".timeindex", txnIndexExt, ".log"} {
						if err := remove(s + ext); err != nil {
							return changed, err
						}
					}
				}
			}
			if !have[stem+txnIndexExt+swapExt] {
				if err := remove(stem + txnIndexExt); err != nil {
					return changed, err
				}
			}
		}
		for _, ext := range []string{".index", ".timeindex", txnIndexExt, ".log"} {
			if have[stem+ext+swapExt] {
				if err := fsys.Rename(filepath.Join(p.dir, stem+ext+swapExt), filepath.Join(p.dir, stem+ext)); err != nil {
					return changed, err
				}
				changed = true
			}
		}
		p.logger.Info("completed an interrupted cleaner swap", zap.Int64("base_offset", base))
	}
	if changed {
		if err := fsys.SyncDir(p.dir); err != nil {
			return changed, err
		}
	}
	return changed, nil
}

// swapNext is the end of the offsets a committed swap replaces, from its
// index header (fsync'd before the commit); failing that, from its log.
func (p *Partition) swapNext(stem string, base int64) (int64, error) {
	if b, err := readIndexFile(p.store.fs, filepath.Join(p.dir, stem+".index"+swapExt)); err == nil {
		if m, _, err := decodeIndex(b, indexKindOffset, base); err == nil {
			return m.next, nil
		}
	}
	f, err := p.store.fs.OpenFile(filepath.Join(p.dir, stem+".log"+swapExt), os.O_RDONLY, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return 0, err
	}
	res, err := walkSegment(f, 0, size, base, true, nil)
	return res.next, err
}
