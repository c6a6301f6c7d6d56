package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/internal/parallel"
	"github.com/synapsebroker/synapse/log"
)

// The final offload: a graceful stop seals and uploads every partition.

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
