package broker

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// AlterPartitionReassignments: v0-1
//
// Behavior:
//   - One broker: the only assignment is [this node]. Asking for it is a
//     success with nothing to move; any other replica list is
//     INVALID_REPLICA_ASSIGNMENT; a cancel (null replicas)
//     NO_REASSIGNMENT_IN_PROGRESS; an unknown partition
//     UNKNOWN_TOPIC_OR_PARTITION. (Tools such as topicctl and kafkactl call
//     it and must not refuse to run.)
//   - With ACLs: ALTER on the cluster, else CLUSTER_AUTHORIZATION_FAILED at
//     the top.
func (s *Server) handleAlterPartitionReassignments(c *conn, req *kmsg.AlterPartitionAssignmentsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.AlterPartitionAssignmentsResponse)
	if !c.allowedCluster(opAlter) {
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		return resp, nil
	}
	if s.cl != nil {
		s.cl.alterReassignments(req, resp) // cluster_reassign.go
		return resp, nil
	}
	node := s.meta.m.NodeID
	for _, rt := range req.Topics {
		st := kmsg.NewAlterPartitionAssignmentsResponseTopic()
		st.Topic = rt.Topic
		t := s.reg.get(rt.Topic)
		for _, rp := range rt.Partitions {
			sp := kmsg.NewAlterPartitionAssignmentsResponseTopicPartition()
			sp.Partition = rp.Partition
			switch {
			case t == nil || s.reg.partition(t, rp.Partition) == nil:
				sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
			case rp.Replicas == nil:
				sp.ErrorCode = kerr.NoReassignmentInProgress.Code
			case len(rp.Replicas) != 1 || rp.Replicas[0] != node:
				sp.ErrorCode = kerr.InvalidReplicaAssignment.Code
				sp.ErrorMessage = kmsg.StringPtr(fmt.Sprintf("this cluster is one broker (node %d): its only assignment is [%d]", node, node))
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}

// ListPartitionReassignments: v0
//
// Behavior:
//   - One broker: no reassignment is ever in progress; the answer lists
//     none (named partitions included, as Kafka leaves out those not being
//     reassigned).
//   - With ACLs: DESCRIBE on the cluster, else CLUSTER_AUTHORIZATION_FAILED.
func (s *Server) handleListPartitionReassignments(c *conn, req *kmsg.ListPartitionReassignmentsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.ListPartitionReassignmentsResponse)
	if !c.allowedCluster(opDescribe) {
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
	} else if s.cl != nil {
		s.cl.listReassignments(req, resp)
	}
	return resp, nil
}
