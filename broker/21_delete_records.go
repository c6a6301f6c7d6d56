package broker

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DeleteRecords: v0-2
//
// Behavior:
//   - Moves the partition's log start offset to the given offset (-1: the
//     high watermark), durably; whole segments below it are deleted. An
//     offset above the high watermark is OFFSET_OUT_OF_RANGE.
//   - The response's low watermark is the new log start offset.
func (s *Server) handleDeleteRecords(c *conn, req *kmsg.DeleteRecordsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DeleteRecordsResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewDeleteRecordsResponseTopic()
		st.Topic = rt.Topic
		t := s.reg.get(rt.Topic)
		denied := !c.allowed(opDelete, resTopic, rt.Topic)
		for _, rp := range rt.Partitions {
			sp := kmsg.NewDeleteRecordsResponseTopicPartition()
			sp.Partition, sp.LowWatermark = rp.Partition, -1
			var p *partition
			if t != nil {
				p = s.reg.partition(t, rp.Partition)
			}
			if denied {
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
			} else if p == nil {
				sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
			} else if lc := s.leaderCode(p); lc != 0 {
				sp.ErrorCode = lc // cluster mode: the leader deletes; followers follow its log start
			} else if lw, err := p.log.DeleteRecordsBefore(rp.Offset); err != nil {
				sp.ErrorCode = s.errorCode(err)
			} else {
				sp.LowWatermark = lw
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}
