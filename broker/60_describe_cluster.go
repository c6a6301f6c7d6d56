package broker

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DescribeCluster: v0-1
//
// Behavior:
//   - This broker is the only broker and the controller; cluster id as in
//     Metadata. v1: endpoint type 1 (brokers).
//   - With ACLs: DESCRIBE on the cluster, else CLUSTER_AUTHORIZATION_FAILED.
func (s *Server) handleDescribeCluster(c *conn, req *kmsg.DescribeClusterRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DescribeClusterResponse)
	if !c.allowedCluster(opDescribe) {
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		return resp, nil
	}
	resp.ClusterID = s.meta.m.ClusterID
	resp.ControllerID = s.meta.m.NodeID
	resp.EndpointType = 1
	resp.ClusterAuthorizedOperations = -2147483648
	b := kmsg.NewDescribeClusterResponseBroker()
	b.NodeID, b.Host, b.Port = s.meta.m.NodeID, c.lis.host, c.lis.port
	resp.Brokers = append(resp.Brokers, b)
	return resp, nil
}
