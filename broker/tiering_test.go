package broker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

func startTiered(t *testing.T, dir string, tier *tiering.Tier) *testServer {
	t.Helper()
	return startServerConfig(t, Config{DataDir: dir, AutoCreateTopics: true, Tier: tier, MaintenanceInterval: 50 * time.Millisecond})
}

func localLogFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		sep := string(filepath.Separator)
		if err == nil && strings.HasSuffix(p, ".log") && !strings.Contains(p, sep+"tier") && !strings.Contains(p, sep+groupsDir+sep) && !strings.Contains(p, sep+txnDir+sep) {
			n++
		}
		return nil
	})
	return n
}

// TestTieringOffloadColdReadRestore: small segments go to the bucket and
// leave the disk; everything is consumed byte-exact from offset 0 (cold),
// then again after a restart with an empty data directory (restore), and
// new records continue at the right offset.
func TestTieringOffloadColdReadRestore(t *testing.T) {
	store := tiering.NewMemStore()
	dir := t.TempDir()
	ts := startTiered(t, dir, tiering.New(store, nil, 8<<20))
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	cfg := map[string]*string{"segment.bytes": kstr("20000"), "local.retention.bytes": kstr("0"), "retention.ms": kstr("-1")}
	if _, err := adm.CreateTopic(ctx, 2, 1, cfg, "cold"); err != nil {
		t.Fatal(err)
	}
	pr, _ := client(t, ts.addr, kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.ProducerLinger(0))
	var sent []*kgo.Record
	for i := 0; i < 600; i++ {
		r := &kgo.Record{Topic: "cold", Partition: int32(i % 2), Key: []byte(fmt.Sprint(i)), Value: bytes.Repeat([]byte{byte(i)}, 500)}
		sent = append(sent, r)
	}
	for i := 0; i < len(sent); i += 20 { // ~10 KB batches: several segments
		if err := pr.ProduceSync(ctx, sent[i:i+20]...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until sealed segments are uploaded and gone from the disk.
	deadline := time.Now().Add(20 * time.Second)
	for {
		tp := ts.reg.get("cold")
		p0 := ts.reg.partition(tp, 0)
		if p0.log.LocalStartOffset() > 0 && localLogFiles(t, dir) <= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("segments never left the disk: local start %d, %d local .log files", p0.log.LocalStartOffset(), localLogFiles(t, dir))
		}
		time.Sleep(50 * time.Millisecond)
	}
	check := func(addr string) {
		t.Helper()
		got := consumeAll(t, addr, "cold", len(sent))
		byKey := map[string][]byte{}
		for _, r := range got {
			byKey[string(r.Key)] = r.Value
		}
		for _, r := range sent {
			if !bytes.Equal(byKey[string(r.Key)], r.Value) {
				t.Fatalf("record %s not read back byte-exact", r.Key)
			}
		}
	}
	check(ts.addr) // cold
	check(ts.addr) // cache
	end0 := ts.reg.partition(ts.reg.get("cold"), 0).log.LogEndOffset()

	// Committed offsets are mirrored to the bucket by the maintenance loop.
	var commit kadm.Offsets
	commit.Add(kadm.Offset{Topic: "cold", Partition: 0, At: 42, LeaderEpoch: -1, Metadata: "meta"})
	commit.Add(kadm.Offset{Topic: "cold", Partition: 1, At: 7, LeaderEpoch: -1})
	_, adm2 := client(t, ts.addr)
	if err := adm2.CommitAllOffsets(ctx, "restore-g", commit); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := store.GetRange(ctx, groupsKey, 0, -1); err == nil && bytes.Contains(b, []byte("restore-g")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("committed offsets never mirrored to the bucket")
		}
	}

	// Lose the disk: a new broker on an empty directory and the same bucket.
	ts.stop(t)
	dir2 := t.TempDir()
	ts2 := startTiered(t, dir2, tiering.New(store, nil, 8<<20))
	check(ts2.addr)
	_, adm3 := client(t, ts2.addr)
	offs, err := adm3.FetchOffsets(ctx, "restore-g")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := offs.Lookup("cold", 0); o.At != 42 || o.Metadata != "meta" {
		t.Fatalf("restored offset of partition 0: %+v", o)
	}
	if o, _ := offs.Lookup("cold", 1); o.At != 7 {
		t.Fatalf("restored offset of partition 1: %+v", o)
	}
	p0 := ts2.reg.partition(ts2.reg.get("cold"), 0)
	if p0.log.LogEndOffset() != end0 {
		t.Fatalf("restored partition ends at %d, was %d", p0.log.LogEndOffset(), end0)
	}
	pr2, _ := client(t, ts2.addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	res := pr2.ProduceSync(ctx, &kgo.Record{Topic: "cold", Partition: 0, Value: []byte("after restore")})
	if err := res.FirstErr(); err != nil {
		t.Fatal(err)
	}
	if r, _ := res.First(); r.Offset != end0 {
		t.Fatalf("first record after restore at %d, want %d", r.Offset, end0)
	}
	// ListOffsets -4 (earliest local) and -5 (latest tiered).
	for _, q := range []struct {
		ts   int64
		want func(int64) bool
	}{{-4, func(o int64) bool { return o == end0 }}, {-5, func(o int64) bool { return o >= 0 && o < end0 }}} {
		req := kmsg.NewPtrListOffsetsRequest()
		req.Version = 9
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = "cold"
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Timestamp = q.ts
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, pr2)
		if err != nil {
			t.Fatal(err)
		}
		if p := resp.Topics[0].Partitions[0]; p.ErrorCode != 0 || !q.want(p.Offset) {
			t.Fatalf("ListOffsets %d: %+v (log end before restore %d)", q.ts, p, end0)
		}
	}
}

func kstr(s string) *string { return &s }

// TestBucketOutageDiskBudget: with the bucket away, produce is accepted up
// to the local disk budget, then refused with a retriable error; when the
// bucket returns, uploads catch up, local copies are released and produce
// works again. Nothing acknowledged is lost.
func TestBucketOutageDiskBudget(t *testing.T) {
	store, away := storeThatGoesAway()
	ts := startServerConfig(t, Config{Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 20 * time.Millisecond,
		LocalDiskBudget: 200_000})
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	cfg := map[string]*string{"segment.bytes": kstr("20000"), "local.retention.bytes": kstr("0"), "retention.ms": kstr("-1")}
	if _, err := adm.CreateTopic(ctx, 1, 1, cfg, "budget"); err != nil {
		t.Fatal(err)
	}
	away.Store(true)
	acked, refused := produceUntilRefused(t, ts.addr, "budget", 400, 2*time.Millisecond, // let maintenance see the growth
		func(i int) []byte { return bytes.Repeat([]byte{byte(i), 7, byte(i >> 3)}, 400) })
	if !refused {
		t.Fatal("produce never refused past the local disk budget while the bucket was away")
	}
	if !kerr.KafkaStorageError.Retriable {
		t.Fatal("the refusal must be retriable")
	}
	away.Store(false)
	acceptedAgainNothingLost(t, ts.addr, "budget", acked)
}

// produceUntilRefused produces records (key i, value value(i)) to topic one
// at a time, pausing between them, until one is refused with
// KAFKA_STORAGE_ERROR or max were sent (any other error fails t). It
// returns the acknowledged records and whether one was refused.
func produceUntilRefused(t *testing.T, addr, topic string, max int, pause time.Duration, value func(i int) []byte) ([]*kgo.Record, bool) {
	t.Helper()
	ctx := ctxT(t)
	pr, _ := client(t, addr, kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RecordRetries(1))
	var acked []*kgo.Record
	for i := 0; i < max; i++ {
		r := &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(i)), Value: value(i)}
		switch err := pr.ProduceSync(ctx, r).FirstErr(); {
		case err == nil:
			acked = append(acked, r)
		case errors.Is(err, kerr.KafkaStorageError):
			t.Logf("refused after %d records at %v", len(acked), time.Now().Format("15:04:05.000"))
			return acked, true
		default:
			t.Fatal(err)
		}
		time.Sleep(pause)
	}
	return acked, false
}

// acceptedAgainNothingLost waits until topic accepts a record again (from
// a fresh client: the first may be backing off after refusals), then reads
// the topic back and fails t unless every acknowledged record is there,
// byte-exact.
func acceptedAgainNothingLost(t *testing.T, addr, topic string, acked []*kgo.Record) {
	t.Helper()
	ctx := ctxT(t)
	pr, _ := client(t, addr, kgo.RecordRetries(1))
	waitUntil(t, 20*time.Second, func() bool {
		return pr.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("after"), Value: []byte("x")}).FirstErr() == nil
	})
	t.Logf("accepted again at %v", time.Now().Format("15:04:05.000"))
	got := consumeAll(t, addr, topic, len(acked)+1)
	byKey := map[string][]byte{}
	for _, r := range got {
		byKey[string(r.Key)] = r.Value
	}
	for _, r := range acked {
		if !bytes.Equal(byKey[string(r.Key)], r.Value) {
			t.Fatalf("acknowledged record %s lost", r.Key)
		}
	}
}

func waitUntil(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSlowBucketDoesNotStallTailPartitions: a fetch naming a cold partition
// (its chunk slow to arrive from the bucket) and a tail partition answers
// the tail partition at once; the cold data arrives in a later fetch.
func TestSlowBucketDoesNotStallTailPartitions(t *testing.T) {
	store := tiering.NewMemStore()
	var slow atomic.Bool
	store.SetFault(func(op, key string) error {
		if op == "get" && slow.Load() && strings.HasSuffix(key, ".log") {
			time.Sleep(3 * time.Second)
		}
		return nil
	})
	dir := t.TempDir()
	ts := startTiered(t, dir, tiering.New(store, nil, 8<<20))
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	cfg := map[string]*string{"segment.bytes": kstr("5000"), "local.retention.bytes": kstr("0"), "retention.ms": kstr("-1")}
	if _, err := adm.CreateTopic(ctx, 2, 1, cfg, "mixed"); err != nil {
		t.Fatal(err)
	}
	pr, _ := client(t, ts.addr, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchCompression(kgo.NoCompression()))
	for i := 0; i < 40; i++ {
		if err := pr.ProduceSync(ctx, &kgo.Record{Topic: "mixed", Partition: 0, Value: bytes.Repeat([]byte{1, 2, 3}, 300)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	p0 := ts.reg.partition(ts.reg.get("mixed"), 0)
	waitUntil(t, 10*time.Second, func() bool { return p0.log.LocalStartOffset() > 0 })
	if err := pr.ProduceSync(ctx, &kgo.Record{Topic: "mixed", Partition: 1, Value: []byte("tail")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	req := kmsg.NewPtrFetchRequest()
	req.Version = 12
	req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 5000, 1, 1<<20
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = "mixed", ts.reg.get("mixed").id // kgo may send v13+: by id
	for _, p := range []int32{0, 1} {
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = p, 0, 1<<20
		rp.CurrentLeaderEpoch, rp.LogStartOffset = -1, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	start := time.Now()
	resp, err := req.RequestWith(ctx, pr)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("fetch took %v behind a slow bucket", took)
	}
	var tail, cold int
	for _, p := range resp.Topics[0].Partitions {
		if p.Partition == 1 {
			tail = len(p.RecordBatches)
		} else {
			cold = len(p.RecordBatches)
		}
	}
	if tail == 0 || cold != 0 {
		t.Fatalf("tail partition %d bytes, cold partition %d bytes: %+v", tail, cold, resp.Topics[0].Partitions)
	}
	// The download finishes in the background; a later fetch gets the data.
	slow.Store(false)
	waitUntil(t, 10*time.Second, func() bool {
		resp, err := req.RequestWith(ctx, pr)
		return err == nil && len(resp.Topics[0].Partitions[0].RecordBatches) > 0
	})
}

// TestRestoreKeepsProducerState: after a restore from the bucket, a retried
// idempotent batch is answered with its original offset, not written twice,
// and a new producer never gets the id of one whose state came back (its
// first batch would be taken for that one's retry and dropped).
func TestRestoreKeepsProducerState(t *testing.T) {
	store := tiering.NewMemStore()
	ts := startTiered(t, t.TempDir(), tiering.New(store, nil, 8<<20))
	cl, adm := client(t, ts.addr)
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "idem"); err != nil {
		t.Fatal(err)
	}
	ipr, err := kmsg.NewPtrInitProducerIDRequest().RequestWith(ctx, cl)
	if err != nil || ipr.ErrorCode != 0 {
		t.Fatal(err, ipr)
	}
	send := func(addr string, id [16]byte, seq int32, pid ...int64) *kmsg.ProduceResponseTopicPartition {
		t.Helper()
		c, _ := client(t, addr)
		req := kmsg.NewPtrProduceRequest()
		req.Acks, req.TimeoutMillis = -1, 5000
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic, rt.TopicID = "idem", id
		rp := kmsg.NewProduceRequestTopicPartition()
		rb := kmsg.RecordBatch{Magic: 2, ProducerID: ipr.ProducerID, FirstSequence: seq, NumRecords: 1, FirstTimestamp: 1, MaxTimestamp: 1}
		if len(pid) > 0 {
			rb.ProducerID = pid[0]
		}
		rec := kmsg.Record{Value: []byte("x")}
		rec.Length = int32(len(rec.AppendTo(nil)) - 1)
		rb.Records = rec.AppendTo(nil)
		rp.Records = fixCRC(rb.AppendTo(nil))
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return &resp.Topics[0].Partitions[0]
	}
	id := ts.reg.get("idem").id
	for seq := int32(0); seq < 3; seq++ {
		if r := send(ts.addr, id, seq); r.ErrorCode != 0 || r.BaseOffset != int64(seq) {
			t.Fatalf("seq %d: %+v", seq, r)
		}
	}
	ts.stop(t) // graceful: offloads the data and the producer state

	// A restore that crashed right after rebasing the partition (before
	// its producer state was installed) is finished by the next start,
	// producer state and id floor included.
	crashed := t.TempDir()
	topicsJSON, err := store.GetRange(ctx, metaKey, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{restorePending: nil, topicsFile: topicsJSON} {
		if err := os.WriteFile(filepath.Join(crashed, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := tiering.New(store, nil, 0).Manifest(ctx, tiering.PartitionKey{Topic: "idem", TopicID: id, Partition: 0})
	if err != nil {
		t.Fatal(err)
	}
	ls := log.OpenStore(log.Options{})
	lp, err := ls.OpenPartition(partitionDir(crashed, "idem", 0), log.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.Rebase(m.Next(), m.LogStartOffset); err != nil {
		t.Fatal(err)
	}
	lp.Close()
	ls.Close()
	ts3 := startTiered(t, crashed, tiering.New(store, nil, 8<<20))
	if r := send(ts3.addr, id, 2); r.ErrorCode != 0 || r.BaseOffset != 2 {
		t.Fatalf("retried batch after a restore finished by a second start: %+v", r)
	}
	cl3, _ := client(t, ts3.addr)
	if ipr3, err := kmsg.NewPtrInitProducerIDRequest().RequestWith(ctx, cl3); err != nil || ipr3.ProducerID <= ipr.ProducerID {
		t.Fatalf("new producer after a restore finished by a second start: %+v, %v", ipr3, err)
	}
	ts3.stop(t)

	ts2 := startTiered(t, t.TempDir(), tiering.New(store, nil, 8<<20))
	if r := send(ts2.addr, id, 2); r.ErrorCode != 0 || r.BaseOffset != 2 {
		t.Fatalf("retried batch after restore: %+v", r)
	}
	if r := send(ts2.addr, id, 3); r.ErrorCode != 0 || r.BaseOffset != 3 {
		t.Fatalf("next batch after restore: %+v", r)
	}
	cl2, _ := client(t, ts2.addr)
	ipr2, err := kmsg.NewPtrInitProducerIDRequest().RequestWith(ctx, cl2)
	if err != nil || ipr2.ErrorCode != 0 {
		t.Fatal(err, ipr2)
	}
	if ipr2.ProducerID <= ipr.ProducerID {
		t.Fatalf("new producer after restore got id %d; the restored one has %d", ipr2.ProducerID, ipr.ProducerID)
	}
	for seq := int32(0); seq < 3; seq++ {
		if r := send(ts2.addr, id, seq, ipr2.ProducerID); r.ErrorCode != 0 || r.BaseOffset != int64(4+seq) {
			t.Fatalf("new producer's seq %d after restore: %+v", seq, r)
		}
	}
}

// TestProducerMirrorRetried: a producer-state mirror that failed is tried
// again on the next maintenance passes, not only after the next upload (with
// no more produce, the bucket's copy stayed stale for good).
func TestProducerMirrorRetried(t *testing.T) {
	store := tiering.NewMemStore()
	var failing atomic.Bool
	var failed atomic.Int32
	failing.Store(true)
	store.SetFault(func(op, key string) error {
		if op == "put" && strings.HasPrefix(key, "_synapse/producers/") && failing.Load() {
			failed.Add(1)
			return errors.New("injected: bucket refuses")
		}
		return nil
	})
	ts := startTiered(t, t.TempDir(), tiering.New(store, nil, 8<<20))
	cl, adm := client(t, ts.addr, kgo.ProducerBatchCompression(kgo.NoCompression())) // kgo: idempotent
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"segment.bytes": kstr("20000")}, "mir"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ { // one batch each: several segments
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "mir", Value: bytes.Repeat([]byte{'v'}, 1000)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 10*time.Second, func() bool { return failed.Load() > 0 })
	failing.Store(false)
	key := producersKey(ts.reg.partitionsOf(ts.reg.get("mir"))[0].tierKey())
	waitUntil(t, 10*time.Second, func() bool {
		_, err := store.GetRange(ctx, key, 0, -1)
		return err == nil
	})
}

// TestRestoredTopicsAreChecked: a topics.json from the bucket whose records
// are not what this broker writes (a name that leaves the data directory, a
// partition count without end, a topic twice) stops the start with an
// error naming it; nothing is created outside the data directory.
func TestRestoredTopicsAreChecked(t *testing.T) {
	id := func(b byte) string { return fmt.Sprintf("%032x", b) }
	for _, tc := range []struct{ name, topics string }{
		{"path", `{"version":1,"topics":[{"name":"../../escaped","id":"` + id(1) + `","partitions":1}]}`},
		{"count", `{"version":1,"topics":[{"name":"huge","id":"` + id(1) + `","partitions":2147483647}]}`},
		{"none", `{"version":1,"topics":[{"name":"none","id":"` + id(1) + `","partitions":0}]}`},
		{"twice", `{"version":1,"topics":[{"name":"a","id":"` + id(1) + `","partitions":1},{"name":"a","id":"` + id(2) + `","partitions":1}]}`},
		{"same-id", `{"version":1,"topics":[{"name":"a","id":"` + id(1) + `","partitions":1},{"name":"b","id":"` + id(1) + `","partitions":1}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := tiering.NewMemStore()
			ctx := ctxT(t)
			if err := store.Put(ctx, metaKey, strings.NewReader(tc.topics), int64(len(tc.topics))); err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			dir := filepath.Join(root, "a", "b", "data")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			s, err := New(Config{DataDir: dir, Tier: tiering.New(store, nil, 8<<20), Logger: zaptest.NewLogger(t)})
			if err == nil {
				s.Close()
				t.Fatal("started from a bad topics.json")
			}
			if !strings.Contains(err.Error(), topicsFile) {
				t.Fatalf("error does not name %s: %v", topicsFile, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "../../escaped-0")); err == nil {
				t.Fatal("a partition directory was created outside the data directory")
			}
		})
	}
}

// TestRestoreProducersChecksTheSnapshot: a mirrored producer snapshot is
// the bucket's word: batches at or past the bucket's end, negative ids and
// sequences are dropped, and the id floor covers every restored id and the
// bound the snapshot was taken with.
func TestRestoreProducersChecksTheSnapshot(t *testing.T) {
	dir := t.TempDir()
	ls := log.OpenStore(log.Options{})
	defer ls.Close()
	lp, err := ls.OpenPartition(filepath.Join(dir, "p"), log.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{log: lp, producers: map[int64]*producerState{}}
	snap := `{"version":1,"log_end":100,"producer_id_end":50,"producers":{
		"7":{"epoch":0,"batches":[{"first_seq":0,"last_seq":0,"base_offset":10},{"first_seq":1,"last_seq":1,"base_offset":95}]},
		"900":{"epoch":1,"batches":[{"first_seq":0,"last_seq":4,"base_offset":120}]},
		"-4":{"epoch":0,"batches":[{"first_seq":0,"last_seq":0,"base_offset":1}]},
		"8":{"epoch":0,"batches":[{"first_seq":-2,"last_seq":0,"base_offset":2}]}}}`
	keep, _, floor, err := restoredProducers([]byte(snap), 90)
	if err != nil {
		t.Fatal(err)
	}
	p.restoreProducers(keep, nil)
	if floor != 901 {
		t.Fatalf("id floor %d, want 901", floor)
	}
	if len(p.producers) != 1 || p.producers[7] == nil || len(p.producers[7].Batches) != 1 || p.producers[7].Batches[0].BaseOffset != 10 {
		t.Fatalf("restored %+v, want producer 7 with its batch at 10 only", p.producers)
	}
	if _, _, _, err := restoredProducers([]byte(`{"version":2}`), 90); err == nil {
		t.Fatal("a snapshot of another version restored")
	}
}

// TestInterruptedRestoreIsFinished: a restore that wrote topics.json but
// died before rebasing the partitions is finished by the next start, so new
// records never reuse offsets the bucket already holds.
func TestInterruptedRestoreIsFinished(t *testing.T) {
	store := tiering.NewMemStore()
	ts := startTiered(t, t.TempDir(), tiering.New(store, nil, 8<<20))
	pr, adm := client(t, ts.addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "r"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := pr.ProduceSync(ctx, &kgo.Record{Topic: "r", Value: []byte{byte(i)}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	ts.stop(t) // offloads everything
	// The interrupted restore: its marker and topics.json back, nothing else.
	dir := t.TempDir()
	b, err := store.GetRange(ctx, metaKey, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, restorePending), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, topicsFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ts2 := startTiered(t, dir, tiering.New(store, nil, 8<<20))
	pr2, _ := client(t, ts2.addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	res := pr2.ProduceSync(ctx, &kgo.Record{Topic: "r", Value: []byte("new")})
	if r, err := res.First(); err != nil || r.Offset != 10 {
		t.Fatalf("first record after an interrupted restore at %d (%v), want 10", r.Offset, err)
	}
	if _, err := os.Stat(filepath.Join(dir, restorePending)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("restore marker still there once the restore finished: %v", err)
	}
}

// TestRestartWithTheBucketAway: a broker with an empty partition (a topic
// never written to) restarts while the bucket is unreachable; only a
// restore in progress needs the bucket to start.
func TestRestartWithTheBucketAway(t *testing.T) {
	ts2 := restartWithTheBucketAway(t, 2, nil, "empty")
	ctx := ctxT(t)
	pr, _ := client(t, ts2.addr)
	if err := pr.ProduceSync(ctx, &kgo.Record{Topic: "empty", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatalf("produce after a restart with the bucket away: %v", err)
	}
}

// TestGroupRestoreAfterInterruptedRestore: a restore of the group log cut
// short (its temporary directory left behind, no group log) is redone from
// the bucket on the next start.
func TestGroupRestoreAfterInterruptedRestore(t *testing.T) {
	store := tiering.NewMemStore()
	ts := startTiered(t, t.TempDir(), tiering.New(store, nil, 8<<20))
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "gt"); err != nil {
		t.Fatal(err)
	}
	var commit kadm.Offsets
	commit.Add(kadm.Offset{Topic: "gt", Partition: 0, At: 5, LeaderEpoch: -1})
	if err := adm.CommitAllOffsets(ctx, "g", commit); err != nil {
		t.Fatal(err)
	}
	ts.stop(t) // mirrors the group state

	dir := t.TempDir()
	partial := filepath.Join(dir, groupsDir+".restore")
	if err := os.MkdirAll(partial, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(partial, "00000000000000000000.log"), []byte("torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	ts2 := startTiered(t, dir, tiering.New(store, nil, 8<<20))
	_, adm2 := client(t, ts2.addr)
	offs, err := adm2.FetchOffsets(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := offs.Lookup("gt", 0); o.At != 5 {
		t.Fatalf("restored offset %+v, want 5", o)
	}
	if _, err := os.Stat(partial); !os.IsNotExist(err) {
		t.Fatalf("the interrupted restore's directory is still there: %v", err)
	}
}

// TestSealedSegmentUploadedAtOnce: a sealed segment is uploaded without
// waiting for the next maintenance tick (an hour here).
func TestSealedSegmentUploadedAtOnce(t *testing.T) {
	ts := startServerConfig(t, Config{DataDir: t.TempDir(), AutoCreateTopics: true, Tier: tiering.New(tiering.NewMemStore(), nil, 8<<20), MaintenanceInterval: time.Hour})
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"segment.bytes": kstr("20000")}, "kick"); err != nil {
		t.Fatal(err)
	}
	pr, _ := client(t, ts.addr, kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()))
	for i := 0; i < 10; i++ {
		if err := pr.ProduceSync(ctx, &kgo.Record{Topic: "kick", Value: bytes.Repeat([]byte{1}, 5000)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, _ := ts.TierStatus(ctx); st.UploadedSegments > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a sealed segment waited for the maintenance tick")
		}
	}
}

// TestTailTrafficReachesTheGuard: small acks=all produce requests and
// fetches woken at the end of a partition are timed for the tail guard;
// large produce requests are not.
func TestTailTrafficReachesTheGuard(t *testing.T) {
	tier := tiering.New(tiering.NewMemStore(), nil, 8<<20)
	ts := startTiered(t, t.TempDir(), tier)
	ctx := ctxT(t)
	pr, adm := client(t, ts.addr, kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "tail"); err != nil {
		t.Fatal(err)
	}
	if err := pr.ProduceSync(ctx, &kgo.Record{Topic: "tail", Value: bytes.Repeat([]byte{7}, 200<<10)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if n := tier.Stats().TailSamples; n != 0 {
		t.Fatalf("a 200 KiB produce was timed as tail traffic (%d samples)", n)
	}
	cons, _ := client(t, ts.addr, kgo.ConsumeTopics("tail"), kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(5*time.Second))
	got := make(chan int, 1)
	go func() {
		n := 0
		for n < 5 && ctx.Err() == nil {
			cons.PollFetches(ctx).EachRecord(func(*kgo.Record) { n++ })
		}
		got <- n
	}()
	time.Sleep(300 * time.Millisecond) // the consumer waits at the end
	for i := 0; i < 5; i++ {
		if err := pr.ProduceSync(ctx, &kgo.Record{Topic: "tail", Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := <-got; n != 5 {
		t.Fatalf("consumed %d", n)
	}
	// 5 produce samples, and at least one fetch woken by an append.
	if n := tier.Stats().TailSamples; n < 6 {
		t.Fatalf("%d tail samples, want at least 6", n)
	}
}

// TestTailGuardPacesColdServing: while the tail guard has lowered the
// cold-read rate (driven here by late tail samples right after cold
// downloads), cold data is handed out at about that rate even from the
// cache, and a tail partition in the same fetch is answered at once.
func TestTailGuardPacesColdServing(t *testing.T) {
	tier := tiering.New(tiering.NewMemStore(), nil, 64<<20)
	ts := startTiered(t, t.TempDir(), tier)
	ctx := ctxT(t)
	pr, adm := client(t, ts.addr, kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(256<<10))
	cfg := map[string]*string{"segment.bytes": kstr(fmt.Sprint(1 << 20)), "local.retention.bytes": kstr("0"), "retention.ms": kstr("-1")}
	if _, err := adm.CreateTopic(ctx, 1, 1, cfg, "cold"); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "tail"); err != nil {
		t.Fatal(err)
	}
	v := make([]byte, 16<<10)
	const total = 24 << 20
	for n := 0; n < total; n += len(v) {
		rand.Read(v)
		pr.Produce(ctx, &kgo.Record{Topic: "cold", Value: append([]byte(nil), v...)}, nil)
	}
	if err := pr.ProduceSync(ctx, &kgo.Record{Topic: "tail", Value: []byte("tail")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := pr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p0 := ts.reg.partition(ts.reg.get("cold"), 0)
	waitUntil(t, 30*time.Second, func() bool { return p0.log.LocalStartOffset() > p0.log.HighWatermark()*9/10 })

	// fetchFor fetches "cold" from its start and "tail" from 0 for d, and
	// returns the cold bytes received; every response must carry the tail
	// record.
	fetchFor := func(d time.Duration) int64 {
		var got, offset int64
		for start := time.Now(); time.Since(start) < d && offset < p0.log.LocalStartOffset(); {
			req := kmsg.NewPtrFetchRequest()
			req.Version = 12
			req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 100, 1, 32<<20
			for _, tp := range []struct {
				topic string
				off   int64
			}{{"cold", offset}, {"tail", 0}} {
				rt := kmsg.NewFetchRequestTopic()
				rt.Topic, rt.TopicID = tp.topic, ts.reg.get(tp.topic).id // kgo may send v13+: by id
				rp := kmsg.NewFetchRequestTopicPartition()
				rp.FetchOffset, rp.PartitionMaxBytes = tp.off, 32<<20
				rp.CurrentLeaderEpoch, rp.LogStartOffset = -1, -1
				rt.Partitions = append(rt.Partitions, rp)
				req.Topics = append(req.Topics, rt)
			}
			resp, err := req.RequestWith(ctx, pr)
			if err != nil {
				t.Fatal(err)
			}
			for i, rt := range resp.Topics {
				p := rt.Partitions[0]
				if p.ErrorCode != 0 {
					t.Fatalf("%s: error %d", req.Topics[i].Topic, p.ErrorCode)
				}
				if i == 1 { // "tail"
					if len(p.RecordBatches) == 0 {
						t.Fatal("a fetch came back without its tail partition's record")
					}
					continue
				}
				for bs := p.RecordBatches; len(bs) >= 61; {
					n := 12 + int64(int32(binary.BigEndian.Uint32(bs[8:])))
					offset = int64(binary.BigEndian.Uint64(bs)) + int64(int32(binary.BigEndian.Uint32(bs[23:]))) + 1
					got += n
					bs = bs[n:]
				}
			}
		}
		return got
	}

	// A quiet tail first (the guard's reference), then everything cold is
	// read once, unpaced: downloaded into the cache.
	for range 300 {
		tier.ObserveTail(tiering.TailProduce, 400*time.Microsecond)
		time.Sleep(300 * time.Microsecond)
	}
	if got := fetchFor(20 * time.Second); got < total*9/10 {
		t.Fatalf("read %d of %d cold bytes unpaced", got, total)
	}
	// Right after those downloads the tail runs late: the guard lowers the
	// rate, and late samples keep it down.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			tier.ObserveTail(tiering.TailProduce, time.Second)
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	waitUntil(t, 5*time.Second, func() bool { return tier.Stats().ColdRate > 0 })
	rate := tier.Stats().ColdRate
	// Now the same read, all from the cache, gets about rate bytes a
	// second (plus a first burst and one response ahead of the rate).
	got := fetchFor(time.Second)
	if limit := rate + 3<<20; got == 0 || got > limit {
		t.Fatalf("read %d cold bytes in 1 s from the cache at a lowered rate of %d B/s, want 1..%d", got, rate, limit)
	}
}

// TestTopicsMirrorNeverStallsRequests: while the bucket hangs on the copy of
// topics.json, creating topics and producing to and looking up existing
// ones go on at once (the copy is not made under the registry's lock); a
// copy that failed is made by a later maintenance pass once the bucket
// answers again, so a restore would see every topic.
func TestTopicsMirrorNeverStallsRequests(t *testing.T) {
	store := tiering.NewMemStore()
	var hang atomic.Bool
	store.SetFault(func(op, key string) error {
		if op == "put" && key == metaKey && hang.Load() {
			time.Sleep(3 * time.Second)
			return errors.New("timeout")
		}
		return nil
	})
	ts := startTiered(t, t.TempDir(), tiering.New(store, nil, 8<<20))
	cl, adm := client(t, ts.addr)
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "before"); err != nil {
		t.Fatal(err)
	}
	hang.Store(true)
	start := time.Now()
	for _, name := range []string{"during1", "during2"} {
		if _, err := adm.CreateTopic(ctx, 1, 1, nil, name); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "before", Value: []byte(name)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := adm.ListTopics(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("two CreateTopics and produces took %v behind a hanging bucket", took)
	}
	// The failed copy counts as a store error (once the hanging Put gives up).
	waitUntil(t, 10*time.Second, func() bool { st, _ := ts.TierStatus(ctx); return st.Errors > 0 })
	hang.Store(false)
	waitUntil(t, 20*time.Second, func() bool {
		b, err := store.GetRange(ctx, metaKey, 0, -1)
		return err == nil && bytes.Contains(b, []byte(`"during2"`)) && bytes.Contains(b, []byte(`"during1"`))
	})
}

// TestDiskBudgetReleasesUploadedSegments: with default topic configs
// (local.retention.* keeps data for days) and a healthy bucket, the local
// disk budget deletes local copies of uploaded segments, oldest first
// across partitions, instead of refusing produce; everything stays
// readable from offset 0.
func TestDiskBudgetReleasesUploadedSegments(t *testing.T) {
	store := tiering.NewMemStore()
	const budget = 150_000
	ts := startServerConfig(t, Config{Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 20 * time.Millisecond,
		LocalDiskBudget: budget})
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	for _, name := range []string{"old", "new"} {
		if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"segment.bytes": kstr("20000")}, name); err != nil {
			t.Fatal(err)
		}
	}
	pr, _ := client(t, ts.addr, kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RecordRetries(1))
	produce := func(topic string, n int) {
		for i := 0; i < n; i++ {
			r := &kgo.Record{Topic: topic, Value: bytes.Repeat([]byte{byte(i), 7, byte(i >> 3)}, 400)}
			if err := pr.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("%s record %d refused: %v", topic, i, err)
			}
			time.Sleep(time.Millisecond) // let maintenance keep up
		}
	}
	produce("old", 150) // ~180 KB: over the budget on its own
	produce("new", 150)
	pOld := ts.reg.partition(ts.reg.get("old"), 0)
	pNew := ts.reg.partition(ts.reg.get("new"), 0)
	waitUntil(t, 10*time.Second, func() bool { return pOld.log.LocalBytes()+pNew.log.LocalBytes() <= budget })
	if pOld.log.LocalStartOffset() == 0 {
		t.Fatal("the older topic kept all its local segments")
	}
	if pOld.log.LocalBytes() > pNew.log.LocalBytes() {
		t.Fatalf("older topic has %d local bytes, newer %d: the newer was released first", pOld.log.LocalBytes(), pNew.log.LocalBytes())
	}
	if ts.overDisk.Load() {
		t.Fatal("produce still refused with the bucket healthy")
	}
	if got := consumeAll(t, ts.addr, "old", 150); len(got) != 150 {
		t.Fatalf("read back %d of 150 records", len(got))
	}
}

// TestRemoteStorageEnableFollowsTheBroker: DescribeConfigs reports
// remote.storage.enable as the broker tiers (true with a tiered store, false
// without), and a topic config that contradicts it is refused with
// INVALID_CONFIG at create and at alter.
func TestRemoteStorageEnableFollowsTheBroker(t *testing.T) {
	for _, tiered := range []bool{true, false} {
		cfg := Config{}
		if tiered {
			cfg.Tier = tiering.New(tiering.NewMemStore(), nil, 8<<20)
		}
		ts := startServerConfig(t, cfg)
		_, adm := client(t, ts.addr)
		ctx := ctxT(t)
		if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"local.retention.ms": kstr("60000")}, "t"); err != nil {
			t.Fatal(err)
		}
		rcs, err := adm.DescribeTopicConfigs(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		rc, err := rcs.On("t", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, c := range rc.Configs {
			got[c.Key] = c.MaybeValue()
		}
		want := fmt.Sprint(tiered)
		if got["remote.storage.enable"] != want || got["local.retention.ms"] != "60000" || got["local.retention.bytes"] != "-2" {
			t.Fatalf("tiered %v: remote.storage.enable %q, local.retention.ms %q, local.retention.bytes %q", tiered,
				got["remote.storage.enable"], got["local.retention.ms"], got["local.retention.bytes"])
		}
		other := fmt.Sprint(!tiered)
		resp, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"remote.storage.enable": kstr(other)}, "contradicts")
		if !errors.Is(err, kerr.InvalidConfig) && !errors.Is(resp.Err, kerr.InvalidConfig) {
			t.Fatalf("tiered %v: create with remote.storage.enable=%s: %v / %v", tiered, other, err, resp.Err)
		}
		if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"remote.storage.enable": kstr(want)}, "agrees"); err != nil {
			t.Fatalf("tiered %v: create with remote.storage.enable=%s: %v", tiered, want, err)
		}
		ar, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "remote.storage.enable", Value: kstr(other)}}, "t")
		if err == nil {
			err = ar[0].Err
		}
		if !errors.Is(err, kerr.InvalidConfig) {
			t.Fatalf("tiered %v: alter remote.storage.enable=%s: %v", tiered, other, err)
		}
		// A topic stored with the contradicting value before the broker
		// checked it: its other configs can still be altered, and the
		// broker's truth is what DescribeConfigs shows.
		if err := ts.reg.setConfigs(ts.reg.get("t"), map[string]string{"remote.storage.enable": other}); err != nil {
			t.Fatal(err)
		}
		ar, err = adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: kstr("1000000")}}, "t")
		if err == nil {
			err = ar[0].Err
		}
		if err != nil {
			t.Fatalf("tiered %v: alter retention.ms of a topic stored with remote.storage.enable=%s: %v", tiered, other, err)
		}
		rcs, err = adm.DescribeTopicConfigs(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		rc, _ = rcs.On("t", nil)
		for _, c := range rc.Configs {
			if c.Key == "remote.storage.enable" && c.MaybeValue() != want {
				t.Fatalf("tiered %v: stored %s described as %q", tiered, other, c.MaybeValue())
			}
		}
	}
}

// TestOrphansSweptWhileRunning: an object in a partition's directory that
// no manifest names (an upload cut short, a failed delete) is removed by
// the periodic sweep between maintenance passes, not only at start-up;
// what the manifest names stays.
func TestOrphansSweptWhileRunning(t *testing.T) {
	store := tiering.NewMemStore()
	sweepingBroker(t, store, "swept")
	ctx := ctxT(t)
	var logs []string
	waitUntil(t, 10*time.Second, func() bool {
		keys, _ := store.List(ctx, "")
		logs = logs[:0]
		for _, k := range keys {
			if strings.HasSuffix(k, ".log") {
				logs = append(logs, k)
			}
		}
		return len(logs) >= 2
	})
	orphan := logs[0][:strings.LastIndexByte(logs[0], '/')+1] + "00000000000999999999.log"
	if err := store.Put(ctx, orphan, bytes.NewReader([]byte("cut short")), 9); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, func() bool {
		_, err := store.GetRange(ctx, orphan, 0, -1)
		return errors.Is(err, tiering.ErrNotFound)
	})
	for _, k := range logs {
		if _, err := store.GetRange(ctx, k, 0, 1); err != nil {
			t.Fatalf("uploaded segment %s gone: %v", k, err)
		}
	}
}

// TestLocalRetentionBrokerDefault: the broker default of local.retention.*
// (--local-retention-bytes) applies to topics that do not set their own:
// with 0, uploaded segments leave the local disk at once; a topic setting
// -1 keeps them. DescribeConfigs shows the default as a static broker
// config, with its log.local.retention.bytes synonym.
func TestLocalRetentionBrokerDefault(t *testing.T) {
	store := tiering.NewMemStore()
	ts := startServerConfig(t, Config{Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 20 * time.Millisecond,
		LocalRetention: &LocalRetention{Bytes: 0, Ms: -2}})
	_, adm := client(t, ts.addr)
	cl, _ := client(t, ts.addr, kgo.ProducerBatchCompression(kgo.NoCompression()))
	ctx := ctxT(t)
	seg := map[string]*string{"segment.bytes": kstr("5000")}
	if _, err := adm.CreateTopic(ctx, 1, 1, seg, "bydefault"); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"segment.bytes": kstr("5000"), "local.retention.bytes": kstr("-1")}, "keeps"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		for _, topic := range []string{"bydefault", "keeps"} {
			produceFiller(t, cl, topic, 1)
		}
	}
	pDef := ts.reg.partition(ts.reg.get("bydefault"), 0)
	pKeep := ts.reg.partition(ts.reg.get("keeps"), 0)
	waitUntil(t, 10*time.Second, func() bool { return pDef.log.LocalStartOffset() > 0 && len(pDef.log.SealedSegments()) == 0 })
	if st, _ := ts.TierStatus(ctx); st.LagSegments != 0 {
		t.Fatalf("upload lag %d segments", st.LagSegments)
	}
	if pKeep.log.LocalStartOffset() != 0 {
		t.Fatalf("the topic with local.retention.bytes=-1 released local data (local start %d)", pKeep.log.LocalStartOffset())
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	req.IncludeSynonyms = true
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType, rr.ResourceName, rr.ConfigNames = kmsg.ConfigResourceTypeTopic, "bydefault", []string{"local.retention.bytes"}
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	c := resp.Resources[0].Configs[0]
	if c.Value == nil || *c.Value != "0" || c.Source != kmsg.ConfigSourceStaticBrokerConfig || c.IsDefault ||
		len(c.ConfigSynonyms) == 0 || c.ConfigSynonyms[0].Name != "log.local.retention.bytes" {
		t.Fatalf("local.retention.bytes described as %+v", c)
	}
}

// TestUploadLagWithTheBucketAwayFromTheStart: when no manifest could be
// read since the start (a restart with the bucket away), every sealed
// segment counts as upload lag instead of none.
func TestUploadLagWithTheBucketAwayFromTheStart(t *testing.T) {
	ts := restartWithTheBucketAway(t, 1, map[string]*string{"segment.bytes": kstr("5000")}, "lagging")
	ctx := ctxT(t)
	cl, _ := client(t, ts.addr, kgo.ProducerBatchCompression(kgo.NoCompression()))
	produceFiller(t, cl, "lagging", 20)
	sealed := len(ts.reg.partition(ts.reg.get("lagging"), 0).log.SealedSegments())
	st, _ := ts.TierStatus(ctx)
	if sealed < 2 || st.LagSegments != int64(sealed) {
		t.Fatalf("%d sealed segments, upload lag %d segments", sealed, st.LagSegments)
	}
}

// TestDeletedTopicObjectsGoEvenAfterAnOutage: a tiered topic deleted while
// the bucket is away keeps its objects there for now (and topics.json in
// the bucket still names it); once the bucket is back, the sweep copies
// topics.json without the topic, then deletes the topic's objects.
func TestDeletedTopicObjectsGoEvenAfterAnOutage(t *testing.T) {
	ts, store, adm, objects := sweptTopicInTheBucket(t, "doomed")
	ctx := ctxT(t)
	var away atomic.Bool
	store.SetFault(func(op, key string) error {
		if away.Load() && op != "list" { // the test still looks
			return errors.New("connection refused")
		}
		return nil
	})
	away.Store(true)
	if _, err := adm.DeleteTopics(ctx, "doomed"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a few sweeps fail
	if objects() == 0 {
		t.Fatal("objects deleted while the bucket was away?")
	}
	away.Store(false)
	waitUntil(t, 10*time.Second, func() bool { return objects() == 0 })
	b, err := store.GetRange(ctx, metaKey, 0, -1)
	if err != nil || bytes.Contains(b, []byte(`"doomed"`)) {
		t.Fatalf("topics.json in the bucket after the delete: %s, %v", b, err)
	}
	waitUntil(t, 5*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(ts.cfg.DataDir, forgetFile))
		return err == nil && string(b) == "[]"
	})
}

// TestGroupMirrorAfterRestart: a group-state mirror that failed before a
// restart is written by the restarted broker's first pass, though no group
// changes after it (it stayed stale until one did).
func TestGroupMirrorAfterRestart(t *testing.T) {
	store := tiering.NewMemStore()
	var failing atomic.Bool
	failing.Store(true)
	store.SetFault(func(op, key string) error {
		if op == "put" && key == groupsKey && failing.Load() {
			return errors.New("injected: bucket refuses")
		}
		return nil
	})
	dir := t.TempDir()
	ts := startTiered(t, dir, tiering.New(store, nil, 8<<20))
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "gm"); err != nil {
		t.Fatal(err)
	}
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: "gm", Partition: 0, At: 7, LeaderEpoch: -1})
	if r, err := adm.CommitOffsets(ctx, "mirrored-group", offs); err != nil || r.Error() != nil {
		t.Fatal(err, r.Error())
	}
	ts.stop(t) // its last mirrors fail too
	failing.Store(false)
	startTiered(t, dir, tiering.New(store, nil, 8<<20))
	waitUntil(t, 10*time.Second, func() bool {
		b, err := store.GetRange(ctx, groupsKey, 0, -1)
		return err == nil && bytes.Contains(b, []byte("mirrored-group"))
	})
}

// TestUnreadableForgetFileIsKeptAside: a tier-forget.json that does not
// decode is moved aside (what it lists is swept by nothing else), not
// overwritten by the next edit.
func TestUnreadableForgetFileIsKeptAside(t *testing.T) {
	store := tiering.NewMemStore()
	ts := sweepingBroker(t, store, "any")
	garbage := []byte(`[{"topic":"x","topic_id":`)
	if err := os.WriteFile(filepath.Join(ts.cfg.DataDir, forgetFile), garbage, 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, func() bool {
		m, _ := filepath.Glob(filepath.Join(ts.cfg.DataDir, forgetFile+".unreadable-*"))
		if len(m) != 1 {
			return false
		}
		b, err := os.ReadFile(m[0])
		return err == nil && bytes.Equal(b, garbage)
	})
}

// TestDeleteDuringAnUploadLeavesNothing: a topic deleted while an upload of
// one of its segments is under way loses every object once that upload
// ends; the deletion used to run at once, beside the upload, which then put
// back its segment and a manifest naming deleted objects, for good.
func TestDeleteDuringAnUploadLeavesNothing(t *testing.T) {
	store := tiering.NewMemStore()
	release := make(chan struct{})
	var blocked atomic.Bool
	store.SetFault(func(op, key string) error {
		if op == "put" && strings.HasPrefix(key, "mid-") && strings.HasSuffix(key, ".log") && blocked.CompareAndSwap(false, true) {
			<-release // this upload hangs until the topic is deleted
		}
		return nil
	})
	ts := startServerConfig(t, Config{Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 20 * time.Millisecond,
		OrphanSweepInterval: time.Hour})
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	smallSegments(t, ts, "mid")
	waitUntil(t, 10*time.Second, blocked.Load)
	if _, err := adm.DeleteTopics(ctx, "mid"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // an immediate deletion would run now
	close(release)
	objects := func() int {
		keys, _ := store.List(ctx, "mid-")
		return len(keys)
	}
	waitUntil(t, 10*time.Second, func() bool { return objects() == 0 })
	time.Sleep(200 * time.Millisecond) // more passes: nothing comes back
	if n := objects(); n != 0 {
		t.Fatalf("%d objects of the deleted topic back in the bucket", n)
	}
}

// TestForgetEntriesOfLiveTopics: an entry in tier-forget.json for a topic
// that exists (a DeleteTopics between recording and removing it, or one
// that crashed there) deletes nothing and stays while the broker runs; the
// next start drops it.
func TestForgetEntriesOfLiveTopics(t *testing.T) {
	store := tiering.NewMemStore()
	dir := t.TempDir()
	ts := startTiered(t, dir, tiering.New(store, nil, 8<<20))
	ctx := ctxT(t)
	smallSegments(t, ts, "live")
	objects := func() int {
		keys, _ := store.List(ctx, "live-")
		return len(keys)
	}
	waitUntil(t, 10*time.Second, func() bool { return objects() >= 4 })
	parts := ts.reg.partitionsOf(ts.reg.get("live"))
	ts.recordForgets(parts, false)
	n := objects()
	ts.forgetPending()
	if got := objects(); got < n {
		t.Fatalf("%d objects of a live topic deleted", n-got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, forgetFile)); !bytes.Contains(b, []byte(`"live"`)) {
		t.Fatalf("the entry went while the broker runs: %s", b)
	}
	ts.stop(t)
	startTiered(t, dir, tiering.New(store, nil, 8<<20))
	if b, _ := os.ReadFile(filepath.Join(dir, forgetFile)); bytes.Contains(b, []byte(`"live"`)) {
		t.Fatalf("the entry of a live topic is still there after a start: %s", b)
	}
}

// TestCreateWhileDeleting: a topic whose predecessor of the same name is
// still having its files deleted is not created over them (they share
// directories); asked again once the delete is done, it is.
func TestCreateWhileDeleting(t *testing.T) {
	ts := startServerConfig(t, Config{})
	ts.reg.mu.Lock()
	ts.reg.deleting = map[string]bool{"again": true}
	ts.reg.mu.Unlock()
	if _, err := ts.reg.create("again", 1, nil, false); !errors.Is(err, errTopicDeleting) {
		t.Fatalf("create during the delete: %v", err)
	}
	ts.reg.mu.Lock()
	delete(ts.reg.deleting, "again")
	ts.reg.mu.Unlock()
	if _, err := ts.reg.create("again", 1, nil, false); err != nil {
		t.Fatal(err)
	}
}

// TestFailedDeleteKeepsTheBucketObjects: a DeleteTopics whose topics.json
// save fails leaves the topic in place, in memory as on disk, so the
// sweeps that retry deleted topics' objects leave its objects alone (the
// topic was gone from memory only, and its bucket data with it).
func TestFailedDeleteKeepsTheBucketObjects(t *testing.T) {
	ts, _, adm, objects := sweptTopicInTheBucket(t, "kept")
	ctx := ctxT(t)
	// topics.json cannot be replaced while a directory has its name.
	path := filepath.Join(ts.cfg.DataDir, topicsFile)
	saved, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "in-the-way"), 0o755); err != nil {
		t.Fatal(err)
	}
	resp, err := adm.DeleteTopics(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	if r := resp["kept"]; r.Err == nil {
		t.Fatal("delete answered without error though topics.json could not be saved")
	}
	// Growing it or changing its configs fails the same way and leaves
	// it as topics.json has it.
	if r, err := adm.CreatePartitions(ctx, 2, "kept"); err != nil || r["kept"].Err == nil {
		t.Fatalf("CreatePartitions without a topics.json save: %v %v", err, r["kept"].Err)
	}
	if n := len(ts.reg.partitionsOf(ts.reg.get("kept"))); n != 1 {
		t.Fatalf("%d partitions in memory after a failed CreatePartitions", n)
	}
	if _, err := os.Stat(partitionDir(ts.cfg.DataDir, "kept", 1)); err == nil {
		t.Fatal("the failed CreatePartitions left a partition directory")
	}
	if r, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "retention.ms", Value: kstr("1234")}}, "kept"); err == nil && r[0].Err == nil {
		t.Fatal("AlterConfigs without a topics.json save succeeded")
	}
	if v := ts.reg.configsOf(ts.reg.get("kept"))["retention.ms"]; v == "1234" {
		t.Fatal("configs changed in memory after a failed AlterConfigs")
	}
	n := objects()
	time.Sleep(500 * time.Millisecond) // several sweeps
	if ts.reg.get("kept") == nil {
		t.Fatal("topic gone from memory, still in topics.json")
	}
	if got := objects(); got < n {
		t.Fatalf("%d of the topic's %d objects deleted from the bucket", n-got, n)
	}
	os.RemoveAll(path)
	if err := os.WriteFile(path, saved, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDiskReserveKeepsTheDiskFromFilling: with no byte budget, the free
// space reserve still protects the file system: while the bucket is away,
// produce is refused (retriable) once free space falls below the reserve;
// when the bucket is back, uploaded local copies are released and produce
// is accepted again. The file system is simulated: 1 MB, less what the
// partitions hold.
func TestDiskReserveKeepsTheDiskFromFilling(t *testing.T) {
	store, away := storeThatGoesAway()
	var srv atomic.Pointer[Server]
	const size = 1_000_000
	diskFree := func(string) (int64, int64, bool) {
		s := srv.Load()
		if s == nil {
			return size, size, true
		}
		return size - s.localBytes(), size, true
	}
	ts := startServerConfig(t, Config{Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 20 * time.Millisecond,
		LocalDiskReservePercent: 70, DiskFree: diskFree}) // at most ~300 KB local
	srv.Store(ts.Server)
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"segment.bytes": kstr("20000")}, "full"); err != nil {
		t.Fatal(err)
	}
	away.Store(true)
	acked, refused := produceUntilRefused(t, ts.addr, "full", 2000, time.Millisecond,
		func(i int) []byte { return bytes.Repeat([]byte{byte(i), 3}, 400) })
	if !refused {
		t.Fatal("produce never refused below the free-space reserve while the bucket was away")
	}
	away.Store(false)
	acceptedAgainNothingLost(t, ts.addr, "full", acked)
}

// produceFiller produces n records of 900 bytes to topic, one at a time
// (acks=all), so small segments roll.
func produceFiller(t *testing.T, cl *kgo.Client, topic string, n int) {
	t.Helper()
	ctx := ctxT(t)
	for i := 0; i < n; i++ {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: bytes.Repeat([]byte{byte(i)}, 900)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// restartWithTheBucketAway starts a tiered broker, creates topic with
// partitions and cfg, stops it, and starts it again on the same data
// directory with every bucket operation failing.
func restartWithTheBucketAway(t *testing.T, partitions int32, cfg map[string]*string, topic string) *testServer {
	t.Helper()
	store := tiering.NewMemStore()
	dir := t.TempDir()
	ts := startTiered(t, dir, tiering.New(store, nil, 8<<20))
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctxT(t), partitions, 1, cfg, topic); err != nil {
		t.Fatal(err)
	}
	ts.stop(t)
	store.SetFault(func(op, key string) error { return errors.New("connection refused") })
	return startTiered(t, dir, tiering.New(store, nil, 8<<20))
}

// sweepingBroker starts a tiered broker on store sweeping orphans every
// 100 ms, with topic (one partition, 5000-byte segments) holding 20
// records of 900 bytes: a few sealed segments.
func sweepingBroker(t *testing.T, store *tiering.MemStore, topic string) *testServer {
	t.Helper()
	ts := startServerConfig(t, Config{Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 20 * time.Millisecond,
		OrphanSweepInterval: 100 * time.Millisecond})
	smallSegments(t, ts, topic)
	return ts
}

// smallSegments creates topic (one partition of 5000-byte segments) on ts
// and fills it with 20 records of 900 bytes: several sealed segments.
func smallSegments(t *testing.T, ts *testServer, topic string) {
	t.Helper()
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctxT(t), 1, 1, map[string]*string{"segment.bytes": kstr("5000")}, topic); err != nil {
		t.Fatal(err)
	}
	cl, _ := client(t, ts.addr, kgo.ProducerBatchCompression(kgo.NoCompression()))
	produceFiller(t, cl, topic, 20)
}

// sweptTopicInTheBucket starts a sweepingBroker with topic and waits until
// the bucket holds some of its objects; objects counts them.
func sweptTopicInTheBucket(t *testing.T, topic string) (*testServer, *tiering.MemStore, *kadm.Client, func() int) {
	t.Helper()
	store := tiering.NewMemStore()
	ts := sweepingBroker(t, store, topic)
	_, adm := client(t, ts.addr)
	objects := func() int {
		keys, _ := store.List(context.Background(), topic)
		return len(keys)
	}
	waitUntil(t, 10*time.Second, func() bool { return objects() >= 4 })
	return ts, store, adm, objects
}

// storeThatGoesAway returns a memory store whose every operation fails
// (connection refused) while the returned flag is set.
func storeThatGoesAway() (*tiering.MemStore, *atomic.Bool) {
	store := tiering.NewMemStore()
	away := new(atomic.Bool)
	store.SetFault(func(op, key string) error {
		if away.Load() {
			return errors.New("connection refused")
		}
		return nil
	})
	return store, away
}

// TestRestoreKeepsTheLeaderEpochGrowing: a broker restored into an empty
// data directory starts above the epochs of the broker it replaces (which
// restarted several times): above the bucket's copy of meta.json, and,
// with no copy (an older bucket), above the epochs its consumers committed
// with. OffsetForLeaderEpoch for the committed epoch answers an end at or
// past the committed offset (no false truncation), and an epoch above the
// broker's is answered with the log end, not UNDEFINED.
func TestRestoreKeepsTheLeaderEpochGrowing(t *testing.T) {
	for _, mirrored := range []bool{true, false} {
		t.Run(fmt.Sprintf("mirrored=%v", mirrored), func(t *testing.T) {
			store := tiering.NewMemStore()
			dir := t.TempDir()
			ctx := ctxT(t)
			ts := startTiered(t, dir, tiering.New(store, nil, 8<<20))
			_, adm := client(t, ts.addr)
			if _, err := adm.CreateTopic(ctx, 1, 1, nil, "ep"); err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				if i > 0 {
					ts.stop(t)
					ts = startTiered(t, dir, tiering.New(store, nil, 8<<20))
				}
				cl, _ := client(t, ts.addr, kgo.DefaultProduceTopic("ep"))
				for range 2 {
					if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
						t.Fatal(err)
					}
				}
				cl.Close()
			}
			old := ts.meta.m.LeaderEpoch
			if old < 3 {
				t.Fatalf("epoch %d after 3 restarts", old)
			}
			_, adm = client(t, ts.addr)
			var commit kadm.Offsets
			commit.Add(kadm.Offset{Topic: "ep", Partition: 0, At: 8, LeaderEpoch: old})
			if err := adm.CommitAllOffsets(ctx, "g", commit); err != nil {
				t.Fatal(err)
			}
			ts.stop(t) // offloads the segments and mirrors topics.json, meta.json and the groups
			if _, err := store.GetRange(ctx, metaMirrorKey, 0, -1); err != nil {
				t.Fatalf("meta.json not mirrored: %v", err)
			}
			if !mirrored {
				if err := store.Delete(ctx, metaMirrorKey); err != nil {
					t.Fatal(err)
				}
			}

			ts = startTiered(t, t.TempDir(), tiering.New(store, nil, 8<<20))
			cur := ts.meta.m.LeaderEpoch
			if cur <= old {
				t.Fatalf("restored at leader epoch %d, not above the old broker's %d", cur, old)
			}
			_, adm = client(t, ts.addr)
			ask := func(epoch int32) kadm.OffsetForLeaderEpoch {
				t.Helper()
				var req kadm.OffsetForLeaderEpochRequest
				req.Add("ep", 0, epoch)
				res, err := adm.OffsetForLeaderEpoch(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				return res["ep"][0]
			}
			if r := ask(old); r.Err != nil || r.LeaderEpoch < 0 || r.EndOffset < 8 {
				t.Fatalf("epoch %d (the committed one): %+v, want an end >= 8", old, r)
			}
			if r := ask(cur + 50); r.Err != nil || r.LeaderEpoch != cur || r.EndOffset != 8 {
				t.Fatalf("epoch above the broker's: %+v, want epoch %d end 8", r, cur)
			}
			offs, err := adm.FetchOffsets(ctx, "g")
			if err != nil {
				t.Fatal(err)
			}
			if o, _ := offs.Lookup("ep", 0); o.At != 8 || o.LeaderEpoch != old {
				t.Fatalf("restored commit %+v", o)
			}
		})
	}
}
