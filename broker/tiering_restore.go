package broker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

// The bucket as a backup of the broker: topics.json, meta.json and each
// partition's producer state are mirrored there, and an empty data
// directory is restored from it (single-node mode; a cluster keeps its
// metadata in etcd).

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
