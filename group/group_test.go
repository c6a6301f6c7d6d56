package group

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/log"
)

// env is a coordinator on a real group log in a temp directory.
type env struct {
	t     *testing.T
	dir   string
	store *log.Store
	lp    *log.Partition
	c     *Coordinator
	cfg   Config
}

func newEnv(t *testing.T, cfg Config) *env {
	e := &env{t: t, dir: t.TempDir(), cfg: cfg}
	e.open(nil)
	t.Cleanup(e.close)
	return e
}

func (e *env) open(seed []byte) {
	e.t.Helper()
	e.store = log.OpenStore(log.Options{})
	lp, err := e.store.OpenPartition(filepath.Join(e.dir, "__groups"), LogConfig())
	if err != nil {
		e.t.Fatal(err)
	}
	e.lp = lp
	cfg := e.cfg
	cfg.Logger = zaptest.NewLogger(e.t)
	if cfg.InitialRebalanceDelay == 0 {
		cfg.InitialRebalanceDelay = -1
	}
	if cfg.MinSessionTimeout == 0 {
		cfg.MinSessionTimeout = 10 * time.Millisecond
	}
	if e.c, err = Open(cfg, lp, seed); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) close() {
	if e.c == nil {
		return
	}
	e.c.Close()
	e.lp.Close()
	e.store.Close()
	e.c = nil
}

func (e *env) reopen() {
	e.close()
	e.open(nil)
}

var bg = context.Background()

func joinReq(group, member string, version int16, session time.Duration, protos ...string) *kmsg.JoinGroupRequest {
	r := kmsg.NewPtrJoinGroupRequest()
	r.Version, r.Group, r.MemberID, r.ProtocolType = version, group, member, "consumer"
	r.SessionTimeoutMillis = int32(session / time.Millisecond)
	r.RebalanceTimeoutMillis = int32(2 * session / time.Millisecond)
	if len(protos) == 0 {
		protos = []string{"range"}
	}
	for _, p := range protos {
		jp := kmsg.NewJoinGroupRequestProtocol()
		jp.Name, jp.Metadata = p, []byte("meta-"+member+"-"+p)
		r.Protocols = append(r.Protocols, jp)
	}
	return r
}

var cl = Client{ID: "c", Host: "/127.0.0.1"}

// joinAsync runs JoinGroup in the background.
func (e *env) joinAsync(r *kmsg.JoinGroupRequest) <-chan *kmsg.JoinGroupResponse {
	ch := make(chan *kmsg.JoinGroupResponse, 1)
	go func() { ch <- e.c.JoinGroup(bg, r, cl) }()
	return ch
}

func wait[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out")
		panic("unreachable")
	}
}

// newMember joins a new member the v4+ way (MEMBER_ID_REQUIRED first) and
// returns its id and the parked join.
func (e *env) newMember(group string, session time.Duration) (string, <-chan *kmsg.JoinGroupResponse) {
	e.t.Helper()
	r := e.c.JoinGroup(bg, joinReq(group, "", 9, session), cl)
	if r.ErrorCode != kerr.MemberIDRequired.Code || r.MemberID == "" {
		e.t.Fatalf("first join: error %d member %q, want MEMBER_ID_REQUIRED and an id", r.ErrorCode, r.MemberID)
	}
	return r.MemberID, e.joinAsync(joinReq(group, r.MemberID, 9, session))
}

func syncReq(group, member string, gen int32, assign map[string]string) *kmsg.SyncGroupRequest {
	r := kmsg.NewPtrSyncGroupRequest()
	r.Version, r.Group, r.MemberID, r.Generation = 5, group, member, gen
	for m, a := range assign {
		ga := kmsg.NewSyncGroupRequestGroupAssignment()
		ga.MemberID, ga.MemberAssignment = m, []byte(a)
		r.GroupAssignment = append(r.GroupAssignment, ga)
	}
	return r
}

func (e *env) heartbeat(group, member string, gen int32) int16 {
	r := kmsg.NewPtrHeartbeatRequest()
	r.Version, r.Group, r.MemberID, r.Generation = 4, group, member, gen
	return e.c.Heartbeat(r).ErrorCode
}

func (e *env) describe(group string) kmsg.DescribeGroupsResponseGroup {
	r := kmsg.NewPtrDescribeGroupsRequest()
	r.Version, r.Groups = 5, []string{group}
	return e.c.DescribeGroups(r).Groups[0]
}

func (e *env) commit(group, member string, gen int32, topic string, offsets ...int64) []int16 {
	r := kmsg.NewPtrOffsetCommitRequest()
	r.Version, r.Group, r.MemberID, r.Generation = 9, group, member, gen
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = topic
	for i, o := range offsets {
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = int32(i), o, 3, kmsg.StringPtr(fmt.Sprintf("m%d", o))
		rt.Partitions = append(rt.Partitions, rp)
	}
	r.Topics = append(r.Topics, rt)
	var codes []int16
	for _, p := range e.c.OffsetCommit(r).Topics[0].Partitions {
		codes = append(codes, p.ErrorCode)
	}
	return codes
}

// fetch returns the committed offsets of partitions 0..n-1 (v9, batched).
func (e *env) fetch(group, topic string, n int) []int64 {
	r := kmsg.NewPtrOffsetFetchRequest()
	r.Version = 9
	rg := kmsg.NewOffsetFetchRequestGroup()
	rg.Group = group
	rt := kmsg.NewOffsetFetchRequestGroupTopic()
	rt.Topic = topic
	for i := 0; i < n; i++ {
		rt.Partitions = append(rt.Partitions, int32(i))
	}
	rg.Topics = append(rg.Topics, rt)
	r.Groups = append(r.Groups, rg)
	resp := e.c.OffsetFetch(r)
	var out []int64
	for _, p := range resp.Groups[0].Topics[0].Partitions {
		if p.ErrorCode != 0 {
			e.t.Fatalf("fetch partition %d: error %d", p.Partition, p.ErrorCode)
		}
		out = append(out, p.Offset)
	}
	return out
}

func codeName(c int16) string {
	if c == 0 {
		return "NONE"
	}
	return kerr.ErrorForCode(c).Error()
}

func wantCode(t *testing.T, what string, got int16, want *kerr.Error) {
	t.Helper()
	w := int16(0)
	if want != nil {
		w = want.Code
	}
	if got != w {
		t.Fatalf("%s: got %s, want %s", what, codeName(got), codeName(w))
	}
}

// TestJoinSyncRebalance walks the classic protocol: two members, a leader
// assignment, a third member forcing a rebalance seen through heartbeats,
// then a leave.
func TestJoinSyncRebalance(t *testing.T) {
	e := newEnv(t, Config{})
	const g = "g1"
	a, aj := e.newMember(g, time.Second)
	ra := wait(t, aj)
	wantCode(t, "join a", ra.ErrorCode, nil)
	if ra.Generation != 1 || ra.LeaderID != a || len(ra.Members) != 1 || *ra.Protocol != "range" || *ra.ProtocolType != "consumer" {
		t.Fatalf("join a: %+v", ra)
	}
	if string(ra.Members[0].ProtocolMetadata) != "meta-"+a+"-range" {
		t.Fatalf("leader got metadata %q", ra.Members[0].ProtocolMetadata)
	}
	s := e.c.SyncGroup(bg, syncReq(g, a, 1, map[string]string{a: "A1"}))
	wantCode(t, "sync a", s.ErrorCode, nil)
	if string(s.MemberAssignment) != "A1" {
		t.Fatalf("sync a assignment %q", s.MemberAssignment)
	}
	if d := e.describe(g); d.State != "Stable" || len(d.Members) != 1 || string(d.Members[0].MemberAssignment) != "A1" {
		t.Fatalf("describe: %+v", d)
	}
	wantCode(t, "heartbeat a", e.heartbeat(g, a, 1), nil)
	wantCode(t, "heartbeat wrong generation", e.heartbeat(g, a, 7), kerr.IllegalGeneration)
	wantCode(t, "heartbeat unknown", e.heartbeat(g, "nobody", 1), kerr.UnknownMemberID)

	// b joins: a learns through its heartbeat and rejoins.
	b, bj := e.newMember(g, time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for e.heartbeat(g, a, 1) != kerr.RebalanceInProgress.Code {
		if time.Now().After(deadline) {
			t.Fatal("a never saw REBALANCE_IN_PROGRESS")
		}
		time.Sleep(5 * time.Millisecond)
	}
	aj = e.joinAsync(joinReq(g, a, 9, time.Second))
	ra, rb := wait(t, aj), wait(t, bj)
	wantCode(t, "rejoin a", ra.ErrorCode, nil)
	wantCode(t, "join b", rb.ErrorCode, nil)
	if ra.Generation != 2 || rb.Generation != 2 || ra.LeaderID != a || rb.LeaderID != a || len(ra.Members) != 2 || len(rb.Members) != 0 {
		t.Fatalf("generation 2: a %+v b %+v", ra, rb)
	}
	// b's sync waits for the leader's.
	bs := make(chan *kmsg.SyncGroupResponse, 1)
	go func() { bs <- e.c.SyncGroup(bg, syncReq(g, b, 2, nil)) }()
	time.Sleep(20 * time.Millisecond)
	select {
	case r := <-bs:
		t.Fatalf("b's sync answered before the leader's: %+v", r)
	default:
	}
	s = e.c.SyncGroup(bg, syncReq(g, a, 2, map[string]string{a: "A2", b: "B2"}))
	if s.ErrorCode != 0 || string(s.MemberAssignment) != "A2" {
		t.Fatalf("sync a: %+v", s)
	}
	if r := wait(t, bs); r.ErrorCode != 0 || string(r.MemberAssignment) != "B2" {
		t.Fatalf("sync b: %+v", r)
	}
	wantCode(t, "sync old generation", e.c.SyncGroup(bg, syncReq(g, b, 1, nil)).ErrorCode, kerr.IllegalGeneration)

	// b leaves; a rebalances alone.
	lr := kmsg.NewPtrLeaveGroupRequest()
	lr.Version = 5
	lm := kmsg.NewLeaveGroupRequestMember()
	lm.MemberID = b
	lr.Group, lr.Members = g, []kmsg.LeaveGroupRequestMember{lm}
	if resp := e.c.LeaveGroup(lr); resp.ErrorCode != 0 || resp.Members[0].ErrorCode != 0 {
		t.Fatalf("leave: %+v", resp)
	}
	wantCode(t, "heartbeat after leave", e.heartbeat(g, a, 2), kerr.RebalanceInProgress)
	ra = e.c.JoinGroup(bg, joinReq(g, a, 9, time.Second), cl)
	if ra.ErrorCode != 0 || ra.Generation != 3 || len(ra.Members) != 1 {
		t.Fatalf("rejoin alone: %+v", ra)
	}
	// Leaving again: unknown member.
	if resp := e.c.LeaveGroup(lr); resp.Members[0].ErrorCode != kerr.UnknownMemberID.Code {
		t.Fatalf("second leave: %+v", resp)
	}
}

// TestSessionTimeoutEvicts: a member that stops heartbeating is removed and
// the rest rebalance without it; a group left with no one is Empty.
func TestSessionTimeoutEvicts(t *testing.T) {
	e := newEnv(t, Config{})
	const g = "g"
	a, aj := e.newMember(g, 200*time.Millisecond)
	wait(t, aj)
	e.c.SyncGroup(bg, syncReq(g, a, 1, map[string]string{a: "x"}))
	deadline := time.Now().Add(5 * time.Second)
	for e.describe(g).State != "Empty" {
		if time.Now().After(deadline) {
			t.Fatalf("member never expired: %+v", e.describe(g))
		}
		time.Sleep(10 * time.Millisecond)
	}
	wantCode(t, "heartbeat after expiry", e.heartbeat(g, a, 1), kerr.UnknownMemberID)
	// A heartbeating member is kept well past its session timeout.
	b, bj := e.newMember(g, 200*time.Millisecond)
	rb := wait(t, bj)
	e.c.SyncGroup(bg, syncReq(g, b, rb.Generation, map[string]string{b: "x"}))
	for i := 0; i < 20; i++ {
		wantCode(t, "heartbeat", e.heartbeat(g, b, rb.Generation), nil)
		time.Sleep(40 * time.Millisecond)
	}
}

// TestJoinWaitsForKnownMembers: the join completes only once every known
// member has rejoined, or at the rebalance timeout without the missing.
func TestJoinTimeoutRemovesMissing(t *testing.T) {
	e := newEnv(t, Config{InitialRebalanceDelay: 100 * time.Millisecond}) // both in the first generation
	const g = "g"
	a, aj := e.newMember(g, 150*time.Millisecond)
	b, bj := e.newMember(g, 5*time.Second)
	ra := wait(t, aj)
	rb := wait(t, bj)
	if ra.Generation != rb.Generation || (ra.LeaderID != a && ra.LeaderID != b) {
		t.Fatalf("a %+v b %+v", ra, rb)
	}
	e.c.SyncGroup(bg, syncReq(g, ra.LeaderID, ra.Generation, nil))
	// b rejoins (protocol change) while a goes silent; the join completes
	// without a once a's rebalance window and session pass.
	start := time.Now()
	rb = wait(t, e.joinAsync(joinReq(g, b, 9, 5*time.Second, "roundrobin", "range")))
	if rb.ErrorCode != 0 || len(rb.Members) != 1 || rb.LeaderID != b {
		t.Fatalf("b alone: %+v", rb)
	}
	if time.Since(start) > 8*time.Second {
		t.Fatalf("join took %s", time.Since(start))
	}
}

// TestStaticMembership: a static member rejoining without its id replaces
// itself without a rebalance; the old id is fenced.
func TestStaticMembership(t *testing.T) {
	e := newEnv(t, Config{})
	const g = "g"
	jr := joinReq(g, "", 9, time.Second)
	jr.InstanceID = kmsg.StringPtr("inst-1")
	r := e.c.JoinGroup(bg, jr, cl) // static members get an id at once
	if r.ErrorCode != 0 || r.MemberID == "" || r.Generation != 1 {
		t.Fatalf("static join: %+v", r)
	}
	old := r.MemberID
	e.c.SyncGroup(bg, syncReq(g, old, 1, map[string]string{old: "mine"}))
	r = e.c.JoinGroup(bg, jr, cl)
	if r.ErrorCode != 0 || r.MemberID == old || r.Generation != 1 || !r.SkipAssignment {
		t.Fatalf("static rejoin: %+v (old %s)", r, old)
	}
	s := e.c.SyncGroup(bg, syncReq(g, r.MemberID, 1, nil))
	if s.ErrorCode != 0 || string(s.MemberAssignment) != "mine" {
		t.Fatalf("sync after static rejoin: %+v", s)
	}
	// The replaced process is a zombie: fenced (fatal in clients), not
	// UNKNOWN_MEMBER_ID (which would make it rejoin and take the instance
	// back).
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Version, hb.Group, hb.MemberID, hb.Generation, hb.InstanceID = 4, g, old, 1, kmsg.StringPtr("inst-1")
	wantCode(t, "old id heartbeat", e.c.Heartbeat(hb).ErrorCode, kerr.FencedInstanceID)
	hb.MemberID = "someone-else"
	wantCode(t, "zombie heartbeat", e.c.Heartbeat(hb).ErrorCode, kerr.FencedInstanceID)
	zs := syncReq(g, old, 1, nil)
	zs.InstanceID = kmsg.StringPtr("inst-1")
	wantCode(t, "zombie sync", e.c.SyncGroup(bg, zs).ErrorCode, kerr.FencedInstanceID)
	zj := joinReq(g, old, 9, time.Second)
	zj.InstanceID = kmsg.StringPtr("inst-1")
	wantCode(t, "zombie join", e.c.JoinGroup(bg, zj, cl).ErrorCode, kerr.FencedInstanceID)
	zc := kmsg.NewPtrOffsetCommitRequest()
	zc.Version, zc.Group, zc.MemberID, zc.Generation, zc.InstanceID = 8, g, old, 1, kmsg.StringPtr("inst-1")
	zt := kmsg.NewOffsetCommitRequestTopic()
	zt.Topic, zt.Partitions = "t", []kmsg.OffsetCommitRequestTopicPartition{kmsg.NewOffsetCommitRequestTopicPartition()}
	zc.Topics = append(zc.Topics, zt)
	wantCode(t, "zombie commit", e.c.OffsetCommit(zc).Topics[0].Partitions[0].ErrorCode, kerr.FencedInstanceID)
	hb.InstanceID = kmsg.StringPtr("inst-unknown")
	wantCode(t, "unknown instance", e.c.Heartbeat(hb).ErrorCode, kerr.UnknownMemberID)
	if d := e.describe(g); d.State != "Stable" || len(d.Members) != 1 || *d.Members[0].InstanceID != "inst-1" {
		t.Fatalf("describe: %+v", d)
	}
	// Leave by instance id.
	lr := kmsg.NewPtrLeaveGroupRequest()
	lr.Version, lr.Group = 5, g
	lm := kmsg.NewLeaveGroupRequestMember()
	lm.InstanceID = kmsg.StringPtr("inst-1")
	lr.Members = append(lr.Members, lm)
	if resp := e.c.LeaveGroup(lr); resp.Members[0].ErrorCode != 0 {
		t.Fatalf("leave: %+v", resp)
	}
	// The last member gone: Empty at once, so the group can be deleted
	// right away (an admin deleting a group after its consumer closed).
	if d := e.describe(g); d.State != "Empty" {
		t.Fatalf("after static leave: %s", d.State)
	}
	dr := kmsg.NewPtrDeleteGroupsRequest()
	dr.Groups = []string{g}
	wantCode(t, "delete after leave", e.c.DeleteGroups(dr).Groups[0].ErrorCode, nil)
}

// TestStaticLeaderRejoinV9: a static leader that restarts learns it is the
// leader (KIP-814: SkipAssignment) at v9; below v9 it is told the old
// leader id.
func TestStaticLeaderRejoinV9(t *testing.T) {
	e := newEnv(t, Config{})
	for _, v := range []int16{9, 8} {
		g := fmt.Sprint("g", v)
		jr := joinReq(g, "", v, time.Second)
		jr.InstanceID = kmsg.StringPtr("leader")
		r := e.c.JoinGroup(bg, jr, cl)
		old := r.MemberID
		e.c.SyncGroup(bg, syncReq(g, old, 1, map[string]string{old: "a"}))
		r = e.c.JoinGroup(bg, jr, cl)
		switch {
		case r.ErrorCode != 0:
			t.Fatalf("v%d rejoin: %s", v, codeName(r.ErrorCode))
		case v >= 9 && (r.LeaderID != r.MemberID || !r.SkipAssignment || len(r.Members) != 1):
			t.Fatalf("v9 static leader rejoin: leader %s member %s skip %v members %d", r.LeaderID, r.MemberID, r.SkipAssignment, len(r.Members))
		case v < 9 && (r.LeaderID != old || r.SkipAssignment || len(r.Members) != 0):
			t.Fatalf("v%d static leader rejoin: leader %s (old %s) skip %v", v, r.LeaderID, old, r.SkipAssignment)
		}
	}
}

// TestInvalidUTF8GroupIDSurvivesRestart: what is kept in memory is what the
// log stores, so a restart finds the same group.
func TestInvalidUTF8GroupIDSurvivesRestart(t *testing.T) {
	e := newEnv(t, Config{})
	e.commit("caf\xe9", "", -1, "t", 42)
	before := e.fetch("caf\xe9", "t", 1)[0]
	e.reopen()
	if got := e.fetch("caf\xe9", "t", 1)[0]; got != 42 || before != 42 {
		t.Fatalf("offset before %d, after restart %d, want 42", before, got)
	}
}

func TestJoinValidation(t *testing.T) {
	e := newEnv(t, Config{MinSessionTimeout: time.Second, MaxSessionTimeout: time.Minute})
	wantCode(t, "empty group", e.c.JoinGroup(bg, joinReq("", "", 9, time.Second), cl).ErrorCode, kerr.InvalidGroupID)
	wantCode(t, "short session", e.c.JoinGroup(bg, joinReq("g", "", 9, 10*time.Millisecond), cl).ErrorCode, kerr.InvalidSessionTimeout)
	wantCode(t, "long session", e.c.JoinGroup(bg, joinReq("g", "", 9, time.Hour), cl).ErrorCode, kerr.InvalidSessionTimeout)
	wantCode(t, "unknown member", e.c.JoinGroup(bg, joinReq("g", "ghost", 9, time.Second), cl).ErrorCode, kerr.UnknownMemberID)
	// v0-3 join at once, without MEMBER_ID_REQUIRED.
	r := e.c.JoinGroup(bg, joinReq("g", "", 3, time.Second), cl)
	if r.ErrorCode != 0 || r.MemberID == "" {
		t.Fatalf("v3 join: %+v", r)
	}
	// A different protocol type, or no common protocol, is refused.
	other := joinReq("g", "", 3, time.Second, "sticky")
	wantCode(t, "no common protocol", e.c.JoinGroup(bg, other, cl).ErrorCode, kerr.InconsistentGroupProtocol)
	other = joinReq("g", "", 3, time.Second)
	other.ProtocolType = "connect"
	wantCode(t, "protocol type", e.c.JoinGroup(bg, other, cl).ErrorCode, kerr.InconsistentGroupProtocol)
	// Sync and heartbeat on unknown groups.
	wantCode(t, "sync unknown group", e.c.SyncGroup(bg, syncReq("nope", "m", 1, nil)).ErrorCode, kerr.UnknownMemberID)
	wantCode(t, "heartbeat unknown group", e.heartbeat("nope", "m", 1), kerr.UnknownMemberID)
}

// TestOffsetsCommitFetchPersist: commits round-trip with metadata and
// epoch, unknown groups answer -1, simple commits are refused while the
// group has members, and everything survives a reopen.
func TestOffsetsCommitFetchPersist(t *testing.T) {
	e := newEnv(t, Config{PartitionExists: func(topic string, p int32) bool { return topic != "missing" && p < 4 }})
	if got := e.fetch("nobody", "t", 2); got[0] != -1 || got[1] != -1 {
		t.Fatalf("unknown group: %v", got)
	}
	// A simple consumer (generation -1, no member) creates the group.
	for _, c := range e.commit("simple", "", -1, "t", 10, 20, 30) {
		wantCode(t, "simple commit", c, nil)
	}
	if got := e.fetch("simple", "t", 4); fmt.Sprint(got) != "[10 20 30 -1]" {
		t.Fatalf("fetch: %v", got)
	}
	wantCode(t, "unknown topic", e.commit("simple", "", -1, "missing", 1)[0], kerr.UnknownTopicOrPartition)
	if c := e.commit("simple", "", -1, "t", 1, 2, 3, 4, 5); c[4] != kerr.UnknownTopicOrPartition.Code || c[3] != 0 {
		t.Fatalf("partition 4: %v", c)
	}
	// Metadata and epoch round-trip (v5+).
	r := kmsg.NewPtrOffsetFetchRequest()
	r.Version, r.Group = 7, "simple"
	resp := e.c.OffsetFetch(r) // null topics: everything committed
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 4 || *resp.Topics[0].Partitions[1].Metadata != "m2" || resp.Topics[0].Partitions[1].LeaderEpoch != 3 {
		t.Fatalf("fetch all: %+v", resp.Topics)
	}
	// Metadata too large.
	big := kmsg.NewPtrOffsetCommitRequest()
	big.Version, big.Group, big.Generation = 8, "simple", -1
	bt := kmsg.NewOffsetCommitRequestTopic()
	bt.Topic = "t"
	bp := kmsg.NewOffsetCommitRequestTopicPartition()
	bp.Metadata = kmsg.StringPtr(string(make([]byte, 5000)))
	bt.Partitions = append(bt.Partitions, bp)
	big.Topics = append(big.Topics, bt)
	wantCode(t, "big metadata", e.c.OffsetCommit(big).Topics[0].Partitions[0].ErrorCode, kerr.OffsetMetadataTooLarge)

	// A member group: commits need the right generation and member.
	a, aj := e.newMember("cg", time.Minute)
	ra := wait(t, aj)
	wantCode(t, "member commit during CompletingRebalance", e.commit("cg", a, ra.Generation, "t", 5)[0], kerr.RebalanceInProgress)
	e.c.SyncGroup(bg, syncReq("cg", a, ra.Generation, map[string]string{a: ""}))
	wantCode(t, "member commit", e.commit("cg", a, ra.Generation, "t", 5, 6)[0], nil)
	wantCode(t, "wrong generation", e.commit("cg", a, ra.Generation+1, "t", 7)[0], kerr.IllegalGeneration)
	wantCode(t, "unknown member", e.commit("cg", "ghost", ra.Generation, "t", 7)[0], kerr.UnknownMemberID)
	wantCode(t, "simple commit to a live group", e.commit("cg", "", -1, "t", 7)[0], kerr.UnknownMemberID)

	e.reopen()
	if got := e.fetch("simple", "t", 4); fmt.Sprint(got) != "[1 2 3 4]" {
		t.Fatalf("after reopen, simple: %v", got)
	}
	if got := e.fetch("cg", "t", 2); fmt.Sprint(got) != "[5 6]" {
		t.Fatalf("after reopen, cg: %v", got)
	}
	// The member and its generation survived: it heartbeats and commits on.
	if d := e.describe("cg"); d.State != "Stable" || len(d.Members) != 1 || d.Members[0].MemberID != a {
		t.Fatalf("after reopen, describe: %+v", d)
	}
	wantCode(t, "heartbeat after reopen", e.heartbeat("cg", a, ra.Generation), nil)
	wantCode(t, "commit after reopen", e.commit("cg", a, ra.Generation, "t", 8)[0], nil)
}

func TestListDeleteGroupsAndOffsets(t *testing.T) {
	e := newEnv(t, Config{})
	e.commit("simple", "", -1, "t", 1, 2)
	a, aj := e.newMember("cg", time.Minute)
	wait(t, aj)
	// A real consumer subscription so OffsetDelete knows the topics.
	sub := kmsg.NewConsumerMemberMetadata()
	sub.Topics = []string{"t"}
	jr := joinReq("cg", a, 9, time.Minute)
	jr.Protocols[0].Metadata = sub.AppendTo(nil)
	ra := e.c.JoinGroup(bg, jr, cl) // protocol metadata changed: a new generation
	e.c.SyncGroup(bg, syncReq("cg", a, ra.Generation, map[string]string{a: ""}))
	e.commit("cg", a, ra.Generation, "t", 3)
	e.commit("cg", a, ra.Generation, "u", 4)

	lr := kmsg.NewPtrListGroupsRequest()
	lr.Version = 5
	got := map[string]string{}
	for _, g := range e.c.ListGroups(lr).Groups {
		got[g.Group] = g.GroupState + "/" + g.ProtocolType + "/" + g.GroupType
	}
	if got["simple"] != "Empty//classic" || got["cg"] != "Stable/consumer/classic" || len(got) != 2 {
		t.Fatalf("list: %v", got)
	}
	lr.StatesFilter = []string{"stable"}
	if gs := e.c.ListGroups(lr).Groups; len(gs) != 1 || gs[0].Group != "cg" {
		t.Fatalf("list stable: %+v", gs)
	}
	lr.StatesFilter, lr.TypesFilter = nil, []string{"consumer"}
	if gs := e.c.ListGroups(lr).Groups; len(gs) != 0 {
		t.Fatalf("list consumer type: %+v", gs)
	}

	od := kmsg.NewPtrOffsetDeleteRequest()
	od.Group = "cg"
	for _, topic := range []string{"t", "u"} {
		ot := kmsg.NewOffsetDeleteRequestTopic()
		ot.Topic = topic
		op := kmsg.NewOffsetDeleteRequestTopicPartition()
		ot.Partitions = append(ot.Partitions, op)
		od.Topics = append(od.Topics, ot)
	}
	resp := e.c.OffsetDelete(od)
	if resp.ErrorCode != 0 || resp.Topics[0].Partitions[0].ErrorCode != kerr.GroupSubscribedToTopic.Code || resp.Topics[1].Partitions[0].ErrorCode != 0 {
		t.Fatalf("offset delete: %+v", resp)
	}
	if e.fetch("cg", "u", 1)[0] != -1 || e.fetch("cg", "t", 1)[0] != 3 {
		t.Fatal("offset delete removed the wrong offsets")
	}
	od.Group = "ghost"
	wantCode(t, "offset delete unknown group", e.c.OffsetDelete(od).ErrorCode, kerr.GroupIDNotFound)

	dr := kmsg.NewPtrDeleteGroupsRequest()
	dr.Version, dr.Groups = 2, []string{"cg", "simple", "ghost", ""}
	want := []*kerr.Error{kerr.NonEmptyGroup, nil, kerr.GroupIDNotFound, kerr.InvalidGroupID}
	for i, g := range e.c.DeleteGroups(dr).Groups {
		wantCode(t, "delete "+g.Group, g.ErrorCode, want[i])
	}
	if e.fetch("simple", "t", 1)[0] != -1 || e.describe("simple").State != "Dead" {
		t.Fatal("deleted group still has offsets")
	}
	e.reopen()
	if e.fetch("simple", "t", 1)[0] != -1 || e.fetch("cg", "t", 1)[0] != 3 {
		t.Fatal("deletion did not persist")
	}
	e.c.TopicDeleted("t")
	if e.fetch("cg", "t", 1)[0] != -1 {
		t.Fatal("offsets of a deleted topic remain")
	}
}

// TestOffsetsRetention: an empty group's offsets go after the retention
// period; the group goes with them.
func TestOffsetsRetention(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	e := newEnv(t, Config{Now: clock, OffsetsRetention: time.Hour})
	e.commit("simple", "", -1, "t", 1)
	e.c.Maintain(clock())
	if e.fetch("simple", "t", 1)[0] != 1 {
		t.Fatal("expired too early")
	}
	mu.Lock()
	now = now.Add(61 * time.Minute)
	mu.Unlock()
	e.c.Maintain(clock())
	if e.fetch("simple", "t", 1)[0] != -1 || e.describe("simple").State != "Dead" {
		t.Fatal("offsets did not expire")
	}
	e.reopen()
	if e.fetch("simple", "t", 1)[0] != -1 {
		t.Fatal("expiry did not persist")
	}

	// An explicit retention (OffsetCommit v2-4) does not expire the offsets
	// of a topic a live consumer group subscribes to.
	a, aj := e.newMember("live", 10*time.Minute)
	wait(t, aj)
	sub := kmsg.NewConsumerMemberMetadata()
	sub.Topics = []string{"t"}
	jr := joinReq("live", a, 9, 10*time.Minute)
	jr.Protocols[0].Metadata = sub.AppendTo(nil)
	ra := e.c.JoinGroup(bg, jr, cl)
	e.c.SyncGroup(bg, syncReq("live", a, ra.Generation, map[string]string{a: ""}))
	cr := kmsg.NewPtrOffsetCommitRequest()
	cr.Version, cr.Group, cr.MemberID, cr.Generation, cr.RetentionTimeMillis = 4, "live", a, ra.Generation, 1000
	for _, topic := range []string{"t", "u"} {
		ct := kmsg.NewOffsetCommitRequestTopic()
		ct.Topic, ct.Partitions = topic, []kmsg.OffsetCommitRequestTopicPartition{kmsg.NewOffsetCommitRequestTopicPartition()}
		ct.Partitions[0].Offset = 9
		cr.Topics = append(cr.Topics, ct)
	}
	e.c.OffsetCommit(cr)
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	e.c.Maintain(clock())
	if e.fetch("live", "t", 1)[0] != 9 || e.fetch("live", "u", 1)[0] != -1 {
		t.Fatalf("explicit retention: t %d (subscribed, kept), u %d (not subscribed, expired)", e.fetch("live", "t", 1)[0], e.fetch("live", "u", 1)[0])
	}
}

// TestCompactionAndSnapshotSeed: the group log is compacted to its live
// state, and a snapshot restores an empty log.
func TestCompactionAndSnapshotSeed(t *testing.T) {
	e := newEnv(t, Config{})
	for i := 0; i < 3000; i++ {
		e.commit(fmt.Sprintf("g%d", i%5), "", -1, "t", int64(i), int64(i+1))
	}
	before := e.lp.LocalBytes()
	if err := e.c.compact(); err != nil {
		t.Fatal(err)
	}
	if after := e.lp.LocalBytes(); after*10 > before || e.lp.LogStartOffset() == 0 {
		t.Fatalf("compaction: %d -> %d bytes, log start %d", before, after, e.lp.LogStartOffset())
	}
	check := func(what string) {
		t.Helper()
		for g := 0; g < 5; g++ {
			last := int64(3000 - 5 + g)
			if got := e.fetch(fmt.Sprintf("g%d", g), "t", 2); got[0] != last || got[1] != last+1 {
				t.Fatalf("%s: g%d: %v, want [%d %d]", what, g, got, last, last+1)
			}
		}
	}
	check("compacted")
	e.reopen()
	check("compacted and reopened")

	snap, _ := e.c.Snapshot()
	e.close()
	e.dir = t.TempDir()
	e.open(snap)
	check("restored from a snapshot")
	e.reopen()
	check("restored and reopened")
}

// TestCompactionCrashPartWay: a crash after the cut and part of the
// snapshot (some groups re-written, the log start not yet moved) replays to
// the same state, and so does one right after the log start moved.
func TestCompactionCrashPartWay(t *testing.T) {
	e := newEnv(t, Config{})
	for i := 0; i < 50; i++ {
		e.commit(fmt.Sprintf("g%d", i%5), "", -1, "t", int64(i), int64(i+1))
	}
	e.commit("gone", "", -1, "t", 7)
	check := func(what string) {
		t.Helper()
		for g := 0; g < 5; g++ {
			last := int64(45 + g)
			if got := e.fetch(fmt.Sprintf("g%d", g), "t", 2); got[0] != last || got[1] != last+1 {
				t.Fatalf("%s: g%d: %v, want [%d %d]", what, g, got, last, last+1)
			}
		}
		if got := e.fetch("gone", "t", 1)[0]; got != -1 {
			t.Fatalf("%s: deleted group has offset %d", what, got)
		}
	}
	// Part way: the cut, two groups' snapshots, a deletion after the cut;
	// then the "crash" (no log start move).
	if err := e.lp.Roll(); err != nil {
		t.Fatal(err)
	}
	for _, g := range e.c.all()[:2] {
		g.mu.Lock()
		if err := e.c.append(g.recordsLocked()); err != nil {
			t.Fatal(err)
		}
		g.mu.Unlock()
	}
	dr := kmsg.NewPtrDeleteGroupsRequest()
	dr.Groups = []string{"gone"}
	if code := e.c.DeleteGroups(dr).Groups[0].ErrorCode; code != 0 {
		t.Fatalf("delete: %s", codeName(code))
	}
	check("before the crash")
	e.reopen()
	check("after a crash part way through compaction")
	if err := e.c.compact(); err != nil {
		t.Fatal(err)
	}
	e.reopen()
	check("after a full compaction")
}

// failingFS fails every file Sync while fail is set.
type failingFS struct {
	log.FS
	fail *atomic.Bool
}

type failingFile struct {
	log.File
	fail *atomic.Bool
}

func (f failingFS) OpenFile(name string, flag int, perm os.FileMode) (log.File, error) {
	lf, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return failingFile{lf, f.fail}, nil
}

func (f failingFile) Sync() error {
	if f.fail.Load() {
		return syscall.EIO
	}
	return f.File.Sync()
}

// TestCommitFsyncFailure: a commit whose fsync fails is answered with an
// error and not applied; what was acknowledged before survives a restart.
func TestCommitFsyncFailure(t *testing.T) {
	dir := t.TempDir()
	var fail atomic.Bool
	open := func(fs log.FS) (*log.Store, *log.Partition, *Coordinator) {
		store := log.OpenStore(log.Options{FS: fs})
		lp, err := store.OpenPartition(filepath.Join(dir, "__groups"), LogConfig())
		if err != nil {
			t.Fatal(err)
		}
		c, err := Open(Config{Logger: zaptest.NewLogger(t)}, lp, nil)
		if err != nil {
			t.Fatal(err)
		}
		return store, lp, c
	}
	store, lp, c := open(failingFS{log.OSFS, &fail})
	e := &env{t: t, c: c}
	wantCode(t, "healthy commit", e.commit("g", "", -1, "t", 10)[0], nil)
	fail.Store(true)
	wantCode(t, "commit with a failing fsync", e.commit("g", "", -1, "t", 20)[0], kerr.CoordinatorNotAvailable)
	if got := e.fetch("g", "t", 1)[0]; got != 10 {
		t.Fatalf("after the failed commit the offset is %d, want the acknowledged 10", got)
	}
	c.Close()
	lp.Close()
	store.Close()
	_, _, c2 := open(log.OSFS)
	defer c2.Close()
	e.c = c2
	if got := e.fetch("g", "t", 1)[0]; got != 10 && got != 20 {
		t.Fatalf("after a restart the offset is %d, want 10 (or the unacknowledged 20)", got)
	}
}

// TestSeedWithAMemberTwice: a group record (from a bucket seed) naming a
// member id twice, or a static instance id twice, loads with the repeat
// left out; the member's session then ends cleanly (the repeat used to
// stay in the join order and crash the session timer's rebalance).
func TestSeedWithAMemberTwice(t *testing.T) {
	member := func(id, iid string) string {
		m := `{"id":"` + id + `","cid":"c","h":"h","st":20,"rt":20,"md":null,"a":null`
		if iid != "" {
			m += `,"iid":"` + iid + `"`
		}
		return m + "}"
	}
	for name, members := range map[string]string{
		"id":       member("a", "") + "," + member("a", ""),
		"instance": member("a", "i") + "," + member("b", "i"),
	} {
		t.Run(name, func(t *testing.T) {
			e := &env{t: t, dir: t.TempDir()}
			t.Cleanup(e.close)
			e.open([]byte(`{"version":1,"records":[{"key":{"k":"g","g":"grp"},"value":{"pt":"consumer","p":"range","gen":3,"l":"a","s":0,"m":[` + members + `]}}]}`))
			g := e.c.all()[0]
			g.mu.Lock()
			n, order := len(g.members), len(g.order)
			g.mu.Unlock()
			if n != 1 || order != 1 {
				t.Fatalf("%d members, %d in the join order; want 1 and 1", n, order)
			}
			deadline := time.Now().Add(5 * time.Second)
			for { // the session (20 ms) ends: the group empties
				g.mu.Lock()
				n = len(g.members)
				g.mu.Unlock()
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the member's session never ended")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestOffsetsOfGonePartitionsDropAtLoad: offsets of a topic that no longer
// exists when the group log loads (deleted just before a crash, or after
// the bucket's copy was taken) are dropped for good: a topic created again
// with the same name starts without them.
func TestOffsetsOfGonePartitionsDropAtLoad(t *testing.T) {
	var gone atomic.Bool
	e := newEnv(t, Config{PartitionExists: func(topic string, p int32) bool { return !(gone.Load() && topic == "t") }})
	e.commit("g", "", -1, "t", 5, 6)
	e.commit("g", "", -1, "u", 7)
	gone.Store(true)
	e.reopen()
	gone.Store(false) // created again
	if got := e.fetch("g", "t", 2); got[0] != -1 || got[1] != -1 {
		t.Fatalf("offsets of a topic gone at load: %v", got)
	}
	e.reopen()
	if got := e.fetch("g", "t", 2); got[0] != -1 || got[1] != -1 {
		t.Fatalf("offsets of a topic gone at the last load came back: %v", got)
	}
	if got := e.fetch("g", "u", 1); got[0] != 7 {
		t.Fatalf("another topic's offset: %v", got)
	}
}

// TestSeedIsCheckedBeforeWriting: a seed with a record of an unknown kind
// or an offset without a topic is refused before anything is written; a
// null value is a tombstone (not an offset of 0); offsets of the empty
// group id (Kafka accepts commits to it) restore.
func TestSeedIsCheckedBeforeWriting(t *testing.T) {
	for _, bad := range []string{
		`{"version":1,"records":[{"key":{"k":"x","g":"g"},"value":{}}]}`,
		`{"version":1,"records":[{"key":{"k":"o","g":"g","t":""},"value":{}}]}`,
		`{"version":1,"records":[{"key":{"k":"o","g":"g","t":"t","p":-1},"value":{}}]}`,
	} {
		if _, err := parseSnapshot([]byte(bad)); err == nil {
			t.Errorf("parsed %s", bad)
		}
	}
	e := &env{t: t, dir: t.TempDir()}
	t.Cleanup(e.close)
	e.open([]byte(`{"version":1,"records":[{"key":{"k":"o","g":"g","t":"t","p":0},"value":null}]}`))
	if got := e.fetch("g", "t", 1); got[0] != -1 {
		t.Fatalf("a null offset value loads as offset %d", got[0])
	}
	e.commit("", "", -1, "t", 42)
	snap, _ := e.c.Snapshot()
	e.close()
	e.dir = t.TempDir()
	e.open(snap)
	if got := e.fetch("", "t", 1); got[0] != 42 {
		t.Fatalf("the empty group's offset after a restore: %d", got[0])
	}
}

// TestThrowawayGroupsCostNoWrites: groups only ever asked for a member id
// (JoinGroup v4+ with none) are removed once their pending ids expire
// without writing to the group log (each deletion was a synced append).
func TestThrowawayGroupsCostNoWrites(t *testing.T) {
	e := newEnv(t, Config{})
	before := e.lp.LogEndOffset()
	for i := 0; i < 50; i++ {
		r := e.c.JoinGroup(bg, joinReq(fmt.Sprintf("throwaway-%d", i), "", 9, 10*time.Millisecond), cl)
		if r.ErrorCode != kerr.MemberIDRequired.Code {
			t.Fatalf("join: error %d", r.ErrorCode)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(e.c.all()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d throwaway groups left", len(e.c.all()))
		}
		time.Sleep(20 * time.Millisecond)
		e.c.Maintain(time.Now())
	}
	if after := e.lp.LogEndOffset(); after != before {
		t.Fatalf("removing throwaway groups wrote %d records to the group log", after-before)
	}
	// A group that was written keeps its deletion record.
	e.commit("kept", "", -1, "t", 5)
	e.c.Maintain(time.Now().Add(30 * 24 * time.Hour))
	if got := e.fetch("kept", "t", 1)[0]; got != -1 {
		t.Fatalf("expired offset %d", got)
	}
	e.reopen()
	if got := e.fetch("kept", "t", 1)[0]; got != -1 {
		t.Fatalf("expired offset %d back after a reopen", got)
	}
}

// TestEmptyInstanceIDIsNone: a group.instance.id of "" is no instance id
// in SyncGroup, Heartbeat and LeaveGroup as in JoinGroup (a member that
// joined with one was answered UNKNOWN_MEMBER_ID by the others for ever).
func TestEmptyInstanceIDIsNone(t *testing.T) {
	e := newEnv(t, Config{})
	id, ch := e.newMember("g", time.Second)
	jr := wait(t, ch)
	if jr.ErrorCode != 0 {
		t.Fatalf("join: error %d", jr.ErrorCode)
	}
	empty := ""
	sr := syncReq("g", id, jr.Generation, map[string]string{id: "a"})
	sr.InstanceID = &empty
	if r := e.c.SyncGroup(bg, sr); r.ErrorCode != 0 {
		t.Fatalf("SyncGroup with an empty instance id: error %d", r.ErrorCode)
	}
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Version, hb.Group, hb.MemberID, hb.Generation, hb.InstanceID = 4, "g", id, jr.Generation, &empty
	if r := e.c.Heartbeat(hb); r.ErrorCode != 0 {
		t.Fatalf("Heartbeat with an empty instance id: error %d", r.ErrorCode)
	}
	lr := kmsg.NewPtrLeaveGroupRequest()
	lr.Version, lr.Group = 5, "g"
	lm := kmsg.NewLeaveGroupRequestMember()
	lm.MemberID, lm.InstanceID = id, &empty
	lr.Members = append(lr.Members, lm)
	if r := e.c.LeaveGroup(lr); r.ErrorCode != 0 || r.Members[0].ErrorCode != 0 {
		t.Fatalf("LeaveGroup with an empty instance id: %d / %d", r.ErrorCode, r.Members[0].ErrorCode)
	}
}
