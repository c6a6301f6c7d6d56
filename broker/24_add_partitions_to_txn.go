package broker

import (
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/txn"
)

// AddPartitionsToTxn: v0-5
//
// Behavior:
//   - Adds partitions to the transactional id's transaction (the first
//     add begins it: Ongoing), durably before the answer. Partitions
//     already in it are no write.
//   - An unknown id or a producer id that is not the id's:
//     INVALID_PRODUCER_ID_MAPPING; another epoch: PRODUCER_FENCED
//     (INVALID_PRODUCER_EPOCH below v2, as KIP-588); a transaction being
//     ended: CONCURRENT_TRANSACTIONS.
//   - An unknown partition fails the whole request: it gets
//     UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED.
//   - With ACLs: WRITE on the transactional id (else every partition
//     TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and on each topic (else
//     TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED).
//
// Version notes:
//   - v4+: batched transactions (Kafka's broker-to-coordinator form,
//     CLUSTER_ACTION on the cluster, else CLUSTER_AUTHORIZATION_FAILED at
//     the top); VerifyOnly (KIP-890) adds nothing and answers, per
//     partition, INVALID_TXN_STATE for one not in the open transaction.
func (s *Server) handleAddPartitionsToTxn(c *conn, req *kmsg.AddPartitionsToTxnRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.AddPartitionsToTxnResponse)
	if req.Version >= 4 {
		if !c.allowedCluster(opClusterAction) {
			resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
			return resp, nil
		}
		for _, rt := range req.Transactions {
			tr := kmsg.NewAddPartitionsToTxnResponseTransaction()
			tr.TransactionalID = rt.TransactionalID
			topics := make([]kmsg.AddPartitionsToTxnRequestTopic, len(rt.Topics))
			for i, t := range rt.Topics {
				topics[i] = kmsg.AddPartitionsToTxnRequestTopic{Topic: t.Topic, Partitions: t.Partitions}
			}
			for _, t := range s.addPartitions(c, rt.TransactionalID, rt.ProducerID, rt.ProducerEpoch, topics, rt.VerifyOnly, req.Version) {
				bt := kmsg.NewAddPartitionsToTxnResponseTransactionTopic()
				bt.Topic = t.Topic
				for _, p := range t.Partitions {
					bp := kmsg.NewAddPartitionsToTxnResponseTransactionTopicPartition()
					bp.Partition, bp.ErrorCode = p.Partition, p.ErrorCode
					bt.Partitions = append(bt.Partitions, bp)
				}
				tr.Topics = append(tr.Topics, bt)
			}
			resp.Transactions = append(resp.Transactions, tr)
		}
		return resp, nil
	}
	resp.Topics = s.addPartitions(c, req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Topics, false, req.Version)
	return resp, nil
}

// addPartitions is one transaction's add, answered per partition.
func (s *Server) addPartitions(c *conn, id string, pid int64, epoch int16, topics []kmsg.AddPartitionsToTxnRequestTopic, verify bool, version int16) []kmsg.AddPartitionsToTxnResponseTopic {
	var parts []txn.TP
	codes := map[txn.TP]int16{}
	denied := false
	idDenied := !c.allowed(opWrite, resTxnID, id)
	for _, t := range topics {
		topicDenied := !idDenied && !c.allowed(opWrite, resTopic, t.Topic)
		for _, p := range t.Partitions {
			k := txn.TP{Topic: t.Topic, Partition: p}
			switch {
			case idDenied:
				codes[k] = kerr.TransactionalIDAuthorizationFailed.Code
			case topicDenied:
				codes[k] = kerr.TopicAuthorizationFailed.Code
				denied = true
			default:
				parts = append(parts, k)
			}
		}
	}
	if !idDenied && denied {
		for _, k := range parts {
			codes[k] = kerr.OperationNotAttempted.Code
		}
		parts = nil
	}
	if len(parts) > 0 && s.txnElsewhere() {
		for _, k := range parts {
			codes[k] = kerr.NotCoordinator.Code
		}
		parts = nil
	}
	if len(parts) > 0 {
		t := time.Now()
		got, e := s.txnCoord().AddPartitions(id, pid, epoch, parts, verify)
		c.parkedSince(t) // mostly the transaction log's fsync
		for i, k := range parts {
			switch {
			case e != nil:
				codes[k] = e.Code
				if e == kerr.ProducerFenced && version < 2 {
					codes[k] = kerr.InvalidProducerEpoch.Code
				}
			default:
				codes[k] = got[i]
			}
		}
	}
	out := make([]kmsg.AddPartitionsToTxnResponseTopic, 0, len(topics))
	for _, t := range topics {
		rt := kmsg.NewAddPartitionsToTxnResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewAddPartitionsToTxnResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p, codes[txn.TP{Topic: t.Topic, Partition: p}]
			rt.Partitions = append(rt.Partitions, rp)
		}
		out = append(out, rt)
	}
	return out
}
