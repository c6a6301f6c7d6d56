package broker

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/internal/parallel"
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

// Tiering glue: what the broker does with a tiering.Tier. The maintenance
// loop uploads sealed segments, releases local copies outside the hot budget
// and applies retention over the whole log; fetches below the local start
// are served from the bucket; topics.json is mirrored to the bucket, and an
// empty data directory is restored from it.

// metaKey is where topics.json is mirrored in the bucket.
const metaKey = "_synapse/topics.json"

func (p *partition) tierKey() tiering.PartitionKey {
	return tiering.PartitionKey{Topic: p.topic.name, TopicID: p.topic.id, Partition: p.index}
}

// tierOpTimeout bounds one partition's tiering work per maintenance pass.
const tierOpTimeout = 2 * time.Minute

// tierPartition runs one partition's tiering step.
// tierSig is what a partition's tiering work depends on besides the clock:
// a pass that found nothing to do records it, and later passes skip the
// partition while it is unchanged (tierIdle), so an idle broker's passes cost
// O(partitions that changed), not a bucket round per partition.
type tierSig struct {
	leo, logStart, localStart int64
	segments                  int
	// firstDirty moves with every clean: the clean's segments are to be
	// uploaded again, and the release of a compacted topic waits for it.
	firstDirty int64
	configs    uint64 // topic.configGen
	at         time.Time
}

func (s *Server) tierSigOf(p *partition, now time.Time) tierSig {
	return tierSig{leo: p.log.LogEndOffset(), logStart: p.log.LogStartOffset(), localStart: p.log.LocalStartOffset(),
		segments: p.log.SegmentCount(), firstDirty: p.log.FirstDirtyOffset(), configs: s.reg.configGenOf(p.topic), at: now}
}

// compactHoldBytes bounds the dirty bytes of a compacted partition kept
// on local disk for the cleaner to map before they may be released.
const compactHoldBytes = 1 << 30

// tierIdleRecheck bounds how long an unchanged partition goes without its
// tiering work (time alone can make a segment due for retention): a
// quarter of its shortest time-based retention, at most a minute (Kafka
// checks retention every 5 minutes).
const tierIdleRecheck = time.Minute

// tierIdle reports whether p's last pass found nothing to do and nothing
// has changed since (and it is not yet due for a recheck).
func (s *Server) tierIdle(p *partition, now time.Time) bool {
	last := p.tierIdle.Load()
	if last == nil || p.mirrorDue.Load() {
		return false
	}
	cur := s.tierSigOf(p, now)
	cur.at = last.at
	if cur != *last {
		return false
	}
	recheck := tierIdleRecheck
	set := s.reg.configsOf(p.topic)
	_, rm := retention(set)
	for _, ms := range []int64{rm, s.localRetention(set, "local.retention.ms", "retention.ms")} {
		if ms >= 0 {
			recheck = min(recheck, time.Duration(ms)*time.Millisecond/4)
		}
	}
	return now.Sub(last.at) < recheck
}

func (s *Server) tierPartition(p *partition, now time.Time) {
	if !p.tierMu.TryLock() {
		return // the cleaner works on it: the next pass takes it
	}
	defer p.tierMu.Unlock()
	sig := s.tierSigOf(p, now)
	p.tierIdle.Store(nil)
	if s.tierPartitionWork(p, now) {
		p.tierIdle.Store(&sig)
	}
}

// tierPartitionWork uploads, mirrors, releases and applies retention for
// p; it reports whether it found nothing to do and nothing failed.
func (s *Server) tierPartitionWork(p *partition, now time.Time) (idle bool) {
	t := s.cfg.Tier
	ctx, cancel := context.WithTimeout(s.ctx, tierOpTimeout)
	defer cancel()
	pk := p.tierKey()
	// Each pass fails the same way for every partition while the bucket
	// is away: counted per minute, not logged per partition per pass.
	where := []zap.Field{zap.String("topic", p.topic.name), zap.Int32("partition", p.index)}
	warn := func(msg string, err error) { s.repeat.Warn(msg, append(where, zap.Error(err))...) }
	n, err := t.Upload(ctx, pk, p.log)
	if err != nil {
		warn("upload to the tiered store", err) // retried next pass
		return false
	}
	idle = n == 0
	if n > 0 {
		p.mirrorDue.Store(true)
	}
	if p.mirrorDue.Load() {
		idle = false
		if s.mirrorProducers(ctx, p) {
			p.mirrorDue.Store(false) // else retried next pass, new uploads or not
		}
	}
	set := s.reg.configsOf(p.topic)
	keepBytes := s.localRetention(set, "local.retention.bytes", "retention.bytes")
	keepMs := s.localRetention(set, "local.retention.ms", "retention.ms")
	stable := p.lastStable(p.log.HighWatermark())
	if s.cfg.CleanerBackoff > 0 && compacted(set) {
		// A compacted topic's dirty segments stay until the cleaner has
		// mapped their keys: a key first seen in the bucket only would
		// keep its older values there. Not past compactHoldBytes of them
		// (the dirty ratio counts the bucket, so a large bucket could
		// hold most of its size on disk), nor when the disk budget must
		// release them: compaction is then less thorough, nothing is lost.
		if _, dirty, _ := p.log.CleanableDirtyRatio(); dirty < compactHoldBytes {
			stable = min(stable, p.log.FirstDirtyOffset())
		}
	}
	if released, err := t.ReleaseLocalBelow(ctx, pk, p.log, keepBytes, keepMs, now, stable, p.beforeRelease); err != nil {
		warn("release local segments", err)
		idle = false
	} else if released > 0 {
		idle = false
	}
	rb, rm := retention(set)
	if err := t.ApplyRetention(ctx, pk, p.log, rb, rm, now); err != nil {
		warn("retention in the tiered store", err)
		idle = false
	}
	return idle
}

// checkDiskBudget enforces --local-disk-budget and --local-disk-reserve
// (with tiering): past the budget, or below the reserve of free space,
// local copies of uploaded segments go first, oldest first across all
// partitions, whatever local.retention.* would keep; produce is refused
// only while what is left still exceeds the budget (the bucket is away or
// behind). The maintenance loop calls it around each pass, and a watcher
// every second (a pass can be stuck on a bucket that is away); one at a
// time.
func (s *Server) checkDiskBudget() {
	b := s.cfg.LocalDiskBudget
	pct := s.cfg.LocalDiskReservePercent
	if (b <= 0 && pct <= 0) || s.cfg.Tier == nil {
		return
	}
	s.budgetMu.Lock()
	defer s.budgetMu.Unlock()
	local := s.localBytes()
	if b > 0 && local > b {
		local -= s.releaseOverBudget(local - b)
	}
	over := b > 0 && local > b
	// The free-space reserve: whatever the budget, the data directory's
	// file system is not written full (a write error would take partitions
	// offline until a restart).
	var free, reserve int64
	if pct > 0 {
		if f, size, ok := s.cfg.DiskFree(s.cfg.DataDir); ok {
			free, reserve = f, int64(float64(size)*pct/100)
			// Releasing frees nothing when the store hard-links segments
			// (the local-directory tier): then produce is only refused.
			if free < reserve && !s.cfg.Tier.LinksLocalFiles() && s.releaseOverBudget(reserve-free) > 0 {
				if f, _, ok := s.cfg.DiskFree(s.cfg.DataDir); ok {
					free = f // what the file system says, not what was meant to go
				}
			}
			over = over || free < reserve
		}
	}
	if over != s.overDisk.Swap(over) {
		s.logger.Warn("local disk budget", zap.Bool("over", over), zap.Int64("local_bytes", local), zap.Int64("budget", b),
			zap.Int64("free_bytes", free), zap.Int64("reserve_bytes", reserve))
	}
}

// localBytes is the bytes of every partition's local segments.
func (s *Server) localBytes() int64 {
	var n int64
	for _, tp := range s.reg.all() {
		for _, p := range s.reg.partitionsOf(tp) {
			n += p.log.LocalBytes()
		}
	}
	return n
}

// releaseOverBudget deletes local copies of uploaded sealed segments until
// at least excess bytes are gone or none is left, oldest first (by the
// largest timestamp up to each segment in its partition, so each partition
// loses a prefix), and returns the bytes deleted.
func (s *Server) releaseOverBudget(excess int64) int64 {
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	type candidate struct {
		p              *partition
		next, size, ts int64
	}
	var cands []candidate
	for _, tp := range s.reg.all() {
		for _, p := range s.reg.partitionsOf(tp) {
			m, err := s.cfg.Tier.Manifest(ctx, p.tierKey()) // cached: no bucket call once read
			if err != nil {
				// Every second, per partition, while the bucket is away:
				// counted per minute.
				s.repeat.Warn("disk budget: cannot tell what is uploaded (manifest unreadable); nothing released there", zap.String("topic", tp.name), zap.Int32("partition", p.index), zap.Error(err))
				continue
			}
			ts := int64(math.MinInt64)
			stable := p.lastStable(p.log.HighWatermark())
			for _, sg := range p.log.SealedSegments() {
				if !s.cfg.Tier.SafeToRelease(m, sg, p.log) || sg.Next > stable {
					break // not (all) in the bucket yet, or holds an open transaction
				}
				ts = max(ts, sg.MaxTimestamp)
				cands = append(cands, candidate{p, sg.Next, sg.Size, ts})
			}
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].ts < cands[j].ts })
	cut := map[*partition]int64{}
	var freed int64
	for _, c := range cands {
		if freed >= excess {
			break
		}
		cut[c.p] = c.next
		freed += c.size
	}
	freed = 0
	for p, off := range cut {
		if err := p.beforeRelease(); err != nil {
			s.repeat.Warn("release local segments over the disk budget", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
			continue
		}
		before := p.log.LocalBytes()
		if _, err := p.log.DeleteLocalBefore(off); err != nil {
			s.repeat.Warn("release local segments over the disk budget", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
			continue
		}
		freed += before - p.log.LocalBytes()
	}
	return freed
}

// localRetention reads local.retention.* (the topic's, else the broker
// default); -2 means "as retention.*", as in Kafka (KIP-405).
func (s *Server) localRetention(set map[string]string, local, whole string) int64 {
	v := s.topicConfigInt(set, local)
	if v == -2 {
		return configInt(set, whole)
	}
	return v
}

// coldRead serves a fetch below the local start from the bucket without
// stalling on it: cached chunks are served at once; otherwise the download
// starts and wait (closed when it lands) joins the fetch's long-poll
// wake-ups, so the other partitions of the fetch are answered meanwhile.
func (s *Server) coldRead(p *partition, offset, maxBytes, stop int64) (*tiering.ColdRead, <-chan struct{}, error) {
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	var r *tiering.ColdRead
	var wait <-chan struct{}
	var err error
	if stop < math.MaxInt64 {
		// read_committed: no segment past the last stable offset.
		r, wait, err = s.cfg.Tier.ReadNoWaitStable(ctx, p.tierKey(), offset, maxBytes, stop)
	} else {
		r, wait, err = s.cfg.Tier.ReadNoWait(ctx, p.tierKey(), offset, maxBytes)
	}
	if errors.Is(err, tiering.ErrOffsetNotTiered) {
		return nil, nil, log.ErrOffsetOutOfRange
	}
	if err != nil {
		// The bucket failed (missing or corrupt object, outage): a retriable
		// storage error for this partition, never garbage.
		s.logger.Debug("cold read failed", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
		return nil, nil, fmt.Errorf("%w: tiered store: %v", log.ErrStorage, err)
	}
	if r != nil && r.Len == 0 && r.Next <= offset {
		r.Release()
		r = nil
	}
	// Len 0 with Next past offset: compaction emptied the bucket's
	// segments from offset on; the fetch goes on in the local log at Next.
	return r, wait, nil
}

// queueTopicsMirror is the registry's mirror hook (called under its lock
// after every save of topics.json): it keeps the bytes for mirrorTopics and
// asks the maintenance loop for a pass.
func (s *Server) queueTopicsMirror(b []byte) {
	s.topicsMirror.queue(b)
	s.kickTiering()
}

// mirrorTopics copies the last saved topics.json to the bucket if it
// changed since the last copy; it reports whether the bucket has the
// latest copy.
func (s *Server) mirrorTopics(ctx context.Context) bool {
	s.meta.mirror.copy(ctx, s.cfg.Tier, s.repeat) // meta.json beside it: the epoch and producer ids a restore starts above
	return s.topicsMirror.copy(ctx, s.cfg.Tier, s.repeat)
}

// restoreMeta starts a restored broker above the bucket's copy of
// meta.json: a leader epoch above the mirrored one, producer ids above
// those handed out (an older bucket has no copy: nothing to do). Each
// start runs it while the restore marker is there, before the marker
// goes, so a crash cannot skip it.
func (s *Server) restoreMeta(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	b, err := s.cfg.Tier.Store().GetRange(ctx, metaMirrorKey, 0, -1)
	if errors.Is(err, tiering.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("broker: restore: read %s from the tiered store: %w", metaMirrorKey, err)
	}
	m, err := decodeMirroredMeta(b)
	if err != nil {
		return err
	}
	if err := s.meta.reserveProducerIDsBelow(m.ProducerIDEnd); err != nil {
		return err
	}
	if m.LeaderEpoch >= 0 && m.LeaderEpoch < maxFoundEpoch {
		if err := s.meta.raiseLeaderEpoch(m.LeaderEpoch + 1); err != nil {
			return err
		}
	}
	s.logger.Info("restored broker metadata from the tiered store", zap.Int32("mirrored_leader_epoch", m.LeaderEpoch),
		zap.Int32("leader_epoch", s.meta.m.LeaderEpoch), zap.Int64("producer_id_end", m.ProducerIDEnd))
	return nil
}

// restorePending, in the data directory, marks a restore from the bucket
// not finished yet: partitions may still need rebasing.
const restorePending = "tier-restore.pending"

// restoreFromTier fills an empty data directory from the bucket: topics.json
// comes back, every partition is created empty and rebased at the offset
// after its last uploaded segment, so old data is served cold and new data
// continues the log. It reports whether anything was restored.
func restoreFromTier(ctx context.Context, dataDir string, t *tiering.Tier, logger *zap.Logger) (bool, error) {
	if _, err := os.Stat(filepath.Join(dataDir, topicsFile)); err == nil {
		return false, nil
	}
	// Users and ACLs before topics.json: once that is written this is no
	// longer an empty data directory, and they would not be looked for.
	if err := restoreSecurityFiles(ctx, dataDir, t, logger); err != nil {
		return false, err
	}
	b, err := t.Store().GetRange(ctx, metaKey, 0, -1)
	if errors.Is(err, tiering.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("broker: restore: read %s from the tiered store: %w", metaKey, err)
	}
	// The marker first: until every partition is rebased (rebaseRestored),
	// each start finishes the restore, and only then do bucket errors stop
	// the start.
	if err := log.WriteFileAtomic(log.OSFS, filepath.Join(dataDir, restorePending), nil); err != nil {
		return false, err
	}
	if err := log.WriteFileAtomic(log.OSFS, filepath.Join(dataDir, topicsFile), b); err != nil {
		return false, err
	}
	logger.Info("restoring topics from the tiered store", zap.Int("bytes", len(b)))
	return true, nil
}

// rebaseRestored starts each empty partition where the bucket's log ends,
// with the producer state mirrored beside it. It runs while the restore
// marker is there (no request served yet), so it may run again after a
// crash part way: a partition already rebased (empty, ending where the
// bucket does) gets its producer state installed again, and the id floor
// is reserved before the rebase, so no crash point loses it. Each
// partition has its own minute with the bucket.
func (s *Server) rebaseRestored(ctx context.Context) error {
	for _, t := range s.reg.all() {
		for _, p := range s.reg.partitionsOf(t) {
			if p.log.LocalBytes() != 0 || len(p.log.SealedSegments()) != 0 {
				continue // has local data: not a restore
			}
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := s.rebasePartition(pctx, p)
			cancel()
			if err != nil {
				return fmt.Errorf("broker: restore %s-%d: %w", t.name, p.index, err)
			}
		}
	}
	return nil
}

func (s *Server) rebasePartition(ctx context.Context, p *partition) error {
	m, err := s.cfg.Tier.Manifest(ctx, p.tierKey())
	if err != nil {
		return err
	}
	if m.Next() == 0 || m.Next() < p.log.LogEndOffset() {
		return nil // nothing in the bucket beyond what the empty log already starts at
	}
	b, err := s.cfg.Tier.Store().GetRange(ctx, producersKey(p.tierKey()), 0, -1)
	if errors.Is(err, tiering.ErrNotFound) {
		b, err = nil, nil
	}
	if err != nil {
		return fmt.Errorf("producer state: %w", err)
	}
	var producers map[int64]*producerState
	var open map[int64]int64
	if b != nil {
		var floor int64
		if producers, open, floor, err = restoredProducers(b, m.Next()); err != nil {
			s.logger.Warn("restore producer state", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
		} else if err := s.meta.reserveProducerIDsBelow(floor); err != nil {
			return err
		}
	}
	if m.Next() > p.log.LogEndOffset() {
		if err := p.log.Rebase(m.Next(), m.LogStartOffset); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(p.log.Dir(), producersFile)); producers != nil && errors.Is(err, fs.ErrNotExist) {
		// Not yet installed by an earlier pass of this restore (which
		// writes producers.json): a state of its own is never replaced.
		p.restoreProducers(producers, open)
	}
	s.logger.Info("restored partition from the tiered store", zap.String("topic", p.topic.name),
		zap.Int32("partition", p.index), zap.Int64("log_start_offset", m.LogStartOffset), zap.Int64("next_offset", m.Next()))
	return nil
}

// The final offload's parallelism: how many partitions it uploads at
// once, and how many it seals at once (a few fsyncs each; a disk takes
// many at once). More than a maintenance pass's tierParallelism: nothing
// else runs during a stop, and with thousands of partitions the
// per-partition round trips and fsyncs, not bandwidth, take the time.
// Sealing keeps ahead of uploading: a partition sealed but not uploaded is
// uploaded by the first pass after the next start, one never sealed only
// once segment.ms or segment.bytes seals it.
const (
	finalUploadParallelism = 32
	finalSealParallelism   = 32
)

// offloadResult counts what a final offload did, for its log line.
type offloadResult struct {
	partitions int // partitions with tiering
	uploaded   int // partitions whose every sealed segment is in the bucket
	segments   int // segments uploaded by the offload
	failed     int // partitions whose upload failed (the bucket's error)
	// leftSegments are sealed segments still not in the bucket (for a
	// partition whose manifest is not in memory: all its sealed segments,
	// an upper bound): the first maintenance pass after the next start
	// uploads them.
	leftSegments int
	// unsealed are partitions the offload never reached with data in
	// their active segment: it stays local and is uploaded once sealed
	// (segment.ms, segment.bytes), as always.
	unsealed int
}

// stuckUploadGrace is how long a final offload waits, once its deadline
// has passed, for uploads that do not return on cancellation (a store
// call stuck in the kernel); then the stop goes on without them. Their
// partitions' files stay (closing deletes nothing), so a late upload
// either completes a consistent manifest or fails.
const stuckUploadGrace = 250 * time.Millisecond

// offloadAll seals and uploads every partition's data, so a graceful stop
// leaves the bucket complete, up to ctx's end: partitions are sealed
// (finalSealParallelism at once) and handed to finalUploadParallelism
// uploaders as they are, beside the copies of topics.json, the security
// files and the groups. When ctx ends the uploads under way are cancelled
// (their objects are orphans the next start's sweep removes) and nothing
// new starts: what did not fit stays local, safely, and the log line says
// how much. The maintenance loop has ended (no other upload runs).
func (s *Server) offloadAll(ctx context.Context) offloadResult {
	start := time.Now()
	var parts []*partition
	for _, t := range s.reg.all() {
		parts = append(parts, s.reg.partitionsOf(t)...)
	}
	res := offloadResult{partitions: len(parts)}
	done := make([]atomic.Bool, len(parts))   // every sealed segment in the bucket
	sealed := make([]atomic.Bool, len(parts)) // Roll ran (or found nothing to seal)
	var segments, failed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.mirrorTopics(ctx)
		s.mirrorSecurity(ctx)
		if s.grp() != nil {
			s.mirrorGroups(ctx)
		}
		s.mirrorTxns(ctx)
	}()
	toUpload := make(chan int, len(parts))
	go func() {
		defer close(toUpload)
		parallel.Each(finalSealParallelism, len(parts), func(i int) {
			if ctx.Err() != nil {
				return
			}
			if err := parts[i].log.Roll(); err != nil {
				return // offline (or closed): nothing to upload from it
			}
			sealed[i].Store(true)
			toUpload <- i
		})
	}()
	go func() {
		defer wg.Done()
		parallel.Each(finalUploadParallelism, finalUploadParallelism, func(int) {
			for i := range toUpload {
				if ctx.Err() != nil {
					continue // drain: the sealers stop soon too
				}
				p := parts[i]
				n, err := s.cfg.Tier.Upload(ctx, p.tierKey(), p.log)
				segments.Add(int64(n))
				if err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
						s.repeat.Warn("final upload", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
					}
					continue
				}
				done[i].Store(true)
				if n > 0 || p.mirrorDue.Load() {
					s.mirrorProducers(ctx, p)
				}
			}
		})
	}()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	stuck := false
	select {
	case <-finished:
	case <-ctx.Done():
		t := time.NewTimer(stuckUploadGrace)
		select {
		case <-finished:
		case <-t.C:
			stuck = true
		}
		t.Stop()
	}
	res.segments, res.failed = int(segments.Load()), int(failed.Load())
	for i, p := range parts {
		if done[i].Load() {
			res.uploaded++
			continue
		}
		if !sealed[i].Load() && activeHasData(p.log) {
			res.unsealed++
		}
		uploaded := int64(-1) // unknown: every sealed segment counts
		if s.cfg.Tier.ManifestCached(p.tierKey()) {
			if m, err := s.cfg.Tier.Manifest(ctx, p.tierKey()); err == nil {
				uploaded = m.Next()
			}
		}
		for _, sg := range p.log.SealedSegments() {
			if sg.Next > uploaded {
				res.leftSegments++
			}
		}
	}
	fields := []zap.Field{zap.Int("partitions", res.partitions), zap.Int("partitions_uploaded", res.uploaded),
		zap.Int("segments_uploaded", res.segments), zap.Int("segments_left_local", res.leftSegments),
		zap.Int("partitions_unsealed", res.unsealed), zap.Int("partitions_failed", res.failed),
		zap.Bool("store_calls_stuck", stuck), zap.Duration("took", time.Since(start).Round(time.Millisecond))}
	switch {
	case res.uploaded == res.partitions:
		s.logger.Info("final offload: every partition sealed and uploaded", fields...)
	case ctx.Err() != nil:
		s.logger.Warn("final offload cut short by the shutdown deadline: what is left stays local, safely, and is uploaded after the next start", fields...)
	default:
		s.logger.Warn("final offload incomplete (uploads failed): what is left stays local, safely, and is uploaded after the next start", fields...)
	}
	return res
}

// activeHasData reports whether lp's active segment holds records.
func activeHasData(lp *log.Partition) bool {
	base := lp.LocalStartOffset()
	if sealed := lp.SealedSegments(); len(sealed) > 0 {
		base = sealed[len(sealed)-1].Next
	}
	return lp.LogEndOffset() > base
}

// TierStatus is what /status reports about tiering.
type TierStatus struct {
	tiering.Stats
	// LagBytes and LagSegments are sealed local segments not yet in the
	// bucket (active segments come on top): with the local disk lost, this
	// is what would be gone.
	LagBytes      int64   `json:"lag_bytes"`
	LagSegments   int64   `json:"lag_segments"`
	CacheHitRatio float64 `json:"cache_hit_ratio"`
}

// TierStatus reports upload lag and the tier's counters; ok is false
// without tiering.
func (s *Server) TierStatus(ctx context.Context) (st TierStatus, ok bool) {
	t := s.cfg.Tier
	if t == nil {
		return st, false
	}
	st.Stats = t.Stats()
	if n := st.CacheHits + st.CacheMisses; n > 0 {
		st.CacheHitRatio = float64(st.CacheHits) / float64(n)
	}
	for _, tp := range s.reg.all() {
		for _, p := range s.reg.partitionsOf(tp) {
			uploaded := int64(-1) // unknown: every sealed segment counts as lag
			if t.ManifestCached(p.tierKey()) || ctx.Err() == nil {
				if m, err := t.Manifest(ctx, p.tierKey()); err == nil {
					uploaded = m.Next()
				}
			}
			for _, seg := range p.log.SealedSegments() {
				if seg.Next > uploaded {
					st.LagBytes += seg.Size
					st.LagSegments++
				}
			}
		}
	}
	return st, true
}

// cleanOrphans removes objects no manifest names (interrupted uploads or
// retention passes, failed deletes) and the objects of deleted topics
// still pending (forgetPending): at start-up before the first upload, then
// every OrphanSweepInterval between two maintenance passes (no upload is
// under way then).
func (s *Server) cleanOrphans() {
	s.forgetPending() // deleted topics' objects a delete left behind
	// Incomplete multipart uploads an interrupted upload left (stored and
	// billed, but in no listing of objects): none of ours runs now.
	// A bucket clean uploads outside the tiering passes: not while one runs
	// (the next sweep aborts what is left).
	if s.cleanerUploads.TryLock() {
		ctx, cancel := context.WithTimeout(s.ctx, tierOpTimeout)
		if n, err := s.cfg.Tier.AbortUploads(ctx); err != nil {
			s.logger.Warn("abort incomplete uploads (retried at the next sweep)", zap.Error(err))
		} else if n > 0 {
			s.logger.Info("aborted incomplete uploads", zap.Int("uploads", n))
		}
		cancel()
		s.cleanerUploads.Unlock()
	}
	// A few partitions at once, as uploads; the first store error ends the
	// sweep (the bucket is away or refusing: the next sweep tries again).
	sem := make(chan struct{}, tierParallelism)
	var wg sync.WaitGroup
	var failed atomic.Bool
	for _, t := range s.reg.all() {
		for _, p := range s.reg.partitionsOf(t) {
			if s.ctx.Err() != nil || failed.Load() {
				break
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if !p.tierMu.TryLock() {
					return // the cleaner is writing objects its manifest will name: the next sweep
				}
				defer p.tierMu.Unlock()
				ctx, cancel := context.WithTimeout(s.ctx, tierOpTimeout)
				n, err := s.cfg.Tier.CleanOrphans(ctx, p.tierKey())
				cancel()
				if err != nil {
					if !failed.Swap(true) {
						s.logger.Warn("clean orphan objects (the sweep stops here, retried later)", zap.String("topic", t.name), zap.Int32("partition", p.index), zap.Error(err))
					}
				} else if n > 0 {
					s.logger.Info("cleaned orphan objects", zap.String("topic", t.name), zap.Int32("partition", p.index), zap.Int("objects", n))
				}
			}()
		}
	}
	wg.Wait()
}

// producersKey is where a partition's producer snapshot is mirrored.
func producersKey(pk tiering.PartitionKey) string {
	return fmt.Sprintf("_synapse/producers/%s-%x/%d.json", pk.Topic, pk.TopicID, pk.Partition)
}

// mirrorProducers copies the idempotent-producer state covering what the
// bucket holds, so a restored broker still recognises retried batches. It
// reports whether the bucket's copy is current.
func (s *Server) mirrorProducers(ctx context.Context, p *partition) bool {
	m, err := s.cfg.Tier.Manifest(ctx, p.tierKey())
	if err != nil {
		return false
	}
	b := p.producerSnapshotBelow(m.Next(), s.meta.producerIDEnd())
	if b == nil {
		return true
	}
	if err := s.cfg.Tier.PutMeta(ctx, producersKey(p.tierKey()), b); err != nil {
		s.repeat.Warn("mirror producer state", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
		return false
	}
	return true
}

// forgetTiered has a deleted topic's objects deleted from the bucket by
// the next maintenance pass (the topic id in the keys keeps them from ever
// mixing with a new topic of the same name). The partitions are first
// recorded in <data-dir>/tier-forget.json (recordForgets), and each orphan
// sweep retries what is still there, so a delete during an outage or cut
// short by a crash is finished later rather than leaked. The deletion runs
// on the maintenance goroutine, after the pass's uploads: an upload of the
// same partition still under way would otherwise put back objects and a
// manifest after they were deleted.
func (s *Server) forgetTiered() {
	s.forgetDue.Store(true)
	s.kickTiering()
}

// recordForgets adds parts to forgetFile (DeleteTopics does it before the
// topic goes), or with undo takes them out again (the delete failed).
func (s *Server) recordForgets(parts []*partition, undo bool) {
	if err := s.editForgets(func(m map[tiering.PartitionKey]bool) {
		for _, p := range parts {
			if undo {
				delete(m, p.tierKey())
			} else {
				m[p.tierKey()] = true
			}
		}
	}); err != nil {
		s.logger.Warn("record a deleted topic's objects for deletion", zap.Error(err))
	}
}

// pruneForgets drops forgetFile entries of topics that exist: a delete
// that crashed between recording and removing the topic. Only at start,
// before any request: a DeleteTopics records its entries before the topic
// goes, so while requests are served such an entry is not stale.
func (s *Server) pruneForgets() {
	if err := s.editForgets(func(m map[tiering.PartitionKey]bool) {
		for k := range m {
			if s.reg.getByID(k.TopicID) != nil {
				delete(m, k)
			}
		}
	}); err != nil {
		s.logger.Warn("prune the deleted topics' objects to delete", zap.Error(err))
	}
}

// forgetFile lists partitions of deleted topics whose objects may still be
// in the bucket.
const forgetFile = "tier-forget.json"

// forgetRecord is one forgetFile entry.
type forgetRecord struct {
	Topic     string `json:"topic"`
	TopicID   string `json:"topic_id"`
	Partition int32  `json:"partition"`
}

// editForgets applies edit to the set of partitions whose objects are to be
// deleted and saves it (forgetMu).
func (s *Server) editForgets(edit func(map[tiering.PartitionKey]bool)) error {
	s.forgetMu.Lock()
	defer s.forgetMu.Unlock()
	m := s.readForgetsLocked()
	edit(m)
	recs := make([]forgetRecord, 0, len(m))
	for k := range m {
		recs = append(recs, forgetRecord{k.Topic, hex.EncodeToString(k.TopicID[:]), k.Partition})
	}
	sort.Slice(recs, func(i, j int) bool {
		return recs[i].Topic < recs[j].Topic || recs[i].Topic == recs[j].Topic && recs[i].Partition < recs[j].Partition
	})
	b, err := json.Marshal(recs)
	if err != nil {
		return err
	}
	return log.WriteFileAtomic(log.OSFS, filepath.Join(s.cfg.DataDir, forgetFile), b)
}

// readForgetsLocked reads forgetFile (empty if missing or unreadable).
func (s *Server) readForgetsLocked() map[tiering.PartitionKey]bool {
	m := map[tiering.PartitionKey]bool{}
	b, err := os.ReadFile(filepath.Join(s.cfg.DataDir, forgetFile))
	if err != nil {
		return m
	}
	var recs []forgetRecord
	if err := json.Unmarshal(b, &recs); err != nil {
		// Kept aside for the operator (the objects it listed are not
		// swept by anything else) rather than overwritten by the next edit.
		aside := fmt.Sprintf("%s.unreadable-%d", forgetFile, time.Now().UnixNano())
		rerr := os.Rename(filepath.Join(s.cfg.DataDir, forgetFile), filepath.Join(s.cfg.DataDir, aside))
		s.logger.Error("deleted topics' objects to delete: file unreadable, moved aside; the objects it lists stay in the bucket",
			zap.String("file", forgetFile), zap.String("moved_to", aside), zap.Error(err), zap.NamedError("move_error", rerr))
		return m
	}
	for _, r := range recs {
		var k tiering.PartitionKey
		id, err := hex.DecodeString(r.TopicID)
		if err != nil || len(id) != len(k.TopicID) {
			continue
		}
		k.Topic, k.Partition = r.Topic, r.Partition
		copy(k.TopicID[:], id)
		m[k] = true
	}
	return m
}

// forgetPending deletes the objects of the partitions in forgetFile, once
// topics.json without their topics is in the bucket (else a restore would
// bring back a topic whose objects are gone), and drops each from
// forgetFile when its objects are gone. What fails stays for the next
// sweep. It runs on the maintenance goroutine only, between passes (no
// upload under way).
func (s *Server) forgetPending() {
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Minute)
	defer cancel()
	var keys []tiering.PartitionKey
	s.forgetMu.Lock()
	for k := range s.readForgetsLocked() {
		keys = append(keys, k)
	}
	s.forgetMu.Unlock()
	if len(keys) == 0 || !s.mirrorTopics(ctx) {
		return
	}
	var done []tiering.PartitionKey
	failed := 0
	for _, pk := range keys {
		if s.reg.getByID(pk.TopicID) != nil {
			// Recorded by a DeleteTopics that has not removed the topic
			// yet (or failed to, and takes the entry out itself).
			continue
		}
		err := s.cfg.Tier.Forget(ctx, pk)
		if err == nil {
			err = s.cfg.Tier.Store().Delete(ctx, producersKey(pk))
			if errors.Is(err, tiering.ErrNotFound) {
				err = nil
			}
		}
		if err != nil {
			s.repeat.Warn("delete a deleted topic's objects (retried at the next sweep)", zap.String("topic", pk.Topic), zap.Int32("partition", pk.Partition), zap.Error(err))
			if failed++; failed >= 3 {
				break // the bucket is away or refusing: the rest can wait too
			}
			continue // one partition's trouble does not hold up the others
		}
		done = append(done, pk)
	}
	if len(done) > 0 {
		if err := s.editForgets(func(m map[tiering.PartitionKey]bool) {
			for _, k := range done {
				delete(m, k)
			}
		}); err != nil {
			s.logger.Warn("record deleted objects", zap.Error(err))
		}
	}
}
