package group

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzGroupOps drives the coordinator with arbitrary sequences of group
// requests (any version, known, unknown and fenced members, static ids,
// wrong generations, commits, deletes) and checks after every step that
// nothing panicked and each group's bookkeeping is consistent. Joins and
// syncs are given a short deadline, as a client that gives up would.
func FuzzGroupOps(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 0, 2, 0, 1, 3, 0, 0})
	f.Add([]byte{0, 9, 1, 0, 9, 2, 1, 5, 0, 4, 0, 0, 6, 1, 0, 7, 0, 0, 8, 0, 0})
	f.Add([]byte("\x00\x05\x41\x00\x05\x42\x01\x00\x00\x02\x00\x01\x05\x00\x00\x0b\x00\x00\x0a\x00\x00"))
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 120 {
			ops = ops[:120]
		}
		e := newEnv(t, Config{MinSessionTimeout: time.Millisecond, PartitionExists: func(topic string, p int32) bool { return p < 3 }})
		var ids []string // member ids seen in responses
		pick := func(b byte) string {
			switch {
			case b%4 == 0 || len(ids) == 0:
				return ""
			case b%4 == 1:
				return "unknown"
			default:
				return ids[int(b)%len(ids)]
			}
		}
		groups := []string{"a", "b", ""}
		for i := 0; i+2 < len(ops); i += 3 {
			op, x, y := ops[i], ops[i+1], ops[i+2]
			g := groups[int(y)%len(groups)]
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			switch op % 12 {
			case 0, 1: // join
				r := kmsg.NewPtrJoinGroupRequest()
				r.Version = int16(x % 10)
				r.Group, r.MemberID, r.ProtocolType = g, pick(y>>2), "consumer"
				if x&0x10 != 0 {
					r.ProtocolType = "other"
				}
				r.SessionTimeoutMillis = int32(5 + int(y)%40)
				r.RebalanceTimeoutMillis = int32(5 + int(x)%40)
				if x&0x20 != 0 {
					r.InstanceID = kmsg.StringPtr(fmt.Sprint("i", y%3))
				}
				for j := 0; j < int(x>>6); j++ {
					p := kmsg.NewJoinGroupRequestProtocol()
					p.Name, p.Metadata = fmt.Sprint("p", (int(y)+j)%3), []byte{x, y}
					r.Protocols = append(r.Protocols, p)
				}
				resp := e.c.JoinGroup(ctx, r, cl)
				if resp.MemberID != "" {
					ids = append(ids, resp.MemberID)
				}
			case 2: // sync
				r := kmsg.NewPtrSyncGroupRequest()
				r.Version, r.Group, r.MemberID, r.Generation = int16(x%6), g, pick(x), int32(y%4)
				if x&0x40 != 0 {
					r.InstanceID = kmsg.StringPtr(fmt.Sprint("i", y%3))
				}
				for _, id := range ids {
					a := kmsg.NewSyncGroupRequestGroupAssignment()
					a.MemberID, a.MemberAssignment = id, []byte{y}
					r.GroupAssignment = append(r.GroupAssignment, a)
				}
				e.c.SyncGroup(ctx, r)
			case 3: // heartbeat
				r := kmsg.NewPtrHeartbeatRequest()
				r.Version, r.Group, r.MemberID, r.Generation = int16(x%5), g, pick(x), int32(y%4)
				e.c.Heartbeat(r)
			case 4: // leave
				r := kmsg.NewPtrLeaveGroupRequest()
				r.Version, r.Group, r.MemberID = int16(x%6), g, pick(x)
				m := kmsg.NewLeaveGroupRequestMember()
				m.MemberID = pick(y)
				if x&0x80 != 0 {
					m.InstanceID = kmsg.StringPtr(fmt.Sprint("i", y%3))
				}
				r.Members = append(r.Members, m)
				e.c.LeaveGroup(r)
			case 5: // commit
				r := kmsg.NewPtrOffsetCommitRequest()
				r.Version, r.Group, r.MemberID, r.Generation = int16(x%10), g, pick(x), int32(y%4)-1
				t := kmsg.NewOffsetCommitRequestTopic()
				t.Topic = "t"
				p := kmsg.NewOffsetCommitRequestTopicPartition()
				p.Partition, p.Offset = int32(x%4), int64(y)
				t.Partitions = append(t.Partitions, p)
				r.Topics = append(r.Topics, t)
				e.c.OffsetCommit(r)
			case 6: // fetch
				r := kmsg.NewPtrOffsetFetchRequest()
				r.Version, r.Group = int16(x%10), g
				if x&0x10 == 0 {
					t := kmsg.NewOffsetFetchRequestTopic()
					t.Topic, t.Partitions = "t", []int32{0, 1, 5}
					r.Topics = append(r.Topics, t)
				}
				rg := kmsg.NewOffsetFetchRequestGroup()
				rg.Group = g
				r.Groups = append(r.Groups, rg)
				e.c.OffsetFetch(r)
			case 7: // offset delete
				r := kmsg.NewPtrOffsetDeleteRequest()
				r.Group = g
				t := kmsg.NewOffsetDeleteRequestTopic()
				t.Topic = "t"
				t.Partitions = append(t.Partitions, kmsg.NewOffsetDeleteRequestTopicPartition())
				r.Topics = append(r.Topics, t)
				e.c.OffsetDelete(r)
			case 8: // delete groups
				r := kmsg.NewPtrDeleteGroupsRequest()
				r.Groups = []string{g}
				e.c.DeleteGroups(r)
			case 9: // describe + list
				r := kmsg.NewPtrDescribeGroupsRequest()
				r.Groups = []string{g, "zz"}
				e.c.DescribeGroups(r)
				e.c.ListGroups(kmsg.NewPtrListGroupsRequest())
			case 10: // time passes
				time.Sleep(time.Duration(x%30) * time.Millisecond)
				e.c.Maintain(time.Now())
			case 11: // restart
				e.reopen()
			}
			cancel()
			checkConsistent(t, e.c)
		}
	})
}

// checkConsistent checks each group's member bookkeeping.
func checkConsistent(t *testing.T, c *Coordinator) {
	t.Helper()
	for _, g := range c.all() {
		g.mu.Lock()
		if len(g.order) != len(g.members) {
			t.Fatalf("group %q: order %v vs %d members", g.id, g.order, len(g.members))
		}
		for _, id := range g.order {
			if g.members[id] == nil {
				t.Fatalf("group %q: %s in order but not a member", g.id, id)
			}
		}
		for iid, id := range g.static {
			if m := g.members[id]; m == nil || m.instanceID == nil || *m.instanceID != iid {
				t.Fatalf("group %q: static %s -> %s does not match a member", g.id, iid, id)
			}
		}
		if g.state == stateEmpty && len(g.members) > 0 {
			t.Fatalf("group %q: Empty with %d members", g.id, len(g.members))
		}
		if (g.state == stateStable || g.state == stateCompletingRebalance) && g.members[g.leader] == nil {
			t.Fatalf("group %q: %s with leader %q not a member", g.id, g.state, g.leader)
		}
		g.mu.Unlock()
	}
}
