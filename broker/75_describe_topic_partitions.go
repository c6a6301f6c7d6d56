package broker

import (
	"sort"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DescribeTopicPartitions: v0 (KIP-966; Kafka 3.7+ AdminClient describeTopics)
//
// Behavior (Kafka's DescribeTopicPartitionsRequestHandler and
// KRaftMetadataCache.getTopicMetadataForDescribeTopicResponse):
//   - No topics: every topic (those the principal may not DESCRIBE left
//     out); else the topics named, each once. Either way only names at or
//     after the cursor's topic, in name order; the cursor's topic starts at
//     the cursor's partition, the others at 0.
//   - At most max(min(ResponsePartitionLimit, 2000), 1) partitions in all
//     (Kafka's max.request.partition.size.limit default): a topic cut short
//     sets NextCursor to its first partition left out and ends the
//     response; a topic reached with the budget spent gets NextCursor at
//     its partition 0 (known or not) and is left out.
//   - Named topics unknown: UNKNOWN_TOPIC_OR_PARTITION, or
//     INVALID_TOPIC_EXCEPTION for an invalid name (no id); in the listing of
//     every topic there are none.
//   - A cursor whose topic the topic list lacks, or whose partition is
//     negative: INVALID_REQUEST on every topic named (Kafka's error
//     response), nothing else.
//   - Partitions as Metadata gives them (this broker leads, is the replica
//     and the ISR; no eligible leader replicas, ELR being for clusters);
//     __consumer_offsets as Metadata shows it (internal, once groups are in
//     use).
//   - AuthorizedOperations is always computed (Kafka does; the request has
//     no flag): the topic operations the principal may do, all of them with
//     no authorizer.
//
// ACLs: DESCRIBE on each topic; a named topic without it is
// TOPIC_AUTHORIZATION_FAILED (zero id, no partitions), listed after the
// others, its existence not disclosed (as Kafka, only those before the
// point where the response ends: Kafka checks lazily, in name order).
func (s *Server) handleDescribeTopicPartitions(c *conn, req *kmsg.DescribeTopicPartitionsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DescribeTopicPartitionsResponse)
	all := len(req.Topics) == 0
	cursorTopic, cursorPart := "", int32(0)
	if req.Cursor != nil {
		cursorTopic, cursorPart = req.Cursor.Topic, req.Cursor.Partition
	}
	seen := make(map[string]bool)
	var names []string
	add := func(name string) {
		if name >= cursorTopic && !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	z := s.sec.authz
	if all {
		for _, t := range s.reg.all() {
			add(t.name)
		}
		if s.virtualOffsets(offsetsTopic) {
			add(offsetsTopic)
		}
	} else {
		for _, rt := range req.Topics {
			add(rt.Topic)
		}
	}
	if req.Cursor != nil && ((!all && !seen[cursorTopic]) || cursorPart < 0) {
		for _, rt := range req.Topics {
			st := kmsg.NewDescribeTopicPartitionsResponseTopic()
			st.Topic, st.ErrorCode = kmsg.StringPtr(rt.Topic), kerr.InvalidRequest.Code
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil
	}
	sort.Strings(names)

	var denied []kmsg.DescribeTopicPartitionsResponseTopic
	remaining := min(max(req.ResponsePartitionLimit, 1), describePartitionsLimit)
	node := s.meta.m.NodeID
	self := []int32{node}
	for _, name := range names {
		ok := z == nil || z.Authorize(c.principal, c.ip, opDescribe, resTopic, name)
		if !ok && !all {
			c.allowed(opDescribe, resTopic, name) // audited, as Kafka logs the denial
			st := kmsg.NewDescribeTopicPartitionsResponseTopic()
			st.Topic, st.ErrorCode = kmsg.StringPtr(name), kerr.TopicAuthorizationFailed.Code
			denied = append(denied, st)
		}
		if !ok {
			continue
		}
		if remaining == 0 {
			nc := kmsg.NewDescribeTopicPartitionsResponseNextCursor()
			nc.Topic, nc.Partition = name, 0
			resp.NextCursor = &nc
			break
		}
		start := int32(0)
		if name == cursorTopic {
			start = cursorPart
		}
		st := kmsg.NewDescribeTopicPartitionsResponseTopic()
		st.Topic = kmsg.StringPtr(name)
		st.AuthorizedOperations = s.topicOperations(c, name)
		t := s.reg.get(name)
		var count int32
		switch {
		case t != nil:
			st.TopicID = t.id
			count = int32(len(s.reg.partitionsOf(t)))
		case s.virtualOffsets(name):
			st.TopicID, st.IsInternal, count = s.offsetsTopicID(), true, 1
		default:
			st.ErrorCode = kerr.UnknownTopicOrPartition.Code
			if validTopicName(name) != nil {
				st.ErrorCode = kerr.InvalidTopicException.Code
			}
			st.IsInternal = internalTopic(name)
			if !all { // the listing of every topic leaves out what went away meanwhile
				resp.Topics = append(resp.Topics, st)
			}
			continue
		}
		// A cursor past the topic's partitions starts at its end (none
		// shown); the budget is added to what is left of the topic, never
		// to the cursor itself (a cursor near MaxInt32 would overflow).
		start = min(start, count)
		upper := start + min(remaining, count-start)
		st.Partitions = make([]kmsg.DescribeTopicPartitionsResponseTopicPartition, 0, upper-start)
		for i := start; i < upper; i++ {
			sp := kmsg.NewDescribeTopicPartitionsResponseTopicPartition()
			sp.Partition, sp.LeaderID, sp.LeaderEpoch = i, node, s.meta.m.LeaderEpoch
			sp.Replicas, sp.ISR = self, self
			sp.EligibleLeaderReplicas, sp.LastKnownELR, sp.OfflineReplicas = []int32{}, []int32{}, []int32{}
			if t != nil {
				if p := s.reg.partition(t, i); p != nil && p.log.Err() != nil {
					sp.ErrorCode, sp.OfflineReplicas = kerr.KafkaStorageError.Code, self
				}
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
		if upper < count {
			nc := kmsg.NewDescribeTopicPartitionsResponseNextCursor()
			nc.Topic, nc.Partition = name, upper
			resp.NextCursor = &nc
			break
		}
		remaining -= int32(len(st.Partitions))
	}
	resp.Topics = append(resp.Topics, denied...)
	return resp, nil
}

// describePartitionsLimit is Kafka's max.request.partition.size.limit
// default: the most partitions one DescribeTopicPartitions answers.
const describePartitionsLimit = 2000

// topicOps are the operations Kafka defines on a topic.
var topicOps = []kmsg.ACLOperation{opRead, opWrite, opCreate, opDelete, opAlter, opDescribe, opDescribeConfigs, opAlterConfigs}

// topicOperations is the bit field (1 << operation code) of the topic
// operations c's principal may do on name; every one with no authorizer.
func (s *Server) topicOperations(c *conn, name string) int32 {
	z := s.sec.authz
	var ops int32
	for _, op := range topicOps {
		if z == nil || z.Authorize(c.principal, c.ip, op, resTopic, name) {
			ops |= 1 << int32(op)
		}
	}
	return ops
}
