package compattests

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// IBM/sarama, configured for Kafka 2.8 (what many deployments pin) and for
// the newest version it knows (sarama.MaxVersion), which changes the
// protocol versions it sends.

func TestSarama(t *testing.T) {
	for _, v := range []struct {
		name    string
		version sarama.KafkaVersion
	}{
		{"V2_8_0_0", sarama.V2_8_0_0},
		{"MaxVersion-" + sarama.MaxVersion.String(), sarama.MaxVersion},
	} {
		t.Run(v.name, func(t *testing.T) {
			runClientSuite(t, clientSpec{
				newClient: func(t testing.TB, b broker) client {
					return &saramaClient{addr: b.Addr(), version: v.version, producers: make(map[string]sarama.SyncProducer)}
				},
				nullsDistinct: true,
			})
		})
	}
}

type saramaClient struct {
	addr    string
	version sarama.KafkaVersion

	mu        sync.Mutex
	client    sarama.Client // for admin, consumer and offsets
	producers map[string]sarama.SyncProducer
}

var saramaCodecs = map[string]sarama.CompressionCodec{
	"none":   sarama.CompressionNone,
	"gzip":   sarama.CompressionGZIP,
	"snappy": sarama.CompressionSnappy,
	"lz4":    sarama.CompressionLZ4,
	"zstd":   sarama.CompressionZSTD,
}

func (c *saramaClient) config() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.ClientID = "compat-tests-sarama"
	cfg.Version = c.version
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.MaxMessageBytes = maxMessageBytes
	cfg.Producer.Retry.Max = 10
	cfg.Producer.Retry.Backoff = 200 * time.Millisecond
	cfg.Producer.Flush.Frequency = 5 * time.Millisecond
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.MaxWaitTime = 250 * time.Millisecond
	return cfg
}

func (c *saramaClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.producers {
		p.Close()
	}
	if c.client != nil {
		c.client.Close()
	}
}

func (c *saramaClient) shared(t testing.TB) sarama.Client {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client == nil {
		cl, err := sarama.NewClient([]string{c.addr}, c.config())
		if err != nil {
			t.Fatalf("sarama.NewClient: %v", err)
		}
		c.client = cl
	}
	return c.client
}

func (c *saramaClient) createTopic(t testing.TB, _ context.Context, topic string, partitions int32) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin([]string{c.addr}, c.config())
	if err != nil {
		t.Fatalf("sarama.NewClusterAdmin: %v", err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false); err != nil {
		t.Fatalf("sarama CreateTopic %s: %v", topic, err)
	}
}

func (c *saramaClient) producer(t testing.TB, codec string) sarama.SyncProducer {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.producers[codec]; p != nil {
		return p
	}
	cfg := c.config()
	cfg.Producer.Compression = saramaCodecs[codec]
	p, err := sarama.NewSyncProducer([]string{c.addr}, cfg)
	if err != nil {
		t.Fatalf("sarama.NewSyncProducer: %v", err)
	}
	c.producers[codec] = p
	return p
}

func (c *saramaClient) produce(t testing.TB, ctx context.Context, topic, codec string, recs []record) {
	t.Helper()
	p := c.producer(t, codec)
	msgs := make([]*sarama.ProducerMessage, len(recs))
	for i, r := range recs {
		m := &sarama.ProducerMessage{
			Topic:     topic,
			Partition: r.Partition,
			Timestamp: r.Timestamp,
		}
		// A nil Encoder is a null key/value; ByteEncoder([]byte{}) an empty one.
		if r.Key != nil {
			m.Key = sarama.ByteEncoder(r.Key)
		}
		if r.Value != nil {
			m.Value = sarama.ByteEncoder(r.Value)
		}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
		msgs[i] = m
	}
	// SendMessages has no context; it is bounded by sarama's own retries.
	done := make(chan error, 1)
	go func() { done <- p.SendMessages(msgs) }()
	select {
	case err := <-done:
		if err != nil {
			var perrs sarama.ProducerErrors
			if errors.As(err, &perrs) && len(perrs) > 0 {
				t.Fatalf("produce %s (%s): %d errors, first: %v", topic, codec, len(perrs), perrs[0].Err)
			}
			t.Fatalf("produce %s (%s): %v", topic, codec, err)
		}
	case <-ctx.Done():
		t.Fatalf("produce %s (%s): %v", topic, codec, ctx.Err())
	}
	for i, m := range msgs {
		if m.Partition != recs[i].Partition {
			t.Errorf("seq %d produced to partition %d, want %d", recs[i].Seq, m.Partition, recs[i].Partition)
		}
		recs[i].Offset = m.Offset
	}
}

func fromSarama(m *sarama.ConsumerMessage) record {
	r := record{
		Partition: m.Partition,
		Key:       m.Key,
		Value:     m.Value,
		Timestamp: m.Timestamp,
		Offset:    m.Offset,
	}
	for _, h := range m.Headers {
		r.Headers = append(r.Headers, header{string(h.Key), h.Value})
	}
	r.Seq = seqOf(r.Headers)
	return r
}

func (c *saramaClient) consume(t testing.TB, ctx context.Context, topic string, counts map[int32]int) []record {
	t.Helper()
	consumer, err := sarama.NewConsumer([]string{c.addr}, c.config())
	if err != nil {
		t.Fatalf("sarama.NewConsumer: %v", err)
	}
	defer consumer.Close()
	// Start every partition first so their fetches overlap.
	pcs := make(map[int32]sarama.PartitionConsumer, len(counts))
	defer func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
	}()
	for p := range counts {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("ConsumePartition %s p%d: %v", topic, p, err)
		}
		pcs[p] = pc
	}
	var got []record
	for p, n := range counts {
		pc := pcs[p]
		for have := 0; have < n; {
			select {
			case m := <-pc.Messages():
				got = append(got, fromSarama(m))
				have++
			case err := <-pc.Errors():
				t.Logf("consume %s p%d: %v", topic, p, err)
			case <-ctx.Done():
				t.Fatalf("consume %s p%d: %d of %d records: %v", topic, p, have, n, ctx.Err())
			}
		}
	}
	return got
}

func (c *saramaClient) listOffset(t testing.TB, _ context.Context, topic string, partition int32, ts int64) int64 {
	t.Helper()
	// sarama.OffsetOldest is -2 and sarama.OffsetNewest -1, as on the wire.
	off, err := c.shared(t).GetOffset(topic, partition, ts)
	if err != nil {
		t.Fatalf("sarama GetOffset %s p%d ts %d: %v", topic, partition, ts, err)
	}
	return off
}
