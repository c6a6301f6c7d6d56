package log

import (
	"errors"
	"io/fs"
	"path/filepath"
	"time"

	"go.uber.org/zap"
)

// DeleteRecordsBefore moves the log start offset up to offset (Kafka's
// DeleteRecords), which must not exceed the high watermark; -1 means the high
// watermark. Segments wholly below the new start are deleted. The new start
// is checkpointed before any file is removed, so a crash never brings deleted
// records back into view and never leaves a hole.
func (p *Partition) DeleteRecordsBefore(offset int64) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return 0, err
	}
	hw := p.hw.Load().off
	if offset == -1 {
		offset = hw
	}
	if offset < 0 || offset > hw {
		return 0, ErrOffsetOutOfRange
	}
	if offset <= p.logStart.Load() {
		return p.logStart.Load(), nil
	}
	if err := p.setLogStartLocked(offset); err != nil {
		return 0, err
	}
	return offset, p.deleteSegmentsLocked(func(seg *segment) bool { return seg.next.Load() <= offset })
}

func (p *Partition) usableLocked() error {
	if p.closed {
		return ErrClosed
	}
	if e := p.failed.Load(); e != nil {
		return e
	}
	return nil
}

func (p *Partition) setLogStartLocked(offset int64) error {
	if err := writeState(p.store.fs, p.dir, partitionState{LogStartOffset: offset}); err != nil {
		if re := openRefused("write partition state", err); re != nil {
			return re // refused before anything was written: the old state stands; the caller may retry
		}
		return p.failLocked("write partition state", err)
	}
	p.logStart.Store(offset)
	return nil
}

// Maintain does the periodic work of one partition; the broker calls it for
// every partition from one goroutine, so idle partitions cost nothing in
// between. It rolls an active segment older than segment.ms (so idle
// partitions seal and can be offloaded), then applies retention.ms (by each
// segment's max timestamp) and retention.bytes (whole segments, oldest
// first, never the active one). It returns the number of segments deleted.
func (p *Partition) Maintain(now time.Time) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return 0, err
	}
	cfg := p.cfg.Load()
	if seg := p.active; seg.size.Load() > 0 && now.Sub(seg.created) >= time.Duration(cfg.SegmentMs)*time.Millisecond {
		if err := p.rollLocked(); err != nil {
			return 0, err
		}
	}
	segs := *p.segs.Load()
	var total int64
	for _, seg := range segs {
		total += seg.size.Load()
	}
	nowMs := now.UnixMilli()
	var drop []*segment
	for _, seg := range segs[:len(segs)-1] {
		expired := cfg.RetentionMs >= 0 && seg.maxTs.Load() >= 0 && nowMs-seg.maxTs.Load() > cfg.RetentionMs
		oversize := cfg.RetentionBytes >= 0 && total-seg.size.Load() >= cfg.RetentionBytes
		if !expired && !oversize {
			break
		}
		total -= seg.size.Load()
		drop = append(drop, seg)
	}
	if len(drop) == 0 {
		return 0, nil
	}
	newStart := drop[len(drop)-1].next.Load()
	if newStart > p.logStart.Load() {
		if err := p.setLogStartLocked(newStart); err != nil {
			return 0, err
		}
	}
	return len(drop), p.deleteSegmentsLocked(func(seg *segment) bool { return seg.next.Load() <= newStart })
}

// deleteSegmentsLocked removes the leading segments for which below is true,
// never the active one, oldest file first so a crash part way leaves a
// contiguous log.
func (p *Partition) deleteSegmentsLocked(below func(*segment) bool) error {
	segs := *p.segs.Load()
	n := 0
	for n < len(segs)-1 && below(segs[n]) {
		n++
	}
	if n == 0 {
		return nil
	}
	rest := append([]*segment(nil), segs[n:]...)
	p.segs.Store(&rest)
	var err error
	for _, seg := range segs[:n] {
		p.store.cache.drop(seg)
		// The .log goes last and the first failure stops the loop: what is
		// left is always a contiguous log (the next open finishes the job).
		for _, path := range []string{seg.indexPath(), seg.timeIndexPath(), seg.txnIndexPath(), seg.logPath} {
			if rerr := p.store.fs.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = rerr
				break
			}
		}
		if err != nil {
			break
		}
		p.logger.Info("deleted segment", zap.Int64("base_offset", seg.base), zap.Int64("next_offset", seg.next.Load()))
	}
	if serr := p.store.fs.SyncDir(p.dir); serr != nil && err == nil {
		err = serr
	}
	return err
}

// Delete closes the partition and removes its directory's files (DeleteTopics).
func (p *Partition) Delete() error {
	if err := p.Close(); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrStorage) {
		return err
	}
	names, err := p.store.fs.ReadDir(p.dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := p.store.fs.Remove(filepath.Join(p.dir, n)); err != nil {
			return err
		}
	}
	if err := p.store.fs.Remove(p.dir); err != nil {
		return err
	}
	return p.store.fs.SyncDir(filepath.Dir(p.dir))
}
