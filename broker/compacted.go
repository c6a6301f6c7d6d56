package broker

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
)

// Keys on compacted topics. A topic whose cleanup.policy includes compact
// keeps the latest record per key, so, as Kafka's LogValidator does, a
// produced batch holding any record without a key (a null key; an empty
// one is a key) is refused whole: INVALID_RECORD, the records named in
// RecordErrors (Produce v8+) and the partition's ErrorMessage, nothing
// appended. Every record is read, so a compressed batch is decompressed:
// streamed through a small buffer, at most maxDecompressed bytes of it
// (past that the batch is refused), and only on compacted topics: other
// topics never get here.

// maxRecordErrors bounds how many records a refusal names: a compressed
// batch may hold millions of keyless records, Kafka would name them all
// (some 90 bytes each in the response). The ErrorMessage still counts them
// all; clients fail the records not named with a generic message.
const maxRecordErrors = 1000

// recordErrors is a batch refused for some of its records: INVALID_RECORD
// (it wraps log.ErrInvalidBatch), the message Kafka's ErrorMessage, and
// records the RecordErrors of the answer.
type recordErrors struct {
	msg     string
	records []kmsg.ProduceResponseTopicPartitionErrorRecord
}

func (e *recordErrors) Error() string { return e.msg }
func (e *recordErrors) Unwrap() error { return log.ErrInvalidBatch }

// errRecords: a batch whose records do not read (INVALID_RECORD).
var errRecords = errors.New("records do not read")

// checkKeys refuses batch (one whole batch, header h, of topic partition
// tp) if a record has no key. A batch above maxBytes (max.message.bytes)
// is left to the append to refuse (MESSAGE_TOO_LARGE, as Kafka checks the
// size first), a corrupt one is answered as such (CORRUPT_MESSAGE, Kafka
// checks the CRC first): the CRC is computed only when the batch would be
// refused, the append checks it otherwise.
func checkKeys(batch []byte, h *log.BatchHeader, maxBytes int, topic string, partition int32) error {
	if int(h.Length) != len(batch) || len(batch) > maxBytes {
		return nil // the append refuses it
	}
	var keyless []int32
	total := 0
	err := eachKeyless(batch, h, func(i int32) {
		total++
		if len(keyless) < maxRecordErrors {
			keyless = append(keyless, i)
		}
	})
	if err == nil && total == 0 {
		return nil
	}
	if _, cerr := log.CheckBatch(batch, 0); cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("%w: %w", log.ErrInvalidBatch, err)
	}
	msg := kmsg.StringPtr("Compacted topic cannot accept message without key in topic partition " + topic + "-" + strconv.Itoa(int(partition)) + ".")
	e := &recordErrors{records: make([]kmsg.ProduceResponseTopicPartitionErrorRecord, len(keyless))}
	var first strings.Builder
	for i, idx := range keyless {
		e.records[i] = kmsg.ProduceResponseTopicPartitionErrorRecord{RelativeOffset: idx, ErrorMessage: msg}
		if i < 3 {
			if i > 0 {
				first.WriteString(", ")
			}
			fmt.Fprintf(&first, "RecordError(batchIndex=%d, message='%s')", idx, *msg)
		}
	}
	e.msg = fmt.Sprintf("One or more records have been rejected due to %d record errors in total, and only showing the first three errors at most: [%s]", total, first.String())
	return e
}

// recordSource is what the record walk reads: a batch's records, in
// place or decompressing.
type recordSource interface {
	io.ByteReader
	Discard(n int) (int, error)
}

// sliceSource reads records in place.
type sliceSource struct{ b []byte }

func (s *sliceSource) ReadByte() (byte, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c, nil
}

func (s *sliceSource) Discard(n int) (int, error) {
	if n > len(s.b) {
		n = len(s.b)
		s.b = nil
		return n, io.EOF
	}
	s.b = s.b[n:]
	return n, nil
}

// bufReaders buffer decompressed records for the walk.
var bufReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}

// eachKeyless calls keyless with the index in the batch of each record
// without a key. A compressed batch is decompressed as it is read, through
// a 16 KiB buffer, up to maxDecompressed bytes.
func eachKeyless(batch []byte, h *log.BatchHeader, keyless func(i int32)) error {
	recs := batch[log.BatchHeaderSize:h.Length]
	var src recordSource
	var limited *io.LimitedReader
	switch h.Codec() {
	case log.CodecNone:
		src = &sliceSource{recs}
	case log.CodecSnappy:
		b, err := unsnappy(recs) // bounded by maxDecompressed
		if err != nil {
			return err
		}
		src = &sliceSource{b}
	default:
		r, done, err := openCompressed(h.Codec(), recs)
		if err != nil {
			return err
		}
		defer done()
		limited = &io.LimitedReader{R: r, N: maxDecompressed}
		br := bufReaders.Get().(*bufio.Reader)
		br.Reset(limited)
		defer func() { br.Reset(nil); bufReaders.Put(br) }()
		src = br
	}
	for i := int32(0); i < h.NumRecords; i++ {
		if err := nextRecord(src, i, keyless); err != nil {
			if limited != nil && limited.N == 0 {
				return fmt.Errorf("%w: more than %d bytes", errDecompress, maxDecompressed)
			}
			return err
		}
	}
	return nil
}

// nextRecord reads record i from src up to its key length and skips the
// rest of it.
func nextRecord(src recordSource, i int32, keyless func(int32)) error {
	length, _, err := readVarint(src)
	if err != nil || length < 1 || length > maxDecompressed {
		return fmt.Errorf("%w: record %d: bad length", errRecords, i)
	}
	if _, err := src.ReadByte(); err != nil { // attributes
		return fmt.Errorf("%w: record %d: %v", errRecords, i, err)
	}
	used := int64(1)
	var keyLen int64
	for range 3 { // timestamp delta, offset delta, key length
		v, n, err := readVarint(src)
		if err != nil {
			return fmt.Errorf("%w: record %d: %v", errRecords, i, err)
		}
		used += int64(n)
		keyLen = v
	}
	rest := length - used
	if rest < 0 || keyLen > rest {
		return fmt.Errorf("%w: record %d: fields overrun its length %d", errRecords, i, length)
	}
	if keyLen < 0 {
		keyless(i)
	}
	if _, err := src.Discard(int(rest)); err != nil {
		return fmt.Errorf("%w: record %d: %v", errRecords, i, err)
	}
	return nil
}

// readVarint reads a zig-zag varint (as records encode their fields) and
// how many bytes it took.
func readVarint(r io.ByteReader) (int64, int, error) {
	var ux uint64
	for i, shift := 0, uint(0); i < 10; i, shift = i+1, shift+7 {
		b, err := r.ReadByte()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, i, err
		}
		ux |= uint64(b&0x7f) << shift
		if b < 0x80 {
			x := int64(ux >> 1)
			if ux&1 != 0 {
				x = ^x
			}
			return x, i + 1, nil
		}
	}
	return 0, 10, errors.New("varint overflows")
}
