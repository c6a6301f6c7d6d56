package log

import (
	"container/list"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/internal/fdbudget"
	"github.com/synapsebroker/synapse/internal/parallel"
)

// Options configure a Store: the things shared by every partition of a broker.
type Options struct {
	// FS is the file system; nil means the operating system's.
	FS FS
	// Logger receives recovery and failure reports; nil means no logging.
	Logger *zap.Logger
	// SyncInterval selects the durability policy. Zero (the default) means
	// durable: WaitDurable returns only once the bytes are fsync'd, and the high
	// watermark is the durable end. Concurrent appends to one or many
	// partitions share fsyncs (group commit). A positive interval is the relaxed
	// policy: appends are visible at once (high watermark = log end) and dirty
	// partitions are fsync'd every interval, like Kafka's page-cache brokers.
	SyncInterval time.Duration
	// MaxOpenFiles bounds the segment file descriptors kept open across all
	// partitions (default 1024). Descriptors in use (a read in flight, an active
	// segment with unsynced bytes) are never closed, so the bound is soft.
	MaxOpenFiles int
	// FDs, if set, is the broker's file-descriptor budget: every file and
	// directory the store opens holds one slot while open. Short-lived
	// opens wait for a slot (up to a couple of seconds), reads that would
	// pin one more file are refused while less than a quarter of the budget
	// is free, and a refusal or the kernel's EMFILE/ENFILE/ENOMEM/ENOSPC is
	// ErrResource: retriable, never latched. Nil means unbounded.
	FDs *fdbudget.Budget
	// Preallocate reserves the active segment's space ahead of appends
	// with fallocate(2) (Kafka's file.preallocate), growing by doubling
	// steps of 1 to 16 MiB once a segment has had a few appends (an idle
	// partition never is); an fdatasync after an append into allocated
	// space has no file size to journal. Sealing and closing trim the file
	// to its batches; recovery cuts the zeros after a crash. Linux only.
	Preallocate bool
	// SyncFSMin is how many dirty partitions on one file system a
	// group-commit round needs before it makes them durable with one
	// syncfs(2) instead of an fdatasync each (default 64; negative: never).
	// Only where the FS implements FSSyncer (Linux 5.8+).
	SyncFSMin int
	// SyncParallelism is how many partitions one group-commit round fsyncs at
	// once (default 4).
	SyncParallelism int
	// Now returns the time for segment.ms and retention.ms; nil means time.Now.
	Now func() time.Time
	// OnSeal, if set, is called (under the partition's lock: it must not
	// block or call back into the partition) each time a segment is sealed,
	// so an uploader can start at once instead of at its next poll.
	OnSeal func()
}

// Store owns what partitions share: the group-commit syncer and the bounded
// cache of open segment files. There is no goroutine per partition: one
// syncer goroutine serves all of them.
type Store struct {
	fs     FS
	logger *zap.Logger
	now    func() time.Time
	opts   Options
	cache  *fileCache
	syncer *syncer
	fss    FSSyncer            // nil: no syncfs rounds
	devs   map[uint64]*devSync // s.mu

	syncfsRounds atomic.Int64

	mu     sync.Mutex
	parts  map[*Partition]struct{}
	closed bool
}

// OpenStore starts a store. Close stops it.
func OpenStore(opts Options) *Store {
	if opts.FS == nil {
		opts.FS = OSFS
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxOpenFiles <= 0 {
		opts.MaxOpenFiles = 1024
	}
	if opts.SyncParallelism <= 0 {
		opts.SyncParallelism = 4
	}
	if opts.SyncFSMin == 0 {
		opts.SyncFSMin = 64
	}
	cache := &fileCache{max: opts.MaxOpenFiles, budget: opts.FDs}
	cache.fs = budgetFS{FS: opts.FS, b: opts.FDs, cache: cache}
	if opts.FDs != nil {
		// Idle cached files may hold at most half the budget; the other
		// half is for pinned files (appends, reads in flight) and
		// short-lived opens, which also shed idle ones when refused.
		cache.max = min(cache.max, max(1, opts.FDs.Max()/2))
	}
	s := &Store{
		fs:     cache.fs,
		logger: opts.Logger,
		now:    opts.Now,
		opts:   opts,
		cache:  cache,
		parts:  make(map[*Partition]struct{}),
	}
	s.syncer = newSyncer(opts.SyncInterval, opts.SyncParallelism)
	if fss, ok := opts.FS.(FSSyncer); ok && opts.SyncFSMin > 0 {
		s.fss = fss
		s.syncer.bulk = s.syncBulk
		s.syncer.bulkMin = opts.SyncFSMin
	}
	return s
}

// devSync is the store's syncfs handle on one file system, opened before
// any partition there is written, and the file system's error epoch: each
// failed round syncfs bumps it, and a partition whose last verified fsync
// is from an older epoch is fsync'd on its own (its file's error is still
// reported to it) before its high watermark moves again. A failure that
// syncfs reported for a partition outside its round is so never lost.
type devSync struct {
	dev   uint64
	h     SyncFSHandle
	epoch atomic.Uint64
}

// devSyncFor returns the handle on the file system holding dir (opening it
// the first time), or nil.
func (s *Store) devSyncFor(dir string) *devSync {
	if s.fss == nil {
		return nil
	}
	dev, ok := s.fss.Device(dir)
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ds := s.devs[dev]; ds != nil {
		return ds
	}
	h, err := s.fss.OpenSyncFS(dir)
	if err != nil {
		return nil
	}
	ds := &devSync{dev: dev, h: h}
	if s.devs == nil {
		s.devs = map[uint64]*devSync{}
	}
	s.devs[dev] = ds
	return ds
}

// syncBulk makes the partitions of a round that share a file system durable
// with one syncfs per file system (where there are at least SyncFSMin of
// them, each verified as of the current error epoch), and returns the
// others for fdatasync one by one. If a syncfs fails, the epoch moves on
// and its partitions are fsync'd one by one after all, so the failure
// lands on (and takes offline) only the partitions whose files it hit.
func (s *Store) syncBulk(parts []*Partition) []*Partition {
	byDev := map[*devSync][]*Partition{}
	var rest []*Partition
	for _, p := range parts {
		if p.ds != nil && p.syncEpoch.Load() == p.ds.epoch.Load() {
			byDev[p.ds] = append(byDev[p.ds], p)
		} else {
			rest = append(rest, p)
		}
	}
	for ds, g := range byDev {
		if len(g) < s.opts.SyncFSMin {
			rest = append(rest, g...)
			continue
		}
		steps := make([]syncStep, 0, len(g))
		live := g[:0]
		for _, p := range g {
			if st, ok := p.syncBegin(false); ok {
				steps = append(steps, st)
				live = append(live, p)
			}
		}
		if len(live) == 0 {
			continue
		}
		err := ds.h.SyncFS()
		var epoch uint64
		if err != nil {
			epoch = ds.epoch.Add(1)
			s.logger.Warn("syncfs failed: fsync'ing partitions one by one", zap.Int("partitions", len(live)), zap.Error(err))
		}
		s.syncfsRounds.Add(1)
		parallel.Each(s.syncer.parallel, len(live), func(i int) {
			var ferr error
			if err != nil && steps[i].h != nil {
				ferr = live[i].fsyncActive(steps[i].h.f)
			}
			live[i].syncEnd(steps[i], ferr)
			if err != nil && ferr == nil {
				live[i].syncEpoch.Store(epoch)
			}
		})
	}
	return rest
}

// openSyncFS opens a syncfs handle for one batch (OpenPartitions,
// CloseBatch) before the batch writes anything, so its SyncFS reports any
// failure of those writes. It holds a descriptor slot until closed.
func (s *Store) openSyncFS(dir string) (SyncFSHandle, error) {
	bfs := s.cache.fs
	if !bfs.take(0, true) {
		return nil, &os.PathError{Op: "open", Path: dir, Err: errNoDescriptor}
	}
	var h SyncFSHandle
	err := bfs.retry(func() (err error) {
		h, err = s.fss.OpenSyncFS(dir)
		return err
	})
	if err != nil {
		bfs.b.Release()
		return nil, err
	}
	return slotHandle{h, bfs.b}, nil
}

// slotHandle gives its descriptor slot back on Close.
type slotHandle struct {
	SyncFSHandle
	b *fdbudget.Budget
}

func (h slotHandle) Close() error {
	err := h.SyncFSHandle.Close()
	h.b.Release()
	return err
}

// SyncFSRounds returns how many group-commit rounds used syncfs.
func (s *Store) SyncFSRounds() int64 { return s.syncfsRounds.Load() }

// Durable reports whether the store runs the durable (fsync before ack) policy.
func (s *Store) Durable() bool { return s.opts.SyncInterval <= 0 }

// OpenFiles returns the number of segment files currently open.
func (s *Store) OpenFiles() int {
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	return s.cache.open
}

// KernelRefusals returns how many segment-file opens the kernel refused for
// want of a resource (EMFILE, ENFILE, ENOMEM): the descriptor limit lowered
// below the budget, or descriptors held outside it.
func (s *Store) KernelRefusals() int64 { return s.cache.kernelRefused.Load() }

// Close closes every partition still open and stops the syncer.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	parts := make([]*Partition, 0, len(s.parts))
	for p := range s.parts {
		parts = append(parts, p)
	}
	s.mu.Unlock()
	// Each close is a few fsyncs (log, indexes, clean state): CloseBatch
	// shares them (syncfs), or runs many closes at once.
	err := s.CloseBatch(parts, nil)
	defer func() {
		s.mu.Lock()
		for _, ds := range s.devs {
			ds.h.Close()
		}
		s.mu.Unlock()
	}()
	s.syncer.stop()
	return err
}

func (s *Store) forget(p *Partition) {
	s.mu.Lock()
	delete(s.parts, p)
	s.mu.Unlock()
}

// syncer runs group commit. Partitions with unsynced bytes register in
// dirty; a round takes the whole set, fsyncs each partition (a few at once)
// and then closes the round's done channel. Whoever registers while a round
// runs joins the next one, so N concurrent appenders cost about two fsyncs,
// not N.
//
// A durability waiter that finds no round running leads one itself, on its
// own goroutine: a lone appender pays no hand-off to another goroutine.
// Waiters that arrive during a round wait for it to end, then check again
// and lead the next round if their bytes were not in it (one of them wins,
// the others follow it). Appends that nobody waits for (acks=0/1) are
// committed by the background goroutine a moment later (commitDelay), which
// leaves room for a waiter to lead.
type syncer struct {
	interval time.Duration
	parallel int
	// bulk, if set, makes durable at once what it can of a round of at
	// least bulkMin partitions, and returns the rest (Store.syncBulk).
	bulk    func([]*Partition) []*Partition
	bulkMin int

	mu    sync.Mutex
	dirty []*Partition
	cur   chan struct{} // closed when the running round ends; nil if none
	armed bool          // timer set to commit unwaited appends

	timer *time.Timer
	kick  chan struct{}
	quit  chan struct{}
	wg    sync.WaitGroup
}

// commitDelay is how long an append nobody waits for stays uncommitted (and
// invisible under the durable policy) at most before the background round.
const commitDelay = 500 * time.Microsecond

func newSyncer(interval time.Duration, parallel int) *syncer {
	s := &syncer{
		interval: interval,
		parallel: parallel,
		timer:    time.NewTimer(time.Hour),
		kick:     make(chan struct{}, 1),
		quit:     make(chan struct{}),
	}
	s.timer.Stop()
	s.wg.Add(1)
	go s.run()
	return s
}

// markDirty registers p for the next round. Lock order: Partition.mu before
// syncer.mu.
func (s *syncer) markDirty(p *Partition) {
	s.mu.Lock()
	s.dirty = append(s.dirty, p)
	if s.interval <= 0 && !s.armed {
		s.armed = true
		s.timer.Reset(commitDelay)
	}
	s.mu.Unlock()
}

// commit runs a round if none is running (and reports true), else waits
// for the running one to end. Callers loop until their condition holds: a
// round that was already running may not have included their bytes.
func (s *syncer) commit() (led bool) {
	s.mu.Lock()
	if s.cur == nil {
		parts, done := s.startLocked()
		s.mu.Unlock()
		s.runRound(parts, done)
		return true
	}
	ch := s.cur
	s.mu.Unlock()
	<-ch
	return false
}

// startLocked begins a round: it takes the dirty set. s.mu held.
func (s *syncer) startLocked() ([]*Partition, chan struct{}) {
	parts := s.dirty
	s.dirty = nil
	s.cur = make(chan struct{})
	return parts, s.cur
}

// runRound syncs parts and ends the round; if unwaited appends registered
// meanwhile, the background goroutine commits them.
func (s *syncer) runRound(parts []*Partition, done chan struct{}) {
	s.syncAll(parts)
	s.mu.Lock()
	s.cur = nil
	more := len(s.dirty) > 0
	s.mu.Unlock()
	close(done)
	if more {
		s.poke()
	}
}

func (s *syncer) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *syncer) run() {
	defer s.wg.Done()
	var tick <-chan time.Time
	if s.interval > 0 {
		t := time.NewTicker(s.interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-s.kick:
		case <-tick:
		case <-s.timer.C:
			s.mu.Lock()
			s.armed = false
			s.mu.Unlock()
		case <-s.quit:
			for !s.commit() { // a final round of our own, after any running one
			}
			return
		}
		s.mu.Lock()
		if s.cur != nil || len(s.dirty) == 0 {
			s.mu.Unlock() // the running round pokes us when it ends
			continue
		}
		parts, done := s.startLocked()
		s.mu.Unlock()
		s.runRound(parts, done)
	}
}

func (s *syncer) syncAll(parts []*Partition) {
	if s.bulk != nil && len(parts) >= s.bulkMin {
		parts = s.bulk(parts)
	}
	parallel.Each(s.parallel, len(parts), func(i int) { parts[i].syncNow() })
}

// waitRound waits for the round running now, if any, to end.
func (s *syncer) waitRound() {
	s.mu.Lock()
	ch := s.cur
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

func (s *syncer) stop() {
	close(s.quit)
	s.wg.Wait()
}

// fileCache keeps at most max segment files open, closing the least recently
// used unreferenced ones. Lock order: fileCache.mu is a leaf.
type fileCache struct {
	fs     budgetFS
	budget *fdbudget.Budget // nil: unbounded
	max    int
	mu     sync.Mutex
	open   int
	lru    list.List // of *handle with refs == 0, front = most recent

	kernelRefused atomic.Int64 // opens refused by the kernel (EMFILE, ENFILE, ...)
}

// handle is an open segment file shared by the appender and readers.
type handle struct {
	f    File
	seg  *segment
	refs int
	elem *list.Element // in lru while refs == 0
	gone bool          // segment deleted: close on last release
}

// How a segment file is opened: an append (or a one-off lookup) may wait
// for a descriptor; a fetch's read is refusable: refused while less than a
// quarter of the budget is free (the fetch then serves fewer partitions)
// rather than wait or take the last slots from writers.
const (
	mayWait   = false
	refusable = true
)

// acquire returns seg's open file with one more reference, opening it if
// needed. The open happens outside the cache lock. Short of descriptors it
// returns a *ResourceError.
func (c *fileCache) acquire(seg *segment, refuse bool) (*handle, error) {
	c.mu.Lock()
	if h := seg.fh; h != nil {
		c.refLocked(h)
		c.mu.Unlock()
		return h, nil
	}
	c.mu.Unlock()
	if seg.replaced.Load() {
		return nil, errSegmentReplaced // its path names the cleaner's new file now
	}

	flag := os.O_RDWR
	if seg.sealed.Load() {
		flag = os.O_RDONLY
	}
	f, err := c.openFile(seg.logPath, flag, refuse)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if h := seg.fh; h != nil { // lost a race with another opener
		c.refLocked(h)
		c.mu.Unlock()
		f.Close()
		return h, nil
	}
	if seg.replaced.Load() { // set before the rename: f may be the new file
		c.mu.Unlock()
		f.Close()
		return nil, errSegmentReplaced
	}
	h := &handle{f: f, seg: seg, refs: 1}
	c.open++
	if seg.dropped {
		// Opened just before the segment was deleted (or its partition
		// closed): serve this reader, close on its release, cache nothing.
		h.gone = true
		c.mu.Unlock()
		return h, nil
	}
	seg.fh = h
	toClose := c.evictLocked()
	c.mu.Unlock()
	closeAll(toClose)
	return h, nil
}

// openFile opens a segment file within the budget (budgetFS.open); unless
// refuse, a full budget is waited on.
func (c *fileCache) openFile(name string, flag int, refuse bool) (File, error) {
	keep := 0
	if refuse {
		keep = c.budget.Max() / 4
	}
	f, err := c.fs.open(name, flag, 0, keep, !refuse)
	if err != nil {
		if re := asResource("open segment", err); re != nil {
			return nil, re
		}
		return nil, err
	}
	return f, nil
}

// shed closes up to a sixteenth of the idle cached files (at least 8), for
// room under the descriptor limit, and returns how many it closed.
func (c *fileCache) shed() int {
	c.mu.Lock()
	var out []File
	for n := max(8, c.open/16); n > 0; n-- {
		e := c.lru.Back()
		if e == nil {
			break
		}
		out = append(out, c.closeIdleLocked(e))
	}
	c.mu.Unlock()
	closeAll(out)
	return len(out)
}

// ref adds a reference to a handle the caller already holds one of.
func (c *fileCache) ref(h *handle) {
	c.mu.Lock()
	c.refLocked(h)
	c.mu.Unlock()
}

func (c *fileCache) refLocked(h *handle) {
	if h.refs == 0 && h.elem != nil {
		c.lru.Remove(h.elem)
		h.elem = nil
	}
	h.refs++
}

func (c *fileCache) release(h *handle) {
	c.mu.Lock()
	h.refs--
	var toClose []File
	if h.refs == 0 {
		if h.gone {
			c.open--
			toClose = append(toClose, h.f)
		} else {
			h.elem = c.lru.PushFront(h)
			toClose = c.evictLocked()
		}
	}
	c.mu.Unlock()
	closeAll(toClose)
}

// install caches f as seg's open file, with one reference for the caller
// (the cleaner's swap: seg's path names f only once a rename is done, and
// a referenced handle is never evicted).
func (c *fileCache) install(seg *segment, f File) *handle {
	c.mu.Lock()
	h := &handle{f: f, seg: seg, refs: 1}
	c.open++
	seg.fh = h
	toClose := c.evictLocked()
	c.mu.Unlock()
	closeAll(toClose)
	return h
}

// drop forgets seg's handle (segment deleted or partition closed). The file
// is closed now if unused, else by the last release.
func (c *fileCache) drop(seg *segment) {
	c.mu.Lock()
	seg.dropped = true
	c.uncacheLocked(seg)
}

// reopen forgets seg's cached file (opened read-only while it was sealed)
// so that the next acquire opens it again for writing. c.mu is released.
func (c *fileCache) reopen(seg *segment) {
	c.mu.Lock()
	c.uncacheLocked(seg)
}

// uncacheLocked takes seg's handle out of the cache (closing it now if
// unused, else on its last release) and unlocks c.mu.
func (c *fileCache) uncacheLocked(seg *segment) {
	h := seg.fh
	var f File
	if h != nil {
		seg.fh = nil
		h.gone = true
		if h.refs == 0 {
			if h.elem != nil {
				c.lru.Remove(h.elem)
				h.elem = nil
			}
			c.open--
			f = h.f
		}
	}
	c.mu.Unlock()
	if f != nil {
		f.Close()
	}
}

func (c *fileCache) evictLocked() []File {
	var out []File
	for c.open > c.max {
		e := c.lru.Back()
		if e == nil {
			break
		}
		out = append(out, c.closeIdleLocked(e))
	}
	return out
}

// closeIdleLocked takes an idle handle out of the cache and returns its file
// to close.
func (c *fileCache) closeIdleLocked(e *list.Element) File {
	h := e.Value.(*handle)
	c.lru.Remove(e)
	h.elem = nil
	h.gone = true
	h.seg.fh = nil
	c.open--
	return h.f
}

// transientWait is how long a short-lived open (an index, a state file, a
// directory to fsync, a recovery scan) waits for a descriptor slot.
const transientWait = 2 * time.Second

// budgetFS counts open descriptors against Options.FDs: each open file holds
// a slot until closed; SyncDir and ReadDir hold one while they run. Without
// a budget it only handles the kernel's refusals. Either way, when the
// kernel refuses an open for want of descriptors (EMFILE, ENFILE: the limit
// lowered at run time, or descriptors held outside the budget), idle cached
// files are closed and the open tried again.
type budgetFS struct {
	FS
	b     *fdbudget.Budget // nil: unbounded
	cache *fileCache       // whose idle files are closed to make room
}

func (f budgetFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	return f.open(name, flag, perm, 0, true)
}

// open takes a slot (waiting up to transientWait if wait, else only if keep
// slots stay free) and opens name with it.
func (f budgetFS) open(name string, flag int, perm os.FileMode, keep int, wait bool) (File, error) {
	if !f.take(keep, wait) {
		return nil, &os.PathError{Op: "open", Path: name, Err: errNoDescriptor}
	}
	var file File
	err := f.retry(func() (err error) {
		file, err = f.FS.OpenFile(name, flag, perm)
		return err
	})
	if err != nil {
		f.b.Release()
		return nil, err
	}
	if f.b == nil {
		return file, nil
	}
	bf := &budgetFile{File: file, b: f.b}
	if _, ok := file.(OSFile); ok {
		return budgetOSFile{bf}, nil
	}
	return bf, nil
}

// retry runs op, and again after closing idle cached files while the
// kernel refuses it for want of descriptors (a few times at most).
func (f budgetFS) retry(op func() error) error {
	err := op()
	for i := 0; i < 4 && err != nil && isOutOfDescriptors(err); i++ {
		f.cache.kernelRefused.Add(1)
		if f.cache.shed() == 0 {
			break
		}
		err = op()
	}
	return err
}

func isOutOfDescriptors(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// take gets a slot: if there is none, idle cached files are closed to make
// one; then, if wait, it waits for a release.
func (f budgetFS) take(keep int, wait bool) bool {
	if f.b == nil {
		return true
	}
	if wait {
		keep = 0
	}
	for !f.b.TryAcquire(keep) {
		if f.cache.shed() == 0 {
			return wait && f.b.Acquire(transientWait)
		}
	}
	return true
}

func (f budgetFS) SyncDir(dir string) error {
	if !f.take(0, true) {
		return &os.PathError{Op: "open", Path: dir, Err: errNoDescriptor}
	}
	defer f.b.Release()
	return f.retry(func() error { return f.FS.SyncDir(dir) })
}

func (f budgetFS) ReadDir(dir string) ([]string, error) {
	if !f.take(0, true) {
		return nil, &os.PathError{Op: "open", Path: dir, Err: errNoDescriptor}
	}
	defer f.b.Release()
	var names []string
	err := f.retry(func() (err error) {
		names, err = f.FS.ReadDir(dir)
		return err
	})
	return names, err
}

// budgetFile gives its slot back on Close (once).
type budgetFile struct {
	File
	b      *fdbudget.Budget
	closed atomic.Bool
}

func (f *budgetFile) Close() error {
	err := f.File.Close()
	if f.closed.CompareAndSwap(false, true) {
		f.b.Release()
	}
	return err
}

// budgetOSFile keeps the OSFile (sendfile) path of an operating-system file.
type budgetOSFile struct{ *budgetFile }

func (f budgetOSFile) OSFile() *os.File { return f.File.(OSFile).OSFile() }

func closeAll(fs []File) {
	for _, f := range fs {
		f.Close()
	}
}
