package broker

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CreateTopics: v0-7
//
// Behavior:
//   - NumPartitions -1 takes the broker default; ReplicationFactor must be -1
//     or 1 (one broker); a replica assignment may only name this broker.
//   - Configs are validated by name and value (INVALID_CONFIG names the
//     culprit); unknown names are refused, as Kafka does.
//   - Names are checked as Kafka does (INVALID_TOPIC_EXCEPTION); an existing
//     topic is TOPIC_ALREADY_EXISTS; ValidateOnly checks without creating.
//   - One request creates at most 100000 partitions in all (a topic at most
//     100000); topics past that get POLICY_VIOLATION.
//
// Version notes:
//   - v5+: the response carries the topic id, partition count, replication
//     factor and the topic's configs.
func (s *Server) handleCreateTopics(c *conn, req *kmsg.CreateTopicsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
	seen := map[string]int{}
	for _, rt := range req.Topics {
		seen[rt.Topic]++
	}
	created := 0 // partitions this request created
	for _, rt := range req.Topics {
		st := kmsg.NewCreateTopicsResponseTopic()
		st.Topic = rt.Topic
		st.NumPartitions, st.ReplicationFactor = -1, -1
		fail := func(code int16, msg string) {
			st.ErrorCode = code
			st.ErrorMessage = kmsg.StringPtr(msg)
			resp.Topics = append(resp.Topics, st)
		}
		if seen[rt.Topic] > 1 {
			fail(kerr.InvalidRequest.Code, "topic named more than once in the request")
			continue
		}
		if !c.mayCreateTopic(rt.Topic) {
			fail(kerr.TopicAuthorizationFailed.Code, "not authorized to create the topic")
			continue
		}
		n := rt.NumPartitions
		if n == -1 {
			n = s.cfg.DefaultPartitions
		}
		if s.cl != nil && len(rt.ReplicaAssignment) > 0 {
			fail(kerr.InvalidReplicaAssignment.Code, "replica assignments are not supported yet in cluster mode: the controller places replicas")
			continue
		}
		if s.cl != nil {
			// Placed by the controller (cluster_admin.go).
		} else if len(rt.ReplicaAssignment) > 0 {
			if rt.NumPartitions != -1 || rt.ReplicationFactor != -1 {
				fail(kerr.InvalidRequest.Code, "replica assignment given with a partition count or replication factor")
				continue
			}
			n = int32(len(rt.ReplicaAssignment))
			if !s.assignmentIsSelf(rt.ReplicaAssignment) {
				fail(kerr.InvalidReplicaAssignment.Code, "this cluster has one broker; assignments may only name it, once per partition")
				continue
			}
		} else if rt.ReplicationFactor != -1 && rt.ReplicationFactor != 1 {
			fail(kerr.InvalidReplicationFactor.Code, "this cluster has one broker: replication factor must be 1 (or -1)")
			continue
		}
		if n <= 0 {
			fail(kerr.InvalidPartitions.Code, "partition count must be positive")
			continue
		}
		if !req.ValidateOnly && int64(created)+int64(n) > int64(maxPartitionsPerRequest) {
			// One request's work is bounded (each partition is a directory
			// of open files, made under the registry lock).
			fail(kerr.PolicyViolation.Code, "this request already creates as many partitions as one request may (100000 in all): ask again for the rest")
			continue
		}
		configs := map[string]string{}
		for _, c := range rt.Configs {
			if c.Value != nil {
				configs[c.Name] = *c.Value
			}
		}
		var t *topic
		var err error
		rf := int16(1)
		if s.cl != nil {
			t, err = s.cl.createTopic(s.ctx, rt.Topic, n, int32(rt.ReplicationFactor), configs, req.ValidateOnly)
			rf = rt.ReplicationFactor
			if rf == -1 {
				rf = int16(s.cl.defaultRF())
			}
		} else {
			t, err = s.reg.create(rt.Topic, n, configs, req.ValidateOnly)
		}
		if err != nil {
			switch {
			case errors.Is(err, errTopicExists):
				fail(kerr.TopicAlreadyExists.Code, "topic '"+rt.Topic+"' already exists")
			case errors.Is(err, errInternalTopic) && rt.Topic == offsetsTopic:
				fail(kerr.TopicAlreadyExists.Code, "topic '"+rt.Topic+"' already exists (internal)")
			case errors.Is(err, errInternalTopic):
				fail(kerr.InvalidRequest.Code, "'"+rt.Topic+"' is reserved for a Kafka internal topic")
			case errors.Is(err, errRestoring):
				fail(kerr.NotController.Code, err.Error()) // retriable
			case errors.Is(err, errTopicDeleting):
				fail(kerr.TopicAlreadyExists.Code, "topic '"+rt.Topic+"' is still being deleted: ask again")
			case validTopicName(rt.Topic) != nil:
				fail(kerr.InvalidTopicException.Code, err.Error())
			case validateConfigs(configs, s.cfg.Tier != nil) != nil:
				fail(kerr.InvalidConfig.Code, err.Error())
			default:
				fail(s.errorCode(err), err.Error())
			}
			continue
		}
		if !req.ValidateOnly {
			created += int(n)
		}
		st.TopicID = t.id
		st.NumPartitions, st.ReplicationFactor = n, rf
		if c.allowed(opDescribeConfigs, resTopic, rt.Topic) {
			st.Configs = s.createTopicsConfigs(t.configs)
		} else {
			st.ConfigErrorCode = kerr.TopicAuthorizationFailed.Code // v5+: created, configs not shown (as Kafka)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}

// maxPartitionsPerRequest bounds the partitions one CreateTopics creates
// in all. (A variable for tests.)
var maxPartitionsPerRequest = maxPartitions

func (s *Server) assignmentIsSelf(as []kmsg.CreateTopicsRequestTopicReplicaAssignment) bool {
	for _, a := range as {
		if len(a.Replicas) != 1 || a.Replicas[0] != s.meta.m.NodeID {
			return false
		}
	}
	return true
}

func (s *Server) createTopicsConfigs(set map[string]string) []kmsg.CreateTopicsResponseTopicConfig {
	var out []kmsg.CreateTopicsResponseTopicConfig
	for _, name := range sortedConfigNames() {
		v, src := s.topicConfig(set, name)
		c := kmsg.NewCreateTopicsResponseTopicConfig()
		c.Name, c.Value = name, kmsg.StringPtr(v)
		c.Source = int8(src)
		out = append(out, c)
	}
	return out
}
