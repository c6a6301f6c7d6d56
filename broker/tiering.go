package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

// Tiering glue: what the broker does with a tiering.Tier. The maintenance
// loop uploads sealed segments, releases local copies outside the hot budget
// and applies retention over the whole log; fetches below the local start
// are served from the bucket. Mirrors and restore: tiering_restore.go; the
// final offload: tiering_offload.go; orphans and deleted topics:
// tiering_forget.go.

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
	// In a cluster: the role (leader or not, epoch) and the committed
	// manifest pointer's revision.
	lead  bool
	epoch int32
	ptr   int64
	at    time.Time
}

func (s *Server) tierSigOf(p *partition, now time.Time) tierSig {
	sig := tierSig{leo: p.log.LogEndOffset(), logStart: p.log.LogStartOffset(), localStart: p.log.LocalStartOffset(),
		segments: p.log.SegmentCount(), firstDirty: p.log.FirstDirtyOffset(), configs: s.reg.configGenOf(p.topic), at: now}
	if s.cl != nil {
		r := roleOf(p)
		sig.lead, sig.epoch, sig.ptr = r.isLeader, r.epoch, s.cl.tierPtrRev(p)
	}
	return sig
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
	// In a cluster only the leader uploads (to its high watermark) and
	// applies retention; a follower only releases what the bucket holds.
	lead, limit := true, int64(math.MaxInt64)
	if s.cl != nil {
		lead, limit = s.cl.tierRole(p)
	}
	var n int
	var err error
	if lead {
		if n, err = t.UploadBelow(ctx, pk, p.log, limit); err != nil {
			warn("upload to the tiered store", err) // retried next pass
			return false
		}
	}
	idle = n == 0
	if n > 0 {
		p.mirrorDue.Store(true)
	}
	if p.mirrorDue.Load() && lead {
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
	if !lead {
		return idle
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
