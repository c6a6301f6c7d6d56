// Package recordlog is the record format of the broker's own state logs
// (the group log, the transaction log): key/value records in uncompressed
// v2 record batches on a log.Partition, written one batch per change and
// replayed from the log start at open.
package recordlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
)

// Record is one key/value record; a nil Value is a tombstone.
type Record struct {
	Key, Value []byte
}

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// Encode builds one uncompressed v2 record batch of recs stamped now.
func Encode(recs []Record, now time.Time) []byte {
	var body []byte
	var scratch []byte
	for i, r := range recs {
		rec := kmsg.Record{
			OffsetDelta: int32(i),
			Key:         r.Key,
			Value:       r.Value,
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

// ErrUnreadable is returned (wrapped) for a log that cannot be parsed.
var ErrUnreadable = errors.New("unreadable state log")

// Replay reads p from its start to its high watermark and calls fn with
// every record in order. The key and value alias a buffer reused for the
// next read: fn copies what it keeps.
func Replay(p *log.Partition, fn func(key, value []byte) error) error {
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
			return fmt.Errorf("%w: no progress at offset %d", ErrUnreadable, off)
		}
		for len(buf) > 0 {
			var b kmsg.RecordBatch
			if err := b.ReadFrom(buf); err != nil {
				return fmt.Errorf("%w: batch at offset %d: %v", ErrUnreadable, off, err)
			}
			n := int(b.Length) + 12
			if n > len(buf) || n < 61 {
				return fmt.Errorf("%w: batch length %d", ErrUnreadable, b.Length)
			}
			buf = buf[n:]
			if b.Attributes&0x07 != 0 {
				return fmt.Errorf("%w: compressed batch at offset %d", ErrUnreadable, b.FirstOffset)
			}
			recs := b.Records
			for i := int32(0); i < b.NumRecords; i++ {
				var r kmsg.Record
				if err := r.ReadFrom(recs); err != nil {
					return fmt.Errorf("%w: record in batch %d: %v", ErrUnreadable, b.FirstOffset, err)
				}
				l := int(r.Length) + varintLen(int64(r.Length))
				if l > len(recs) || l <= 0 {
					return fmt.Errorf("%w: record length in batch %d", ErrUnreadable, b.FirstOffset)
				}
				recs = recs[l:]
				if err := fn(r.Key, r.Value); err != nil {
					return err
				}
			}
		}
		off = next
	}
	return nil
}
