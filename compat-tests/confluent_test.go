//go:build cgo

package compattests

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// confluent-kafka-go v2: librdkafka (bundled, cgo). AdminClient for
// CreateTopics, one Producer per codec (acks=all), a Consumer with an
// explicit assignment (no subscription), QueryWatermarkOffsets for
// earliest/latest and OffsetsForTimes for ListOffsets by time.

func TestConfluent(t *testing.T) {
	t.Logf("librdkafka %s (bundled with confluent-kafka-go)", kafkaLibVersion())
	runClientSuite(t, confluentSpec())
}

func confluentSpec() clientSpec {
	return clientSpec{
		newClient: func(t testing.TB, b broker) client {
			return &confluentClient{addr: b.Addr(), producers: make(map[string]*kafka.Producer)}
		},
		nullsDistinct: true,
	}
}

func kafkaLibVersion() string {
	_, s := kafka.LibraryVersion()
	return s
}

type confluentClient struct {
	addr string

	mu        sync.Mutex
	producers map[string]*kafka.Producer
	querier   *kafka.Consumer // for offset queries
}

// rdkafkaLogLevel keeps librdkafka's own stderr logging to errors (3).
const rdkafkaLogLevel = 3

func (c *confluentClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.producers {
		p.Flush(1000)
		p.Close()
	}
	if c.querier != nil {
		c.querier.Close()
	}
}

func (c *confluentClient) createTopic(t testing.TB, ctx context.Context, topic string, partitions int32) {
	t.Helper()
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": c.addr, "log_level": rdkafkaLogLevel})
	if err != nil {
		t.Fatalf("kafka.NewAdminClient: %v", err)
	}
	defer admin.Close()
	res, err := admin.CreateTopics(ctx,
		[]kafka.TopicSpecification{{Topic: topic, NumPartitions: int(partitions), ReplicationFactor: 1}},
		kafka.SetAdminOperationTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("confluent CreateTopics %s: %v", topic, err)
	}
	for _, r := range res {
		if r.Error.Code() != kafka.ErrNoError {
			t.Fatalf("confluent CreateTopics %s: %v", r.Topic, r.Error)
		}
	}
}

func (c *confluentClient) producer(t testing.TB, codec string) *kafka.Producer {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.producers[codec]; p != nil {
		return p
	}
	p, err := kafka.NewProducer(&kafka.ConfigMap{
		"bootstrap.servers": c.addr,
		"acks":              "all",
		"compression.codec": codec,
		"linger.ms":         5,
		"message.max.bytes": maxMessageBytes + 48<<10,
		"log_level":         rdkafkaLogLevel,
		// Drain the events channel ourselves (below) so logs and errors
		// never block the producer.
		"go.logs.channel.enable": false,
	})
	if err != nil {
		t.Fatalf("kafka.NewProducer: %v", err)
	}
	go func() {
		for range p.Events() {
		}
	}()
	c.producers[codec] = p
	return p
}

func (c *confluentClient) produce(t testing.TB, ctx context.Context, topic, codec string, recs []record) {
	t.Helper()
	p := c.producer(t, codec)
	reports := make(chan kafka.Event, len(recs))
	for i, r := range recs {
		m := &kafka.Message{
			TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: r.Partition},
			Key:            r.Key, // nil is null, []byte{} is empty
			Value:          r.Value,
			Timestamp:      r.Timestamp,
			Opaque:         i,
		}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		if err := p.Produce(m, reports); err != nil {
			t.Fatalf("produce %s (%s) seq %d: %v", topic, codec, r.Seq, err)
		}
	}
	for range recs {
		select {
		case ev := <-reports:
			m, ok := ev.(*kafka.Message)
			if !ok {
				t.Fatalf("produce %s (%s): unexpected delivery event %v", topic, codec, ev)
			}
			i := m.Opaque.(int)
			if err := m.TopicPartition.Error; err != nil {
				t.Fatalf("produce %s (%s) seq %d: %v", topic, codec, recs[i].Seq, err)
			}
			if m.TopicPartition.Partition != recs[i].Partition {
				t.Errorf("seq %d delivered to partition %d, want %d", recs[i].Seq, m.TopicPartition.Partition, recs[i].Partition)
			}
			recs[i].Offset = int64(m.TopicPartition.Offset)
		case <-ctx.Done():
			t.Fatalf("produce %s (%s): waiting for delivery reports: %v", topic, codec, ctx.Err())
		}
	}
}

func (c *confluentClient) newConsumer(t testing.TB) *kafka.Consumer {
	t.Helper()
	// librdkafka's Go consumer insists on a group.id; the consumer only
	// ever uses Assign, so no group is joined and nothing is committed.
	cons, err := kafka.NewConsumer(&kafka.ConfigMap{
		"bootstrap.servers":        c.addr,
		"group.id":                 "compat-tests-confluent",
		"enable.auto.commit":       false,
		"enable.auto.offset.store": false,
		"enable.partition.eof":     false,
		"fetch.wait.max.ms":        250,
		"log_level":                rdkafkaLogLevel,
	})
	if err != nil {
		t.Fatalf("kafka.NewConsumer: %v", err)
	}
	return cons
}

func (c *confluentClient) consume(t testing.TB, ctx context.Context, topic string, counts map[int32]int) []record {
	t.Helper()
	cons := c.newConsumer(t)
	defer cons.Close()
	var tps []kafka.TopicPartition
	for p := range counts {
		tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: p, Offset: kafka.OffsetBeginning})
	}
	if err := cons.Assign(tps); err != nil {
		t.Fatalf("Assign %s: %v", topic, err)
	}
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
		if err := ctx.Err(); err != nil {
			t.Fatalf("consume %s: %v of %v records per partition: %v", topic, have, counts, err)
		}
		switch ev := cons.Poll(200).(type) {
		case *kafka.Message:
			if ev.TopicPartition.Error != nil {
				t.Fatalf("consume %s: %v", topic, ev.TopicPartition.Error)
			}
			r := record{
				Partition: ev.TopicPartition.Partition,
				Key:       ev.Key,
				Value:     ev.Value,
				Timestamp: ev.Timestamp,
				Offset:    int64(ev.TopicPartition.Offset),
			}
			for _, h := range ev.Headers {
				r.Headers = append(r.Headers, header{h.Key, h.Value})
			}
			r.Seq = seqOf(r.Headers)
			have[r.Partition]++
			got = append(got, r)
		case kafka.Error:
			if ev.IsFatal() {
				t.Fatalf("consume %s: %v", topic, ev)
			}
			t.Logf("consume %s: %v", topic, ev)
		}
	}
	for p, n := range counts {
		if have[p] > n {
			t.Errorf("partition %d: consumed %d records, produced %d", p, have[p], n)
		}
	}
	return got
}

func (c *confluentClient) listOffset(t testing.TB, ctx context.Context, topic string, partition int32, ts int64) int64 {
	t.Helper()
	c.mu.Lock()
	if c.querier == nil {
		c.querier = c.newConsumer(t)
	}
	q := c.querier
	c.mu.Unlock()
	timeoutMs := 10_000
	if dl, ok := ctx.Deadline(); ok {
		timeoutMs = max(1, int(time.Until(dl).Milliseconds()))
	}
	switch ts {
	case -2, -1:
		low, high, err := q.QueryWatermarkOffsets(topic, partition, timeoutMs)
		if err != nil {
			t.Fatalf("QueryWatermarkOffsets %s p%d: %v", topic, partition, err)
		}
		if ts == -2 {
			return low
		}
		return high
	default:
		res, err := q.OffsetsForTimes([]kafka.TopicPartition{{Topic: &topic, Partition: partition, Offset: kafka.Offset(ts)}}, timeoutMs)
		if err != nil {
			t.Fatalf("OffsetsForTimes %s p%d ts %d: %v", topic, partition, ts, err)
		}
		if len(res) != 1 || res[0].Error != nil {
			t.Fatalf("OffsetsForTimes %s p%d ts %d: %v", topic, partition, ts, res)
		}
		return int64(res[0].Offset)
	}
}
