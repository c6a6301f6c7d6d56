package broker

import "github.com/twmb/franz-go/pkg/kmsg"

// DescribeCluster: v0-1
//
// Behavior:
//   - This broker is the only broker and the controller; cluster id as in
//     Metadata. v1: endpoint type 1 (brokers).
func (s *Server) handleDescribeCluster(req *kmsg.DescribeClusterRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DescribeClusterResponse)
	resp.ClusterID = s.meta.m.ClusterID
	resp.ControllerID = s.meta.m.NodeID
	resp.EndpointType = 1
	resp.ClusterAuthorizedOperations = -2147483648
	b := kmsg.NewDescribeClusterResponseBroker()
	b.NodeID, b.Host, b.Port = s.meta.m.NodeID, s.host, s.port
	resp.Brokers = append(resp.Brokers, b)
	return resp, nil
}
