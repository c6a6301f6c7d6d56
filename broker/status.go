package broker

import "context"

// PartitionStatus is one partition's log as the broker holds it: what is on
// local disk and what is in the bucket. `synapse demo` prints it.
type PartitionStatus struct {
	LogStart       int64 `json:"log_start_offset"`   // first offset readable (local or bucket)
	LocalStart     int64 `json:"local_start_offset"` // first offset on local disk
	HighWatermark  int64 `json:"high_watermark"`
	LogEnd         int64 `json:"log_end_offset"`
	LocalSegments  int   `json:"local_segments"`  // the active one too
	SealedSegments int   `json:"sealed_segments"` // sealed and still on local disk
	// TieredSegments and TieredNext describe the partition's manifest in
	// the bucket: how many segments it names and the offset after the last
	// (0 and the log start without tiering or before the first upload).
	TieredSegments int   `json:"tiered_segments"`
	TieredNext     int64 `json:"tiered_next_offset"`
	// ReleasedSegments are the tiered segments wholly below LocalStart:
	// in the bucket only, their local files gone.
	ReleasedSegments int `json:"released_segments"`
}

// PartitionStatus reports partition p of topic; ok is false if there is no
// such partition.
func (s *Server) PartitionStatus(ctx context.Context, topic string, p int32) (st PartitionStatus, ok bool) {
	t := s.reg.get(topic)
	if t == nil {
		return st, false
	}
	part := s.reg.partition(t, p)
	if part == nil || part.log == nil {
		return st, false
	}
	lp := part.log
	st.LogStart, st.LocalStart = lp.LogStartOffset(), lp.LocalStartOffset()
	st.HighWatermark, st.LogEnd = lp.HighWatermark(), lp.LogEndOffset()
	st.LocalSegments, st.SealedSegments = lp.SegmentCount(), len(lp.SealedSegments())
	st.TieredNext = st.LogStart
	if tier := s.cfg.Tier; tier != nil {
		if m, err := tier.Manifest(ctx, part.tierKey()); err == nil {
			st.TieredSegments, st.TieredNext = len(m.Segments), m.Next()
			for _, seg := range m.Segments {
				if seg.Next <= st.LocalStart {
					st.ReleasedSegments++
				}
			}
		}
	}
	return st, true
}
