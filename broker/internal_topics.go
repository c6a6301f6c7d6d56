package broker

import (
	"crypto/sha256"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Kafka's internal topics. Synapse keeps committed offsets in its own group
// log (__groups), not in a topic, but clients expect Kafka's offsets topic
// to be listed once groups are in use: franz-go's regex consumer, for one,
// tells internal topics apart by it. So __consumer_offsets is a virtual
// topic: Metadata lists it (IsInternal, one partition on this broker) from
// the first FindCoordinator for a group, or from the start if groups exist;
// fetches of it are empty, ListOffsets answers 0, produce is refused
// (INVALID_TOPIC_EXCEPTION, as Kafka refuses clients' appends to internal
// topics), so is DeleteTopics of it (20_delete_topics.go), and neither it
// nor __transaction_state is ever created as an ordinary topic. A data directory that already holds an ordinary topic of
// that name (created before this rule) keeps serving it instead.

const (
	offsetsTopic = "__consumer_offsets"
	txnTopic     = "__transaction_state"
)

// internalTopic reports whether name is one of Kafka's internal topics.
func internalTopic(name string) bool { return name == offsetsTopic || name == txnTopic }

// errInternalTopic: a client asked to create an internal topic.
var errInternalTopic = errors.New("the name is reserved for a Kafka internal topic")

// errDeleteOffsetsTopic answers a DeleteTopics of the virtual offsets
// topic. Kafka's brokers would delete theirs (only kafka-topics.sh refuses
// internal topics); here there is nothing to delete, the offsets being in
// the group log, so it is refused as Kafka refuses other writes to internal
// topics (INVALID_TOPIC_EXCEPTION). DeleteGroups and OffsetDelete remove
// committed offsets.
const errDeleteOffsetsTopic = "__consumer_offsets is an internal topic: committed offsets are kept in the group log; delete groups or their offsets instead"

// virtualOffsets reports whether name is the virtual offsets topic and it
// is shown.
func (s *Server) virtualOffsets(name string) bool {
	return name == offsetsTopic && s.offsetsShown.Load() && s.reg.get(offsetsTopic) == nil
}

// virtualOffsetsID reports whether id is the shown virtual topic's.
func (s *Server) virtualOffsetsID(id [16]byte) bool {
	return id == s.offsetsTopicID() && s.virtualOffsets(offsetsTopic)
}

// offsetsTopicID is the virtual topic's id, stable for the cluster.
func (s *Server) offsetsTopicID() [16]byte { return s.internalTopicID(offsetsTopic) }

// internalTopicID is an internal topic's id, stable for the cluster.
func (s *Server) internalTopicID(name string) [16]byte {
	sum := sha256.Sum256([]byte(name + "\x00" + s.meta.m.ClusterID))
	var id [16]byte
	copy(id[:], sum[:16])
	return id
}

func (s *Server) metadataOffsetsTopic() kmsg.MetadataResponseTopic {
	mt := kmsg.NewMetadataResponseTopic()
	mt.Topic = kmsg.StringPtr(offsetsTopic)
	mt.TopicID = s.offsetsTopicID()
	mt.IsInternal = true
	mt.AuthorizedOperations = -2147483648
	node := s.meta.m.NodeID
	mp := kmsg.NewMetadataResponseTopicPartition()
	mp.Leader, mp.LeaderEpoch = node, s.meta.m.LeaderEpoch
	mp.Replicas, mp.ISR = []int32{node}, []int32{node}
	mt.Partitions = append(mt.Partitions, mp)
	return mt
}

// fetchOffsetsTopic answers a fetch of the virtual topic: partition 0 is
// empty at offset 0, others do not exist.
func fetchOffsetsTopic(rt *kmsg.FetchRequestTopic, st *kmsg.FetchResponseTopic) {
	for _, rp := range rt.Partitions {
		sp := kmsg.NewFetchResponseTopicPartition()
		sp.Partition, sp.PreferredReadReplica = rp.Partition, -1
		sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = 0, 0, 0
		if rp.Partition != 0 {
			sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
			sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = -1, -1, -1
		} else if rp.FetchOffset != 0 {
			sp.ErrorCode = kerr.OffsetOutOfRange.Code
		}
		st.Partitions = append(st.Partitions, sp)
	}
}
