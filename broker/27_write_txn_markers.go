package broker

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/txn"
)

// handleWriteTxnMarkers serves WriteTxnMarkers (key 27): a transaction
// coordinator's COMMIT or ABORT markers for the partitions this broker
// leads. It is an inter-broker request.
//
// Behavior:
//   - Each marker is written where its producer has a transaction open,
//     and answered once it is durable (in a cluster: held by the ISR).
//     Where none is open (a retry) nothing is written.
//   - In a cluster a coordinator whose epoch is below the transaction
//     log's leader epoch gets TRANSACTION_COORDINATOR_FENCED; a partition
//     this broker does not lead, NOT_LEADER_OR_FOLLOWER.
//   - One broker coordinates its own transactions: its markers never come
//     this way, and a request is served against its partitions as is.
//   - Needs CLUSTER_ACTION on the cluster (else CLUSTER_AUTHORIZATION_FAILED
//     for every partition), as Kafka.
func (s *Server) handleWriteTxnMarkers(c *conn, req *kmsg.WriteTxnMarkersRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.WriteTxnMarkersResponse)
	allowed := c.allowedCluster(opClusterAction)
	for _, m := range req.Markers {
		rm := kmsg.NewWriteTxnMarkersResponseMarker()
		rm.ProducerID = m.ProducerID
		for _, t := range m.Topics {
			rt := kmsg.NewWriteTxnMarkersResponseMarkerTopic()
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewWriteTxnMarkersResponseMarkerTopicPartition()
				rp.Partition = p
				tp := txn.TP{Topic: t.Topic, Partition: p}
				switch {
				case !allowed:
					rp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
				case s.cl != nil:
					rp.ErrorCode = s.cl.leaderMarker(m.CoordinatorEpoch, m.ProducerID, m.ProducerEpoch, m.Committed, tp)
				default:
					rp.ErrorCode = s.localMarker(m.ProducerID, m.ProducerEpoch, m.Committed, tp)
				}
				rt.Partitions = append(rt.Partitions, rp)
			}
			rm.Topics = append(rm.Topics, rt)
		}
		resp.Markers = append(resp.Markers, rm)
	}
	return resp, nil
}

// localMarker writes one marker on a single broker and waits until it is
// durable: 0 or a Kafka error code.
func (s *Server) localMarker(pid int64, pe int16, commit bool, tp txn.TP) int16 {
	p := s.txnPartition(tp)
	if p == nil {
		return kerr.UnknownTopicOrPartition.Code
	}
	next, err := p.writeMarker(pid, pe, commit, s.cfg.Now().UnixMilli(), s.meta.m.LeaderEpoch, -1)
	if err == nil && next > 0 {
		err = p.log.WaitDurable(next)
	}
	return s.errorCode(err)
}
