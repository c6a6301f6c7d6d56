package tiering

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/log"
)

// fakePointer is the commit point a cluster keeps in etcd: the leader and
// its epoch, and the committed manifest's key with its token.
type fakePointer struct {
	mu     sync.Mutex
	leader int
	epoch  int32
	key    string
	token  int64
}

// fakeCommitter is one broker's view of fakePointer: believes is the epoch
// it thinks it leads at (-1: none), stale or not.
type fakeCommitter struct {
	p       *fakePointer
	id      int
	believe int32
}

func (c *fakeCommitter) Committed(PartitionKey) (string, int64, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	return c.p.key, c.p.token, nil
}

func (c *fakeCommitter) Latest(_ context.Context, pk PartitionKey) (string, int64, error) {
	return c.Committed(pk)
}

func (c *fakeCommitter) Epoch(PartitionKey) (int32, error) {
	if c.believe < 0 {
		return 0, ErrFenced
	}
	return c.believe, nil
}

func (c *fakeCommitter) Commit(_ context.Context, _ PartitionKey, key string, epoch int32, token int64) (int64, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if c.p.leader != c.id || c.p.epoch != epoch || c.p.token != token {
		return 0, fmt.Errorf("leader %d at %d, token %d: %w", c.p.leader, c.p.epoch, c.p.token, ErrFenced)
	}
	c.p.key = key
	c.p.token++
	return c.p.token, nil
}

func openReplica(t *testing.T, segBytes int64) *log.Partition {
	ls := log.OpenStore(log.Options{Logger: zaptest.NewLogger(t)})
	t.Cleanup(func() { ls.Close() })
	lp, err := ls.OpenPartition(filepath.Join(t.TempDir(), "t-0"), log.Config{SegmentBytes: segBytes, IndexIntervalBytes: 500, RetentionMs: -1})
	if err != nil {
		t.Fatal(err)
	}
	return lp
}

// TestFencedFailover: leader A uploads at epoch 1; the leadership moves
// to B at epoch 2 while A, paused, does not know. A's later uploads never
// become part of the log and never overwrite B's objects; B carries on
// from A's last commit although its own segments end elsewhere (the part
// of a straddling segment is uploaded alone); A's sweep deletes none of
// B's objects, B's deletes A's leftovers; every offset reads back from the
// bucket through B.
func TestFencedFailover(t *testing.T) {
	ctx := context.Background()
	store := NewMemStore()
	ptr := &fakePointer{leader: 1, epoch: 1}
	ca, cb := &fakeCommitter{p: ptr, id: 1, believe: 1}, &fakeCommitter{p: ptr, id: 2, believe: -1}
	ta, tb := New(store, zaptest.NewLogger(t), 1<<20), New(store, zaptest.NewLogger(t), 1<<20)
	ta.SetCommitter(ca)
	tb.SetCommitter(cb)
	pk := PartitionKey{Topic: "t", Partition: 0}
	// The same batches in both replicas, rolled at other places.
	la, lb := openReplica(t, 4000), openReplica(t, 3000)
	want := map[int64][]byte{}
	produce := func(n int, lps ...*log.Partition) {
		for i := 0; i < n; i++ {
			b := batch(300, time.Now().UnixMilli(), byte(len(want)))
			var base int64
			for j, lp := range lps {
				res, err := lp.Append(b)
				if err != nil {
					t.Fatal(err)
				}
				if err := lp.WaitDurable(res.LastOffset + 1); err != nil {
					t.Fatal(err)
				}
				if j > 0 && res.BaseOffset != base {
					t.Fatalf("replicas diverged: %d, %d", base, res.BaseOffset)
				}
				base = res.BaseOffset
			}
			want[base] = b
		}
	}
	produce(40, la, lb)
	if n, err := ta.UploadBelow(ctx, pk, la, la.HighWatermark()); err != nil || n == 0 {
		t.Fatalf("A's upload: %d, %v", n, err)
	}
	ma, _ := ta.Manifest(ctx, pk)
	if !strings.Contains(ptr.key, "manifest-e1-") || !ma.Segments[0].Fenced || ma.Segments[0].Epoch != 1 {
		t.Fatalf("A's commit: pointer %q, first segment %+v", ptr.key, ma.Segments[0])
	}
	// Uploads stop at the limit (the high watermark).
	if n, _ := ta.UploadBelow(ctx, pk, la, 0); n != 0 {
		t.Fatalf("upload below offset 0 committed %d segments", n)
	}

	// The failover: B leads at epoch 2; A does not know.
	ptr.mu.Lock()
	ptr.leader, ptr.epoch = 2, 2
	ptr.mu.Unlock()
	cb.believe = 2
	produce(40, la, lb) // A's are what a zombie would still hold; B's log goes on
	if _, err := ta.UploadBelow(ctx, pk, la, la.HighWatermark()); !errors.Is(err, ErrFenced) {
		t.Fatalf("zombie A's upload: %v, want ErrFenced", err)
	}
	if !strings.Contains(ptr.key, "manifest-e1-") {
		t.Fatalf("a zombie's commit landed: %q", ptr.key)
	}
	straddles := false
	for _, s := range lb.SealedSegments() {
		straddles = straddles || s.Base < ma.Next() && ma.Next() < s.Next
	}
	if !straddles {
		t.Fatalf("no segment of B straddles A's last upload's end %d: the test does not test the split", ma.Next())
	}
	n, err := tb.UploadBelow(ctx, pk, lb, lb.HighWatermark())
	if err != nil || n == 0 {
		t.Fatalf("B's upload: %d, %v", n, err)
	}
	mb, err := tb.Manifest(ctx, pk)
	if err != nil {
		t.Fatal(err)
	}
	if mb.Next() <= ma.Next() || mb.Epoch != 2 || !strings.Contains(ptr.key, "manifest-e2-") {
		t.Fatalf("B's manifest ends at %d (A's at %d), epoch %d, pointer %q", mb.Next(), ma.Next(), mb.Epoch, ptr.key)
	}
	for i, s := range mb.Segments {
		if i > 0 && s.Base != mb.Segments[i-1].Next {
			t.Fatalf("B's manifest is not contiguous at %d", i)
		}
	}
	// A's sweep (it still believes it leads at 1) spares epoch 2's objects.
	if _, err := ta.CleanOrphans(ctx, pk); err != nil {
		t.Fatal(err)
	}
	named := func(m *Manifest) []string {
		var keys []string
		for i := range m.Segments {
			keys = append(keys, pk.objectKey(&m.Segments[i], ".log"))
		}
		return keys
	}
	for _, k := range append(named(mb), ptr.key) {
		if _, err := store.GetRange(ctx, k, 0, 1); err != nil {
			t.Fatalf("%s after the zombie's sweep: %v", k, err)
		}
	}
	// B's sweep takes the zombie's leftovers (epoch 1, never committed).
	if _, err := tb.CleanOrphans(ctx, pk); err != nil {
		t.Fatal(err)
	}
	keys, _ := store.List(ctx, pk.dir()+"/")
	keep := map[string]bool{ptr.key: true}
	for i := range mb.Segments {
		for _, ext := range []string{".log", ".index", ".timeindex"} {
			keep[pk.objectKey(&mb.Segments[i], ext)] = true
		}
	}
	for _, k := range keys {
		if !keep[k] {
			t.Errorf("left after B's sweep: %s", k)
		}
	}
	// Every offset B's manifest covers reads back from the bucket.
	for off := int64(0); off < mb.Next(); {
		got, next, err := tb.Read(ctx, pk, off, 1<<20)
		if err != nil || next <= off {
			t.Fatalf("cold read at %d: %v (next %d)", off, err, next)
		}
		for len(got) > 0 {
			h, err := log.ParseBatchHeader(got)
			if err != nil {
				t.Fatal(err)
			}
			if h.NextOffset() <= off {
				t.Fatalf("read at %d returned batch %d, below it", off, h.BaseOffset)
			}
			if h.BaseOffset != off || string(got[:h.Length]) != string(want[off]) {
				t.Fatalf("batch at %d: got base %d (same bytes: %v)", off, h.BaseOffset, string(got[:h.Length]) == string(want[off]))
			}
			off = h.NextOffset()
			got = got[h.Length:]
		}
	}
	// With the commit point lost (a disaster), the newest readable
	// manifest is B's last commit, and epoch 2 the highest in the keys.
	if key, m, maxEpoch, ok, err := tb.LatestManifest(ctx, pk); err != nil || !ok || key != ptr.key || m.Next() != mb.Next() || maxEpoch != 2 {
		t.Fatalf("LatestManifest: %q (next %v), max epoch %d, %v, %v; want %q, %d, 2", key, m != nil && m.Next() == mb.Next(), maxEpoch, ok, err, ptr.key, mb.Next())
	}
	// A newer manifest whose last segment is not in the bucket (swept) is
	// passed over.
	bad := mb.clone()
	bad.Seq, bad.Epoch = 99, 2
	bad.Segments = append(bad.Segments, SegmentMeta{Base: mb.Next(), Next: mb.Next() + 5, Size: 10, Fenced: true, Epoch: 2})
	bb, _ := bad.encode()
	if err := store.Put(ctx, pk.fencedManifestKey(2, 99), strings.NewReader(string(bb)), int64(len(bb))); err != nil {
		t.Fatal(err)
	}
	if key, _, _, _, err := tb.LatestManifest(ctx, pk); err != nil || key != ptr.key {
		t.Fatalf("LatestManifest with a newer manifest naming a missing object: %q, %v; want %q", key, err, ptr.key)
	}
	// A follower releases what the manifest covers, whatever its own
	// segment boundaries (A's log as a follower of B).
	ca.believe = -1
	ta.Invalidate(pk)
	if rel, err := ta.ReleaseLocal(ctx, pk, la, 0, -1, time.Now()); err != nil || rel == 0 {
		t.Fatalf("follower release: %d, %v", rel, err)
	}
	if la.LocalStartOffset() > mb.Next() {
		t.Fatalf("follower released past the manifest: local start %d, manifest end %d", la.LocalStartOffset(), mb.Next())
	}
}

func TestKeyEpoch(t *testing.T) {
	for key, want := range map[string]int32{
		"t-00/0/00000000000000000012-0-e7.log":       7,
		"t-00/0/00000000000000000012-3-e0.index":     0,
		"t-00/0/manifest-e12-4.json":                 12,
		"t-00/0/manifest-e3-4-0badcafe.json":         3,
		"t-00/0/00000000000000000012.log":            -1,
		"t-00/0/manifest.json":                       -1,
		"t-00/0/00000000000000000012-0-ex.log":       -1,
		"t-e5/0/00000000000000000012.timeindex":      -1,
		"t-00/0/00000000000000000012-1.txnindex":     -1,
		"t-00/0/00000000000000000012-0-e99.txnindex": 99,
	} {
		e, ok := keyEpoch(key)
		if (want < 0) == ok || ok && e != want {
			t.Errorf("keyEpoch(%q) = %d, %v; want %d", key, e, ok, want)
		}
	}
}

// TestFencedSweepStaleCache: a broker that becomes leader with an older
// manifest cached (it missed its predecessor's last commit) sweeps
// nothing the commit point names; the next sweep, with the manifest
// loaded again, keeps it too.
func TestFencedSweepStaleCache(t *testing.T) {
	ctx := context.Background()
	store := NewMemStore()
	ptr := &fakePointer{leader: 2, epoch: 5}
	ca, cb := &fakeCommitter{p: ptr, id: 1, believe: -1}, &fakeCommitter{p: ptr, id: 2, believe: 5}
	ta, tb := New(store, zaptest.NewLogger(t), 1<<20), New(store, zaptest.NewLogger(t), 1<<20)
	ta.SetCommitter(ca)
	tb.SetCommitter(cb)
	pk := PartitionKey{Topic: "t", Partition: 0}
	lb := openReplica(t, 4000)
	for i := 0; i < 25; i++ {
		res, err := lb.Append(batch(300, time.Now().UnixMilli(), byte(i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := lb.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tb.UploadBelow(ctx, pk, lb, lb.HighWatermark()); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.Manifest(ctx, pk); err != nil { // A caches B's first manifest
		t.Fatal(err)
	}
	for i := 0; i < 25; i++ {
		res, err := lb.Append(batch(300, time.Now().UnixMilli(), byte(i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := lb.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := tb.UploadBelow(ctx, pk, lb, lb.HighWatermark()); err != nil || n == 0 {
		t.Fatalf("B's second upload: %d, %v", n, err)
	}
	mb, _ := tb.Manifest(ctx, pk)
	// A leads at epoch 6 with B's first manifest still cached.
	ptr.mu.Lock()
	ptr.leader, ptr.epoch = 1, 6
	ptr.mu.Unlock()
	ca.believe, cb.believe = 6, -1
	for range 2 {
		if _, err := ta.CleanOrphans(ctx, pk); err != nil {
			t.Fatal(err)
		}
		for i := range mb.Segments {
			if _, err := store.GetRange(ctx, pk.objectKey(&mb.Segments[i], ".log"), 0, 1); err != nil {
				t.Fatalf("segment %d of the committed manifest after the new leader's sweep: %v", mb.Segments[i].Base, err)
			}
		}
		if _, err := store.GetRange(ctx, ptr.key, 0, 1); err != nil {
			t.Fatalf("the committed manifest after the new leader's sweep: %v", err)
		}
	}
}

// TestFencedSuffixTxnIndex: a new leader whose local segment straddles the
// bucket's end uploads that segment's tail alone, with the aborted
// transactions whose markers are in the tail: a cold read_committed read
// finds them, and the local segment counts as uploaded (it can be
// released).
func TestFencedSuffixTxnIndex(t *testing.T) {
	ctx := context.Background()
	store := NewMemStore()
	ptr := &fakePointer{leader: 1, epoch: 1}
	ca, cb := &fakeCommitter{p: ptr, id: 1, believe: 1}, &fakeCommitter{p: ptr, id: 2, believe: -1}
	ta, tb := New(store, zaptest.NewLogger(t), 1<<20), New(store, zaptest.NewLogger(t), 1<<20)
	ta.SetCommitter(ca)
	tb.SetCommitter(cb)
	pk := PartitionKey{Topic: "t", Partition: 0}
	la, lb := openReplica(t, 4000), openReplica(t, 3000)
	produce := func(n int) {
		for i := 0; i < n; i++ {
			b := batch(300, time.Now().UnixMilli(), byte(i))
			for _, lp := range []*log.Partition{la, lb} {
				res, err := lp.Append(b)
				if err != nil {
					t.Fatal(err)
				}
				if err := lp.WaitDurable(res.LastOffset + 1); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	produce(40)
	if n, err := ta.UploadBelow(ctx, pk, la, la.HighWatermark()); err != nil || n == 0 {
		t.Fatalf("A's upload: %d, %v", n, err)
	}
	ma, _ := ta.Manifest(ctx, pk)
	ptr.mu.Lock()
	ptr.leader, ptr.epoch = 2, 2
	ptr.mu.Unlock()
	cb.believe = 2
	produce(40)
	var straddle log.SegmentInfo
	for _, s := range lb.SealedSegments() {
		if s.Base < ma.Next() && ma.Next() < s.Next {
			straddle = s
		}
	}
	if straddle.Next == 0 || straddle.Next-ma.Next() < 2 {
		t.Fatalf("no segment of B straddles A's last upload's end %d with two batches past it", ma.Next())
	}
	head := log.AbortedTxn{ProducerID: 7, FirstOffset: straddle.Base, LastOffset: ma.Next() - 1, LastStableOffset: ma.Next()}
	tail := log.AbortedTxn{ProducerID: 8, FirstOffset: ma.Next(), LastOffset: ma.Next() + 1, LastStableOffset: ma.Next() + 2}
	for _, a := range []log.AbortedTxn{head, tail} {
		if err := lb.AddAborted(a); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := tb.UploadBelow(ctx, pk, lb, lb.HighWatermark()); err != nil || n == 0 {
		t.Fatalf("B's upload: %d, %v", n, err)
	}
	mb, err := tb.Manifest(ctx, pk)
	if err != nil {
		t.Fatal(err)
	}
	i, ok := committedSegment(mb, straddle)
	if !ok || mb.Segments[i].Base != ma.Next() || mb.Segments[i].TxnIndexBytes != txnEntryBytes {
		t.Fatalf("the tail's entry in B's manifest: %+v (found %v), want one aborted transaction", mb.Segments[min(i, len(mb.Segments)-1)], ok)
	}
	// From the straddling segment's base: head ends in A's range (below
	// the suffix), so the suffix must not carry it.
	got, err := tb.AbortedTxns(ctx, pk, nil, straddle.Base, mb.Next())
	if err != nil || len(got) != 1 || got[0] != tail {
		t.Fatalf("the bucket's aborted transactions past %d: %+v, %v; want %+v only", straddle.Base, got, err, tail)
	}
	if !tb.txnIndexUploaded(mb, straddle, lb) {
		t.Fatal("the straddling segment does not count as uploaded")
	}
}
