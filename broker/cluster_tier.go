package broker

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/coord"
	"github.com/synapsebroker/synapse/tiering"
)

// Tiering in a cluster. The brokers share one bucket; each partition's
// leader is the only broker that uploads it, up to its high watermark, at
// its leader epoch (in the objects' keys). The commit point is the
// partition's pointer in etcd (tier/<topic>/<p>), written by compare-and-
// swap on the partition state the leader read itself in and on the pointer
// it last saw: a deposed leader's uploads never become part of the log
// (tiering/fenced.go). Followers follow the pointer from the watched view
// and release local segments the manifest covers. A follower whose fetch
// offset is below its leader's local log (answered
// OFFSET_MOVED_TO_TIERED_STORAGE, as KIP-405's leaders do) starts its log
// over where the bucket's log ends: an empty disk copies only the tail.

// tierCommitter is the cluster's tiering.Committer.
type tierCommitter struct{ cl *cluster }

func partKeyOf(pk tiering.PartitionKey) coord.PartKey {
	return coord.PartKey{Topic: pk.Topic, Partition: pk.Partition}
}

// tierPartition is pk's local partition, if it is still that topic's.
func (c tierCommitter) tierPartition(pk tiering.PartitionKey) *partition {
	p := c.cl.partitionFor(pk.Topic, pk.Partition)
	if p == nil || p.topic.id != pk.TopicID {
		return nil
	}
	return p
}

func (c tierCommitter) Committed(pk tiering.PartitionKey) (string, int64, error) {
	v := c.cl.currentView()
	if v == nil {
		return "", 0, errors.New("cluster: no view of the cluster yet")
	}
	ptr, ok := v.Tier[partKeyOf(pk)]
	return checkPointer(pk, ptr, ok)
}

func (c tierCommitter) Latest(ctx context.Context, pk tiering.PartitionKey) (string, int64, error) {
	start := time.Now()
	ptr, ok, err := c.cl.client().ManifestPointer(ctx, partKeyOf(pk))
	c.cl.observeEtcd(start)
	if err != nil {
		return "", 0, err
	}
	return checkPointer(pk, ptr, ok)
}

// checkPointer returns a pointer's key and token if it is pk's topic's.
func checkPointer(pk tiering.PartitionKey, ptr coord.TierPtr, ok bool) (string, int64, error) {
	if !ok {
		return "", 0, nil
	}
	if !strings.HasPrefix(ptr.Manifest, pk.Topic+"-"+hex.EncodeToString(pk.TopicID[:])+"/") {
		// Not this topic's (a pointer left by a topic of the same name):
		// nothing of it is trusted.
		return "", 0, fmt.Errorf("cluster: the manifest pointer of %s-%d names %q, not this topic's", pk.Topic, pk.Partition, ptr.Manifest)
	}
	return ptr.Manifest, ptr.ModRev, nil
}

func (c tierCommitter) Epoch(pk tiering.PartitionKey) (int32, error) {
	p := c.tierPartition(pk)
	if p == nil {
		return 0, tiering.ErrFenced
	}
	if r := roleOf(p); r.isLeader {
		return r.epoch, nil
	}
	return 0, tiering.ErrFenced
}

func (c tierCommitter) Commit(ctx context.Context, pk tiering.PartitionKey, key string, epoch int32, token int64) (int64, error) {
	p := c.tierPartition(pk)
	if p == nil {
		return 0, tiering.ErrFenced
	}
	r := roleOf(p)
	part, ok := c.cl.currentView().Parts[partKeyOf(pk)]
	if !r.isLeader || r.epoch != epoch || !ok || part.State.Leader != c.cl.id || part.State.Epoch != epoch {
		return 0, fmt.Errorf("cluster: commit of %s at epoch %d: %w", key, epoch, tiering.ErrFenced)
	}
	start := time.Now()
	rev, err := c.cl.client().CommitManifest(ctx, partKeyOf(pk), key, epoch, part.ModRev, token)
	c.cl.observeEtcd(start)
	if errors.Is(err, coord.ErrConflict) {
		return 0, fmt.Errorf("cluster: commit of %s at epoch %d: %w (%v)", key, epoch, tiering.ErrFenced, err)
	}
	return rev, err
}

// tierRole says what p's tiering pass does here: upload (and apply
// retention) as its leader up to limit, or only release local copies.
// The cached manifest follows the committed pointer first.
func (cl *cluster) tierRole(p *partition) (lead bool, limit int64) {
	t := cl.s.cfg.Tier
	pk := p.tierKey()
	if v := cl.currentView(); v != nil {
		if _, token, ok := t.Committed(pk); ok && v.Tier[partKeyOf(pk)].ModRev > token {
			t.Invalidate(pk) // a newer commit (another leader's): load it
		}
	}
	r := roleOf(p)
	return r.isLeader, p.log.HighWatermark()
}

// tierPtrRev is the revision of p's committed pointer in the view (a
// follower's release has work when it moves).
func (cl *cluster) tierPtrRev(p *partition) int64 {
	v := cl.currentView()
	if v == nil {
		return 0
	}
	return v.Tier[coord.PartKey{Topic: p.topic.name, Partition: p.index}].ModRev
}

// rebaseFromBucket starts a follower's log over where the bucket's log
// ends (its fetch offset was below the leader's local log), with the
// producer state mirrored beside it. It reports whether the log moved.
func (cl *cluster) rebaseFromBucket(f *replicaFetcher, p *partition, epoch int32) (bool, error) {
	t := cl.s.cfg.Tier
	if t == nil {
		return false, errors.New("cluster: the leader's log is in a tiered store, and this broker has none (start it with the same --tier)")
	}
	pk := p.tierKey()
	t.Invalidate(pk)
	ctx, cancel := context.WithTimeout(cl.ctx, time.Minute)
	defer cancel()
	m, err := t.Manifest(ctx, pk)
	if err != nil {
		return false, err
	}
	if m.Next() <= p.log.LogEndOffset() {
		return false, nil // this view's manifest is behind the leader's release: wait for the next
	}
	var producers map[int64]*producerState
	var open map[int64]int64
	if b, err := t.Store().GetRange(ctx, producersKey(pk), 0, -1); err == nil {
		if producers, open, _, err = restoredProducers(b, m.Next()); err != nil {
			cl.logger.Warn("the bucket's producer state", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
			producers, open = nil, nil
		}
	} else if !errors.Is(err, tiering.ErrNotFound) {
		return false, err
	}
	if err := cl.resetLog(f, p, epoch, m.Next(), m.LogStartOffset); err != nil {
		return false, err
	}
	if producers != nil {
		// This fetcher is the partition's only writer: nothing was
		// appended since the reset.
		p.restoreProducers(producers, open)
	}
	cl.logger.Info("behind the leader's local log: started over where the bucket's log ends", zap.String("topic", p.topic.name),
		zap.Int32("partition", p.index), zap.Int64("log_start", m.LogStartOffset), zap.Int64("next_offset", m.Next()))
	return true, nil
}
