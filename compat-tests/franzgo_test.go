package compattests

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// franz-go (kgo + kadm) with its defaults: idempotent producer, acks=all,
// newest protocol versions.

func TestFranzGo(t *testing.T) {
	runClientSuite(t, clientSpec{newClient: newFranzGo, nullsDistinct: true})
}

type franzGo struct {
	addr  string
	admin *kgo.Client
	adm   *kadm.Client

	mu        sync.Mutex
	producers map[string]*kgo.Client
}

func newFranzGo(t testing.TB, b broker) client {
	t.Helper()
	admin, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	return &franzGo{addr: b.Addr(), admin: admin, adm: kadm.NewClient(admin), producers: make(map[string]*kgo.Client)}
}

func (c *franzGo) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.producers {
		p.Close()
	}
	c.admin.Close()
}

var kgoCodecs = map[string]kgo.CompressionCodec{
	"none":   kgo.NoCompression(),
	"gzip":   kgo.GzipCompression(),
	"snappy": kgo.SnappyCompression(),
	"lz4":    kgo.Lz4Compression(),
	"zstd":   kgo.ZstdCompression(),
}

func (c *franzGo) createTopic(t testing.TB, ctx context.Context, topic string, partitions int32) {
	t.Helper()
	resp, err := c.adm.CreateTopic(ctx, partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("kadm CreateTopic %s: %v", topic, err)
	}
}

func (c *franzGo) producer(t testing.TB, codec string) *kgo.Client {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.producers[codec]; p != nil {
		return p
	}
	// Defaults otherwise: idempotent, acks=all, ProducerBatchMaxBytes
	// 1,000,012 (room for the ~900 KB record).
	p, err := kgo.NewClient(
		kgo.SeedBrokers(c.addr),
		kgo.ProducerBatchCompression(kgoCodecs[codec]),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	c.producers[codec] = p
	return p
}

func (c *franzGo) produce(t testing.TB, ctx context.Context, topic, codec string, recs []record) {
	t.Helper()
	p := c.producer(t, codec)
	krs := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		kr := &kgo.Record{
			Topic:     topic,
			Partition: r.Partition,
			Key:       r.Key,
			Value:     r.Value,
			Timestamp: r.Timestamp,
		}
		for _, h := range r.Headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		krs[i] = kr
	}
	if err := p.ProduceSync(ctx, krs...).FirstErr(); err != nil {
		t.Fatalf("produce %s (%s): %v", topic, codec, err)
	}
	for i, kr := range krs {
		recs[i].Offset = kr.Offset
	}
}

func fromKgo(kr *kgo.Record) record {
	r := record{
		Partition: kr.Partition,
		Key:       kr.Key,
		Value:     kr.Value,
		Timestamp: kr.Timestamp,
		Offset:    kr.Offset,
	}
	for _, h := range kr.Headers {
		r.Headers = append(r.Headers, header{h.Key, h.Value})
	}
	r.Seq = seqOf(r.Headers)
	return r
}

func (c *franzGo) consume(t testing.TB, ctx context.Context, topic string, counts map[int32]int) []record {
	t.Helper()
	parts := make(map[int32]kgo.Offset)
	for p := range counts {
		parts[p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.addr),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchMaxWait(500*time.Millisecond),
	)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	defer cl.Close()
	return pollKgo(t, ctx, cl, counts)
}

// pollKgo polls until every partition has its count of records.
func pollKgo(t testing.TB, ctx context.Context, cl *kgo.Client, counts map[int32]int) []record {
	t.Helper()
	var got []record
	have := make(map[int32]int)
	complete := func() bool {
		for p, n := range counts {
			if have[p] < n {
				return false
			}
		}
		return true
	}
	for !complete() {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %v of %v records per partition: %v", have, counts, err)
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !kerr.IsRetriable(err) && !errors.Is(err, context.Canceled) {
				t.Errorf("fetch %s p%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(kr *kgo.Record) {
			have[kr.Partition]++
			got = append(got, fromKgo(kr))
		})
		if t.Failed() {
			t.FailNow()
		}
	}
	for p, n := range counts {
		if have[p] > n {
			t.Errorf("partition %d: consumed %d records, produced %d", p, have[p], n)
		}
	}
	return got
}

func (c *franzGo) listOffset(t testing.TB, ctx context.Context, topic string, partition int32, ts int64) int64 {
	t.Helper()
	var (
		listed kadm.ListedOffsets
		err    error
	)
	switch ts {
	case -2:
		listed, err = c.adm.ListStartOffsets(ctx, topic)
	case -1:
		listed, err = c.adm.ListEndOffsets(ctx, topic)
	default:
		listed, err = c.adm.ListOffsetsAfterMilli(ctx, ts, topic)
	}
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		t.Fatalf("kadm ListOffsets %s ts %d: %v", topic, ts, err)
	}
	o, ok := listed.Lookup(topic, partition)
	if !ok {
		t.Fatalf("kadm ListOffsets %s: no answer for partition %d", topic, partition)
	}
	return o.Offset
}

// TestFranzGoListOffsetsRaw checks what kadm smooths over: a timestamp after
// every record answers offset -1 and timestamp -1, and -3 (max timestamp)
// answers the record with the largest timestamp.
func TestFranzGoListOffsetsRaw(t *testing.T) {
	b := newBroker(t)
	c := newFranzGo(t, b).(*franzGo)
	t.Cleanup(c.close)
	ctx := testCtx(t, scenarioTimeout)
	topic := uniqueTopic(t)
	c.createTopic(t, ctx, topic, 1)
	gen := newRecordGen(1)
	recs := gen.batch("none", 6, false)
	c.produce(t, ctx, topic, "none", recs)
	last := recs[len(recs)-1]

	ask := func(ts int64) kmsg.ListOffsetsResponseTopicPartition {
		t.Helper()
		req := kmsg.NewPtrListOffsetsRequest()
		req.ReplicaID = -1
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = 0
		rp.Timestamp = ts
		rp.CurrentLeaderEpoch = -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, c.admin)
		if err != nil {
			t.Fatalf("ListOffsets ts %d: %v", ts, err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			t.Fatalf("ListOffsets ts %d: response shape %+v", ts, resp)
		}
		p := resp.Topics[0].Partitions[0]
		if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
			t.Fatalf("ListOffsets ts %d: %v", ts, err)
		}
		return p
	}
	if p := ask(last.Timestamp.UnixMilli() + 1); p.Offset != -1 || p.Timestamp != -1 {
		t.Errorf("ListOffsets after the last timestamp: offset %d timestamp %d, want -1 -1", p.Offset, p.Timestamp)
	}
	if p := ask(-3); p.Offset != last.Offset || p.Timestamp != last.Timestamp.UnixMilli() {
		t.Errorf("ListOffsets -3 (max timestamp): offset %d timestamp %d, want %d %d",
			p.Offset, p.Timestamp, last.Offset, last.Timestamp.UnixMilli())
	}
	if p := ask(recs[2].Timestamp.UnixMilli()); p.Offset != recs[2].Offset || p.Timestamp != recs[2].Timestamp.UnixMilli() {
		t.Errorf("ListOffsets exact ts: offset %d timestamp %d, want %d %d",
			p.Offset, p.Timestamp, recs[2].Offset, recs[2].Timestamp.UnixMilli())
	}
}

// TestFranzGoKill9 kills the broker with SIGKILL right after acks=all
// produces were acknowledged: after a start nothing acknowledged is missing
// (acks=all is answered only once the data is fsync'd).
func TestFranzGoKill9(t *testing.T) {
	b := newBroker(t)
	if b.Target() == targetKfake {
		t.Skip("kfake runs inside the test process and cannot be killed with SIGKILL")
	}
	c := newFranzGo(t, b).(*franzGo)
	t.Cleanup(c.close)
	ctx := testCtx(t, 2*scenarioTimeout)
	topic := uniqueTopic(t)
	c.createTopic(t, ctx, topic, numPartitions)
	gen := newRecordGen(numPartitions)
	var want []record
	for _, codec := range codecs {
		recs := gen.batch(codec, 6, false)
		c.produce(t, ctx, topic, codec, recs)
		want = append(want, recs...)
	}
	b.Kill9(t)
	b.Start(t)
	for _, codec := range codecs {
		recs := gen.batch(codec, 2, false)
		c.produce(t, ctx, topic, codec, recs)
		want = append(want, recs...)
	}
	got := c.consume(t, ctx, topic, perPartition(want))
	checkRecords(t, want, got, checkOpts{nullsDistinct: true})
}

// BenchmarkFranzGo measures loopback throughput with franz-go's defaults
// (idempotent, acks=all, no compression) and 1 KiB values over 3
// partitions. Not part of `go test`; run for example
//
//	SYNAPSE_BIN=../bin/synapse go test -run '^$' -bench FranzGo -benchtime 200000x
func BenchmarkFranzGo(b *testing.B) {
	br := newBroker(b)
	value := make([]byte, 1024)
	for i := range value {
		value[i] = byte(i * 31)
	}
	produce := func(b *testing.B, cl *kgo.Client, topic string, n int) {
		var failed atomic.Int64
		var first atomic.Value
		for range n {
			cl.Produce(context.Background(), &kgo.Record{Topic: topic, Value: value}, func(_ *kgo.Record, err error) {
				if err != nil && failed.Add(1) == 1 {
					first.Store(err)
				}
			})
		}
		if err := cl.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
		if n := failed.Load(); n > 0 {
			b.Fatalf("%d records failed, first: %v", n, first.Load())
		}
	}
	newTopic := func(b *testing.B) string {
		topic := uniqueTopic(b)
		createTopicKadm(b, br.Addr(), topic, numPartitions)
		return topic
	}
	b.Run("produce-1KiB", func(b *testing.B) {
		topic := newTopic(b)
		cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addr()), kgo.DefaultProduceTopic(topic))
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		b.SetBytes(int64(len(value)))
		b.ResetTimer()
		produce(b, cl, topic, b.N)
	})
	b.Run("consume-1KiB", func(b *testing.B) {
		topic := newTopic(b)
		cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addr()))
		if err != nil {
			b.Fatal(err)
		}
		produce(b, cl, topic, b.N)
		cl.Close()
		cons, err := kgo.NewClient(kgo.SeedBrokers(br.Addr()), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			b.Fatal(err)
		}
		defer cons.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		b.SetBytes(int64(len(value)))
		b.ResetTimer()
		for got := 0; got < b.N; {
			fs := cons.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				b.Fatalf("consumed %d of %d: %v", got, b.N, err)
			}
			got += fs.NumRecords()
		}
	})
}
