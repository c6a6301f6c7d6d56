// Package testbatch builds valid Kafka v2 RecordBatches for tests and
// benchmarks of the log engine, with real record encoding.
package testbatch

import (
	"encoding/binary"
	"hash/crc32"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Options shape a batch.
type Options struct {
	Records       int   // number of records (>= 1)
	ValueSize     int   // bytes of each record value
	Timestamp     int64 // base timestamp; record i gets Timestamp+i
	ProducerID    int64 // -1 for none
	ProducerEpoch int16
	BaseSequence  int32
	Attributes    int16
	Fill          byte // value byte
}

// Make returns one batch with baseOffset 0.
func Make(o Options) []byte {
	if o.Records < 1 {
		o.Records = 1
	}
	var recs []byte
	for i := 0; i < o.Records; i++ {
		var r []byte
		r = append(r, 0)                               // attributes
		r = binary.AppendVarint(r, int64(i))           // timestampDelta
		r = binary.AppendVarint(r, int64(i))           // offsetDelta
		r = binary.AppendVarint(r, -1)                 // key: null
		r = binary.AppendVarint(r, int64(o.ValueSize)) // value length
		for j := 0; j < o.ValueSize; j++ {
			r = append(r, o.Fill+byte(i+j))
		}
		r = binary.AppendUvarint(r, 0) // headers
		recs = binary.AppendVarint(recs, int64(len(r)))
		recs = append(recs, r...)
	}
	b := make([]byte, 61, 61+len(recs))
	be := binary.BigEndian
	be.PutUint32(b[8:], uint32(49+len(recs)))
	b[16] = 2
	be.PutUint16(b[21:], uint16(o.Attributes))
	be.PutUint32(b[23:], uint32(o.Records-1))
	be.PutUint64(b[27:], uint64(o.Timestamp))
	be.PutUint64(b[35:], uint64(o.Timestamp+int64(o.Records-1)))
	pid := o.ProducerID
	if pid == 0 {
		pid = -1
	}
	be.PutUint64(b[43:], uint64(pid))
	be.PutUint16(b[51:], uint16(o.ProducerEpoch))
	be.PutUint32(b[53:], uint32(o.BaseSequence))
	be.PutUint32(b[57:], uint32(o.Records))
	b = append(b, recs...)
	be.PutUint32(b[17:], crc32.Checksum(b[21:], castagnoli))
	return b
}

// Sized returns a batch of one record whose total size is exactly size bytes
// (size >= 72), value bytes derived from seed.
func Sized(size int, ts int64, seed byte) []byte {
	// One record: overhead = 61 header + record framing. Solve for value size.
	for v := size - 61 - 7; v >= 0; v-- {
		b := Make(Options{Records: 1, ValueSize: v, Timestamp: ts, Fill: seed})
		if len(b) == size {
			return b
		}
		if len(b) < size {
			break
		}
	}
	return Make(Options{Records: 1, ValueSize: max(size-80, 0), Timestamp: ts, Fill: seed})
}
