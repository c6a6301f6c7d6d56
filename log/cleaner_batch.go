package log

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// attrDeleteHorizon is KIP-534's attribute bit: the batch's baseTimestamp
// field holds its delete horizon (when its tombstones and, for a control
// batch, its marker may go); record timestamps stay baseTimestamp + delta.
const attrDeleteHorizon = 0x40

// DeleteHorizon returns the batch's KIP-534 delete horizon (ms), if it has
// one.
func (h *BatchHeader) DeleteHorizon() (int64, bool) {
	if h.Attributes&attrDeleteHorizon == 0 {
		return 0, false
	}
	return h.BaseTimestamp, true
}

// cleanRecord is one record of a batch as the cleaner sees it.
type cleanRecord struct {
	attrs    byte
	ts       int64 // absolute timestamp
	offDelta int64
	key      []byte // nil: no key
	hasValue bool
	tail     []byte // the record after its timestamp delta (offset delta .. headers)
	raw      []byte // the whole record, length prefix included
}

var errBadRecord = errors.New("malformed record")

// parseRecords decodes n records from data (a batch's records, decompressed).
func parseRecords(data []byte, n int32, baseTs int64) ([]cleanRecord, error) {
	recs := make([]cleanRecord, 0, n)
	for i := int32(0); i < n; i++ {
		l, k := binary.Varint(data)
		if k <= 0 || l < 0 || int64(len(data)-k) < l {
			return nil, fmt.Errorf("%w: record %d length", errBadRecord, i)
		}
		raw := data[:k+int(l)]
		b := data[k : k+int(l)]
		data = data[k+int(l):]
		if len(b) < 1 {
			return nil, fmt.Errorf("%w: record %d empty", errBadRecord, i)
		}
		r := cleanRecord{attrs: b[0], raw: raw}
		b = b[1:]
		tsd, k := binary.Varint(b)
		if k <= 0 {
			return nil, fmt.Errorf("%w: record %d timestamp", errBadRecord, i)
		}
		b = b[k:]
		r.tail = b
		r.ts = baseTs + tsd
		od, k := binary.Varint(b)
		if k <= 0 {
			return nil, fmt.Errorf("%w: record %d offset delta", errBadRecord, i)
		}
		b = b[k:]
		r.offDelta = od
		kl, k := binary.Varint(b)
		if k <= 0 || kl < -1 || int64(len(b)-k) < kl {
			return nil, fmt.Errorf("%w: record %d key", errBadRecord, i)
		}
		b = b[k:]
		if kl >= 0 {
			r.key = b[:kl:kl]
			if r.key == nil {
				r.key = []byte{}
			}
			b = b[kl:]
		}
		vl, k := binary.Varint(b)
		if k <= 0 || vl < -1 || int64(len(b)-k) < vl {
			return nil, fmt.Errorf("%w: record %d value", errBadRecord, i)
		}
		r.hasValue = vl >= 0
		recs = append(recs, r)
	}
	return recs, nil
}

// batchRecords returns the decoded records of batch b (header h).
func batchRecords(b []byte, h *BatchHeader) ([]cleanRecord, []byte, error) {
	if h.NumRecords == 0 {
		return nil, nil, nil
	}
	data, err := decompressRecords(h.Codec(), b[BatchHeaderSize:])
	if err != nil {
		return nil, nil, fmt.Errorf("decompress batch at offset %d: %w", h.BaseOffset, err)
	}
	recs, err := parseRecords(data, h.NumRecords, h.BaseTimestamp)
	if err != nil {
		return nil, nil, fmt.Errorf("batch at offset %d: %w", h.BaseOffset, err)
	}
	return recs, data, nil
}

// encodeCleanedBatch builds the batch that replaces orig (header h) keeping
// recs, as Kafka's MemoryRecords.filterTo: the same base offset and
// lastOffsetDelta (so the last offset, and the producer's last sequence,
// stay), producer fields, leader epoch, timestamp type and codec; the
// record count, max timestamp (CreateTime) and CRC recomputed. horizon >=
// 0 sets the KIP-534 delete horizon. With no records the batch is a bare
// header (Kafka's empty batch, kept for producer state), uncompressed.
func encodeCleanedBatch(orig []byte, h *BatchHeader, recs []cleanRecord, horizon int64) ([]byte, error) {
	attrs := h.Attributes
	baseTs := h.BaseTimestamp
	if horizon >= 0 {
		attrs |= attrDeleteHorizon
		baseTs = horizon
	}
	maxTs := h.MaxTimestamp
	var body []byte
	if len(recs) > 0 {
		if !h.LogAppendTime() {
			maxTs = recs[0].ts
			for _, r := range recs[1:] {
				maxTs = max(maxTs, r.ts)
			}
		}
		var raw []byte
		for _, r := range recs {
			if baseTs == h.BaseTimestamp {
				raw = append(raw, r.raw...)
				continue
			}
			var rb []byte
			rb = append(rb, r.attrs)
			rb = binary.AppendVarint(rb, r.ts-baseTs)
			rb = append(rb, r.tail...)
			raw = binary.AppendVarint(raw, int64(len(rb)))
			raw = append(raw, rb...)
		}
		var err error
		if body, err = compressRecords(h.Codec(), raw, orig[BatchHeaderSize:]); err != nil {
			return nil, fmt.Errorf("compress batch at offset %d: %w", h.BaseOffset, err)
		}
	} else {
		attrs &^= 0x7 // no records: no codec
	}
	out := make([]byte, BatchHeaderSize, BatchHeaderSize+len(body))
	copy(out, orig[:BatchHeaderSize])
	be := binary.BigEndian
	be.PutUint32(out[8:], uint32(BatchHeaderSize-lengthFieldEnd+len(body)))
	be.PutUint16(out[21:], uint16(attrs))
	be.PutUint64(out[27:], uint64(baseTs))
	be.PutUint64(out[35:], uint64(maxTs))
	be.PutUint32(out[57:], uint32(len(recs)))
	out = append(out, body...)
	be.PutUint32(out[17:], crc32.Checksum(out[crcStart:], castagnoli))
	return out, nil
}

// checkCleanedFields is checkFields for batches of a cleaned segment: the
// record count may be anything from 0 to lastOffsetDelta+1.
func checkCleanedFields(h *BatchHeader) error {
	if h.Codec() > CodecZstd {
		return fmt.Errorf("%w: unknown compression codec %d", ErrInvalidBatch, h.Codec())
	}
	if h.LastOffsetDelta < 0 || h.NumRecords < 0 || int64(h.NumRecords) > int64(h.LastOffsetDelta)+1 {
		return fmt.Errorf("%w: record count %d inconsistent with lastOffsetDelta %d", ErrInvalidBatch, h.NumRecords, h.LastOffsetDelta)
	}
	room := int64(h.Length) - BatchHeaderSize
	if h.Codec() != CodecNone {
		room *= maxCompressionRatio
	}
	if int64(h.NumRecords)*minRecordSize > room {
		return fmt.Errorf("%w: %d records cannot fit in %d bytes", ErrInvalidBatch, h.NumRecords, h.Length)
	}
	return nil
}
