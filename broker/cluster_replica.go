package broker

import (
	"context"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/coord"
	"github.com/synapsebroker/synapse/log"
)

// The leader's side of replication: followers fetch with Kafka's Fetch
// (replica id set). A follower's fetch offset is its durable log end, so
// the high watermark is the least fetch offset of the ISR members (and the
// leader's own durable end); an acks=all produce is answered once the high
// watermark passes its records. The leader shrinks the ISR when a follower
// falls behind for replica.lag.time.max.ms and grows it when one catches
// up, each a compare-and-swap in etcd on the state it read: a leader
// deposed meanwhile (a new epoch) changes nothing.

// isrJoinFresh: a follower joins the ISR only on a fetch this recent.
const isrJoinFresh = time.Second

func registered(v *coord.View, id int32) bool {
	_, ok := v.Brokers[id]
	return ok
}

// replicaFetchMaxBytes bounds one partition's bytes in a replica fetch.
const replicaFetchMaxBytes = 1 << 20

// handleReplicaFetch answers a follower's Fetch.
func (cl *cluster) handleReplicaFetch(req *kmsg.FetchRequest) kmsg.Response {
	rid := req.ReplicaID
	if req.Version >= 15 {
		rid = req.ReplicaState.ID
	}
	wait := min(time.Duration(req.MaxWaitMillis)*time.Millisecond, time.Second)
	deadline := time.Now().Add(wait)
	for first := true; ; first = false {
		resp, bytes, waitOn := cl.replicaFetchOnce(rid, req, first)
		left := time.Until(deadline)
		if bytes > 0 || left <= 0 || len(waitOn) == 0 || cl.ctx.Err() != nil {
			return resp
		}
		waitOn = append(waitOn, cl.viewChanged())
		if cl.s.waitAny(waitOn, left) < 0 {
			resp, _, _ = cl.replicaFetchOnce(rid, req, false)
			return resp
		}
	}
}

// replicaFetchOnce reads every partition of a replica fetch; record says
// whether to note the fetch offsets (the first pass of a request).
func (cl *cluster) replicaFetchOnce(rid int32, req *kmsg.FetchRequest, record bool) (*kmsg.FetchResponse, int64, []<-chan struct{}) {
	resp := req.ResponseKind().(*kmsg.FetchResponse)
	var total int64
	var waitOn []<-chan struct{}
	for _, rt := range req.Topics {
		st := kmsg.NewFetchResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		t := cl.s.reg.get(rt.Topic)
		if req.Version >= 13 {
			t = cl.s.reg.getByID(rt.TopicID)
		}
		for _, rp := range rt.Partitions {
			sp := kmsg.NewFetchResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = -1, -1, -1
			sp.PreferredReadReplica = -1
			var p *partition
			if t != nil {
				p = cl.s.reg.partition(t, rp.Partition)
			}
			if p == nil {
				sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
				st.Partitions = append(st.Partitions, sp)
				continue
			}
			code, r := cl.leaderCheck(p, rp.CurrentLeaderEpoch)
			if code == 0 && !slices.Contains(r.replicas, rid) {
				code = kerr.NotLeaderForPartition.Code // not one of its replicas
			}
			if code != 0 {
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
				continue
			}
			if record {
				cl.noteFollower(p, r, rid, rp.FetchOffset)
			}
			sp.HighWatermark = p.log.HighWatermark()
			sp.LastStableOffset = sp.HighWatermark
			sp.LogStartOffset = p.log.LogStartOffset()
			if rp.FetchOffset > p.log.LogEndOffset() || rp.FetchOffset < p.log.LogStartOffset() {
				sp.ErrorCode = kerr.OffsetOutOfRange.Code
				st.Partitions = append(st.Partitions, sp)
				continue
			}
			waitOn = append(waitOn, p.log.Notify())
			budget := min(int64(rp.PartitionMaxBytes), replicaFetchMaxBytes)
			if budget <= 0 {
				budget = replicaFetchMaxBytes
			}
			res, err := p.log.ReadReplica(rp.FetchOffset, budget)
			if err != nil {
				sp.ErrorCode = cl.s.errorCode(err)
				st.Partitions = append(st.Partitions, sp)
				continue
			}
			b, err := res.AppendTo(nil)
			res.Release()
			if err != nil {
				sp.ErrorCode = kerr.KafkaStorageError.Code
				st.Partitions = append(st.Partitions, sp)
				continue
			}
			sp.RecordBatches = b
			total += int64(len(b))
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, total, waitOn
}

// noteFollower records a follower's fetch offset (durable on it) and
// advances the high watermark.
func (cl *cluster) noteFollower(p *partition, r *replicaRole, rid int32, off int64) {
	now := time.Now()
	p.repl.mu.Lock()
	if p.repl.followers == nil {
		p.repl.followers = map[int32]*followerState{}
	}
	f := p.repl.followers[rid]
	if f == nil || f.epoch != r.epoch {
		f = &followerState{epoch: r.epoch, caughtUp: now}
		p.repl.followers[rid] = f
	}
	f.leo, f.fetched = off, now
	if off >= p.log.DurableEnd() {
		f.caughtUp = now
	}
	p.repl.mu.Unlock()
	cl.advanceHW(p)
}

// advanceHW commits what every ISR member holds durably.
func (cl *cluster) advanceHW(p *partition) {
	r := roleOf(p)
	if !r.isLeader {
		return
	}
	hw := p.log.DurableEnd()
	p.repl.mu.Lock()
	for _, id := range r.isr {
		if id == cl.id {
			continue
		}
		f := p.repl.followers[id]
		if f == nil || f.epoch != r.epoch {
			p.repl.mu.Unlock()
			return // not heard from in this epoch: nothing new is known committed
		}
		hw = min(hw, f.leo)
	}
	p.repl.mu.Unlock()
	if hw > p.log.HighWatermark() {
		if err := p.log.Commit(hw); err != nil {
			cl.logger.Warn("advance the high watermark", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
		}
	}
}

// waitCommitted waits until the high watermark passes next (an acks=all
// produce), as leader at role's epoch, for at most timeout.
func (cl *cluster) waitCommitted(p *partition, next int64, role *replicaRole, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		ch := p.log.Notify()
		vc := cl.viewChanged()
		cl.advanceHW(p)
		if p.log.HighWatermark() >= next {
			return nil
		}
		if err := p.log.Err(); err != nil {
			return err
		}
		r := roleOf(p)
		if !r.isLeader || r.epoch != role.epoch {
			return errNotLeader
		}
		if len(r.isr) < cl.minISR(p, r) {
			return errNotEnoughISRLate
		}
		select {
		case <-ch:
		case <-vc:
		case <-timer.C:
			return errReplicaTimeout
		case <-cl.ctx.Done():
			return errNotLeader
		}
	}
}

// isrLoop shrinks and grows the ISR of the partitions this broker leads.
func (cl *cluster) isrLoop() {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-cl.ctx.Done():
			return
		case <-tick.C:
		}
		for _, t := range cl.s.reg.all() {
			for _, p := range cl.s.reg.partitionsOf(t) {
				cl.checkISR(p)
			}
		}
	}
}

// checkISR proposes p's ISR change, if any: followers behind for longer
// than replica.lag.time.max.ms out, followers caught up to the high
// watermark (and to this epoch's start) in.
func (cl *cluster) checkISR(p *partition) {
	r := roleOf(p)
	if !r.isLeader {
		return
	}
	now := time.Now()
	hw := p.log.HighWatermark()
	v := cl.currentView()
	isr := []int32{cl.id}
	changed := false
	p.repl.mu.Lock()
	for _, id := range r.replicas {
		if id == cl.id {
			continue
		}
		f := p.repl.followers[id]
		in := slices.Contains(r.isr, id)
		switch {
		case in && f == nil:
			// Not heard from since this broker took the lead: it has
			// the lag time to show up.
			if p.repl.followers == nil {
				p.repl.followers = map[int32]*followerState{}
			}
			p.repl.followers[id] = &followerState{epoch: r.epoch, leo: -1, caughtUp: now}
			isr = append(isr, id)
		case in && now.Sub(f.caughtUp) > cl.cfg.ReplicaLagMax:
			changed = true
		case in:
			isr = append(isr, id)
		case f != nil && f.epoch == r.epoch && f.leo >= hw && f.leo >= r.startOffset &&
			now.Sub(f.fetched) < isrJoinFresh && registered(v, id):
			// Caught up, fetching now, and registered (the controller
			// takes dead brokers out: never put one back).
			isr = append(isr, id)
			changed = true
		}
	}
	p.repl.mu.Unlock()
	if !changed {
		return
	}
	slices.Sort(isr)
	st := coord.PartState{Leader: r.leader, Epoch: r.epoch, Replicas: r.replicas, ISR: isr}
	ctx, cancel := context.WithTimeout(cl.ctx, 5*time.Second)
	defer cancel()
	if _, err := cl.co.SetPart(ctx, coord.PartKey{Topic: p.topic.name, Partition: p.index}, st, r.modRev); err != nil {
		cl.logger.Info("ISR change not made", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
		return
	}
	cl.logger.Info("ISR changed", zap.String("topic", p.topic.name), zap.Int32("partition", p.index),
		zap.Int32s("from", r.isr), zap.Int32s("to", isr), zap.Int32("leader_epoch", r.epoch))
}

// readCommittedEnd is what a follower's read of res leaves committed:
// the leader's high watermark, up to what it holds durably.
func readCommittedEnd(lp *log.Partition, hw int64) int64 {
	return min(hw, lp.DurableEnd())
}
