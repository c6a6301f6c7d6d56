package broker

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/synapsebroker/synapse/log"
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
	t := time.NewTicker(s.cfg.CleanerBackoff)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		for s.ctx.Err() == nil {
			c, ok := s.nextToClean()
			if !ok {
				break
			}
			if km == nil {
				km = log.NewKeyMap(s.cfg.CleanerDedupeBufferSize)
			}
			s.cleanOne(c, km, limiter)
		}
	}
}

// nextToClean picks the partition to clean next, if any is due.
func (s *Server) nextToClean() (cleanCandidate, bool) {
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
			if p.log == nil || p.log.Err() != nil {
				continue
			}
			ratio, dirty, _ := p.log.CleanableDirtyRatio()
			maxRatio = max(maxRatio, ratio)
			if dirty == 0 {
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
			if ratio < minRatio && !overdue {
				continue
			}
			c := cleanCandidate{t: t, p: p, set: set, ratio: ratio, overdue: overdue}
			if !found || c.overdue && !best.overdue || c.overdue == best.overdue && c.ratio > best.ratio {
				best, found = c, true
			}
		}
	}
	s.cleaner.maxDirtyRatio.Store(math.Float64bits(maxRatio))
	return best, found
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
	// swap replaces), and with a tier only what the bucket does not hold
	// yet is rewritten locally: a segment already uploaded stays as the
	// bucket has it, so its local copy can still be released.
	c.p.tierMu.Lock()
	defer c.p.tierMu.Unlock()
	if t := s.cfg.Tier; t != nil {
		ctx, cancel := context.WithTimeout(s.ctx, tierOpTimeout)
		m, err := t.Manifest(ctx, c.p.tierKey())
		cancel()
		if err != nil {
			s.repeat.Warn("log cleaner: manifest unknown, not cleaning", zap.String("topic", c.t.name), zap.Int32("partition", c.p.index), zap.Error(err))
			return
		}
		cfg.RewriteFrom = m.Next()
	}
	res, err := c.p.log.Clean(s.ctx, cfg)
	s.cleaner.bytesRead.Add(res.Stats.BytesRead)
	s.cleaner.bytesWritten.Add(res.Stats.BytesWritten)
	if err != nil {
		if errors.Is(err, log.ErrCleanRaced) || s.ctx.Err() != nil {
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
		zap.Int64("bytes_read", res.Stats.BytesRead), zap.Int64("bytes_written", res.Stats.BytesWritten),
		zap.Float64("dirty_ratio_before", res.DirtyRatioBefore), zap.Float64("dirty_ratio_after", res.DirtyRatioAfter))
}
