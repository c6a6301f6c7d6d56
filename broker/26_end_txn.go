package broker

import (
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// EndTxn: v0-5
//
// Behavior:
//   - Commits or aborts the transactional id's transaction and answers once
//     it is whole and durable: the decision in the transaction log, a
//     COMMIT or ABORT marker on every partition of the transaction, for a
//     commit the transaction's offsets in the group log, and the
//     transaction's completion (package txn has the state machine).
//   - A retry of an end that happened answers success; the other outcome
//     of an ended transaction, or a commit with no transaction open, is
//     INVALID_TXN_STATE. An abort with none open answers success.
//   - INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED (v2+, else
//     INVALID_PRODUCER_EPOCH) as AddPartitionsToTxn. A write that fails
//     after the decision answers COORDINATOR_NOT_AVAILABLE (retriable):
//     the retry, or the maintenance loop, finishes the same end.
//   - With ACLs: WRITE on the transactional id.
//
// Version notes:
//   - v5+ (KIP-890): the epoch is bumped by every end, the markers carry
//     the new epoch, and the response returns the producer id and epoch to
//     use next (a new producer id once the epoch is exhausted).
func (s *Server) handleEndTxn(c *conn, req *kmsg.EndTxnRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.EndTxnResponse)
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if !c.allowed(opWrite, resTxnID, req.TransactionalID) {
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
		return resp, nil
	}
	if s.txnElsewhere() {
		resp.ErrorCode = kerr.NotCoordinator.Code
		return resp, nil
	}
	t := time.Now()
	pid, epoch, e := s.txnCoord().EndTxn(req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit, req.Version >= 5)
	c.parkedSince(t) // mostly fsyncs: the transaction log, the markers
	if e != nil {
		resp.ErrorCode = fencedCode(e, req.Version, 2)
		return resp, nil
	}
	if req.Version >= 5 {
		resp.ProducerID, resp.ProducerEpoch = pid, epoch
	}
	return resp, nil
}
