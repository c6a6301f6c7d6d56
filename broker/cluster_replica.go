package broker

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/coord"
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
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

// replicaFetchMaxBytes bounds one partition's bytes in a replica fetch,
// replicaFetchTotalBytes the response's.
const (
	replicaFetchMaxBytes   = 1 << 20
	replicaFetchTotalBytes = 16 << 20
)

// handleReplicaFetch answers a follower's Fetch. The records go out as
// the segment file ranges they are in (sendfile, as a consumer's fetch):
// a batch read above the high watermark may be cut by a truncation
// before it is sent, and the follower then finds it short or failing its
// CRC and fetches again.
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
		resp.release()
		waitOn = append(waitOn, cl.viewChanged())
		if cl.s.waitAny(waitOn, left) < 0 {
			resp, _, _ = cl.replicaFetchOnce(rid, req, false)
			return resp
		}
	}
}

// replicaFetchOnce reads every partition of a replica fetch; record says
// whether to note the fetch offsets (the first pass of a request).
func (cl *cluster) replicaFetchOnce(rid int32, req *kmsg.FetchRequest, record bool) (*fetchResponse, int64, []<-chan struct{}) {
	resp := &fetchResponse{FetchResponse: req.ResponseKind().(*kmsg.FetchResponse)}
	var total int64
	var waitOn []<-chan struct{}
	maxTotal := int64(replicaFetchTotalBytes)
	if req.MaxBytes > 0 {
		maxTotal = min(maxTotal, int64(req.MaxBytes))
	}
	if !registered(cl.currentView(), rid) {
		resp.ErrorCode = kerr.NotLeaderForPartition.Code // not a broker of this cluster
		return resp, 0, nil
	}
	for _, rt := range req.Topics {
		st := kmsg.NewFetchResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		reads := make([]*log.ReadResult, 0, len(rt.Partitions))
		name := rt.Topic
		if req.Version >= 13 {
			if t := cl.s.reg.getByID(rt.TopicID); t != nil {
				name = t.name
			}
		}
		for _, rp := range rt.Partitions {
			sp, res, wait := cl.replicaFetchPartition(rid, name, rp, record, maxTotal-total)
			if res != nil {
				total += res.Bytes
			}
			waitOn = append(waitOn, wait...)
			st.Partitions = append(st.Partitions, sp)
			reads = append(reads, res)
		}
		resp.Topics = append(resp.Topics, st)
		resp.reads = append(resp.reads, reads)
		resp.cold = append(resp.cold, make([]*tiering.ColdRead, len(reads)))
	}
	return resp, total, waitOn
}

// replicaFetchPartition reads one partition of a replica fetch, with at
// most budget bytes: its answer, the records (nil if none) and what to
// wait on for more.
func (cl *cluster) replicaFetchPartition(rid int32, name string, rp kmsg.FetchRequestTopicPartition, record bool, budget int64) (kmsg.FetchResponseTopicPartition, *log.ReadResult, []<-chan struct{}) {
	sp := kmsg.NewFetchResponseTopicPartition()
	sp.Partition = rp.Partition
	sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = -1, -1, -1
	sp.PreferredReadReplica = -1
	p := cl.partitionFor(name, rp.Partition)
	if p == nil {
		sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
		return sp, nil, nil
	}
	code, r := cl.leaderCheck(p, rp.CurrentLeaderEpoch)
	if code == 0 && !slices.Contains(r.replicas, rid) {
		code = kerr.NotLeaderForPartition.Code // not one of its replicas
	}
	if code != 0 {
		sp.ErrorCode = code
		return sp, nil, nil
	}
	sp.LogStartOffset = p.log.LogStartOffset()
	if rp.FetchOffset > p.log.LogEndOffset() || rp.FetchOffset < p.log.LogStartOffset() {
		sp.ErrorCode = kerr.OffsetOutOfRange.Code
		return sp, nil, nil
	}
	if cl.s.cfg.Tier != nil && rp.FetchOffset < p.log.LocalStartOffset() {
		// Released here, in the bucket: the follower starts over where
		// the bucket's log ends (rebaseFromBucket).
		sp.ErrorCode = kerr.OffsetMovedToTieredStorage.Code
		return sp, nil, nil
	}
	if rp.LastFetchedEpoch >= 0 && rp.FetchOffset > p.log.LogStartOffset() {
		// KIP-320's check: the follower's log must end where this log's
		// epoch LastFetchedEpoch does, or it diverged (it is told where,
		// truncates, and is not counted meanwhile).
		code, e, end := epochEndOffset(p.log, kmsg.OffsetForLeaderEpochRequestTopicPartition{CurrentLeaderEpoch: -1, LeaderEpoch: rp.LastFetchedEpoch}, r.epoch)
		if code == 0 && (e != rp.LastFetchedEpoch || end < rp.FetchOffset) {
			sp.DivergingEpoch.Epoch, sp.DivergingEpoch.EndOffset = e, end
			return sp, nil, nil
		}
	}
	if record {
		cl.noteFollower(p, r, rid, rp.FetchOffset)
	}
	// After noting the follower: the high watermark it may have just
	// moved (followers learn it from these answers).
	sp.HighWatermark = p.log.HighWatermark()
	sp.LastStableOffset = sp.HighWatermark
	wait := []<-chan struct{}{p.log.ReplicaNotify(), p.log.Notify()}
	if rp.PartitionMaxBytes > 0 {
		budget = min(budget, int64(rp.PartitionMaxBytes))
	}
	budget = min(budget, replicaFetchMaxBytes)
	if budget <= 0 {
		return sp, nil, wait // the response is full: next time
	}
	end := p.log.LogEndOffset()
	res, err := p.log.ReadReplica(rp.FetchOffset, budget)
	if err != nil {
		sp.ErrorCode = cl.s.errorCode(err)
		return sp, nil, wait
	}
	if res.Bytes == 0 {
		res.Release()
		res = nil
	}
	if record {
		cl.noteSent(p, r, rid, end)
	}
	return sp, res, wait
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
	f.leo, f.fetched = min(off, p.log.LogEndOffset()), now
	// Kafka's rule: caught up as of the last answer if it now asks from
	// where that answer's log ended (under steady load the leader is
	// always a little ahead of the current fetch).
	if off >= p.log.LogEndOffset() {
		f.caughtUp = now
	} else if f.sentAt.After(f.caughtUp) && off >= f.sentEnd {
		f.caughtUp = f.sentAt
	}
	p.repl.mu.Unlock()
	cl.advanceHW(p)
}

// noteSent records the leader's durable end as of an answer to a
// follower (for the caught-up rule).
func (cl *cluster) noteSent(p *partition, r *replicaRole, rid int32, end int64) {
	p.repl.mu.Lock()
	if f := p.repl.followers[rid]; f != nil && f.epoch == r.epoch {
		f.sentEnd, f.sentAt = end, time.Now()
	}
	p.repl.mu.Unlock()
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
//
// truncs is the log's truncation count when the records were appended: the
// records are acknowledged only if no truncation came since (which may have
// cut them, the offsets then filled by another leader's records) and this
// broker still leads at that epoch with at least min.insync.replicas in
// the ISR. A truncation never cuts below the high watermark, so reading the
// high watermark first and the count second is enough.
func (cl *cluster) waitCommitted(p *partition, next int64, role *replicaRole, truncs uint64, timeout time.Duration) error {
	// The leader's own fsync first, led by this waiter (group commit):
	// left to the background round it would start only commitDelay
	// later. The followers fetch the records meanwhile (they are served
	// the log end), so the two fsyncs run side by side.
	if err := p.log.WaitDurable(next); err != nil {
		if p.log.Truncations() != truncs {
			return errNotLeader // cut by a truncation (a new leader's log)
		}
		return err
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		ch := p.log.Notify()
		vc := cl.viewChanged()
		cl.advanceHW(p)
		committed := p.log.HighWatermark() >= next
		if p.log.Truncations() != truncs {
			return errNotLeader
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
		if committed {
			return nil
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

// waitLocal is acks=1 in cluster mode: durable here, with no truncation
// since the append and the leadership unchanged.
func (cl *cluster) waitLocal(p *partition, next int64, role *replicaRole, truncs uint64) error {
	if err := p.log.WaitDurable(next); err != nil {
		return err
	}
	if r := roleOf(p); p.log.Truncations() != truncs || !r.isLeader || r.epoch != role.epoch {
		return errNotLeader
	}
	return nil
}

// isrLoop shrinks and grows the ISR of the partitions this broker leads.
func (cl *cluster) isrLoop() {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var saved map[string]int64
	lastSave, lastProbe := time.Now(), time.Time{}
	for {
		select {
		case <-cl.ctx.Done():
			cl.saveHWCheckpoint(saved)
			return
		case <-tick.C:
		}
		for _, t := range cl.s.reg.all() {
			for _, p := range cl.s.reg.partitionsOf(t) {
				cl.moveOffFailed(p)
				cl.checkISR(p)
			}
		}
		for _, p := range []*partition{cl.groupsPart, cl.txnPart} {
			cl.moveOffFailed(p)
			cl.checkISR(p)
		}
		if time.Since(lastSave) >= time.Second {
			saved, lastSave = cl.saveHWCheckpoint(saved), time.Now()
		}
		if time.Since(lastProbe) >= 2*time.Second {
			cl.probeEtcd()
			lastProbe = time.Now()
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
	slices.Sort(isr)
	if !changed {
		// What etcd has may differ from the ISR counted here: a joining
		// member counted before a write that failed (not a conflict, so no
		// new view came). Write it again.
		held := slices.Clone(r.state.ISR)
		slices.Sort(held)
		changed = !slices.Equal(isr, held)
	}
	if !changed {
		return
	}
	st := r.state
	st.ISR = isr
	// A member joining counts from before etcd has it (Kafka's maximal
	// ISR): between the write and the role below, the high watermark must
	// not pass what it lacks, as the controller may elect it already.
	union := slices.Clone(r.isr)
	for _, id := range isr {
		if !slices.Contains(union, id) {
			union = append(union, id)
		}
	}
	if len(union) > len(r.isr) {
		cl.applyMu.Lock()
		if roleOf(p) == r {
			nr := *r
			nr.isr = union
			p.repl.role.Store(&nr)
			r = &nr
		}
		cl.applyMu.Unlock()
	}
	ctx, cancel := context.WithTimeout(cl.ctx, 5*time.Second)
	defer cancel()
	t0 := time.Now()
	rev, err := cl.client().SetPart(ctx, coord.PartKey{Topic: p.topic.name, Partition: p.index}, st, r.modRev)
	cl.observeEtcd(t0)
	if err != nil {
		cl.logger.Info("ISR change not made", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
		return
	}
	// In force at once (the watch brings it later): a follower counted in
	// etcd's ISR must be counted by the high watermark from now on, or a
	// record could be acknowledged without it and lost if it is elected.
	cl.applyMu.Lock()
	if cur := roleOf(p); cur == r {
		nr := *r
		nr.isr, nr.modRev, nr.state = isr, rev, st
		p.repl.role.Store(&nr)
	}
	cl.applyMu.Unlock()
	cl.logger.Info("ISR changed", zap.String("topic", p.topic.name), zap.Int32("partition", p.index),
		zap.Int32s("from", r.isr), zap.Int32s("to", isr), zap.Int32("leader_epoch", r.epoch))
}

// readCommittedEnd is what a follower's read of res leaves committed:
// the leader's high watermark, up to what it holds durably.
func readCommittedEnd(lp *log.Partition, hw int64) int64 {
	return min(hw, lp.DurableEnd())
}

// The replication checkpoint (Kafka's replication-offset-checkpoint):
// each partition's high watermark, written about once a second when one
// moved, read at start so that a restarted broker does not answer its
// high watermark from the log start until its first fetch (ListOffsets
// "latest" going back in time).
const hwCheckpointFile = "replication-checkpoint.json"

// loadHWCheckpoint reads the checkpoint (empty if none or unreadable: the
// high watermarks are then learned from the leaders).
func (cl *cluster) loadHWCheckpoint() map[string]int64 {
	b, err := os.ReadFile(filepath.Join(cl.s.cfg.DataDir, hwCheckpointFile))
	out := map[string]int64{}
	if err == nil {
		if err := json.Unmarshal(b, &out); err != nil {
			cl.logger.Warn("replication checkpoint unreadable: high watermarks start at the log start", zap.Error(err))
			return map[string]int64{}
		}
	}
	return out
}

func hwKey(p *partition) string { return p.topic.name + "/" + strconv.Itoa(int(p.index)) }

// saveHWCheckpoint writes the checkpoint if a high watermark moved since
// the last one.
func (cl *cluster) saveHWCheckpoint(last map[string]int64) map[string]int64 {
	cur := map[string]int64{}
	for _, p := range []*partition{cl.groupsPart, cl.txnPart} {
		if p.log.Replicated() {
			cur[hwKey(p)] = p.log.HighWatermark()
		}
	}
	for _, t := range cl.s.reg.all() {
		for _, p := range cl.s.reg.partitionsOf(t) {
			if p.log.Replicated() {
				cur[hwKey(p)] = p.log.HighWatermark()
			}
		}
	}
	if maps.Equal(cur, last) {
		return last
	}
	b, err := json.Marshal(cur)
	if err == nil {
		err = log.WriteFileAtomic(log.OSFS, filepath.Join(cl.s.cfg.DataDir, hwCheckpointFile), b)
	}
	if err != nil {
		cl.logger.Warn("write the replication checkpoint", zap.Error(err))
		return last
	}
	return cur
}
