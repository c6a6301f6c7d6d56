package broker

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
)

// OffsetForLeaderEpoch: v0-4
//
// Behavior (Kafka's leader answer, KIP-101/KIP-320):
//   - This broker leads every partition; its leader epoch grows by one on
//     every start (meta.json) and is stamped into every batch it appends, so
//     the log itself is the epoch history: epochs never go down along it.
//     A start never lowers it (raiseLeaderEpoch): it starts above every
//     epoch it finds in a partition's last batch, in a committed offset and
//     in the bucket's copy of meta.json (a data directory restored from the
//     bucket), which is what lets the search below be a binary one.
//   - The requested epoch is the current one: the log end offset (Kafka
//     answers the leader's LEO for its current epoch, not the high
//     watermark).
//   - An older epoch E: the largest epoch <= E in the log with the offset
//     where the next epoch starts (the first batch stamped above E, or the
//     log end offset when none is: the current epoch starts there). With
//     no batch <= E left in the local log, E itself with that offset, as
//     Kafka answers an epoch below its cache's first. Batches moved to the
//     tiered store are not searched: the local log's first batch stands
//     for them.
//   - -1: UNDEFINED (-1 epoch, -1 offset), no error, as Kafka.
//   - An epoch above the current one: the current epoch and the log end
//     offset, no error. Kafka answers UNDEFINED there (its
//     LeaderEpochFileCache.endOffsetFor finds no later epoch), which Java
//     and librdkafka consumers take as a log truncation and reset their
//     position; with one leader, no history diverges from the client's, so
//     everything up to the log end is what it saw. (Such an epoch comes
//     from a broker whose epochs went down, before raiseLeaderEpoch.)
//   - CurrentLeaderEpoch (v2+, -1 is none): older than the broker's is
//     FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH.
//   - Unknown topics and partitions: UNKNOWN_TOPIC_OR_PARTITION; an offline
//     partition: KAFKA_STORAGE_ERROR (a read failing once because
//     retention or the tiering released local segments meanwhile is
//     searched again from the new local start). ReplicaID (v3+) changes nothing (no
//     followers; Kafka too answers every caller as the leader).
//   - __consumer_offsets, when shown (internal_topics.go): partition 0 is an
//     empty log of the current epoch.
//
// ACLs: CLUSTER_ACTION on the cluster allows every topic (brokers' own
// requests); else each topic needs DESCRIBE, else TOPIC_AUTHORIZATION_FAILED
// on its partitions (Kafka's KafkaApis.handleOffsetForLeaderEpochRequest;
// the cluster check is not audited as a denial).
func (s *Server) handleOffsetForLeaderEpoch(c *conn, req *kmsg.OffsetForLeaderEpochRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.OffsetForLeaderEpochResponse)
	z := s.sec.authz
	cluster := z == nil || z.Authorize(c.principal, c.ip, opClusterAction, resCluster, clusterName)
	current := s.meta.m.LeaderEpoch
	for _, rt := range req.Topics {
		st := kmsg.NewOffsetForLeaderEpochResponseTopic()
		st.Topic = rt.Topic
		var code int16
		var t *topic
		virtual := false
		if !cluster && !c.allowed(opDescribe, resTopic, rt.Topic) {
			code = kerr.TopicAuthorizationFailed.Code
		} else if t = s.reg.get(rt.Topic); t == nil {
			code = kerr.UnknownTopicOrPartition.Code
			virtual = s.virtualOffsets(rt.Topic)
		}
		for _, rp := range rt.Partitions {
			if req.Version < 2 {
				rp.CurrentLeaderEpoch = -1 // not sent: not decoded either
			}
			sp := kmsg.NewOffsetForLeaderEpochResponseTopicPartition()
			sp.Partition = rp.Partition
			switch {
			case s.cl != nil && internalTopic(rt.Topic) && code == kerr.UnknownTopicOrPartition.Code:
				// The group or transaction log, replicated in cluster mode.
				if p := s.cl.partitionFor(rt.Topic, rp.Partition); p == nil {
					sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
				} else if lc, r := s.cl.leaderCheck(p, -1); lc != 0 {
					sp.ErrorCode = lc
				} else {
					sp.ErrorCode, sp.LeaderEpoch, sp.EndOffset = epochEndOffset(p.log, rp, r.epoch)
				}
			case virtual && rp.Partition == 0:
				sp.ErrorCode, sp.LeaderEpoch, sp.EndOffset = epochEndOffset(nil, rp, current)
			case t == nil:
				sp.ErrorCode = code
			default:
				p := s.reg.partition(t, rp.Partition)
				if p == nil {
					sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
					break
				}
				cur := current
				if s.cl != nil {
					// The partition's own epoch; only its leader answers.
					lc, r := s.cl.leaderCheck(p, -1)
					if lc != 0 {
						sp.ErrorCode = lc
						break
					}
					cur = r.epoch
				}
				sp.ErrorCode, sp.LeaderEpoch, sp.EndOffset = epochEndOffset(p.log, rp, cur)
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}

// epochEndOffset answers one partition (lp nil: an empty log at offset 0)
// for a broker at leader epoch current: an error code, or the epoch and
// end offset (-1, -1 when the epoch is undefined here).
func epochEndOffset(lp *log.Partition, rp kmsg.OffsetForLeaderEpochRequestTopicPartition, current int32) (int16, int32, int64) {
	if want := rp.CurrentLeaderEpoch; want >= 0 {
		if want < current {
			return kerr.FencedLeaderEpoch.Code, -1, -1
		} else if want > current {
			return kerr.UnknownLeaderEpoch.Code, -1, -1
		}
	}
	var start, end int64
	if lp != nil {
		if lp.Err() != nil {
			return kerr.KafkaStorageError.Code, -1, -1
		}
		start, end = lp.LocalStartOffset(), lp.LogEndOffset()
	}
	e := rp.LeaderEpoch
	switch {
	case e < 0:
		return 0, -1, -1
	case e >= current:
		return 0, current, end // above the current epoch too: see the header
	case lp == nil || start >= end:
		return 0, e, end
	}
	epoch, off, err := searchEpochEnd(lp, e, start, end)
	if err != nil {
		// Retention or the tiering may have released the segments being
		// read: once more from the local start as it is now.
		if start = lp.LocalStartOffset(); start >= end {
			return 0, e, end
		}
		if epoch, off, err = searchEpochEnd(lp, e, start, end); err != nil {
			return kerr.KafkaStorageError.Code, -1, -1
		}
	}
	return 0, epoch, off
}

// scanHeaders is lp.ScanHeaders (a variable for tests).
var scanHeaders = (*log.Partition).ScanHeaders

// searchEpochEnd finds, in the local log [start, end), the end of epoch e
// (below the current one): the base offset of the first batch stamped
// above e (end when none is), and the epoch of the batch before it.
func searchEpochEnd(lp *log.Partition, e int32, start, end int64) (int32, int64, error) {
	// The batch holding off, or the first after it.
	batchAt := func(off int64) (log.BatchHeader, bool, error) {
		var b log.BatchHeader
		found := false
		err := scanHeaders(lp, off, func(h *log.BatchHeader) bool {
			b, found = *h, true
			return false
		})
		return b, found, err
	}
	// Epochs grow along the log: a binary search of batch headers.
	lo, hi := start, end
	for lo < hi {
		mid := lo + (hi-lo)/2
		h, ok, err := batchAt(mid)
		if err != nil {
			return 0, 0, err
		}
		if !ok || h.LeaderEpoch > e {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	next := lo
	if lo < end {
		// A compacted log may have a gap before the batch above e (its
		// first batches cleaned away): epoch e+1 starts at most at that
		// batch. Answering the gap's start would send a follower below
		// what the ISR holds, and a fetch would find it diverging forever.
		h, ok, err := batchAt(lo)
		if err != nil {
			return 0, 0, err
		}
		if ok {
			next = max(lo, h.BaseOffset)
		}
	}
	if lo == start {
		return e, next, nil // no batch of e or older left
	}
	h, ok, err := batchAt(lo - 1)
	if err != nil {
		return 0, 0, err
	}
	floor := h.LeaderEpoch
	if !ok || floor < 0 || floor > e {
		floor = e // unstamped batches (-1): no epoch Kafka would have cached
	}
	return floor, next, nil
}
