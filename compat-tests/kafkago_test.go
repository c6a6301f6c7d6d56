package compattests

import (
	"context"
	"sync"
	"testing"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
)

// segmentio/kafka-go: Writer (acks=all, one per codec) for producing, a
// Reader per partition without a consumer group for consuming, Client for
// CreateTopics and Conn.ReadOffset (ListOffsets v1) for offsets.

func TestKafkaGo(t *testing.T) {
	runClientSuite(t, kafkaGoSpec())
}

func kafkaGoSpec() clientSpec {
	return clientSpec{
		newClient: func(t testing.TB, b broker) client {
			return &kafkaGo{
				addr:      b.Addr(),
				transport: &kafka.Transport{DialTimeout: 5 * time.Second, MetadataTTL: time.Second},
				writers:   make(map[string]*kafka.Writer),
			}
		},
		// kafka-go's Reader returns an empty key or value as nil (it only
		// allocates for a positive length), so null and empty cannot be
		// told apart on the consuming side; its Writer does send them apart.
		nullsDistinct: false,
	}
}

type kafkaGo struct {
	addr      string
	transport *kafka.Transport

	mu      sync.Mutex
	writers map[string]*kafka.Writer
	// partOf maps seq → partition for the Balancer, offsetOf seq → offset
	// from the Completion callback.
	partOf   map[int]int32
	offsetOf map[int]int64
}

var kafkaGoCodecs = map[string]compress.Compression{
	"none":   0,
	"gzip":   kafka.Gzip,
	"snappy": kafka.Snappy,
	"lz4":    kafka.Lz4,
	"zstd":   kafka.Zstd,
}

func (c *kafkaGo) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.writers {
		w.Close()
	}
	c.transport.CloseIdleConnections()
}

func (c *kafkaGo) createTopic(t testing.TB, ctx context.Context, topic string, partitions int32) {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(c.addr), Transport: c.transport}
	resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: int(partitions), ReplicationFactor: 1}},
	})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		t.Fatalf("kafka-go CreateTopics %s: %v", topic, err)
	}
}

func (c *kafkaGo) writer(codec string) *kafka.Writer {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.writers[codec]; w != nil {
		return w
	}
	w := &kafka.Writer{
		Addr:         kafka.TCP(c.addr),
		Transport:    c.transport,
		RequiredAcks: kafka.RequireAll,
		Compression:  kafkaGoCodecs[codec],
		BatchTimeout: 5 * time.Millisecond,
		BatchBytes:   maxMessageBytes + 48<<10,
		MaxAttempts:  20,
		// Records go to the partition the test chose for their seq.
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int {
			c.mu.Lock()
			defer c.mu.Unlock()
			return int(c.partOf[seqOf(fromKafkaGoHeaders(m.Headers))])
		}),
		Completion: func(msgs []kafka.Message, err error) {
			if err != nil {
				return
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, m := range msgs {
				c.offsetOf[seqOf(fromKafkaGoHeaders(m.Headers))] = m.Offset
			}
		},
	}
	c.writers[codec] = w
	return w
}

func fromKafkaGoHeaders(hs []kafka.Header) []header {
	var out []header
	for _, h := range hs {
		out = append(out, header{h.Key, h.Value})
	}
	return out
}

func (c *kafkaGo) produce(t testing.TB, ctx context.Context, topic, codec string, recs []record) {
	t.Helper()
	w := c.writer(codec)
	c.mu.Lock()
	c.partOf = make(map[int]int32)
	c.offsetOf = make(map[int]int64)
	c.mu.Unlock()
	msgs := make([]kafka.Message, len(recs))
	for i, r := range recs {
		m := kafka.Message{Topic: topic, Key: r.Key, Value: r.Value, Time: r.Timestamp}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		msgs[i] = m
		c.mu.Lock()
		c.partOf[r.Seq] = r.Partition
		c.mu.Unlock()
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce %s (%s): %v", topic, codec, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range recs {
		off, ok := c.offsetOf[recs[i].Seq]
		if !ok {
			t.Errorf("seq %d: no offset from the Completion callback", recs[i].Seq)
			continue
		}
		recs[i].Offset = off
	}
}

func (c *kafkaGo) consume(t testing.TB, ctx context.Context, topic string, counts map[int32]int) []record {
	t.Helper()
	var got []record
	for p, n := range counts {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:   []string{c.addr},
			Topic:     topic,
			Partition: int(p),
			MinBytes:  1,
			MaxBytes:  4 << 20,
			MaxWait:   250 * time.Millisecond,
		})
		for have := 0; have < n; have++ {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("consume %s p%d: %d of %d records: %v", topic, p, have, n, err)
			}
			rec := record{
				Partition: int32(m.Partition),
				Key:       m.Key,
				Value:     m.Value,
				Headers:   fromKafkaGoHeaders(m.Headers),
				Timestamp: m.Time,
				Offset:    m.Offset,
			}
			rec.Seq = seqOf(rec.Headers)
			got = append(got, rec)
		}
		r.Close()
	}
	return got
}

func (c *kafkaGo) listOffset(t testing.TB, ctx context.Context, topic string, partition int32, ts int64) int64 {
	t.Helper()
	conn, err := kafka.DialLeader(ctx, "tcp", c.addr, topic, int(partition))
	if err != nil {
		t.Fatalf("kafka-go DialLeader %s p%d: %v", topic, partition, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	var off int64
	switch ts {
	case -2:
		off, err = conn.ReadFirstOffset()
	case -1:
		off, err = conn.ReadLastOffset()
	default:
		off, err = conn.ReadOffset(time.UnixMilli(ts))
	}
	if err != nil {
		t.Fatalf("kafka-go ReadOffset %s p%d ts %d: %v", topic, partition, ts, err)
	}
	return off
}
