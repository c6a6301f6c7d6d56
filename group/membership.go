package group

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Client identifies the connection a request came on (DescribeGroups shows
// it).
type Client struct {
	ID   string // the request header's client id
	Host string // "/" + remote IP, as Kafka shows it
}

func ms(v int32) time.Duration { return time.Duration(v) * time.Millisecond }

// clean makes s valid UTF-8 the way Kafka's decoding of a protocol string
// does (bad bytes become U+FFFD), so what is kept in memory is what the
// group log stores and a restart loads.
func clean(s *string) {
	if s != nil && !utf8.ValidString(*s) {
		*s = strings.ToValidUTF8(*s, "\uFFFD")
	}
}

// JoinGroup: v0-9
//
// Behavior:
//   - A member without an id gets MEMBER_ID_REQUIRED and a new id at v4+
//     (it must join again with it); below v4 it joins at once.
//   - The join is parked until every known member has rejoined (or the
//     rebalance timeout passes, removing dynamic members that did not); the
//     first rebalance of an empty group waits the initial rebalance delay
//     for more members.
//   - The protocol is the one every member supports that most prefer; the
//     leader (the previous leader if it rejoined, else the first member)
//     gets every member's metadata.
//   - A static member (group.instance.id) rejoining without its id takes
//     over its old id's place: without a rebalance if the group is Stable
//     and its protocols are unchanged; the old id is fenced
//     (FENCED_INSTANCE_ID).
//
// Version notes:
//   - v0: the rebalance timeout is the session timeout.
//   - v5: instance ids. v7: protocol type and name in the response.
func (c *Coordinator) JoinGroup(ctx context.Context, req *kmsg.JoinGroupRequest, cl Client) *kmsg.JoinGroupResponse {
	resp := req.ResponseKind().(*kmsg.JoinGroupResponse)
	r := c.join(ctx, req, cl)
	resp.ErrorCode, resp.Generation, resp.MemberID, resp.LeaderID, resp.Members = r.err, r.generation, r.memberID, r.leader, r.members
	resp.SkipAssignment = r.skip
	if r.err == 0 {
		resp.ProtocolType, resp.Protocol = &r.protocolType, &r.protocol
	} else {
		resp.Generation = -1
	}
	if resp.Members == nil {
		resp.Members = []kmsg.JoinGroupResponseMember{}
	}
	return resp
}

func (c *Coordinator) join(ctx context.Context, req *kmsg.JoinGroupRequest, cl Client) joinReply {
	for _, s := range []*string{&req.Group, &req.MemberID, req.InstanceID, &req.ProtocolType, &cl.ID, &cl.Host} {
		clean(s)
	}
	for i := range req.Protocols {
		clean(&req.Protocols[i].Name)
	}
	fail := func(e *kerr.Error) joinReply { return joinReply{err: e.Code, memberID: req.MemberID, generation: -1} }
	if req.Group == "" {
		return fail(kerr.InvalidGroupID)
	}
	session, rebalance := ms(req.SessionTimeoutMillis), ms(req.RebalanceTimeoutMillis)
	if req.Version == 0 {
		rebalance = session
	}
	if session < c.cfg.MinSessionTimeout || session > c.cfg.MaxSessionTimeout {
		return fail(kerr.InvalidSessionTimeout)
	}
	if req.ProtocolType == "" || len(req.Protocols) == 0 {
		return fail(kerr.InconsistentGroupProtocol)
	}
	var iid *string
	if req.Version >= 5 {
		if id := instanceID(req.InstanceID); id != nil {
			s := *id
			iid = &s
		}
	}
	protos := make([]protocol, len(req.Protocols))
	for i, p := range req.Protocols {
		protos[i] = protocol{name: p.Name, metadata: append([]byte(nil), p.Metadata...)}
	}
	g := c.lockGroup(req.Group, req.MemberID == "")
	if g == nil {
		if c.ctx.Err() != nil {
			return fail(kerr.NotCoordinator)
		}
		return fail(kerr.UnknownMemberID)
	}
	now := c.cfg.Now()
	newMember := func(id string) *member {
		return &member{id: id, instanceID: iid, clientID: cl.ID, clientHost: cl.Host, sessionTimeout: session,
			rebalanceTimeout: rebalance, protocolType: req.ProtocolType, protocols: protos}
	}
	update := func(m *member) {
		m.protocols, m.sessionTimeout, m.rebalanceTimeout, m.clientID, m.clientHost = protos, session, rebalance, cl.ID, cl.Host
	}
	park := func(m *member, reason string) chan joinReply {
		if m.joinCh != nil { // a retried join replaces the parked one
			m.reply(joinReply{err: kerr.RebalanceInProgress.Code, memberID: m.id, generation: -1})
		}
		ch := make(chan joinReply, 1)
		m.joinCh = ch
		m.lastSeen = now
		g.memberJoinedLocked(m, reason)
		return ch
	}
	var ch chan joinReply
	switch {
	case !g.supportsLocked(req.ProtocolType, protos):
		g.mu.Unlock()
		return fail(kerr.InconsistentGroupProtocol)
	case req.MemberID == "" && iid != nil && g.members[g.static[*iid]] != nil:
		old := g.members[g.static[*iid]]
		r, parked := g.replaceStaticLocked(old, newMember(newMemberID(cl.ID)), now, req.Version)
		if parked == nil {
			g.mu.Unlock()
			return r
		}
		ch = parked
	case req.MemberID == "" && iid == nil && req.Version >= 4:
		id := newMemberID(cl.ID)
		g.pending[id] = time.AfterFunc(session, func() { g.expirePending(id) })
		g.mu.Unlock()
		return joinReply{err: kerr.MemberIDRequired.Code, memberID: id, generation: -1}
	case req.MemberID == "":
		m := newMember(newMemberID(cl.ID))
		g.addMember(m, now)
		ch = park(m, "new member "+m.id+" joined")
	case g.pending[req.MemberID] != nil:
		g.pending[req.MemberID].Stop()
		delete(g.pending, req.MemberID)
		m := newMember(req.MemberID)
		g.addMember(m, now)
		ch = park(m, "new member "+m.id+" joined")
	default:
		if e := g.validateMemberLocked(req.MemberID, iid); e != nil {
			g.mu.Unlock()
			return fail(e)
		}
		m := g.members[req.MemberID]
		unchanged := sameProtocols(m.protocols, protos)
		switch {
		case g.state == stateCompletingRebalance && unchanged,
			g.state == stateStable && unchanged && m.id != g.leader:
			// A repeated join: answer with the current generation.
			m.lastSeen = now
			r := g.joinReplyLocked(m.id)
			if m.id == g.leader {
				r.members = g.memberListLocked()
			}
			g.mu.Unlock()
			return r
		default:
			update(m)
			ch = park(m, "member "+m.id+" rejoined")
		}
	}
	g.mu.Unlock()
	select {
	case r := <-ch:
		return r
	case <-ctx.Done():
		return fail(kerr.CoordinatorNotAvailable)
	case <-c.ctx.Done():
		return fail(kerr.NotCoordinator)
	}
}

// replaceStaticLocked gives a rejoining static member a new id in place of
// old. It returns either an immediate reply or a channel for a parked join.
func (g *group) replaceStaticLocked(old, m *member, now time.Time, version int16) (joinReply, chan joinReply) {
	oldLeader := g.leader
	old.reply(joinReply{err: kerr.FencedInstanceID.Code, memberID: old.id, generation: -1})
	old.replySync(syncReply{err: kerr.FencedInstanceID.Code})
	m.assignment = old.assignment
	protocolBefore := g.protocol
	// Swap in place: keep old's position in the join order.
	old.timer.Stop()
	delete(g.members, old.id)
	for i, id := range g.order {
		if id == old.id {
			g.order[i] = m.id
		}
	}
	g.members[m.id] = m
	g.static[*m.instanceID] = m.id
	m.lastSeen = now
	m.timer = time.AfterFunc(m.sessionTimeout, func() { g.checkSession(m) })
	if g.leader == old.id {
		g.leader = m.id
	}
	g.logger().Info("static member rejoined with a new id", zap.String("instance", *m.instanceID), zap.String("old", old.id), zap.String("new", m.id))
	if g.state == stateStable && g.selectProtocolLocked() == protocolBefore {
		if err := g.persistLocked(); err != nil {
			return joinReply{err: kerr.CoordinatorNotAvailable.Code, memberID: m.id, generation: -1}, nil
		}
		r := g.joinReplyLocked(m.id)
		if version >= 9 {
			// KIP-814: the leader learns it is the leader (it watches
			// metadata for the group) but skips the assignment.
			if m.id == g.leader {
				r.skip, r.members = true, g.memberListLocked()
			}
		} else {
			// Below v9, the old leader id, so a rejoining leader does not
			// reassign in a Stable group (its assignment would not be
			// delivered).
			r.leader = oldLeader
		}
		return r, nil
	}
	ch := make(chan joinReply, 1)
	m.joinCh = ch
	g.memberJoinedLocked(m, "static member "+*m.instanceID+" rejoined")
	return joinReply{}, ch
}

func (g *group) memberListLocked() []kmsg.JoinGroupResponseMember {
	var all []kmsg.JoinGroupResponseMember
	for _, id := range g.order {
		m := g.members[id]
		jm := kmsg.NewJoinGroupResponseMember()
		jm.MemberID, jm.InstanceID, jm.ProtocolMetadata = m.id, m.instanceID, m.metadataFor(g.protocol)
		all = append(all, jm)
	}
	return all
}

func (g *group) expirePending(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.pending[id]; !ok || g.c.ctx.Err() != nil {
		return
	}
	delete(g.pending, id)
	g.maybeCompleteJoinLocked()
}

// SyncGroup: v0-5
//
// Behavior:
//   - In CompletingRebalance, the leader's assignments are stored (members
//     it left out get an empty one), the group metadata is written durably,
//     the group becomes Stable and every parked SyncGroup is answered. Other
//     members' syncs wait for the leader's.
//   - In Stable, a member gets its current assignment; in
//     PreparingRebalance, REBALANCE_IN_PROGRESS.
//   - The assignment is always present in the response, empty if none.
func (c *Coordinator) SyncGroup(ctx context.Context, req *kmsg.SyncGroupRequest) *kmsg.SyncGroupResponse {
	resp := req.ResponseKind().(*kmsg.SyncGroupResponse)
	resp.MemberAssignment = []byte{}
	r, pt, p := c.sync(ctx, req)
	resp.ErrorCode = r.err
	if r.err == 0 {
		resp.ProtocolType, resp.Protocol = &pt, &p
		if r.assignment != nil {
			resp.MemberAssignment = r.assignment
		}
	}
	return resp
}

func (c *Coordinator) sync(ctx context.Context, req *kmsg.SyncGroupRequest) (syncReply, string, string) {
	for _, s := range []*string{&req.Group, &req.MemberID, req.InstanceID, req.ProtocolType, req.Protocol} {
		clean(s)
	}
	for i := range req.GroupAssignment {
		clean(&req.GroupAssignment[i].MemberID)
	}
	fail := func(e *kerr.Error) (syncReply, string, string) { return syncReply{err: e.Code}, "", "" }
	if req.Group == "" {
		return fail(kerr.InvalidGroupID)
	}
	g := c.lockGroup(req.Group, false)
	if g == nil {
		if c.ctx.Err() != nil {
			return fail(kerr.NotCoordinator)
		}
		return fail(kerr.UnknownMemberID)
	}
	var iid *string
	if req.Version >= 3 {
		iid = instanceID(req.InstanceID)
	}
	m := g.members[req.MemberID]
	e := g.validateMemberLocked(req.MemberID, iid)
	switch {
	case e != nil:
	case req.Generation != g.generation:
		e = kerr.IllegalGeneration
	case req.ProtocolType != nil && *req.ProtocolType != g.protocolType,
		req.Protocol != nil && *req.Protocol != g.protocol:
		e = kerr.InconsistentGroupProtocol
	case g.state == stateEmpty:
		e = kerr.UnknownMemberID
	case g.state == statePreparingRebalance:
		e = kerr.RebalanceInProgress
	}
	if e != nil {
		g.mu.Unlock()
		return fail(e)
	}
	pt, p := g.protocolType, g.protocol
	m.lastSeen = c.cfg.Now()
	m.syncedGen = g.generation
	if g.state == stateStable {
		a := m.assignment
		g.mu.Unlock()
		return syncReply{assignment: a}, pt, p
	}
	// CompletingRebalance.
	if m.syncCh != nil {
		m.replySync(syncReply{err: kerr.RebalanceInProgress.Code})
	}
	ch := make(chan syncReply, 1)
	m.syncCh = ch
	if m.id == g.leader {
		assigned := map[string][]byte{}
		for _, a := range req.GroupAssignment {
			assigned[a.MemberID] = append([]byte(nil), a.MemberAssignment...)
		}
		for _, mm := range g.members {
			mm.assignment = assigned[mm.id]
			if mm.assignment == nil {
				mm.assignment = []byte{}
			}
		}
		if err := g.persistLocked(); err != nil {
			for _, mm := range g.members {
				mm.assignment = nil
				mm.replySync(syncReply{err: kerr.CoordinatorNotAvailable.Code})
			}
			g.prepareRebalanceLocked("group metadata could not be written")
		} else {
			g.setStateLocked(stateStable) // the sync timer runs on: followers must still sync
			for _, mm := range g.members {
				mm.replySync(syncReply{assignment: mm.assignment})
			}
			g.logger().Info("rebalance complete: group is stable", zap.Int32("generation", g.generation), zap.Int("members", len(g.members)))
		}
	}
	g.mu.Unlock()
	select {
	case r := <-ch:
		if r.err != 0 {
			return r, "", ""
		}
		return r, pt, p
	case <-ctx.Done():
		return fail(kerr.CoordinatorNotAvailable)
	case <-c.ctx.Done():
		return fail(kerr.NotCoordinator)
	}
}

// Heartbeat: v0-4
//
// Behavior:
//   - Keeps the member's session alive. REBALANCE_IN_PROGRESS while the
//     group is preparing a rebalance tells the member to rejoin.
//   - UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION and FENCED_INSTANCE_ID as Kafka.
func (c *Coordinator) Heartbeat(req *kmsg.HeartbeatRequest) *kmsg.HeartbeatResponse {
	resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
	resp.ErrorCode = c.heartbeat(req).Code
	return resp
}

var errNone = &kerr.Error{Message: "NONE", Code: 0}

func (c *Coordinator) heartbeat(req *kmsg.HeartbeatRequest) *kerr.Error {
	for _, s := range []*string{&req.Group, &req.MemberID, req.InstanceID} {
		clean(s)
	}
	if req.Group == "" {
		return kerr.InvalidGroupID
	}
	g := c.lockGroup(req.Group, false)
	if g == nil {
		if c.ctx.Err() != nil {
			return kerr.NotCoordinator
		}
		return kerr.UnknownMemberID
	}
	defer g.mu.Unlock()
	var iid *string
	if req.Version >= 3 {
		iid = instanceID(req.InstanceID)
	}
	if e := g.validateMemberLocked(req.MemberID, iid); e != nil {
		return e
	}
	if req.Generation != g.generation {
		return kerr.IllegalGeneration
	}
	m := g.members[req.MemberID]
	m.lastSeen = c.cfg.Now()
	if g.state == statePreparingRebalance {
		return kerr.RebalanceInProgress
	}
	return errNone
}

// LeaveGroup: v0-5
//
// Behavior:
//   - Removes each member (by member id, or by instance id for a static
//     member) and rebalances the rest.
//   - Per-member errors at v3+ (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID); below
//     v3, the one member's error is the response's.
func (c *Coordinator) LeaveGroup(req *kmsg.LeaveGroupRequest) *kmsg.LeaveGroupResponse {
	resp := req.ResponseKind().(*kmsg.LeaveGroupResponse)
	clean(&req.Group)
	clean(&req.MemberID)
	for i := range req.Members {
		clean(&req.Members[i].MemberID)
		clean(req.Members[i].InstanceID)
	}
	leaving := req.Members
	if req.Version < 3 {
		lm := kmsg.NewLeaveGroupRequestMember()
		lm.MemberID = req.MemberID
		leaving = []kmsg.LeaveGroupRequestMember{lm}
	}
	codes := make([]int16, len(leaving))
	if req.Group == "" {
		resp.ErrorCode = kerr.InvalidGroupID.Code
		return resp
	}
	g := c.lockGroup(req.Group, false)
	if g == nil {
		if c.ctx.Err() != nil {
			resp.ErrorCode = kerr.NotCoordinator.Code
			return resp
		}
		for i := range codes {
			codes[i] = kerr.UnknownMemberID.Code
		}
	} else {
		for i, lm := range leaving {
			id, liid := lm.MemberID, instanceID(lm.InstanceID)
			if id == "" && liid != nil {
				id = g.static[*liid]
			}
			if t := g.pending[id]; t != nil && liid == nil {
				t.Stop()
				delete(g.pending, id)
				g.maybeCompleteJoinLocked()
				continue
			}
			e := g.validateMemberLocked(id, liid)
			m := g.members[id]
			switch {
			case e != nil:
				codes[i] = e.Code
			default:
				reason := "member " + id + " left"
				if lm.Reason != nil {
					reason += ": " + *lm.Reason
				}
				g.removeMemberLocked(m, reason)
			}
		}
		g.mu.Unlock()
	}
	if req.Version < 3 {
		resp.ErrorCode = codes[0]
		return resp
	}
	for i, lm := range leaving {
		rm := kmsg.NewLeaveGroupResponseMember()
		rm.MemberID, rm.InstanceID, rm.ErrorCode = lm.MemberID, lm.InstanceID, codes[i]
		resp.Members = append(resp.Members, rm)
	}
	return resp
}

// instanceID is a request's group.instance.id: an empty one is none (a
// dynamic member), in every request alike, as JoinGroup takes it.
func instanceID(id *string) *string {
	if id == nil || *id == "" {
		return nil
	}
	return id
}
