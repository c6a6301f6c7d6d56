package broker

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/protocol"
)

// dispatchGroup serves the group keys (package group), checking first what
// Kafka checks: READ on the group to join, sync, heartbeat, leave and
// commit; DESCRIBE to fetch offsets and describe; DELETE to delete groups
// and offsets; READ (commit, delete) or DESCRIBE (fetch) on each topic.
// ListGroups lists only groups the principal may describe unless it may
// describe the cluster.
func (s *Server) dispatchGroup(c *conn, req *protocol.Request) (kmsg.Response, error) {
	if s.cl != nil && !s.cl.activeGroups() {
		if resp := notCoordinator(req.Body); resp != nil {
			return resp, nil
		}
	}
	groupDenied := kerr.GroupAuthorizationFailed.Code
	switch b := req.Body.(type) {
	case *kmsg.JoinGroupRequest:
		if !c.allowed(opRead, resGroup, groupName(b.Group)) {
			resp := b.ResponseKind().(*kmsg.JoinGroupResponse)
			resp.ErrorCode, resp.MemberID, resp.Generation = groupDenied, b.MemberID, -1
			return resp, nil
		}
		defer c.parkedSince(time.Now()) // the rebalance is waited for: not handler time
		return s.grp().JoinGroup(s.ctx, b, s.clientOf(c, req.ClientID)), nil
	case *kmsg.SyncGroupRequest:
		if !c.allowed(opRead, resGroup, groupName(b.Group)) {
			resp := b.ResponseKind().(*kmsg.SyncGroupResponse)
			resp.ErrorCode = groupDenied
			return resp, nil
		}
		defer c.parkedSince(time.Now()) // the assignment is waited for: not handler time
		return s.grp().SyncGroup(s.ctx, b), nil
	case *kmsg.HeartbeatRequest:
		if !c.allowed(opRead, resGroup, groupName(b.Group)) {
			resp := b.ResponseKind().(*kmsg.HeartbeatResponse)
			resp.ErrorCode = groupDenied
			return resp, nil
		}
		return s.grp().Heartbeat(b), nil
	case *kmsg.LeaveGroupRequest:
		if !c.allowed(opRead, resGroup, groupName(b.Group)) {
			resp := b.ResponseKind().(*kmsg.LeaveGroupResponse)
			resp.ErrorCode = groupDenied
			return resp, nil
		}
		defer c.parkedSince(time.Now()) // mostly the group log's fsync
		return s.grp().LeaveGroup(b), nil
	case *kmsg.OffsetCommitRequest:
		return s.offsetCommit(c, b), nil
	case *kmsg.OffsetFetchRequest:
		return s.offsetFetch(c, b), nil
	case *kmsg.OffsetDeleteRequest:
		return s.offsetDelete(c, b), nil
	case *kmsg.DescribeGroupsRequest:
		var denied []string
		b.Groups, denied = split(b.Groups, func(g string) bool { return c.allowed(opDescribe, resGroup, groupName(g)) })
		resp := s.grp().DescribeGroups(b)
		for _, g := range denied {
			rg := kmsg.NewDescribeGroupsResponseGroup()
			rg.Group, rg.ErrorCode, rg.AuthorizedOperations = g, groupDenied, -2147483648
			resp.Groups = append(resp.Groups, rg)
		}
		return resp, nil
	case *kmsg.ListGroupsRequest:
		resp := s.grp().ListGroups(b)
		if s.sec.authz != nil && !s.sec.authz.Authorize(c.principal, c.ip, opDescribe, resCluster, clusterName) {
			keep := resp.Groups[:0]
			for _, g := range resp.Groups {
				if s.sec.authz.Authorize(c.principal, c.ip, opDescribe, resGroup, groupName(g.Group)) {
					keep = append(keep, g)
				}
			}
			resp.Groups = keep
		}
		return resp, nil
	case *kmsg.DeleteGroupsRequest:
		var denied []string
		b.Groups, denied = split(b.Groups, func(g string) bool { return c.allowed(opDelete, resGroup, groupName(g)) })
		t := time.Now()
		resp := s.grp().DeleteGroups(b)
		c.parkedSince(t) // mostly the group log's fsync
		for _, g := range denied {
			rg := kmsg.NewDeleteGroupsResponseGroup()
			rg.Group, rg.ErrorCode = g, groupDenied
			resp.Groups = append(resp.Groups, rg)
		}
		return resp, nil
	}
	return nil, fmt.Errorf("no handler for %s", kmsg.NameForKey(req.Key))
}

// split divides items into the allowed and the rest, each in order; kept is
// empty, not nil, when items is not nil and none is allowed (a nil topic
// list means "all topics" to OffsetFetch).
func split[T any](items []T, allowed func(T) bool) (kept, denied []T) {
	kept = items[:0:0]
	for _, it := range items {
		if allowed(it) {
			kept = append(kept, it)
		} else {
			denied = append(denied, it)
		}
	}
	return kept, denied
}

// groupName is a group id as the coordinator keeps it: invalid UTF-8
// becomes U+FFFD (group.clean), so ACLs are checked on the name acted on.
func groupName(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

func (s *Server) offsetCommit(c *conn, b *kmsg.OffsetCommitRequest) kmsg.Response {
	groupOK := c.allowed(opRead, resGroup, groupName(b.Group))
	keep, denied := split(b.Topics, func(t kmsg.OffsetCommitRequestTopic) bool { return groupOK && c.allowed(opRead, resTopic, t.Topic) })
	var resp *kmsg.OffsetCommitResponse
	if groupOK {
		b.Topics = keep
		t := time.Now()
		resp = s.grp().OffsetCommit(b)
		c.parkedSince(t) // mostly the group log's fsync
	} else {
		resp = b.ResponseKind().(*kmsg.OffsetCommitResponse)
	}
	code := kerr.TopicAuthorizationFailed.Code
	if !groupOK {
		code = kerr.GroupAuthorizationFailed.Code
	}
	for _, t := range denied {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

func (s *Server) offsetFetch(c *conn, b *kmsg.OffsetFetchRequest) kmsg.Response {
	if b.Version < 8 {
		if !c.allowed(opDescribe, resGroup, groupName(b.Group)) {
			resp := b.ResponseKind().(*kmsg.OffsetFetchResponse)
			resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
			for _, t := range b.Topics { // v0-1 carry the error per partition
				rt := kmsg.NewOffsetFetchResponseTopic()
				rt.Topic = t.Topic
				for _, p := range t.Partitions {
					rp := kmsg.NewOffsetFetchResponseTopicPartition()
					rp.Partition, rp.Offset, rp.LeaderEpoch, rp.ErrorCode = p, -1, -1, kerr.GroupAuthorizationFailed.Code
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			return resp
		}
		var denied []kmsg.OffsetFetchRequestTopic
		if b.Topics != nil {
			b.Topics, denied = split(b.Topics, func(t kmsg.OffsetFetchRequestTopic) bool { return c.allowed(opDescribe, resTopic, t.Topic) })
		}
		all := b.Topics == nil
		resp := s.grp().OffsetFetch(b)
		if all && s.sec.authz != nil {
			keep := resp.Topics[:0]
			for _, t := range resp.Topics {
				if s.sec.authz.Authorize(c.principal, c.ip, opDescribe, resTopic, t.Topic) {
					keep = append(keep, t)
				}
			}
			resp.Topics = keep
		}
		for _, t := range denied {
			rt := kmsg.NewOffsetFetchResponseTopic()
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetFetchResponseTopicPartition()
				rp.Partition, rp.Offset, rp.LeaderEpoch, rp.ErrorCode = p, -1, -1, kerr.TopicAuthorizationFailed.Code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	}
	// v8+: several groups, each checked on its own.
	var deniedGroups []string
	type deniedTopic struct {
		group string
		t     kmsg.OffsetFetchRequestGroupTopic
	}
	var deniedTopics []deniedTopic
	keepGroups := b.Groups[:0:0]
	for _, g := range b.Groups {
		if !c.allowed(opDescribe, resGroup, groupName(g.Group)) {
			deniedGroups = append(deniedGroups, g.Group)
			continue
		}
		if g.Topics != nil {
			var denied []kmsg.OffsetFetchRequestGroupTopic
			g.Topics, denied = split(g.Topics, func(t kmsg.OffsetFetchRequestGroupTopic) bool { return c.allowed(opDescribe, resTopic, t.Topic) })
			for _, t := range denied {
				deniedTopics = append(deniedTopics, deniedTopic{g.Group, t})
			}
		}
		keepGroups = append(keepGroups, g)
	}
	b.Groups = keepGroups
	resp := s.grp().OffsetFetch(b)
	for i := range resp.Groups {
		g := &resp.Groups[i]
		if s.sec.authz != nil { // (named topics were checked above; all topics are filtered here)
			keep := g.Topics[:0]
			for _, t := range g.Topics {
				if s.sec.authz.Authorize(c.principal, c.ip, opDescribe, resTopic, t.Topic) {
					keep = append(keep, t)
				}
			}
			g.Topics = keep
		}
		for _, d := range deniedTopics {
			if d.group != g.Group {
				continue
			}
			rt := kmsg.NewOffsetFetchResponseGroupTopic()
			rt.Topic = d.t.Topic
			for _, p := range d.t.Partitions {
				rp := kmsg.NewOffsetFetchResponseGroupTopicPartition()
				rp.Partition, rp.Offset, rp.LeaderEpoch, rp.ErrorCode = p, -1, -1, kerr.TopicAuthorizationFailed.Code
				rt.Partitions = append(rt.Partitions, rp)
			}
			g.Topics = append(g.Topics, rt)
		}
	}
	for _, g := range deniedGroups {
		rg := kmsg.NewOffsetFetchResponseGroup()
		rg.Group, rg.ErrorCode = g, kerr.GroupAuthorizationFailed.Code
		resp.Groups = append(resp.Groups, rg)
	}
	return resp
}

func (s *Server) offsetDelete(c *conn, b *kmsg.OffsetDeleteRequest) kmsg.Response {
	if !c.allowed(opDelete, resGroup, groupName(b.Group)) {
		resp := b.ResponseKind().(*kmsg.OffsetDeleteResponse)
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		return resp
	}
	var denied []kmsg.OffsetDeleteRequestTopic
	b.Topics, denied = split(b.Topics, func(t kmsg.OffsetDeleteRequestTopic) bool { return c.allowed(opRead, resTopic, t.Topic) })
	t := time.Now()
	resp := s.grp().OffsetDelete(b)
	c.parkedSince(t) // mostly the group log's fsync
	for _, t := range denied {
		rt := kmsg.NewOffsetDeleteResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetDeleteResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, kerr.TopicAuthorizationFailed.Code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}
