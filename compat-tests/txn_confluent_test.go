//go:build cgo

package compattests

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Transactions with confluent-kafka-go (bundled librdkafka): the copy
// scenario (txn_franzgo_test.go, copyPlan) with a transactional Producer
// (InitTransactions, BeginTransaction, Produce, SendOffsetsToTransaction
// with the group metadata of a subscribed Consumer, CommitTransaction,
// AbortTransaction), then librdkafka consumers at isolation.level
// read_committed and read_uncommitted read out.

func TestTxnConfluent(t *testing.T) {
	t.Logf("librdkafka %s (bundled with confluent-kafka-go)", kafkaLibVersion())
	e := newTxnEnv(t)
	ctx := testCtx(t, txnTimeout)
	in, out, group := e.copyFixture(t, ctx)

	cons, err := kafka.NewConsumer(&kafka.ConfigMap{
		"bootstrap.servers":    e.addr,
		"group.id":             group,
		"enable.auto.commit":   false,
		"auto.offset.reset":    "earliest",
		"isolation.level":      "read_committed",
		"enable.partition.eof": false,
		"fetch.wait.max.ms":    250,
		"session.timeout.ms":   10000,
		"log_level":            rdkafkaLogLevel,
	})
	if err != nil {
		t.Fatalf("kafka.NewConsumer: %v", err)
	}
	closeCons := sync.OnceValue(cons.Close)
	defer closeCons()
	if err := cons.Subscribe(in, nil); err != nil {
		t.Fatalf("Subscribe %s: %v", in, err)
	}

	prod, err := kafka.NewProducer(&kafka.ConfigMap{
		"bootstrap.servers":      e.addr,
		"transactional.id":       "txn-" + out,
		"transaction.timeout.ms": 30000,
		"linger.ms":              5,
		"log_level":              rdkafkaLogLevel,
		"go.logs.channel.enable": false,
	})
	if err != nil {
		t.Fatalf("kafka.NewProducer: %v", err)
	}
	closeProd := sync.OnceFunc(prod.Close)
	defer closeProd()
	go func() {
		for ev := range prod.Events() {
			if err, ok := ev.(kafka.Error); ok {
				t.Logf("producer event: %v", err)
			}
		}
	}()
	if err := prod.InitTransactions(ctx); err != nil {
		t.Fatalf("InitTransactions: %v", err)
	}

	// What the consumer read, per partition, by offset.
	read := make(map[int32][]*kafka.Message)
	fill := func(upto int64) {
		t.Helper()
		for {
			full := true
			for p := range int32(copyParts) {
				full = full && int64(len(read[p])) >= upto
			}
			if full {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("consumer of %s: read %d, %d records, want %d each: %v", in, len(read[0]), len(read[1]), upto, ctx.Err())
			}
			switch ev := cons.Poll(200).(type) {
			case *kafka.Message:
				if ev.TopicPartition.Error != nil {
					t.Fatalf("consume %s: %v", in, ev.TopicPartition.Error)
				}
				p, off := ev.TopicPartition.Partition, int64(ev.TopicPartition.Offset)
				if off != int64(len(read[p])) || string(ev.Value) != copyValue(p, off) {
					t.Fatalf("consumer of %s p%d: record %q at offset %d after %d records", in, p, ev.Value, off, len(read[p]))
				}
				read[p] = append(read[p], ev)
			case kafka.Error:
				if ev.IsFatal() {
					t.Fatalf("consume %s: %v", in, ev)
				}
				t.Logf("consume %s: %v", in, ev)
			}
		}
	}

	for i, step := range copyPlan {
		fill(step.To)
		if err := prod.BeginTransaction(); err != nil {
			t.Fatalf("step %d: BeginTransaction: %v", i, err)
		}
		reports := make(chan kafka.Event, copyParts*copyPerPart)
		n := 0
		for p := range int32(copyParts) {
			for off := step.From; off < step.To; off++ {
				m := read[p][off]
				if err := prod.Produce(&kafka.Message{
					TopicPartition: kafka.TopicPartition{Topic: &out, Partition: p},
					Key:            m.Key,
					Value:          m.Value,
				}, reports); err != nil {
					t.Fatalf("step %d: Produce: %v", i, err)
				}
				n++
			}
		}
		for range n {
			select {
			case ev := <-reports:
				if m, ok := ev.(*kafka.Message); !ok || m.TopicPartition.Error != nil {
					t.Fatalf("step %d: delivery report %v", i, ev)
				}
			case <-ctx.Done():
				t.Fatalf("step %d: waiting for delivery reports: %v", i, ctx.Err())
			}
		}
		var offsets []kafka.TopicPartition
		for p := range int32(copyParts) {
			offsets = append(offsets, kafka.TopicPartition{Topic: &in, Partition: p, Offset: kafka.Offset(step.To)})
		}
		meta, err := cons.GetConsumerGroupMetadata()
		if err != nil {
			t.Fatalf("step %d: GetConsumerGroupMetadata: %v", i, err)
		}
		if err := prod.SendOffsetsToTransaction(ctx, offsets, meta); err != nil {
			t.Fatalf("step %d: SendOffsetsToTransaction: %v", i, err)
		}
		if step.Commit {
			err = prod.CommitTransaction(ctx)
		} else {
			err = prod.AbortTransaction(ctx)
		}
		if err != nil {
			t.Fatalf("step %d: end transaction (commit=%v): %v", i, step.Commit, err)
		}
		e.checkGroupOffsets(t, ctx, fmt.Sprintf("after step %d (%d-%d, commit=%v)", i, step.From, step.To, step.Commit), group, in, copyParts, copyCommittedAfter(i))
	}
	closeProd()
	if err := closeCons(); err != nil {
		t.Errorf("close the consumer: %v", err)
	}

	e.checkCopyOut(t, ctx, out)
	rc, _ := copyWant(true)
	ru, _ := copyWant(false)
	checkTxnRead(t, "librdkafka read_committed", readTxnConfluent(t, ctx, e.addr, out, copyParts, "read_committed"), rc)
	checkTxnRead(t, "librdkafka read_uncommitted", readTxnConfluent(t, ctx, e.addr, out, copyParts, "read_uncommitted"), ru)
}

// readTxnConfluent reads every partition of topic from the start with a
// librdkafka consumer (assigned, no group) at isolation until the end record
// of each, and returns the records before it.
func readTxnConfluent(t testing.TB, ctx context.Context, addr, topic string, parts int32, isolation string) map[int32][]txnRec {
	t.Helper()
	cons, err := kafka.NewConsumer(&kafka.ConfigMap{
		"bootstrap.servers":    addr,
		"group.id":             "compat-tests-confluent-reader",
		"enable.auto.commit":   false,
		"isolation.level":      isolation,
		"enable.partition.eof": false,
		"fetch.wait.max.ms":    250,
		"log_level":            rdkafkaLogLevel,
	})
	if err != nil {
		t.Fatalf("kafka.NewConsumer: %v", err)
	}
	defer cons.Close()
	var tps []kafka.TopicPartition
	for p := range parts {
		tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: p, Offset: kafka.OffsetBeginning})
	}
	if err := cons.Assign(tps); err != nil {
		t.Fatalf("Assign %s: %v", topic, err)
	}
	got := make(map[int32][]txnRec)
	done := make(map[int32]bool)
	deadline := time.Now().Add(30 * time.Second)
	for len(done) < int(parts) {
		if ctx.Err() != nil || time.Now().After(deadline) {
			t.Fatalf("librdkafka %s of %s: the end record was not reached on every partition; read so far: %s", isolation, topic, fmtTxnRecs(got))
		}
		switch ev := cons.Poll(200).(type) {
		case *kafka.Message:
			if ev.TopicPartition.Error != nil {
				t.Fatalf("librdkafka %s of %s: %v", isolation, topic, ev.TopicPartition.Error)
			}
			p := ev.TopicPartition.Partition
			switch {
			case done[p]:
				t.Errorf("librdkafka %s of %s p%d: record %q after the end record", isolation, topic, p, ev.Value)
			case string(ev.Value) == txnEndValue(p):
				done[p] = true
			default:
				got[p] = append(got[p], txnRec{P: p, Off: int64(ev.TopicPartition.Offset), V: string(ev.Value)})
			}
		case kafka.Error:
			if ev.IsFatal() {
				t.Fatalf("librdkafka %s of %s: %v", isolation, topic, ev)
			}
			t.Logf("librdkafka %s of %s: %v", isolation, topic, ev)
		}
	}
	return got
}
