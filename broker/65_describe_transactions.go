package broker

import (
	"regexp"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/txn"
)

// DescribeTransactions: v0
//
// Behavior:
//   - Each transactional id's state as Kafka names it (Empty, Ongoing,
//     PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort), timeout,
//     start of the open transaction (-1 if none), producer id and epoch,
//     and the partitions of the open transaction. An unknown id is
//     TRANSACTIONAL_ID_NOT_FOUND.
//   - With ACLs: DESCRIBE on each id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
func (s *Server) handleDescribeTransactions(c *conn, req *kmsg.DescribeTransactionsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DescribeTransactionsResponse)
	for _, id := range req.TransactionalIDs {
		st := kmsg.NewDescribeTransactionsResponseTransactionState()
		st.TransactionalID, st.ProducerID, st.ProducerEpoch, st.StartTimestamp = id, -1, -1, -1
		if !c.allowed(opDescribe, resTxnID, id) {
			st.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
			resp.TransactionStates = append(resp.TransactionStates, st)
			continue
		}
		if s.txnElsewhere() {
			st.ErrorCode = kerr.NotCoordinator.Code
			resp.TransactionStates = append(resp.TransactionStates, st)
			continue
		}
		in, ok := s.txnCoord().Describe(id)
		if !ok {
			st.ErrorCode = kerr.TransactionalIDNotFound.Code
			resp.TransactionStates = append(resp.TransactionStates, st)
			continue
		}
		st.State, st.TimeoutMillis, st.StartTimestamp = in.State.String(), in.TimeoutMs, in.StartMs
		st.ProducerID, st.ProducerEpoch = in.ProducerID, in.Epoch
		var last *kmsg.DescribeTransactionsResponseTransactionStateTopic
		for _, p := range in.Partitions {
			if last == nil || last.Topic != p.Topic {
				st.Topics = append(st.Topics, kmsg.NewDescribeTransactionsResponseTransactionStateTopic())
				last = &st.Topics[len(st.Topics)-1]
				last.Topic = p.Topic
			}
			last.Partitions = append(last.Partitions, p.Partition)
		}
		resp.TransactionStates = append(resp.TransactionStates, st)
	}
	return resp, nil
}

// ListTransactions: v0-2
//
// Behavior:
//   - Every transactional id the principal may DESCRIBE, with its producer
//     id and state; filtered by states (names not Kafka's come back in
//     UnknownStateFilters), by producer ids, by v1's duration (open longer
//     than that many ms) and by v2's id pattern (a regular expression, as
//     Kafka's; a bad one is INVALID_REQUEST).
func (s *Server) handleListTransactions(c *conn, req *kmsg.ListTransactionsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.ListTransactionsResponse)
	states := map[txn.State]bool{}
	for _, f := range req.StateFilters {
		st, ok := txn.ParseState(f)
		if !ok || st == txn.Dead {
			resp.UnknownStateFilters = append(resp.UnknownStateFilters, f)
			continue
		}
		states[st] = true
	}
	pids := map[int64]bool{}
	for _, id := range req.ProducerIDFilters {
		pids[id] = true
	}
	var pattern *regexp.Regexp
	if req.Version >= 2 && req.TransactionalIDPattern != nil && *req.TransactionalIDPattern != "" {
		re, err := regexp.Compile(*req.TransactionalIDPattern)
		if err != nil {
			resp.ErrorCode = kerr.InvalidRequest.Code
			return resp, nil
		}
		pattern = re
	}
	if s.txnElsewhere() {
		return resp, nil // none here (clients ask every broker)
	}
	now := time.Now().UnixMilli()
	for _, in := range s.txnCoord().List() {
		switch {
		case len(req.StateFilters) > 0 && !states[in.State]:
			continue
		case len(pids) > 0 && !pids[in.ProducerID]:
			continue
		case req.Version >= 1 && req.DurationFilterMillis >= 0 && (in.StartMs < 0 || now-in.StartMs < req.DurationFilterMillis):
			continue
		case pattern != nil && !pattern.MatchString(in.ID):
			continue
		case !c.allowed(opDescribe, resTxnID, in.ID):
			continue
		}
		ts := kmsg.NewListTransactionsResponseTransactionState()
		ts.TransactionalID, ts.ProducerID, ts.TransactionState = in.ID, in.ProducerID, in.State.String()
		resp.TransactionStates = append(resp.TransactionStates, ts)
	}
	return resp, nil
}
