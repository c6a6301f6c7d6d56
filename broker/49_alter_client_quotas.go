package broker

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// AlterClientQuotas: v0-1
//
// Behavior:
//   - ALTER_CONFIGS on the cluster (else every entry
//     CLUSTER_AUTHORIZATION_FAILED).
//   - Each entry is checked and applied on its own, as Kafka's controller
//     does: an entity of user, client-id (a name, or null for the default)
//     or both, or ip alone (an IP address or the default); keys
//     producer_byte_rate, consumer_byte_rate (whole numbers),
//     request_percentage, controller_mutation_rate for user/client-id,
//     connection_creation_rate (a whole number) for ip; values above 0.
//     Anything else (an unknown key or type, a repeated type or key, an
//     empty name, a repeated entity) is INVALID_REQUEST with Kafka's
//     message, and that entry changes nothing.
//   - Remove (or a key not set) drops the key; an entity left with no key
//     is gone.
//   - validate_only: checked and answered, nothing changed.
//   - Changes are in quotas.json (fsync'd, mirrored to the bucket) before
//     they are answered and apply; they apply to the rates measured so far
//     at each client's next request.
//
// Version notes:
//   - v1: flexible.
func (s *Server) handleAlterClientQuotas(c *conn, req *kmsg.AlterClientQuotasRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.AlterClientQuotasResponse)
	answer := func(i int, code int16, msg string) {
		re := kmsg.NewAlterClientQuotasResponseEntry()
		for _, e := range req.Entries[i].Entity {
			ee := kmsg.NewAlterClientQuotasResponseEntryEntity()
			ee.Type, ee.Name = e.Type, e.Name
			re.Entity = append(re.Entity, ee)
		}
		re.ErrorCode = code
		if msg != "" {
			re.ErrorMessage = kmsg.StringPtr(msg)
		}
		resp.Entries = append(resp.Entries, re)
	}
	if !c.allowedCluster(opAlterConfigs) {
		for i := range req.Entries {
			answer(i, kerr.ClusterAuthorizationFailed.Code, "not authorized to ALTER_CONFIGS on the cluster")
		}
		return resp, nil
	}
	results, applied, err := s.sec.quotas.alter(req.Entries, req.ValidateOnly)
	if err != nil {
		s.logger.Error("persist client quotas", zap.Error(err))
	}
	for i, r := range results {
		if err != nil && r.code == 0 {
			r = quotaResult{kerr.UnknownServerError.Code, "the quotas could not be stored"}
		}
		answer(i, r.code, r.msg)
	}
	for _, e := range applied {
		s.sec.audit.Info("client quota changed", zap.String("event", "quota_changed"), zap.String("by", c.principal),
			zap.String("client", c.ip), zap.Stringer("entity", e))
	}
	return resp, nil
}
