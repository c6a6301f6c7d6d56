package broker

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DescribeProducers: v0
//
// Behavior:
//   - For each partition, the producers whose idempotence state it keeps:
//     producer id, epoch, last sequence and append time, and the first
//     offset of its open transaction there (-1 if none). Coordinator epoch
//     is -1 (one coordinator, never moved).
//   - Unknown topic or partition: UNKNOWN_TOPIC_OR_PARTITION.
//   - With ACLs: READ on each topic (TOPIC_AUTHORIZATION_FAILED).
func (s *Server) handleDescribeProducers(c *conn, req *kmsg.DescribeProducersRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DescribeProducersResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewDescribeProducersResponseTopic()
		st.Topic = rt.Topic
		allowed := c.allowed(opRead, resTopic, rt.Topic)
		t := s.reg.get(rt.Topic)
		for _, pi := range rt.Partitions {
			sp := kmsg.NewDescribeProducersResponseTopicPartition()
			sp.Partition = pi
			var p *partition
			if t != nil {
				p = s.reg.partition(t, pi)
			}
			switch {
			case !allowed:
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
			case p == nil:
				sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
			default:
				sp.ActiveProducers = p.activeProducers()
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}

// activeProducers lists the partition's producer state for
// DescribeProducers.
func (p *partition) activeProducers() []kmsg.DescribeProducersResponseTopicPartitionActiveProducer {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]kmsg.DescribeProducersResponseTopicPartitionActiveProducer, 0, len(p.producers))
	for id, st := range p.producers {
		ap := kmsg.NewDescribeProducersResponseTopicPartitionActiveProducer()
		ap.ProducerID, ap.ProducerEpoch, ap.LastSequence, ap.LastTimestamp = id, int32(st.Epoch), -1, st.LastMs
		if n := len(st.Batches); n > 0 {
			ap.LastSequence = st.Batches[n-1].LastSeq
		}
		if st.LastMs == 0 {
			ap.LastTimestamp = -1
		}
		ap.CoordinatorEpoch = -1
		ap.CurrentTxnStartOffset = -1
		if first, ok := p.txnOpen[id]; ok {
			ap.CurrentTxnStartOffset = first
		}
		out = append(out, ap)
	}
	return out
}
