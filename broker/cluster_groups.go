package broker

import (
	"context"
	"encoding/hex"
	"errors"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/coord"
	"github.com/synapsebroker/synapse/group"
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

// Consumer groups in cluster mode. The group log (every group's
// membership and committed offsets) is partition 0 of __consumer_offsets,
// replicated like any partition: its leader is the coordinator of every
// group. A write of the coordinator is answered once the ISR holds it, so
// an acknowledged commit survives the loss of the coordinator's broker.
// When the leadership moves, the new leader replays the log it replicated
// and serves; the old one closes its coordinator (its clients get
// NOT_COORDINATOR and look it up again).

// initGroups makes the group log the replicated partition it is in
// cluster mode.
func (cl *cluster) initGroups() {
	cl.groupsPart = &partition{topic: &topic{name: offsetsTopic}, index: 0, log: cl.s.groupLog,
		producers: map[int64]*producerState{}}
	cl.groupsActive.Store(-1)
	cl.groupsKick = make(chan struct{}, 1)
	cl.wg.Add(1)
	go func() { defer cl.wg.Done(); cl.groupsLoop() }()
}

// groupsOpenConfig is the config of the coordinator a broker opens at
// start in cluster mode: it writes nothing (it is closed at once, until
// this broker leads the group log) and drops no offsets.
func groupsOpenConfig(cfg group.Config) group.Config {
	cfg.PartitionExists = func(string, int32) bool { return true }
	cfg.Write = func([]byte) error { return errNotLeader }
	return cfg
}

// groupsLoop opens and closes the group coordinator as the group log's
// leadership comes and goes (never on the watch goroutine: opening one
// may write, and a write waits for the ISR). A new leader opens its
// coordinator only once its high watermark reached the log end it took
// over at: every record the old coordinator had acknowledged is then
// replayed (the replay stops at the high watermark). Until then, and on
// every broker that does not coordinate, group requests are answered
// NOT_COORDINATOR (dispatchGroup, activeGroups).
func (cl *cluster) groupsLoop() {
	var leading int32 = -1                      // the epoch the open coordinator leads at
	txnLeading, txnWith := int32(-1), int32(-1) // the transaction coordinator's (syncTxns)
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-cl.ctx.Done():
			return
		case <-cl.groupsKick:
		case <-retry.C:
		}
		r := roleOf(cl.groupsPart)
		switch {
		case r.isLeader && leading == r.epoch:
		case r.isLeader:
			cl.groupsActive.Store(-1)
			cl.s.grp().Close()
			leading = -1
			if hw := cl.groupsPart.log.HighWatermark(); hw < r.startOffset {
				cl.advanceHW(cl.groupsPart)
				retry.Reset(50 * time.Millisecond) // the followers' first fetches of this epoch
				continue
			}
			cfg := cl.s.groupConfig()
			cfg.PartitionExists = cl.partitionExists
			epoch := r.epoch
			cfg.Write = func(b []byte) error { return cl.groupsWrite(b, epoch) }
			seed, err := cl.groupsSeed()
			if err != nil {
				cl.s.repeat.Warn("read the groups' mirror from the tiered store (retried)", zap.Error(err))
				retry.Reset(time.Second)
				continue
			}
			c, err := group.Open(cfg, cl.s.groupLog, seed)
			if err != nil {
				cl.logger.Error("open the group coordinator (retried)", zap.Error(err))
				retry.Reset(time.Second)
				continue
			}
			cl.s.groupsPtr.Store(c)
			cl.s.groupsMirrored.Store(math.MaxUint64) // a new coordinator's change count: mirror at its first pass
			leading = r.epoch
			cl.groupsActive.Store(r.epoch)
			cl.logger.Info("group coordinator", zap.Int32("leader_epoch", r.epoch))
		case leading >= 0:
			cl.groupsActive.Store(-1)
			cl.s.grp().Close()
			leading = -1
			cl.logger.Info("no longer the group coordinator")
		}
		if cl.syncTxns(&txnLeading, &txnWith) {
			retry.Reset(50 * time.Millisecond)
		}
	}
}

// groupsSeed is the bucket's mirror of the groups if the group log is
// empty (stateSeed).
func (cl *cluster) groupsSeed() ([]byte, error) { return cl.stateSeed(cl.s.groupLog, groupsKey) }

// stateSeed is the bucket's mirror at key of a state log (the group or
// transaction log) if lp is empty (nil if it is not, or there is no
// mirror): after a disaster (every disk and etcd lost) the first
// coordinator writes the last mirror into the log it leads, as a single
// broker restores its state logs at start, and the followers replicate
// it. A log that is empty at its leader holds nothing committed anywhere
// (a broker back on an empty disk is not elected), so nothing the cluster
// has is overwritten. The coordinators' maintenance keeps the mirrors
// (maintainGroups, maintainTxns).
func (cl *cluster) stateSeed(lp *log.Partition, key string) ([]byte, error) {
	t := cl.s.cfg.Tier
	if t == nil || lp.LogEndOffset() != lp.LogStartOffset() {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(cl.ctx, 30*time.Second)
	defer cancel()
	b, err := t.Store().GetRange(ctx, key, 0, -1)
	if errors.Is(err, tiering.ErrNotFound) {
		return nil, nil
	}
	return b, err
}

// activeGroups reports whether this broker coordinates groups now: it
// leads the group log and its coordinator is open at that epoch.
func (cl *cluster) activeGroups() bool {
	e := cl.groupsActive.Load()
	if e < 0 {
		return false
	}
	r := roleOf(cl.groupsPart)
	return r.isLeader && r.epoch == e
}

// partitionExists is the coordinator's PartitionExists in cluster mode:
// the cluster's view, not what this broker has applied yet.
func (cl *cluster) partitionExists(topic string, p int32) bool {
	t, ok := cl.currentView().Topics[topic]
	return ok && p >= 0 && p < t.Info.Partitions
}

// kickGroups asks groupsLoop to look at the group log's role again.
func (cl *cluster) kickGroups() {
	select {
	case cl.groupsKick <- struct{}{}:
	default:
	}
}

// groupsWrite appends one batch of the group log as its leader at epoch
// (the coordinator's: a coordinator opened at another epoch writes
// nothing), stamped with it, and waits until the ISR holds it.
func (cl *cluster) groupsWrite(b []byte, epoch int32) error {
	p := cl.groupsPart
	p.mu.Lock()
	r := roleOf(p)
	if !r.isLeader || r.epoch != epoch {
		p.mu.Unlock()
		return errNotLeader
	}
	log.PatchLeaderEpoch(b, r.epoch)
	truncs := p.log.Truncations()
	res, err := p.log.Append(b)
	p.mu.Unlock()
	if err != nil {
		return err
	}
	return cl.waitCommitted(p, res.LastOffset+1, r, truncs, 30*time.Second)
}

// groupCoordinator is the broker that coordinates every group: the leader
// of the group log. The first ask creates __consumer_offsets (one
// partition, min(3, live brokers) replicas); until it has a leader the
// answer is COORDINATOR_NOT_AVAILABLE (ok false).
func (cl *cluster) groupCoordinator() (coord.BrokerInfo, bool) {
	v := cl.currentView()
	part, ok := v.Parts[coord.PartKey{Topic: offsetsTopic, Partition: 0}]
	if _, exists := v.Topics[offsetsTopic]; !exists {
		cl.createOffsetsTopic()
		return coord.BrokerInfo{}, false
	}
	if !ok || part.State.Leader < 0 {
		return coord.BrokerInfo{}, false
	}
	b, ok := v.Brokers[part.State.Leader]
	return b, ok
}

// createOffsetsTopic creates __consumer_offsets in etcd (once: the CAS
// makes a second create a no-op).
func (cl *cluster) createOffsetsTopic() {
	if !cl.restoreSettled() || !cl.offsetsCreating.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer cl.offsetsCreating.Store(false)
		ctx, cancel := context.WithTimeout(cl.ctx, 10*time.Second)
		defer cancel()
		id := cl.s.offsetsTopicID()
		err := cl.client().CreateTopic(ctx, coord.TopicInfo{Name: offsetsTopic, ID: hex.EncodeToString(id[:]), Partitions: 1, RF: cl.defaultRF()})
		if err != nil && !errors.Is(err, coord.ErrExists) {
			cl.logger.Warn("create __consumer_offsets", zap.Error(err))
		}
	}()
}

// partitionFor finds a partition by name for peers: a topic's, or the
// group log.
func (cl *cluster) partitionFor(topicName string, index int32) *partition {
	if topicName == offsetsTopic || topicName == txnTopic {
		if index != 0 {
			return nil
		}
		if topicName == txnTopic {
			return cl.txnPart
		}
		return cl.groupsPart
	}
	t := cl.s.reg.get(topicName)
	if t == nil {
		return nil
	}
	return cl.s.reg.partition(t, index)
}

// notCoordinator answers a group request on a broker that does not
// coordinate groups (cluster mode): NOT_COORDINATOR wherever the request
// type carries an error, so clients look the coordinator up again. A
// closed coordinator's own answers (no offsets, a Dead group) would be
// taken for the truth.
func notCoordinator(req kmsg.Request) kmsg.Response {
	code := kerr.NotCoordinator.Code
	switch b := req.(type) {
	case *kmsg.JoinGroupRequest:
		resp := b.ResponseKind().(*kmsg.JoinGroupResponse)
		resp.ErrorCode, resp.MemberID, resp.Generation = code, b.MemberID, -1
		return resp
	case *kmsg.SyncGroupRequest:
		resp := b.ResponseKind().(*kmsg.SyncGroupResponse)
		resp.ErrorCode = code
		return resp
	case *kmsg.HeartbeatRequest:
		resp := b.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = code
		return resp
	case *kmsg.LeaveGroupRequest:
		resp := b.ResponseKind().(*kmsg.LeaveGroupResponse)
		resp.ErrorCode = code
		return resp
	case *kmsg.OffsetCommitRequest:
		resp := b.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range b.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp
	case *kmsg.OffsetFetchRequest:
		resp := b.ResponseKind().(*kmsg.OffsetFetchResponse)
		resp.ErrorCode = code
		for _, g := range b.Groups {
			rg := kmsg.NewOffsetFetchResponseGroup()
			rg.Group, rg.ErrorCode = g.Group, code
			resp.Groups = append(resp.Groups, rg)
		}
		for _, rt := range b.Topics { // v0-1 carry errors per partition only
			st := kmsg.NewOffsetFetchResponseTopic()
			st.Topic = rt.Topic
			for _, p := range rt.Partitions {
				sp := kmsg.NewOffsetFetchResponseTopicPartition()
				sp.Partition, sp.Offset, sp.ErrorCode = p, -1, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp
	case *kmsg.OffsetDeleteRequest:
		resp := b.ResponseKind().(*kmsg.OffsetDeleteResponse)
		resp.ErrorCode = code
		return resp
	case *kmsg.DescribeGroupsRequest:
		resp := b.ResponseKind().(*kmsg.DescribeGroupsResponse)
		for _, g := range b.Groups {
			rg := kmsg.NewDescribeGroupsResponseGroup()
			rg.Group, rg.ErrorCode, rg.AuthorizedOperations = g, code, -2147483648
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.DeleteGroupsRequest:
		resp := b.ResponseKind().(*kmsg.DeleteGroupsResponse)
		for _, g := range b.Groups {
			rg := kmsg.NewDeleteGroupsResponseGroup()
			rg.Group, rg.ErrorCode = g, code
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.ListGroupsRequest:
		return b.ResponseKind() // no groups here (clients ask every broker)
	}
	return nil
}
