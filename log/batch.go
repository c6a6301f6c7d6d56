package log

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Kafka v2 RecordBatch header layout (all big-endian). The header is the
// frame: batchLength bounds the batch and the CRC-32C covers bytes 21..end.
//
//	 0  baseOffset            int64   patched by the log on append
//	 8  batchLength           int32   bytes after this field
//	12  partitionLeaderEpoch  int32
//	16  magic                 int8    must be 2
//	17  crc                   uint32  CRC-32C of bytes 21..end
//	21  attributes            int16   codec(0-2) tsType(3) txn(4) control(5)
//	23  lastOffsetDelta       int32
//	27  baseTimestamp         int64
//	35  maxTimestamp          int64
//	43  producerId            int64
//	51  producerEpoch         int16
//	53  baseSequence          int32
//	57  recordCount           int32
//	61  records...
const (
	// BatchHeaderSize is the size of a v2 RecordBatch header.
	BatchHeaderSize = 61
	// lengthFieldEnd is where batchLength is counted from.
	lengthFieldEnd = 12
	crcStart       = 21
	// BatchCRCStart is where the bytes a batch's CRC-32C covers begin.
	BatchCRCStart = crcStart
	// maxBatchSize bounds any batch the engine will frame, whatever the
	// configured max.message.bytes: segment positions are 32-bit.
	maxBatchSize = 1<<31 - 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Codec is the compression codec of a batch (attributes bits 0-2).
type Codec int8

// Kafka's compression codecs.
const (
	CodecNone Codec = iota
	CodecGzip
	CodecSnappy
	CodecLZ4
	CodecZstd
)

func (c Codec) String() string {
	switch c {
	case CodecNone:
		return "none"
	case CodecGzip:
		return "gzip"
	case CodecSnappy:
		return "snappy"
	case CodecLZ4:
		return "lz4"
	case CodecZstd:
		return "zstd"
	}
	return fmt.Sprintf("codec(%d)", int8(c))
}

// BatchHeader is the decoded header of a v2 RecordBatch. It is what the layers
// above need (producer state, timestamps, flags) without touching records.
type BatchHeader struct {
	BaseOffset      int64
	Length          int32 // whole batch in bytes, header included
	LeaderEpoch     int32
	Magic           int8
	CRC             uint32
	Attributes      int16
	LastOffsetDelta int32
	BaseTimestamp   int64
	MaxTimestamp    int64
	ProducerID      int64
	ProducerEpoch   int16
	BaseSequence    int32
	NumRecords      int32
}

// Codec returns the compression codec.
func (h *BatchHeader) Codec() Codec { return Codec(h.Attributes & 0x7) }

// LogAppendTime reports whether the batch uses LogAppendTime timestamps.
func (h *BatchHeader) LogAppendTime() bool { return h.Attributes&0x8 != 0 }

// Transactional reports whether the batch is part of a transaction.
func (h *BatchHeader) Transactional() bool { return h.Attributes&0x10 != 0 }

// Control reports whether the batch is a control batch (commit/abort marker).
func (h *BatchHeader) Control() bool { return h.Attributes&0x20 != 0 }

// LastOffset is the offset of the last record of the batch.
func (h *BatchHeader) LastOffset() int64 { return h.BaseOffset + int64(h.LastOffsetDelta) }

// NextOffset is the offset after the batch.
func (h *BatchHeader) NextOffset() int64 { return h.LastOffset() + 1 }

// ParseBatchHeader decodes the header at the start of b and checks what can be
// checked from the header alone: batchLength bounds and magic 2. b may be
// shorter than the whole batch but must hold BatchHeaderSize bytes.
func ParseBatchHeader(b []byte) (BatchHeader, error) {
	var h BatchHeader
	if len(b) < BatchHeaderSize {
		return h, fmt.Errorf("%w: %d bytes, header needs %d", ErrBatchCorrupt, len(b), BatchHeaderSize)
	}
	be := binary.BigEndian
	h.BaseOffset = int64(be.Uint64(b[0:]))
	bl := int64(int32(be.Uint32(b[8:])))
	if bl < BatchHeaderSize-lengthFieldEnd || bl > maxBatchSize-lengthFieldEnd {
		return h, fmt.Errorf("%w: batchLength %d out of bounds", ErrBatchCorrupt, bl)
	}
	h.Length = int32(bl + lengthFieldEnd)
	h.LeaderEpoch = int32(be.Uint32(b[12:]))
	h.Magic = int8(b[16])
	if h.Magic != 2 {
		return h, fmt.Errorf("%w: magic %d, only v2 record batches are accepted", ErrInvalidBatch, h.Magic)
	}
	h.CRC = be.Uint32(b[17:])
	h.Attributes = int16(be.Uint16(b[21:]))
	h.LastOffsetDelta = int32(be.Uint32(b[23:]))
	h.BaseTimestamp = int64(be.Uint64(b[27:]))
	h.MaxTimestamp = int64(be.Uint64(b[35:]))
	h.ProducerID = int64(be.Uint64(b[43:]))
	h.ProducerEpoch = int16(be.Uint16(b[51:]))
	h.BaseSequence = int32(be.Uint32(b[53:]))
	h.NumRecords = int32(be.Uint32(b[57:]))
	return h, nil
}

// CheckBatch validates b as exactly one v2 RecordBatch as a client sends it:
// framing, magic, CRC-32C, codec, and a record count consistent with
// lastOffsetDelta. maxSize (max.message.bytes) caps the batch size; <= 0 means
// no cap beyond the engine's own. Records are never decompressed.
func CheckBatch(b []byte, maxSize int) (BatchHeader, error) {
	return checkBatch(b, maxSize, checkFields)
}

func checkBatch(b []byte, maxSize int, check func(*BatchHeader) error) (BatchHeader, error) {
	h, err := ParseBatchHeader(b)
	if err != nil {
		return h, err
	}
	if int(h.Length) != len(b) {
		return h, fmt.Errorf("%w: batchLength says %d bytes, got %d", ErrBatchCorrupt, h.Length, len(b))
	}
	if maxSize > 0 && len(b) > maxSize {
		return h, fmt.Errorf("%w: %d bytes, max.message.bytes is %d", ErrBatchTooLarge, len(b), maxSize)
	}
	if crc := crc32.Checksum(b[crcStart:], castagnoli); crc != h.CRC {
		return h, fmt.Errorf("%w: crc32c %08x, header says %08x", ErrBatchCorrupt, crc, h.CRC)
	}
	if err := check(&h); err != nil {
		return h, err
	}
	return h, nil
}

func checkFields(h *BatchHeader) error {
	if h.Codec() > CodecZstd {
		return fmt.Errorf("%w: unknown compression codec %d", ErrInvalidBatch, h.Codec())
	}
	if h.LastOffsetDelta < 0 || h.NumRecords <= 0 || int64(h.NumRecords) != int64(h.LastOffsetDelta)+1 {
		return fmt.Errorf("%w: record count %d inconsistent with lastOffsetDelta %d", ErrInvalidBatch, h.NumRecords, h.LastOffsetDelta)
	}
	// A record takes at least minRecordSize bytes, so a batch cannot claim
	// more records than its bytes could hold (compressed: than any realistic
	// compression ratio could). Without this, a header-only batch could
	// consume 2^31 offsets and force a segment roll per append.
	room := int64(h.Length) - BatchHeaderSize
	if h.Codec() != CodecNone {
		room *= maxCompressionRatio
	}
	if int64(h.NumRecords)*minRecordSize > room {
		return fmt.Errorf("%w: %d records cannot fit in %d bytes", ErrInvalidBatch, h.NumRecords, h.Length)
	}
	return nil
}

const (
	// minRecordSize is the smallest encoded record: length, attributes,
	// timestamp delta, offset delta, key length, value length, header count,
	// one byte each.
	minRecordSize = 7
	// maxCompressionRatio bounds how many record bytes one compressed byte
	// may stand for when counting records without decompressing.
	maxCompressionRatio = 1024
)

// VerifyBatch checks the CRC-32C of a complete stored batch b (header already
// parsed into h).
func VerifyBatch(b []byte, h *BatchHeader) bool {
	return len(b) == int(h.Length) && crc32.Checksum(b[crcStart:], castagnoli) == h.CRC
}

// PatchBaseOffset writes baseOffset into bytes 0..7 of a batch. The CRC does
// not cover these bytes, so the batch stays valid.
func PatchBaseOffset(b []byte, baseOffset int64) {
	binary.BigEndian.PutUint64(b[0:], uint64(baseOffset))
}

// PatchLeaderEpoch writes partitionLeaderEpoch into bytes 12..15 (not covered
// by the CRC).
func PatchLeaderEpoch(b []byte, epoch int32) {
	binary.BigEndian.PutUint32(b[12:], uint32(epoch))
}

// SetLogAppendTime rewrites a batch for a LogAppendTime topic: the timestamp
// type bit is set, baseTimestamp and maxTimestamp become ts, and the CRC is
// recomputed (these bytes are covered by it). Kafka does the same.
func SetLogAppendTime(b []byte, ts int64) {
	be := binary.BigEndian
	be.PutUint16(b[21:], be.Uint16(b[21:])|0x8)
	be.PutUint64(b[27:], uint64(ts))
	be.PutUint64(b[35:], uint64(ts))
	be.PutUint32(b[17:], crc32.Checksum(b[crcStart:], castagnoli))
}

// SetMaxTimestamp sets a batch's MaxTimestamp and recomputes its CRC (the
// broker repairs batches whose header says less than their records).
func SetMaxTimestamp(b []byte, ts int64) {
	binary.BigEndian.PutUint64(b[35:], uint64(ts))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[crcStart:], castagnoli))
}

// ScanBatches walks the stored batches at the start of buf, which must start
// at a batch boundary where nextOffset is expected. It returns the number of
// bytes that form a valid prefix (whole batches, each with a good CRC, magic
// 2 and contiguous offsets), the offset after the last valid batch and the
// greatest max timestamp seen (-1 if none). It never reads past buf.
func ScanBatches(buf []byte, nextOffset int64) (valid int, next int64, maxTs int64) {
	next, maxTs = nextOffset, -1
	for valid+BatchHeaderSize <= len(buf) {
		h, err := ParseBatchHeader(buf[valid:])
		if err != nil || int(h.Length) > len(buf)-valid || h.BaseOffset != next || checkFields(&h) != nil {
			break
		}
		if !VerifyBatch(buf[valid:valid+int(h.Length)], &h) {
			break
		}
		valid += int(h.Length)
		next = h.NextOffset()
		if h.MaxTimestamp > maxTs {
			maxTs = h.MaxTimestamp
		}
	}
	return valid, next, maxTs
}
