package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/coord"
	"github.com/synapsebroker/synapse/tiering"
)

// The disaster restore: every broker's disk and etcd lost, the bucket
// intact. The controller keeps a copy of the cluster's topics and its
// producer-id counter in the bucket (_synapse/cluster.json). The first
// controller of an empty keyspace finds it and writes every topic back,
// each partition with its newest manifest in the bucket as committed
// pointer and a leader epoch above every epoch in the bucket's keys; the
// leaders start their logs where those manifests end (setRole), the
// followers copy only the tail. What was not in the bucket (the unsealed
// tail, the group log) is gone with the disks.

// clusterMirrorKey is where the controller mirrors the cluster's topics.
const clusterMirrorKey = "_synapse/cluster.json"

// clusterMirror is the value at clusterMirrorKey.
type clusterMirror struct {
	Version   int             `json:"version"`
	ClusterID string          `json:"cluster_id"`
	Topics    []mirroredTopic `json:"topics"`
	// ProducerIDNext is pid/next when the copy was made: a restore starts
	// above it (by restorePIDMargin: blocks handed out since).
	ProducerIDNext int64 `json:"producer_id_next"`
}

// mirroredTopic is a topic and its partitions' leader epochs (a restore
// goes on above them too).
type mirroredTopic struct {
	coord.TopicInfo
	Epochs []int32 `json:"leader_epochs"`
}

const (
	// restorePIDMargin is how far above the mirrored pid/next a restore
	// starts: the mirror is refreshed every clusterMirrorEvery, and ids
	// go in blocks of producerIDBlock.
	restorePIDMargin = 1 << 24
	// clusterMirrorEvery bounds the age of the mirror's producer-id
	// counter; topic changes are copied at the next check.
	clusterMirrorEvery = 10 * time.Second
	// restoreWaitBrokers is how long a restore waits for enough brokers to
	// place every topic's replicas, before it places fewer.
	restoreWaitBrokers = 30 * time.Second
)

// mirrorLoop keeps clusterMirrorKey current while this broker is the
// controller (its own goroutine: a slow bucket never holds up an
// election).
func (cl *cluster) mirrorLoop(ctx context.Context, co *coord.Client) {
	var last []byte
	var pidNext int64
	var pidAt time.Time
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-co.Done():
			return
		case <-tick.C:
		}
		v := cl.currentView()
		if v == nil {
			continue
		}
		if time.Since(pidAt) >= clusterMirrorEvery {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			n, err := co.ProducerIDNext(rctx)
			cancel()
			if err == nil {
				pidNext, pidAt = n, time.Now()
			}
		}
		m := clusterMirror{Version: 1, ClusterID: v.ClusterID, ProducerIDNext: pidNext}
		for name, t := range v.Topics {
			if internalTopic(name) { // the group and transaction logs are not in the bucket
				continue
			}
			mt := mirroredTopic{TopicInfo: t.Info, Epochs: make([]int32, t.Info.Partitions)}
			for p := range t.Info.Partitions {
				mt.Epochs[p] = v.Parts[coord.PartKey{Topic: name, Partition: p}].State.Epoch
			}
			m.Topics = append(m.Topics, mt)
		}
		slices.SortFunc(m.Topics, func(a, b mirroredTopic) int { return strings.Compare(a.Name, b.Name) })
		b, err := json.Marshal(m)
		if err != nil || bytes.Equal(b, last) {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = cl.s.cfg.Tier.PutMeta(pctx, clusterMirrorKey, b)
		cancel()
		if err != nil {
			cl.s.repeat.Warn("mirror the cluster's topics to the tiered store", zap.Error(err))
			continue
		}
		last = b
	}
}

// restoreOnce is the controller's first duty in a keyspace no controller
// has checked yet: restore from the bucket's mirror if there is one. It
// reports whether that is settled (done, or nothing to do); until then the
// controller does nothing else.
func (cl *cluster) restoreOnce(ctx context.Context, co *coord.Client, lead *coord.Leadership, v *coord.View, waited time.Duration) bool {
	t := cl.s.cfg.Tier
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	checked, err := co.RestoreChecked(ctx)
	if err != nil {
		cl.logger.Info("restore check (retried)", zap.Error(err))
		return false
	}
	if checked {
		return true
	}
	b, err := t.Store().GetRange(ctx, clusterMirrorKey, 0, -1)
	switch {
	case errors.Is(err, tiering.ErrNotFound):
		b = nil
	case err != nil:
		// The bucket may hold a cluster to restore: nothing is decided
		// (no topic placed, no id handed out) before it answers.
		cl.s.repeat.Warn("restore: read the cluster's mirror from the tiered store (retried)", zap.Error(err))
		return false
	}
	var m clusterMirror
	if b != nil {
		if err := json.Unmarshal(b, &m); err != nil || m.Version != 1 {
			cl.logger.Error("restore: the bucket's cluster mirror does not decode: not restored", zap.Int("bytes", len(b)), zap.Error(err))
			b = nil
		}
	}
	if b != nil {
		if !cl.restoreFrom(ctx, co, lead, v, &m, waited) {
			return false
		}
	}
	if err := co.MarkRestoreChecked(ctx, lead.Fence()); err != nil {
		cl.logger.Info("restore: mark the keyspace checked (retried)", zap.Error(err))
		return false
	}
	return true
}

// restoreFrom writes back every topic of m that etcd does not have.
func (cl *cluster) restoreFrom(ctx context.Context, co *coord.Client, lead *coord.Leadership, v *coord.View, m *clusterMirror, waited time.Duration) bool {
	live := liveBrokers(v)
	var rf int32
	for _, ti := range m.Topics {
		rf = max(rf, ti.RF)
	}
	if int32(len(live)) < rf && waited < restoreWaitBrokers {
		cl.logger.Info("restore: waiting for brokers to place replicas on", zap.Int("live", len(live)), zap.Int32("replication_factor", rf))
		return false
	}
	t := cl.s.cfg.Tier
	for _, ti := range m.Topics {
		if _, ok := v.Topics[ti.Name]; ok {
			continue // created since (or restored by a controller before)
		}
		id, err := parseTopicID(ti.ID)
		if err != nil || ti.Partitions <= 0 {
			cl.logger.Error("restore: a topic of the mirror is not valid: skipped", zap.String("topic", ti.Name), zap.Error(err))
			continue
		}
		parts := map[int32]coord.PartState{}
		ptrs := map[int32]coord.TierPtr{}
		var records int64
		for p := range ti.Partitions {
			key, man, maxEpoch, ok, err := t.LatestManifest(ctx, tiering.PartitionKey{Topic: ti.Name, TopicID: id, Partition: p})
			if err != nil {
				cl.logger.Info("restore: list the bucket (retried)", zap.String("topic", ti.Name), zap.Int32("partition", p), zap.Error(err))
				return false
			}
			st, placed := assignReplicas(ti.Name, p, ti.RF, live)
			if !placed {
				return false
			}
			if int(p) < len(ti.Epochs) {
				maxEpoch = max(maxEpoch, ti.Epochs[p])
			}
			st.Epoch = maxEpoch + 1 // above every batch in the bucket, and every epoch the mirror saw
			parts[p] = st
			if ok {
				ptrs[p] = coord.TierPtr{Manifest: key, Epoch: man.Epoch, Next: man.Next(), LogStart: man.LogStartOffset}
				records += man.Next() - man.LogStartOffset
			}
		}
		if err := co.RestoreTopic(ctx, ti.TopicInfo, parts, ptrs, lead.Fence()); err != nil && !errors.Is(err, coord.ErrConflict) {
			cl.logger.Info("restore: write the topic (retried)", zap.String("topic", ti.Name), zap.Error(err))
			return false
		}
		cl.logger.Warn("restored a topic from the tiered store", zap.String("topic", ti.Name), zap.Int32("partitions", ti.Partitions),
			zap.Int("partitions_with_data", len(ptrs)), zap.Int64("offsets", records))
	}
	if err := co.RaiseProducerIDs(ctx, m.ProducerIDNext+restorePIDMargin); err != nil {
		cl.logger.Info("restore: producer ids (retried)", zap.Error(err))
		return false
	}
	return true
}

// restoredStart starts the log of a partition this broker is to lead over
// where its restored manifest ends, if it ends before that (the log of a
// leader after a disaster restore is empty; the bucket holds the rest). It
// runs before the leadership is taken, under p.mu.
func (cl *cluster) restoredStart(p *partition, v *coord.View) error {
	if cl.s.cfg.Tier == nil || v == nil {
		return nil
	}
	ptr, ok := v.Tier[coord.PartKey{Topic: p.topic.name, Partition: p.index}]
	if !ok || ptr.Next <= p.log.LogEndOffset() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.log.ResetToAt(ptr.Next, min(ptr.LogStart, ptr.Next)); err != nil {
		return fmt.Errorf("start the log at the restored manifest's end %d: %w", ptr.Next, err)
	}
	clear(p.producers)
	clear(p.txnOpen)
	p.setFirstOpenLocked()
	cl.logger.Info("restored: the log starts where the bucket's ends", zap.String("topic", p.topic.name), zap.Int32("partition", p.index),
		zap.Int64("log_start", ptr.LogStart), zap.Int64("next_offset", ptr.Next))
	return nil
}
