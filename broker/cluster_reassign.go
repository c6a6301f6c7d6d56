package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/coord"
)

// Reassignment, as Kafka's (KIP-455): a partition's state names the
// replicas being added and removed; Replicas is the target followed by
// the removing ones. The added replicas follow the leader like any
// replica and join the ISR by its caught-up rule; once every one is in,
// the controller drops the removing ones (a new leader at epoch + 1 if the
// leader was one of them). AlterPartitionReassignments starts or cancels
// one (a CAS on the partition's state, from any broker); the controller
// also starts them on its own when the replicas are unevenly spread over
// the live brokers (a broker added), a few at a time, so a new broker
// takes its share of replicas and, as some partitions' first replica, of
// leaderships. Such a rebalance starts only when a live broker holds no
// replica (a broker added) and runs until the counts are even: it never
// undoes an operator's reassignment afterwards.

// maxMoves bounds the reassignments the controller starts on its own at
// once.
const maxMoves = 4

// reassigning reports whether st is being reassigned.
func reassigning(st coord.PartState) bool { return len(st.Adding) > 0 || len(st.Removing) > 0 }

// completeReassignment drops st's removing replicas once every adding one
// is in the ISR.
func completeReassignment(st coord.PartState) (coord.PartState, bool) {
	if !reassigning(st) {
		return st, false
	}
	for _, id := range st.Adding {
		if !slices.Contains(st.ISR, id) {
			return st, false
		}
	}
	gone := func(id int32) bool { return slices.Contains(st.Removing, id) }
	out := st
	out.Replicas = slices.DeleteFunc(slices.Clone(st.Replicas), gone)
	out.ISR = slices.DeleteFunc(slices.Clone(st.ISR), gone)
	out.Adding, out.Removing = nil, nil
	if !slices.Contains(out.ISR, st.Leader) {
		out.Leader = -1
		for _, id := range out.Replicas {
			if slices.Contains(out.ISR, id) {
				out.Leader = id
				break
			}
		}
		if out.Leader < 0 {
			return st, false // no target replica in sync yet: wait
		}
		out.Epoch = st.Epoch + 1
	}
	return out, true
}

// startReassignment is st moving to the replicas target (an ongoing
// reassignment replaced: its base is the replicas before it).
func startReassignment(st coord.PartState, target []int32) coord.PartState {
	base := slices.DeleteFunc(slices.Clone(st.Replicas), func(id int32) bool { return slices.Contains(st.Adding, id) })
	out := st
	out.Adding, out.Removing = nil, nil
	for _, id := range target {
		if !slices.Contains(base, id) {
			out.Adding = append(out.Adding, id)
		}
	}
	for _, id := range st.Replicas { // an earlier move's added replica no longer wanted goes too
		if !slices.Contains(target, id) {
			out.Removing = append(out.Removing, id)
		}
	}
	out.Replicas = append(slices.Clone(target), out.Removing...)
	// Added replicas that were in the ISR of a replaced reassignment stay;
	// those no longer wanted leave with the others at the end.
	return out
}

// cancelReassignment is st back at the replicas it had before its
// reassignment.
// ok is false if no in-sync replica would be left (the move is then
// finished instead, or waited for).
func cancelReassignment(st coord.PartState, alive func(int32) bool) (coord.PartState, bool) {
	adding := func(id int32) bool { return slices.Contains(st.Adding, id) }
	out := st
	out.Replicas = slices.DeleteFunc(slices.Clone(st.Replicas), adding)
	out.ISR = slices.DeleteFunc(slices.Clone(st.ISR), adding)
	out.Adding, out.Removing = nil, nil
	if len(out.ISR) == 0 {
		return st, false
	}
	if adding(st.Leader) || !slices.Contains(out.ISR, st.Leader) {
		// Only a live replica the ISR counts: else none, and the
		// controller elects one when it is back.
		out.Leader = -1
		for _, id := range out.Replicas {
			if slices.Contains(out.ISR, id) && alive(id) {
				out.Leader = id
				break
			}
		}
		out.Epoch = st.Epoch + 1
	}
	return out, true
}

// proposeMoves starts, when no reassignment is under way, up to maxMoves
// replica moves from the live broker with the most replicas to the one
// with the fewest, while they differ by more than one. Only partitions
// with a leader and their whole ISR move; the moved replica keeps its
// place in the order (the first one is the preferred leader). done
// reports that there is nothing (more) to move.
func proposeMoves(v *coord.View, live []coord.BrokerInfo) (ups []coord.PartUpdate, done bool) {
	if len(live) < 2 {
		return nil, true
	}
	keys := make([]coord.PartKey, 0, len(v.Parts))
	for k, p := range v.Parts {
		if reassigning(p.State) {
			return nil, false // one round at a time
		}
		// Not the internal topics: the transaction log keeps the group
		// log's replicas, so that one broker can lead both.
		if _, ok := v.Topics[k.Topic]; ok && !internalTopic(k.Topic) {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Topic != keys[j].Topic {
			return keys[i].Topic < keys[j].Topic
		}
		return keys[i].Partition < keys[j].Partition
	})
	counts, prefs := map[int32]int{}, map[int32]int{} // replicas, and partitions each is the first replica of
	for _, b := range live {
		counts[b.ID], prefs[b.ID] = 0, 0
	}
	for _, k := range keys {
		reps := v.Parts[k].State.Replicas
		for _, id := range reps {
			if _, ok := counts[id]; ok {
				counts[id]++
			}
		}
		if len(reps) > 0 {
			if _, ok := prefs[reps[0]]; ok {
				prefs[reps[0]]++
			}
		}
	}
	moved := map[coord.PartKey]bool{}
	for len(ups) < maxMoves {
		from, to := int32(-1), int32(-1)
		for _, b := range live { // by id: deterministic
			if from < 0 || counts[b.ID] > counts[from] {
				from = b.ID
			}
			if to < 0 || counts[b.ID] < counts[to] {
				to = b.ID
			}
		}
		if counts[from]-counts[to] <= 1 {
			break
		}
		// The first replica's place (the preferred leader) moves too while
		// from is the preferred leader of more partitions than to by two:
		// leaderships spread with the replicas.
		first := prefs[from] > prefs[to]+1
		var pick coord.PartKey
		found := false
		for pass := 0; pass < 2 && !found; pass++ {
			for _, k := range keys {
				st := v.Parts[k].State
				if moved[k] || st.Leader < 0 || len(st.ISR) != len(st.Replicas) || !slices.Contains(st.Replicas, from) || slices.Contains(st.Replicas, to) {
					continue
				}
				if pass == 0 && (st.Replicas[0] == from) != first {
					continue // the second pass takes any
				}
				pick, found = k, true
				break
			}
		}
		if !found {
			break
		}
		st := v.Parts[pick].State
		target := slices.Clone(st.Replicas)
		i := slices.Index(target, from)
		target[i] = to
		if i == 0 {
			prefs[from]--
			prefs[to]++
		}
		ups = append(ups, coord.PartUpdate{Key: pick, State: startReassignment(st, target), ModRev: v.Parts[pick].ModRev})
		moved[pick] = true
		counts[from]--
		counts[to]++
	}
	return ups, len(ups) == 0
}

// emptyBroker reports whether a live broker holds no replica while some
// partition exists: a broker added, which starts a rebalance.
func emptyBroker(v *coord.View, live []coord.BrokerInfo) bool {
	if len(v.Parts) == 0 {
		return false
	}
	held := map[int32]bool{}
	for _, p := range v.Parts {
		for _, id := range p.State.Replicas {
			held[id] = true
		}
	}
	for _, b := range live {
		if !held[b.ID] {
			return true
		}
	}
	return false
}

// alterReassignments is AlterPartitionReassignments in a cluster.
func (cl *cluster) alterReassignments(req *kmsg.AlterPartitionAssignmentsRequest, resp *kmsg.AlterPartitionAssignmentsResponse) {
	ctx, cancel := context.WithTimeout(cl.ctx, time.Duration(max(req.TimeoutMillis, 1000))*time.Millisecond)
	defer cancel()
	for _, rt := range req.Topics {
		st := kmsg.NewAlterPartitionAssignmentsResponseTopic()
		st.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			sp := kmsg.NewAlterPartitionAssignmentsResponseTopicPartition()
			sp.Partition = rp.Partition
			code, msg := cl.alterReassignment(ctx, rt.Topic, rp.Partition, rp.Replicas)
			sp.ErrorCode = code
			if msg != "" {
				sp.ErrorMessage = kmsg.StringPtr(msg)
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
}

func (cl *cluster) alterReassignment(ctx context.Context, topic string, partition int32, replicas []int32) (int16, string) {
	for {
		v := cl.currentView()
		k := coord.PartKey{Topic: topic, Partition: partition}
		part, ok := v.Parts[k]
		if _, known := v.Topics[topic]; !known || !ok {
			return kerr.UnknownTopicOrPartition.Code, ""
		}
		if b, ok := v.Brokers[part.State.Leader]; ok && b.RegRev > part.ModRev {
			// The leadership is an earlier run's: the controller gives it a
			// new epoch first (a write of ours would hand the old one on).
			select {
			case <-cl.viewChanged():
				continue
			case <-ctx.Done():
				return kerr.RequestTimedOut.Code, ""
			}
		}
		var next coord.PartState
		switch {
		case replicas == nil && !reassigning(part.State):
			return kerr.NoReassignmentInProgress.Code, ""
		case replicas == nil:
			var ok bool
			if next, ok = cancelReassignment(part.State, func(id int32) bool { return replicaAlive(v, id) }); !ok {
				return kerr.InvalidReplicaAssignment.Code, "a cancel would leave no in-sync replica: the added replicas hold the log now"
			}
		default:
			if len(replicas) == 0 {
				return kerr.InvalidReplicaAssignment.Code, "no replicas"
			}
			for i, id := range replicas {
				if _, ok := v.Brokers[id]; !ok {
					return kerr.InvalidReplicaAssignment.Code, fmt.Sprintf("broker %d is not in the cluster", id)
				}
				if slices.Contains(replicas[:i], id) {
					return kerr.InvalidReplicaAssignment.Code, fmt.Sprintf("broker %d named twice", id)
				}
			}
			next = startReassignment(part.State, replicas)
			if !reassigning(next) && slices.Equal(next.Replicas, part.State.Replicas) {
				return 0, "" // already there
			}
		}
		start := time.Now()
		_, err := cl.client().SetPart(ctx, k, next, part.ModRev)
		cl.observeEtcd(start)
		switch {
		case err == nil:
			cl.logger.Info("reassignment", zap.String("topic", topic), zap.Int32("partition", partition),
				zap.Int32s("replicas", next.Replicas), zap.Int32s("adding", next.Adding), zap.Int32s("removing", next.Removing))
			return 0, ""
		case errors.Is(err, coord.ErrConflict):
			// Changed meanwhile: again on the next view.
			select {
			case <-cl.viewChanged():
				continue
			case <-ctx.Done():
				return kerr.RequestTimedOut.Code, ""
			}
		default:
			return kerr.RequestTimedOut.Code, err.Error()
		}
	}
}

// listReassignments is ListPartitionReassignments in a cluster: the
// partitions named (all, if none is) that are being reassigned.
func (cl *cluster) listReassignments(req *kmsg.ListPartitionReassignmentsRequest, resp *kmsg.ListPartitionReassignmentsResponse) {
	v := cl.currentView()
	want := func(topic string, p int32) bool {
		if req.Topics == nil {
			return true
		}
		for _, rt := range req.Topics {
			if rt.Topic == topic && slices.Contains(rt.Partitions, p) {
				return true
			}
		}
		return false
	}
	byTopic := map[string]int{}
	var keys []coord.PartKey
	for k, p := range v.Parts {
		if reassigning(p.State) && want(k.Topic, k.Partition) {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].Topic < keys[j].Topic || keys[i].Topic == keys[j].Topic && keys[i].Partition < keys[j].Partition
	})
	for _, k := range keys {
		st := v.Parts[k].State
		i, ok := byTopic[k.Topic]
		if !ok {
			rt := kmsg.NewListPartitionReassignmentsResponseTopic()
			rt.Topic = k.Topic
			resp.Topics = append(resp.Topics, rt)
			i = len(resp.Topics) - 1
			byTopic[k.Topic] = i
		}
		rp := kmsg.NewListPartitionReassignmentsResponseTopicPartition()
		rp.Partition = k.Partition
		rp.Replicas, rp.AddingReplicas, rp.RemovingReplicas = st.Replicas, st.Adding, st.Removing
		resp.Topics[i].Partitions = append(resp.Topics[i].Partitions, rp)
	}
}

// electLeaders is ElectLeaders in a cluster (43_elect_leaders.go).
func (cl *cluster) electLeaders(req *kmsg.ElectLeadersRequest, resp *kmsg.ElectLeadersResponse) {
	ctx, cancel := context.WithTimeout(cl.ctx, time.Duration(max(req.TimeoutMillis, 1000))*time.Millisecond)
	defer cancel()
	unclean := req.Version >= 1 && req.ElectionType == 1
	topics := req.Topics
	if topics == nil {
		v := cl.currentView()
		byTopic := map[string]int{}
		for k, p := range v.Parts {
			if _, ok := v.Topics[k.Topic]; !ok || len(p.State.Replicas) == 0 || p.State.Leader == p.State.Replicas[0] {
				continue
			}
			i, ok := byTopic[k.Topic]
			if !ok {
				rt := kmsg.NewElectLeadersRequestTopic()
				rt.Topic = k.Topic
				topics = append(topics, rt)
				i = len(topics) - 1
				byTopic[k.Topic] = i
			}
			topics[i].Partitions = append(topics[i].Partitions, k.Partition)
		}
	}
	for _, rt := range topics {
		st := kmsg.NewElectLeadersResponseTopic()
		st.Topic = rt.Topic
		for _, p := range rt.Partitions {
			sp := kmsg.NewElectLeadersResponseTopicPartition()
			sp.Partition = p
			sp.ErrorCode = cl.electLeader(ctx, coord.PartKey{Topic: rt.Topic, Partition: p}, unclean)
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
}

func (cl *cluster) electLeader(ctx context.Context, k coord.PartKey, unclean bool) int16 {
	for {
		v := cl.currentView()
		part, ok := v.Parts[k]
		if _, known := v.Topics[k.Topic]; !known || !ok || len(part.State.Replicas) == 0 {
			return kerr.UnknownTopicOrPartition.Code
		}
		st := part.State
		if unclean {
			if st.Leader >= 0 {
				return kerr.ElectionNotNeeded.Code
			}
			return kerr.EligibleLeadersNotAvailable.Code // never outside the ISR
		}
		pref := st.Replicas[0]
		switch {
		case st.Leader == pref:
			return kerr.ElectionNotNeeded.Code
		case !replicaAlive(v, pref) || !slices.Contains(st.ISR, pref):
			return kerr.PreferredLeaderNotAvailable.Code
		}
		start := time.Now()
		_, err := cl.client().SetPart(ctx, k, with(st, pref, st.Epoch+1, st.ISR), part.ModRev)
		cl.observeEtcd(start)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, coord.ErrConflict):
			select {
			case <-cl.viewChanged():
			case <-ctx.Done():
				return kerr.RequestTimedOut.Code
			}
		default:
			return kerr.RequestTimedOut.Code
		}
	}
}
