package broker

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DeleteTopics: v0-6
//
// Behavior:
//   - The topic leaves the registry durably first, then its partitions are
//     closed and their directories removed; it vanishes from Metadata and
//     Fetch at once. Its objects in the tiered store are deleted in the
//     background (manifest first). Unknown topics get
//     UNKNOWN_TOPIC_OR_PARTITION. The virtual __consumer_offsets
//     (internal_topics.go) is refused, INVALID_TOPIC_EXCEPTION.
//
// Version notes:
//   - v6: topics by name or id (UNKNOWN_TOPIC_ID).
func (s *Server) handleDeleteTopics(c *conn, req *kmsg.DeleteTopicsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DeleteTopicsResponse)
	del := func(name *string, id [16]byte) {
		st := kmsg.NewDeleteTopicsResponseTopic()
		st.Topic, st.TopicID = name, id
		var t *topic
		if name != nil {
			if !c.allowed(opDelete, resTopic, *name) {
				st.ErrorCode = kerr.TopicAuthorizationFailed.Code
			} else if s.virtualOffsets(*name) {
				st.ErrorCode, st.ErrorMessage = kerr.InvalidTopicException.Code, kmsg.StringPtr(errDeleteOffsetsTopic)
			} else if t = s.reg.get(*name); t == nil {
				st.ErrorCode = kerr.UnknownTopicOrPartition.Code
			}
		} else if s.virtualOffsetsID(id) && c.allowed(opDelete, resTopic, offsetsTopic) {
			st.Topic, st.ErrorCode, st.ErrorMessage = kmsg.StringPtr(offsetsTopic), kerr.InvalidTopicException.Code, kmsg.StringPtr(errDeleteOffsetsTopic)
		} else if t = s.reg.getByID(id); t == nil {
			st.ErrorCode = kerr.UnknownTopicID.Code
		} else if !c.allowed(opDelete, resTopic, t.name) {
			t, st.ErrorCode = nil, kerr.TopicAuthorizationFailed.Code
		}
		if t != nil {
			st.Topic, st.TopicID = kmsg.StringPtr(t.name), t.id
			var err error
			if s.cl != nil {
				err = s.cl.deleteTopic(s.ctx, t)
			} else {
				err = s.deleteTopic(t)
			}
			if err != nil {
				st.ErrorCode = s.errorCode(err)
				st.ErrorMessage = kmsg.StringPtr(err.Error())
			}
		}
		resp.Topics = append(resp.Topics, st)
	}
	if req.Version < 6 {
		for _, n := range req.TopicNames {
			del(kmsg.StringPtr(n), [16]byte{})
		}
	} else {
		for _, rt := range req.Topics {
			del(rt.Topic, rt.TopicID)
		}
	}
	return resp, nil
}

// deleteTopic deletes a local topic: its partitions, its group offsets
// and, with tiering, its objects.
func (s *Server) deleteTopic(t *topic) error {
	parts := s.reg.partitionsOf(t)
	if s.cfg.Tier != nil {
		// Recorded before the topic goes, so a crash in between cannot
		// leak its objects (a live topic's entry is skipped, and dropped
		// at the next start).
		s.recordForgets(parts, false)
	}
	if err := s.reg.remove(t); err != nil {
		if s.cfg.Tier != nil {
			s.recordForgets(parts, true)
		}
		return err
	}
	if s.cl == nil {
		s.grp().TopicDeleted(t.name)
	} else if s.cl.activeGroups() {
		// Not on the watch goroutine: the write waits for the ISR, which
		// may wait for the next view.
		g := s.grp()
		go g.TopicDeleted(t.name)
	}
	if s.cfg.Tier != nil {
		s.forgetTiered()
	}
	return nil
}
