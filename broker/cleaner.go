package broker

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

// The log cleaner's scheduler (Kafka's LogCleanerManager with one cleaner
// thread): every CleanerBackoff it takes the compacted partition most in
// need of cleaning, cleans it (log.Partition.Clean) and looks again, until
// no partition is due. A partition is due when its cleanable dirty ratio is
// at least min.cleanable.dirty.ratio, or when its oldest dirty segment is
// older than max.compaction.lag.ms. Dirtiest first; the max-lag ones
// before the others, as Kafka orders them.

// cleanerStats are the cleaner's counters for /metrics.
type cleanerStats struct {
	bytesRead, bytesWritten atomic.Int64
	cleans, failures        atomic.Int64
	bucketSegments          atomic.Int64 // cleaned segments swapped into the bucket by CleanBucket
	lastClean               atomic.Int64 // unix ms of the last clean's end; 0: none
	maxDirtyRatio           atomic.Uint64
}

func configFloat(set map[string]string, name string) float64 {
	v, _ := configValue(set, name)
	f, _ := strconv.ParseFloat(v, 64)
	return f
}

// cleanCandidate is one partition the cleaner may clean now.
type cleanCandidate struct {
	t       *topic
	p       *partition
	set     map[string]string
	ratio   float64
	overdue bool // max.compaction.lag.ms passed
}

// cleanerLoop runs the cleaner until the server stops (maintain starts it
// and waits for it: a clean in flight ends with s.ctx).
func (s *Server) cleanerLoop(done chan<- struct{}) {
	defer close(done)
	var limiter *rate.Limiter
	if r := s.cfg.CleanerIOMaxBytesPerSecond; r > 0 {
		limiter = rate.NewLimiter(rate.Limit(r), int(min(r, 1<<20)))
	}
	var km *log.KeyMap // allocated at the first clean, reused
	if s.cfg.Tier != nil {
		// Bucket cleans stage their output here; a crash leaves files behind.
		os.RemoveAll(s.cleanerTempDir())
	}
	t := time.NewTicker(s.cfg.CleanerBackoff)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		// Each partition at most once per pass: one that fails, or stays
		// due after its clean, waits for the next tick.
		done := map[*partition]bool{}
		for s.ctx.Err() == nil {
			c, ok := s.nextToClean(done)
			if !ok {
				break
			}
			done[c.p] = true
			if km == nil {
				km = log.NewKeyMap(s.cfg.CleanerDedupeBufferSize)
			}
			s.cleanOne(c, km, limiter)
		}
	}
}

// nextToClean picks the partition to clean next, if any is due.
func (s *Server) nextToClean(done map[*partition]bool) (cleanCandidate, bool) {
	now := s.cfg.Now()
	var best cleanCandidate
	found := false
	var maxRatio float64
	for _, t := range s.reg.all() {
		set := s.reg.configsOf(t)
		if !compacted(set) {
			continue
		}
		minRatio := configFloat(set, "min.cleanable.dirty.ratio")
		maxLag := time.Duration(configInt(set, "max.compaction.lag.ms")) * time.Millisecond
		for _, p := range s.reg.partitionsOf(t) {
			if p.log == nil || p.log.Err() != nil || done[p] {
				continue
			}
			ratio, dirty, cleanable := p.log.CleanableDirtyRatio()
			if b := s.bucketOnlyBytes(p); b > 0 && dirty > 0 {
				// The bucket's segments below the local log are part of what
				// a clean reads: at the default ratio 0.5 each byte they hold
				// is downloaded at most once per byte of new dirty data.
				ratio = float64(dirty) / float64(cleanable+b)
			}
			maxRatio = max(maxRatio, ratio)
			due := p.log.DeleteHorizonDue(now)
			if dirty == 0 && !due {
				continue
			}
			overdue := false
			if maxLag > 0 && maxLag < time.Duration(1<<62) {
				first := p.log.FirstDirtyOffset()
				for _, seg := range p.log.SealedSegments() {
					if seg.Next > first {
						overdue = seg.MaxTimestamp >= 0 && now.Sub(time.UnixMilli(seg.MaxTimestamp)) > maxLag
						break
					}
				}
			}
			if ratio < minRatio && !overdue && !due {
				continue
			}
			c := cleanCandidate{t: t, p: p, set: set, ratio: ratio, overdue: overdue}
			if !found || c.overdue && !best.overdue || c.overdue == best.overdue && c.ratio > best.ratio {
				best, found = c, true
			}
		}
	}
	if len(done) == 0 { // the pass's first look saw every partition
		s.cleaner.maxDirtyRatio.Store(math.Float64bits(maxRatio))
	}
	return best, found
}

// cleanerTempDir holds bucket cleans' output until it is uploaded (no
// dash in the name: the registry's orphan sweep passes it by).
func (s *Server) cleanerTempDir() string { return filepath.Join(s.cfg.DataDir, ".cleaner") }

// bucketOnlyBytes is what the bucket holds of p below its local log
// (from the cached manifest; 0 if none is cached).
func (s *Server) bucketOnlyBytes(p *partition) int64 {
	t := s.cfg.Tier
	if t == nil || !t.ManifestCached(p.tierKey()) {
		return 0
	}
	m, err := t.Manifest(s.ctx, p.tierKey())
	if err != nil {
		return 0
	}
	var n int64
	for _, sg := range m.OnlyInBucket(p.log.LocalStartOffset()) {
		n += sg.Size
	}
	return n
}

// cleanOne cleans c's partition and records the outcome.
func (s *Server) cleanOne(c cleanCandidate, km *log.KeyMap, limiter *rate.Limiter) {
	cfg := log.CleanConfig{
		Now:              s.cfg.Now,
		DeleteRetention:  time.Duration(configInt(c.set, "delete.retention.ms")) * time.Millisecond,
		MinCompactionLag: time.Duration(configInt(c.set, "min.compaction.lag.ms")) * time.Millisecond,
		KeyMap:           km,
		StableOffset:     func() int64 { return c.p.lastStable(c.p.log.HighWatermark()) },
	}
	if cfg.DeleteRetention == 0 {
		cfg.DeleteRetention = -1 // 0 on the topic: none (log.CleanConfig's 0 means the default)
	}
	if limiter != nil {
		cfg.Throttle = log.RateThrottle(limiter)
	}
	// Not beside the partition's tiering step (an upload reads the files a
	// swap replaces, a bucket clean swaps manifest entries). With a tier
	// the bucket's segments below the local log are cleaned with the same
	// key map first (tiering.CleanBucket); local segments the bucket also
	// holds are cleaned here and uploaded again by the next tiering pass.
	c.p.tierMu.Lock()
	defer c.p.tierMu.Unlock()
	s.cleanerUploads.RLock() // the orphan sweep aborts no upload of ours meanwhile
	defer s.cleanerUploads.RUnlock()
	var bucket tiering.BucketCleanResult
	// In a cluster only the leader cleans the bucket (its commits are
	// fenced by its epoch); every replica cleans its own disk.
	if t := s.cfg.Tier; t != nil && (s.cl == nil || roleOf(c.p).isLeader) {
		cfg.Below = func(ctx context.Context, km *log.KeyMap, end int64, retain map[int64]bool) (log.CleanStats, error) {
			if err := os.MkdirAll(s.cleanerTempDir(), 0o755); err != nil {
				return log.CleanStats{}, err
			}
			var err error
			bucket, err = t.CleanBucket(ctx, c.p.tierKey(), c.p.log, tiering.BucketCleanConfig{Map: km, End: end,
				NowMs: s.cfg.Now().UnixMilli(), DeleteRetentionMs: max(cfg.DeleteRetention, 0).Milliseconds(), Retain: retain,
				SegmentBytes: configInt(c.set, "segment.bytes"), IndexIntervalBytes: configInt(c.set, "index.interval.bytes"),
				Throttle: cfg.Throttle, TempDir: s.cleanerTempDir()})
			s.cleaner.bucketSegments.Add(int64(bucket.Swapped))
			return bucket.Stats, err
		}
	}
	res, err := c.p.log.Clean(s.ctx, cfg)
	s.cleaner.bytesRead.Add(res.Stats.BytesRead)
	s.cleaner.bytesWritten.Add(res.Stats.BytesWritten)
	if err != nil {
		if errors.Is(err, log.ErrCleanRaced) || errors.Is(err, tiering.ErrBucketCleanRaced) || s.ctx.Err() != nil {
			return // segments moved under it: the next pass cleans again
		}
		s.cleaner.failures.Add(1)
		s.repeat.Warn("log cleaner", zap.String("topic", c.t.name), zap.Int32("partition", c.p.index), zap.Error(err))
		return
	}
	s.cleaner.cleans.Add(1)
	s.cleaner.lastClean.Store(time.Now().UnixMilli())
	s.logger.Debug("cleaned", zap.String("topic", c.t.name), zap.Int32("partition", c.p.index),
		zap.Int64("first_dirty", res.FirstDirty), zap.Int64("end", res.End),
		zap.Int("segments_in", res.SegmentsIn), zap.Int("segments_out", res.SegmentsOut),
		zap.Int("bucket_segments_in", bucket.SegmentsIn), zap.Int("bucket_segments_out", bucket.SegmentsOut),
		zap.Int64("bytes_read", res.Stats.BytesRead), zap.Int64("bytes_written", res.Stats.BytesWritten),
		zap.Float64("dirty_ratio_before", res.DirtyRatioBefore), zap.Float64("dirty_ratio_after", res.DirtyRatioAfter))
}
