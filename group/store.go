package group

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
)

// The group log: committed offsets and group metadata are records in one
// internal partition, written through the same log engine (and the same
// group commit) as user data. Each record's key names what it describes and
// its value is the latest state; a nil value is a tombstone. Loading replays
// the log in order, so the last record of each key wins. The log is
// compacted by appending a snapshot of the live state and moving the log
// start past everything before it (see compact).
//
// Keys and values are JSON: small, stable and readable with
// `synapse inspect dump`. Offset commits are not a hot path (clients commit
// every few seconds), and the batch of one request is one append.

// recKey is a record's key. Kind "o" is a committed offset of
// (Group, Topic, Partition); kind "g" is a group's metadata.
type recKey struct {
	Kind      string `json:"k"`
	Group     string `json:"g"`
	Topic     string `json:"t,omitempty"`
	Partition int32  `json:"p,omitempty"`
}

// offsetValue is a committed offset.
type offsetValue struct {
	Offset      int64  `json:"o"`
	LeaderEpoch int32  `json:"e"`
	Metadata    string `json:"m,omitempty"`
	CommitMs    int64  `json:"c"`
	ExpireMs    int64  `json:"x,omitempty"` // 0: by offsets retention
}

// groupValue is a group's metadata as of its last completed rebalance.
type groupValue struct {
	ProtocolType string        `json:"pt"`
	Protocol     string        `json:"p,omitempty"`
	Generation   int32         `json:"gen"`
	Leader       string        `json:"l,omitempty"`
	StateMs      int64         `json:"s"` // when the group entered its state (Empty: offsets retention counts from here)
	Members      []memberValue `json:"m,omitempty"`
}

type memberValue struct {
	ID               string  `json:"id"`
	InstanceID       *string `json:"iid,omitempty"`
	ClientID         string  `json:"cid"`
	ClientHost       string  `json:"h"`
	SessionTimeout   int32   `json:"st"`
	RebalanceTimeout int32   `json:"rt"`
	Metadata         []byte  `json:"md"` // subscription for the group's protocol
	Assignment       []byte  `json:"a"`
}

// record is one key and value (nil value: tombstone).
type record struct {
	key   recKey
	value []byte
}

func offsetRecord(g, topic string, p int32, v *offsetValue) record {
	r := record{key: recKey{Kind: "o", Group: g, Topic: topic, Partition: p}}
	if v != nil {
		r.value, _ = json.Marshal(v)
	}
	return r
}

func groupRecord(g string, v *groupValue) record {
	r := record{key: recKey{Kind: "g", Group: g}}
	if v != nil {
		r.value, _ = json.Marshal(v)
	}
	return r
}

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// encodeBatch builds one uncompressed v2 record batch of recs.
func encodeBatch(recs []record, now time.Time) []byte {
	var body []byte
	var scratch []byte
	for i, r := range recs {
		k, _ := json.Marshal(r.key)
		rec := kmsg.Record{
			OffsetDelta: int32(i),
			Key:         k,
			Value:       r.value,
		}
		// Length (a varint) is the size of the rest of the record: encode
		// with a zero length (one byte), then write the real length in its
		// place.
		enc := rec.AppendTo(scratch[:0])
		body = binary.AppendVarint(body, int64(len(enc)-1))
		body = append(body, enc[1:]...)
		scratch = enc
	}
	ms := now.UnixMilli()
	b := kmsg.RecordBatch{
		FirstOffset:          0,
		PartitionLeaderEpoch: -1,
		Magic:                2,
		LastOffsetDelta:      int32(len(recs) - 1),
		FirstTimestamp:       ms,
		MaxTimestamp:         ms,
		ProducerID:           -1,
		ProducerEpoch:        -1,
		FirstSequence:        -1,
		NumRecords:           int32(len(recs)),
		Records:              body,
	}
	out := b.AppendTo(nil)
	// Length counts from after itself (offset 12); the CRC covers from the
	// attributes (offset 21) to the end.
	binary.BigEndian.PutUint32(out[8:], uint32(len(out)-12))
	binary.BigEndian.PutUint32(out[17:], crc32.Checksum(out[21:], crc32c))
	return out
}

func varintLen(v int64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutVarint(buf[:], v)
}

// errLoad is returned for a group log that cannot be parsed.
var errLoad = errors.New("group: unreadable group log")

// replay reads the log from its start to its high watermark and calls fn
// with every record in order.
func replay(p *log.Partition, fn func(k recKey, v []byte) error) error {
	off := p.LogStartOffset()
	var buf []byte
	for off < p.HighWatermark() {
		rr, err := p.Read(off, 4<<20)
		if err != nil {
			return err
		}
		buf, err = rr.AppendTo(buf[:0])
		next := rr.NextOffset
		rr.Release()
		if err != nil {
			return err
		}
		if next <= off {
			return fmt.Errorf("%w: no progress at offset %d", errLoad, off)
		}
		for len(buf) > 0 {
			var b kmsg.RecordBatch
			if err := b.ReadFrom(buf); err != nil {
				return fmt.Errorf("%w: batch at offset %d: %v", errLoad, off, err)
			}
			n := int(b.Length) + 12
			if n > len(buf) || n < 61 {
				return fmt.Errorf("%w: batch length %d", errLoad, b.Length)
			}
			buf = buf[n:]
			if b.Attributes&0x07 != 0 {
				return fmt.Errorf("%w: compressed batch at offset %d", errLoad, b.FirstOffset)
			}
			recs := b.Records
			for i := int32(0); i < b.NumRecords; i++ {
				var r kmsg.Record
				if err := r.ReadFrom(recs); err != nil {
					return fmt.Errorf("%w: record in batch %d: %v", errLoad, b.FirstOffset, err)
				}
				l := int(r.Length) + varintLen(int64(r.Length))
				if l > len(recs) || l <= 0 {
					return fmt.Errorf("%w: record length in batch %d", errLoad, b.FirstOffset)
				}
				recs = recs[l:]
				var k recKey
				if err := json.Unmarshal(r.Key, &k); err != nil {
					return fmt.Errorf("%w: key in batch %d: %v", errLoad, b.FirstOffset, err)
				}
				if err := fn(k, r.Value); err != nil {
					return err
				}
			}
		}
		off = next
	}
	return nil
}
