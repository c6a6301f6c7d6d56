package broker

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DescribeClientQuotas: v0-1
//
// Behavior:
//   - DESCRIBE_CONFIGS on the cluster (else CLUSTER_AUTHORIZATION_FAILED).
//   - The stored entities (quotas.go) matching every filter component:
//     exact (a name), default, or any entity naming the type (its default
//     too); strict also excludes entities naming a type the filter does
//     not. No components: every entity (strict: none).
//   - An empty or repeated entity type, a match string where the match
//     type takes none (or none for exact), an unknown match type, or ip
//     with user or client-id: INVALID_REQUEST; a type other than user,
//     client-id and ip: UNSUPPORTED_VERSION (Kafka's codes and messages).
//
// Version notes:
//   - v1: flexible.
func (s *Server) handleDescribeClientQuotas(c *conn, req *kmsg.DescribeClientQuotasRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DescribeClientQuotasResponse)
	if !c.allowedCluster(opDescribeConfigs) {
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		resp.ErrorMessage = kmsg.StringPtr("not authorized to DESCRIBE_CONFIGS on the cluster")
		return resp, nil
	}
	entries, code, msg := s.sec.quotas.describe(req.Components, req.Strict)
	if code != 0 {
		resp.ErrorCode, resp.ErrorMessage = code, kmsg.StringPtr(msg)
		return resp, nil
	}
	resp.Entries = entries
	return resp, nil
}
