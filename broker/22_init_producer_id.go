package broker

import (
	"errors"
	"math"
	"time"

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
//   - A transactional id goes to the transaction coordinator (package
//     txn): a new id gets a new producer id at epoch 0; a known one its
//     producer id with the epoch bumped, which fences the older producer
//     (an open transaction of it is aborted first, at the bumped epoch).
//     transaction.timeout.ms above --transaction-max-timeout, or not
//     positive, is INVALID_TRANSACTION_TIMEOUT. With the caller's id and
//     epoch (v3+, KIP-360) they must be the id's current ones (or the
//     ones before a bump whose answer was lost), else PRODUCER_FENCED.
//   - With ACLs: for a transactional id WRITE on it (else
//     TRANSACTIONAL_ID_AUTHORIZATION_FAILED); without one
//     IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679),
//     else CLUSTER_AUTHORIZATION_FAILED.
func (s *Server) handleInitProducerID(c *conn, req *kmsg.InitProducerIDRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if req.TransactionalID != nil {
		if !c.allowed(opWrite, resTxnID, *req.TransactionalID) {
			resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
			return resp, nil
		}
		if *req.TransactionalID == "" {
			resp.ErrorCode = kerr.InvalidRequest.Code // as Kafka: an empty id is no id
			return resp, nil
		}
		if s.txnElsewhere() {
			resp.ErrorCode = kerr.NotCoordinator.Code
			return resp, nil
		}
		reqPID, reqEpoch := int64(-1), int16(-1)
		if req.Version >= 3 {
			reqPID, reqEpoch = req.ProducerID, req.ProducerEpoch
		}
		t := time.Now()
		pid, epoch, e := s.txnCoord().InitProducerID(*req.TransactionalID, req.TransactionTimeoutMillis, reqPID, reqEpoch)
		c.parkedSince(t) // mostly fsyncs (the transaction log, markers of an aborted transaction)
		if e != nil {
			resp.ErrorCode = e.Code
			if e == kerr.ProducerFenced && req.Version < 4 {
				resp.ErrorCode = kerr.InvalidProducerEpoch.Code // PRODUCER_FENCED is v4+
			}
			return resp, nil
		}
		resp.ProducerID, resp.ProducerEpoch = pid, epoch
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
	var id int64
	var err error
	if s.cl != nil {
		id, err = s.cl.nextProducerID(s.ctx) // unique across the cluster
	} else {
		id, err = s.meta.nextProducerID()
	}
	if errors.Is(err, errRestoring) {
		resp.ErrorCode = kerr.CoordinatorLoadInProgress.Code // retriable
		return resp, nil
	}
	if err != nil {
		resp.ErrorCode = kerr.KafkaStorageError.Code
		return resp, nil
	}
	resp.ProducerID, resp.ProducerEpoch = id, 0
	return resp, nil
}
