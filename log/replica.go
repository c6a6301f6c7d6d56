package log

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"

	"go.uber.org/zap"
)

// Replication support (cluster mode). A replicated partition has two ends:
// the durable end (what this broker has fsync'd, which a follower reports
// to its leader and a leader serves to followers) and the high watermark,
// which is also bounded by the committed offset the replication protocol
// sets (Commit): what every in-sync replica holds. Readers and the layers
// above (tiering, the cleaner, DeleteRecords) only ever see below the high
// watermark. A follower whose log diverged from its leader's cuts it back
// with TruncateTo, which never goes below the high watermark.

// replicaState is a partition's replication state.
type replicaState struct {
	on        atomic.Bool
	committed atomic.Int64
	// truncs counts truncations: a sync begun before one publishes nothing
	// (its target may lie in the part cut away).
	truncs atomic.Uint64
	// leoMark is the log end as a position, set at every append: what a
	// leader serves its followers, before its own fsync (the follower's
	// fsync runs beside it; the high watermark still waits for both).
	leoMark atomic.Pointer[mark]
	// notify wakes replica fetches at every append (Notify wakes readers
	// when the high watermark moves).
	notify  atomic.Pointer[chan struct{}]
	waiting atomic.Bool
}

// ReplicaNotify returns a channel closed at the next append (or
// truncation): what a leader's answer to a follower waits on.
func (p *Partition) ReplicaNotify() <-chan struct{} {
	p.rep.waiting.Store(true)
	if ch := p.rep.notify.Load(); ch != nil {
		return *ch
	}
	return p.Notify() // not replicated
}

func (p *Partition) wakeReplicas() {
	if !p.rep.waiting.Swap(false) {
		return
	}
	ch := make(chan struct{})
	if old := p.rep.notify.Swap(&ch); old != nil {
		close(*old)
	}
}

// ErrBelowHighWatermark: a truncation would remove committed records.
var ErrBelowHighWatermark = errors.New("log: truncation below the high watermark")

// SetReplicated puts the partition under replication with committed as
// the committed offset: the high watermark becomes min(committed, durable
// end) at once (it may go down: a broker that restarts does not know what
// its replicas hold). Call it before the partition serves reads.
func (p *Partition) SetReplicated(committed int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	ch := make(chan struct{})
	p.rep.notify.Store(&ch)
	p.rep.leoMark.Store(&mark{off: p.leo.Load(), seg: p.active, pos: p.active.size.Load()})
	p.rep.on.Store(true)
	committed = max(committed, p.logStart.Load())
	p.rep.committed.Store(committed)
	d := p.dur.Load()
	if committed >= d.off {
		p.hw.Store(d)
		return nil
	}
	m, err := p.findMark(committed)
	if err != nil {
		return err
	}
	p.hw.Store(&m)
	p.stableMark.Store(nil)
	return nil
}

// Replicated reports whether SetReplicated was called.
func (p *Partition) Replicated() bool { return p.rep.on.Load() }

// DurableEnd is the offset below which every record is durable here.
func (p *Partition) DurableEnd() int64 { return p.dur.Load().off }

// Committed is the committed offset last set (SetReplicated, Commit).
func (p *Partition) Committed() int64 { return p.rep.committed.Load() }

// Commit raises the committed offset to off (never lowers it) and with it
// the high watermark, up to the durable end. off must be a batch boundary
// (a replica's reported end is one).
func (p *Partition) Commit(off int64) error {
	if off <= p.rep.committed.Load() && off <= p.hw.Load().off {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	if off > p.rep.committed.Load() {
		p.rep.committed.Store(off)
	}
	return p.publishLocked()
}

// publishLocked moves the high watermark to min(committed, durable end),
// rounded down to a batch boundary (a batch is visible whole or not at
// all). p.mu held.
func (p *Partition) publishLocked() error {
	d := p.dur.Load()
	target := min(p.rep.committed.Load(), d.off)
	if target <= p.hw.Load().off {
		return nil
	}
	m := *d
	if target < d.off {
		segs := p.segments()
		i := sort.Search(len(segs), func(i int) bool { return segs[i].base > target }) - 1
		if i < 0 {
			return nil
		}
		pos, base, err := p.cutPoint(segs[i], target)
		if err != nil {
			return err
		}
		if base <= p.hw.Load().off {
			return nil
		}
		m = mark{off: base, seg: segs[i], pos: pos}
	}
	p.hw.Store(&m)
	p.wake()
	return nil
}

// Truncations counts TruncateTo and ResetTo calls that changed the log: an
// acknowledgement waited for across one may be for records cut away.
func (p *Partition) Truncations() uint64 { return p.rep.truncs.Load() }

// ResetTo empties the log and starts it again at next, with the log start
// there too: a follower whose whole log lies below its leader's log start
// (retention or DeleteRecords moved it) starts over from the leader's. next
// must be at least the log end.
func (p *Partition) ResetTo(next int64) error {
	return p.ResetToAt(next, next)
}

// ResetToAt is ResetTo with the log start at logStart (<= next): with
// tiering, offsets [logStart, next) are in the bucket (a follower behind
// its leader's local log starts over where the bucket's log ends).
func (p *Partition) ResetToAt(next, logStart int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	if next < p.leo.Load() || logStart > next || logStart < 0 {
		return fmt.Errorf("log: reset to %d (log start %d) below the log end %d", next, logStart, p.leo.Load())
	}
	if err := p.resetLocked(next, logStart); err != nil {
		return err
	}
	p.rep.committed.Store(max(p.rep.committed.Load(), next))
	p.wake()
	return nil
}

// Wipe removes every record and starts the log over, empty, at offset 0:
// a broker that is no longer one of the partition's replicas frees its
// disk, and if it is made one again it copies the leader's log from its
// start (a fetch from 0 is told where that is). Unlike ResetTo, the
// offsets go back: only for a log nobody reads or waits on. The cleaner
// checkpoint goes too (a clean running meanwhile may still write its own,
// which at worst leaves the first dirty offset past the new log end: less
// is cleaned, nothing is lost).
func (p *Partition) Wipe() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	p.cleaner.ckMu.Lock()
	err := p.store.fs.Remove(filepath.Join(p.dir, cleanerCheckpointFile))
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		p.cleaner.firstDirty.Store(0)
		p.cleaner.cleanedBelow.Store(0)
		err = nil
	}
	p.cleaner.ckMu.Unlock()
	if err != nil {
		return p.failLocked("wipe", err)
	}
	if err := p.resetLocked(0, 0); err != nil {
		return err
	}
	p.rep.committed.Store(0)
	p.wake()
	return nil
}

// resetLocked replaces every segment with one empty segment at next, the
// log start at logStart, and moves every mark there. p.mu held.
func (p *Partition) resetLocked(next, logStart int64) error {
	fsys := p.store.fs
	if err := writeState(fsys, p.dir, partitionState{LogStartOffset: logStart}); err != nil {
		return p.failLocked("reset", err)
	}
	p.logStart.Store(logStart)
	p.rep.truncs.Add(1)
	if p.activeH != nil {
		p.store.cache.release(p.activeH)
		p.activeH = nil
	}
	segs := *p.segs.Load()
	for j := len(segs) - 1; j >= 0; j-- {
		d := segs[j]
		d.replaced.Store(true)
		p.store.cache.drop(d)
		for _, path := range []string{d.logPath, d.indexPath(), d.timeIndexPath(), d.txnIndexPath()} {
			if err := fsys.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return p.failLocked("reset", err)
			}
		}
	}
	seg := newSegment(p.dir, next, p.store.now())
	seg.idx = &segmentIndex{}
	f, err := fsys.OpenFile(seg.logPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return p.failLocked("reset", err)
	}
	f.Close()
	if err := fsys.SyncDir(p.dir); err != nil {
		return p.failLocked("reset", err)
	}
	ns := []*segment{seg}
	p.segs.Store(&ns)
	p.active = seg
	p.sinceIndex = 0
	p.leo.Store(next)
	p.setMarksLocked(mark{off: next, seg: seg, pos: 0})
	p.stableMark.Store(nil)
	p.logger.Info("log reset", zap.Int64("to", next), zap.Int("segments_removed", len(segs)))
	return nil
}

// ReadReplica is Read bounded by the log end instead of the high
// watermark: what a leader serves its followers, durable here or not (the
// high watermark counts this broker's durable end too).
func (p *Partition) ReadReplica(offset, maxBytes int64) (*ReadResult, error) {
	if !p.rep.on.Load() {
		return p.readTo(&p.dur, offset, maxBytes, true, maxInt64)
	}
	return p.readTo(&p.rep.leoMark, offset, maxBytes, true, maxInt64)
}

const maxInt64 = 1<<63 - 1

// TruncateTo cuts the log back so that it ends before off: the batch
// holding off and every later one are removed (Kafka's truncation: a cut
// inside a batch takes the whole batch). It returns the new log end. It
// never cuts below the high watermark (ErrBelowHighWatermark) nor below
// the local log start.
//
// Crash safety: the clean-close record goes first, then later segments
// (last first), then the cut of the segment holding off; a crash at any
// point leaves a prefix of the old log that reopens by a scan, and the
// replication protocol truncates it again.
func (p *Partition) TruncateTo(off int64) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return 0, err
	}
	leo := p.leo.Load()
	if off >= leo {
		return leo, nil
	}
	segs := *p.segs.Load()
	if off < segs[0].base {
		return 0, fmt.Errorf("%w: truncate to %d below the local log start %d", ErrOffsetOutOfRange, off, segs[0].base)
	}
	i := sort.Search(len(segs), func(i int) bool { return segs[i].base > off }) - 1
	seg := segs[i]
	pos, cut, err := p.cutPoint(seg, off)
	if err != nil {
		return 0, err
	}
	if pos == 0 && i > 0 {
		// The cut is at the start of seg: the previous segment ends there.
		i--
		seg = segs[i]
		pos, cut = seg.size.Load(), seg.next.Load()
	}
	if cut < p.hw.Load().off {
		return 0, fmt.Errorf("%w: truncate to %d (batch at %d) below %d", ErrBelowHighWatermark, off, cut, p.hw.Load().off)
	}
	fsys := p.store.fs
	// From here a failure leaves the files in an unknown state: offline
	// (the next open scans and the protocol truncates again).
	if err := writeState(fsys, p.dir, partitionState{LogStartOffset: p.logStart.Load()}); err != nil {
		return 0, p.failLocked("truncate", err)
	}
	p.rep.truncs.Add(1)
	if p.activeH != nil {
		p.store.cache.release(p.activeH)
		p.activeH = nil
	}
	drop := segs[i+1:]
	for j := len(drop) - 1; j >= 0; j-- {
		d := drop[j]
		d.replaced.Store(true)
		p.store.cache.drop(d)
		for _, path := range []string{d.logPath, d.indexPath(), d.timeIndexPath(), d.txnIndexPath()} {
			if err := fsys.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return 0, p.failLocked("truncate", err)
			}
		}
	}
	if len(drop) > 0 {
		// The removals are durable before the cut: after a power loss the
		// segments past it must not come back behind a shorter one.
		if err := fsys.SyncDir(p.dir); err != nil {
			return 0, p.failLocked("truncate", err)
		}
	}
	if pos < seg.size.Load() || seg.alloc > 0 {
		f, err := fsys.OpenFile(seg.logPath, os.O_RDWR, 0)
		if err != nil {
			return 0, p.failLocked("truncate", err)
		}
		err = f.Truncate(pos)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return 0, p.failLocked("truncate", err)
		}
	}
	if seg.sealed.Load() {
		// Active again: its index files describe the old end; the active
		// segment's are written at the next seal or clean close.
		for _, path := range []string{seg.indexPath(), seg.timeIndexPath()} {
			if err := fsys.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return 0, p.failLocked("truncate", err)
			}
		}
		seg.sealed.Store(false)
		p.store.cache.reopen(seg)
	}
	if err := fsys.SyncDir(p.dir); err != nil {
		return 0, p.failLocked("truncate", err)
	}
	seg.mu.Lock()
	seg.verified = nil
	seg.maxTs.Store(-1)
	seg.lastTime = -1
	seg.alloc, seg.appends, seg.noPrealloc = 0, 0, false
	res, err := p.rebuild(seg, pos)
	if err == nil && len(seg.idx.times) > 0 {
		seg.lastTime = seg.idx.times[len(seg.idx.times)-1].ts
	}
	seg.mu.Unlock()
	if err == nil && seg.cleaned.Load() && res.end == pos && res.next >= seg.base && res.next < cut {
		// A cleaned segment: the batch at the cut starts past the end of
		// the one before (the offsets between were cleaned away). The log
		// ends where the kept batches do, at or below off, so the leader
		// is asked again for what follows.
		cut = res.next
	}
	if err != nil || res.end != pos || res.next != cut {
		if err == nil {
			err = fmt.Errorf("rescan ends at %d (offset %d), expected %d (offset %d)", res.end, res.next, pos, cut)
		}
		return 0, p.failLocked("truncate", err)
	}
	if st := seg.txn.Load(); st != nil {
		st.mu.Lock()
		err := p.rebuildSegLocked(seg, st, cut, nil)
		st.mu.Unlock()
		if err != nil {
			return 0, p.failLocked("truncate", err)
		}
	}
	keep := append([]*segment(nil), segs[:i+1]...)
	p.segs.Store(&keep)
	p.active = seg
	p.leo.Store(cut)
	m := mark{off: cut, seg: seg, pos: pos}
	p.dur.Store(&m)
	p.rep.leoMark.Store(&m)
	p.wakeReplicas()
	if hw := p.hw.Load(); hw.off >= cut {
		// At the cut, or inside the cleaned gap before it: no batch lies
		// between the new end and the high watermark.
		p.hw.Store(&m)
	}
	p.stableMark.Store(nil)
	p.logger.Info("log truncated", zap.Int64("to", cut), zap.Int64("from", leo), zap.Int("segments_removed", len(drop)))
	p.wake()
	return cut, nil
}

// cutPoint finds, in seg, the batch holding off (or the first after it):
// its position and base offset. At seg's end it returns seg's size and next
// offset.
func (p *Partition) cutPoint(seg *segment, off int64) (pos, base int64, err error) {
	size := seg.size.Load()
	if off >= seg.next.Load() {
		return size, seg.next.Load(), nil
	}
	h, err := p.store.cache.acquire(seg, mayWait)
	if err != nil {
		return 0, 0, err
	}
	defer p.store.cache.release(h)
	if ix, err := p.segmentIndex(seg, h); err == nil {
		seg.mu.RLock()
		pos = ix.lookup(seg.base, off)
		seg.mu.RUnlock()
	}
	sc := newHeaderScanner(h.f, seg.logPath, size)
	defer sc.close()
	for pos < size {
		hdr, err := sc.header(pos)
		if err != nil {
			return 0, 0, err
		}
		if hdr.NextOffset() > off {
			return pos, hdr.BaseOffset, nil
		}
		pos += int64(hdr.Length)
	}
	return size, seg.next.Load(), nil
}
