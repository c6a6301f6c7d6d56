package broker

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
)

// compress encodes raw records with codec as clients do (snappy: a raw
// block, as franz-go and librdkafka; xerial framing is the Java client's).
func compressRecords(t testing.TB, codec log.Codec, raw []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	switch codec {
	case log.CodecNone:
		return raw
	case log.CodecGzip:
		w := gzip.NewWriter(&buf)
		w.Write(raw)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	case log.CodecSnappy:
		return s2.EncodeSnappy(nil, raw)
	case log.CodecLZ4:
		w := lz4.NewWriter(&buf)
		w.Write(raw)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	case log.CodecZstd:
		enc, err := zstd.NewWriter(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer enc.Close()
		return enc.EncodeAll(raw, nil)
	}
	return buf.Bytes()
}

// xerial frames a snappy block as the Java client does.
func xerial(block []byte) []byte {
	out := append([]byte{}, xerialHeader...)
	out = binary.BigEndian.AppendUint32(out, 1)
	out = binary.BigEndian.AppendUint32(out, 1)
	out = binary.BigEndian.AppendUint32(out, uint32(len(block)))
	return append(out, block...)
}

// rawRecords encodes records with the keys given (nil: no key) and values.
func rawRecords(keys, values [][]byte) []byte {
	var raw []byte
	for i := range keys {
		rec := kmsg.Record{OffsetDelta: int32(i), TimestampDelta64: int64(i), Key: keys[i], Value: values[i]}
		body := len(rec.AppendTo(nil)) - 1 // the length varint of 0 is one byte
		rec.Length = int32(body)
		raw = rec.AppendTo(raw)
	}
	return raw
}

// testBatch is a whole v2 batch (CRC set) of records with keys (nil: no
// key) and values, its records section recs (encoded by codec).
func testBatch(codec log.Codec, pid int64, seq int32, recs []byte, n int) []byte {
	rb := kmsg.RecordBatch{Magic: 2, Attributes: int16(codec), LastOffsetDelta: int32(n - 1), NumRecords: int32(n),
		FirstTimestamp: 1_750_000_000_000, MaxTimestamp: 1_750_000_000_000 + int64(n-1),
		ProducerID: pid, ProducerEpoch: -1, FirstSequence: seq, Records: recs}
	if pid >= 0 {
		rb.ProducerEpoch = 0
	}
	return fixCRC(rb.AppendTo(nil))
}

func keyedBatch(t testing.TB, codec log.Codec, keys ...[]byte) []byte {
	values := make([][]byte, len(keys))
	for i := range values {
		values[i] = fmt.Appendf(nil, "value-%d", i)
	}
	return testBatch(codec, -1, -1, compressRecords(t, codec, rawRecords(keys, values)), len(keys))
}

// produceRaw sends a Produce v8 request of batch to partition 0 of topic
// on a fresh connection and returns the partition's answer.
func produceRaw(t *testing.T, addr, topic string, batch []byte) kmsg.ProduceResponseTopicPartition {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 8, -1, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = batch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	if _, err := nc.Write(reqFrame(req, 1)); err != nil {
		t.Fatal(err)
	}
	_, sp := readProduceAnswer(t, nc)
	return sp
}

func endOffset(t *testing.T, adm *kadm.Client, topic string) int64 {
	t.Helper()
	ends, err := adm.ListEndOffsets(ctxT(t), topic)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := ends.Lookup(topic, 0)
	if !ok || o.Err != nil {
		t.Fatalf("end offset of %s: %+v", topic, o)
	}
	return o.Offset
}

func compactedServer(t *testing.T, topics map[string]string) (*testServer, *kgo.Client, *kadm.Client) {
	t.Helper()
	ts := startServerConfig(t, Config{AutoCreateTopics: true})
	cl, adm := client(t, ts.addr, kgo.DefaultProduceTopic("c"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for topic, policy := range topics {
		if _, err := adm.CreateTopic(ctxT(t), 1, 1, map[string]*string{"cleanup.policy": kstr(policy)}, topic); err != nil {
			t.Fatal(err)
		}
	}
	return ts, cl, adm
}

// TestCompactedRefusesKeylessRecord: with the Go client (idempotent by
// default), a keyless record on a compacted topic (compact, or
// compact,delete) fails with INVALID_RECORD, a keyed one is written, and
// the producer goes on: the refused batch took no sequence numbers (had
// it, the next batch would be answered as its duplicate, unwritten).
func TestCompactedRefusesKeylessRecord(t *testing.T) {
	ts, cl, adm := compactedServer(t, map[string]string{"c": "compact", "cd": "compact,delete", "d": "delete"})
	ctx := ctxT(t)
	for _, topic := range []string{"c", "cd"} {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("k0"), Value: []byte("v0")}).FirstErr(); err != nil {
			t.Fatalf("%s: keyed record: %v", topic, err)
		}
		err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("no key")}).FirstErr()
		if !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("%s: keyless record answered %v, want INVALID_RECORD", topic, err)
		}
		// An empty key is a key.
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte{}, Value: []byte("v1")}).FirstErr(); err != nil {
			t.Fatalf("%s: record after the refusal: %v", topic, err)
		}
		if end := endOffset(t, adm, topic); end != 2 {
			t.Fatalf("%s: end offset %d, want 2", topic, end)
		}
	}
	recs := consumeAll(t, ts.addr, "c", 2)
	if string(recs[0].Value) != "v0" || string(recs[1].Value) != "v1" {
		t.Fatalf("read %q, %q, want v0, v1", recs[0].Value, recs[1].Value)
	}
	// An ordinary topic takes keyless records.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "d", Value: []byte("no key")}).FirstErr(); err != nil {
		t.Fatalf("delete topic: keyless record: %v", err)
	}
}

// TestCompactedRefusesMixedBatchWhole: a batch of keyed and keyless
// records is refused whole, naming each keyless record as Kafka's log
// validator does; nothing of it is appended.
func TestCompactedRefusesMixedBatchWhole(t *testing.T) {
	ts, _, adm := compactedServer(t, map[string]string{"c": "compact"})
	if sp := produceRaw(t, ts.addr, "c", keyedBatch(t, log.CodecNone, []byte("a"))); sp.ErrorCode != 0 {
		t.Fatalf("keyed batch: %v", kerr.ErrorForCode(sp.ErrorCode))
	}
	sp := produceRaw(t, ts.addr, "c", keyedBatch(t, log.CodecNone, []byte("a"), nil, []byte("b"), nil, []byte("c")))
	if sp.ErrorCode != kerr.InvalidRecord.Code || sp.BaseOffset != -1 {
		t.Fatalf("mixed batch answered %v at %d, want INVALID_RECORD", kerr.ErrorForCode(sp.ErrorCode), sp.BaseOffset)
	}
	const msg = "Compacted topic cannot accept message without key in topic partition c-0."
	if len(sp.ErrorRecords) != 2 {
		t.Fatalf("record errors %+v, want records 1 and 3", sp.ErrorRecords)
	}
	for i, want := range []int32{1, 3} {
		if e := sp.ErrorRecords[i]; e.RelativeOffset != want || e.ErrorMessage == nil || *e.ErrorMessage != msg {
			t.Fatalf("record error %d: %d %v, want %d %q", i, e.RelativeOffset, e.ErrorMessage, want, msg)
		}
	}
	wantMsg := "One or more records have been rejected due to 2 record errors in total, and only showing the first three errors at most: [RecordError(batchIndex=1, message='" + msg + "'), RecordError(batchIndex=3, message='" + msg + "')]"
	if sp.ErrorMessage == nil || *sp.ErrorMessage != wantMsg {
		t.Fatalf("error message %v, want %q", sp.ErrorMessage, wantMsg)
	}
	if end := endOffset(t, adm, "c"); end != 1 {
		t.Fatalf("end offset %d after the refused batch, want 1", end)
	}
}

// TestCompactedChecksCompressedBatches: every codec's batch is read
// record by record (a keyless record in the middle of it found), a keyed
// one accepted.
func TestCompactedChecksCompressedBatches(t *testing.T) {
	ts, _, adm := compactedServer(t, map[string]string{"c": "compact"})
	keys := make([][]byte, 50)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%d", i)
	}
	keys[37] = nil
	values := make([][]byte, len(keys))
	for i := range values {
		values[i] = bytes.Repeat([]byte{byte('a' + i%26)}, 300)
	}
	raw := rawRecords(keys, values)
	end := int64(0)
	for _, codec := range []log.Codec{log.CodecGzip, log.CodecSnappy, log.CodecLZ4, log.CodecZstd, log.CodecSnappy + 8} {
		name := codec.String()
		var recs []byte
		if codec == log.CodecSnappy+8 {
			codec, name = log.CodecSnappy, "snappy-xerial"
			recs = xerial(s2.EncodeSnappy(nil, raw))
		} else {
			recs = compressRecords(t, codec, raw)
		}
		t.Run(name, func(t *testing.T) {
			if len(recs) >= len(raw) {
				t.Fatalf("%d bytes compressed to %d", len(raw), len(recs))
			}
			sp := produceRaw(t, ts.addr, "c", testBatch(codec, -1, -1, recs, len(keys)))
			if sp.ErrorCode != kerr.InvalidRecord.Code || len(sp.ErrorRecords) != 1 || sp.ErrorRecords[0].RelativeOffset != 37 {
				t.Fatalf("answered %v %+v, want INVALID_RECORD for record 37", kerr.ErrorForCode(sp.ErrorCode), sp.ErrorRecords)
			}
			if got := endOffset(t, adm, "c"); got != end {
				t.Fatalf("end offset %d, want %d", got, end)
			}
			keyed := append([][]byte{}, keys...)
			keyed[37] = []byte("key-37")
			sp = produceRaw(t, ts.addr, "c", testBatch(codec, -1, -1, compressRecords(t, codec, rawRecords(keyed, values)), len(keys)))
			if sp.ErrorCode != 0 || sp.BaseOffset != end {
				t.Fatalf("keyed batch answered %v at %d, want %d", kerr.ErrorForCode(sp.ErrorCode), sp.BaseOffset, end)
			}
			end += int64(len(keys))
		})
	}
	// With the Go client's compression too.
	cl, _ := client(t, ts.addr, kgo.DefaultProduceTopic("c"), kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerLinger(50*time.Millisecond))
	rs := []*kgo.Record{{Key: []byte("x"), Value: bytes.Repeat([]byte("v"), 1000)}, {Value: bytes.Repeat([]byte("v"), 1000)}}
	for _, err := range cl.ProduceSync(ctxT(t), rs...) {
		if !errors.Is(err.Err, kerr.InvalidRecord) {
			t.Fatalf("compressed mixed batch: %v, want INVALID_RECORD", err.Err)
		}
	}
}

// TestCompactedAfterAlter: a topic altered to compact refuses keyless
// records from then on, and takes them again once altered back.
func TestCompactedAfterAlter(t *testing.T) {
	ts, cl, adm := compactedServer(t, map[string]string{"c": "delete"})
	ctx := ctxT(t)
	keyless := func() error { return cl.ProduceSync(ctx, &kgo.Record{Value: []byte("no key")}).FirstErr() }
	if err := keyless(); err != nil {
		t.Fatalf("delete topic: %v", err)
	}
	alter := func(policy string) {
		r, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "cleanup.policy", Value: kstr(policy)}}, "c")
		if err == nil {
			err = r[0].Err
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	alter("delete,compact")
	if err := keyless(); !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("after the alter to compact: %v, want INVALID_RECORD", err)
	}
	if sp := produceRaw(t, ts.addr, "c", keyedBatch(t, log.CodecNone, nil)); sp.ErrorCode != kerr.InvalidRecord.Code {
		t.Fatalf("raw keyless batch: %v", kerr.ErrorForCode(sp.ErrorCode))
	}
	alter("delete")
	if err := keyless(); err != nil {
		t.Fatalf("altered back to delete: %v", err)
	}
	if end := endOffset(t, adm, "c"); end != 2 {
		t.Fatalf("end offset %d, want 2", end)
	}
}

// TestCompactedIdempotentSequenceKept: a refused idempotent batch leaves
// the producer's sequence where it was: the next batch at that sequence
// is written (not answered as a duplicate), one past it is out of order.
func TestCompactedIdempotentSequenceKept(t *testing.T) {
	ts, cl, adm := compactedServer(t, map[string]string{"c": "compact"})
	ipr := kmsg.NewPtrInitProducerIDRequest()
	ipr.TransactionTimeoutMillis = -1
	resp, err := ipr.RequestWith(ctxT(t), cl)
	if err != nil || resp.ErrorCode != 0 {
		t.Fatalf("init producer id: %v %v", err, resp)
	}
	pid := resp.ProducerID
	batch := func(seq int32, keys ...[]byte) []byte {
		values := make([][]byte, len(keys))
		for i := range values {
			values[i] = []byte("v")
		}
		return testBatch(log.CodecLZ4, pid, seq, compressRecords(t, log.CodecLZ4, rawRecords(keys, values)), len(keys))
	}
	if sp := produceRaw(t, ts.addr, "c", batch(0, []byte("a"), []byte("b"))); sp.ErrorCode != 0 {
		t.Fatalf("seq 0: %v", kerr.ErrorForCode(sp.ErrorCode))
	}
	if sp := produceRaw(t, ts.addr, "c", batch(2, []byte("c"), nil)); sp.ErrorCode != kerr.InvalidRecord.Code {
		t.Fatalf("keyless at seq 2: %v", kerr.ErrorForCode(sp.ErrorCode))
	}
	if sp := produceRaw(t, ts.addr, "c", batch(4, []byte("e"))); sp.ErrorCode != kerr.OutOfOrderSequenceNumber.Code {
		t.Fatalf("seq 4 after the refused 2-3: %v, want OUT_OF_ORDER_SEQUENCE_NUMBER", kerr.ErrorForCode(sp.ErrorCode))
	}
	if sp := produceRaw(t, ts.addr, "c", batch(2, []byte("c"), []byte("d"))); sp.ErrorCode != 0 || sp.BaseOffset != 2 {
		t.Fatalf("seq 2 again, keyed: %v at %d, want offset 2", kerr.ErrorForCode(sp.ErrorCode), sp.BaseOffset)
	}
	if end := endOffset(t, adm, "c"); end != 4 {
		t.Fatalf("end offset %d, want 4", end)
	}
}

// TestCompactedTransactional: a transactional producer's keyless record
// is refused; the transaction aborts and the next commits its keyed one.
func TestCompactedTransactional(t *testing.T) {
	ts, _, adm := compactedServer(t, map[string]string{"c": "compact"})
	cl, _ := client(t, ts.addr, kgo.DefaultProduceTopic("c"), kgo.TransactionalID("tx"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	ctx := ctxT(t)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("no key")}).FirstErr(); !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("keyless in a transaction: %v, want INVALID_RECORD", err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatalf("abort: %v", err)
	}
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("keyed in the next transaction: %v", err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit: %v", err)
	}
	recs := consumeAll(t, ts.addr, "c", 1)
	if len(recs) != 1 || string(recs[0].Key) != "k" {
		t.Fatalf("read %d records (first %q), want the keyed one", len(recs), recs[0].Key)
	}
	if end := endOffset(t, adm, "c"); end < 2 {
		t.Fatalf("end offset %d, want the record and its marker", end)
	}
}

// TestCompactedCheckBounds: a batch whose records decompress past
// maxDecompressed is refused (INVALID_RECORD) without holding them; a
// corrupt one answers CORRUPT_MESSAGE; one above max.message.bytes
// MESSAGE_TOO_LARGE, as Kafka checks those first; records overrunning
// their length INVALID_RECORD.
func TestCompactedCheckBounds(t *testing.T) {
	// 80 keyed records of 1 MiB (zeros): 80 MiB decompressed.
	keys, values := make([][]byte, 80), make([][]byte, 80)
	for i := range keys {
		keys[i], values[i] = []byte("k"), make([]byte, 1<<20)
	}
	b := testBatch(log.CodecZstd, -1, -1, compressRecords(t, log.CodecZstd, rawRecords(keys, values)), len(keys))
	h, err := log.ParseBatchHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	keys, values = nil, nil
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err = checkKeys(b, &h, 1<<20, "c", 0)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, log.ErrInvalidBatch) || !errors.Is(err, errDecompress) {
		t.Fatalf("80 MiB of records: %v, want refused past %d bytes", err, maxDecompressed)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 32<<20 {
		t.Fatalf("the check allocated %d MiB", grew>>20)
	}

	keyless := keyedBatch(t, log.CodecNone, []byte("a"), nil)
	h, _ = log.ParseBatchHeader(keyless)
	keyless[len(keyless)-1] ^= 1 // a value byte: the CRC no longer matches
	if err := checkKeys(keyless, &h, 1<<20, "c", 0); !errors.Is(err, log.ErrBatchCorrupt) {
		t.Fatalf("corrupt keyless batch: %v, want corrupt", err)
	}
	keyless[len(keyless)-1] ^= 1
	if err := checkKeys(keyless, &h, len(keyless)-1, "c", 0); err != nil {
		t.Fatalf("batch above max.message.bytes: %v, want it left to the append", err)
	}

	// A record whose key length runs past its length.
	recs := rawRecords([][]byte{[]byte("key")}, [][]byte{nil})
	recs[0] = 2 * 5 // length 5: attributes, two deltas, key length 3, value length: no room for the key
	bad := testBatch(log.CodecNone, -1, -1, recs, 1)
	h, _ = log.ParseBatchHeader(bad)
	if err := checkKeys(bad, &h, 1<<20, "c", 0); !errors.Is(err, log.ErrInvalidBatch) {
		t.Fatalf("overrunning record: %v, want invalid", err)
	}

	// At most maxRecordErrors named, all counted.
	many := make([][]byte, maxRecordErrors+5)
	mb := keyedBatch(t, log.CodecLZ4, many...)
	h, _ = log.ParseBatchHeader(mb)
	var re *recordErrors
	if err := checkKeys(mb, &h, 1<<20, "c", 3); !errors.As(err, &re) || len(re.records) != maxRecordErrors {
		t.Fatalf("%d keyless records: %v", len(many), err)
	}
	if want := fmt.Sprintf("due to %d record errors in total", len(many)); !bytes.Contains([]byte(re.msg), []byte(want)) {
		t.Fatalf("message %q, want %q", re.msg, want)
	}
}

// BenchmarkCompactedKeyCheck: the key check of a compacted topic's
// produce, per batch of 1 KiB records (values of words drawn at random
// from 256 random ones: text-like, compressed to 1/2 to 1/3), keyed (so
// read to the end).
func BenchmarkCompactedKeyCheck(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	words := make([][]byte, 256)
	for i := range words {
		w := make([]byte, 2+rng.IntN(8), 11)
		for j := range w {
			w[j] = byte('a' + rng.IntN(26))
		}
		words[i] = append(w, ' ')
	}
	for _, n := range []int{16, 1000} {
		keys, values := make([][]byte, n), make([][]byte, n)
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "key-%08d", i)
			var v []byte
			for len(v) < 1024 {
				v = append(v, words[rng.IntN(len(words))]...)
			}
			values[i] = v[:1024]
		}
		raw := rawRecords(keys, values)
		for _, codec := range []log.Codec{log.CodecNone, log.CodecLZ4, log.CodecZstd, log.CodecSnappy, log.CodecGzip} {
			batch := testBatch(codec, -1, -1, compressRecords(b, codec, raw), n)
			h, err := log.ParseBatchHeader(batch)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("%s/%drecords/%dB", codec, n, len(batch)), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(raw)))
				for b.Loop() {
					if err := checkKeys(batch, &h, 2<<20, "c", 0); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
