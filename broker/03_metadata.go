package broker

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Metadata: v0-13
//
// Behavior:
//   - One broker (this one) is the leader, sole replica and ISR of every
//     partition; it is also the controller.
//   - v0: an empty topic list means all topics; v1+: null means all, empty
//     means none.
//   - Unknown topics are created when auto-creation is on and the request
//     allows it (v0-3 always allow; v4+ AllowAutoTopicCreation), else they
//     get UNKNOWN_TOPIC_OR_PARTITION. Invalid names get INVALID_TOPIC_EXCEPTION
//     and are never created. At most 64 topics are created per request; the
//     others get LEADER_NOT_AVAILABLE (retriable) until a later request.
//
// Version notes:
//   - v10+: topics may be asked for by id (UNKNOWN_TOPIC_ID if none).
//   - v8+: authorized operations are not computed (-2147483648).
//
// Listeners and ACLs:
//   - The broker's endpoint is the advertised address of the listener the
//     client connected to.
//   - With ACLs, listing all topics leaves out those the principal may not
//     DESCRIBE; a named one it may not describe is
//     TOPIC_AUTHORIZATION_FAILED; auto-creation needs CREATE (on the
//     cluster or the topic), else TOPIC_AUTHORIZATION_FAILED (as Kafka).
func (s *Server) handleMetadata(c *conn, req *kmsg.MetadataRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.MetadataResponse)
	b := kmsg.NewMetadataResponseBroker()
	b.NodeID, b.Host, b.Port = s.meta.m.NodeID, c.lis.host, c.lis.port
	resp.Brokers = append(resp.Brokers, b)
	resp.ClusterID = kmsg.StringPtr(s.meta.m.ClusterID)
	resp.ControllerID = s.meta.m.NodeID
	resp.AuthorizedOperations = -2147483648
	if s.cl != nil {
		resp.Brokers, resp.ControllerID = s.cl.metadataBrokers(), s.cl.controllerID()
	}

	all := req.Topics == nil || (req.Version == 0 && len(req.Topics) == 0)
	if all {
		z := s.sec.authz
		ts := s.reg.all()
		resp.Topics = make([]kmsg.MetadataResponseTopic, 0, len(ts)+1)
		for _, t := range ts {
			if z == nil || z.Authorize(c.principal, c.ip, opDescribe, resTopic, t.name) {
				resp.Topics = append(resp.Topics, s.metadataTopic(t))
			}
		}
		if s.virtualOffsets(offsetsTopic) && (z == nil || z.Authorize(c.principal, c.ip, opDescribe, resTopic, offsetsTopic)) {
			resp.Topics = append(resp.Topics, s.metadataOffsetsTopic())
		}
		return resp, nil
	}
	autoCreate := s.cfg.AutoCreateTopics && (req.Version < 4 || req.AllowAutoTopicCreation)
	creates := maxAutoCreates
	for _, rt := range req.Topics {
		var t *topic
		if rt.Topic == nil {
			if t = s.reg.getByID(rt.TopicID); t == nil || !c.allowed(opDescribe, resTopic, t.name) {
				code := kerr.UnknownTopicID.Code
				if t != nil {
					code = kerr.TopicAuthorizationFailed.Code
				}
				mt := kmsg.NewMetadataResponseTopic()
				mt.TopicID, mt.ErrorCode = rt.TopicID, code
				mt.AuthorizedOperations = -2147483648
				resp.Topics = append(resp.Topics, mt)
				continue
			}
		} else {
			var code int16
			if s.virtualOffsets(*rt.Topic) && c.allowed(opDescribe, resTopic, offsetsTopic) {
				resp.Topics = append(resp.Topics, s.metadataOffsetsTopic())
				continue
			} else if c.allowed(opDescribe, resTopic, *rt.Topic) {
				t, code = s.topicOrCreate(c, *rt.Topic, autoCreate, &creates)
			} else {
				code = kerr.TopicAuthorizationFailed.Code
			}
			if t == nil {
				mt := kmsg.NewMetadataResponseTopic()
				mt.Topic, mt.ErrorCode = rt.Topic, code
				mt.AuthorizedOperations = -2147483648
				resp.Topics = append(resp.Topics, mt)
				continue
			}
		}
		resp.Topics = append(resp.Topics, s.metadataTopic(t))
	}
	return resp, nil
}

func (s *Server) metadataTopic(t *topic) kmsg.MetadataResponseTopic {
	mt := kmsg.NewMetadataResponseTopic()
	mt.Topic = kmsg.StringPtr(t.name)
	mt.TopicID = t.id
	mt.AuthorizedOperations = -2147483648
	if s.cl != nil {
		mt.Partitions = s.cl.metadataPartitions(t)
		return mt
	}
	node := s.meta.m.NodeID
	parts := s.reg.partitionsOf(t)
	// While every partition is online the list is the same each time:
	// built once, shared by every response (the encoder only reads it), so
	// a full Metadata of 100 000 partitions allocates nothing per
	// partition. A partition count change or an offline partition builds
	// it anew.
	online := true
	for _, p := range parts {
		if p.log.Err() != nil {
			online = false
			break
		}
	}
	if c := t.meta.Load(); online && c != nil && len(*c) == len(parts) {
		mt.Partitions = *c
		return mt
	}
	self := []int32{node} // one replica list for every partition
	mt.Partitions = make([]kmsg.MetadataResponseTopicPartition, len(parts))
	for i, p := range parts {
		mp := &mt.Partitions[i]
		mp.Default()
		mp.Partition = p.index
		mp.Leader = node
		mp.LeaderEpoch = s.meta.m.LeaderEpoch
		mp.Replicas = self
		mp.ISR = self
		if p.log.Err() != nil {
			mp.ErrorCode = kerr.KafkaStorageError.Code
			mp.OfflineReplicas = self
		}
	}
	if online {
		ps := mt.Partitions
		t.meta.Store(&ps)
	}
	return mt
}

// maxAutoCreates bounds the topics one request may auto-create (each
// opens its partitions and rewrites topics.json under the registry lock);
// the rest are answered LEADER_NOT_AVAILABLE, as Kafka answers a topic
// still being created, and clients ask again.
const maxAutoCreates = 64

// topicOrCreate finds a topic, creating it if allowed (and the request's
// budget of creates, if not nil, is not spent, and c's principal may CREATE
// it: else TOPIC_AUTHORIZATION_FAILED, as Kafka answers). A nil topic comes
// with the error code to answer.
func (s *Server) topicOrCreate(c *conn, name string, create bool, budget *int) (*topic, int16) {
	if t := s.reg.get(name); t != nil {
		return t, 0
	}
	if err := validTopicName(name); err != nil {
		return nil, kerr.InvalidTopicException.Code
	}
	if internalTopic(name) {
		return nil, kerr.UnknownTopicOrPartition.Code // never created as an ordinary topic
	}
	if !create {
		return nil, kerr.UnknownTopicOrPartition.Code
	}
	if !c.mayCreateTopic(name) {
		return nil, kerr.TopicAuthorizationFailed.Code
	}
	if budget != nil {
		if *budget <= 0 {
			return nil, kerr.LeaderNotAvailable.Code
		}
		*budget--
	}
	var t *topic
	var err error
	if s.cl != nil {
		t, err = s.cl.createTopic(s.ctx, name, s.cfg.DefaultPartitions, -1, nil, false)
	} else {
		t, err = s.reg.create(name, s.cfg.DefaultPartitions, nil, false)
	}
	if err == errTopicExists {
		t = s.reg.get(name)
	} else if err == errTopicDeleting || errors.Is(err, errRestoring) {
		return nil, kerr.LeaderNotAvailable.Code // retriable: created when asked again
	} else if err != nil {
		return nil, s.errorCode(err)
	}
	if t == nil {
		return nil, kerr.UnknownTopicOrPartition.Code
	}
	return t, 0
}
