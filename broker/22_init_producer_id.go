package broker

import (
	"math"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// InitProducerID: v0-5
//
// Behavior:
//   - Idempotent producers (no transactional id) get a producer id never
//     handed out before (persisted in blocks in meta.json) and epoch 0.
//   - v3+: a producer that sends its current id and epoch (KIP-360, after an
//     error) gets the same id with the epoch bumped; at the maximum epoch a
//     new id.
//   - Transactional ids are refused (transactions are not implemented):
//     TRANSACTIONAL_ID_AUTHORIZATION_FAILED tells clients plainly.
//   - With ACLs: IDEMPOTENT_WRITE on the cluster or WRITE on some topic
//     (KIP-679), else CLUSTER_AUTHORIZATION_FAILED.
func (s *Server) handleInitProducerID(c *conn, req *kmsg.InitProducerIDRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if req.TransactionalID != nil {
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
		return resp, nil
	}
	if !c.mayWriteIdempotently() {
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		return resp, nil
	}
	if req.ProducerID >= 0 && req.ProducerEpoch >= 0 && req.ProducerEpoch < math.MaxInt16-1 {
		resp.ProducerID, resp.ProducerEpoch = req.ProducerID, req.ProducerEpoch+1
		return resp, nil
	}
	id, err := s.meta.nextProducerID()
	if err != nil {
		resp.ErrorCode = kerr.KafkaStorageError.Code
		return resp, nil
	}
	resp.ProducerID, resp.ProducerEpoch = id, 0
	return resp, nil
}
