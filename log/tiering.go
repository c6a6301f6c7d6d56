package log

import (
	"fmt"
	"os"
)

// What the tiering layer needs from a partition: the sealed segments to
// upload, a way to drop local copies once they are safe in object storage
// (without moving the log start), and a way to start an empty partition at
// the offsets a restore finds in the bucket.

// SegmentInfo describes a sealed segment.
type SegmentInfo struct {
	Base, Next    int64 // first offset, offset after the last batch
	Size          int64 // bytes of the .log
	MaxTimestamp  int64
	LogPath       string
	IndexPath     string
	TimeIndexPath string
	// TxnIndexPath is the segment's aborted-transaction index ("" if it
	// has none; its entries: Partition.SegmentAbortedTxns).
	TxnIndexPath string
	// Cleaned: written by the log cleaner (its offsets may have gaps).
	Cleaned bool
}

// LocalStartOffset is the first offset held in local segments; below it (and
// at or above LogStartOffset) data is in the tiered store.
func (p *Partition) LocalStartOffset() int64 {
	segs := p.segments()
	if len(segs) == 0 {
		return p.leo.Load()
	}
	return max(segs[0].base, p.logStart.Load())
}

// SegmentCount returns the number of local segments (the active one too).
func (p *Partition) SegmentCount() int { return len(p.segments()) }

// SealedSegments lists the sealed (immutable, durable) local segments, oldest
// first. Their files are complete: data, offset index and time index.
func (p *Partition) SealedSegments() []SegmentInfo {
	segs := p.segments()
	if len(segs) == 0 {
		return nil
	}
	out := make([]SegmentInfo, 0, len(segs)-1)
	for _, seg := range segs[:len(segs)-1] {
		out = append(out, SegmentInfo{
			Base: seg.base, Next: seg.next.Load(), Size: seg.size.Load(), MaxTimestamp: seg.maxTs.Load(),
			LogPath: seg.logPath, IndexPath: seg.indexPath(), TimeIndexPath: seg.timeIndexPath(), Cleaned: seg.cleaned.Load(),
		})
		if seg.txn.Load() != nil {
			out[len(out)-1].TxnIndexPath = seg.txnIndexPath()
		}
	}
	return out
}

// OpenSegmentFile opens a sealed segment's file (log or index) for reading
// through the partition's file system.
func (p *Partition) OpenSegmentFile(path string) (File, error) {
	return p.store.fs.OpenFile(path, os.O_RDONLY, 0)
}

// DeleteLocalBefore removes local segments wholly below offset (never the
// active one) without moving the log start: the tiering layer calls it once
// those segments are durable in object storage. It returns how many went.
func (p *Partition) DeleteLocalBefore(offset int64) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return 0, err
	}
	segs := *p.segs.Load()
	n := 0
	for n < len(segs)-1 && segs[n].next.Load() <= offset {
		n++
	}
	if n == 0 {
		return 0, nil
	}
	// Checkpoint the log start first: without it, an open after a crash
	// would take the first remaining local segment as the start of the log
	// and hide everything in the tiered store.
	if err := p.setLogStartLocked(p.logStart.Load()); err != nil {
		return 0, err
	}
	return n, p.deleteSegmentsLocked(func(seg *segment) bool { return seg.next.Load() <= offset })
}

// Roll seals the active segment now if it holds data, so it can be uploaded
// (a graceful stop offloads everything).
func (p *Partition) Roll() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	if p.active.size.Load() == 0 {
		return nil
	}
	return p.rollLocked()
}

// Rebase moves an empty partition to start at next, with the log start at
// logStart (<= next): a restore from object storage, where offsets below
// next are served from the bucket.
func (p *Partition) Rebase(next, logStart int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	segs := *p.segs.Load()
	if len(segs) != 1 || p.active.size.Load() != 0 || logStart > next || logStart < 0 {
		return fmt.Errorf("log: rebase of a partition that is not empty (or bad offsets %d, %d)", next, logStart)
	}
	if err := writeState(p.store.fs, p.dir, partitionState{LogStartOffset: logStart}); err != nil {
		return err
	}
	if next != p.active.base {
		// Old empty segment out first, new one in second: a crash in between
		// leaves no segment (open creates an empty one at the checkpointed
		// log start) or just the new one, never two that do not join up. The
		// caller (the broker's restore) rebases any still-empty partition
		// again on the next start.
		old := p.active
		if p.activeH != nil {
			p.store.cache.release(p.activeH)
			p.activeH = nil
		}
		p.store.cache.drop(old)
		if err := p.store.fs.Remove(old.logPath); err != nil {
			return err
		}
		p.store.fs.Remove(old.indexPath())
		p.store.fs.Remove(old.timeIndexPath())
		p.store.fs.Remove(old.txnIndexPath())
		if err := p.store.fs.SyncDir(p.dir); err != nil {
			return err
		}
		seg := newSegment(p.dir, next, p.store.now())
		seg.idx = &segmentIndex{}
		f, err := p.store.fs.OpenFile(seg.logPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		f.Close()
		if err := p.store.fs.SyncDir(p.dir); err != nil {
			return err
		}
		ns := []*segment{seg}
		p.segs.Store(&ns)
		p.active = seg
		p.sinceIndex = 0
		p.leo.Store(next)
	}
	p.logStart.Store(logStart)
	p.setMarksLocked(mark{off: next, seg: p.active, pos: 0})
	p.rep.committed.Store(min(p.rep.committed.Load(), next))
	p.wake()
	return nil
}

// LocalBytes is the size of the partition's local segments.
func (p *Partition) LocalBytes() int64 {
	var n int64
	for _, seg := range p.segments() {
		n += seg.size.Load()
	}
	return n
}
