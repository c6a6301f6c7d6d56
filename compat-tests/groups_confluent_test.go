//go:build cgo

package compattests

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// TestGroupConfluent: the resume scenario (groups_test.go) with
// confluent-kafka-go's Consumer (librdkafka's KafkaConsumer: Subscribe,
// Poll, CommitOffsets, Close; autocommit off).
func TestGroupConfluent(t *testing.T) {
	t.Logf("librdkafka %s (bundled with confluent-kafka-go)", kafkaLibVersion())
	runGroupResume(t, confluentGroupRun)
}

func confluentGroupRun(t *testing.T, ctx context.Context, f *groupFixture, until, commit map[int32]int64) []groupRec {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{
		"bootstrap.servers":  f.b.Addr(),
		"group.id":           f.group,
		"client.id":          "compat-tests-confluent-group",
		"enable.auto.commit": false,
		"auto.offset.reset":  "earliest",
		"fetch.wait.max.ms":  250,
		"session.timeout.ms": 10000,
		"log_level":          rdkafkaLogLevel,
	})
	if err != nil {
		t.Fatalf("kafka.NewConsumer: %v", err)
	}
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	if err := c.Subscribe(f.topic, nil); err != nil {
		t.Fatalf("confluent Subscribe %s: %v", f.topic, err)
	}
	var got []groupRec
	next := make(map[int32]int64)
	reached := func() bool {
		for p, u := range until {
			if next[p] < u {
				return false
			}
		}
		return true
	}
	for !reached() {
		if err := ctx.Err(); err != nil {
			t.Fatalf("confluent group member: read up to %s of %s: %v", fmtOffsets(next), fmtOffsets(until), err)
		}
		switch ev := c.Poll(200).(type) {
		case *kafka.Message:
			if ev.TopicPartition.Error != nil {
				t.Fatalf("confluent group member: %v", ev.TopicPartition.Error)
			}
			p, o := ev.TopicPartition.Partition, int64(ev.TopicPartition.Offset)
			got = append(got, groupRec{p, o, string(ev.Value)})
			next[p] = max(next[p], o+1)
		case kafka.Error:
			if ev.IsFatal() {
				t.Fatalf("confluent group member: %v", ev)
			}
			t.Logf("confluent group member: %v", ev)
		}
	}
	var tps []kafka.TopicPartition
	for _, p := range slices.Sorted(maps.Keys(commit)) {
		tps = append(tps, kafka.TopicPartition{Topic: &f.topic, Partition: p, Offset: kafka.Offset(commit[p])})
	}
	done, err := c.CommitOffsets(tps) // synchronous
	if err != nil {
		t.Fatalf("confluent CommitOffsets %s: %v", fmtOffsets(commit), err)
	}
	for _, tp := range done {
		if tp.Error != nil {
			t.Fatalf("confluent CommitOffsets p%d: %v", tp.Partition, tp.Error)
		}
	}
	closed = true
	if err := c.Close(); err != nil { // LeaveGroup
		t.Errorf("confluent Consumer.Close: %v", err)
	}
	return got
}
