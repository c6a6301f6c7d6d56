package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/coord"
)

// Topic changes in cluster mode go to etcd; every broker's watch then
// makes them locally (cluster.go). A request is answered once this
// broker's view has them (every partition with a leader, for a create).

// errRestoring: with a bucket, no topic is created (nor producer id handed
// out) before the controller decided whether to restore the cluster from
// it (cluster_restore.go): a restore skips topics that exist.
var errRestoring = errors.New("the cluster is deciding whether to restore from the tiered store: ask again")

// restoreSettled reports whether topics may be created and producer ids
// handed out.
func (cl *cluster) restoreSettled() bool {
	v := cl.currentView()
	return cl.s.cfg.Tier == nil || v != nil && v.RestoreChecked
}

// errBadReplicationFactor: more replicas than live brokers.
var errBadReplicationFactor = errors.New("replication factor above the number of live brokers")

// topicWait bounds how long a create or delete waits to see itself applied.
const topicWait = 10 * time.Second

// defaultRF is the replication factor of a topic created without one:
// min(3, live brokers).
func (cl *cluster) defaultRF() int32 {
	return int32(min(3, max(1, len(cl.currentView().Brokers))))
}

// createTopic creates a topic in etcd (rf -1: the default) and waits for
// it to be served here.
func (cl *cluster) createTopic(ctx context.Context, name string, partitions, rf int32, configs map[string]string, validateOnly bool) (*topic, error) {
	if err := cl.s.reg.validateTopic(name, partitions, configs); err != nil {
		return nil, err
	}
	if !cl.restoreSettled() {
		return nil, errRestoring
	}
	if rf == -1 {
		rf = cl.defaultRF()
	}
	if rf <= 0 || int(rf) > len(cl.currentView().Brokers) {
		return nil, fmt.Errorf("%w: %d replicas, %d live brokers", errBadReplicationFactor, rf, len(cl.currentView().Brokers))
	}
	if _, ok := cl.currentView().Topics[name]; ok {
		return nil, errTopicExists
	}
	if validateOnly {
		return &topic{name: name, configs: configs}, nil
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	err := cl.client().CreateTopic(ctx, coord.TopicInfo{Name: name, ID: hex.EncodeToString(id[:]), Partitions: partitions, RF: rf, Configs: configs})
	if errors.Is(err, coord.ErrExists) {
		return nil, errTopicExists
	}
	if err != nil {
		return nil, err
	}
	var t *topic
	cl.waitFor(ctx, topicWait, func() bool {
		t = cl.s.reg.get(name)
		if t == nil || t.id != id {
			return false
		}
		for _, p := range cl.s.reg.partitionsOf(t) {
			if roleOf(p).leader < 0 {
				return false
			}
		}
		return true
	})
	if t == nil || t.id != id {
		return nil, errTopicDeleting // not applied here yet: retriable (LEADER_NOT_AVAILABLE)
	}
	return t, nil
}

// deleteTopic deletes a topic in etcd and waits for it to be gone here.
func (cl *cluster) deleteTopic(ctx context.Context, t *topic) error {
	err := cl.client().DeleteTopic(ctx, t.name)
	if errors.Is(err, coord.ErrNotFound) {
		return nil // gone already
	}
	if err != nil {
		return err
	}
	cl.waitFor(ctx, topicWait, func() bool { return cl.s.reg.getByID(t.id) == nil })
	return nil
}

// metadataBrokers lists the live brokers for Metadata.
func (cl *cluster) metadataBrokers() []kmsg.MetadataResponseBroker {
	v := cl.currentView()
	out := make([]kmsg.MetadataResponseBroker, 0, len(v.Brokers))
	for _, b := range liveBrokers(v) {
		mb := kmsg.NewMetadataResponseBroker()
		mb.NodeID, mb.Host, mb.Port = b.ID, b.Host, b.Port
		if b.Rack != "" {
			mb.Rack = kmsg.StringPtr(b.Rack)
		}
		out = append(out, mb)
	}
	return out
}

// controllerID is the controller's broker id for Metadata (-1: none).
func (cl *cluster) controllerID() int32 { return cl.currentView().Controller }

// metadataPartitions answers a topic's partitions from the view.
func (cl *cluster) metadataPartitions(t *topic) []kmsg.MetadataResponseTopicPartition {
	v := cl.currentView()
	parts := cl.s.reg.partitionsOf(t)
	out := make([]kmsg.MetadataResponseTopicPartition, len(parts))
	for i, p := range parts {
		mp := &out[i]
		mp.Default()
		mp.Partition = p.index
		part, ok := v.Parts[coord.PartKey{Topic: t.name, Partition: p.index}]
		if !ok {
			mp.ErrorCode = kerr.LeaderNotAvailable.Code
			mp.Leader, mp.LeaderEpoch = -1, 0
			continue
		}
		st := part.State
		mp.Leader, mp.LeaderEpoch = st.Leader, st.Epoch
		mp.Replicas, mp.ISR = st.Replicas, st.ISR
		for _, id := range st.Replicas {
			if _, ok := v.Brokers[id]; !ok {
				mp.OfflineReplicas = append(mp.OfflineReplicas, id)
			}
		}
		if _, ok := v.Brokers[st.Leader]; st.Leader < 0 || !ok {
			mp.ErrorCode = kerr.LeaderNotAvailable.Code
			mp.Leader = -1
		}
	}
	return out
}

// currentLeader fills KIP-951's hint for a NOT_LEADER_OR_FOLLOWER answer:
// the leader and epoch from the view, and its endpoint.
func (cl *cluster) currentLeader(r *replicaRole) (leader, epoch int32, ep *coord.BrokerInfo) {
	if r.leader < 0 {
		return -1, -1, nil
	}
	if b, ok := cl.currentView().Brokers[r.leader]; ok {
		return r.leader, r.epoch, &b
	}
	return r.leader, r.epoch, nil
}

// produceLeaderHint adds KIP-951's current leader to a produce answer
// NOT_LEADER_OR_FOLLOWER (v10+), with the leader's endpoint.
func (cl *cluster) produceLeaderHint(resp *kmsg.ProduceResponse, sp *kmsg.ProduceResponseTopicPartition, r *replicaRole) {
	id, epoch, b := cl.currentLeader(r)
	sp.CurrentLeader.LeaderID, sp.CurrentLeader.LeaderEpoch = id, epoch
	if b == nil || resp.Version < 10 {
		return
	}
	for _, have := range resp.Brokers {
		if have.NodeID == b.ID {
			return
		}
	}
	rb := kmsg.NewProduceResponseBroker()
	rb.NodeID, rb.Host, rb.Port = b.ID, b.Host, b.Port
	if b.Rack != "" {
		rb.Rack = kmsg.StringPtr(b.Rack)
	}
	resp.Brokers = append(resp.Brokers, rb)
}

// fetchLeaderHint is produceLeaderHint for Fetch (v12+ current leader,
// v16+ endpoints).
func (cl *cluster) fetchLeaderHint(resp *kmsg.FetchResponse, sp *kmsg.FetchResponseTopicPartition, r *replicaRole) {
	id, epoch, b := cl.currentLeader(r)
	sp.CurrentLeader.LeaderID, sp.CurrentLeader.LeaderEpoch = id, epoch
	if b == nil || resp.Version < 16 {
		return
	}
	for _, have := range resp.Brokers {
		if have.NodeID == b.ID {
			return
		}
	}
	rb := kmsg.NewFetchResponseBroker()
	rb.NodeID, rb.Host, rb.Port = b.ID, b.Host, b.Port
	if b.Rack != "" {
		rb.Rack = kmsg.StringPtr(b.Rack)
	}
	resp.Brokers = append(resp.Brokers, rb)
}

// updateTopic changes a topic's partition count or configs in etcd
// (compare-and-swap on its key, retried on a race) and waits until this
// broker applied it.
func (cl *cluster) updateTopic(ctx context.Context, t *topic, change func(*coord.TopicInfo) error) error {
	for range 10 {
		ct, ok := cl.currentView().Topics[t.name]
		if !ok {
			return errUnknownTopic
		}
		info := ct.Info
		info.Configs = maps.Clone(info.Configs)
		if err := change(&info); err != nil {
			return err
		}
		err := cl.client().UpdateTopic(ctx, info, ct.ModRev)
		if errors.Is(err, coord.ErrConflict) {
			cl.waitFor(ctx, time.Second, func() bool { return cl.currentView().Topics[t.name].ModRev != ct.ModRev })
			continue
		}
		if err != nil {
			return err
		}
		cl.waitFor(ctx, topicWait, func() bool {
			return int32(len(cl.s.reg.partitionsOf(t))) >= info.Partitions && maps.Equal(cl.s.reg.configsOf(t), info.Configs)
		})
		return nil
	}
	return fmt.Errorf("topic %s: changed by others ten times in a row: retry", t.name)
}

// leaderCode is 0 on a single node, or where this broker leads p; else
// the error to answer.
func (s *Server) leaderCode(p *partition) int16 {
	if s.cl == nil {
		return 0
	}
	code, _ := s.cl.leaderCheck(p, -1)
	return code
}

// errUnknownTopic: the topic is not in the cluster's view.
var errUnknownTopic = errors.New("unknown topic")

// growTopic raises a topic's partition count (CreatePartitions).
func (s *Server) growTopic(t *topic, count int32, validateOnly bool) error {
	if s.cl == nil {
		return s.reg.addPartitions(t, count, validateOnly)
	}
	return s.cl.updateTopic(s.ctx, t, func(info *coord.TopicInfo) error {
		if count <= info.Partitions {
			return fmt.Errorf("topic has %d partitions; the new count %d must be larger", info.Partitions, count)
		}
		if count > maxPartitions {
			return fmt.Errorf("partition count %d is above the limit %d", count, maxPartitions)
		}
		if validateOnly {
			return errValidated
		}
		info.Partitions = count
		return nil
	})
}

// errValidated stops an update after its checks (validate only).
var errValidated = errors.New("validated")

// setTopicConfigs replaces a topic's configs (AlterConfigs,
// IncrementalAlterConfigs).
func (s *Server) setTopicConfigs(t *topic, configs map[string]string) error {
	if s.cl == nil {
		return s.reg.setConfigs(t, configs)
	}
	return s.cl.updateTopic(s.ctx, t, func(info *coord.TopicInfo) error {
		info.Configs = maps.Clone(configs)
		return nil
	})
}
