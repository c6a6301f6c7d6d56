package compattests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// txnOutcome is what a transaction's producer was told.
type txnOutcome int

const (
	txnCommitted txnOutcome = iota
	txnAborted
	txnUnknown // the end failed: committed or aborted, as a whole
)

// TestClusterTransactions: a franz-go transactional producer on a
// 3-broker cluster writes transactions of one record per partition
// (every third aborted), and the transaction coordinator's broker is
// killed with SIGKILL half way. The producer goes on through the new
// coordinator (the transaction log is replicated). A read_committed
// consumer then sees every committed transaction whole and once, nothing
// of an aborted one, and a transaction whose end failed either whole or
// not at all; no transaction is left hanging (the LSO reaches the high
// watermark).
func TestClusterTransactions(t *testing.T) {
	c := startSynCluster(t, 3)
	adm := c.admin(t)
	ctx := testCtx(t, 3*time.Minute)
	topic := uniqueTopic(t)
	const parts = 3
	c.createTopic(t, adm, topic, parts)
	txnID := "tx-" + topic
	newProducer := func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.seeds()...), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionTimeout(10*time.Second),
			kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }))
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	prod := newProducer()
	defer func() { prod.Close() }()
	outcomes := map[int]txnOutcome{}
	runTxn := func(i int) error {
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := prod.BeginTransaction(); err != nil {
			return err
		}
		var perr error
		for p := range int32(parts) {
			r := &kgo.Record{Partition: p, Value: fmt.Appendf(nil, "t%d-p%d", i, p)}
			if err := prod.ProduceSync(tctx, r).FirstErr(); err != nil && perr == nil {
				perr = err
			}
		}
		commit := i%3 != 2 && perr == nil
		end := kgo.TryCommit
		if !commit {
			end = kgo.TryAbort
			if perr != nil {
				prod.AbortBufferedRecords(tctx)
			}
		}
		if err := prod.EndTransaction(tctx, end); err != nil {
			outcomes[i] = txnUnknown
			return err
		}
		// An abort answered is an abort, a produce that failed part way
		// included: none of its records may be read.
		outcomes[i] = txnAborted
		if commit {
			outcomes[i] = txnCommitted
		}
		return nil
	}
	const before, after = 15, 30
	for i := range before {
		if err := runTxn(i); err != nil {
			t.Fatalf("transaction %d before the kill: %v", i, err)
		}
	}
	var coordID int32 = -1
	adm.FindTxnCoordinators(ctx, txnID).Each(func(d kadm.FindCoordinatorResponse) {
		if d.Err == nil {
			coordID = d.NodeID
		}
	})
	if coordID < 0 {
		t.Fatalf("no transaction coordinator for %s", txnID)
	}
	// The kill lands while the next transactions run (mid-produce or
	// mid-end): a decision the old coordinator made is finished by the new
	// one, or the transaction is aborted whole.
	var killedNs atomic.Int64 // when the kill returned (the process is gone)
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(30 * time.Millisecond)
		c.brokers[coordID].Kill9(t)
		killedNs.Store(time.Now().UnixNano())
	}()
	t.Logf("%d transactions; killing the transaction coordinator, broker %d, in 30 ms", before, coordID)
	start := time.Now()
	var firstCommit time.Duration
	failed := 0
	i := before
	for committedAfter := 0; committedAfter < after; i++ {
		if time.Since(start) > 90*time.Second {
			t.Fatalf("only %d transactions committed in 90 s after the kill (%d failed)", committedAfter, failed)
		}
		began := time.Now().UnixNano()
		err := runTxn(i)
		if err != nil {
			failed++
			t.Logf("transaction %d: %v", i, err)
			// kgo cannot go on after some errors (a fence, a failed end):
			// a new producer of the same id aborts whatever was open.
			prod.Close()
			prod = newProducer()
			continue
		}
		// Counted only if it began once the coordinator was gone.
		if k := killedNs.Load(); k != 0 && began > k && outcomes[i] == txnCommitted {
			if committedAfter == 0 {
				firstCommit = time.Duration(time.Now().UnixNano() - k)
			}
			committedAfter++
		}
	}
	prod.Close()
	<-done
	t.Logf("after the kill: first transaction begun and committed after it %v later, %d transactions failed and were retried", firstCommit.Round(time.Millisecond), failed)
	c.brokers[coordID].Start(t)

	// No transaction hangs: the last stable offsets reach the ends.
	var ends map[int32]int64
	deadline := time.Now().Add(40 * time.Second)
	for {
		hw, err1 := adm.ListEndOffsets(ctx, topic)
		lso, err2 := adm.ListCommittedOffsets(ctx, topic)
		if err := errors.Join(err1, err2); err == nil && hw.Error() == nil && lso.Error() == nil {
			ends = map[int32]int64{}
			same := true
			hw.Each(func(o kadm.ListedOffset) {
				ends[o.Partition] = o.Offset
				if l, ok := lso.Lookup(topic, o.Partition); !ok || l.Offset != o.Offset {
					same = false
				}
			})
			if same && len(ends) == parts {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last stable offsets did not reach the high watermarks: %v %v", hw, lso)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(c.seeds()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	for p, e := range ends {
		if e == 0 {
			delete(ends, p)
		}
	}
	seen := map[string]int{}
	byTxn := map[int]int{}
	for len(ends) > 0 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read_committed read: %v with partitions %v still to reach", ctx.Err(), ends)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if e, ok := ends[r.Partition]; ok && r.Offset+1 >= e {
				delete(ends, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			v := string(r.Value)
			seen[v]++
			var n, p int
			if _, err := fmt.Sscanf(v, "t%d-p%d", &n, &p); err != nil {
				t.Errorf("unexpected record %q", v)
				return
			}
			byTxn[n]++
		})
	}
	var bad []string
	for v, n := range seen {
		if n > 1 {
			bad = append(bad, fmt.Sprintf("%s read %d times", v, n))
		}
	}
	committed, aborted, unknown := 0, 0, 0
	for n, o := range outcomes {
		got := byTxn[n]
		switch o {
		case txnCommitted:
			committed++
			if got != parts {
				bad = append(bad, fmt.Sprintf("committed transaction %d: %d of %d records", n, got, parts))
			}
		case txnAborted:
			aborted++
			if got != 0 {
				bad = append(bad, fmt.Sprintf("aborted transaction %d: %d records visible", n, got))
			}
		case txnUnknown:
			unknown++
			if got != 0 && got != parts {
				bad = append(bad, fmt.Sprintf("transaction %d (end failed): %d of %d records, not all or none", n, got, parts))
			}
		}
	}
	for n := range byTxn {
		if _, ok := outcomes[n]; !ok {
			bad = append(bad, fmt.Sprintf("transaction %d was never run", n))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("read_committed:\n%s", strings.Join(bad, "\n"))
	}
	t.Logf("read_committed: %d committed transactions whole, %d aborted invisible, %d with a failed end all or none", committed, aborted, unknown)
}

// TestClusterExactlyOnce: a franz-go GroupTransactSession (KIP-447's
// consume-transform-produce: the output and the group's offsets commit in
// one transaction) copies a topic on a 3-broker cluster, and the broker
// coordinating the group and the transactions is killed with SIGKILL half
// way. The copy, read with read_committed, holds every input record
// exactly once.
func TestClusterExactlyOnce(t *testing.T) {
	c := startSynCluster(t, 3)
	adm := c.admin(t)
	ctx := testCtx(t, 3*time.Minute)
	in, out := uniqueTopic(t), uniqueTopic(t)+"-out"
	const parts, n = 3, 600
	c.createTopic(t, adm, in, parts)
	c.createTopic(t, adm, out, parts)
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.seeds()...), kgo.DefaultProduceTopic(in))
	if err != nil {
		t.Fatal(err)
	}
	var rs []*kgo.Record
	for i := range n {
		rs = append(rs, &kgo.Record{Partition: int32(i % parts), Value: fmt.Appendf(nil, "r%d", i)})
	}
	if err := prod.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	prod.Close()
	group, txnID := "eos-"+in, "eos-tx-"+in
	newSession := func() *kgo.GroupTransactSession {
		s, err := kgo.NewGroupTransactSession(kgo.SeedBrokers(c.seeds()...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(in),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(out),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.TransactionTimeout(10*time.Second),
			kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(500*time.Millisecond),
			kgo.FetchMaxWait(200*time.Millisecond), kgo.MaxBufferedRecords(50),
			kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	sess := newSession()
	defer func() { sess.Close() }()
	copied, ends, failed := 0, 0, 0
	var coordID int32 = -1
	var killed time.Time
	for copied < n {
		if !killed.IsZero() && time.Since(killed) > 90*time.Second {
			t.Fatalf("%d of %d copied, 90 s after the kill (%d ends failed)", copied, n, failed)
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fs := sess.PollRecords(pctx, 40)
		cancel()
		if ctx.Err() != nil {
			t.Fatalf("%d of %d copied: %v", copied, n, ctx.Err())
		}
		if err := sess.Begin(); err != nil {
			t.Fatalf("begin: %v", err)
		}
		batch := 0
		fs.EachRecord(func(r *kgo.Record) {
			batch++
			sess.Produce(ctx, &kgo.Record{Partition: r.Partition, Value: r.Value}, nil)
		})
		ectx, ecancel := context.WithTimeout(ctx, 30*time.Second)
		committed, err := sess.End(ectx, kgo.TryCommit)
		ecancel()
		switch {
		case err != nil:
			failed++
			t.Logf("end after %d copied: %v", copied, err)
		case committed:
			copied += batch
			ends++
		}
		if coordID < 0 && copied >= n/3 {
			adm.FindTxnCoordinators(ctx, txnID).Each(func(d kadm.FindCoordinatorResponse) {
				if d.Err == nil {
					coordID = d.NodeID
				}
			})
			if coordID < 0 {
				t.Fatal("no transaction coordinator")
			}
			c.brokers[coordID].Kill9(t)
			killed = time.Now()
			t.Logf("%d copied in %d transactions; killed the coordinator, broker %d", copied, ends, coordID)
		}
	}
	sess.Close()
	t.Logf("copied %d records in %d committed transactions, %d ends failed", copied, ends, failed)
	c.brokers[coordID].Start(t)

	// The copy, read_committed, up to its last stable offsets.
	cons, err := kgo.NewClient(kgo.SeedBrokers(c.seeds()...), kgo.ConsumeTopics(out),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	seen := map[string]int{}
	total := 0
	deadline := time.Now().Add(30 * time.Second)
	for total < n && time.Now().Before(deadline) {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cons.PollFetches(pctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			seen[string(r.Value)]++
			total++
		})
	}
	// A little longer: a duplicate would come after the n-th record.
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	cons.PollFetches(pctx).EachRecord(func(r *kgo.Record) { seen[string(r.Value)]++; total++ })
	cancel()
	var bad []string
	for i := range n {
		if k := seen[fmt.Sprintf("r%d", i)]; k != 1 {
			bad = append(bad, fmt.Sprintf("r%d copied %d times", i, k))
		}
	}
	if len(bad) > 0 || total != n {
		if len(bad) > 20 {
			bad = append(bad[:20], fmt.Sprintf("… %d more", len(bad)-20))
		}
		t.Fatalf("%d records read from the copy, want %d:\n%s", total, n, strings.Join(bad, "\n"))
	}
}
