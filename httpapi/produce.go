package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/crc32"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// record is one record to produce. Nil Key or Value is null.
type record struct {
	Key, Value []byte
	Headers    []header
	Timestamp  int64 // ms; 0: now
}

type header struct {
	Key   string
	Value []byte
}

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// batchHeader is the size of a v2 record batch's header (baseOffset to
// recordCount).
const batchHeader = 61

// encodeBatch builds one uncompressed v2 record batch of recs (no
// producer id: the API's produce is not idempotent, as a retried HTTP POST
// cannot be told from a new one). Records are encoded in place after the
// header, which is filled last.
func encodeBatch(recs []record, now time.Time) []byte {
	ms := now.UnixMilli()
	first, maxTS := int64(math.MaxInt64), int64(math.MinInt64)
	size := batchHeader
	for _, r := range recs {
		ts := r.Timestamp
		if ts == 0 {
			ts = ms
		}
		first, maxTS = min(first, ts), max(maxTS, ts)
		size += 32 + len(r.Key) + len(r.Value)
		for _, h := range r.Headers {
			size += 10 + len(h.Key) + len(h.Value)
		}
	}
	out := make([]byte, batchHeader, size)
	var scratch []byte
	for i, r := range recs {
		ts := r.Timestamp
		if ts == 0 {
			ts = ms
		}
		rec := kmsg.Record{
			TimestampDelta64: ts - first,
			OffsetDelta:      int32(i),
			Key:              r.Key,
			Value:            r.Value,
		}
		for _, h := range r.Headers {
			rec.Headers = append(rec.Headers, kmsg.Header{Key: h.Key, Value: h.Value})
		}
		if len(r.Headers) == 0 {
			// The common case, encoded in place: the record's length,
			// then its fields as kmsg.Record encodes them.
			out = binary.AppendVarint(out, int64(recordBodyLen(&rec)))
			out = append(out, 0) // attributes
			out = binary.AppendVarint(out, rec.TimestampDelta64)
			out = binary.AppendVarint(out, int64(rec.OffsetDelta))
			out = appendNullable(out, rec.Key)
			out = appendNullable(out, rec.Value)
			out = append(out, 0) // no headers
			continue
		}
		// Length is the size of the rest of the record: encode with a
		// zero length (one byte), then write the real one before it.
		scratch = rec.AppendTo(scratch[:0])
		out = binary.AppendVarint(out, int64(len(scratch)-1))
		out = append(out, scratch[1:]...)
	}
	be := binary.BigEndian
	be.PutUint64(out[0:], 0)                   // base offset
	be.PutUint32(out[8:], uint32(len(out)-12)) // length, from after itself
	be.PutUint32(out[12:], math.MaxUint32)     // partition leader epoch -1
	out[16] = 2                                // magic
	be.PutUint16(out[21:], 0)                  // attributes: no compression, not transactional
	be.PutUint32(out[23:], uint32(len(recs)-1))
	be.PutUint64(out[27:], uint64(first))
	be.PutUint64(out[35:], uint64(maxTS))
	be.PutUint64(out[43:], math.MaxUint64) // producer id -1
	be.PutUint16(out[51:], math.MaxUint16) // producer epoch -1
	be.PutUint32(out[53:], math.MaxUint32) // base sequence -1
	be.PutUint32(out[57:], uint32(len(recs)))
	// The CRC covers from the attributes (offset 21) to the end.
	be.PutUint32(out[17:], crc32.Checksum(out[21:], crc32c))
	return out
}

// recordBodyLen is the encoded size of a header-less record after its
// length varint.
func recordBodyLen(r *kmsg.Record) int {
	n := 1 + varintLen(r.TimestampDelta64) + varintLen(int64(r.OffsetDelta)) + 1 // attributes, deltas, header count 0
	if r.Key == nil {
		n += 1
	} else {
		n += varintLen(int64(len(r.Key))) + len(r.Key)
	}
	if r.Value == nil {
		n += 1
	} else {
		n += varintLen(int64(len(r.Value))) + len(r.Value)
	}
	return n
}

func appendNullable(dst, b []byte) []byte {
	if b == nil {
		return binary.AppendVarint(dst, -1)
	}
	return append(binary.AppendVarint(dst, int64(len(b))), b...)
}

func varintLen(v int64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutVarint(b[:], v)
}

// produceTimeout is the produce requests' timeout (acks=all).
const produceTimeout = 30 * time.Second

// produced is the outcome of one partition's batch: its base offset, or
// its error (nothing of the batch was written).
type produced struct {
	base int64
	err  *apiError
}

// checkPartitions looks topic up without creating it (HTTP produce never
// auto-creates: an unknown topic is the caller's mistake, answered 404
// 40401) and checks that every partition of byPart exists (404 40402,
// before anything is written). It returns the topic's metadata.
func (a *API) checkPartitions(q *request, sc *sharedClient, topic string, byPart map[int32][]record) (*kmsg.MetadataResponseTopic, error) {
	t, err := a.topicMeta(q, sc, topic)
	if err != nil {
		return nil, err
	}
	for p := range byPart {
		if p < 0 || !slices.ContainsFunc(t.Partitions, func(mp kmsg.MetadataResponseTopicPartition) bool { return mp.Partition == p }) {
			return nil, errPartitionNotFound(topic, p)
		}
	}
	return t, nil
}

// produceTo appends one batch to topic's partition p (which must exist)
// with acks=all and returns its base offset.
func (a *API) produceTo(q *request, topic string, p int32, recs []record) (int64, error) {
	sc, err := a.client(q)
	if err != nil {
		return 0, err
	}
	defer a.clients.release(sc)
	byPart := map[int32][]record{p: recs}
	if _, err := a.checkPartitions(q, sc, topic, byPart); err != nil {
		return 0, err
	}
	out, err := a.produce(q, sc, topic, byPart)
	if err != nil {
		return 0, err
	}
	if e := out[p].err; e != nil {
		return 0, e
	}
	return out[p].base, nil
}

// produce appends one batch per partition of byPart to topic with
// acks=all, in one Produce request, and returns each partition's outcome:
// some may fail while others are written. An error is returned only when
// the request failed as a whole (the outcome of each batch unknown).
func (a *API) produce(q *request, sc *sharedClient, topic string, byPart map[int32][]record) (map[int32]produced, error) {
	req := kmsg.NewPtrProduceRequest()
	req.Acks = -1
	req.TimeoutMillis = int32(produceTimeout.Milliseconds())
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	now := time.Now()
	for p, recs := range byPart {
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Partition = p
		rp.Records = encodeBatch(recs, now)
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(q.ctx, sc.cl)
	if err != nil {
		return nil, clientErr(err, topic, -1)
	}
	out := map[int32]produced{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				e := kafkaErr(p.ErrorCode, topic, p.Partition)
				if e.code == 40402 && !a.topicExists(q, sc, topic) {
					e = errTopicNotFound(topic)
				}
				if p.ErrorMessage != nil && *p.ErrorMessage != "" {
					e.msg += ": " + *p.ErrorMessage
				}
				out[p.Partition] = produced{err: e}
				continue
			}
			out[p.Partition] = produced{base: p.BaseOffset}
		}
	}
	for p := range byPart {
		if _, ok := out[p]; !ok {
			out[p] = produced{err: newErr(http.StatusBadGateway, 50201, "the broker did not answer for partition %d", p)}
		}
	}
	return out, nil
}

// topicExists reports whether Metadata knows topic (not creating it).
func (a *API) topicExists(q *request, sc *sharedClient, topic string) bool {
	md, err := a.metadata(q, sc, []string{topic})
	if err != nil || len(md.Topics) == 0 {
		return false
	}
	return md.Topics[0].ErrorCode == 0
}

// queryTopicPartition reads ?topic=&partition= (partition default 0).
func queryTopicPartition(r *http.Request) (string, int32, error) {
	topic := r.URL.Query().Get("topic")
	if topic == "" {
		return "", 0, errBadRequest("missing query parameter topic")
	}
	p := int32(0)
	if s := r.URL.Query().Get("partition"); s != "" {
		v, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			return "", 0, errBadRequest("partition %q is not a number", s)
		}
		if v < 0 {
			return "", 0, errInvalid("partition %d must not be negative", v)
		}
		p = int32(v)
	}
	return topic, p, nil
}

// POST /produce?topic=T&partition=P, the raw value as the body.
func (a *API) produceOne(q *request) {
	// curl --data-binary labels its bytes application/x-www-form-urlencoded
	// unless told otherwise; they are the raw value all the same.
	if ct := mediaType(q.r); ct != "" && ct != "application/octet-stream" && ct != "application/x-www-form-urlencoded" {
		q.fail(errContentType(ct, "application/octet-stream (the raw value)"))
		return
	}
	topic, p, err := queryTopicPartition(q.r)
	if err != nil {
		q.fail(err)
		return
	}
	value, err := a.readBody(q.r)
	if err != nil {
		q.fail(bodyErr(err))
		return
	}
	off, err := a.produceTo(q, topic, p, []record{{Value: value}})
	if err != nil {
		q.fail(err)
		return
	}
	// The original API's answer, its keys in this order.
	q.reply(http.StatusOK, "application/json", struct {
		Topic     string `json:"topic"`
		Partition int32  `json:"partition"`
		Offset    int64  `json:"offset"`
	}{topic, p, off})
}

// Media types of POST /produce/batch.
const (
	mediaJSON    = "application/json"
	mediaRecords = "application/x-synapse-records"
)

// batchJSON is the JSON body of POST /produce/batch: keys and values in
// base64 (null: null), header values in base64.
type batchJSON struct {
	Records []struct {
		Key       []byte `json:"key"`
		Value     []byte `json:"value"`
		Timestamp int64  `json:"timestamp"`
		Headers   []struct {
			Key   string `json:"key"`
			Value []byte `json:"value"`
		} `json:"headers"`
	} `json:"records"`
}

// POST /produce/batch?topic=T&partition=P: many records appended as one
// batch (one fsync).
func (a *API) produceBatch(q *request) {
	ct := mediaType(q.r)
	if ct != mediaJSON && ct != mediaRecords {
		q.fail(errContentType(ct, mediaJSON, mediaRecords))
		return
	}
	topic, p, err := queryTopicPartition(q.r)
	if err != nil {
		q.fail(err)
		return
	}
	var recs []record
	if ct == mediaJSON {
		var body batchJSON
		if err := decodeJSON(q.r.Body, &body); err != nil {
			q.fail(err)
			return
		}
		if len(body.Records) > a.cfg.MaxRecords {
			q.fail(a.tooMany(len(body.Records)))
			return
		}
		for i, r := range body.Records {
			if r.Timestamp < 0 {
				q.fail(errInvalid("records[%d]: negative timestamp", i))
				return
			}
			rec := record{Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
			for _, h := range r.Headers {
				rec.Headers = append(rec.Headers, header{h.Key, h.Value})
			}
			recs = append(recs, rec)
		}
	} else {
		data, err := a.readBody(q.r)
		if err != nil {
			q.fail(bodyErr(err))
			return
		}
		if recs, err = decodeFraming(data, a.cfg.MaxRecords); err != nil {
			q.fail(err)
			return
		}
	}
	if len(recs) == 0 {
		q.fail(errInvalid("no records in the batch"))
		return
	}
	base, err := a.produceTo(q, topic, p, recs)
	if err != nil {
		q.fail(err)
		return
	}
	q.reply(http.StatusOK, "application/json", struct {
		Topic      string `json:"topic"`
		Partition  int32  `json:"partition"`
		BaseOffset int64  `json:"base_offset"`
		Count      int    `json:"count"`
	}{topic, p, base, len(recs)})
}

func (a *API) tooMany(n int) *apiError {
	return newErr(http.StatusRequestEntityTooLarge, 41303, "%d records in one request: at most %d", n, a.cfg.MaxRecords)
}

// decodeJSON decodes one JSON value of r into v, refusing trailing data.
func decodeJSON(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errBadRequest("empty request body: want a JSON object")
		}
		return bodyErr(err)
	}
	if dec.More() {
		return errBadRequest("trailing data after the JSON object")
	}
	return nil
}

// readBody reads the whole body, in one allocation when its length is
// known (MaxBytesReader bounds it either way).
func (a *API) readBody(r *http.Request) ([]byte, error) {
	if r.ContentLength > a.cfg.MaxBodyBytes {
		return nil, &http.MaxBytesError{Limit: a.cfg.MaxBodyBytes}
	}
	if n := r.ContentLength; n > 0 {
		buf := make([]byte, n)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				err = errBadRequest("body shorter than its Content-Length")
			}
			return nil, err
		}
		return buf, nil
	}
	return io.ReadAll(r.Body)
}

// decodeOptionalJSON is decodeJSON for a body that may be empty.
func decodeOptionalJSON(r io.Reader, v any) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return bodyErr(err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	return decodeJSON(bytes.NewReader(data), v)
}

// decodeFraming parses the compact binary framing of
// application/x-synapse-records (docs/http-api.md): records back to back
// until the body ends, each
//
//	varint keyLen (-1: null)   key
//	varint valueLen (-1: null) value
//	varint headerCount
//	headerCount × { varint keyLen, key, varint valueLen (-1: null), value }
//
// with zig-zag varints as in Kafka's record format.
func decodeFraming(data []byte, maxRecords int) ([]record, error) {
	var recs []record
	pos := 0
	varint := func(what string) (int64, error) {
		v, n := binary.Varint(data[pos:])
		if n <= 0 {
			return 0, errInvalid("record %d: bad or truncated varint (%s) at byte %d", len(recs), what, pos)
		}
		pos += n
		return v, nil
	}
	bytesOf := func(what string, nullable bool) ([]byte, error) {
		l, err := varint(what + " length")
		if err != nil {
			return nil, err
		}
		if l == -1 && nullable {
			return nil, nil
		}
		if l < 0 || l > int64(len(data)-pos) {
			return nil, errInvalid("record %d: %s length %d at byte %d: past the end of the body (%d bytes)", len(recs), what, l, pos, len(data))
		}
		b := data[pos : pos+int(l) : pos+int(l)]
		pos += int(l)
		return b, nil
	}
	for pos < len(data) {
		if len(recs) >= maxRecords {
			return nil, newErr(http.StatusRequestEntityTooLarge, 41303, "more than %d records in one request", maxRecords)
		}
		var r record
		var err error
		if r.Key, err = bytesOf("key", true); err != nil {
			return nil, err
		}
		if r.Value, err = bytesOf("value", true); err != nil {
			return nil, err
		}
		nh, err := varint("header count")
		if err != nil {
			return nil, err
		}
		if nh < 0 || nh > int64(len(data)-pos) {
			return nil, errInvalid("record %d: header count %d", len(recs), nh)
		}
		for range nh {
			k, err := bytesOf("header key", false)
			if err != nil {
				return nil, err
			}
			v, err := bytesOf("header value", true)
			if err != nil {
				return nil, err
			}
			r.Headers = append(r.Headers, header{string(k), v})
		}
		recs = append(recs, r)
	}
	return recs, nil
}

// AppendFraming appends r to dst in the framing of
// application/x-synapse-records (for clients written in Go, and tests).
func AppendFraming(dst []byte, key, value []byte, headers ...[2][]byte) []byte {
	appendBytes := func(dst, b []byte) []byte {
		if b == nil {
			return binary.AppendVarint(dst, -1)
		}
		return append(binary.AppendVarint(dst, int64(len(b))), b...)
	}
	dst = appendBytes(dst, key)
	dst = appendBytes(dst, value)
	dst = binary.AppendVarint(dst, int64(len(headers)))
	for _, h := range headers {
		k := h[0]
		if k == nil {
			k = []byte{}
		}
		dst = appendBytes(dst, k)
		dst = appendBytes(dst, h[1])
	}
	return dst
}

// fetchMaxBytes is what GET /fetch asks for of the partition: the batch
// holding the offset comes whole however large (KIP-74).
const fetchMaxBytes = 1 << 20

// GET /fetch?topic=T&partition=P&offset=N: the raw value of the record at
// N (404 past the end, 410 below the log start).
func (a *API) fetchOne(q *request) {
	topic, p, err := queryTopicPartition(q.r)
	if err != nil {
		q.fail(err)
		return
	}
	s := q.r.URL.Query().Get("offset")
	if s == "" {
		q.fail(errBadRequest("missing query parameter offset"))
		return
	}
	off, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		q.fail(errBadRequest("offset %q is not a number", s))
		return
	}
	if off < 0 {
		q.fail(errInvalid("offset %d must not be negative", off))
		return
	}
	rec, err := a.fetchRecord(q, topic, p, off)
	if err != nil {
		q.fail(err)
		return
	}
	h := q.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Kafka-Offset", strconv.FormatInt(rec.Offset, 10))
	h.Set("X-Kafka-Timestamp", strconv.FormatInt(rec.Timestamp.UnixMilli(), 10))
	if rec.Key != nil {
		h.Set("X-Kafka-Key", base64.StdEncoding.EncodeToString(rec.Key))
	}
	if rec.Value == nil {
		// A null value (a tombstone) is an empty body, told from an
		// empty value by this header.
		h.Set("X-Kafka-Value-Null", "true")
	}
	h.Set("Content-Length", strconv.Itoa(len(rec.Value)))
	q.w.WriteHeader(http.StatusOK)
	q.w.Write(rec.Value)
}

// coldWait bounds a long poll of GET /fetch for a cold chunk.
const coldWait = 10 * time.Second

// fetchPartition fetches topic's partition p at off, waiting up to wait
// for data.
func fetchPartition(q *request, sc *sharedClient, topic string, p int32, off int64, wait time.Duration) (*kmsg.FetchResponseTopicPartition, error) {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(wait.Milliseconds())
	req.MinBytes = 1
	req.MaxBytes = fetchMaxBytes
	req.SessionEpoch = -1 // no fetch session
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = p
	rp.FetchOffset = off
	rp.LogStartOffset = -1
	rp.CurrentLeaderEpoch = -1
	rp.PartitionMaxBytes = fetchMaxBytes
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(q.ctx, sc.cl)
	if err != nil {
		return nil, clientErr(err, topic, p)
	}
	if resp.ErrorCode != 0 {
		return nil, kafkaErr(resp.ErrorCode, topic, p)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return nil, newErr(http.StatusBadGateway, 50201, "the broker answered a fetch of %s/%d with no partition", topic, p)
	}
	return &resp.Topics[0].Partitions[0], nil
}

// fetchRecord reads the record at off of topic's partition p.
func (a *API) fetchRecord(q *request, topic string, p int32, off int64) (*kgo.Record, error) {
	sc, err := a.client(q)
	if err != nil {
		return nil, err
	}
	defer a.clients.release(sc)
	var part *kmsg.FetchResponseTopicPartition
	for try := 0; ; try++ {
		// The first try does not wait; an empty answer below the high
		// watermark is a cold chunk being downloaded: the next tries
		// long-poll, woken when it lands.
		wait := time.Duration(0)
		if try > 0 {
			wait = coldWait
		}
		part, err = fetchPartition(q, sc, topic, p, off, wait)
		if err != nil {
			return nil, err
		}
		if part.ErrorCode != 0 || len(part.RecordBatches) > 0 || off >= part.HighWatermark || off < part.LogStartOffset || try == 3 {
			break
		}
	}
	gone := func() error {
		return newErr(http.StatusGone, 41001, "offset %d of %s/%d is below the log start offset %d: deleted", off, topic, p, part.LogStartOffset)
	}
	past := func() error {
		return errNotFound(40404, "no record at offset %d of %s/%d: the log ends at %d", off, topic, p, part.HighWatermark)
	}
	switch part.ErrorCode {
	case 0:
	case kerr.OffsetOutOfRange.Code:
		if off < part.LogStartOffset {
			return nil, gone()
		}
		return nil, past()
	default:
		e := kafkaErr(part.ErrorCode, topic, p)
		if e.code == 40402 && !a.topicExists(q, sc, topic) {
			e = errTopicNotFound(topic)
		}
		return nil, e
	}
	if off >= part.HighWatermark {
		return nil, past()
	}
	if off < part.LogStartOffset {
		return nil, gone()
	}
	if len(part.RecordBatches) == 0 {
		// Below the high watermark and nothing came back, try after
		// try: the broker could not read it now (a cold chunk still
		// downloading, a rate limit or resource shortage), not a gap,
		// which a batch past off would show.
		return nil, newErr(http.StatusServiceUnavailable, 50302,
			"offset %d of %s/%d (below the high watermark %d) could not be read now (a tiered-storage read still downloading, or a broker resource limit): retry", off, topic, p, part.HighWatermark)
	}
	fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: off, Topic: topic, Partition: p}, part, kgo.DefaultDecompressor(), nil)
	if fp.Err != nil {
		return nil, newErr(http.StatusBadGateway, 50202, "reading %s/%d at %d: %v", topic, p, off, fp.Err)
	}
	for _, r := range fp.Records {
		if r.Offset == off {
			return r, nil
		}
	}
	return nil, errNotFound(40405, "no record at offset %d of %s/%d (a transaction marker, or compacted away)", off, topic, p)
}
