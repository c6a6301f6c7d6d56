package tiering

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/log"
)

// keyedBatch is a v2 batch of one record with a key.
func keyedBatch(key string, value []byte, ts int64) []byte {
	return recordBatch([]byte(key), value, ts)
}

// crashStore is a store that dies at its n-th write: that write and every
// later one fail (reads go on, as they would for the next process).
type crashStore struct {
	ObjectStore
	mu      sync.Mutex
	n, done int
	crashed bool
}

var errCrash = errors.New("crashed")

func (c *crashStore) write() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done >= c.n {
		c.crashed = true
		return errCrash
	}
	c.done++
	return nil
}

func (c *crashStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.ObjectStore.Put(ctx, key, r, size)
}

func (c *crashStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.ObjectStore.PutIfAbsent(ctx, key, r, size)
}

func (c *crashStore) Delete(ctx context.Context, key string) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.ObjectStore.Delete(ctx, key)
}

// compactFixture: a keyed log whose older segments only the bucket holds,
// superseded in part by the local tail.
type compactFixture struct {
	store  *MemStore
	lp     *log.Partition
	pk     PartitionKey
	values map[int64]string // offset -> key=value of every record written
	latest map[string]int64
	km     *log.KeyMap
	below  int64 // local start: the bucket holds [0, below)
}

func newCompactFixture(t *testing.T) *compactFixture {
	t.Helper()
	ctx := context.Background()
	ls := log.OpenStore(log.Options{Logger: zaptest.NewLogger(t)})
	t.Cleanup(func() { ls.Close() })
	lp, err := ls.OpenPartition(filepath.Join(t.TempDir(), "t-0"), log.Config{SegmentBytes: 1500, IndexIntervalBytes: 200, RetentionMs: -1})
	if err != nil {
		t.Fatal(err)
	}
	f := &compactFixture{store: NewMemStore(), lp: lp, pk: PartitionKey{Topic: "t", Partition: 0},
		values: map[int64]string{}, latest: map[string]int64{}, km: log.NewKeyMap(1 << 16)}
	put := func(i, k int) {
		key := fmt.Sprintf("k%02d", k)
		v := fmt.Sprintf("%s=%d", key, i)
		res, err := lp.Append(keyedBatch(key, []byte(v), int64(1000+i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := lp.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
		f.values[res.BaseOffset], f.latest[key] = v, res.BaseOffset
		f.km.Put([]byte(key), res.BaseOffset)
	}
	for i := 0; i < 120; i++ {
		put(i, (i*7)%23)
	}
	tier := New(f.store, nil, 1<<20)
	if _, err := tier.Upload(ctx, f.pk, lp); err != nil {
		t.Fatal(err)
	}
	if _, err := tier.ReleaseLocal(ctx, f.pk, lp, 0, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	for i := 120; i < 140; i++ {
		put(i, i%11) // keys 11 to 22 keep their latest in the bucket
	}
	f.below = lp.LocalStartOffset()
	if f.below < 60 {
		t.Fatalf("only %d offsets in the bucket", f.below)
	}
	return f
}

func (f *compactFixture) cfg(t *testing.T) BucketCleanConfig {
	return BucketCleanConfig{Map: f.km, End: f.lp.LogEndOffset(), NowMs: time.Now().UnixMilli(), SegmentBytes: 3000, TempDir: t.TempDir()}
}

// read returns the records the bucket serves from 0 to f.below, checking
// each against what was written: offsets ascending, each record one that
// was written at that offset.
func (f *compactFixture) read(t *testing.T, tier *Tier) map[int64]string {
	t.Helper()
	got := map[int64]string{}
	last := int64(-1)
	for off := int64(0); off < f.below; {
		b, next, err := tier.Read(context.Background(), f.pk, off, 1<<16)
		if err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if next <= off {
			t.Fatalf("read at %d made no progress", off)
		}
		for len(b) > 0 {
			h, err := log.ParseBatchHeader(b)
			if err != nil {
				t.Fatal(err)
			}
			if h.NumRecords > 0 {
				i := bytes.IndexByte(b[61:h.Length], '=')
				v := string(b[61+i-3 : h.Length-1])
				if h.BaseOffset <= last {
					t.Fatalf("offset %d after %d", h.BaseOffset, last)
				}
				last = h.BaseOffset
				if f.values[h.BaseOffset] != v {
					t.Fatalf("offset %d: read %q, wrote %q", h.BaseOffset, v, f.values[h.BaseOffset])
				}
				got[h.BaseOffset] = v
			}
			b = b[h.Length:]
		}
		off = next
	}
	return got
}

// A bucket clean leaves one record per key, the latest: in the bucket,
// only records no later one supersedes stay.
func TestCleanBucketKeepsTheLatestPerKey(t *testing.T) {
	f := newCompactFixture(t)
	tier := New(f.store, zaptest.NewLogger(t), 1<<20)
	before, _ := tier.Manifest(context.Background(), f.pk)
	res, err := tier.CleanBucket(context.Background(), f.pk, f.lp, f.cfg(t))
	if err != nil {
		t.Fatal(err)
	}
	if res.Swapped == 0 || res.SegmentsIn != len(before.Segments) {
		t.Fatalf("%+v of %d segments", res, len(before.Segments))
	}
	got := f.read(t, New(f.store, nil, 1<<20))
	for off, v := range f.values {
		if off >= f.below {
			continue
		}
		key := v[:3]
		if want := f.latest[key] == off; want != (got[off] != "") {
			t.Fatalf("offset %d (%s): kept %v, latest of its key at %d", off, v, !want, f.latest[key])
		}
	}
	after, _ := tier.Manifest(context.Background(), f.pk)
	if after.Next() != before.Next() || after.Gen == 0 || len(after.Segments) >= len(before.Segments) {
		t.Fatalf("manifest before %+v\nafter %+v", before, after)
	}
	if n, err := tier.CleanOrphans(context.Background(), f.pk); err != nil || n != 0 {
		t.Fatalf("%d objects left behind (%v)", n, err)
	}
	// Cleaning again merges the small outputs (groups are made by input
	// size), then changes nothing; the records stay the same.
	for i := 0; ; i++ {
		res, err := tier.CleanBucket(context.Background(), f.pk, f.lp, f.cfg(t))
		if err != nil {
			t.Fatal(err)
		}
		if res.Swapped == 0 {
			break
		}
		if i == 3 || res.Stats.RecordsOut != res.Stats.RecordsIn {
			t.Fatalf("clean %d: %+v", i+2, res)
		}
	}
	if again := f.read(t, New(f.store, nil, 1<<20)); len(again) != len(got) {
		t.Fatalf("%d records after merging, %d before", len(again), len(got))
	}
}

// A crash at every write of a bucket clean (each object upload, the
// manifest commit, each delete after it) leaves a bucket whose log reads
// whole: every offset either as it was or as cleaned, never lost, never
// twice; the latest record of every key always there. The orphan sweep
// then leaves only what the manifest names, and a clean run after the
// restart finishes the job.
func TestCleanBucketCrashAtEveryWrite(t *testing.T) {
	for n := 0; ; n++ {
		f := newCompactFixture(t)
		cs := &crashStore{ObjectStore: f.store, n: n}
		_, err := New(cs, nil, 1<<20).CleanBucket(context.Background(), f.pk, f.lp, f.cfg(t))
		if !cs.crashed {
			if err != nil {
				t.Fatal(err)
			}
			if n < 4 {
				t.Fatalf("a clean of %d writes", n)
			}
			t.Logf("crashed at each of %d writes", n)
			return
		}
		if err != nil && !errors.Is(err, errCrash) { // deletes after the commit are best effort: no error
			t.Fatalf("write %d: %v", n, err)
		}
		tier := New(f.store, nil, 1<<20) // the next process
		got := f.read(t, tier)
		for key, off := range f.latest {
			if off < f.below && got[off] == "" {
				t.Fatalf("crash at write %d: latest record of %s (offset %d) lost", n, key, off)
			}
		}
		if _, err := tier.CleanOrphans(context.Background(), f.pk); err != nil {
			t.Fatal(err)
		}
		keys, _ := f.store.List(context.Background(), f.pk.dir()+"/")
		m, _ := tier.Manifest(context.Background(), f.pk)
		named := 1
		for _, s := range m.Segments {
			named += 3
			if s.TxnIndexBytes > 0 {
				named++
			}
		}
		if len(keys) != named {
			t.Fatalf("crash at write %d: %d objects, the manifest names %d: %v", n, len(keys), named, keys)
		}
		if _, err := tier.CleanBucket(context.Background(), f.pk, f.lp, f.cfg(t)); err != nil {
			t.Fatal(err)
		}
		got = f.read(t, tier)
		for off, v := range f.values {
			if off < f.below && (f.latest[v[:3]] == off) != (got[off] != "") {
				t.Fatalf("crash at write %d, then a clean: offset %d kept %v", n, off, got[off] != "")
			}
		}
	}
}

// When every record the bucket holds is superseded, compaction leaves
// empty segments: a read there answers nothing with the offset where the
// log goes on (the local log's start), not an error.
func TestCleanBucketToNothing(t *testing.T) {
	f := newCompactFixture(t)
	for off, v := range f.values { // supersede every key locally
		if off < f.below {
			f.km.Put([]byte(v[:3]), f.lp.LogEndOffset()+1)
		}
	}
	tier := New(f.store, nil, 1<<20)
	if _, err := tier.CleanBucket(context.Background(), f.pk, f.lp, f.cfg(t)); err != nil {
		t.Fatal(err)
	}
	b, next, err := tier.Read(context.Background(), f.pk, 0, 1<<16)
	if err != nil || len(b) != 0 || next != f.below {
		t.Fatalf("read of a bucket compacted to nothing: %d bytes, next %d (local start %d), %v", len(b), next, f.below, err)
	}
}

// A local clean merges segments the bucket holds; before the next upload,
// DeleteRecords and retention drop the first of them from the manifest.
// The upload still swaps the cleaned segment in (from the manifest's
// first segment on), so its local copy can be released.
func TestUploadReplacesAfterRetentionDroppedTheHead(t *testing.T) {
	ctx := context.Background()
	ls := log.OpenStore(log.Options{Logger: zaptest.NewLogger(t)})
	t.Cleanup(func() { ls.Close() })
	lp, err := ls.OpenPartition(filepath.Join(t.TempDir(), "t-0"), log.Config{SegmentBytes: 1500, IndexIntervalBytes: 200, RetentionMs: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 120; i++ {
		res, err := lp.Append(keyedBatch(fmt.Sprintf("k%02d", i%5), []byte(fmt.Sprintf("v%d", i)), int64(1000+i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := lp.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
	}
	tier := New(NewMemStore(), nil, 1<<20)
	pk := PartitionKey{Topic: "t", Partition: 0}
	if _, err := tier.Upload(ctx, pk, lp); err != nil {
		t.Fatal(err)
	}
	before, _ := tier.Manifest(ctx, pk)
	if len(before.Segments) < 3 {
		t.Fatalf("%d segments uploaded", len(before.Segments))
	}
	if _, err := lp.Clean(ctx, log.CleanConfig{DeleteRetention: -1}); err != nil {
		t.Fatal(err)
	}
	local := lp.SealedSegments()
	if !local[0].Cleaned || local[0].Next <= before.Segments[1].Base {
		t.Fatalf("the clean did not merge the first segments: %+v", local[0])
	}
	d := before.Segments[1].Base + 1 // inside the second uploaded segment
	if _, err := lp.DeleteRecordsBefore(d); err != nil {
		t.Fatal(err)
	}
	if err := tier.ApplyRetention(ctx, pk, lp, -1, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	if m, _ := tier.Manifest(ctx, pk); m.Segments[0].Base == local[0].Base {
		t.Fatalf("retention kept the head: %+v", m.Segments[0])
	}
	if _, err := tier.Upload(ctx, pk, lp); err != nil {
		t.Fatal(err)
	}
	m, _ := tier.Manifest(ctx, pk)
	if !m.Releasable(lp.SealedSegments()[0], lp.LogStartOffset()) {
		t.Fatalf("cleaned local segment %+v not swapped in: %+v", lp.SealedSegments()[0], m.Segments)
	}
}
