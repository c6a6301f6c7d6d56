package protocol

import (
	"encoding/binary"
	"fmt"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Hole is where a partition's record bytes go in an encoded fetch response:
// the encoder wrote the length prefix, the caller supplies Len bytes at At
// (typically straight from a segment file with sendfile).
type Hole struct {
	At     int // offset in the encoded buffer
	Topic  int // index in resp.Topics
	Part   int // index in that topic's Partitions
	Length int64
}

// AppendFetchResponse encodes a whole fetch response frame (size,
// correlation id, header, body) like AppendResponse, except that each
// partition's record bytes are left out: recLen(topic, partition) gives their
// length (-1 for null) and the returned holes say where they belong. The size
// prefix already counts them. resp's RecordBatches fields are ignored.
//
// It mirrors kmsg's FetchResponse.AppendTo for versions 4-17 and relies on
// the fields Synapse never sets staying at their defaults (no aborted
// transactions list other than null, no diverging epoch, current leader,
// snapshot id or node endpoints tags). A differential test compares it with
// kmsg for every version.
func AppendFetchResponse(dst []byte, correlationID int32, resp *kmsg.FetchResponse, recLen func(topic, part int) int64) ([]byte, []Hole, error) {
	v := resp.Version
	if v < 4 || v > 17 {
		return dst, nil, fmt.Errorf("protocol: fetch encoder does not speak v%d", v)
	}
	flex := v >= 12
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(correlationID))
	if flex {
		dst = append(dst, 0)
	}
	dst = kbin.AppendInt32(dst, resp.ThrottleMillis)
	if v >= 7 {
		dst = kbin.AppendInt16(dst, resp.ErrorCode)
		dst = kbin.AppendInt32(dst, resp.SessionID)
	}
	var holes []Hole
	var extra int64
	dst = appendArrayLen(dst, len(resp.Topics), flex)
	for ti := range resp.Topics {
		t := &resp.Topics[ti]
		if v <= 12 {
			if flex {
				dst = kbin.AppendCompactString(dst, t.Topic)
			} else {
				dst = kbin.AppendString(dst, t.Topic)
			}
		} else {
			dst = append(dst, t.TopicID[:]...)
		}
		dst = appendArrayLen(dst, len(t.Partitions), flex)
		for pi := range t.Partitions {
			p := &t.Partitions[pi]
			if p.DivergingEpoch.Epoch != -1 || p.DivergingEpoch.EndOffset != -1 ||
				p.CurrentLeader.LeaderID != -1 || p.CurrentLeader.LeaderEpoch != -1 ||
				p.SnapshotID.EndOffset != -1 || p.SnapshotID.Epoch != -1 || p.UnknownTags.Len() > 0 {
				return dst[:start], nil, fmt.Errorf("protocol: fetch encoder: partition sets fields it does not encode")
			}
			dst = kbin.AppendInt32(dst, p.Partition)
			dst = kbin.AppendInt16(dst, p.ErrorCode)
			dst = kbin.AppendInt64(dst, p.HighWatermark)
			dst = kbin.AppendInt64(dst, p.LastStableOffset)
			if v >= 5 {
				dst = kbin.AppendInt64(dst, p.LogStartOffset)
			}
			// Aborted transactions (read_committed): null when none.
			switch {
			case len(p.AbortedTransactions) > 0:
				dst = appendArrayLen(dst, len(p.AbortedTransactions), flex)
				for _, a := range p.AbortedTransactions {
					if a.UnknownTags.Len() > 0 {
						return dst[:start], nil, fmt.Errorf("protocol: fetch encoder: aborted transaction tags")
					}
					dst = kbin.AppendInt64(dst, a.ProducerID)
					dst = kbin.AppendInt64(dst, a.FirstOffset)
					if flex {
						dst = append(dst, 0) // no tags
					}
				}
			case flex:
				dst = kbin.AppendUvarint(dst, 0)
			default:
				dst = kbin.AppendInt32(dst, -1)
			}
			if v >= 11 {
				dst = kbin.AppendInt32(dst, p.PreferredReadReplica)
			}
			n := recLen(ti, pi)
			switch {
			case n < 0 && flex:
				dst = kbin.AppendUvarint(dst, 0)
			case n < 0:
				dst = kbin.AppendInt32(dst, -1)
			case flex:
				dst = kbin.AppendUvarint(dst, uint32(n+1))
			default:
				dst = kbin.AppendInt32(dst, int32(n))
			}
			if n > 0 {
				holes = append(holes, Hole{At: len(dst), Topic: ti, Part: pi, Length: n})
				extra += n
			}
			if flex {
				dst = append(dst, 0) // no partition tags
			}
		}
		if flex {
			if t.UnknownTags.Len() > 0 {
				return dst[:start], nil, fmt.Errorf("protocol: fetch encoder: topic tags")
			}
			dst = append(dst, 0)
		}
	}
	if flex {
		if len(resp.Brokers) > 0 || resp.UnknownTags.Len() > 0 {
			return dst[:start], nil, fmt.Errorf("protocol: fetch encoder: response tags")
		}
		dst = append(dst, 0)
	}
	size := int64(len(dst)-start-4) + extra
	if size > 1<<31-1 {
		return dst[:start], nil, fmt.Errorf("protocol: fetch response of %d bytes", size)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(size))
	return dst, holes, nil
}

func appendArrayLen(dst []byte, n int, flex bool) []byte {
	if flex {
		return kbin.AppendCompactArrayLen(dst, n)
	}
	return kbin.AppendArrayLen(dst, n)
}
