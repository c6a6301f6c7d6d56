package broker

import (
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// AddOffsetsToTxn: v0-4
//
// Behavior:
//   - Adds a group to the transactional id's transaction, durably: the
//     offsets the producer then sends for it (TxnOffsetCommit) are
//     committed to the group with the transaction.
//   - Errors as AddPartitionsToTxn (INVALID_PRODUCER_ID_MAPPING,
//     PRODUCER_FENCED, from v2 on, else INVALID_PRODUCER_EPOCH,
//     CONCURRENT_TRANSACTIONS).
//   - With ACLs: WRITE on the transactional id
//     (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), READ on the group
//     (GROUP_AUTHORIZATION_FAILED).
func (s *Server) handleAddOffsetsToTxn(c *conn, req *kmsg.AddOffsetsToTxnRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.AddOffsetsToTxnResponse)
	switch {
	case !c.allowed(opWrite, resTxnID, req.TransactionalID):
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
	case !c.allowed(opRead, resGroup, groupName(req.Group)):
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
	case s.txnElsewhere():
		resp.ErrorCode = kerr.NotCoordinator.Code
	default:
		t := time.Now()
		e := s.txnCoord().AddOffsets(req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Group)
		c.parkedSince(t) // mostly the transaction log's fsync
		if e != nil {
			resp.ErrorCode = fencedCode(e, req.Version, 2)
		}
	}
	return resp, nil
}

// fencedCode is e's code, with PRODUCER_FENCED answered as
// INVALID_PRODUCER_EPOCH below version since (KIP-588).
func fencedCode(e *kerr.Error, version, since int16) int16 {
	if e == kerr.ProducerFenced && version < since {
		return kerr.InvalidProducerEpoch.Code
	}
	return e.Code
}
