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
