package group

import (
	"bytes"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// state is a group's state, as Kafka names them (DescribeGroups and
// ListGroups show the names).
type state int

const (
	stateEmpty state = iota
	statePreparingRebalance
	stateCompletingRebalance
	stateStable
	stateDead
)

var stateNames = [...]string{"Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"}

func (s state) String() string { return stateNames[s] }

type tp struct {
	topic     string
	partition int32
}

type protocol struct {
	name     string
	metadata []byte
}

// joinReply is what a parked JoinGroup is answered with.
type joinReply struct {
	err          int16
	generation   int32
	protocolType string
	protocol     string
	leader       string
	memberID     string
	members      []kmsg.JoinGroupResponseMember // the leader's only
	skip         bool                           // v9 SkipAssignment
}

// syncReply is what a parked SyncGroup is answered with.
type syncReply struct {
	err        int16
	assignment []byte
}

type member struct {
	id               string
	instanceID       *string // static membership (group.instance.id)
	clientID         string
	clientHost       string
	sessionTimeout   time.Duration
	rebalanceTimeout time.Duration
	protocolType     string
	protocols        []protocol // in the member's order of preference
	assignment       []byte

	joinCh    chan joinReply // non-nil while a JoinGroup is parked
	syncCh    chan syncReply // non-nil while a SyncGroup is parked
	syncedGen int32          // the generation this member last sent SyncGroup for
	lastSeen  time.Time      // last heartbeat, join or sync
	timer     *time.Timer    // session expiry check
}

func (m *member) metadataFor(name string) []byte {
	for _, p := range m.protocols {
		if p.name == name {
			return p.metadata
		}
	}
	return nil
}

func (m *member) reply(r joinReply) {
	if m.joinCh != nil {
		m.joinCh <- r
		m.joinCh = nil
	}
}

func (m *member) replySync(r syncReply) {
	if m.syncCh != nil {
		m.syncCh <- r
		m.syncCh = nil
	}
}

// group is one group. Every field is guarded by mu.
type group struct {
	c  *Coordinator
	id string

	mu           sync.Mutex
	state        state
	stateSince   time.Time
	protocolType string
	protocol     string
	generation   int32
	leader       string
	members      map[string]*member
	order        []string               // member ids in join order
	pending      map[string]*time.Timer // ids handed out with MEMBER_ID_REQUIRED
	static       map[string]string      // instance id -> member id
	offsets      map[tp]offsetValue
	persisted    *groupValue // the group record last written

	joinSeq      uint64      // invalidates stale join timers
	joinTimer    *time.Timer // rebalance deadline / initial delay
	joinDeadline time.Time
	initialUntil time.Time // in the initial delay: no completion before this
	syncTimer    *time.Timer
}

func newGroup(c *Coordinator, id string, now time.Time) *group {
	return &group{
		c: c, id: id, state: stateEmpty, stateSince: now,
		members: map[string]*member{}, pending: map[string]*time.Timer{},
		static: map[string]string{}, offsets: map[tp]offsetValue{},
	}
}

func (g *group) logger() *zap.Logger { return g.c.cfg.Logger.With(zap.String("group", g.id)) }

func (g *group) setStateLocked(s state) {
	g.state = s
	g.stateSince = g.c.cfg.Now()
}

// addMember adds m and starts its session clock.
func (g *group) addMember(m *member, now time.Time) {
	if len(g.members) == 0 {
		g.protocolType = m.protocolType
	}
	g.members[m.id] = m
	g.order = append(g.order, m.id)
	if m.instanceID != nil {
		g.static[*m.instanceID] = m.id
	}
	m.lastSeen = now
	m.timer = time.AfterFunc(m.sessionTimeout, func() { g.checkSession(m) })
}

// checkSession runs when m's session may have expired.
func (g *group) checkSession(m *member) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.members[m.id] != m || g.state == stateDead || g.c.ctx.Err() != nil {
		return
	}
	if m.joinCh != nil || m.syncCh != nil {
		m.timer.Reset(m.sessionTimeout) // a parked request keeps the member alive
		return
	}
	if left := m.lastSeen.Add(m.sessionTimeout).Sub(g.c.cfg.Now()); left > 0 {
		m.timer.Reset(left)
		return
	}
	g.logger().Info("member session expired", zap.String("member", m.id), zap.Duration("session_timeout", m.sessionTimeout))
	g.removeMemberLocked(m, "session timeout of "+m.id)
}

// dropMemberLocked removes m without any state transition.
func (g *group) dropMemberLocked(m *member) {
	delete(g.members, m.id)
	for i, id := range g.order {
		if id == m.id {
			g.order = append(g.order[:i:i], g.order[i+1:]...)
			break
		}
	}
	if m.instanceID != nil && g.static[*m.instanceID] == m.id {
		delete(g.static, *m.instanceID)
	}
	m.timer.Stop()
	m.reply(joinReply{err: kerr.UnknownMemberID.Code, memberID: m.id, generation: -1})
	m.replySync(syncReply{err: kerr.UnknownMemberID.Code})
	if g.leader == m.id {
		g.leader = ""
		if len(g.order) > 0 {
			g.leader = g.order[0]
		}
	}
}

// removeMemberLocked removes m (left or expired) and moves the group on.
func (g *group) removeMemberLocked(m *member, reason string) {
	g.dropMemberLocked(m)
	switch g.state {
	case stateStable, stateCompletingRebalance:
		g.prepareRebalanceLocked(reason)
		g.maybeCompleteJoinLocked() // the last member gone: Empty at once
	case statePreparingRebalance:
		g.maybeCompleteJoinLocked()
	}
}

func (g *group) maxRebalanceTimeoutLocked() time.Duration {
	var d time.Duration
	for _, m := range g.members {
		d = max(d, m.rebalanceTimeout)
	}
	return d
}

// prepareRebalanceLocked starts a rebalance: members must rejoin within the
// rebalance timeout.
func (g *group) prepareRebalanceLocked(reason string) {
	if g.state == statePreparingRebalance {
		return
	}
	if g.state == stateCompletingRebalance {
		for _, m := range g.members {
			m.replySync(syncReply{err: kerr.RebalanceInProgress.Code})
		}
	}
	if g.syncTimer != nil {
		g.syncTimer.Stop()
		g.syncTimer = nil
	}
	wasEmpty := g.state == stateEmpty
	g.setStateLocked(statePreparingRebalance)
	now := g.c.cfg.Now()
	timeout := g.maxRebalanceTimeoutLocked()
	g.joinDeadline = now.Add(timeout)
	g.initialUntil = time.Time{}
	if d := g.c.cfg.InitialRebalanceDelay; wasEmpty && d > 0 {
		g.initialUntil = now.Add(min(d, timeout))
	}
	g.logger().Info("preparing to rebalance", zap.String("reason", reason), zap.Int32("generation", g.generation), zap.Int("members", len(g.members)))
	g.scheduleJoinLocked()
}

// scheduleJoinLocked arms the join timer for the next point the join may
// complete at: the end of the initial delay, or the rebalance deadline.
func (g *group) scheduleJoinLocked() {
	g.joinSeq++
	seq := g.joinSeq
	if g.joinTimer != nil {
		g.joinTimer.Stop()
	}
	at := g.joinDeadline
	if !g.initialUntil.IsZero() {
		at = g.initialUntil
	}
	g.joinTimer = time.AfterFunc(max(at.Sub(g.c.cfg.Now()), 0), func() { g.onJoinTimer(seq) })
}

func (g *group) onJoinTimer(seq uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if seq != g.joinSeq || g.state != statePreparingRebalance || g.c.ctx.Err() != nil {
		return
	}
	now := g.c.cfg.Now()
	if !g.initialUntil.IsZero() {
		if now.Before(g.initialUntil) {
			g.scheduleJoinLocked()
			return
		}
		g.initialUntil = time.Time{}
		if !g.allJoinedLocked() && now.Before(g.joinDeadline) {
			g.scheduleJoinLocked()
			return
		}
	} else if now.Before(g.joinDeadline) && !g.allJoinedLocked() {
		g.scheduleJoinLocked()
		return
	}
	g.completeJoinLocked()
}

// memberJoinedLocked is called when m has a parked join: it starts a
// rebalance if none is running and completes the join once everyone is in.
func (g *group) memberJoinedLocked(m *member, reason string) {
	if g.state != statePreparingRebalance {
		g.prepareRebalanceLocked(reason)
	} else if !g.initialUntil.IsZero() {
		// Another member in the initial delay: wait a little longer for
		// more, up to the rebalance timeout (Kafka's InitialDelayedJoin).
		g.joinDeadline = later(g.joinDeadline, g.c.cfg.Now().Add(m.rebalanceTimeout))
		g.initialUntil = earlier(g.c.cfg.Now().Add(g.c.cfg.InitialRebalanceDelay), g.joinDeadline)
		g.scheduleJoinLocked()
	}
	g.maybeCompleteJoinLocked()
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (g *group) allJoinedLocked() bool {
	if len(g.pending) > 0 {
		return false
	}
	for _, m := range g.members {
		if m.joinCh == nil {
			return false
		}
	}
	return true
}

func (g *group) anyJoinedLocked() bool {
	for _, m := range g.members {
		if m.joinCh != nil {
			return true
		}
	}
	return false
}

func (g *group) maybeCompleteJoinLocked() {
	if g.state == statePreparingRebalance && g.initialUntil.IsZero() && g.allJoinedLocked() {
		g.completeJoinLocked()
	}
}

// completeJoinLocked ends the join phase: dynamic members that did not
// rejoin are removed, a new generation starts, the protocol is chosen and
// every parked join is answered (the leader with the members' metadata).
func (g *group) completeJoinLocked() {
	g.joinSeq++
	if g.joinTimer != nil {
		g.joinTimer.Stop()
		g.joinTimer = nil
	}
	g.initialUntil = time.Time{}
	for _, id := range append([]string(nil), g.order...) {
		if m := g.members[id]; m.joinCh == nil && m.instanceID == nil {
			g.logger().Info("member did not rejoin in time; removed", zap.String("member", id))
			g.dropMemberLocked(m)
		}
	}
	if len(g.members) > 0 && !g.anyJoinedLocked() {
		// Only static members remain and none rejoined: wait another
		// rebalance timeout (their sessions expire them meanwhile), as
		// Kafka does, rather than start a generation nobody is in.
		g.joinDeadline = g.c.cfg.Now().Add(g.maxRebalanceTimeoutLocked())
		g.scheduleJoinLocked()
		return
	}
	g.generation++
	if len(g.members) == 0 {
		g.protocol, g.leader = "", ""
		g.setStateLocked(stateEmpty)
		g.persistLocked()
		g.logger().Info("group is empty", zap.Int32("generation", g.generation))
		return
	}
	g.protocol = g.selectProtocolLocked()
	if m := g.members[g.leader]; m == nil || m.joinCh == nil {
		for _, id := range g.order {
			if g.members[id].joinCh != nil {
				g.leader = id
				break
			}
		}
	}
	g.setStateLocked(stateCompletingRebalance)
	now := g.c.cfg.Now()
	all := g.memberListLocked()
	for _, m := range g.members {
		if m.joinCh == nil {
			continue
		}
		r := g.joinReplyLocked(m.id)
		if m.id == g.leader {
			r.members = all
		}
		m.lastSeen = now
		m.reply(r)
	}
	gen := g.generation
	g.syncTimer = time.AfterFunc(g.maxRebalanceTimeoutLocked(), func() { g.onSyncTimeout(gen) })
	g.logger().Info("rebalance: join complete", zap.Int32("generation", g.generation), zap.String("protocol", g.protocol), zap.String("leader", g.leader), zap.Int("members", len(g.members)))
}

func (g *group) joinReplyLocked(memberID string) joinReply {
	return joinReply{generation: g.generation, protocolType: g.protocolType, protocol: g.protocol, leader: g.leader, memberID: memberID}
}

// onSyncTimeout removes members that did not send SyncGroup within the
// rebalance timeout after the join completed, and rebalances again.
// A follower that never syncs is removed even once the leader made the
// group Stable (Kafka's pending-sync tracking).
func (g *group) onSyncTimeout(gen int32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.c.ctx.Err() != nil || (g.state != stateCompletingRebalance && g.state != stateStable) || g.generation != gen {
		return
	}
	removed := false
	for _, id := range append([]string(nil), g.order...) {
		if m := g.members[id]; m.syncedGen != gen {
			g.logger().Info("member did not sync in time; removed", zap.String("member", id))
			g.dropMemberLocked(m)
			removed = true
		}
	}
	if removed || g.state == stateCompletingRebalance {
		g.prepareRebalanceLocked("members did not sync in time")
		g.maybeCompleteJoinLocked()
	}
}

// selectProtocolLocked picks the protocol every member supports that most
// members prefer (each member votes for its first supported choice).
func (g *group) selectProtocolLocked() string {
	candidates := g.candidatesLocked()
	votes := map[string]int{}
	for _, id := range g.order {
		for _, p := range g.members[id].protocols {
			if candidates[p.name] {
				votes[p.name]++
				break
			}
		}
	}
	best, n := "", -1
	for _, p := range g.members[g.order[0]].protocols { // ties: the first member's order
		if candidates[p.name] && votes[p.name] > n {
			best, n = p.name, votes[p.name]
		}
	}
	return best
}

// candidatesLocked is the set of protocols every member supports.
func (g *group) candidatesLocked() map[string]bool {
	var set map[string]bool
	for _, m := range g.members {
		next := map[string]bool{}
		for _, p := range m.protocols {
			if set == nil || set[p.name] {
				next[p.name] = true
			}
		}
		set = next
	}
	return set
}

// supportsLocked reports whether a member with these protocols may join.
func (g *group) supportsLocked(protocolType string, protos []protocol) bool {
	if len(g.members) == 0 {
		return protocolType != "" && len(protos) > 0
	}
	if protocolType != g.protocolType {
		return false
	}
	c := g.candidatesLocked()
	for _, p := range protos {
		if c[p.name] {
			return true
		}
	}
	return false
}

func sameProtocols(a, b []protocol) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].name != b[i].name || !bytes.Equal(a[i].metadata, b[i].metadata) {
			return false
		}
	}
	return true
}

// validateMemberLocked is Kafka's check of a request's member: a static
// instance id is checked first (unknown: UNKNOWN_MEMBER_ID; now another
// member: FENCED_INSTANCE_ID, so a zombie shuts down instead of rejoining
// and taking the instance back), then the member id.
func (g *group) validateMemberLocked(memberID string, iid *string) *kerr.Error {
	if iid != nil {
		cur, ok := g.static[*iid]
		if !ok {
			return kerr.UnknownMemberID
		}
		if cur != memberID {
			return kerr.FencedInstanceID
		}
	}
	if g.members[memberID] == nil {
		return kerr.UnknownMemberID
	}
	return nil
}

// groupValueLocked is the group record for the current state.
func (g *group) groupValueLocked() *groupValue {
	gv := &groupValue{ProtocolType: g.protocolType, Protocol: g.protocol, Generation: g.generation, Leader: g.leader, StateMs: g.stateSince.UnixMilli()}
	for _, id := range g.order {
		m := g.members[id]
		gv.Members = append(gv.Members, memberValue{
			ID: m.id, InstanceID: m.instanceID, ClientID: m.clientID, ClientHost: m.clientHost,
			SessionTimeout:   int32(m.sessionTimeout / time.Millisecond),
			RebalanceTimeout: int32(m.rebalanceTimeout / time.Millisecond),
			Metadata:         m.metadataFor(g.protocol),
			Assignment:       m.assignment,
		})
	}
	return gv
}

// persistLocked writes the group record for the current state.
func (g *group) persistLocked() error {
	gv := g.groupValueLocked()
	if err := g.c.append([]record{groupRecord(g.id, gv)}); err != nil {
		g.logger().Warn("write group metadata", zap.Error(err))
		return err
	}
	g.persisted = gv
	return nil
}

// recordsLocked is the group's live state as records (a snapshot).
func (g *group) recordsLocked() []record {
	var recs []record
	if g.persisted != nil {
		recs = append(recs, groupRecord(g.id, g.persisted))
	}
	for k, v := range g.offsets {
		recs = append(recs, offsetRecord(g.id, k.topic, k.partition, &v))
	}
	return recs
}

// shutdownLocked stops timers and answers parked requests.
func (g *group) shutdownLocked() {
	g.joinSeq++
	for _, t := range []*time.Timer{g.joinTimer, g.syncTimer} {
		if t != nil {
			t.Stop()
		}
	}
	for _, t := range g.pending {
		t.Stop()
	}
	for _, m := range g.members {
		m.timer.Stop()
		m.reply(joinReply{err: kerr.NotCoordinator.Code, memberID: m.id, generation: -1})
		m.replySync(syncReply{err: kerr.NotCoordinator.Code})
	}
}
