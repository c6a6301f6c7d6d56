package broker

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/coord"
)

// The controller: one broker at a time, chosen by etcd election. It holds
// no state of its own: at every view (and every second) it writes what the
// view needs, each write a compare-and-swap on the partition's state and
// fenced by its election revision, so a deposed controller changes
// nothing.
//   - A partition of a topic with no state yet gets its replicas
//     (round-robin over the live brokers from a per-topic start) and epoch 0.
//   - A partition whose leader is gone gets the first live ISR member as
//     leader at epoch+1; with none, no leader (epoch+1): it waits for an ISR
//     member to come back (no unclean election).
//   - Dead brokers leave the ISR (never its last member).
//   - A partition with no leader whose ISR member is back gets it.

// campaign runs for controller for as long as the broker is in the
// cluster, and controls while elected.
func (cl *cluster) campaign(ctx context.Context, co *coord.Client) {
	for ctx.Err() == nil {
		lead, err := co.Campaign(ctx, cl.id)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, coord.ErrSessionLost) {
				return
			}
			cl.logger.Warn("controller campaign", zap.Error(err))
			sleepCtx(ctx, time.Second)
			continue
		}
		cl.controller.Store(true)
		cl.logger.Info("controller")
		cl.control(ctx, co, lead)
		cl.controller.Store(false)
		return // the session is gone: a new one campaigns again
	}
}

// control acts on every view until the session ends.
func (cl *cluster) control(ctx context.Context, co *coord.Client, lead *coord.Leadership) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	// With a bucket: a keyspace no controller has checked may be a disaster
	// to restore from it (cluster_restore.go) before anything else.
	// The mirror only once that is settled: an empty keyspace's topics
	// must not replace the copy a restore reads.
	settled := cl.s.cfg.Tier == nil
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	for {
		ch := cl.viewChanged()
		if v := cl.currentView(); v != nil {
			if !settled {
				if settled = cl.restoreOnce(ctx, co, lead, v, time.Since(start)); settled {
					go cl.mirrorLoop(mctx, co)
				}
			}
			if settled {
				cl.controlOnce(ctx, co, lead, v)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-co.Done():
			return
		case <-ch:
		case <-tick.C:
		}
	}
}

// controlOnce writes the partition states v calls for.
func (cl *cluster) controlOnce(ctx context.Context, co *coord.Client, lead *coord.Leadership, v *coord.View) {
	live := liveBrokers(v)
	// A broker counts as the replica the ISR knows only with the data
	// directory the cluster knows it by: one back with another (an empty
	// or replaced disk) leaves every ISR and is elected nowhere, until the
	// controller records its new directory below (it then rejoins ISRs by
	// catching up, as any follower).
	alive := func(id int32) bool { return replicaAlive(v, id) }
	replaced := func(id int32) bool {
		b, ok := v.Brokers[id]
		d, known := v.Dirs[id]
		return ok && known && b.DirID != "" && d != b.DirID
	}
	newDirs := map[int32]string{}
	for id, b := range v.Brokers {
		if b.DirID != "" && v.Dirs[id] != b.DirID {
			newDirs[id] = b.DirID
		}
	}
	// Preferred leaders (Kafka's auto.leader.rebalance.enable), at most
	// every rebalanceEvery: a broker back in the ISR takes back the
	// partitions it is the first replica of.
	rebalance := time.Since(cl.rebalancedAt) >= rebalanceEvery
	if rebalance {
		cl.rebalancedAt = time.Now()
	}
	var ups []coord.PartUpdate
	for name, t := range v.Topics {
		for i := int32(0); i < t.Info.Partitions; i++ {
			k := coord.PartKey{Topic: name, Partition: i}
			part, ok := v.Parts[k]
			if !ok {
				st, ok := assignReplicas(name, i, t.Info.RF, live)
				if name == txnTopic {
					st, ok = txnAssignment(v)
				}
				if ok {
					ups = append(ups, coord.PartUpdate{Key: k, State: st})
				}
				continue
			}
			// The transaction log's leader follows the group log's
			// (alignTxnLeader), not its preferred replica.
			if st, ok := nextState(part, v, alive, replaced, rebalance && name != txnTopic); ok {
				ups = append(ups, coord.PartUpdate{Key: k, State: st, ModRev: part.ModRev})
			}
		}
	}
	ups = alignTxnLeader(v, ups, alive)
	if len(ups) == 0 && !cl.cfg.NoReplicaRebalance {
		// Nothing else to do: a broker added gets its share of replicas
		// (cluster_reassign.go), until the counts are even.
		if !cl.rebalancing && emptyBroker(v, live) {
			cl.rebalancing = true
			cl.logger.Info("controller: a broker holds no replica: moving replicas to it")
		}
		if cl.rebalancing {
			var done bool
			if ups, done = proposeMoves(v, live); done {
				cl.rebalancing = false
				cl.logger.Info("controller: replicas spread over the live brokers")
			}
		}
	}
	if len(ups) == 0 && len(newDirs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	err := co.SetParts(ctx, ups, lead.Fence())
	cl.observeEtcd(start)
	if err != nil {
		cl.logger.Info("controller writes not made (retried at the next view)", zap.Int("partitions", len(ups)), zap.Error(err))
		return
	}
	// Once no ISR counts a broker by its old directory: its new one.
	for id, d := range newDirs {
		if old, known := v.Dirs[id]; known {
			cl.logger.Warn("broker back with another data directory: out of every ISR until it catches up",
				zap.Int32("broker", id), zap.String("was", old), zap.String("now", d))
		}
	}
	if err := co.SetDirs(ctx, newDirs, lead.Fence()); err != nil {
		cl.logger.Info("controller: data directories not recorded (retried at the next view)", zap.Error(err))
	}
	for _, u := range ups {
		cl.logger.Info("partition state", zap.String("topic", u.Key.Topic), zap.Int32("partition", u.Key.Partition),
			zap.Int32("leader", u.State.Leader), zap.Int32("leader_epoch", u.State.Epoch), zap.Int32s("isr", u.State.ISR))
	}
	cl.logger.Debug("controller wrote", zap.Int("partitions", len(ups)), zap.Duration("took", time.Since(start)))
}

// replicaAlive reports whether broker id is registered with the data
// directory the cluster knows it by (the replica the ISR counted).
func replicaAlive(v *coord.View, id int32) bool {
	b, ok := v.Brokers[id]
	if !ok {
		return false
	}
	d, known := v.Dirs[id]
	return !known || b.DirID == "" || d == b.DirID
}

// nextState is the state the controller writes for part, if any.
func nextState(part coord.Part, v *coord.View, alive, replaced func(int32) bool, rebalance bool) (coord.PartState, bool) {
	if b, ok := v.Brokers[part.State.Leader]; ok && b.RegRev > part.ModRev && alive(part.State.Leader) {
		// Granted to an earlier run (or session) of its leader: a new
		// epoch first (the same broker may lead it), so followers that
		// hold a tail it lost truncate it. Before any other change: an
		// ISR change alone would keep the epoch and grant the old
		// leadership to the new run. (A leader back on another disk is
		// not alive: electFor moves the leadership, epoch + 1, and takes
		// it out of the ISR before its new disk is recorded.)
		return reelect(part.State, alive), true
	}
	if st, changed := electFor(part.State, alive, replaced); changed {
		return st, true
	}
	if st, done := completeReassignment(part.State); done {
		return st, true
	}
	if rebalance {
		return preferLeader(part.State, alive)
	}
	return coord.PartState{}, false
}

// with is st with another leader, epoch and ISR (its replicas and any
// reassignment kept).
func with(st coord.PartState, leader, epoch int32, isr []int32) coord.PartState {
	st.Leader, st.Epoch, st.ISR = leader, epoch, isr
	return st
}

// reelect gives st a new epoch with the first live ISR member (in replica
// order) as leader.
func reelect(st coord.PartState, alive func(int32) bool) coord.PartState {
	isr := slices.DeleteFunc(slices.Clone(st.ISR), func(id int32) bool { return !alive(id) })
	for _, id := range st.Replicas {
		if slices.Contains(isr, id) {
			return with(st, id, st.Epoch+1, isr)
		}
	}
	return with(st, -1, st.Epoch+1, st.ISR)
}

// rebalanceEvery is how often the controller moves leadership back to
// preferred replicas.
const rebalanceEvery = 10 * time.Second

// preferLeader moves leadership to the first replica when it is alive and
// in the ISR but not the leader.
func preferLeader(st coord.PartState, alive func(int32) bool) (coord.PartState, bool) {
	if len(st.Replicas) == 0 {
		return st, false
	}
	pref := st.Replicas[0]
	if st.Leader == pref || !alive(pref) || !slices.Contains(st.ISR, pref) {
		return st, false
	}
	return with(st, pref, st.Epoch+1, st.ISR), true
}

// assignReplicas places a new partition's rf replicas on the live brokers:
// round-robin from a start derived from the topic name, so topics spread.
func assignReplicas(topic string, p, rf int32, live []coord.BrokerInfo) (coord.PartState, bool) {
	n := int32(len(live))
	if n == 0 {
		return coord.PartState{}, false
	}
	rf = min(max(rf, 1), n)
	h := fnv.New32a()
	h.Write([]byte(topic))
	start := int32(h.Sum32() % uint32(n))
	reps := make([]int32, rf)
	for j := int32(0); j < rf; j++ {
		reps[j] = live[(start+p+j)%n].ID
	}
	isr := slices.Clone(reps)
	slices.Sort(isr)
	return coord.PartState{Leader: reps[0], Epoch: 0, Replicas: reps, ISR: isr}, true
}

// electFor returns the state st should move to given who is alive, and
// whether it changes.
func electFor(st coord.PartState, alive, replaced func(int32) bool) (coord.PartState, bool) {
	isr := make([]int32, 0, len(st.ISR))
	for _, id := range st.ISR {
		if alive(id) {
			isr = append(isr, id)
		}
	}
	leaderOK := st.Leader >= 0 && alive(st.Leader) && slices.Contains(st.ISR, st.Leader)
	if leaderOK {
		if len(isr) == len(st.ISR) {
			return st, false
		}
		return with(st, st.Leader, st.Epoch, isr), true
	}
	// A new leader: the first replica (the preferred order) in the ISR and
	// alive.
	for _, id := range st.Replicas {
		if alive(id) && slices.Contains(st.ISR, id) {
			return with(st, id, st.Epoch+1, isr), true
		}
	}
	// Nobody in the ISR is alive: offline, keeping the ISR it had (its
	// members hold every committed record), but for brokers back with
	// another data directory, which hold none of it.
	keep := slices.DeleteFunc(slices.Clone(st.ISR), replaced)
	if st.Leader == -1 {
		if len(keep) == len(st.ISR) {
			return st, false // offline already: wait for an ISR member
		}
		return with(st, -1, st.Epoch, keep), true
	}
	return with(st, -1, st.Epoch+1, keep), true
}

// handOverUpdate is the state write that hands p's leadership to the
// first other live ISR member, at epoch + 1 and with this broker out of
// the ISR; ok is false if this broker does not lead p or nobody can take
// it.
func (cl *cluster) handOverUpdate(v *coord.View, p *partition) (coord.PartUpdate, bool) {
	r := roleOf(p)
	if !r.isLeader || v == nil {
		return coord.PartUpdate{}, false
	}
	next := int32(-1)
	for _, id := range r.replicas {
		b, ok := v.Brokers[id]
		if d, known := v.Dirs[id]; ok && known && b.DirID != "" && d != b.DirID {
			continue // back on another disk: not the replica the ISR counted
		}
		if ok && id != cl.id && slices.Contains(r.isr, id) {
			next = id
			break
		}
	}
	if next < 0 {
		return coord.PartUpdate{}, false // nobody to take it: it goes offline with this broker
	}
	st := r.state
	st.Leader, st.Epoch = next, r.epoch+1
	st.ISR = slices.DeleteFunc(slices.Clone(r.isr), func(id int32) bool { return id == cl.id })
	return coord.PartUpdate{Key: coord.PartKey{Topic: p.topic.name, Partition: p.index}, State: st, ModRev: r.modRev}, true
}

// moveOffFailed hands p's leadership over if p's log failed here (a
// latched storage error: the partition is offline on this broker until a
// restart), as Kafka's log directory failure does: another ISR member
// holds every committed record and serves at once. This broker stays a
// replica, out of the ISR.
func (cl *cluster) moveOffFailed(p *partition) {
	err := p.log.Err()
	if err == nil {
		return
	}
	u, ok := cl.handOverUpdate(cl.currentView(), p)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(cl.ctx, 5*time.Second)
	defer cancel()
	t0 := time.Now()
	werr := cl.client().SetParts(ctx, []coord.PartUpdate{u})
	cl.observeEtcd(t0)
	if werr != nil {
		cl.s.repeat.Warn("storage failure: leadership not handed over (retried)", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(werr))
		return
	}
	cl.logger.Error("storage failure: leadership handed over", zap.String("topic", p.topic.name), zap.Int32("partition", p.index),
		zap.Int32("to", u.State.Leader), zap.Int32("leader_epoch", u.State.Epoch), zap.Error(err))
}

// handOver moves the leadership of every partition this broker leads to
// another live ISR member, at epoch + 1 and with this broker out of the
// ISR (a controlled shutdown): clients move at once, instead of after the
// session TTL. Each write is a CAS on the state the role came from, so a
// change made meanwhile wins.
func (cl *cluster) handOver(ctx context.Context) {
	v := cl.currentView()
	var ups []coord.PartUpdate
	var parts []*partition
	for _, t := range cl.s.reg.all() {
		parts = append(parts, cl.s.reg.partitionsOf(t)...)
	}
	parts = append(parts, cl.groupsPart, cl.txnPart)
	for _, p := range parts {
		if u, ok := cl.handOverUpdate(v, p); ok {
			ups = append(ups, u)
		}
	}
	if len(ups) == 0 {
		return
	}
	start := time.Now()
	if err := cl.client().SetParts(ctx, ups); err != nil {
		cl.logger.Warn("controlled shutdown: some leaderships not handed over (they move after the session ends)", zap.Error(err))
	}
	// Stop acting as leader where the view says so now.
	cl.waitFor(ctx, 2*time.Second, func() bool {
		for _, u := range ups {
			t := cl.s.reg.get(u.Key.Topic)
			if t == nil {
				continue
			}
			if p := cl.s.reg.partition(t, u.Key.Partition); p != nil && roleOf(p).isLeader {
				return false
			}
		}
		return true
	})
	cl.logger.Info("controlled shutdown: leadership handed over", zap.Int("partitions", len(ups)), zap.Duration("took", time.Since(start)))
}
