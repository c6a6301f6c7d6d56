package broker

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
)

// ListOffsets: v0-9
//
// Behavior:
//
//   - -2 (earliest): the log start offset. -1 (latest): the high watermark,
//     or with read_committed (v2+) the last stable offset.
//
//   - -3 (max timestamp, v7+): the first record holding the greatest timestamp.
//
//   - -4 (earliest local, KIP-405): the first offset in local segments.
//
//   - -5 (latest tiered, KIP-1005): the last offset in the bucket, -1 if none.
//
//   - With tiering, timestamps are looked up in the bucket's segments first
//     (by their max timestamps in the manifest), then locally.
//
//   - t >= 0: the first record whose timestamp is >= t, with its timestamp;
//     offset -1 and timestamp -1 if none. The index finds the batch; that one
//     batch is read (and decompressed if it must be, bounded) to find the
//     record.
//
//   - A partition named more than once: INVALID_REQUEST for each of its
//     entries, as Kafka answers.
//
// Version notes:
//   - v0: the answer is in OldStyleOffsets.
//   - v4+: the leader epoch is the broker's current epoch.
func (s *Server) handleListOffsets(c *conn, req *kmsg.ListOffsetsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
	// One deadline for the request's reads from the bucket (uncached
	// manifests, timestamp lookups), not one per partition.
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	dups := duplicatePartitions(req)
	resp.Topics = make([]kmsg.ListOffsetsResponseTopic, 0, len(req.Topics))
	for _, rt := range req.Topics {
		st := kmsg.NewListOffsetsResponseTopic()
		st.Topic = rt.Topic
		st.Partitions = make([]kmsg.ListOffsetsResponseTopicPartition, 0, len(rt.Partitions))
		t := s.reg.get(rt.Topic)
		denied := !c.allowed(opDescribe, resTopic, rt.Topic)
		for _, rp := range rt.Partitions {
			sp := kmsg.NewListOffsetsResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.Timestamp, sp.Offset, sp.LeaderEpoch = -1, -1, s.meta.m.LeaderEpoch
			if denied {
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
				continue
			}
			if t == nil && rp.Partition == 0 && s.virtualOffsets(rt.Topic) {
				sp.Offset = 0 // the virtual offsets topic is empty
				if req.Version == 0 {
					sp.OldStyleOffsets = []int64{0}
				}
				st.Partitions = append(st.Partitions, sp)
				continue
			}
			var p *partition
			if t != nil {
				p = s.reg.partition(t, rp.Partition)
			}
			if p == nil || dups[topicPartition{rt.Topic, rp.Partition}] {
				sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
				if p != nil {
					sp.ErrorCode = kerr.InvalidRequest.Code
				}
				st.Partitions = append(st.Partitions, sp)
				continue
			}
			if s.cl != nil {
				if lc, _ := s.cl.leaderCheck(p, rp.CurrentLeaderEpoch); lc != 0 {
					sp.ErrorCode = lc
					st.Partitions = append(st.Partitions, sp)
					continue
				}
				sp.LeaderEpoch = roleOf(p).epoch
			}
			off, ts, code := s.listOffset(ctx, p, rp.Timestamp, req.Version >= 2 && req.IsolationLevel == 1)
			sp.ErrorCode, sp.Offset, sp.Timestamp = code, off, ts
			if req.Version == 0 && code == 0 && off >= 0 {
				sp.OldStyleOffsets = []int64{off}
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp, nil
}

type topicPartition struct {
	topic     string
	partition int32
}

// duplicatePartitions returns the partitions a ListOffsets names more than
// once (nil if none): Kafka answers each of their entries INVALID_REQUEST
// rather than looking them up again and again. A bitset per topic keeps a
// request for every partition of every topic from building a map entry per
// partition.
func duplicatePartitions(req *kmsg.ListOffsetsRequest) map[topicPartition]bool {
	n := 0
	for _, rt := range req.Topics {
		n += len(rt.Partitions)
	}
	if n < 2 {
		return nil
	}
	bits := make(map[string][]uint64, len(req.Topics))
	var odd map[topicPartition]bool // partition numbers no topic can have
	var dups map[topicPartition]bool
	dup := func(k topicPartition) {
		if dups == nil {
			dups = map[topicPartition]bool{}
		}
		dups[k] = true
	}
	for _, rt := range req.Topics {
		b := bits[rt.Topic]
		for _, rp := range rt.Partitions {
			i := rp.Partition
			if i < 0 || i >= maxPartitions {
				k := topicPartition{rt.Topic, i}
				if odd[k] {
					dup(k)
				}
				if odd == nil {
					odd = map[topicPartition]bool{}
				}
				odd[k] = true
				continue
			}
			w, m := int(i/64), uint64(1)<<(i%64)
			for len(b) <= w {
				b = append(b, 0)
			}
			if b[w]&m != 0 {
				dup(topicPartition{rt.Topic, i})
			}
			b[w] |= m
		}
		bits[rt.Topic] = b
	}
	return dups
}

func (s *Server) listOffset(ctx context.Context, p *partition, ts int64, committed bool) (offset, timestamp int64, code int16) {
	lp := p.log
	if err := lp.Err(); err != nil {
		return -1, -1, s.errorCode(err)
	}
	switch ts {
	case -2:
		return lp.LogStartOffset(), -1, 0
	case -1:
		if committed {
			return p.lastStable(lp.HighWatermark()), -1, 0
		}
		return lp.HighWatermark(), -1, 0
	case -3:
		return s.maxTimestampOffset(lp)
	case -4: // earliest local (KIP-405)
		return lp.LocalStartOffset(), -1, 0
	case -5: // latest tiered (KIP-1005): the last offset in the bucket, -1 if none
		if s.cfg.Tier == nil {
			return -1, -1, 0
		}
		m, err := s.cfg.Tier.Manifest(ctx, p.tierKey()) // cached unless just restarted
		if err != nil {
			return -1, -1, kerr.KafkaStorageError.Code
		}
		if len(m.Segments) == 0 {
			return -1, -1, 0
		}
		return m.Next() - 1, -1, 0
	}
	if ts < 0 {
		return -1, -1, kerr.UnsupportedVersion.Code
	}
	if s.cfg.Tier != nil && lp.LogStartOffset() < lp.LocalStartOffset() {
		// Older data may be in the bucket: look there first.
		b, err := s.cfg.Tier.BatchForTimestamp(ctx, p.tierKey(), ts)
		if err != nil {
			return -1, -1, kerr.KafkaStorageError.Code
		}
		if b != nil {
			if r, ok, _ := findRecord(b, lp.LogStartOffset(), atOrAfter(ts)); ok {
				return r.offset, r.ts, 0
			}
			h, _ := log.ParseBatchHeader(b)
			return max(h.BaseOffset, lp.LogStartOffset()), h.MaxTimestamp, 0
		}
	}
	off, mts, ok, err := lp.OffsetForTimestamp(ts)
	if err != nil {
		return -1, -1, s.errorCode(err)
	}
	if !ok {
		return -1, -1, 0
	}
	// Refine to the record: the first one at or after ts, at or after the
	// log start.
	ls := lp.LogStartOffset()
	if b, err := readBatch(lp, off); err == nil {
		if r, ok, _ := findRecord(b, ls, atOrAfter(ts)); ok {
			return r.offset, r.ts, 0
		}
	}
	return off, mts, 0
}

// atOrAfter matches a record timestamp at or after ts.
func atOrAfter(ts int64) func(int64) bool { return func(t int64) bool { return t >= ts } }

// readBatch returns the stored batch holding off.
func readBatch(lp *log.Partition, off int64) ([]byte, error) {
	res, err := lp.Read(off, 1)
	if err != nil {
		return nil, err
	}
	defer res.Release()
	if len(res.Chunks) == 0 {
		return nil, log.ErrOffsetOutOfRange
	}
	c := res.Chunks[0]
	b := make([]byte, c.Len)
	if _, err := c.File().ReadAt(b, c.Pos); err != nil {
		return nil, err
	}
	h, err := log.ParseBatchHeader(b)
	if err != nil {
		return nil, err
	}
	return b[:h.Length], nil
}

// maxTimestampOffset finds the first batch carrying the greatest timestamp.
func (s *Server) maxTimestampOffset(lp *log.Partition) (int64, int64, int16) {
	best, bestTs := int64(-1), int64(-1)
	hw := lp.HighWatermark()
	err := lp.ScanHeaders(lp.LogStartOffset(), func(h *log.BatchHeader) bool {
		if h.BaseOffset >= hw {
			return false
		}
		if h.MaxTimestamp > bestTs {
			best, bestTs = max(h.BaseOffset, lp.LogStartOffset()), h.MaxTimestamp
		}
		return true
	})
	if err != nil {
		return -1, -1, s.errorCode(err)
	}
	if best < 0 {
		return -1, -1, 0
	}
	if b, err := readBatch(lp, best); err == nil {
		if r, ok, _ := findRecord(b, lp.LogStartOffset(), func(ts int64) bool { return ts == bestTs }); ok {
			return r.offset, r.ts, 0
		}
	}
	return best, bestTs, 0
}
