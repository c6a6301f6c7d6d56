package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/txn"
)

// txnClient is a transactional producer of topic.
func txnClient(t *testing.T, addr, id, topic string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, _ := client(t, addr, append([]kgo.Opt{kgo.TransactionalID(id), kgo.DefaultProduceTopic(topic)}, opts...)...)
	return cl
}

// produceTxn runs one transaction writing values (to partition p of
// topic when p >= 0, else spread by the default partitioner) and ends it.
func produceTxn(t *testing.T, ctx context.Context, cl *kgo.Client, topic string, p int32, commit bool, values ...string) {
	t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		r := &kgo.Record{Topic: topic, Value: []byte(v), Partition: p}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", v, err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("end transaction: %v", err)
	}
}

// readValues reads topic from the start at an isolation level until no
// record arrives for a while, and returns the values sorted.
func readValues(t *testing.T, addr, topic string, committed bool) []string {
	t.Helper()
	iso := kgo.ReadUncommitted()
	if committed {
		iso = kgo.ReadCommitted()
	}
	cl, _ := client(t, addr, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(iso),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	var out []string
	for idle := 0; idle < 5; {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)); n++ })
		if n == 0 {
			idle++
		} else {
			idle = 0
		}
	}
	sort.Strings(out)
	return out
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTxnCommitAbortIsolation: committed transactions are visible to
// read_committed consumers and aborted ones are not; read_uncommitted sees
// every data record; no control record reaches a client.
func TestTxnCommitAbortIsolation(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, "tx"); err != nil {
		t.Fatal(err)
	}
	cl := txnClient(t, ts.addr, "t1", "tx")
	var committed, all []string
	for i := 0; i < 6; i++ {
		var vs []string
		for j := 0; j < 4; j++ {
			vs = append(vs, fmt.Sprintf("v%d-%d", i, j))
		}
		commit := i%3 != 1
		produceTxn(t, ctx, cl, "tx", int32(i%2), commit, vs...)
		all = append(all, vs...)
		if commit {
			committed = append(committed, vs...)
		}
	}
	sort.Strings(committed)
	sort.Strings(all)
	if got := readValues(t, ts.addr, "tx", true); !equalStrings(got, committed) {
		t.Fatalf("read_committed got %v, want %v", got, committed)
	}
	if got := readValues(t, ts.addr, "tx", false); !equalStrings(got, all) {
		t.Fatalf("read_uncommitted got %v, want %v", got, all)
	}
	d, err := adm.DescribeTransactions(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if st := d["t1"]; st.State != "CompleteCommit" || st.ProducerID < 0 {
		t.Fatalf("describe: %+v", st)
	}
}

// TestTxnLastStableOffset: an open transaction holds read_committed
// consumers (and ListOffsets read_committed) at its first offset, even for
// records committed by another producer after it began.
func TestTxnLastStableOffset(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "lso"); err != nil {
		t.Fatal(err)
	}
	a := txnClient(t, ts.addr, "a", "lso")
	b := txnClient(t, ts.addr, "b", "lso")
	produceTxn(t, ctx, b, "lso", 0, true, "before") // offsets 0, marker 1
	if err := a.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := a.ProduceSync(ctx, &kgo.Record{Topic: "lso", Value: []byte("a-open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	produceTxn(t, ctx, b, "lso", 0, true, "after") // committed after a began
	ends, err := adm.ListEndOffsets(ctx, "lso")
	if err != nil {
		t.Fatal(err)
	}
	hw := ends["lso"][0].Offset
	req := kmsg.NewPtrListOffsetsRequest()
	req.IsolationLevel = 1
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = "lso"
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Timestamp = -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if lso := resp.Topics[0].Partitions[0].Offset; lso != 2 || hw != 5 {
		t.Fatalf("LSO %d (want 2, a's first offset), high watermark %d (want 5)", lso, hw)
	}
	if got := readValues(t, ts.addr, "lso", true); !equalStrings(got, []string{"before"}) {
		t.Fatalf("read_committed with a open: %v", got)
	}
	if err := a.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	if got := readValues(t, ts.addr, "lso", true); !equalStrings(got, []string{"a-open", "after", "before"}) {
		t.Fatalf("read_committed after a committed: %v", got)
	}
	p := ts.reg.partition(ts.reg.get("lso"), 0)
	if lso, hw := p.lastStable(p.log.HighWatermark()), p.log.HighWatermark(); lso != hw {
		t.Fatalf("LSO %d != high watermark %d with nothing open", lso, hw)
	}
}

// TestTxnFencing: a second producer with the same transactional id fences
// the first; the first's open transaction is aborted, its records never
// visible to read_committed.
func TestTxnFencing(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "fence"); err != nil {
		t.Fatal(err)
	}
	old := txnClient(t, ts.addr, "same", "fence")
	if err := old.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := old.ProduceSync(ctx, &kgo.Record{Topic: "fence", Value: []byte("zombie")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cur := txnClient(t, ts.addr, "same", "fence")
	produceTxn(t, ctx, cur, "fence", 0, true, "new")
	err := old.ProduceSync(ctx, &kgo.Record{Topic: "fence", Value: []byte("zombie-2")}).FirstErr()
	if err == nil {
		err = old.EndTransaction(ctx, kgo.TryCommit)
	}
	if !errors.Is(err, kerr.InvalidProducerEpoch) && !errors.Is(err, kerr.ProducerFenced) {
		t.Fatalf("zombie producer: %v, want a fencing error", err)
	}
	if got := readValues(t, ts.addr, "fence", true); !equalStrings(got, []string{"new"}) {
		t.Fatalf("read_committed: %v", got)
	}
}

// TestTxnTimeoutAbort: a transaction open past its timeout is aborted by
// the coordinator with the epoch bumped (the producer is fenced).
func TestTxnTimeoutAbort(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "slow"); err != nil {
		t.Fatal(err)
	}
	cl := txnClient(t, ts.addr, "slow", "slow", kgo.TransactionTimeout(time.Second))
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "slow", Value: []byte("late")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	before, _ := ts.txnCoord().Describe("slow")
	ts.txnCoord().Maintain(time.Now().Add(2 * time.Second))
	after, _ := ts.txnCoord().Describe("slow")
	if after.State != txn.CompleteAbort || after.Epoch != before.Epoch+1 {
		t.Fatalf("after the timeout: %+v (before %+v)", after, before)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err == nil {
		t.Fatal("commit of a timed-out transaction succeeded")
	}
	if got := readValues(t, ts.addr, "slow", true); len(got) != 0 {
		t.Fatalf("read_committed: %v", got)
	}
	p := ts.reg.partition(ts.reg.get("slow"), 0)
	if lso, hw := p.lastStable(p.log.HighWatermark()), p.log.HighWatermark(); lso != hw {
		t.Fatalf("LSO %d stuck below high watermark %d", lso, hw)
	}
}

// TestTxnStateAcrossRestart: an open transaction and aborted ranges survive
// a restart, with and without the producer snapshot (a crash leaves none:
// open replays the log), and the transaction commits afterwards.
func TestTxnStateAcrossRestart(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprintf("snapshot=%v", !crash), func(t *testing.T) {
			dir := t.TempDir()
			ts := startServer(t, dir)
			ctx := ctxT(t)
			_, adm := client(t, ts.addr)
			if _, err := adm.CreateTopic(ctx, 1, 1, nil, "r"); err != nil {
				t.Fatal(err)
			}
			cl := txnClient(t, ts.addr, "r", "r")
			produceTxn(t, ctx, cl, "r", 0, false, "aborted-1", "aborted-2")
			produceTxn(t, ctx, cl, "r", 0, true, "committed")
			if err := cl.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "r", Value: []byte("open")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			addr := ts.addr
			ts.stop(t)
			if crash {
				os.Remove(filepath.Join(dir, "r-0", producersFile))
			}
			ts2 := startServerAt(t, Config{DataDir: dir, AutoCreateTopics: true}, addr)
			if st, _ := ts2.txnCoord().Describe("r"); st.State != txn.Ongoing {
				t.Fatalf("after restart: %+v", st)
			}
			if got := readValues(t, ts2.addr, "r", true); !equalStrings(got, []string{"committed"}) {
				t.Fatalf("read_committed after restart: %v", got)
			}
			if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
			if got := readValues(t, ts2.addr, "r", true); !equalStrings(got, []string{"committed", "open"}) {
				t.Fatalf("read_committed after commit: %v", got)
			}
		})
	}
}

// TestTxnOffsetsPendingUntilCommit: offsets sent in a transaction are
// pending (OffsetFetch require_stable: UNSTABLE_OFFSET_COMMIT) until the
// transaction ends, committed with it, dropped by an abort.
func TestTxnOffsetsPendingUntilCommit(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	cl, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "in"); err != nil {
		t.Fatal(err)
	}
	init := kmsg.NewPtrInitProducerIDRequest()
	init.TransactionalID = kmsg.StringPtr("off")
	init.TransactionTimeoutMillis = 60000
	ir, err := init.RequestWith(ctx, cl)
	if err != nil || ir.ErrorCode != 0 {
		t.Fatalf("init: %v %v", err, kerr.ErrorForCode(ir.ErrorCode))
	}
	pid, epoch := ir.ProducerID, ir.ProducerEpoch
	commitOffset := func(off int64) {
		t.Helper()
		ao := kmsg.NewPtrAddOffsetsToTxnRequest()
		ao.TransactionalID, ao.ProducerID, ao.ProducerEpoch, ao.Group = "off", pid, epoch, "g"
		if r, err := ao.RequestWith(ctx, cl); err != nil || r.ErrorCode != 0 {
			t.Fatalf("add offsets: %v %v", err, kerr.ErrorForCode(r.ErrorCode))
		}
		tc := kmsg.NewPtrTxnOffsetCommitRequest()
		tc.TransactionalID, tc.ProducerID, tc.ProducerEpoch, tc.Group, tc.Generation = "off", pid, epoch, "g", -1
		tt := kmsg.NewTxnOffsetCommitRequestTopic()
		tt.Topic = "in"
		tp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		tp.Offset = off
		tt.Partitions = append(tt.Partitions, tp)
		tc.Topics = append(tc.Topics, tt)
		r, err := tc.RequestWith(ctx, cl)
		if err != nil || r.Topics[0].Partitions[0].ErrorCode != 0 {
			t.Fatalf("txn offset commit: %v %+v", err, r)
		}
	}
	fetch := func() (int64, int16) {
		t.Helper()
		of := kmsg.NewPtrOffsetFetchRequest()
		of.Group, of.RequireStable = "g", true
		ot := kmsg.NewOffsetFetchRequestTopic()
		ot.Topic, ot.Partitions = "in", []int32{0}
		of.Topics = append(of.Topics, ot)
		r, err := of.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Groups) > 0 {
			p := r.Groups[0].Topics[0].Partitions[0]
			return p.Offset, p.ErrorCode
		}
		p := r.Topics[0].Partitions[0]
		return p.Offset, p.ErrorCode
	}
	end := func(commit bool) {
		t.Helper()
		e := kmsg.NewPtrEndTxnRequest()
		e.TransactionalID, e.ProducerID, e.ProducerEpoch, e.Commit = "off", pid, epoch, commit
		r, err := e.RequestWith(ctx, cl)
		if err != nil || r.ErrorCode != 0 {
			t.Fatalf("end: %v %v", err, kerr.ErrorForCode(r.ErrorCode))
		}
		if r.Version >= 5 { // KIP-890: every end bumps the epoch
			if r.ProducerID != pid || r.ProducerEpoch != epoch+1 {
				t.Fatalf("EndTxn v5 answered %d/%d after %d/%d", r.ProducerID, r.ProducerEpoch, pid, epoch)
			}
			pid, epoch = r.ProducerID, r.ProducerEpoch
		}
	}
	commitOffset(7)
	if _, code := fetch(); code != kerr.UnstableOffsetCommit.Code {
		t.Fatalf("pending offset: code %d, want UNSTABLE_OFFSET_COMMIT", code)
	}
	end(true)
	if off, code := fetch(); off != 7 || code != 0 {
		t.Fatalf("after commit: offset %d code %d", off, code)
	}
	commitOffset(9)
	end(false)
	if off, code := fetch(); off != 7 || code != 0 {
		t.Fatalf("after abort: offset %d code %d, want 7", off, code)
	}
}

// TestTxnUnheldAbortedAtStart: a transaction open on a partition that no
// coordinator state holds (here: the transaction log lost) is aborted at
// start, so the partition's LSO does not stay behind it.
func TestTxnUnheldAbortedAtStart(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "u"); err != nil {
		t.Fatal(err)
	}
	cl := txnClient(t, ts.addr, "u", "u")
	produceTxn(t, ctx, cl, "u", 0, true, "kept")
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "u", Value: []byte("orphan")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	addr := ts.addr
	ts.stop(t)
	if err := os.RemoveAll(filepath.Join(dir, txnDir)); err != nil {
		t.Fatal(err)
	}
	ts2 := startServerAt(t, Config{DataDir: dir, AutoCreateTopics: true}, addr)
	p := ts2.reg.partition(ts2.reg.get("u"), 0)
	if lso, hw := p.lastStable(p.log.HighWatermark()), p.log.HighWatermark(); lso != hw {
		t.Fatalf("LSO %d behind the high watermark %d: the unheld transaction was not aborted", lso, hw)
	}
	if got := readValues(t, ts2.addr, "u", true); !equalStrings(got, []string{"kept"}) {
		t.Fatalf("read_committed: %v", got)
	}
}
