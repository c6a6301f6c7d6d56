package group

import (
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
)

// OffsetCommit: v0-9
//
// Behavior:
//   - A member commits with its generation and id; a commit with
//     generation -1 and no member id (a consumer assigning partitions
//     itself, or an admin) is allowed only while the group has no members,
//     and creates the group if needed.
//   - Commits are written durably (one batch per request, fsync'd) before
//     the response. Unknown partitions get UNKNOWN_TOPIC_OR_PARTITION,
//     metadata over offset.metadata.max.bytes OFFSET_METADATA_TOO_LARGE.
//   - In CompletingRebalance a member's commit gets REBALANCE_IN_PROGRESS;
//     in PreparingRebalance it is accepted (so eager consumers can commit
//     before rejoining).
//
// Version notes:
//   - v1: per-partition timestamps (ignored; the commit time is the
//     broker's). v2-4: retention time, which sets an expiry.
//   - v6: leader epoch. v7: instance id.
func (c *Coordinator) OffsetCommit(req *kmsg.OffsetCommitRequest) *kmsg.OffsetCommitResponse {
	resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
	codes := make([][]int16, len(req.Topics))
	for i, t := range req.Topics {
		codes[i] = make([]int16, len(t.Partitions))
	}
	setAll := func(code int16) {
		for i := range codes {
			for j := range codes[i] {
				if codes[i][j] == 0 {
					codes[i][j] = code
				}
			}
		}
	}
	if e := c.commit(req, codes); e != nil {
		setAll(e.Code)
	}
	for i, t := range req.Topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic = t.Topic
		for j, p := range t.Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, codes[i][j]
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

func (c *Coordinator) commit(req *kmsg.OffsetCommitRequest, codes [][]int16) *kerr.Error {
	for _, s := range []*string{&req.Group, &req.MemberID, req.InstanceID} {
		clean(s)
	}
	for i := range req.Topics {
		for j := range req.Topics[i].Partitions {
			clean(req.Topics[i].Partitions[j].Metadata)
		}
	}
	gen, memberID := int32(-1), ""
	if req.Version >= 1 {
		gen, memberID = req.Generation, req.MemberID
	}
	var iid *string
	if req.Version >= 7 {
		iid = instanceID(req.InstanceID)
	}
	// Kafka's ClassicGroup.validateOffsetCommit: generation -1 on an
	// empty group (or a new one) is a commit from outside group management.
	g := c.lockGroup(req.Group, gen < 0)
	if g == nil {
		if c.ctx.Err() != nil {
			return kerr.NotCoordinator
		}
		return kerr.IllegalGeneration // a member of a generation that no longer exists
	}
	defer g.mu.Unlock()
	switch {
	case gen < 0 && g.state == stateEmpty:
	case gen >= 0 || memberID != "" || iid != nil:
		if e := g.validateMemberLocked(memberID, iid); e != nil {
			return e
		}
		if gen != g.generation {
			return kerr.IllegalGeneration
		}
		if g.state == stateCompletingRebalance {
			return kerr.RebalanceInProgress
		}
	default:
		return kerr.UnknownMemberID // only an empty group takes commits from outside it
	}
	if m := g.members[memberID]; m != nil {
		m.lastSeen = c.cfg.Now() // a commit is as good as a heartbeat
	}
	now := c.cfg.Now()
	var expire int64
	if req.Version >= 2 && req.Version <= 4 && req.RetentionTimeMillis >= 0 {
		expire = now.UnixMilli() + req.RetentionTimeMillis
	}
	type pending struct {
		i, j int
		k    tp
		v    offsetValue
	}
	var recs []record
	var ok []pending
	for i, t := range req.Topics {
		for j, p := range t.Partitions {
			if !c.cfg.PartitionExists(t.Topic, p.Partition) {
				codes[i][j] = kerr.UnknownTopicOrPartition.Code
				continue
			}
			v := offsetValue{Offset: p.Offset, LeaderEpoch: -1, CommitMs: now.UnixMilli(), ExpireMs: expire}
			if req.Version >= 6 {
				v.LeaderEpoch = p.LeaderEpoch
			}
			if p.Metadata != nil {
				if len(*p.Metadata) > c.cfg.MaxMetadataBytes {
					codes[i][j] = kerr.OffsetMetadataTooLarge.Code
					continue
				}
				v.Metadata = *p.Metadata
			}
			k := tp{t.Topic, p.Partition}
			recs = append(recs, offsetRecord(g.id, k.topic, k.partition, &v))
			ok = append(ok, pending{i, j, k, v})
		}
	}
	if err := c.append(recs); err != nil {
		g.logger().Warn("write offset commit", zap.Error(err))
		if errors.Is(err, log.ErrBatchTooLarge) {
			return kerr.InvalidCommitOffsetSize
		}
		return kerr.CoordinatorNotAvailable
	}
	for _, p := range ok {
		g.offsets[p.k] = p.v
	}
	return nil
}

// offsetQuery is the topics of one OffsetFetch group; nil means all.
type offsetQuery struct {
	topic      string
	partitions []int32
}

// OffsetFetch: v0-9
//
// Behavior:
//   - A partition without a commit (or of an unknown group) answers offset
//     -1, no error, empty metadata. Null topics (v2+) means every committed
//     partition of the group.
//   - Metadata round-trips as committed.
//
// Version notes:
//   - v5: leader epoch. v7: require stable: a partition with offsets of
//     an open transaction pending answers UNSTABLE_OFFSET_COMMIT
//     (retriable). v8: batched groups. v9: member id and epoch
//     (KIP-848 groups; not checked for classic groups).
func (c *Coordinator) OffsetFetch(req *kmsg.OffsetFetchRequest) *kmsg.OffsetFetchResponse {
	resp := req.ResponseKind().(*kmsg.OffsetFetchResponse)
	if req.Version >= 8 {
		for _, rg := range req.Groups {
			var q []offsetQuery
			if rg.Topics != nil {
				q = []offsetQuery{}
				for _, t := range rg.Topics {
					q = append(q, offsetQuery{t.Topic, t.Partitions})
				}
			}
			gr := kmsg.NewOffsetFetchResponseGroup()
			gr.Group = rg.Group
			for _, t := range c.fetchOffsets(rg.Group, q, req.RequireStable) {
				rt := kmsg.NewOffsetFetchResponseGroupTopic()
				rt.Topic = t.topic
				for _, p := range t.parts {
					rp := kmsg.NewOffsetFetchResponseGroupTopicPartition()
					rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = p.partition, p.v.Offset, p.v.LeaderEpoch, kmsg.StringPtr(p.v.Metadata)
					rp.ErrorCode = p.code
					rt.Partitions = append(rt.Partitions, rp)
				}
				gr.Topics = append(gr.Topics, rt)
			}
			resp.Groups = append(resp.Groups, gr)
		}
		return resp
	}
	var q []offsetQuery
	if req.Topics != nil || req.Version < 2 {
		q = []offsetQuery{}
		for _, t := range req.Topics {
			q = append(q, offsetQuery{t.Topic, t.Partitions})
		}
	}
	for _, t := range c.fetchOffsets(req.Group, q, req.Version >= 7 && req.RequireStable) {
		rt := kmsg.NewOffsetFetchResponseTopic()
		rt.Topic = t.topic
		for _, p := range t.parts {
			rp := kmsg.NewOffsetFetchResponseTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = p.partition, p.v.Offset, p.v.LeaderEpoch, kmsg.StringPtr(p.v.Metadata)
			rp.ErrorCode = p.code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

type fetchedPartition struct {
	partition int32
	v         offsetValue
	code      int16 // UNSTABLE_OFFSET_COMMIT (require stable) or 0
}

type fetchedTopic struct {
	topic string
	parts []fetchedPartition
}

func (c *Coordinator) fetchOffsets(groupID string, q []offsetQuery, requireStable bool) []fetchedTopic {
	clean(&groupID)
	none := offsetValue{Offset: -1, LeaderEpoch: -1}
	g := c.lockGroup(groupID, false)
	var offsets map[tp]offsetValue
	if g != nil {
		defer g.mu.Unlock()
		offsets = g.offsets
	}
	unstable := func(k tp) int16 { return 0 }
	if requireStable {
		unstable = func(k tp) int16 {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.pendingLocked(groupID, k) {
				return kerr.UnstableOffsetCommit.Code
			}
			return 0
		}
	}
	var out []fetchedTopic
	if q == nil { // every committed partition
		byTopic := map[string][]fetchedPartition{}
		for k, v := range offsets {
			byTopic[k.topic] = append(byTopic[k.topic], fetchedPartition{k.partition, v, unstable(k)})
		}
		for t, ps := range byTopic {
			sort.Slice(ps, func(i, j int) bool { return ps[i].partition < ps[j].partition })
			out = append(out, fetchedTopic{t, ps})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].topic < out[j].topic })
		return out
	}
	for _, t := range q {
		ft := fetchedTopic{topic: t.topic}
		for _, p := range t.partitions {
			v, ok := offsets[tp{t.topic, p}]
			if !ok {
				v = none
			}
			ft.parts = append(ft.parts, fetchedPartition{p, v, unstable(tp{t.topic, p})})
		}
		out = append(out, ft)
	}
	return out
}

// OffsetDelete: v0
//
// Behavior:
//   - GROUP_ID_NOT_FOUND for an unknown group. An Empty group's offsets are
//     deleted. For a consumer group with members, partitions of topics a
//     member subscribes to get GROUP_SUBSCRIBED_TO_TOPIC and the rest are
//     deleted; a non-consumer group with members is NON_EMPTY_GROUP.
func (c *Coordinator) OffsetDelete(req *kmsg.OffsetDeleteRequest) *kmsg.OffsetDeleteResponse {
	resp := req.ResponseKind().(*kmsg.OffsetDeleteResponse)
	clean(&req.Group)
	g := c.lockGroup(req.Group, false)
	if g == nil {
		resp.ErrorCode = kerr.GroupIDNotFound.Code
		return resp
	}
	defer g.mu.Unlock()
	var subscribed map[string]bool
	if len(g.members) > 0 {
		var ok bool
		if subscribed, ok = g.subscribedTopicsLocked(); !ok {
			resp.ErrorCode = kerr.NonEmptyGroup.Code
			return resp
		}
	}
	var recs []record
	var drop []tp
	for _, t := range req.Topics {
		rt := kmsg.NewOffsetDeleteResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetDeleteResponseTopicPartition()
			rp.Partition = p.Partition
			k := tp{t.Topic, p.Partition}
			if subscribed[t.Topic] {
				rp.ErrorCode = kerr.GroupSubscribedToTopic.Code
			} else if _, ok := g.offsets[k]; ok {
				recs = append(recs, offsetRecord(g.id, k.topic, k.partition, nil))
				drop = append(drop, k)
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	if err := c.append(recs); err != nil {
		g.logger().Warn("write offset deletion", zap.Error(err))
		resp.ErrorCode, resp.Topics = kerr.CoordinatorNotAvailable.Code, nil
		return resp
	}
	for _, k := range drop {
		delete(g.offsets, k)
	}
	return resp
}

// subscribedTopicsLocked is the union of the members' subscriptions, if the
// group uses the consumer protocol and every subscription parses.
func (g *group) subscribedTopicsLocked() (map[string]bool, bool) {
	if g.protocolType != "consumer" {
		return nil, false
	}
	set := map[string]bool{}
	for _, m := range g.members {
		md := m.metadataFor(g.protocol)
		if md == nil && len(m.protocols) > 0 {
			md = m.protocols[0].metadata
		}
		var cm kmsg.ConsumerMemberMetadata
		if err := cm.ReadFrom(md); err != nil {
			return nil, false
		}
		for _, t := range cm.Topics {
			set[t] = true
		}
	}
	return set, true
}

// DescribeGroups: v0-5
//
// Behavior:
//   - An unknown group is described as Dead with no error (Kafka's answer
//     below v6).
//   - Members carry their metadata and assignment only when the group is
//     Stable, as in Kafka.
func (c *Coordinator) DescribeGroups(req *kmsg.DescribeGroupsRequest) *kmsg.DescribeGroupsResponse {
	resp := req.ResponseKind().(*kmsg.DescribeGroupsResponse)
	for _, id := range req.Groups {
		clean(&id)
		dg := kmsg.NewDescribeGroupsResponseGroup()
		dg.Group, dg.State = id, stateDead.String()
		dg.AuthorizedOperations = -2147483648
		if g := c.lockGroup(id, false); g != nil {
			dg.State, dg.ProtocolType = g.state.String(), g.protocolType
			stable := g.state == stateStable
			if stable {
				dg.Protocol = g.protocol
			}
			for _, mid := range g.order {
				m := g.members[mid]
				dm := kmsg.NewDescribeGroupsResponseGroupMember()
				dm.MemberID, dm.InstanceID, dm.ClientID, dm.ClientHost = m.id, m.instanceID, m.clientID, m.clientHost
				dm.ProtocolMetadata, dm.MemberAssignment = []byte{}, []byte{}
				if stable {
					dm.ProtocolMetadata, dm.MemberAssignment = m.metadataFor(g.protocol), m.assignment
				}
				dg.Members = append(dg.Members, dm)
			}
			g.mu.Unlock()
		}
		resp.Groups = append(resp.Groups, dg)
	}
	return resp
}

// ListGroups: v0-5
//
// Behavior:
//   - Every live group, including groups that only hold offsets committed
//     from outside (protocol type ""). v4: state filter (case-insensitive);
//     v5: type filter ("classic" is the only type here).
func (c *Coordinator) ListGroups(req *kmsg.ListGroupsRequest) *kmsg.ListGroupsResponse {
	resp := req.ResponseKind().(*kmsg.ListGroupsResponse)
	if len(req.TypesFilter) > 0 {
		classic := false
		for _, t := range req.TypesFilter {
			classic = classic || strings.EqualFold(t, "classic")
		}
		if !classic {
			return resp
		}
	}
	for _, g := range c.all() {
		g.mu.Lock()
		st, pt := g.state, g.protocolType
		g.mu.Unlock()
		if st == stateDead {
			continue
		}
		if len(req.StatesFilter) > 0 {
			match := false
			for _, f := range req.StatesFilter {
				match = match || strings.EqualFold(f, st.String())
			}
			if !match {
				continue
			}
		}
		lg := kmsg.NewListGroupsResponseGroup()
		lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = g.id, pt, st.String(), "classic"
		resp.Groups = append(resp.Groups, lg)
	}
	return resp
}

// DeleteGroups: v0-2
//
// Behavior:
//   - Deletes an Empty group with its offsets (tombstones, durably).
//     GROUP_ID_NOT_FOUND for an unknown group, NON_EMPTY_GROUP while it has
//     members, INVALID_GROUP_ID for "".
func (c *Coordinator) DeleteGroups(req *kmsg.DeleteGroupsRequest) *kmsg.DeleteGroupsResponse {
	resp := req.ResponseKind().(*kmsg.DeleteGroupsResponse)
	for _, id := range req.Groups {
		dg := kmsg.NewDeleteGroupsResponseGroup()
		dg.Group = id
		if e := c.deleteGroup(id); e != nil {
			dg.ErrorCode = e.Code
		}
		resp.Groups = append(resp.Groups, dg)
	}
	return resp
}

func (c *Coordinator) deleteGroup(id string) *kerr.Error {
	clean(&id)
	if id == "" {
		return kerr.InvalidGroupID
	}
	g := c.lockGroup(id, false)
	if g == nil {
		return kerr.GroupIDNotFound
	}
	defer g.mu.Unlock()
	if g.state != stateEmpty {
		return kerr.NonEmptyGroup
	}
	if err := g.deleteLocked(); err != nil {
		return kerr.CoordinatorNotAvailable
	}
	return nil
}

// deleteLocked writes tombstones for everything the group has and removes
// it (state Dead).
func (g *group) deleteLocked() error {
	// A group never written to the log (such as one only ever asked for a
	// member id) leaves nothing to delete there: no write, no fsync, so
	// throwaway groups cost the maintenance pass nothing.
	if g.persisted != nil || len(g.offsets) > 0 {
		recs := []record{groupRecord(g.id, nil)}
		for k := range g.offsets {
			recs = append(recs, offsetRecord(g.id, k.topic, k.partition, nil))
		}
		if err := g.c.append(recs); err != nil {
			g.logger().Warn("write group deletion", zap.Error(err))
			return err
		}
	}
	g.offsets = map[tp]offsetValue{}
	g.persisted = nil
	g.shutdownLocked()
	g.setStateLocked(stateDead)
	g.c.removeLocked(g)
	return nil
}

// expireOffsetsLocked applies offsets retention as Kafka does: a group
// with no members loses its offsets once it has been empty for the
// retention period (a group that never had members: each offset from its
// commit time); a consumer group with members loses only offsets of topics
// no member subscribes to. An offset with an explicit expiry (OffsetCommit
// v2-4) goes at that time. A group left empty with no offsets is removed.
func (g *group) expireOffsetsLocked(now time.Time) {
	ret := g.c.cfg.OffsetsRetention.Milliseconds()
	nowMs := now.UnixMilli()
	// Kafka's GroupMetadata.removeExpiredOffsets: which offsets may expire
	// at all, and from what time.
	var subscribed map[string]bool
	useStateTime := false
	switch {
	case g.protocolType == "": // offsets committed from outside group management
	case g.state == stateEmpty:
		useStateTime = true
	case g.state == stateStable && g.protocolType == "consumer":
		var ok bool
		if subscribed, ok = g.subscribedTopicsLocked(); !ok {
			return
		}
	default:
		return
	}
	var recs []record
	var drop []tp
	for k, v := range g.offsets {
		if subscribed[k.topic] {
			continue
		}
		base := v.CommitMs
		if useStateTime {
			base = g.stateSince.UnixMilli()
		}
		expired := nowMs-base >= ret
		if v.ExpireMs > 0 {
			expired = nowMs >= v.ExpireMs
		}
		if expired {
			recs = append(recs, offsetRecord(g.id, k.topic, k.partition, nil))
			drop = append(drop, k)
		}
	}
	if len(recs) > 0 {
		if err := g.c.append(recs); err != nil {
			g.logger().Warn("write expired offsets", zap.Error(err))
			return
		}
		for _, k := range drop {
			delete(g.offsets, k)
		}
		g.logger().Info("expired committed offsets", zap.Int("partitions", len(drop)))
	}
	if g.state == stateEmpty && len(g.offsets) == 0 && len(g.members) == 0 && len(g.pending) == 0 {
		g.deleteLocked()
	}
}

// TopicDeleted drops every group's committed offsets of a deleted topic.
func (c *Coordinator) TopicDeleted(topic string) {
	for _, g := range c.all() {
		g.mu.Lock()
		var recs []record
		var drop []tp
		for k := range g.offsets {
			if k.topic == topic {
				recs = append(recs, offsetRecord(g.id, k.topic, k.partition, nil))
				drop = append(drop, k)
			}
		}
		if err := c.append(recs); err != nil {
			g.logger().Warn("write offsets of a deleted topic", zap.Error(err))
		} else {
			for _, k := range drop {
				delete(g.offsets, k)
			}
		}
		g.mu.Unlock()
	}
}
