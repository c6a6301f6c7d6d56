package tiering

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/log"
)

// abortMarker is an ABORT control batch of producer pid.
func abortMarker(pid int64) []byte {
	var rec []byte
	rec = append(rec, 0)              // attributes
	rec = binary.AppendVarint(rec, 0) // timestamp delta
	rec = binary.AppendVarint(rec, 0) // offset delta
	rec = binary.AppendVarint(rec, 4) // key: version 0, type ABORT
	rec = binary.BigEndian.AppendUint32(rec, uint32(log.ControlAbort))
	rec = binary.AppendVarint(rec, 6) // value: version, coordinator epoch
	rec = append(rec, 0, 0, 0, 0, 0, 1)
	rec = binary.AppendUvarint(rec, 0)
	recs := append(binary.AppendVarint(nil, int64(len(rec))), rec...)
	b := make([]byte, 61, 61+len(recs))
	be := binary.BigEndian
	be.PutUint32(b[8:], uint32(49+len(recs)))
	b[16] = 2
	be.PutUint16(b[21:], 0x30)
	be.PutUint64(b[43:], uint64(pid))
	be.PutUint32(b[57:], 1)
	b = append(b, recs...)
	be.PutUint32(b[17:], crc32.Checksum(b[21:], castagnoli))
	return b
}

// txnFixture is a partition with aborted transactions in some of its
// segments (and none in others), over store.
type txnFixture struct {
	t       *testing.T
	tier    *Tier
	lp      *log.Partition
	pk      PartitionKey
	aborted []log.AbortedTxn
}

func newTxnFixture(t *testing.T, store ObjectStore) *txnFixture {
	ls := log.OpenStore(log.Options{Logger: zaptest.NewLogger(t)})
	t.Cleanup(func() { ls.Close() })
	lp, err := ls.OpenPartition(filepath.Join(t.TempDir(), "t-0"), log.Config{SegmentBytes: 4000, IndexIntervalBytes: 500, RetentionMs: -1})
	if err != nil {
		t.Fatal(err)
	}
	return &txnFixture{t: t, tier: New(store, zaptest.NewLogger(t), 1<<20), lp: lp, pk: PartitionKey{Topic: "t", Partition: 0}}
}

// produce appends n data batches; in the first half of every third
// segment's worth some transactions are aborted (their marker and entry).
func (f *txnFixture) produce(n int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 3))
	var first int64 = -1
	for i := 0; i < n; i++ {
		res, err := f.lp.Append(batch(300, int64(i), byte(i)))
		if err != nil {
			f.t.Fatal(err)
		}
		if first < 0 {
			first = res.BaseOffset
		}
		if (i/24)%3 == 0 && rng.IntN(4) == 0 {
			m, err := f.lp.Append(abortMarker(7))
			if err != nil {
				f.t.Fatal(err)
			}
			a := log.AbortedTxn{ProducerID: 7, FirstOffset: first, LastOffset: m.BaseOffset, LastStableOffset: m.BaseOffset + 1}
			if err := f.lp.AddAborted(a); err != nil {
				f.t.Fatal(err)
			}
			f.aborted = append(f.aborted, a)
			first = -1
		}
	}
	if err := f.lp.Sync(); err != nil {
		f.t.Fatal(err)
	}
}

// want is the bucket's answer computed from every entry: manifest segments
// from the one holding from.
func (f *txnFixture) want(m *Manifest, from, upper int64) []log.AbortedTxn {
	start := int64(math.MinInt64)
	for _, s := range m.Segments {
		if s.Next > from {
			start = s.Base
			break
		}
	}
	var out []log.AbortedTxn
	for _, e := range f.aborted {
		if e.LastOffset < start || e.LastOffset >= m.Next() {
			continue
		}
		if e.LastOffset >= from && e.FirstOffset < upper {
			out = append(out, e)
		}
		if e.LastStableOffset >= upper {
			break
		}
	}
	return out
}

func (f *txnFixture) offload() *Manifest {
	ctx := context.Background()
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, time.Now()); err != nil {
		f.t.Fatal(err)
	}
	m, err := f.tier.Manifest(ctx, f.pk)
	if err != nil {
		f.t.Fatal(err)
	}
	return m
}

// countTxnGets counts GETs of .txnindex objects.
func countTxnGets(st *MemStore) *atomic.Int64 {
	var n atomic.Int64
	st.SetFault(func(op, key string) error {
		if op == "get" && strings.HasSuffix(key, txnIndexExt) {
			n.Add(1)
		}
		return nil
	})
	return &n
}

func TestTxnIndexUploadAndColdRead(t *testing.T) {
	st := NewMemStore()
	f := newTxnFixture(t, st)
	f.produce(400, 1)
	m := f.offload()
	if f.lp.LocalStartOffset() <= m.Segments[len(m.Segments)/2].Base {
		t.Fatalf("too little released: local start %d", f.lp.LocalStartOffset())
	}
	ctx := context.Background()
	keys, _ := st.List(ctx, f.pk.dir()+"/")
	with := 0
	for _, s := range m.Segments {
		key := f.pk.segmentKey(s.Base, txnIndexExt)
		has := slices.Contains(keys, key)
		var local []log.AbortedTxn
		for _, e := range f.aborted {
			if e.LastOffset >= s.Base && e.LastOffset < s.Next {
				local = append(local, e)
			}
		}
		if has != (len(local) > 0) || s.TxnIndexBytes != int64(len(local))*txnEntryBytes {
			t.Fatalf("segment %d: object %v, %d bytes in the manifest, %d entries", s.Base, has, s.TxnIndexBytes, len(local))
		}
		if has {
			with++
			b, _ := st.GetRange(ctx, key, 0, -1)
			if !bytes.Equal(b, log.EncodeAbortedTxns(nil, local)) {
				t.Fatalf("segment %d: object is not its entries", s.Base)
			}
		}
	}
	if with == 0 || with == len(m.Segments) {
		t.Fatalf("%d of %d segments with entries: the test needs both kinds", with, len(m.Segments))
	}
	gets := countTxnGets(st)
	rng := rand.New(rand.NewPCG(5, 5))
	end := m.Next()
	for i := 0; i < 500; i++ {
		from := rng.Int64N(end)
		upper := from + rng.Int64N(end-from+1)
		got, err := f.tier.AbortedTxns(ctx, f.pk, nil, from, upper)
		if err != nil {
			t.Fatal(err)
		}
		if want := f.want(m, from, upper); !slices.Equal(got, want) {
			t.Fatalf("[%d, %d): got %v\nwant %v", from, upper, got, want)
		}
	}
	if n := gets.Load(); n > int64(with) {
		t.Fatalf("%d GETs of .txnindex objects for %d segments with one", n, with)
	}
	// Segments without an index cost no GET, even with nothing cached: a
	// search from past the last segment that has one.
	f.tier.mu.Lock()
	f.tier.indexes.dropPrefix(f.pk.dir() + "/")
	f.tier.mu.Unlock()
	gets.Store(0)
	last := -1
	for i, s := range m.Segments {
		if s.TxnIndexBytes != 0 {
			last = i
		}
	}
	if last+1 < len(m.Segments) {
		s := m.Segments[last+1]
		if _, err := f.tier.AbortedTxns(ctx, f.pk, nil, s.Base, math.MaxInt64); err != nil {
			t.Fatal(err)
		}
		if n := gets.Load(); n != 0 {
			t.Fatalf("%d GETs for segments without an index", n)
		}
	}
}

func TestTxnIndexNoWait(t *testing.T) {
	st := NewMemStore()
	f := newTxnFixture(t, st)
	f.produce(300, 2)
	m := f.offload()
	ctx := context.Background()
	// A fresh tier: nothing cached, not even the manifest.
	f.tier = New(st, zaptest.NewLogger(t), 1<<20)
	gets := countTxnGets(st)
	from, upper := m.LogStartOffset, m.Next()
	want := f.want(m, from, upper)
	if len(want) == 0 {
		t.Fatal("no entries")
	}
	dst := make([]log.AbortedTxn, 1, 64) // what the caller had stays
	var got []log.AbortedTxn
	for tries := 0; ; tries++ {
		if tries > 100 {
			t.Fatal("never ready")
		}
		out, wait, err := f.tier.AbortedTxnsNoWait(ctx, f.pk, dst, from, upper)
		if err != nil {
			t.Fatal(err)
		}
		if wait == nil {
			got = out
			break
		}
		if len(out) != 1 {
			t.Fatalf("not ready, yet %d entries back", len(out))
		}
		select {
		case <-wait:
		case <-time.After(10 * time.Second):
			t.Fatal("wait never closed")
		}
	}
	if !slices.Equal(got[1:], want) {
		t.Fatalf("got %v\nwant %v", got[1:], want)
	}
	n := gets.Load()
	for i := 0; i < 5; i++ {
		if _, wait, err := f.tier.AbortedTxnsNoWait(ctx, f.pk, nil, from, upper); err != nil || wait != nil {
			t.Fatalf("cached: wait %v, %v", wait, err)
		}
	}
	if gets.Load() != n {
		t.Fatal("cached indexes fetched again")
	}
	// A failed background load is reported once, then tried again.
	f.tier = New(st, zaptest.NewLogger(t), 1<<20)
	if _, err := f.tier.Manifest(ctx, f.pk); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	st.SetFault(func(op, key string) error {
		if op == "get" && strings.HasSuffix(key, txnIndexExt) {
			return boom
		}
		return nil
	})
	_, wait, err := f.tier.AbortedTxnsNoWait(ctx, f.pk, nil, from, upper)
	if err != nil || wait == nil {
		t.Fatalf("first: %v, %v", wait, err)
	}
	<-wait
	if _, _, err := f.tier.AbortedTxnsNoWait(ctx, f.pk, nil, from, upper); !errors.Is(err, boom) {
		t.Fatalf("after a failed load: %v", err)
	}
	st.SetFault(nil)
	if got, err := f.tier.AbortedTxns(ctx, f.pk, nil, from, upper); err != nil || !slices.Equal(got, want) {
		t.Fatalf("after the store healed: %v, %v", got, err)
	}
}

func TestTxnIndexCorruptOrMissingObject(t *testing.T) {
	st := NewMemStore()
	f := newTxnFixture(t, st)
	f.produce(300, 3)
	m := f.offload()
	ctx := context.Background()
	var s SegmentMeta
	for _, sm := range m.Segments {
		if sm.TxnIndexBytes > 0 {
			s = sm
			break
		}
	}
	key := f.pk.segmentKey(s.Base, txnIndexExt)
	b, _ := st.GetRange(ctx, key, 0, -1)
	b[20] ^= 1
	if err := st.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	if _, err := f.tier.AbortedTxns(ctx, f.pk, nil, s.Base, math.MaxInt64); err == nil || !strings.Contains(err.Error(), "CRC") {
		t.Fatalf("corrupt object: %v", err)
	}
	st.Delete(ctx, key)
	if _, err := f.tier.AbortedTxns(ctx, f.pk, nil, s.Base, math.MaxInt64); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing object: %v", err)
	}
}

// TestTxnIndexRetentionAndForget: the objects go with their segments.
func TestTxnIndexRetentionAndForget(t *testing.T) {
	st := NewMemStore()
	f := newTxnFixture(t, st)
	f.produce(400, 4)
	m := f.offload()
	ctx := context.Background()
	txnKeys := func() []string {
		keys, _ := st.List(ctx, f.pk.dir()+"/")
		var out []string
		for _, k := range keys {
			if strings.HasSuffix(k, txnIndexExt) {
				out = append(out, k)
			}
		}
		return out
	}
	before := txnKeys()
	if n, err := f.tier.CleanOrphans(ctx, f.pk); err != nil || n != 0 {
		t.Fatalf("CleanOrphans took %d objects: %v", n, err)
	}
	if got := txnKeys(); !slices.Equal(got, before) {
		t.Fatalf("CleanOrphans deleted .txnindex objects: %v → %v", before, got)
	}
	var total int64
	for _, s := range m.Segments {
		total += s.Size
	}
	for _, s := range f.lp.SealedSegments() {
		if s.Base >= m.Next() {
			total += s.Size
		}
	}
	if err := f.tier.ApplyRetention(ctx, f.pk, f.lp, total/2, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	m2, _ := f.tier.Manifest(ctx, f.pk)
	for _, k := range txnKeys() {
		found := false
		for _, s := range m2.Segments {
			found = found || k == f.pk.segmentKey(s.Base, txnIndexExt)
		}
		if !found {
			t.Fatalf("%s left after retention dropped its segment", k)
		}
	}
	if len(txnKeys()) >= len(before) {
		t.Fatalf("retention deleted no .txnindex object (%d before, %d after)", len(before), len(txnKeys()))
	}
	if err := f.tier.Forget(ctx, f.pk); err != nil {
		t.Fatal(err)
	}
	if k := txnKeys(); len(k) != 0 {
		t.Fatalf("left after Forget: %v", k)
	}
}

// TestTxnIndexEntryAfterUpload: an entry added to a segment after it was
// sealed and uploaded (its marker appended just before a roll) is uploaded
// by the next pass, and the local copy is kept until it is.
func TestTxnIndexEntryAfterUpload(t *testing.T) {
	st := NewMemStore()
	f := newTxnFixture(t, st)
	f.produce(60, 6)
	first, err := f.lp.Append(batch(300, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	mk, err := f.lp.Append(abortMarker(8))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.lp.Roll(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.lp.Append(batch(300, 2, 2)); err != nil { // an active segment after it
		t.Fatal(err)
	}
	if err := f.lp.Sync(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		t.Fatal(err)
	}
	late := log.AbortedTxn{ProducerID: 8, FirstOffset: first.BaseOffset, LastOffset: mk.BaseOffset, LastStableOffset: mk.BaseOffset + 1}
	if err := f.lp.AddAborted(late); err != nil {
		t.Fatal(err)
	}
	f.aborted = append(f.aborted, late)
	// Released before the next upload: not the segment holding it.
	if _, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	if ls := f.lp.LocalStartOffset(); ls > mk.BaseOffset {
		t.Fatalf("segment with an entry the bucket lacks released (local start %d, marker %d)", ls, mk.BaseOffset)
	}
	m := f.offload()
	if ls := f.lp.LocalStartOffset(); ls <= mk.BaseOffset {
		t.Fatalf("segment not released after its entry was uploaded (local start %d)", ls)
	}
	got, err := f.tier.AbortedTxns(ctx, f.pk, nil, first.BaseOffset, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	if want := f.want(m, first.BaseOffset, math.MaxInt64); !slices.Equal(got, want) || !slices.Contains(got, late) {
		t.Fatalf("got %v\nwant %v (with %v)", got, want, late)
	}
}

func TestTxnIndexOldManifest(t *testing.T) {
	m, err := decodeManifest([]byte(`{"version":1,"log_start_offset":0,"segments":[{"base":0,"next":10,"size":100,"max_timestamp":1,"crc32c":5}]}`))
	if err != nil || m.Segments[0].TxnIndexBytes != 0 {
		t.Fatalf("%v %v", m, err)
	}
	if _, err := decodeManifest([]byte(`{"version":1,"segments":[{"base":0,"next":10,"size":100,"txn_index_bytes":35}]}`)); err == nil {
		t.Fatal("a txn index of a size no entries have accepted")
	}
	// No GET for it.
	st := NewMemStore()
	gets := countTxnGets(st)
	tier := New(st, zaptest.NewLogger(t), 1<<20)
	pk := PartitionKey{Topic: "t"}
	b, _ := m.encode()
	if err := st.Put(context.Background(), pk.manifestKey(), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	if got, err := tier.AbortedTxns(context.Background(), pk, nil, 0, math.MaxInt64); err != nil || len(got) != 0 || gets.Load() != 0 {
		t.Fatalf("%v %v, %d GETs", got, err, gets.Load())
	}
}

// TestTxnIndexS3 is the upload and cold read of aborted transactions
// against a real S3 server (versitygw).
func TestTxnIndexS3(t *testing.T) {
	v := runVersitygw(t)
	f := newTxnFixture(t, v.Store(v.Bucket(), "txn/"))
	f.produce(300, 7)
	m := f.offload()
	ctx := context.Background()
	f.tier = New(v.Store(v.Bucket(), "txn/"), zaptest.NewLogger(t), 1<<20) // nothing cached
	from, upper := m.LogStartOffset, m.Next()
	want := f.want(m, from, upper)
	if len(want) == 0 {
		t.Fatal("no entries")
	}
	got, err := f.tier.AbortedTxns(ctx, f.pk, nil, from, upper)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("got %v, %v\nwant %v", got, err, want)
	}
	if err := f.tier.Forget(ctx, f.pk); err != nil {
		t.Fatal(err)
	}
}
