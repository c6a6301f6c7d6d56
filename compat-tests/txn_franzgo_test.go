package compattests

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Transactions (KIP-98, KIP-447) with franz-go: a transactional producer
// committing and aborting, read_committed and read_uncommitted consumers,
// the last stable offset with interleaved open transactions, the control
// batches on the wire (raw Fetch), GroupTransactSession read-process-write,
// fencing of a zombie producer and the admin calls (DescribeTransactions,
// ListTransactions, DescribeProducers).
//
// The helpers here (txnRec, txnEnv, readTxnKgo, checkTxnRead, ...) are
// shared by the other clients' transaction tests (txn_*_test.go): whatever
// produced the transactions, the records a consumer sees are compared
// exactly, partition by partition and in order, with what was committed
// (read_committed) or with everything written (read_uncommitted).
//
// To know where "everything" ends, a test appends one plain record (value
// txnEndValue(p)) to every partition after its last transaction ended: a
// consumer reads until it has seen that record on every partition, and
// everything before it must be exactly the expected records.

// txnTimeout bounds one transaction test.
const txnTimeout = 90 * time.Second

// txnRec is one data record as consumed: partition, offset (-1 when the
// expectation does not know it) and value.
type txnRec struct {
	P   int32
	Off int64
	V   string
}

func (r txnRec) String() string {
	if r.Off < 0 {
		return fmt.Sprintf("%q", r.V)
	}
	return fmt.Sprintf("%d:%q", r.Off, r.V)
}

// txnEndValue is the value of the plain record appended to partition p
// after a test's last transaction.
func txnEndValue(p int32) string { return fmt.Sprintf("end-of-test-p%d", p) }

// txnEnv is a broker with a kadm client, for the transaction tests.
type txnEnv struct {
	b     broker
	addr  string
	admin *kgo.Client
	adm   *kadm.Client
	plain *kgo.Client // idempotent, manual partitioner: non-transactional records
}

func newTxnEnv(t testing.TB) *txnEnv {
	t.Helper()
	b := newBroker(t)
	e := &txnEnv{b: b, addr: b.Addr()}
	var err error
	if e.admin, err = kgo.NewClient(kgo.SeedBrokers(e.addr)); err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	t.Cleanup(e.admin.Close)
	e.adm = kadm.NewClient(e.admin)
	if e.plain, err = kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.RecordPartitioner(kgo.ManualPartitioner())); err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	t.Cleanup(e.plain.Close)
	return e
}

// topic creates a topic unique to t (suffix distinguishes several in one
// test) with n partitions.
func (e *txnEnv) topic(t testing.TB, suffix string, n int32) string {
	t.Helper()
	topic := uniqueTopic(t) + suffix
	createTopicKadm(t, e.addr, topic, n)
	return topic
}

// txnProducer is a franz-go client with transactional id id (manual
// partitioner), closed when t ends.
func (e *txnEnv) txnProducer(t testing.TB, id string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(e.addr),
		kgo.TransactionalID(id),
		kgo.TransactionTimeout(30 * time.Second),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	}, opts...)...)
	if err != nil {
		t.Fatalf("kgo.NewClient (transactional id %s): %v", id, err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// producePlain writes values to partition p of topic without a
// transaction and returns them with their offsets.
func (e *txnEnv) producePlain(t testing.TB, ctx context.Context, topic string, p int32, values ...string) []txnRec {
	t.Helper()
	return produceKgo(t, ctx, e.plain, topic, p, values...)
}

// produceKgo produces values to partition p with cl (in cl's open
// transaction if it has one) and returns them with their offsets.
func produceKgo(t testing.TB, ctx context.Context, cl *kgo.Client, topic string, p int32, values ...string) []txnRec {
	t.Helper()
	var krs []*kgo.Record
	for _, v := range values {
		krs = append(krs, &kgo.Record{Topic: topic, Partition: p, Key: []byte(v), Value: []byte(v)})
	}
	if err := cl.ProduceSync(ctx, krs...).FirstErr(); err != nil {
		t.Fatalf("produce %d records to %s p%d: %v", len(values), topic, p, err)
	}
	out := make([]txnRec, len(krs))
	for i, kr := range krs {
		out[i] = txnRec{P: kr.Partition, Off: kr.Offset, V: string(kr.Value)}
	}
	return out
}

// appendEnd appends the end record to every partition of topic and returns
// their offsets.
func (e *txnEnv) appendEnd(t testing.TB, ctx context.Context, topic string, partitions int32) map[int32]int64 {
	t.Helper()
	end := make(map[int32]int64)
	for p := range partitions {
		end[p] = e.producePlain(t, ctx, topic, p, txnEndValue(p))[0].Off
	}
	return end
}

// txnValues is n values tag-pP-i.
func txnValues(tag string, p int32, n int) []string {
	var vs []string
	for i := range n {
		vs = append(vs, fmt.Sprintf("%s-p%d-%d", tag, p, i))
	}
	return vs
}

// readTxnKgo reads every partition of topic from the start with a franz-go
// consumer at isolation level iso until it has read the end record
// (txnEndValue) of each, and returns the records before it per partition.
func readTxnKgo(t testing.TB, ctx context.Context, addr, topic string, partitions int32, iso kgo.IsolationLevel) map[int32][]txnRec {
	t.Helper()
	cl := newTxnConsumer(t, addr, topic, partitions, iso)
	defer cl.Close()
	got := make(map[int32][]txnRec)
	done := make(map[int32]bool)
	for len(done) < int(partitions) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s (%s): the end record was not reached on every partition: %v; read so far: %s",
				topic, isoName(iso), ctx.Err(), fmtTxnRecs(got))
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !kerr.IsRetriable(err) && !errors.Is(err, context.Canceled) {
				t.Errorf("fetch %s p%d (%s): %v", topic, p, isoName(iso), err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			if done[r.Partition] {
				t.Errorf("%s p%d (%s): record %d %q after the end record", topic, r.Partition, isoName(iso), r.Offset, r.Value)
				return
			}
			if string(r.Value) == txnEndValue(r.Partition) {
				done[r.Partition] = true
				return
			}
			got[r.Partition] = append(got[r.Partition], txnRec{P: r.Partition, Off: r.Offset, V: string(r.Value)})
		})
		if t.Failed() {
			t.FailNow()
		}
	}
	return got
}

// newTxnConsumer is a franz-go consumer of every partition of topic from
// the start at isolation level iso.
func newTxnConsumer(t testing.TB, addr, topic string, partitions int32, iso kgo.IsolationLevel) *kgo.Client {
	t.Helper()
	parts := make(map[int32]kgo.Offset)
	for p := range partitions {
		parts[p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(addr),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(iso),
		kgo.FetchMaxWait(250*time.Millisecond),
	)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	return cl
}

// pollKgoFor polls cl for d and returns what it read (fetch errors fail t).
func pollKgoFor(t testing.TB, ctx context.Context, cl *kgo.Client, d time.Duration) []txnRec {
	t.Helper()
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var got []txnRec
	for pctx.Err() == nil {
		fs := cl.PollFetches(pctx)
		fs.EachError(func(topic string, p int32, err error) {
			if !kerr.IsRetriable(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("fetch %s p%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			got = append(got, txnRec{P: r.Partition, Off: r.Offset, V: string(r.Value)})
		})
	}
	if ctx.Err() != nil {
		t.Fatalf("poll: %v", ctx.Err())
	}
	return got
}

// pollKgoUntil polls cl until it has read n records (then for settle more,
// to catch extra ones) and returns them.
func pollKgoUntil(t testing.TB, ctx context.Context, cl *kgo.Client, n int, settle time.Duration) []txnRec {
	t.Helper()
	var got []txnRec
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("poll: read %d of %d records: %v (read: %v)", len(got), n, ctx.Err(), got)
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !kerr.IsRetriable(err) && !errors.Is(err, context.Canceled) {
				t.Errorf("fetch %s p%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			got = append(got, txnRec{P: r.Partition, Off: r.Offset, V: string(r.Value)})
		})
		if t.Failed() {
			t.FailNow()
		}
	}
	return append(got, pollKgoFor(t, ctx, cl, settle)...)
}

func isoName(iso kgo.IsolationLevel) string {
	if iso == kgo.ReadCommitted() {
		return "read_committed"
	}
	return "read_uncommitted"
}

// byPartition groups records by partition, keeping their order.
func byPartition(recs []txnRec) map[int32][]txnRec {
	m := make(map[int32][]txnRec)
	for _, r := range recs {
		m[r.P] = append(m[r.P], r)
	}
	return m
}

func fmtTxnRecs(m map[int32][]txnRec) string {
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "\n  p%d (%d): %v", p, len(m[p]), m[p])
	}
	if b.Len() == 0 {
		return "(nothing)"
	}
	return b.String()
}

// checkTxnRead compares what who read with want, partition by partition,
// in order: same values, and the same offsets where want knows them.
func checkTxnRead(t testing.TB, who string, got, want map[int32][]txnRec) {
	t.Helper()
	parts := make(map[int32]bool)
	for p := range got {
		parts[p] = true
	}
	for p := range want {
		parts[p] = true
	}
	bad := false
	for _, p := range slices.Sorted(maps.Keys(parts)) {
		g, w := got[p], want[p]
		same := len(g) == len(w)
		for i := 0; same && i < len(g); i++ {
			same = g[i].V == w[i].V && g[i].P == w[i].P && (w[i].Off < 0 || g[i].Off == w[i].Off)
		}
		if !same {
			bad = true
			t.Errorf("%s: partition %d: read %d records, want %d:\n  got  %v\n  want %v%s", who, p, len(g), len(w), g, w, diffTxn(g, w))
		}
	}
	if !bad {
		n := 0
		for _, w := range want {
			n += len(w)
		}
		t.Logf("%s: read exactly the %d expected records", who, n)
	}
}

// diffTxn names the values missing from got and the ones not in want.
func diffTxn(got, want []txnRec) string {
	in := func(rs []txnRec) map[string]int {
		m := make(map[string]int)
		for _, r := range rs {
			m[r.V]++
		}
		return m
	}
	g, w := in(got), in(want)
	var missing, extra, dup []string
	for v := range w {
		if g[v] == 0 {
			missing = append(missing, v)
		}
	}
	for v, n := range g {
		switch {
		case w[v] == 0:
			extra = append(extra, v)
		case n > w[v]:
			dup = append(dup, v)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	slices.Sort(dup)
	var b strings.Builder
	if len(missing) > 0 {
		fmt.Fprintf(&b, "\n  missing: %q", missing)
	}
	if len(extra) > 0 {
		fmt.Fprintf(&b, "\n  not expected: %q", extra)
	}
	if len(dup) > 0 {
		fmt.Fprintf(&b, "\n  duplicated: %q", dup)
	}
	return b.String()
}

// withoutOffsets returns recs with unknown (-1) offsets.
func withoutOffsets(m map[int32][]txnRec) map[int32][]txnRec {
	out := make(map[int32][]txnRec)
	for p, rs := range m {
		for _, r := range rs {
			r.Off = -1
			out[p] = append(out[p], r)
		}
	}
	return out
}

// checkOffsetsKadm checks kadm ListEndOffsets (high watermark) and
// ListCommittedOffsets (ListOffsets with read_committed: the last stable
// offset) of every partition.
//
// Kafka writes the markers after it answered EndTxn, so for a moment after
// a transaction ended the LSO may still be behind: this asks again for up
// to 5 s before it reports a mismatch.
func checkOffsetsKadm(t testing.TB, ctx context.Context, adm *kadm.Client, topic string, hwm, lso map[int32]int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if offsetsMismatch(t, ctx, adm, topic, hwm, lso, false) == 0 || time.Now().After(deadline) {
			break
		}
	}
	offsetsMismatch(t, ctx, adm, topic, hwm, lso, true)
}

func offsetsMismatch(t testing.TB, ctx context.Context, adm *kadm.Client, topic string, hwm, lso map[int32]int64, report bool) int {
	t.Helper()
	bad := 0
	errorf := func(format string, args ...any) {
		t.Helper()
		bad++
		if report {
			t.Errorf(format, args...)
		}
	}
	for _, c := range []struct {
		what string
		list func(context.Context, ...string) (kadm.ListedOffsets, error)
		want map[int32]int64
	}{
		{"ListEndOffsets (read_uncommitted: high watermark)", adm.ListEndOffsets, hwm},
		{"ListCommittedOffsets (read_committed: last stable offset)", adm.ListCommittedOffsets, lso},
	} {
		listed, err := c.list(ctx, topic)
		if err == nil {
			err = listed.Error()
		}
		if err != nil {
			t.Fatalf("kadm %s %s: %v", c.what, topic, err)
		}
		for p, want := range c.want {
			o, ok := listed.Lookup(topic, p)
			if !ok {
				errorf("kadm %s: no answer for %s p%d", c.what, topic, p)
				continue
			}
			if o.Offset != want {
				errorf("kadm %s %s p%d: %d, want %d", c.what, topic, p, o.Offset, want)
			}
		}
	}
	return bad
}

// ---- raw Fetch: LSO, aborted transactions, control batches ------------------

// rawFetch sends one Fetch of topic partition p from offset at isolation
// level iso (0 read_uncommitted, 1 read_committed) and returns the
// partition's answer.
func rawFetch(t testing.TB, ctx context.Context, e *txnEnv, topic string, p int32, offset int64, iso int8) kmsg.FetchResponseTopicPartition {
	t.Helper()
	md, err := e.adm.Metadata(ctx, topic)
	if err != nil {
		t.Fatalf("metadata %s: %v", topic, err)
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil {
		t.Fatalf("metadata %s: %v", topic, td.Err)
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 0
	req.MinBytes = 0
	req.MaxBytes = 50 << 20
	req.IsolationLevel = iso
	req.SessionEpoch = -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	rt.TopicID = td.ID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = p
	rp.FetchOffset = offset
	rp.PartitionMaxBytes = 10 << 20
	rp.CurrentLeaderEpoch = -1
	rp.LogStartOffset = -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, e.admin)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("raw Fetch %s p%d offset %d isolation %d: %v", topic, p, offset, iso, err)
	}
	for _, t2 := range resp.Topics {
		for _, fp := range t2.Partitions {
			if fp.Partition == p {
				if err := kerr.ErrorForCode(fp.ErrorCode); err != nil {
					t.Fatalf("raw Fetch %s p%d offset %d isolation %d: %v", topic, p, offset, iso, err)
				}
				return fp
			}
		}
	}
	t.Fatalf("raw Fetch %s p%d: no answer for the partition (response %+v)", topic, p, resp)
	return kmsg.FetchResponseTopicPartition{}
}

// rawBatch is a record batch as the broker sent it.
type rawBatch struct {
	First, Last   int64
	Transactional bool
	Control       bool
	ControlType   int16 // 0 abort, 1 commit (control batches only)
	ProducerID    int64
}

func (b rawBatch) String() string {
	kind := "data"
	if b.Control {
		kind = map[int16]string{0: "ABORT", 1: "COMMIT"}[b.ControlType]
		if kind == "" {
			kind = fmt.Sprintf("control type %d", b.ControlType)
		}
	}
	if b.Transactional {
		kind += " txn"
	}
	return fmt.Sprintf("[%d-%d %s pid %d]", b.First, b.Last, kind, b.ProducerID)
}

// parseBatches splits a Fetch partition's RecordBatches into batches. A
// trailing partial batch (allowed by the protocol) is dropped.
func parseBatches(t testing.TB, raw []byte) []rawBatch {
	t.Helper()
	var out []rawBatch
	for len(raw) >= 12 {
		length := int(int32(uint32(raw[8])<<24 | uint32(raw[9])<<16 | uint32(raw[10])<<8 | uint32(raw[11])))
		if 12+length > len(raw) {
			break
		}
		var b kmsg.RecordBatch
		if err := b.ReadFrom(raw[:12+length]); err != nil {
			t.Fatalf("record batch at offset %d: %v", b.FirstOffset, err)
		}
		raw = raw[12+length:]
		if b.Magic != 2 {
			t.Fatalf("record batch at offset %d: magic %d, want 2", b.FirstOffset, b.Magic)
		}
		rb := rawBatch{
			First:         b.FirstOffset,
			Last:          b.FirstOffset + int64(b.LastOffsetDelta),
			Transactional: b.Attributes&0x10 != 0,
			Control:       b.Attributes&0x20 != 0,
			ControlType:   -1,
			ProducerID:    b.ProducerID,
		}
		if rb.Control {
			if b.NumRecords != 1 || b.Attributes&0x07 != 0 {
				t.Errorf("control batch at offset %d: %d records, compression %d, want 1 uncompressed record", b.FirstOffset, b.NumRecords, b.Attributes&0x07)
			} else {
				var r kmsg.Record
				var key kmsg.ControlRecordKey
				if err := r.ReadFrom(b.Records); err != nil {
					t.Errorf("control batch at offset %d: record: %v", b.FirstOffset, err)
				} else if err := key.ReadFrom(r.Key); err != nil {
					t.Errorf("control batch at offset %d: key %x: %v", b.FirstOffset, r.Key, err)
				} else {
					rb.ControlType = int16(key.Type)
				}
			}
		}
		out = append(out, rb)
	}
	return out
}

// Kinds of offsets in a partition's expected layout.
const (
	offPlain  = "plain"  // a non-transactional data record
	offTxn    = "txn"    // a transactional data record
	offCommit = "COMMIT" // a commit marker
	offAbort  = "ABORT"  // an abort marker
)

// checkLayout fetches partition p from 0 (read_uncommitted) and checks
// that the batches cover [0, len(layout)) contiguously and that every
// offset is what layout says: plain data in non-transactional batches,
// transactional data in transactional batches of producer pids[offset], and
// a control batch of that producer with the right marker type where a
// transaction ended (pids nil: producer ids not checked).
func checkLayout(t testing.TB, ctx context.Context, e *txnEnv, topic string, p int32, layout []string, pids map[int64]int64) {
	t.Helper()
	fp := rawFetch(t, ctx, e, topic, p, 0, 0)
	checkBatches(t, fmt.Sprintf("%s p%d", topic, p), parseBatches(t, fp.RecordBatches), layout, pids)
}

// checkBatches is checkLayout's comparison of the batches of a partition
// (what) with its expected layout.
func checkBatches(t testing.TB, what string, batches []rawBatch, layout []string, pids map[int64]int64) {
	t.Helper()
	next := int64(0)
	for _, b := range batches {
		if b.First != next {
			t.Errorf("%s: batch %v starts at %d, want %d (all batches: %v)", what, b, b.First, next, batches)
			return
		}
		next = b.Last + 1
		for off := b.First; off <= b.Last; off++ {
			if off >= int64(len(layout)) {
				t.Errorf("%s: batch %v past the expected end %d", what, b, len(layout))
				return
			}
			want := layout[off]
			var ok bool
			pidOK := pids == nil || b.ProducerID == pids[off]
			switch want {
			case offPlain:
				ok = !b.Control && !b.Transactional
			case offTxn:
				ok = !b.Control && b.Transactional && pidOK
			case offCommit:
				ok = b.Control && b.Transactional && b.ControlType == 1 && b.First == b.Last && pidOK
			case offAbort:
				ok = b.Control && b.Transactional && b.ControlType == 0 && b.First == b.Last && pidOK
			}
			if !ok {
				t.Errorf("%s offset %d: in batch %v, want %s (producer id %d)", what, off, b, want, pids[off])
			}
		}
	}
	if next != int64(len(layout)) {
		t.Errorf("%s: batches end at %d, want %d (batches: %v)", what, next, len(layout), batches)
	}
}

// checkAborted checks a read_committed Fetch of partition p from 0: the
// last stable offset and high watermark, and the aborted transactions
// listed (producer id, first offset), in any order.
func checkAborted(t testing.TB, ctx context.Context, e *txnEnv, topic string, p int32, hwm, lso int64, want []kmsg.FetchResponseTopicPartitionAbortedTransaction) {
	t.Helper()
	fp := rawFetch(t, ctx, e, topic, p, 0, 1)
	if fp.HighWatermark != hwm || fp.LastStableOffset != lso {
		t.Errorf("read_committed Fetch %s p%d: high watermark %d, last stable offset %d, want %d, %d", topic, p, fp.HighWatermark, fp.LastStableOffset, hwm, lso)
	}
	key := func(a kmsg.FetchResponseTopicPartitionAbortedTransaction) string {
		return fmt.Sprintf("pid %d from %d", a.ProducerID, a.FirstOffset)
	}
	var got, exp []string
	for _, a := range fp.AbortedTransactions {
		got = append(got, key(a))
	}
	for _, a := range want {
		exp = append(exp, key(a))
	}
	slices.Sort(got)
	slices.Sort(exp)
	if !slices.Equal(got, exp) {
		t.Errorf("read_committed Fetch %s p%d from 0: aborted transactions %q, want %q", topic, p, got, exp)
	}
	// Nothing at or past the LSO is returned.
	for _, b := range parseBatches(t, fp.RecordBatches) {
		if b.Last >= lso {
			t.Errorf("read_committed Fetch %s p%d: batch %v at or past the last stable offset %d", topic, p, b, lso)
		}
	}
}

func abortedTxn(pid, first int64) kmsg.FetchResponseTopicPartitionAbortedTransaction {
	a := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
	a.ProducerID, a.FirstOffset = pid, first
	return a
}

func producerID(t testing.TB, ctx context.Context, cl *kgo.Client) (int64, int16) {
	t.Helper()
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatalf("ProducerID (InitProducerId): %v", err)
	}
	return id, epoch
}

// ---- the tests ----------------------------------------------------------------

// TestTxnFranzGoCommitAbort: plain records, then five transactions of one
// producer over two partitions, committed and aborted in turn (some on one
// partition only). Every transaction's offsets leave exactly one marker per
// partition it wrote to; read_committed reads exactly the plain and the
// committed records at their offsets, read_uncommitted every data record
// (no control record); a raw Fetch shows the control batches (type,
// producer id) and read_committed's aborted-transaction list; ListOffsets
// (both isolation levels) answers the end.
func TestTxnFranzGoCommitAbort(t *testing.T) {
	e := newTxnEnv(t)
	ctx := testCtx(t, txnTimeout)
	topic := e.topic(t, "", mixParts)
	m := e.produceTxnMix(t, ctx, topic)
	checkOffsetsKadm(t, ctx, e.adm, topic, m.hwm, m.hwm)
	for p := range int32(mixParts) {
		checkAborted(t, ctx, e, topic, p, m.hwm[p], m.hwm[p], m.aborted[p])
		checkLayout(t, ctx, e, topic, p, m.layout[p], m.pids[p])
	}
	end := e.appendEnd(t, ctx, topic, mixParts)
	for p, o := range end {
		if o != m.hwm[p] {
			t.Errorf("end record of p%d at offset %d, want %d", p, o, m.hwm[p])
		}
	}
	checkTxnRead(t, "franz-go read_committed", readTxnKgo(t, ctx, e.addr, topic, mixParts, kgo.ReadCommitted()), m.committed)
	checkTxnRead(t, "franz-go read_uncommitted", readTxnKgo(t, ctx, e.addr, topic, mixParts, kgo.ReadUncommitted()), m.all)
}

// mixParts is the number of partitions of produceTxnMix's topic.
const mixParts = 2

// txnMix is what produceTxnMix wrote.
type txnMix struct {
	committed map[int32][]txnRec // what read_committed must read
	all       map[int32][]txnRec // what read_uncommitted must read
	layout    map[int32][]string // per partition, per offset: offPlain, offTxn, offCommit, offAbort
	pids      map[int32]map[int64]int64
	aborted   map[int32][]kmsg.FetchResponseTopicPartitionAbortedTransaction
	hwm       map[int32]int64
}

// produceTxnMix writes two plain records to each partition of topic
// (mixParts partitions), then five transactions of one franz-go producer,
// committed and aborted in turn, some on one partition only, and checks
// that each transaction's first offset on a partition follows the previous
// one's marker. It returns what was written.
func (e *txnEnv) produceTxnMix(t testing.TB, ctx context.Context, topic string) *txnMix {
	t.Helper()
	cl := e.txnProducer(t, "txn-"+topic)
	pid, _ := producerID(t, ctx, cl)
	m := &txnMix{
		committed: make(map[int32][]txnRec),
		all:       make(map[int32][]txnRec),
		layout:    make(map[int32][]string),
		pids:      make(map[int32]map[int64]int64),
		aborted:   make(map[int32][]kmsg.FetchResponseTopicPartitionAbortedTransaction),
		hwm:       make(map[int32]int64),
	}
	lay := func(p int32, kind string, n int, id int64) {
		if m.pids[p] == nil {
			m.pids[p] = make(map[int64]int64)
		}
		for range n {
			m.pids[p][int64(len(m.layout[p]))] = id
			m.layout[p] = append(m.layout[p], kind)
		}
	}
	for p := range int32(mixParts) {
		recs := e.producePlain(t, ctx, topic, p, txnValues("plain", p, 2)...)
		m.committed[p] = append(m.committed[p], recs...)
		m.all[p] = append(m.all[p], recs...)
		lay(p, offPlain, 2, -1)
	}
	plan := []struct {
		tag    string
		commit bool
		n      map[int32]int
	}{
		{"c1", true, map[int32]int{0: 3, 1: 2}},
		{"a1", false, map[int32]int{0: 2, 1: 3}},
		{"c2", true, map[int32]int{0: 1}},
		{"a2", false, map[int32]int{1: 2}},
		{"c3", true, map[int32]int{0: 2, 1: 2}},
	}
	for _, tx := range plan {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatalf("%s: BeginTransaction: %v", tx.tag, err)
		}
		for _, p := range slices.Sorted(maps.Keys(tx.n)) {
			recs := produceKgo(t, ctx, cl, topic, p, txnValues(tx.tag, p, tx.n[p])...)
			if want := int64(len(m.layout[p])); recs[0].Off != want {
				t.Errorf("%s p%d: first record at offset %d, want %d (one marker after each earlier transaction on the partition)", tx.tag, p, recs[0].Off, want)
			}
			if !tx.commit {
				m.aborted[p] = append(m.aborted[p], abortedTxn(pid, recs[0].Off))
			} else {
				m.committed[p] = append(m.committed[p], recs...)
			}
			m.all[p] = append(m.all[p], recs...)
			lay(p, offTxn, len(recs), pid)
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(tx.commit)); err != nil {
			t.Fatalf("%s: EndTransaction(commit=%v): %v", tx.tag, tx.commit, err)
		}
		for p := range tx.n {
			if tx.commit {
				lay(p, offCommit, 1, pid)
			} else {
				lay(p, offAbort, 1, pid)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	for p := range int32(mixParts) {
		m.hwm[p] = int64(len(m.layout[p]))
	}
	return m
}

// TestTxnFranzGoLSO: two producers with open transactions interleaved on
// one partition. While A is open, B's records committed after A began
// stay invisible to read_committed (the fetch stops at A's first offset:
// the last stable offset, which ListOffsets read_committed answers too)
// until A commits; when A aborts instead, read_committed then sees B's
// records and none of A's.
func TestTxnFranzGoLSO(t *testing.T) {
	e := newTxnEnv(t)
	ctx := testCtx(t, txnTimeout)
	topic := e.topic(t, "", 1)
	a := e.txnProducer(t, "a-"+topic)
	b := e.txnProducer(t, "b-"+topic)
	pidA, _ := producerID(t, ctx, a)
	pidB, _ := producerID(t, ctx, b)

	pre := e.producePlain(t, ctx, topic, 0, "pre-0", "pre-1") // 0, 1
	rc := newTxnConsumer(t, e.addr, topic, 1, kgo.ReadCommitted())
	defer rc.Close()
	ru := newTxnConsumer(t, e.addr, topic, 1, kgo.ReadUncommitted())
	defer ru.Close()

	expectOffsets := func(what string, recs []txnRec, first int64) {
		t.Helper()
		for i, r := range recs {
			if r.Off != first+int64(i) {
				t.Fatalf("%s: %q at offset %d, want %d", what, r.V, r.Off, first+int64(i))
			}
		}
	}
	expectOffsets("plain records", pre, 0)

	// Round 1: A open from offset 2, B writes 3, 4 and commits (marker 5).
	begin := func(cl *kgo.Client, who string) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatalf("%s: BeginTransaction: %v", who, err)
		}
	}
	end := func(cl *kgo.Client, who string, commit bool) {
		t.Helper()
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatalf("%s: EndTransaction(commit=%v): %v", who, commit, err)
		}
	}
	begin(a, "A")
	a1 := produceKgo(t, ctx, a, topic, 0, "A1-0")
	expectOffsets("A's first record", a1, 2)
	begin(b, "B")
	b1 := produceKgo(t, ctx, b, topic, 0, "B1-0", "B1-1")
	expectOffsets("B's records", b1, 3)
	end(b, "B", true)

	t.Run("A-open", func(t *testing.T) {
		checkOffsetsKadm(t, ctx, e.adm, topic, map[int32]int64{0: 6}, map[int32]int64{0: 2})
		checkAborted(t, ctx, e, topic, 0, 6, 2, nil)
		// From the LSO itself: nothing to return yet.
		if fp := rawFetch(t, ctx, e, topic, 0, 2, 1); len(parseBatches(t, fp.RecordBatches)) != 0 || fp.LastStableOffset != 2 {
			t.Errorf("read_committed Fetch from the LSO 2: batches %v, LSO %d; want none, 2", parseBatches(t, fp.RecordBatches), fp.LastStableOffset)
		}
		// read_uncommitted sees everything, with the marker's offset
		// skipped.
		if fp := rawFetch(t, ctx, e, topic, 0, 0, 0); fp.LastStableOffset != 2 || fp.HighWatermark != 6 {
			t.Errorf("read_uncommitted Fetch: LSO %d, high watermark %d, want 2, 6", fp.LastStableOffset, fp.HighWatermark)
		}
		checkTxnRead(t, "read_committed while A is open", byPartition(pollKgoUntil(t, ctx, rc, 2, 1500*time.Millisecond)),
			map[int32][]txnRec{0: pre})
		checkTxnRead(t, "read_uncommitted while A is open", byPartition(pollKgoUntil(t, ctx, ru, 5, time.Second)),
			map[int32][]txnRec{0: slices.Concat(pre, a1, b1)})
	})
	if t.Failed() {
		t.FailNow()
	}

	a2 := produceKgo(t, ctx, a, topic, 0, "A1-1") // 6
	expectOffsets("A's second record", a2, 6)
	end(a, "A", true) // marker 7
	t.Run("A-committed", func(t *testing.T) {
		checkOffsetsKadm(t, ctx, e.adm, topic, map[int32]int64{0: 8}, map[int32]int64{0: 8})
		checkAborted(t, ctx, e, topic, 0, 8, 8, nil)
		checkTxnRead(t, "read_committed after A committed", byPartition(pollKgoUntil(t, ctx, rc, 4, time.Second)),
			map[int32][]txnRec{0: slices.Concat(a1, b1, a2)})
		checkTxnRead(t, "read_uncommitted after A committed", byPartition(pollKgoUntil(t, ctx, ru, 1, time.Second)),
			map[int32][]txnRec{0: a2})
	})
	if t.Failed() {
		t.FailNow()
	}

	// Round 2: A open from 8, B writes 9 and commits (marker 10), A aborts
	// (marker 11).
	begin(a, "A")
	a3 := produceKgo(t, ctx, a, topic, 0, "A2-0")
	expectOffsets("A's third record", a3, 8)
	begin(b, "B")
	b2 := produceKgo(t, ctx, b, topic, 0, "B2-0")
	expectOffsets("B's third record", b2, 9)
	end(b, "B", true)
	t.Run("A-open-again", func(t *testing.T) {
		checkOffsetsKadm(t, ctx, e.adm, topic, map[int32]int64{0: 11}, map[int32]int64{0: 8})
		checkAborted(t, ctx, e, topic, 0, 11, 8, nil)
		if got := pollKgoFor(t, ctx, rc, 1500*time.Millisecond); len(got) != 0 {
			t.Errorf("read_committed while A is open again: read %v, want nothing (B's record is past A's first offset)", got)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	end(a, "A", false)
	t.Run("A-aborted", func(t *testing.T) {
		checkOffsetsKadm(t, ctx, e.adm, topic, map[int32]int64{0: 12}, map[int32]int64{0: 12})
		checkAborted(t, ctx, e, topic, 0, 12, 12, []kmsg.FetchResponseTopicPartitionAbortedTransaction{abortedTxn(pidA, 8)})
		layout := []string{offPlain, offPlain, offTxn, offTxn, offTxn, offCommit, offTxn, offCommit, offTxn, offTxn, offCommit, offAbort}
		pids := map[int64]int64{2: pidA, 3: pidB, 4: pidB, 5: pidB, 6: pidA, 7: pidA, 8: pidA, 9: pidB, 10: pidB, 11: pidA}
		checkLayout(t, ctx, e, topic, 0, layout, pids)
		e.appendEnd(t, ctx, topic, 1) // 12
		checkTxnRead(t, "read_committed after A aborted", byPartition(pollKgoUntil(t, ctx, rc, 2, time.Second)),
			map[int32][]txnRec{0: slices.Concat(b2, []txnRec{{0, 12, txnEndValue(0)}})})
		checkTxnRead(t, "read_committed from the start", readTxnKgo(t, ctx, e.addr, topic, 1, kgo.ReadCommitted()),
			map[int32][]txnRec{0: slices.Concat(pre, a1, b1, a2, b2)})
		checkTxnRead(t, "read_uncommitted from the start", readTxnKgo(t, ctx, e.addr, topic, 1, kgo.ReadUncommitted()),
			map[int32][]txnRec{0: slices.Concat(pre, a1, b1, a2, a3, b2)})
	})
}

// TestTxnFranzGoGroupTransactSession: read-process-write with
// GroupTransactSession: consume in (3 partitions, read_committed), copy
// every record to the same partition of out in a transaction with the
// consumed offsets (TxnOffsetCommit), aborting every third transaction on
// purpose (the session rewinds to the committed offsets and processes those
// records again). Afterwards out read_committed holds every input record
// exactly once in input order, read_uncommitted also the aborted copies,
// and the group's committed offsets are the end of in.
func TestTxnFranzGoGroupTransactSession(t *testing.T) {
	e := newTxnEnv(t)
	ctx := testCtx(t, txnTimeout)
	const parts, perPart = 3, 40
	in := e.topic(t, "-in", parts)
	out := e.topic(t, "-out", parts)
	group := "group-" + in

	want := make(map[int32][]txnRec)
	for p := range int32(parts) {
		for _, r := range e.producePlain(t, ctx, in, p, txnValues("in", p, perPart)...) {
			r.Off = -1
			want[p] = append(want[p], r)
		}
	}

	sess, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(e.addr),
		kgo.TransactionalID("etl-"+in),
		kgo.TransactionTimeout(30*time.Second),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(in),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.FetchMaxWait(250*time.Millisecond),
		kgo.SessionTimeout(10*time.Second),
	)
	if err != nil {
		t.Fatalf("NewGroupTransactSession: %v", err)
	}
	defer sess.Close()

	committedIn := make(map[string]int) // input values whose copy was committed
	total := parts * perPart
	var txns, commits, aborts, abortedRecs int
	for len(committedIn) < total {
		if ctx.Err() != nil {
			t.Fatalf("after %d transactions (%d committed, %d aborted): %d of %d input records committed: %v", txns, commits, aborts, len(committedIn), total, ctx.Err())
		}
		if err := sess.Begin(); err != nil {
			t.Fatalf("Begin: %v", err)
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fs := sess.PollRecords(pctx, 17)
		cancel()
		fs.EachError(func(topic string, p int32, err error) {
			if !kerr.IsRetriable(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("fetch %s p%d: %v", topic, p, err)
			}
		})
		var batch []string
		var outRecs []*kgo.Record
		fs.EachRecord(func(r *kgo.Record) {
			batch = append(batch, string(r.Value))
			outRecs = append(outRecs, &kgo.Record{Topic: out, Partition: r.Partition, Key: r.Key, Value: r.Value})
		})
		if len(outRecs) > 0 {
			if err := sess.ProduceSync(ctx, outRecs...).FirstErr(); err != nil {
				t.Fatalf("produce %d records to %s in the transaction: %v", len(outRecs), out, err)
			}
		}
		commit := len(batch) == 0 || txns%3 != 1
		if len(batch) > 0 {
			txns++
		}
		committed, err := sess.End(ctx, kgo.TransactionEndTry(commit))
		if err != nil {
			t.Fatalf("End(commit=%v) after %d records: %v", commit, len(batch), err)
		}
		switch {
		case len(batch) == 0:
		case committed:
			commits++
			for _, v := range batch {
				committedIn[v]++
				if committedIn[v] > 1 {
					t.Errorf("input record %q committed in a second transaction", v)
				}
			}
		case commit:
			// The session aborts by itself after a rebalance; the
			// records come again.
			t.Logf("End(TryCommit) aborted a transaction of %d records (rebalance?)", len(batch))
			aborts++
			abortedRecs += len(batch)
		default:
			aborts++
			abortedRecs += len(batch)
		}
	}
	t.Logf("%d transactions with records: %d committed, %d aborted (%d records)", txns, commits, aborts, abortedRecs)
	if aborts == 0 || abortedRecs == 0 {
		t.Fatalf("no transaction with records was aborted: the test did not test aborts")
	}
	sess.Close()

	// The group's committed offsets: the end of in.
	e.checkGroupOffsets(t, ctx, "after the last transaction", group, in, parts, perPart)

	e.appendEnd(t, ctx, out, parts)
	checkTxnRead(t, "out, read_committed", withoutOffsets(readTxnKgo(t, ctx, e.addr, out, parts, kgo.ReadCommitted())), want)
	ru := readTxnKgo(t, ctx, e.addr, out, parts, kgo.ReadUncommitted())
	n := 0
	for _, rs := range ru {
		n += len(rs)
	}
	if n != total+abortedRecs {
		t.Errorf("out, read_uncommitted: %d records, want %d (%d committed + %d aborted copies)", n, total+abortedRecs, total, abortedRecs)
	}
}

// isFencedErr: what Kafka answers an older epoch of a transactional id.
func isFencedErr(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// TestTxnFranzGoFencing: a zombie. Producer 1 opens a transaction and
// writes to p0; producer 2 with the same transactional id initializes
// (InitProducerId: a new epoch, which aborts the open transaction). Producer
// 1's commit (EndTxn with the old epoch), or its next write (to p1, which
// needs AddPartitionsToTxn, or to p0, a Produce with the old epoch), fails
// with PRODUCER_FENCED / INVALID_PRODUCER_EPOCH; producer 2 commits its own
// transaction.
// read_committed sees only producer 2's records; read_uncommitted also
// producer 1's first record, written and then aborted (an ABORT marker of
// producer 1 right after it).
func TestTxnFranzGoFencing(t *testing.T) {
	for _, path := range []struct {
		name string
		p    int32 // where the zombie writes after being fenced; -1: it commits right away
	}{
		{"EndTxn", -1},
		{"AddPartitionsToTxn", 1},
		{"Produce", 0},
	} {
		t.Run(path.name, func(t *testing.T) {
			e := newTxnEnv(t)
			ctx := testCtx(t, txnTimeout)
			const parts = 2
			topic := e.topic(t, "", parts)
			id := "fence-" + topic

			zombie := e.txnProducer(t, id, kgo.RecordRetries(3))
			pid1, epoch1 := producerID(t, ctx, zombie)
			if err := zombie.BeginTransaction(); err != nil {
				t.Fatalf("zombie BeginTransaction: %v", err)
			}
			z := produceKgo(t, ctx, zombie, topic, 0, "zombie-0") // p0: 0

			fresh := e.txnProducer(t, id)
			pid2, epoch2 := producerID(t, ctx, fresh) // p0: ABORT at 1
			t.Logf("zombie: producer id %d epoch %d; new producer: id %d epoch %d", pid1, epoch1, pid2, epoch2)
			if pid2 == pid1 && epoch2 <= epoch1 {
				t.Errorf("InitProducerId of the second producer: id %d epoch %d, want a higher epoch than %d", pid2, epoch2, epoch1)
			}

			if path.p >= 0 {
				pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				err := zombie.ProduceSync(pctx, &kgo.Record{Topic: topic, Partition: path.p, Value: []byte("zombie-after-fence")}).FirstErr()
				cancel()
				if !isFencedErr(err) {
					t.Errorf("zombie produce to p%d after the new producer's InitProducerId: %v, want PRODUCER_FENCED or INVALID_PRODUCER_EPOCH", path.p, err)
				}
				// After a failed produce kgo refuses to commit
				// (OPERATION_NOT_ATTEMPTED) or repeats the fatal error.
				if err := zombie.EndTransaction(ctx, kgo.TryCommit); err == nil {
					t.Errorf("zombie EndTransaction(TryCommit) after the failed produce: no error")
				} else {
					t.Logf("zombie EndTransaction(TryCommit) after the failed produce: %v", err)
				}
			} else {
				// EndTxn with the old epoch: Kafka answers
				// PRODUCER_FENCED (epoch below the current one).
				err := zombie.EndTransaction(ctx, kgo.TryCommit)
				switch {
				case isFencedErr(err):
				case e.b.Target() == targetKfake && errors.Is(err, kerr.InvalidTxnState):
					t.Logf("kfake: zombie EndTxn answered %v where Kafka answers PRODUCER_FENCED", err)
				default:
					t.Errorf("zombie EndTransaction(TryCommit): %v, want PRODUCER_FENCED or INVALID_PRODUCER_EPOCH", err)
				}
			}

			if err := fresh.BeginTransaction(); err != nil {
				t.Fatalf("new producer BeginTransaction: %v", err)
			}
			f0 := produceKgo(t, ctx, fresh, topic, 0, "fresh-p0") // p0: 2, COMMIT at 3
			f1 := produceKgo(t, ctx, fresh, topic, 1, "fresh-p1") // p1: 0, COMMIT at 1
			if err := fresh.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatalf("new producer EndTransaction(TryCommit): %v", err)
			}
			zombie.Close()

			if z[0].Off != 0 || f0[0].Off != 2 || f1[0].Off != 0 {
				t.Errorf("offsets: zombie p0 %d, new producer p0 %d, p1 %d; want 0, 2 (after the abort marker), 0", z[0].Off, f0[0].Off, f1[0].Off)
			}
			checkLayout(t, ctx, e, topic, 0, []string{offTxn, offAbort, offTxn, offCommit}, map[int64]int64{0: pid1, 1: pid1, 2: pid2, 3: pid2})
			checkLayout(t, ctx, e, topic, 1, []string{offTxn, offCommit}, map[int64]int64{0: pid2, 1: pid2})
			checkAborted(t, ctx, e, topic, 0, 4, 4, []kmsg.FetchResponseTopicPartitionAbortedTransaction{abortedTxn(pid1, 0)})
			e.appendEnd(t, ctx, topic, parts)
			checkTxnRead(t, "read_committed", readTxnKgo(t, ctx, e.addr, topic, parts, kgo.ReadCommitted()),
				map[int32][]txnRec{0: f0, 1: f1})
			checkTxnRead(t, "read_uncommitted", readTxnKgo(t, ctx, e.addr, topic, parts, kgo.ReadUncommitted()),
				map[int32][]txnRec{0: slices.Concat(z, f0), 1: f1})
		})
	}
}

// TestTxnFranzGoAdmin: kadm DescribeTransactions, ListTransactions (with
// state and producer id filters) and DescribeProducers while a transaction
// is open (Ongoing, its partitions, the producer's first offset in the
// transaction), after it committed (CompleteCommit, no partitions, no open
// transaction on the partitions) and after one aborted (CompleteAbort).
func TestTxnFranzGoAdmin(t *testing.T) {
	e := newTxnEnv(t)
	ctx := testCtx(t, txnTimeout)
	topic := e.topic(t, "", 2)
	id := "admin-" + topic
	cl := e.txnProducer(t, id, kgo.TransactionTimeout(25*time.Second))

	e.producePlain(t, ctx, topic, 0, "plain-0", "plain-1") // p0: 0, 1
	before := time.Now().Add(-time.Second)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("BeginTransaction: %v", err)
	}
	r0 := produceKgo(t, ctx, cl, topic, 0, "t1-p0-0")            // 2
	r1 := produceKgo(t, ctx, cl, topic, 1, "t1-p1-0", "t1-p1-1") // 0, 1
	pid, epoch := producerID(t, ctx, cl)

	describe := func(want string) kadm.DescribedTransaction {
		t.Helper()
		var d kadm.DescribedTransaction
		// A transaction that ended may show Prepare* for a moment.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			ds, err := e.adm.DescribeTransactions(ctx, id)
			if err != nil {
				t.Fatalf("DescribeTransactions %s: %v", id, err)
			}
			d, err = ds.On(id, nil)
			if err == nil {
				err = d.Err
			}
			if err != nil {
				t.Fatalf("DescribeTransactions %s: %v", id, err)
			}
			if d.State == want || !strings.HasPrefix(d.State, "Prepare") || time.Now().After(deadline) {
				break
			}
		}
		if e.b.Target() == targetKfake && strings.HasPrefix(want, "Complete") && d.State == "Empty" {
			// kfake moves an ended transaction to Empty; Kafka keeps
			// CompleteCommit / CompleteAbort until the next one.
			t.Logf("kfake: DescribeTransactions answers Empty where Kafka answers %s", want)
			d.State = want
		}
		if d.State != want || d.ProducerID != pid || d.TxnID != id {
			t.Errorf("DescribeTransactions %s: id %q state %q producer id %d, want %q, %q, %d", id, d.TxnID, d.State, d.ProducerID, id, want, pid)
		}
		if d.TimeoutMillis != 25000 {
			t.Errorf("DescribeTransactions %s: timeout %d ms, want 25000", id, d.TimeoutMillis)
		}
		return d
	}
	list := func(what string, pids []int64, states []string, want string) {
		t.Helper()
		if e.b.Target() == targetKfake && len(states) == 1 && strings.HasPrefix(states[0], "Complete") {
			t.Logf("kfake: ListTransactions state %s not checked (kfake has no Complete* states)", states[0])
			return
		}
		ls, err := e.adm.ListTransactions(ctx, pids, states)
		if err != nil {
			t.Fatalf("ListTransactions %s: %v", what, err)
		}
		l, ok := ls[id]
		switch {
		case want == "" && ok:
			t.Errorf("ListTransactions %s lists %s (%+v), want it filtered out", what, id, l)
		case want != "" && !ok:
			t.Errorf("ListTransactions %s does not list %s (it lists %v)", what, id, ls.TransactionalIDs())
		case want != "" && (l.State != want || l.ProducerID != pid):
			t.Errorf("ListTransactions %s: %s state %q producer id %d, want %q, %d", what, id, l.State, l.ProducerID, want, pid)
		}
	}
	producers := func(when string, wantStart map[int32]int64, wantEpoch int16) {
		t.Helper()
		ds, err := e.adm.DescribeProducers(ctx, kadm.TopicsSet{topic: {0: {}, 1: {}}})
		if err != nil {
			t.Fatalf("DescribeProducers %s: %v", when, err)
		}
		for p, start := range wantStart {
			dp, ok := ds[topic].Partitions[p]
			if !ok || dp.Err != nil {
				t.Errorf("DescribeProducers %s: %s p%d: found %v, error %v", when, topic, p, ok, dp.Err)
				continue
			}
			pr, ok := dp.ActiveProducers[pid]
			if !ok && start == -1 && e.b.Target() == targetKfake {
				// Kafka lists every producer of the partition (until
				// its producer id expires); kfake only those in an
				// open transaction.
				t.Logf("kfake: DescribeProducers %s does not list producer %d without an open transaction", when, pid)
				continue
			}
			if !ok {
				t.Errorf("DescribeProducers %s: %s p%d does not list producer %d (lists %v)", when, topic, p, pid, slices.Collect(maps.Keys(dp.ActiveProducers)))
				continue
			}
			if pr.CurrentTxnStartOffset != start || (wantEpoch >= 0 && pr.ProducerEpoch != wantEpoch) {
				t.Errorf("DescribeProducers %s: %s p%d producer %d: epoch %d, current transaction start %d, want epoch %d, start %d",
					when, topic, p, pid, pr.ProducerEpoch, pr.CurrentTxnStartOffset, wantEpoch, start)
			}
			if wantLast := map[int32]int32{0: 0, 1: 1}[p]; wantEpoch >= 0 && pr.LastSequence != wantLast {
				t.Errorf("DescribeProducers %s: %s p%d producer %d: last sequence %d, want %d", when, topic, p, pid, pr.LastSequence, wantLast)
			}
		}
	}

	t.Run("ongoing", func(t *testing.T) {
		d := describe("Ongoing")
		if d.ProducerEpoch != epoch {
			t.Errorf("DescribeTransactions: epoch %d, want %d", d.ProducerEpoch, epoch)
		}
		var got []string
		d.Topics.Each(func(topic string, p int32) {
			got = append(got, fmt.Sprintf("%s/%d", topic, p))
		})
		slices.Sort(got)
		if want := []string{topic + "/0", topic + "/1"}; !slices.Equal(got, want) {
			t.Errorf("DescribeTransactions: partitions %q, want %q", got, want)
		}
		if st := time.UnixMilli(d.StartTimestamp); st.Before(before) || st.After(time.Now().Add(time.Second)) {
			t.Errorf("DescribeTransactions: start timestamp %d (%s), want within this test", d.StartTimestamp, st)
		}
		list("unfiltered", nil, nil, "Ongoing")
		list("state Ongoing", nil, []string{"Ongoing"}, "Ongoing")
		list("state CompleteCommit", nil, []string{"CompleteCommit"}, "")
		list("producer id", []int64{pid}, nil, "Ongoing")
		list("another producer id", []int64{pid + 1000}, nil, "")
		producers("while open", map[int32]int64{0: r0[0].Off, 1: r1[0].Off}, epoch)
	})

	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("EndTransaction(TryCommit): %v", err)
	}
	t.Run("committed", func(t *testing.T) {
		d := describe("CompleteCommit")
		if len(d.Topics) != 0 {
			t.Errorf("DescribeTransactions after the commit: partitions %v, want none", d.Topics)
		}
		list("state CompleteCommit", nil, []string{"CompleteCommit"}, "CompleteCommit")
		list("state Ongoing", nil, []string{"Ongoing"}, "")
		producers("after the commit", map[int32]int64{0: -1, 1: -1}, -1)
	})

	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("BeginTransaction: %v", err)
	}
	produceKgo(t, ctx, cl, topic, 1, "t2-p1-0")
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatalf("EndTransaction(TryAbort): %v", err)
	}
	t.Run("aborted", func(t *testing.T) {
		describe("CompleteAbort")
		list("state CompleteAbort", nil, []string{"CompleteAbort"}, "CompleteAbort")
	})

	t.Run("unknown", func(t *testing.T) {
		ds, err := e.adm.DescribeTransactions(ctx, "no-such-"+id)
		if err != nil {
			t.Fatalf("DescribeTransactions of an unknown id: %v", err)
		}
		if d, ok := ds["no-such-"+id]; !ok || !errors.Is(d.Err, kerr.TransactionalIDNotFound) {
			t.Errorf("DescribeTransactions of an unknown id: %+v (found %v), want TRANSACTIONAL_ID_NOT_FOUND", d, ok)
		}
	})
}

// ---- the copy scenario of the other clients' tests ----------------------------

// The other clients' transactional producers (txn_*_test.go) run one
// scenario: topic in has copyParts partitions of copyPerPart plain records
// copyValue(p, i); the client copies ranges of them to the same partition
// of out in transactions that also commit the consumed position to a group
// (SendOffsetsToTransaction, AddOffsetsToTxn, sendOffsets), per copyPlan:
// [0, 4) committed, [4, 7) aborted (its offsets must not be committed
// either), [4, 10) committed. Afterwards out read_committed holds each input
// record exactly once, read_uncommitted also the aborted copies, the group's
// committed offsets are 4, 4 and 10 after each step, and out's offsets show
// one marker per partition after every transaction.

const (
	copyParts   = 2
	copyPerPart = 10
)

type copyStep struct {
	From, To int64
	Commit   bool
}

var copyPlan = []copyStep{{0, 4, true}, {4, 7, false}, {4, 10, true}}

func copyValue(p int32, i int64) string { return fmt.Sprintf("in-p%d-%d", p, i) }

// copyFixture creates in and out and fills in; the group name is derived
// from in.
func (e *txnEnv) copyFixture(t testing.TB, ctx context.Context) (in, out, group string) {
	t.Helper()
	in = e.topic(t, "-in", copyParts)
	out = e.topic(t, "-out", copyParts)
	for p := range int32(copyParts) {
		var vs []string
		for i := range int64(copyPerPart) {
			vs = append(vs, copyValue(p, i))
		}
		e.producePlain(t, ctx, in, p, vs...)
	}
	return in, out, "group-" + in
}

// copyCommittedAfter is the group's committed offset of every partition
// of in after step i of copyPlan.
func copyCommittedAfter(i int) int64 {
	var at int64
	for _, s := range copyPlan[:i+1] {
		if s.Commit {
			at = s.To
		}
	}
	return at
}

// copyWant is what out must hold (committed only, or every data record)
// per partition, at its offsets, and the partition's layout.
func copyWant(committedOnly bool) (map[int32][]txnRec, []string) {
	want := make(map[int32][]txnRec)
	var layout []string
	for p := range int32(copyParts) {
		off := int64(0)
		layout = nil
		for _, s := range copyPlan {
			for i := s.From; i < s.To; i++ {
				if s.Commit || !committedOnly {
					want[p] = append(want[p], txnRec{P: p, Off: off, V: copyValue(p, i)})
				}
				off++
				layout = append(layout, offTxn)
			}
			off++ // the marker
			layout = append(layout, map[bool]string{true: offCommit, false: offAbort}[s.Commit])
		}
	}
	return want, layout
}

// checkGroupOffsets checks the committed offset of every partition of
// topic in group (kadm OffsetFetch).
// Kafka may answer the previous offsets (or UNSTABLE_OFFSET_COMMIT) for a
// moment after EndTxn; this asks again for up to 5 s.
func (e *txnEnv) checkGroupOffsets(t testing.TB, ctx context.Context, when, group, topic string, parts int32, want int64) {
	t.Helper()
	var got map[int32]int64
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, err = e.groupOffsets(ctx, group, topic, parts)
		same := err == nil
		for p := range parts {
			same = same && got[p] == want
		}
		if same || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("%s: kadm FetchOffsets %s: %v", when, group, err)
	}
	for p := range parts {
		if got[p] != want {
			t.Errorf("%s: group %s committed offset of %s p%d: %d, want %d", when, group, topic, p, got[p], want)
		}
	}
}

// groupOffsets is the committed offset (-1: none) of every partition of
// topic in group.
func (e *txnEnv) groupOffsets(ctx context.Context, group, topic string, parts int32) (map[int32]int64, error) {
	offs, err := e.adm.FetchOffsets(ctx, group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return nil, err
	}
	got := make(map[int32]int64)
	for p := range parts {
		got[p] = -1
		if o, ok := offs.Lookup(topic, p); ok {
			got[p] = o.At
		}
	}
	return got, nil
}

// checkCopyOut checks out once the client's last transaction ended:
// offsets (ListOffsets both levels), the batches and markers (raw Fetch),
// the aborted transactions (raw read_committed Fetch), then appends the
// end records and reads out with franz-go at both isolation levels.
func (e *txnEnv) checkCopyOut(t testing.TB, ctx context.Context, out string) {
	t.Helper()
	rc, layout := copyWant(true)
	ru, _ := copyWant(false)
	end := map[int32]int64{}
	for p := range int32(copyParts) {
		end[p] = int64(len(layout))
	}
	checkOffsetsKadm(t, ctx, e.adm, out, end, end)
	for p := range int32(copyParts) {
		checkLayout(t, ctx, e, out, p, layout, nil)
		fp := rawFetch(t, ctx, e, out, p, 0, 1)
		var firsts []int64
		for _, a := range fp.AbortedTransactions {
			firsts = append(firsts, a.FirstOffset)
		}
		// The aborted step starts after the first step and its marker.
		if want := []int64{copyPlan[0].To - copyPlan[0].From + 1}; !slices.Equal(firsts, want) {
			t.Errorf("read_committed Fetch %s p%d: aborted transactions start at %v, want %v", out, p, firsts, want)
		}
		if fp.LastStableOffset != end[p] {
			t.Errorf("read_committed Fetch %s p%d: last stable offset %d, want %d", out, p, fp.LastStableOffset, end[p])
		}
	}
	e.appendEnd(t, ctx, out, copyParts)
	checkTxnRead(t, "franz-go read_committed of out", readTxnKgo(t, ctx, e.addr, out, copyParts, kgo.ReadCommitted()), rc)
	checkTxnRead(t, "franz-go read_uncommitted of out", readTxnKgo(t, ctx, e.addr, out, copyParts, kgo.ReadUncommitted()), ru)
}

// TestTxnFranzGoKill9: transaction state and markers survive a crash.
// produceTxnMix's committed and aborted transactions, then one more left
// open on p0; SIGKILL and start: the open transaction still holds p0's
// last stable offset at its first record, the producer (same client,
// reconnecting) commits it, and after a graceful restart on top
// read_committed and read_uncommitted read exactly what they must, with
// the markers in place.
func TestTxnFranzGoKill9(t *testing.T) {
	e := newTxnEnv(t)
	if e.b.Target() == targetKfake {
		t.Skip("kfake runs inside the test process and cannot be killed with SIGKILL")
	}
	ctx := testCtx(t, txnTimeout)
	topic := e.topic(t, "", mixParts)
	m := e.produceTxnMix(t, ctx, topic)
	checkOffsetsKadm(t, ctx, e.adm, topic, m.hwm, m.hwm)

	cl := e.txnProducer(t, "open-"+topic)
	pid, _ := producerID(t, ctx, cl)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("BeginTransaction: %v", err)
	}
	open := produceKgo(t, ctx, cl, topic, 0, "open-p0-0", "open-p0-1")
	if open[0].Off != m.hwm[0] {
		t.Fatalf("open transaction's first record at %d, want %d", open[0].Off, m.hwm[0])
	}
	hwm := map[int32]int64{0: m.hwm[0] + 2, 1: m.hwm[1]}
	lso := map[int32]int64{0: m.hwm[0], 1: m.hwm[1]}
	checkOffsetsKadm(t, ctx, e.adm, topic, hwm, lso)

	e.b.Kill9(t)
	e.b.Start(t)
	checkOffsetsKadm(t, ctx, e.adm, topic, hwm, lso)
	if t.Failed() {
		t.FailNow()
	}
	for _, p := range []int32{0, 1} {
		checkAborted(t, ctx, e, topic, p, hwm[p], lso[p], m.aborted[p])
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("EndTransaction(TryCommit) of the transaction open across the crash: %v", err)
	}
	m.committed[0] = append(m.committed[0], open...)
	m.all[0] = append(m.all[0], open...)
	m.layout[0] = append(m.layout[0], offTxn, offTxn, offCommit)
	for i := range int64(3) {
		m.pids[0][hwm[0]-2+i] = pid
	}
	hwm[0]++
	checkOffsetsKadm(t, ctx, e.adm, topic, hwm, hwm)

	e.b.Restart(t)
	checkOffsetsKadm(t, ctx, e.adm, topic, hwm, hwm)
	for p := range int32(mixParts) {
		checkAborted(t, ctx, e, topic, p, hwm[p], hwm[p], m.aborted[p])
		checkLayout(t, ctx, e, topic, p, m.layout[p], m.pids[p])
	}
	e.appendEnd(t, ctx, topic, mixParts)
	checkTxnRead(t, "read_committed after the crash", readTxnKgo(t, ctx, e.addr, topic, mixParts, kgo.ReadCommitted()), m.committed)
	checkTxnRead(t, "read_uncommitted after the crash", readTxnKgo(t, ctx, e.addr, topic, mixParts, kgo.ReadUncommitted()), m.all)
}

// TestTxnChecksCatchMismatches: self-test of checkTxnRead and checkBatches
// (no broker): the good sets pass, and every mutation below (a committed
// record missing, an aborted one seen, a duplicate, a wrong offset, a
// reordering; a missing, mistyped or unflagged marker, a wrong producer id,
// a marker inside a data batch) is reported.
func TestTxnChecksCatchMismatches(t *testing.T) {
	want := map[int32][]txnRec{
		0: {{0, 0, "c1-p0-0"}, {0, 1, "c1-p0-1"}, {0, 5, "c2-p0-0"}},
		1: {{1, 0, "c1-p1-0"}},
	}
	clone := func() map[int32][]txnRec {
		out := make(map[int32][]txnRec)
		for p, rs := range want {
			out[p] = slices.Clone(rs)
		}
		return out
	}
	rec := &errRecorder{TB: t}
	checkTxnRead(rec, "good", clone(), want)
	if len(rec.errs) != 0 {
		t.Fatalf("checkTxnRead of the expected set reported %q", rec.errs)
	}
	for name, mutate := range map[string]func(m map[int32][]txnRec){
		"missing":     func(m map[int32][]txnRec) { m[0] = m[0][:2] },
		"aborted":     func(m map[int32][]txnRec) { m[0] = slices.Insert(m[0], 2, txnRec{0, 3, "a1-p0-0"}) },
		"duplicate":   func(m map[int32][]txnRec) { m[1] = append(m[1], m[1][0]) },
		"offset":      func(m map[int32][]txnRec) { m[0][2].Off = 4 },
		"reordered":   func(m map[int32][]txnRec) { m[0][0], m[0][1] = m[0][1], m[0][0] },
		"partition":   func(m map[int32][]txnRec) { m[1] = append(m[1], m[0][2]); m[0] = m[0][:2] },
		"empty-parts": func(m map[int32][]txnRec) { delete(m, 1) },
	} {
		got := clone()
		mutate(got)
		rec := &errRecorder{TB: t}
		checkTxnRead(rec, name, got, want)
		if len(rec.errs) == 0 {
			t.Errorf("checkTxnRead: mutation %q not reported", name)
		}
	}

	layout := []string{offPlain, offTxn, offTxn, offCommit, offTxn, offAbort}
	pids := map[int64]int64{1: 7, 2: 7, 3: 7, 4: 7, 5: 7}
	good := []rawBatch{
		{First: 0, Last: 0, ProducerID: -1, ControlType: -1},
		{First: 1, Last: 2, Transactional: true, ProducerID: 7, ControlType: -1},
		{First: 3, Last: 3, Transactional: true, Control: true, ControlType: 1, ProducerID: 7},
		{First: 4, Last: 4, Transactional: true, ProducerID: 7, ControlType: -1},
		{First: 5, Last: 5, Transactional: true, Control: true, ControlType: 0, ProducerID: 7},
	}
	rec = &errRecorder{TB: t}
	checkBatches(rec, "good", good, layout, pids)
	if len(rec.errs) != 0 {
		t.Fatalf("checkBatches of the expected batches reported %q", rec.errs)
	}
	for name, mutate := range map[string]func(bs []rawBatch) []rawBatch{
		"no-marker":      func(bs []rawBatch) []rawBatch { return slices.Delete(bs, 2, 3) },
		"last-missing":   func(bs []rawBatch) []rawBatch { return bs[:4] },
		"commit-type":    func(bs []rawBatch) []rawBatch { bs[4].ControlType = 1; return bs },
		"not-control":    func(bs []rawBatch) []rawBatch { bs[2].Control = false; return bs },
		"not-txn-data":   func(bs []rawBatch) []rawBatch { bs[1].Transactional = false; return bs },
		"txn-plain":      func(bs []rawBatch) []rawBatch { bs[0].Transactional = true; return bs },
		"wrong-pid":      func(bs []rawBatch) []rawBatch { bs[2].ProducerID = 8; return bs },
		"marker-in-data": func(bs []rawBatch) []rawBatch { bs[1].Last = 3; return slices.Delete(bs, 2, 3) },
		"extra-marker": func(bs []rawBatch) []rawBatch {
			return append(bs, rawBatch{First: 6, Last: 6, Transactional: true, Control: true, ControlType: 1, ProducerID: 7})
		},
	} {
		rec := &errRecorder{TB: t}
		checkBatches(rec, name, mutate(slices.Clone(good)), layout, pids)
		if len(rec.errs) == 0 {
			t.Errorf("checkBatches: mutation %q not reported", name)
		}
	}
}
