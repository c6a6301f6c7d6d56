package broker

import (
	"context"
	"encoding/hex"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/coord"
	"github.com/synapsebroker/synapse/group"
	"github.com/synapsebroker/synapse/log"
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
// may write, and a write waits for the ISR).
func (cl *cluster) groupsLoop() {
	var leading int32 = -1 // the epoch the open coordinator leads at
	for {
		select {
		case <-cl.ctx.Done():
			return
		case <-cl.groupsKick:
		}
		r := roleOf(cl.groupsPart)
		switch {
		case r.isLeader && leading == r.epoch:
		case r.isLeader:
			old := cl.s.grp()
			old.Close()
			cfg := cl.s.groupConfig()
			cfg.Write = cl.groupsWrite
			c, err := group.Open(cfg, cl.s.groupLog, nil)
			if err != nil {
				cl.logger.Error("open the group coordinator", zap.Error(err))
				leading = -1
				continue
			}
			cl.s.groupsPtr.Store(c)
			leading = r.epoch
			cl.logger.Info("group coordinator", zap.Int32("leader_epoch", r.epoch))
		case leading >= 0:
			cl.s.grp().Close()
			leading = -1
			cl.logger.Info("no longer the group coordinator")
		}
	}
}

// kickGroups asks groupsLoop to look at the group log's role again.
func (cl *cluster) kickGroups() {
	select {
	case cl.groupsKick <- struct{}{}:
	default:
	}
}

// groupsWrite appends one batch of the group log as its leader, stamped
// with the epoch, and waits until the ISR holds it.
func (cl *cluster) groupsWrite(b []byte) error {
	p := cl.groupsPart
	p.mu.Lock()
	r := roleOf(p)
	if !r.isLeader {
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
	if !cl.offsetsCreating.CompareAndSwap(false, true) {
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
	if topicName == offsetsTopic {
		if index == 0 {
			return cl.groupsPart
		}
		return nil
	}
	t := cl.s.reg.get(topicName)
	if t == nil {
		return nil
	}
	return cl.s.reg.partition(t, index)
}
