package broker

import (
	"slices"
	"testing"

	"github.com/synapsebroker/synapse/coord"
)

func TestElectFor(t *testing.T) {
	set := func(ids ...int32) func(int32) bool { return func(id int32) bool { return slices.Contains(ids, id) } }
	none := set()
	st := coord.PartState{Leader: 1, Epoch: 4, Replicas: []int32{1, 2, 3}, ISR: []int32{1, 2, 3}}
	for _, c := range []struct {
		name            string
		st              coord.PartState
		alive, replaced func(int32) bool
		want            coord.PartState
		changed         bool
	}{
		{"all alive", st, set(1, 2, 3), none, st, false},
		{"a follower dies", st, set(1, 2), none, coord.PartState{Leader: 1, Epoch: 4, Replicas: st.Replicas, ISR: []int32{1, 2}}, true},
		{"the leader dies: the next replica in the ISR, epoch + 1", st, set(2, 3), none,
			coord.PartState{Leader: 2, Epoch: 5, Replicas: st.Replicas, ISR: []int32{2, 3}}, true},
		{"the ISR all dead: offline, the ISR kept", coord.PartState{Leader: 1, Epoch: 4, Replicas: st.Replicas, ISR: []int32{1}}, set(2, 3), none,
			coord.PartState{Leader: -1, Epoch: 5, Replicas: st.Replicas, ISR: []int32{1}}, true},
		{"offline: its ISR member back", coord.PartState{Leader: -1, Epoch: 5, Replicas: st.Replicas, ISR: []int32{1}}, set(1, 2, 3), none,
			coord.PartState{Leader: 1, Epoch: 6, Replicas: st.Replicas, ISR: []int32{1}}, true},
		{"offline: its ISR member back with another disk is not elected and leaves the ISR", coord.PartState{Leader: -1, Epoch: 5, Replicas: st.Replicas, ISR: []int32{1}}, set(2, 3), set(1),
			coord.PartState{Leader: -1, Epoch: 5, Replicas: st.Replicas, ISR: []int32{}}, true},
		{"a leader with another disk is replaced", st, set(2, 3), set(1),
			coord.PartState{Leader: 2, Epoch: 5, Replicas: st.Replicas, ISR: []int32{2, 3}}, true},
	} {
		got, changed := electFor(c.st, c.alive, c.replaced)
		if changed != c.changed || got.Leader != c.want.Leader || got.Epoch != c.want.Epoch || !slices.Equal(got.ISR, c.want.ISR) {
			t.Errorf("%s: got %+v (changed %v), want %+v (changed %v)", c.name, got, changed, c.want, c.changed)
		}
	}
}

func TestPreferLeader(t *testing.T) {
	alive := func(int32) bool { return true }
	st := coord.PartState{Leader: 2, Epoch: 3, Replicas: []int32{1, 2, 3}, ISR: []int32{1, 2, 3}}
	if got, ok := preferLeader(st, alive); !ok || got.Leader != 1 || got.Epoch != 4 {
		t.Errorf("preferred replica in the ISR: %+v %v", got, ok)
	}
	st.ISR = []int32{2, 3}
	if _, ok := preferLeader(st, alive); ok {
		t.Error("moved leadership to a replica out of the ISR")
	}
}

func TestAssignReplicasSpreads(t *testing.T) {
	live := []coord.BrokerInfo{{ID: 0}, {ID: 1}, {ID: 2}}
	leaders := map[int32]int{}
	for p := int32(0); p < 30; p++ {
		st, ok := assignReplicas("t", p, 3, live)
		if !ok || len(st.Replicas) != 3 || st.Leader != st.Replicas[0] || st.Epoch != 0 {
			t.Fatalf("partition %d: %+v", p, st)
		}
		seen := map[int32]bool{}
		for _, r := range st.Replicas {
			if seen[r] {
				t.Fatalf("partition %d: replica %d twice", p, r)
			}
			seen[r] = true
		}
		leaders[st.Leader]++
	}
	for id, n := range leaders {
		if n != 10 {
			t.Errorf("broker %d leads %d of 30 partitions, want 10", id, n)
		}
	}
	if st, _ := assignReplicas("t", 0, 5, live); len(st.Replicas) != 3 {
		t.Errorf("replication factor above the live brokers: %d replicas", len(st.Replicas))
	}
}

func TestReelect(t *testing.T) {
	alive := func(id int32) bool { return id != 3 }
	st := coord.PartState{Leader: 1, Epoch: 7, Replicas: []int32{1, 2, 3}, ISR: []int32{1, 2, 3}}
	got := reelect(st, alive)
	if got.Leader != 1 || got.Epoch != 8 || !slices.Equal(got.ISR, []int32{1, 2}) {
		t.Errorf("re-election of a restarted leader: %+v, want leader 1 at epoch 8, ISR [1 2]", got)
	}
}

// TestNextStateStaleLeadership: a leadership granted before its leader's
// registration gets a new epoch even when an ISR member died too (an ISR
// change alone would hand the old epoch to the new run).
func TestNextStateStaleLeadership(t *testing.T) {
	v := &coord.View{Brokers: map[int32]coord.BrokerInfo{1: {ID: 1, RegRev: 50}, 2: {ID: 2, RegRev: 10}}}
	alive := func(id int32) bool { _, ok := v.Brokers[id]; return ok }
	replaced := func(int32) bool { return false }
	part := coord.Part{State: coord.PartState{Leader: 1, Epoch: 4, Replicas: []int32{1, 2, 3}, ISR: []int32{1, 2, 3}}, ModRev: 40}
	st, ok := nextState(part, v, alive, replaced, false)
	if !ok || st.Epoch != 5 || st.Leader != 1 || !slices.Equal(st.ISR, []int32{1, 2}) {
		t.Fatalf("stale leadership with a dead ISR member: %+v, %v; want leader 1 at epoch 5, ISR [1 2]", st, ok)
	}
	// Granted after the registration: only the dead member leaves the ISR.
	part.ModRev = 60
	st, ok = nextState(part, v, alive, replaced, false)
	if !ok || st.Epoch != 4 || st.Leader != 1 || !slices.Equal(st.ISR, []int32{1, 2}) {
		t.Fatalf("current leadership with a dead ISR member: %+v, %v; want leader 1 at epoch 4, ISR [1 2]", st, ok)
	}
}

// TestReassignment: a move adds the target's new replicas, completes once
// they are in the ISR (a new leader at epoch + 1 if the leader left), and
// a cancel goes back to the replicas before it.
func TestReassignment(t *testing.T) {
	st := coord.PartState{Leader: 1, Epoch: 3, Replicas: []int32{1, 2, 3}, ISR: []int32{1, 2, 3}}
	mv := startReassignment(st, []int32{4, 2, 3})
	if !slices.Equal(mv.Replicas, []int32{4, 2, 3, 1}) || !slices.Equal(mv.Adding, []int32{4}) || !slices.Equal(mv.Removing, []int32{1}) {
		t.Fatalf("start: %+v", mv)
	}
	if _, done := completeReassignment(mv); done {
		t.Fatal("completed before the added replica is in the ISR")
	}
	in := mv
	in.ISR = []int32{1, 2, 3, 4}
	end, done := completeReassignment(in)
	if !done || !slices.Equal(end.Replicas, []int32{4, 2, 3}) || !slices.Equal(end.ISR, []int32{2, 3, 4}) || reassigning(end) {
		t.Fatalf("complete: %+v, %v", end, done)
	}
	if end.Leader != 4 || end.Epoch != 4 {
		t.Fatalf("the removed leader's successor: %d at %d; want 4 at 4 (the first target replica in the ISR)", end.Leader, end.Epoch)
	}
	all := func(int32) bool { return true }
	back, ok := cancelReassignment(in, all)
	if !ok || !slices.Equal(back.Replicas, []int32{2, 3, 1}) || !slices.Equal(back.ISR, []int32{1, 2, 3}) || reassigning(back) || back.Leader != 1 {
		t.Fatalf("cancel: %+v", back)
	}
	// Only the added replicas in sync: no cancel (they hold the log).
	only := mv
	only.Leader, only.ISR = 4, []int32{4}
	if _, ok := cancelReassignment(only, all); ok {
		t.Fatal("a cancel leaving no in-sync replica was made")
	}
	// A move replaced: an earlier added replica no longer wanted leaves
	// the ISR with the others, never stays there as a non-replica.
	again := startReassignment(in, []int32{5, 2, 3})
	if !slices.Contains(again.Removing, 4) || !slices.Contains(again.Removing, 1) || !slices.Equal(again.Adding, []int32{5}) {
		t.Fatalf("replaced move: %+v", again)
	}
	again.ISR = []int32{1, 2, 3, 4, 5}
	if end, done := completeReassignment(again); !done || slices.Contains(end.ISR, 4) || !slices.Equal(end.Replicas, []int32{5, 2, 3}) {
		t.Fatalf("replaced move's end: %+v, %v", end, done)
	}
	// A failover during the move keeps it.
	if st2, ok := electFor(mv, func(id int32) bool { return id != 1 }, func(int32) bool { return false }); !ok || !reassigning(st2) || st2.Leader == 1 {
		t.Fatalf("failover during a move: %+v, %v", st2, ok)
	}
}

// TestProposeMoves: a fourth broker added to three holding every replica
// gets its share, one replica per partition moved, at most maxMoves at once,
// and nothing moves while a move is under way or counts are even.
func TestProposeMoves(t *testing.T) {
	v := &coord.View{Topics: map[string]coord.Topic{"t": {}}, Parts: map[coord.PartKey]coord.Part{}}
	for p := range int32(6) {
		v.Parts[coord.PartKey{Topic: "t", Partition: p}] = coord.Part{ModRev: 10, State: coord.PartState{Leader: 0, Replicas: []int32{0, 1, 2}, ISR: []int32{0, 1, 2}}}
	}
	live := []coord.BrokerInfo{{ID: 0}, {ID: 1}, {ID: 2}}
	if ups, done := proposeMoves(v, live); len(ups) != 0 || !done || emptyBroker(v, live) {
		t.Fatalf("even counts: %d moves, done %v", len(ups), done)
	}
	live = append(live, coord.BrokerInfo{ID: 3})
	if !emptyBroker(v, live) {
		t.Fatal("a broker added with no replica: not seen")
	}
	ups, _ := proposeMoves(v, live)
	if len(ups) != maxMoves {
		t.Fatalf("moves to a new broker: %d, want %d", len(ups), maxMoves)
	}
	seen := map[coord.PartKey]bool{}
	for _, u := range ups {
		if seen[u.Key] || !slices.Equal(u.State.Adding, []int32{3}) || len(u.State.Removing) != 1 || u.ModRev != 10 {
			t.Fatalf("move %+v", u)
		}
		seen[u.Key] = true
		v.Parts[u.Key] = coord.Part{ModRev: 11, State: u.State}
	}
	if ups, done := proposeMoves(v, live); len(ups) != 0 || done {
		t.Fatalf("%d moves while moves are under way (done %v)", len(ups), done)
	}
}

// TestProposeMovesLeaders: the moves to a new broker include the first
// replica's place of some partition (it becomes a preferred leader).
func TestProposeMovesLeaders(t *testing.T) {
	v := &coord.View{Topics: map[string]coord.Topic{"t": {}}, Parts: map[coord.PartKey]coord.Part{}}
	orders := [][]int32{{1, 2, 0}, {2, 0, 1}, {0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {0, 1, 2}}
	for p, reps := range orders {
		v.Parts[coord.PartKey{Topic: "t", Partition: int32(p)}] = coord.Part{ModRev: 10, State: coord.PartState{Leader: reps[0], Replicas: reps, ISR: []int32{0, 1, 2}}}
	}
	ups, _ := proposeMoves(v, []coord.BrokerInfo{{ID: 0}, {ID: 1}, {ID: 2}, {ID: 3}})
	first := 0
	for _, u := range ups {
		if u.State.Replicas[0] == 3 {
			first++
		}
	}
	if first == 0 {
		t.Fatalf("no move makes the new broker a partition's first replica: %+v", ups)
	}
}

// TestNextStateLeaderBackEmpty: the only in-sync replica, leader of an
// earlier run, back on another disk: no leader, and it leaves the ISR (it
// holds none of the log), whatever the order of the rules.
func TestNextStateLeaderBackEmpty(t *testing.T) {
	v := &coord.View{Brokers: map[int32]coord.BrokerInfo{1: {ID: 1, RegRev: 50, DirID: "new"}}, Dirs: map[int32]string{1: "old"}}
	alive := func(id int32) bool { b, ok := v.Brokers[id]; return ok && v.Dirs[id] == b.DirID }
	replaced := func(id int32) bool { b, ok := v.Brokers[id]; return ok && v.Dirs[id] != b.DirID }
	part := coord.Part{State: coord.PartState{Leader: 1, Epoch: 1, Replicas: []int32{1, 2, 3}, ISR: []int32{1}}, ModRev: 40}
	st, ok := nextState(part, v, alive, replaced, false)
	if !ok || st.Leader != -1 || len(st.ISR) != 0 {
		t.Fatalf("leader back on an empty disk: %+v, %v; want no leader and an empty ISR", st, ok)
	}
}

// TestAlignTxnLeader: the transaction log's leadership follows the group
// log's, when the group log's leader is alive and in its ISR; a move of the
// group log's leadership in the same pass is followed at once.
func TestAlignTxnLeader(t *testing.T) {
	gk, tk := coord.PartKey{Topic: offsetsTopic, Partition: 0}, coord.PartKey{Topic: txnTopic, Partition: 0}
	reps := []int32{1, 2, 3}
	view := func(gLeader, tLeader int32, tISR []int32) *coord.View {
		return &coord.View{Parts: map[coord.PartKey]coord.Part{
			gk: {State: coord.PartState{Leader: gLeader, Epoch: 3, Replicas: reps, ISR: reps}, ModRev: 10},
			tk: {State: coord.PartState{Leader: tLeader, Epoch: 7, Replicas: reps, ISR: tISR}, ModRev: 11},
		}}
	}
	all := func(int32) bool { return true }
	if ups := alignTxnLeader(view(1, 1, reps), nil, all); len(ups) != 0 {
		t.Fatalf("aligned already: %+v", ups)
	}
	ups := alignTxnLeader(view(2, 1, reps), nil, all)
	if len(ups) != 1 || ups[0].Key != tk || ups[0].State.Leader != 2 || ups[0].State.Epoch != 8 || ups[0].ModRev != 11 {
		t.Fatalf("apart: %+v", ups)
	}
	if ups := alignTxnLeader(view(2, 1, []int32{1, 3}), nil, all); len(ups) != 0 {
		t.Fatalf("the group leader outside the transaction log's ISR: %+v", ups)
	}
	if ups := alignTxnLeader(view(2, 1, reps), nil, func(id int32) bool { return id != 2 }); len(ups) != 0 {
		t.Fatalf("the group leader not alive: %+v", ups)
	}
	// The same pass moves both: the group log's update is followed, and
	// the transaction log's own update gets the leader, at its epoch + 1.
	v := view(1, 1, reps)
	in := []coord.PartUpdate{
		{Key: gk, State: coord.PartState{Leader: 3, Epoch: 4, Replicas: reps, ISR: []int32{2, 3}}, ModRev: 10},
		{Key: tk, State: coord.PartState{Leader: 2, Epoch: 8, Replicas: reps, ISR: []int32{2, 3}}, ModRev: 11},
	}
	ups = alignTxnLeader(v, in, all)
	if len(ups) != 2 || ups[1].State.Leader != 3 || ups[1].State.Epoch != 8 || !slices.Equal(ups[1].State.ISR, []int32{2, 3}) {
		t.Fatalf("moved together: %+v", ups)
	}
	st, ok := txnAssignment(view(2, 1, reps))
	if !ok || st.Leader != 2 || !slices.Equal(st.Replicas, reps) || st.Epoch != 0 {
		t.Fatalf("assignment: %+v %v", st, ok)
	}
}
