package broker

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CreatePartitions: v0-3
//
// Behavior:
//   - Grows a topic to Count partitions (INVALID_PARTITIONS if not larger);
//     an assignment may only name this broker (INVALID_REPLICA_ASSIGNMENT).
//     ValidateOnly checks without creating.
func (s *Server) handleCreatePartitions(c *conn, req *kmsg.CreatePartitionsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.CreatePartitionsResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewCreatePartitionsResponseTopic()
		st.Topic = rt.Topic
		t := s.reg.get(rt.Topic)
		switch {
		case !c.allowed(opAlter, resTopic, rt.Topic):
			st.ErrorCode = kerr.TopicAuthorizationFailed.Code
		case t == nil:
			st.ErrorCode = kerr.UnknownTopicOrPartition.Code
		case s.cl != nil && len(rt.Assignment) > 0:
			st.ErrorCode = kerr.InvalidReplicaAssignment.Code
			st.ErrorMessage = kmsg.StringPtr("replica assignments are not supported yet in cluster mode: the controller places replicas")
		case s.cl == nil && !s.createAssignmentIsSelf(rt.Assignment):
			st.ErrorCode = kerr.InvalidReplicaAssignment.Code
			st.ErrorMessage = kmsg.StringPtr("this cluster has one broker; assignments may only name it")
		default:
			if err := s.growTopic(t, rt.Count, req.ValidateOnly); err != nil && !errors.Is(err, errValidated) {
				st.ErrorCode = kerr.InvalidPartitions.Code
				st.ErrorMessage = kmsg.StringPtr(err.Error())
			}
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}

func (s *Server) createAssignmentIsSelf(as []kmsg.CreatePartitionsRequestTopicAssignment) bool {
	for _, a := range as {
		if len(a.Replicas) != 1 || a.Replicas[0] != s.meta.m.NodeID {
			return false
		}
	}
	return true
}
