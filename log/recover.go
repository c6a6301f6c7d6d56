package log

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/internal/parallel"
)

const stateFile = "partition.state"

// partitionState is the small checkpoint beside the segments, written by
// temp file → fsync → rename → fsync(dir).
type partitionState struct {
	Version        int         `json:"version"`
	LogStartOffset int64       `json:"log_start_offset"`
	Clean          *cleanState `json:"clean,omitempty"` // set only by a clean close
	// Unsynced is set when an fsync failed: the active segment is durable
	// only up to Size. The failed pages may still be in the page cache,
	// where a restart (without a reboot) would read them as if they were
	// on disk, and a later fsync would not report them again: the next
	// open cuts the segment there first (those bytes were never
	// acknowledged), before anything is appended after them.
	Unsynced *durableEnd `json:"unsynced,omitempty"`
}

// durableEnd is how much of segment Base is known to be on disk.
type durableEnd struct {
	Base int64 `json:"base"`
	Size int64 `json:"size"`
}

// cleanState records the active segment at a clean close. It is trusted on
// open only if the .log still has exactly this size: bytes below a clean
// close's size are never rewritten, so an equal size proves equal content.
type cleanState struct {
	Base         int64 `json:"base"`
	Size         int64 `json:"size"`
	Next         int64 `json:"next"`
	MaxTimestamp int64 `json:"max_timestamp"`
}

// cutUnsynced truncates seg's log to size, the end of its last successful
// fsync before an fsync failed (see partitionState.Unsynced).
func (p *Partition) cutUnsynced(seg *segment, size int64) error {
	have, err := fileSize(p.store.fs, seg.logPath)
	if err != nil || have <= size {
		return err
	}
	f, err := p.store.fs.OpenFile(seg.logPath, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	p.logger.Warn("cutting bytes whose fsync failed (never acknowledged)", zap.String("segment", filepath.Base(seg.logPath)),
		zap.Int64("durable_bytes", size), zap.Int64("dropped_bytes", have-size))
	return f.Truncate(size)
}

func writeState(fs FS, dir string, st partitionState) error {
	st.Version = 1
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return WriteFileAtomic(fs, filepath.Join(dir, stateFile), b)
}

func readState(fsys FS, dir string) (partitionState, error) {
	var st partitionState
	b, err := readIndexFile(fsys, filepath.Join(dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Version != 1 {
		return partitionState{}, &CorruptionError{Path: filepath.Join(dir, stateFile), Reason: "unreadable partition state"}
	}
	return st, nil
}

// OpenPartition opens (creating if needed) the partition stored in dir.
//
// Recovery: every segment but the last was fsync'd before the next one was
// created, so only the last is scanned, and only when the previous close was
// not clean. The scan checks every batch (length, magic, CRC, offsets) and
// truncates a torn or corrupt tail, logging what was dropped. Index files are
// derived: one that does not match its .log is rebuilt.
func (s *Store) OpenPartition(dir string, cfg Config) (*Partition, error) {
	return s.openPartition(dir, cfg, false)
}

// openPartition is OpenPartition; with deferSync its fsyncs are left for
// OpenPartitions to do for the batch.
func (s *Store) openPartition(dir string, cfg Config, deferSync bool) (*Partition, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.mu.Unlock()
	cfg = cfg.withDefaults()
	p := &Partition{store: s, dir: dir, logger: s.logger.WithLazy(zap.String("dir", dir)), deferSync: deferSync}
	p.cfg.Store(&cfg)
	ch := make(chan struct{})
	p.notify.Store(&ch)
	// The file system's syncfs handle is opened (on the parent, which
	// exists) before this partition writes anything.
	ds := s.devSyncFor(filepath.Dir(dir))
	if ds != nil {
		p.syncEpoch.Store(ds.epoch.Load())
	}
	if err := p.open(); err != nil {
		for _, seg := range p.segments() {
			s.cache.drop(seg)
		}
		return nil, err
	}
	if ds != nil {
		if dev, ok := s.fss.Device(dir); ok && dev == ds.dev {
			p.ds = ds // not a mount point of its own
		}
	}
	p.deferSync = false
	s.mu.Lock()
	s.parts[p] = struct{}{}
	s.mu.Unlock()
	return p, nil
}

// openSyncDir fsyncs dir for open, or, in a batch open (OpenPartitions),
// leaves it to the batch's one syncfs.
func (p *Partition) openSyncDir(dir string) error {
	if p.deferSync {
		p.pendingDirs = append(p.pendingDirs, dir)
		return nil
	}
	return p.store.fs.SyncDir(dir)
}

// finishOpenSync does the fsyncs a batch open deferred, one by one (no
// syncfs here, or it failed).
func (p *Partition) finishOpenSync() error {
	for _, d := range p.pendingDirs {
		if err := p.store.fs.SyncDir(d); err != nil {
			return err
		}
	}
	if p.pendingActive {
		f, err := p.store.fs.OpenFile(p.active.logPath, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	p.pendingDirs, p.pendingActive = nil, false
	return nil
}

// OpenPartitions opens many partition directories, as OpenPartition does
// each, several at once, and makes what the opens changed durable together:
// one syncfs per file system where the FS has it (FSSyncer), else each
// partition's fsyncs. This is a broker's start-up (and a topic's creation):
// after a crash, opening N partitions costs one syncfs instead of about
// 3N fsyncs. On error every partition opened is closed again.
func (s *Store) OpenPartitions(dirs []string, cfgs []Config) ([]*Partition, error) {
	// The batch's syncfs handle, opened before the opens write anything.
	var h SyncFSHandle
	var hdev uint64
	if s.fss != nil && len(dirs) > 0 {
		if dev, ok := s.fss.Device(filepath.Dir(dirs[0])); ok {
			if hh, err := s.openSyncFS(filepath.Dir(dirs[0])); err == nil {
				h, hdev = hh, dev
				defer h.Close()
			}
		}
	}
	ps := make([]*Partition, len(dirs))
	errs := make([]error, len(dirs))
	parallel.Each(openParallelism, len(dirs), func(i int) {
		ps[i], errs[i] = s.openPartition(dirs[i], cfgs[i], true)
	})
	err := errors.Join(errs...)
	if err == nil {
		err = s.finishOpens(ps, h, hdev)
	}
	if err != nil {
		for _, p := range ps {
			if p == nil {
				continue
			}
			// What the open changed must be durable before Close writes
			// a clean-close record vouching for it; if it cannot be, no
			// record (the next open scans again).
			if ferr := p.finishOpenSync(); ferr != nil {
				p.latch("fsync", ferr)
			}
			p.Close()
		}
		return nil, err
	}
	return ps, nil
}

// openParallelism is how many partitions OpenPartitions opens at once:
// the work is reads and small writes, mostly waiting on the disk.
const openParallelism = 8

// finishOpens makes durable what batch opens deferred: one SyncFS of h
// (opened before the opens) for the partitions on its file system, each
// partition's own fsyncs for the others or if it fails.
func (s *Store) finishOpens(ps []*Partition, h SyncFSHandle, hdev uint64) error {
	var batch, rest []*Partition
	for _, p := range ps {
		if len(p.pendingDirs) == 0 && !p.pendingActive {
			continue
		}
		if h != nil && p.ds != nil && p.ds.dev == hdev {
			batch = append(batch, p)
		} else {
			rest = append(rest, p)
		}
	}
	if len(batch) > 0 {
		if err := h.SyncFS(); err != nil {
			s.logger.Warn("syncfs after opening partitions failed: fsync'ing them one by one", zap.Error(err))
			rest = append(rest, batch...)
		} else {
			for _, p := range batch {
				p.pendingDirs, p.pendingActive = nil, false
			}
		}
	}
	errs := make([]error, len(rest))
	parallel.Each(s.syncer.parallel, len(rest), func(i int) { errs[i] = rest[i].finishOpenSync() })
	return errors.Join(errs...)
}

func (p *Partition) segments() []*segment {
	if sp := p.segs.Load(); sp != nil {
		return *sp
	}
	return nil
}

func (p *Partition) open() error {
	fsys := p.store.fs
	if err := fsys.MkdirAll(p.dir, 0o755); err != nil {
		return err
	}
	if err := p.openSyncDir(filepath.Dir(p.dir)); err != nil {
		return err
	}
	names, err := fsys.ReadDir(p.dir)
	if err != nil {
		return err
	}
	// An interrupted cleaner swap is finished or undone first (cleaner.go).
	swapped, err := p.recoverCleaner(names)
	if err != nil {
		return err
	}
	if swapped {
		if names, err = fsys.ReadDir(p.dir); err != nil {
			return err
		}
	}
	ck, err := readCleanerCheckpoint(fsys, p.dir)
	if err != nil {
		return err
	}
	p.cleaner.firstDirty.Store(ck.FirstDirty)
	p.cleaner.cleanedBelow.Store(ck.CleanedBelow)
	p.cleaner.horizon.Store(ck.NextHorizonMs)
	st, err := readState(fsys, p.dir)
	if err != nil {
		return err
	}
	now := p.store.now()
	var segs []*segment
	haveLog := map[string]bool{}
	var haveTxn map[string]bool // .txnindex files: made only if there are any
	for _, n := range names {
		if base, ok := parseSegmentName(n, ".log"); ok {
			segs = append(segs, newSegment(p.dir, base, now))
			haveLog[strings.TrimSuffix(n, ".log")] = true
		} else if strings.HasSuffix(n, txnIndexExt) {
			if haveTxn == nil {
				haveTxn = map[string]bool{}
			}
			haveTxn[n] = true
		}
	}
	// Leftovers: temp files of an interrupted atomic write, index files whose
	// segment is gone.
	dirty := swapped // directory changed or state recovered: fsync it before use
	for _, n := range names {
		stem := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, ".timeindex"), ".index"), txnIndexExt)
		if strings.HasSuffix(n, ".tmp") || (stem != n && !haveLog[stem]) {
			if err := fsys.Remove(filepath.Join(p.dir, n)); err != nil {
				return err
			}
			dirty = true
		}
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].base < segs[j].base })
	// Segments wholly below the log start (their successor starts at or
	// before it) are leftovers of an interrupted deletion: finish it.
	for len(segs) > 1 && segs[1].base <= st.LogStartOffset {
		for _, path := range []string{segs[0].indexPath(), segs[0].timeIndexPath(), segs[0].txnIndexPath(), segs[0].logPath} {
			if err := fsys.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		segs = segs[1:]
		dirty = true
	}
	if len(segs) == 0 {
		seg := newSegment(p.dir, st.LogStartOffset, now)
		f, err := fsys.OpenFile(seg.logPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		f.Close()
		if err := p.openSyncDir(p.dir); err != nil {
			return err
		}
		seg.idx = &segmentIndex{}
		segs = append(segs, seg)
	}
	for _, seg := range segs {
		if seg.base < ck.CleanedBelow {
			// May have been written by the cleaner, or (the active
			// segment) by a replica's appends with gaps (AppendReplica),
			// or be a cleaned segment a truncation made the last.
			seg.cleaned.Store(true)
		}
	}
	for i, seg := range segs {
		last := i == len(segs)-1
		if i > 0 && seg.base != segs[i-1].next.Load() {
			return &CorruptionError{Path: seg.logPath, Reason: fmt.Sprintf("segment starts at offset %d, previous ends at %d", seg.base, segs[i-1].next.Load())}
		}
		if !last {
			seg.sealed.Store(true)
			if err := p.openSealed(seg, segs[i+1].base); err != nil {
				return err
			}
			continue
		}
		if u := st.Unsynced; u != nil && u.Base == seg.base {
			if err := p.cutUnsynced(seg, u.Size); err != nil {
				return err
			}
		}
		if st.Unsynced != nil {
			// The durable-end mark is cleared right after: the cut must be
			// durable first, not left for the batch.
			p.deferSync = false
		}
		scanned, err := p.openActive(seg, st.Clean)
		if err != nil {
			return err
		}
		dirty = dirty || scanned
		if st.Unsynced != nil {
			// The cut is durable (openActive fsyncs what it scanned): the
			// mark goes before anything can be appended past it.
			if err := writeState(fsys, p.dir, partitionState{LogStartOffset: st.LogStartOffset}); err != nil {
				return err
			}
		}
	}
	p.segs.Store(&segs)
	p.active = segs[len(segs)-1]
	// Aborted-transaction indexes: known from the listing (no stat per
	// segment); the active one's is loaded now, cut to the log end.
	for i, seg := range segs {
		if haveTxn[filepath.Base(seg.txnIndexPath())] {
			if err := p.openTxn(seg, i == len(segs)-1); err != nil {
				return err
			}
		}
	}
	leo := p.active.next.Load()
	p.leo.Store(leo)
	// The checkpointed log start is authoritative when there is one: with
	// tiering, segments below the local start live in object storage and the
	// log start can be far below the first local segment. Without a
	// checkpoint the first segment starts the log.
	ls := segs[0].base
	if st.Version == 1 {
		ls = st.LogStartOffset
	}
	ls = min(max(ls, 0), leo)
	p.logStart.Store(ls)
	if dirty {
		// After a crash the directory entries themselves (the last segment,
		// created by a roll whose directory fsync may not have run) must be
		// durable before anything in them counts as durable.
		if err := p.openSyncDir(p.dir); err != nil {
			return err
		}
	}
	// Everything on disk now is durable: the tail was fsync'd by the scan or
	// by the clean close.
	p.setMarksLocked(mark{off: leo, seg: p.active, pos: p.active.size.Load()})
	// Segments wholly below the log start are leftovers of a crash in the
	// middle of a deletion.
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deleteSegmentsLocked(func(seg *segment) bool { return seg.next.Load() <= ls })
}

func parseSegmentName(name, ext string) (int64, bool) {
	if !strings.HasSuffix(name, ext) || len(name) != 20+len(ext) {
		return 0, false
	}
	base, err := strconv.ParseInt(name[:20], 10, 64)
	return base, err == nil && base >= 0
}

func fileSize(fsys FS, path string) (int64, error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Size()
}

// loadIndexes reads and validates both index files of seg against logSize.
func loadIndexes(fsys FS, seg *segment, logSize int64) (indexMeta, *segmentIndex, error) {
	b, err := readIndexFile(fsys, seg.indexPath())
	if err != nil {
		return indexMeta{}, nil, err
	}
	m, ix, err := decodeIndex(b, indexKindOffset, seg.base)
	if err != nil {
		return m, nil, err
	}
	tb, err := readIndexFile(fsys, seg.timeIndexPath())
	if err != nil {
		return m, nil, err
	}
	tm, tix, err := decodeIndex(tb, indexKindTime, seg.base)
	if err != nil {
		return m, nil, err
	}
	if m != tm || m.logSize != logSize {
		return m, nil, fmt.Errorf("%w: built for %d bytes, log has %d", errBadIndex, m.logSize, logSize)
	}
	ix.times = tix.times
	return m, ix, nil
}

// openSealed sets up a sealed segment from its index headers, rebuilding the
// indexes from the log if they do not match it. The .log itself is not read
// when the indexes are good: open time does not grow with the data.
func (p *Partition) openSealed(seg *segment, successor int64) error {
	size, err := fileSize(p.store.fs, seg.logPath)
	if err != nil {
		return err
	}
	m, ix, err := loadIndexes(p.store.fs, seg, size)
	if err == nil {
		if m.flags&indexFlagCleaned != 0 {
			seg.cleaned.Store(true)
		}
		seg.size.Store(size)
		seg.next.Store(m.next)
		seg.maxTs.Store(m.maxTs)
		seg.idx = ix
		p.checkSuccessor(seg, size, successor)
		return nil
	}
	p.logger.Info("rebuilding segment index", zap.Int64("base_offset", seg.base), zap.String("reason", err.Error()))
	res, err := p.rebuild(seg, size)
	if err != nil {
		return err
	}
	if res.end != size {
		// A sealed segment was fsync'd whole before its successor existed, so
		// damage here is media corruption, not a torn write: keep the data,
		// remember where it breaks, and fail reads that reach it.
		seg.corruptAt = res.end
		seg.next.Store(successor) // offsets past the damage are unknown but end where the next segment starts
		p.logger.Error("corrupt sealed segment", zap.Int64("base_offset", seg.base),
			zap.Int64("position", res.end), zap.String("reason", res.reason))
		return nil
	}
	if err := writeIndexes(p.store.fs, seg, true); err != nil {
		p.logger.Warn("write index", zap.Int64("base_offset", seg.base), zap.Error(err))
	}
	p.checkSuccessor(seg, size, successor)
	return nil
}

// checkSuccessor handles a sealed segment that does not end where the next
// one starts: whole batches are missing at its end (the file cut at a
// batch boundary) or a whole segment between the two is gone. Like other
// damage in a sealed segment it keeps the partition open: the missing
// offsets belong to it, and reads reaching them fail (ErrCorrupt).
func (p *Partition) checkSuccessor(seg *segment, size, successor int64) {
	next := seg.next.Load()
	if next >= successor {
		return // equal; or overlapping: the open loop refuses that
	}
	if seg.cleaned.Load() {
		seg.next.Store(successor) // the cleaner removed the batches at its end
		return
	}
	seg.corruptAt = size
	seg.next.Store(successor)
	p.logger.Error("sealed segment does not end where the next one starts: the offsets between are missing",
		zap.Int64("base_offset", seg.base), zap.Int64("ends_at", next), zap.Int64("next_segment", successor))
}

// rebuild scans seg's log from the start, building its index in memory and
// marking what it read as verified.
func (p *Partition) rebuild(seg *segment, size int64) (walkResult, error) {
	f, err := p.store.fs.OpenFile(seg.logPath, os.O_RDONLY, 0)
	if err != nil {
		return walkResult{}, err
	}
	defer f.Close()
	ix := &segmentIndex{}
	var since int64
	interval := p.cfg.Load().IndexIntervalBytes
	res, err := walkSegment(f, 0, size, seg.base, seg.cleaned.Load(), func(pos int64, h *BatchHeader) {
		seg.addToIndexLocked(ix, &since, interval, pos, h)
		if h.MaxTimestamp > seg.maxTs.Load() {
			seg.maxTs.Store(h.MaxTimestamp)
		}
	})
	if err != nil {
		return res, err
	}
	seg.idx = ix
	seg.size.Store(res.end)
	seg.next.Store(res.next)
	if res.end > 0 {
		seg.markVerifiedLocked(0, res.end)
	}
	p.sinceIndex = since
	if res.end != size {
		seg.size.Store(size)
	}
	return res, nil
}

// openActive sets up the last segment: trusted from the clean-close record
// when it matches, otherwise scanned, truncated after its last good batch and
// fsync'd.
func (p *Partition) openActive(seg *segment, clean *cleanState) (scanned bool, err error) {
	fsys := p.store.fs
	size, err := fileSize(fsys, seg.logPath)
	if err != nil {
		return false, err
	}
	if clean != nil && clean.Base == seg.base && clean.Size == size {
		if m, ix, err := loadIndexes(fsys, seg, size); err == nil && m.next == clean.Next {
			seg.size.Store(size)
			seg.next.Store(m.next)
			seg.maxTs.Store(m.maxTs)
			seg.idx = ix
			if n := len(ix.times); n > 0 {
				seg.lastTime = ix.times[n-1].ts
			}
			if n := len(ix.offsets); n > 0 {
				p.sinceIndex = size - int64(ix.offsets[n-1].pos)
			} else {
				p.sinceIndex = size
			}
			return false, nil
		}
	}
	res, err := p.rebuild(seg, size)
	if err != nil {
		return true, err
	}
	f, err := fsys.OpenFile(seg.logPath, os.O_RDWR, 0)
	if err != nil {
		return true, err
	}
	defer f.Close()
	if clean != nil && clean.Base == seg.base && res.end < clean.Size {
		// Below a clean close's size everything was durable: this is damage
		// on the medium, not a torn write. Recovery still has to cut here to
		// keep the log appendable, but say loudly what is lost.
		p.logger.Error("corruption below the last clean-close size, acknowledged data lost",
			zap.String("segment", filepath.Base(seg.logPath)),
			zap.Int64("position", res.end), zap.Int64("clean_size", clean.Size),
			zap.Int64("first_lost_offset", res.next), zap.String("reason", res.reason))
	}
	if res.end != size && zeroAt(f, res.end, size) {
		// Preallocated space (Options.Preallocate) after the last batch,
		// or a torn write that never reached it: nothing to report.
		p.logger.Debug("trimmed preallocated space", zap.String("segment", filepath.Base(seg.logPath)),
			zap.Int64("valid_bytes", res.end), zap.Int64("trimmed_bytes", size-res.end))
		if err := f.Truncate(res.end); err != nil {
			return true, err
		}
		seg.size.Store(res.end)
	} else if res.end != size {
		p.logger.Warn("truncated torn tail",
			zap.String("segment", filepath.Base(seg.logPath)),
			zap.Int64("valid_bytes", res.end),
			zap.Int64("dropped_bytes", size-res.end),
			zap.Int64("first_dropped_offset", res.next),
			zap.String("reason", res.reason))
		if err := f.Truncate(res.end); err != nil {
			return true, err
		}
		seg.size.Store(res.end)
	}
	// What survived the crash may still be only in the page cache: make it
	// durable before it counts as below the high watermark.
	if p.deferSync {
		p.pendingActive = true
		return true, nil
	}
	return true, f.Sync()
}

// zeroAt reports whether f holds only zeros from pos on (the first 4 KiB
// are read: preallocated space is zero to its end, a torn write is not).
func zeroAt(f File, pos, size int64) bool {
	b := make([]byte, min(size-pos, 4096))
	n, _ := f.ReadAt(b, pos)
	if n != len(b) {
		return false
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
