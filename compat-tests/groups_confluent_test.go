//go:build cgo

package compattests

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

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
	for !reachedAll(next, until) {
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

// TestGroupConfluentCooperativeTwoMembers: two librdkafka consumers with the
// cooperative-sticky strategy (KIP-429 incremental rebalancing) and static
// membership (group.instance.id) share a 4-partition topic: both get
// partitions, every record is read exactly once, and the group ends Stable
// with both members.
func TestGroupConfluentCooperativeTwoMembers(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	f := newGroupFixture(t, 4)
	f.produce(t, ctx, 25)
	var mu sync.Mutex
	seen := map[int32]map[int64]int{}
	owners := map[int32]map[string]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, name := range []string{"coop-a", "coop-b"} {
		c, err := kafka.NewConsumer(&kafka.ConfigMap{
			"bootstrap.servers":             f.b.Addr(),
			"group.id":                      f.group,
			"group.instance.id":             name,
			"client.id":                     name,
			"partition.assignment.strategy": "cooperative-sticky",
			"enable.auto.commit":            true,
			"auto.commit.interval.ms":       200,
			"auto.offset.reset":             "earliest",
			"fetch.wait.max.ms":             100,
			"session.timeout.ms":            10000,
			"log_level":                     rdkafkaLogLevel,
		})
		if err != nil {
			t.Fatalf("kafka.NewConsumer: %v", err)
		}
		if err := c.Subscribe(f.topic, nil); err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch ev := c.Poll(100).(type) {
				case *kafka.Message:
					if ev.TopicPartition.Error != nil {
						t.Errorf("%s: %v", name, ev.TopicPartition.Error)
						continue
					}
					p, o := ev.TopicPartition.Partition, int64(ev.TopicPartition.Offset)
					mu.Lock()
					if seen[p] == nil {
						seen[p], owners[p] = map[int64]int{}, map[string]bool{}
					}
					seen[p][o]++
					owners[p][name] = true
					mu.Unlock()
				case kafka.Error:
					if ev.IsFatal() {
						t.Errorf("%s: %v", name, ev)
					}
				}
			}
		}()
		if name == "coop-a" {
			// a alone first, so b's join is an incremental rebalance.
			waitDistinct(t, &mu, seen, 100, "a alone")
		}
	}
	d := f.waitGroupState(t, ctx, 30*time.Second, "Stable", memberIDsOf(t, ctx, f, 2)...)
	if d.Protocol != "cooperative-sticky" {
		t.Errorf("protocol %q, want cooperative-sticky", d.Protocol)
	}
	f.produce(t, ctx, 25)
	waitDistinct(t, &mu, seen, 200, "both")
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	readers := map[string]bool{}
	for p, offs := range seen {
		for o, n := range offs {
			if n != 1 {
				t.Errorf("p%d offset %d read %d times", p, o, n)
			}
		}
		for who := range owners[p] {
			readers[who] = true
		}
	}
	if !readers["coop-b"] {
		t.Errorf("b never got a partition: readers %v", readers)
	}
}
