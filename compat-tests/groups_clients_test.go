package compattests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	kafka "github.com/segmentio/kafka-go"
)

// The resume scenario (runGroupResume, groups_test.go) with sarama,
// segmentio/kafka-go, kafka-python and confluent-kafka (Python), and kcat's
// balanced consumer (-G) reading, committing and resuming.

// TestGroupSarama: sarama's ConsumerGroup (range strategy, autocommit off,
// MarkOffset + Commit) configured for Kafka 2.8 and for sarama.MaxVersion,
// which changes the JoinGroup/SyncGroup/OffsetCommit versions it sends.
func TestGroupSarama(t *testing.T) {
	for _, v := range []struct {
		name    string
		version sarama.KafkaVersion
	}{
		{"V2_8_0_0", sarama.V2_8_0_0},
		{"MaxVersion-" + sarama.MaxVersion.String(), sarama.MaxVersion},
	} {
		t.Run(v.name, func(t *testing.T) { runGroupResume(t, saramaGroupRun(v.version)) })
	}
}

func saramaGroupRun(version sarama.KafkaVersion) groupRun {
	return func(t *testing.T, ctx context.Context, f *groupFixture, until, commit map[int32]int64) []groupRec {
		t.Helper()
		cfg := (&saramaClient{version: version}).config()
		cfg.ClientID = "compat-tests-sarama-group"
		cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
		cfg.Consumer.Offsets.AutoCommit.Enable = false
		cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
		group, err := sarama.NewConsumerGroup([]string{f.b.Addr()}, f.group, cfg)
		if err != nil {
			t.Fatalf("sarama.NewConsumerGroup: %v", err)
		}
		go func() {
			for err := range group.Errors() {
				t.Logf("sarama ConsumerGroup: %v", err)
			}
		}()
		h := &saramaGroupHandler{topic: f.topic, until: until, commit: commit, next: make(map[int32]int64), done: make(chan struct{})}
		cctx, cancel := context.WithCancel(ctx)
		consumed := make(chan error, 1)
		go func() {
			// Consume returns at the end of every session (a rebalance);
			// join again until canceled.
			for cctx.Err() == nil {
				if err := group.Consume(cctx, []string{f.topic}, h); err != nil && cctx.Err() == nil {
					consumed <- err
					return
				}
			}
			consumed <- nil
		}()
		stop := func() {
			cancel()
			if err := <-consumed; err != nil {
				t.Errorf("sarama ConsumerGroup.Consume: %v", err)
			}
			if err := group.Close(); err != nil { // LeaveGroup
				t.Errorf("sarama ConsumerGroup.Close: %v", err)
			}
		}
		select {
		case <-h.done:
		case <-ctx.Done():
			stop()
			h.mu.Lock()
			defer h.mu.Unlock()
			t.Fatalf("sarama group member: read up to %s of %s: %v", fmtOffsets(h.next), fmtOffsets(until), ctx.Err())
		}
		stop()
		h.mu.Lock()
		defer h.mu.Unlock()
		return slices.Clone(h.read)
	}
}

// saramaGroupHandler records every message; once every partition has been
// read up to until, it marks commit and commits it within the session.
type saramaGroupHandler struct {
	topic         string
	until, commit map[int32]int64

	mu       sync.Mutex
	read     []groupRec
	next     map[int32]int64
	finished bool
	done     chan struct{}
}

func (h *saramaGroupHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *saramaGroupHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *saramaGroupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			h.add(sess, m)
		case <-sess.Context().Done():
			return nil
		}
	}
}

func (h *saramaGroupHandler) add(sess sarama.ConsumerGroupSession, m *sarama.ConsumerMessage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.read = append(h.read, groupRec{m.Partition, m.Offset, string(m.Value)})
	h.next[m.Partition] = max(h.next[m.Partition], m.Offset+1)
	if h.finished {
		return
	}
	for p, u := range h.until {
		if h.next[p] < u {
			return
		}
	}
	h.finished = true
	for p, o := range h.commit {
		// The offset of the next message to read, as Kafka has it.
		sess.MarkOffset(h.topic, p, o, "")
	}
	sess.Commit() // synchronous; failures go to Errors()
	close(h.done)
}

// TestGroupKafkaGo: segmentio/kafka-go's Reader with a GroupID (its
// default range and round-robin balancers, CommitInterval 0: CommitMessages
// commits synchronously).
func TestGroupKafkaGo(t *testing.T) {
	runGroupResume(t, kafkaGoGroupRun)
}

func kafkaGoGroupRun(t *testing.T, ctx context.Context, f *groupFixture, until, commit map[int32]int64) []groupRec {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:           []string{f.b.Addr()},
		GroupID:           f.group,
		Topic:             f.topic,
		StartOffset:       kafka.FirstOffset,
		MinBytes:          1,
		MaxBytes:          1 << 20,
		MaxWait:           250 * time.Millisecond,
		HeartbeatInterval: time.Second,
		SessionTimeout:    10 * time.Second,
		RebalanceTimeout:  10 * time.Second,
		JoinGroupBackoff:  500 * time.Millisecond,
		CommitInterval:    0,
	})
	closed := false
	defer func() {
		if !closed {
			r.Close()
		}
	}()
	var got []groupRec
	next := make(map[int32]int64)
	// kafka-go commits a message's offset + 1: keep the message just
	// before each commit offset.
	toCommit := make(map[int32]kafka.Message)
	for !reachedAll(next, until) {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("kafka-go group member: read up to %s of %s: %v", fmtOffsets(next), fmtOffsets(until), err)
		}
		p := int32(m.Partition)
		got = append(got, groupRec{p, m.Offset, string(m.Value)})
		next[p] = max(next[p], m.Offset+1)
		if c, ok := commit[p]; ok && m.Offset+1 == c {
			toCommit[p] = m
		}
	}
	var msgs []kafka.Message
	for _, p := range slices.Sorted(maps.Keys(commit)) {
		m, ok := toCommit[p]
		if !ok {
			t.Fatalf("kafka-go group member: never read p%d offset %d, so it cannot commit %d", p, commit[p]-1, commit[p])
		}
		msgs = append(msgs, m)
	}
	if err := r.CommitMessages(ctx, msgs...); err != nil {
		t.Fatalf("kafka-go CommitMessages %s: %v", fmtOffsets(commit), err)
	}
	closed = true
	if err := r.Close(); err != nil { // LeaveGroup
		t.Errorf("kafka-go Reader.Close: %v", err)
	}
	return got
}

// TestGroupKafkaPython: kafka-python's KafkaConsumer with a group_id
// (subscribe, poll, commit(offsets), close), via
// testdata/group_member.py under /usr/bin/python3.
func TestGroupKafkaPython(t *testing.T) {
	pythonModule(t, "kafka", "python3-kafka")
	runGroupResume(t, pythonGroupRun("kafka-python"))
}

// TestGroupConfluentPython: the same with confluent-kafka (Python)'s
// Consumer (subscribe, poll, commit(offsets, asynchronous=False), close).
func TestGroupConfluentPython(t *testing.T) {
	pythonModule(t, "confluent_kafka", "python3-confluent-kafka")
	runGroupResume(t, pythonGroupRun("confluent"))
}

func pythonGroupRun(clientName string) groupRun {
	return func(t *testing.T, ctx context.Context, f *groupFixture, until, commit map[int32]int64) []groupRec {
		t.Helper()
		path, err := filepath.Abs(filepath.Join("testdata", "group_member.py"))
		if err != nil {
			t.Fatal(err)
		}
		spec := func(m map[int32]int64) string {
			var parts []string
			for _, p := range slices.Sorted(maps.Keys(m)) {
				parts = append(parts, fmt.Sprintf("%d=%d", p, m[p]))
			}
			return strings.Join(parts, ",")
		}
		cmd := exec.CommandContext(ctx, systemPython, path, clientName, f.b.Addr(), f.topic, f.group, spec(until), spec(commit))
		cmd.Env = pythonEnv()
		cmd.WaitDelay = 5 * time.Second
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		if stderr.Len() > 0 {
			t.Logf("group_member.py %s stderr:\n%s", clientName, stderr.Bytes())
		}
		if err != nil {
			t.Fatalf("group_member.py %s: %v", clientName, err)
		}
		var got []groupRec
		sc := bufio.NewScanner(&stdout)
		for sc.Scan() {
			var r groupRec
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("group_member.py %s: output line %q: %v", clientName, sc.Bytes(), err)
			}
			got = append(got, r)
		}
		return got
	}
}

// TestGroupKcat: kcat's balanced consumer (-G, librdkafka's KafkaConsumer
// with its default auto commit) run to the end with -e: the first run reads
// everything and commits the end, a second run reads nothing, and after
// more records are produced a third run reads exactly those. kcat -G -o
// beginning would set every assigned partition's start offset (ignoring the
// committed ones), so auto.offset.reset=earliest stands in for it.
func TestGroupKcat(t *testing.T) {
	bin := kcatPath(t)
	f := newGroupFixture(t, groupPartitions)
	ctx := testCtx(t, groupTimeout)
	f.produce(t, ctx, 10)
	run := func(who string) []groupRec {
		t.Helper()
		start := time.Now()
		k := &kcat{bin: bin, addr: f.b.Addr()}
		out := k.run(t, ctx, nil, "-G", f.group, "-e", "-J",
			"-X", "topic.auto.offset.reset=earliest",
			"-X", "auto.commit.interval.ms=100",
			"-X", "fetch.wait.max.ms=250",
			f.topic)
		var got []groupRec
		for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var m struct {
				Topic     string  `json:"topic"`
				Partition int32   `json:"partition"`
				Offset    int64   `json:"offset"`
				Payload   *string `json:"payload"`
			}
			if err := json.Unmarshal(line, &m); err != nil {
				t.Fatalf("%s: kcat -J line %q: %v", who, line, err)
			}
			if m.Topic != f.topic || m.Payload == nil {
				t.Errorf("%s: kcat read %s p%d offset %d with a null value", who, m.Topic, m.Partition, m.Offset)
				continue
			}
			got = append(got, groupRec{m.Partition, m.Offset, *m.Payload})
		}
		t.Logf("%s: read %d records (%s)", who, len(got), time.Since(start).Round(time.Millisecond))
		return got
	}

	first := run("first kcat -G")
	checkGroupRead(t, "first kcat -G", first, zeroOffsets(f.partitions), f.end, true)
	f.checkCommitted(t, ctx, "after the first kcat -G", f.end)
	f.waitEmpty(t, ctx)

	again := run("second kcat -G")
	checkGroupRead(t, "second kcat -G", again, f.end, f.end, true)
	f.checkCommitted(t, ctx, "after the second kcat -G", f.end)
	f.waitEmpty(t, ctx)

	before := maps.Clone(f.end)
	f.produce(t, ctx, 5)
	third := run("third kcat -G")
	checkGroupRead(t, "third kcat -G", third, before, f.end, true)
	f.checkCommitted(t, ctx, "after the third kcat -G", f.end)
	f.waitEmpty(t, ctx)
}
