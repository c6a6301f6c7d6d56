package broker

import (
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/txn"
)

// TxnOffsetCommit: v0-5
//
// Behavior:
//   - Offsets of a group sent inside a transaction (after AddOffsetsToTxn
//     for that group, else INVALID_TXN_STATE) are kept with the
//     transaction, durably, and committed to the group when it commits;
//     an abort drops them. Until then OffsetFetch with require_stable
//     answers UNSTABLE_OFFSET_COMMIT for those partitions.
//   - v3+ (KIP-447): a commit naming a member and generation must come
//     from a current member of that generation (UNKNOWN_MEMBER_ID,
//     ILLEGAL_GENERATION, FENCED_INSTANCE_ID), so a zombie cannot commit
//     for partitions that moved.
//   - Unknown partitions: UNKNOWN_TOPIC_OR_PARTITION; metadata over
//     4096 bytes: OFFSET_METADATA_TOO_LARGE.
//   - With ACLs: WRITE on the transactional id, READ on the group and on
//     each topic.
//
// Version notes:
//   - PRODUCER_FENCED from v3 on (INVALID_PRODUCER_EPOCH before).
func (s *Server) handleTxnOffsetCommit(c *conn, req *kmsg.TxnOffsetCommitRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
	all := func(code int16) {
		for _, t := range req.Topics {
			rt := kmsg.NewTxnOffsetCommitResponseTopic()
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
	}
	switch {
	case !c.allowed(opWrite, resTxnID, req.TransactionalID):
		all(kerr.TransactionalIDAuthorizationFailed.Code)
		return resp, nil
	case !c.allowed(opRead, resGroup, groupName(req.Group)):
		all(kerr.GroupAuthorizationFailed.Code)
		return resp, nil
	}
	if s.txnElsewhere() {
		// (In a cluster the group coordinator coordinates transactions
		// too, once it leads the transaction log: retried until then.)
		all(kerr.NotCoordinator.Code)
		return resp, nil
	}
	if e := s.grp().ValidateTxnMember(req); e != nil {
		all(e.Code)
		return resp, nil
	}
	var offs []txn.Offset
	var where [][2]int
	codes := make([][]int16, len(req.Topics))
	for i, t := range req.Topics {
		codes[i] = make([]int16, len(t.Partitions))
		readOK := c.allowed(opRead, resTopic, t.Topic)
		for j, p := range t.Partitions {
			switch {
			case !readOK:
				codes[i][j] = kerr.TopicAuthorizationFailed.Code
			case p.Metadata != nil && len(*p.Metadata) > 4096:
				codes[i][j] = kerr.OffsetMetadataTooLarge.Code
			default:
				offs = append(offs, txn.Offset{Topic: t.Topic, Partition: p.Partition, Offset: p.Offset, LeaderEpoch: p.LeaderEpoch, Metadata: p.Metadata})
				where = append(where, [2]int{i, j})
			}
		}
	}
	if len(offs) > 0 {
		t := time.Now()
		got, e := s.txnCoord().TxnOffsetCommit(req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Group, offs)
		c.parkedSince(t) // mostly fsyncs
		for k, w := range where {
			if e != nil {
				codes[w[0]][w[1]] = fencedCode(e, req.Version, 3)
			} else {
				codes[w[0]][w[1]] = got[k]
			}
		}
	}
	for i, t := range req.Topics {
		rt := kmsg.NewTxnOffsetCommitResponseTopic()
		rt.Topic = t.Topic
		for j, p := range t.Partitions {
			rp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, codes[i][j]
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, nil
}
