package broker

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ElectLeaders: v0-2
//
// Behavior:
//   - One replica: every partition's leader is already its preferred (and
//     only) replica, so each partition named answers ELECTION_NOT_NEEDED,
//     as Kafka answers for a partition led by its preferred replica; an
//     unknown one UNKNOWN_TOPIC_OR_PARTITION. Null topics (every
//     partition) answer an empty list: nothing needed an election.
//   - In a cluster: PREFERRED moves each partition's leadership to its
//     first replica when that one is alive and in the ISR (epoch + 1);
//     UNCLEAN never elects outside the ISR (ELIGIBLE_LEADERS_NOT_AVAILABLE
//     for a partition with no leader). Null topics: every partition not
//     led by its first replica.
//   - With ACLs: ALTER on the cluster, else CLUSTER_AUTHORIZATION_FAILED
//     (v1+ at the top; v0 per partition).
func (s *Server) handleElectLeaders(c *conn, req *kmsg.ElectLeadersRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.ElectLeadersResponse)
	denied := !c.allowedCluster(opAlter)
	if denied && req.Version >= 1 {
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		return resp, nil
	}
	if s.cl != nil && !denied {
		s.cl.electLeaders(req, resp) // cluster_reassign.go
		return resp, nil
	}
	for _, rt := range req.Topics {
		st := kmsg.NewElectLeadersResponseTopic()
		st.Topic = rt.Topic
		t := s.reg.get(rt.Topic)
		for _, i := range rt.Partitions {
			sp := kmsg.NewElectLeadersResponseTopicPartition()
			sp.Partition = i
			switch {
			case denied:
				sp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
			case t == nil || s.reg.partition(t, i) == nil:
				sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
			default:
				sp.ErrorCode = kerr.ElectionNotNeeded.Code
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}
