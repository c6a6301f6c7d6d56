package compattests

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// Transactions with sarama: the copy scenario (txn_franzgo_test.go,
// copyPlan) with a transactional SyncProducer (Producer.Transaction.ID,
// Idempotent, Net.MaxOpenRequests=1; BeginTxn, AddMessageToTxn for the
// first step, AddOffsetsToTxn for the others, CommitTxn, AbortTxn) that
// copies what a sarama read_committed partition consumer read; the offsets
// go to a group without members (TxnOffsetCommit with generation -1, as
// sarama sends it). Then sarama consumers with IsolationLevel
// ReadCommitted and ReadUncommitted read out.

func TestTxnSarama(t *testing.T) {
	for _, v := range []struct {
		name    string
		version sarama.KafkaVersion
	}{
		{"V2_8_0_0", sarama.V2_8_0_0},
		{"MaxVersion-" + sarama.MaxVersion.String(), sarama.MaxVersion},
	} {
		t.Run(v.name, func(t *testing.T) { runTxnSarama(t, v.version) })
	}
}

func runTxnSarama(t *testing.T, version sarama.KafkaVersion) {
	e := newTxnEnv(t)
	ctx := testCtx(t, txnTimeout)
	in, out, group := e.copyFixture(t, ctx)
	sc := &saramaClient{addr: e.addr, version: version}

	read := readTxnSarama(t, ctx, sc, in, copyParts, sarama.ReadCommitted, copyPerPart)

	cfg := sc.config()
	cfg.Producer.Idempotent = true
	cfg.Producer.Transaction.ID = "txn-" + out
	cfg.Producer.Transaction.Timeout = 30 * time.Second
	cfg.Net.MaxOpenRequests = 1
	prod, err := sarama.NewSyncProducer([]string{e.addr}, cfg)
	if err != nil {
		t.Fatalf("sarama.NewSyncProducer (transactional): %v", err)
	}
	closeProd := sync.OnceValue(prod.Close)
	defer closeProd()
	if !prod.IsTransactional() {
		t.Fatalf("sarama producer with Transaction.ID is not transactional")
	}

	for i, step := range copyPlan {
		if err := prod.BeginTxn(); err != nil {
			t.Fatalf("step %d: BeginTxn: %v", i, err)
		}
		var msgs []*sarama.ProducerMessage
		for p := range int32(copyParts) {
			for off := step.From; off < step.To; off++ {
				m := read[p][off]
				msgs = append(msgs, &sarama.ProducerMessage{Topic: out, Partition: p, Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(m.Value)})
			}
		}
		done := make(chan error, 1)
		go func() { done <- prod.SendMessages(msgs) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("step %d: SendMessages: %v", i, err)
			}
		case <-ctx.Done():
			t.Fatalf("step %d: SendMessages: %v", i, ctx.Err())
		}
		if i == 0 {
			// AddMessageToTxn commits the offset after each message.
			for p := range int32(copyParts) {
				if err := prod.AddMessageToTxn(read[p][step.To-1], group, nil); err != nil {
					t.Fatalf("step %d: AddMessageToTxn: %v", i, err)
				}
			}
		} else {
			var pos []*sarama.PartitionOffsetMetadata
			for p := range int32(copyParts) {
				pos = append(pos, &sarama.PartitionOffsetMetadata{Partition: p, Offset: step.To, LeaderEpoch: -1})
			}
			if err := prod.AddOffsetsToTxn(map[string][]*sarama.PartitionOffsetMetadata{in: pos}, group); err != nil {
				t.Fatalf("step %d: AddOffsetsToTxn: %v", i, err)
			}
		}
		if step.Commit {
			err = prod.CommitTxn()
		} else {
			err = prod.AbortTxn()
		}
		if err != nil {
			t.Fatalf("step %d: end transaction (commit=%v): %v", i, step.Commit, err)
		}
		e.checkGroupOffsets(t, ctx, fmt.Sprintf("after step %d (%d-%d, commit=%v)", i, step.From, step.To, step.Commit), group, in, copyParts, copyCommittedAfter(i))
	}
	if err := closeProd(); err != nil {
		t.Errorf("close the transactional producer: %v", err)
	}

	e.checkCopyOut(t, ctx, out)
	rc, _ := copyWant(true)
	ru, _ := copyWant(false)
	checkTxnRead(t, "sarama ReadCommitted", saramaRecs(readTxnSarama(t, ctx, sc, out, copyParts, sarama.ReadCommitted, -1)), rc)
	checkTxnRead(t, "sarama ReadUncommitted", saramaRecs(readTxnSarama(t, ctx, sc, out, copyParts, sarama.ReadUncommitted, -1)), ru)
}

// readTxnSarama reads every partition of topic from the oldest offset with
// sarama partition consumers at isolation level iso: n records per
// partition, or (n < 0) up to the end record of each (left out).
func readTxnSarama(t testing.TB, ctx context.Context, sc *saramaClient, topic string, parts int32, iso sarama.IsolationLevel, n int) map[int32][]*sarama.ConsumerMessage {
	t.Helper()
	cfg := sc.config()
	cfg.Consumer.IsolationLevel = iso
	consumer, err := sarama.NewConsumer([]string{sc.addr}, cfg)
	if err != nil {
		t.Fatalf("sarama.NewConsumer: %v", err)
	}
	defer consumer.Close()
	got := make(map[int32][]*sarama.ConsumerMessage)
	for p := range parts {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("ConsumePartition %s p%d: %v", topic, p, err)
		}
		func() {
			defer pc.AsyncClose()
			timeout := time.After(30 * time.Second)
			for {
				if n >= 0 && len(got[p]) == n {
					return
				}
				select {
				case m := <-pc.Messages():
					if n < 0 && string(m.Value) == txnEndValue(p) {
						return
					}
					got[p] = append(got[p], m)
				case err := <-pc.Errors():
					t.Logf("sarama consume %s p%d: %v", topic, p, err)
				case <-timeout:
					t.Fatalf("sarama consume %s p%d (isolation %d): %d records after 30 s, no end; read: %v", topic, p, iso, len(got[p]), saramaRecs(got)[p])
				case <-ctx.Done():
					t.Fatalf("sarama consume %s p%d: %v", topic, p, ctx.Err())
				}
			}
		}()
	}
	return got
}

func saramaRecs(m map[int32][]*sarama.ConsumerMessage) map[int32][]txnRec {
	out := make(map[int32][]txnRec)
	for p, ms := range m {
		for _, msg := range ms {
			out[p] = append(out[p], txnRec{P: msg.Partition, Off: msg.Offset, V: string(msg.Value)})
		}
	}
	return out
}
