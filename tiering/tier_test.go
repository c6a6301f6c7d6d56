package tiering

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/log"
)

// batch returns a valid v2 batch of one record with a value of n bytes.
func batch(n int, ts int64, fill byte) []byte {
	return recordBatch(nil, bytes.Repeat([]byte{fill}, n), ts)
}

// recordBatch is a valid v2 batch of one record (key nil: a null key).
func recordBatch(key, value []byte, ts int64) []byte {
	var rec []byte
	rec = append(rec, 0)              // attributes
	rec = binary.AppendVarint(rec, 0) // ts delta
	rec = binary.AppendVarint(rec, 0) // offset delta
	if key == nil {
		rec = binary.AppendVarint(rec, -1)
	} else {
		rec = binary.AppendVarint(rec, int64(len(key)))
		rec = append(rec, key...)
	}
	rec = binary.AppendVarint(rec, int64(len(value)))
	rec = append(rec, value...)
	rec = binary.AppendUvarint(rec, 0) // headers
	recs := binary.AppendVarint(nil, int64(len(rec)))
	recs = append(recs, rec...)
	b := make([]byte, 61, 61+len(recs))
	be := binary.BigEndian
	be.PutUint32(b[8:], uint32(49+len(recs)))
	b[16] = 2
	be.PutUint64(b[27:], uint64(ts))
	be.PutUint64(b[35:], uint64(ts))
	be.PutUint64(b[43:], ^uint64(0))
	be.PutUint32(b[57:], 1)
	b = append(b, recs...)
	be.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

type fixture struct {
	t     *testing.T
	store *MemStore
	tier  *Tier
	lp    *log.Partition
	pk    PartitionKey
	want  map[int64][]byte
}

func newFixture(t *testing.T) *fixture {
	dir := t.TempDir()
	ls := log.OpenStore(log.Options{Logger: zaptest.NewLogger(t)})
	t.Cleanup(func() { ls.Close() })
	lp, err := ls.OpenPartition(filepath.Join(dir, "t-0"), log.Config{SegmentBytes: 4000, IndexIntervalBytes: 500, RetentionMs: -1})
	if err != nil {
		t.Fatal(err)
	}
	st := NewMemStore()
	return &fixture{t: t, store: st, tier: New(st, zaptest.NewLogger(t), 1<<20), lp: lp,
		pk: PartitionKey{Topic: "t", Partition: 0}, want: map[int64][]byte{}}
}

// offload produces n batches, uploads every sealed segment, deletes the
// local copies and returns the manifest.
func (f *fixture) offload(n int) *Manifest {
	ctx := context.Background()
	f.produce(n, 1000)
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

func (f *fixture) produce(n int, ts int64) {
	for i := 0; i < n; i++ {
		b := batch(300, ts+int64(i), byte(i))
		res, err := f.lp.Append(b)
		if err != nil {
			f.t.Fatal(err)
		}
		if err := f.lp.WaitDurable(res.LastOffset + 1); err != nil {
			f.t.Fatal(err)
		}
		f.want[res.BaseOffset] = append([]byte(nil), b...)
	}
}

// readAll reads [from, hw) through the tier below the local start and the
// log above it, checking every batch.
func (f *fixture) readAll(from int64) {
	ctx := context.Background()
	off := from
	for off < f.lp.HighWatermark() {
		var got []byte
		res, err := f.lp.Read(off, 10000)
		switch {
		case errors.Is(err, log.ErrNotLocal):
			var next int64
			got, next, err = f.tier.Read(ctx, f.pk, off, 10000)
			if err != nil {
				f.t.Fatalf("cold read %d: %v", off, err)
			}
			if next <= off {
				f.t.Fatalf("cold read %d made no progress", off)
			}
		case err != nil:
			f.t.Fatalf("read %d: %v", off, err)
		default:
			got, _ = res.AppendTo(nil)
			res.Release()
		}
		for len(got) > 0 {
			h, err := log.ParseBatchHeader(got)
			if err != nil {
				f.t.Fatal(err)
			}
			if h.BaseOffset != off {
				f.t.Fatalf("batch %d, want %d", h.BaseOffset, off)
			}
			if !bytes.Equal(got[:h.Length], f.want[off]) {
				f.t.Fatalf("batch %d differs", off)
			}
			off = h.NextOffset()
			got = got[h.Length:]
		}
	}
}

func TestUploadReleaseColdRead(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	now := time.Now()
	f.produce(60, now.UnixMilli())
	n, err := f.tier.Upload(ctx, f.pk, f.lp)
	if err != nil || n == 0 {
		t.Fatalf("upload: %d, %v", n, err)
	}
	if again, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil || again != 0 {
		t.Fatalf("second upload: %d, %v", again, err)
	}
	m, _ := f.tier.Manifest(ctx, f.pk)
	if m.Next() != f.lp.SealedSegments()[len(f.lp.SealedSegments())-1].Next {
		t.Fatalf("manifest ends at %d", m.Next())
	}
	rel, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, now)
	if err != nil || rel == 0 {
		t.Fatalf("release: %d, %v", rel, err)
	}
	if f.lp.LocalStartOffset() != m.Next() || f.lp.LogStartOffset() != 0 {
		t.Fatalf("local start %d (manifest next %d), log start %d", f.lp.LocalStartOffset(), m.Next(), f.lp.LogStartOffset())
	}
	f.readAll(0)
	st := f.tier.Stats()
	f.readAll(0) // again: from the chunk cache
	if st2 := f.tier.Stats(); st2.DownloadedBytes != st.DownloadedBytes || st2.CacheHits <= st.CacheHits {
		t.Fatalf("second cold pass downloaded again: %+v then %+v", st, st2)
	}
	// Reads from the middle of a segment start at the batch holding the offset.
	got, _, err := f.tier.Read(ctx, f.pk, 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := log.ParseBatchHeader(got); h.BaseOffset != 5 || int(h.Length) != len(got) {
		t.Fatalf("read at 5: batch %d, %d bytes", h.BaseOffset, len(got))
	}
}

// TestColdReadDetectsCorruptObject: a flipped byte in an uploaded object is
// an error and a re-fetch, never data. Manifests with chunk checksums catch
// it as the chunk downloads; older manifests without them, by the batch's
// own CRC.
func TestColdReadDetectsCorruptObject(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			m := f.offload(30)
			if len(m.Segments[0].ChunkCRC32C) != 1 || m.Segments[0].ChunkBytes != chunkSize {
				t.Fatalf("manifest chunk sums: %d bytes, %v", m.Segments[0].ChunkBytes, m.Segments[0].ChunkCRC32C)
			}
			want := "chunk 0: crc mismatch"
			if legacy {
				// A manifest from before chunk checksums, read by a new Tier.
				for i := range m.Segments {
					m.Segments[i].ChunkBytes, m.Segments[i].ChunkCRC32C = 0, nil
				}
				b, _ := m.encode()
				f.store.Put(ctx, f.pk.manifestKey(), bytes.NewReader(b), int64(len(b)))
				f.tier = New(f.store, zaptest.NewLogger(t), 1<<20)
				want = "crc mismatch in batch"
			}
			key := f.pk.segmentKey(0, ".log")
			obj, err := f.store.GetRange(ctx, key, 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			bad := append([]byte(nil), obj...)
			bad[200] ^= 0xff
			f.store.Put(ctx, key, bytes.NewReader(bad), int64(len(bad)))
			if _, _, err := f.tier.Read(ctx, f.pk, 0, 1<<20); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("corrupt object: err %v, want %q", err, want)
			}
			// Repaired object: the next read fetches again and succeeds.
			f.store.Put(ctx, key, bytes.NewReader(obj), int64(len(obj)))
			got, _, err := f.tier.Read(ctx, f.pk, 0, 1<<20)
			if err != nil {
				t.Fatalf("after repair: %v", err)
			}
			if !bytes.HasPrefix(got, obj) { // and on into the next segments
				t.Fatal("after repair: wrong bytes")
			}
		})
	}
}

// TestUploadRetriesAfterFailure: a store failing in the middle of an upload
// leaves no manifest entry; the next run completes it.
func TestUploadRetriesAfterFailure(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.produce(40, 1000)
	calls := 0
	f.store.SetFault(func(op, key string) error {
		if op == "put" {
			calls++
			if calls == 5 {
				return errors.New("503 SlowDown")
			}
		}
		return nil
	})
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err == nil {
		t.Fatal("failure not reported")
	}
	m, _ := f.tier.Manifest(ctx, f.pk)
	for _, s := range m.Segments {
		if _, err := f.store.GetRange(ctx, f.pk.segmentKey(s.Base, ".log"), 0, 1); err != nil {
			t.Fatalf("manifest names a missing object: %v", err)
		}
	}
	f.store.SetFault(nil)
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		t.Fatal(err)
	}
	if _, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	f.readAll(0)
}

func TestRetentionAcrossTiers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	now := time.Now()
	f.produce(60, now.Add(-time.Hour).UnixMilli())
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		t.Fatal(err)
	}
	if _, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, now); err != nil {
		t.Fatal(err)
	}
	m, _ := f.tier.Manifest(ctx, f.pk)
	first := m.Segments[0]
	if err := f.tier.ApplyRetention(ctx, f.pk, f.lp, 8000, -1, now); err != nil {
		t.Fatal(err)
	}
	m2, _ := f.tier.Manifest(ctx, f.pk)
	if len(m2.Segments) >= len(m.Segments) || f.lp.LogStartOffset() != m2.LogStartOffset || m2.LogStartOffset == 0 {
		t.Fatalf("retention: %d -> %d segments, log start %d / %d", len(m.Segments), len(m2.Segments), f.lp.LogStartOffset(), m2.LogStartOffset)
	}
	if _, err := f.store.GetRange(ctx, f.pk.segmentKey(first.Base, ".log"), 0, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("expired object still there: %v", err)
	}
	f.readAll(f.lp.LogStartOffset())
}

func TestCleanOrphans(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.produce(40, 1000)
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		t.Fatal(err)
	}
	// An upload cut short before its manifest commit, and a stray object.
	orphan := f.pk.segmentKey(999999, ".log")
	f.store.Put(ctx, orphan, bytes.NewReader([]byte("x")), 1)
	n, err := f.tier.CleanOrphans(ctx, f.pk)
	if err != nil || n != 1 {
		t.Fatalf("CleanOrphans: %d, %v", n, err)
	}
	if _, err := f.store.GetRange(ctx, orphan, 0, -1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("orphan still there: %v", err)
	}
	if _, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	f.readAll(0) // nothing named by the manifest went
}

func TestRetryingStore(t *testing.T) {
	mem := NewMemStore()
	fails := 2
	mem.SetFault(func(op, key string) error {
		if fails > 0 {
			fails--
			return errors.New("503 SlowDown")
		}
		return nil
	})
	s := Retrying(mem, 5)
	ctx := context.Background()
	if err := s.Put(ctx, "a", bytes.NewReader([]byte("hello")), 5); err != nil {
		t.Fatalf("put after two transient failures: %v", err)
	}
	fails = 2
	if b, err := s.GetRange(ctx, "a", 0, -1); err != nil || string(b) != "hello" {
		t.Fatalf("get after two transient failures: %q %v", b, err)
	}
	if _, err := s.GetRange(ctx, "missing", 0, -1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("not-found is not retried away: %v", err)
	}
	fails = 10
	if err := Retrying(mem, 3).Delete(ctx, "a"); err == nil {
		t.Fatal("persistent failure not reported")
	}
	// One attempt timing out (a dial or response-header timeout matches
	// context.DeadlineExceeded) is retried while the caller's context lives;
	// once that context is done, nothing is.
	var tries int
	mem.SetFault(func(op, key string) error {
		tries++
		if tries <= 2 {
			return fmt.Errorf("dial tcp: i/o timeout: %w", context.DeadlineExceeded)
		}
		return nil
	})
	if _, err := s.GetRange(ctx, "a", 0, -1); err != nil || tries != 3 {
		t.Fatalf("after %d tries with two attempt timeouts: %v", tries, err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	tries = 0
	if _, err := s.GetRange(done, "a", 0, -1); err == nil || tries != 1 {
		t.Fatalf("a done context: %d tries, %v; want one, failed", tries, err)
	}
}

// TestDiskCacheLevel: with a memory cache of one chunk, chunks spill to the
// disk level and a second cold pass downloads nothing.
func TestDiskCacheLevel(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.tier = New(f.store, nil, 1) // memory level: next to nothing
	if err := f.tier.SetDiskCache(filepath.Join(t.TempDir(), "cache"), 64<<20); err != nil {
		t.Fatal(err)
	}
	f.produce(60, 1000)
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		t.Fatal(err)
	}
	if _, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	f.readAll(0)
	before := f.tier.Stats()
	f.readAll(0)
	after := f.tier.Stats()
	if after.DownloadedBytes != before.DownloadedBytes {
		t.Fatalf("second pass downloaded %d bytes despite the disk cache", after.DownloadedBytes-before.DownloadedBytes)
	}
	// A cached chunk file changed on disk is not served: it is dropped and
	// downloaded again.
	files, _ := filepath.Glob(filepath.Join(f.tier.cache.dir, "*"))
	if len(files) == 0 {
		t.Fatal("nothing on the disk level")
	}
	for _, p := range files {
		b, _ := os.ReadFile(p)
		b[len(b)/2] ^= 0xff
		os.WriteFile(p, b, 0o644)
	}
	f.readAll(0)
	if f.tier.Stats().DownloadedBytes == after.DownloadedBytes {
		t.Fatal("tampered cache files were served, not downloaded again")
	}
}

// TestNoWaitReadReportsDownloadFailure: a cold chunk whose background
// download fails is reported to the next read, not left empty forever.
func TestNoWaitReadReportsDownloadFailure(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.produce(20, 1000)
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		t.Fatal(err)
	}
	f.store.SetFault(func(op, key string) error {
		if op == "get" && strings.HasSuffix(key, ".log") {
			return ErrNotFound
		}
		return nil
	})
	_, wait, err := f.tier.ReadNoWait(ctx, f.pk, 0, 1<<20)
	if err != nil || wait == nil {
		t.Fatalf("first no-wait read: wait %v, err %v", wait, err)
	}
	<-wait
	if _, _, err := f.tier.ReadNoWait(ctx, f.pk, 0, 1<<20); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after the failed download: %v, want the download's error", err)
	}
}

// TestLocalDirUploadLinks: with a local-directory store on the same file
// system, a sealed segment is stored by a hard link (no copy), the manifest
// checksum is right, and the object outlives the local segment's release.
func TestLocalDirUploadLinks(t *testing.T) {
	f := newFixture(t)
	ld, err := NewLocalDir(filepath.Join(t.TempDir(), "tier"))
	if err != nil {
		t.Fatal(err)
	}
	f.tier = New(Retrying(ld, 3), zaptest.NewLogger(t), 1<<20)
	ctx := context.Background()
	now := time.Now()
	f.produce(60, now.UnixMilli())
	seg := f.lp.SealedSegments()[0]
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		t.Fatal(err)
	}
	local, err := os.Stat(seg.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := os.Stat(ld.path(f.pk.segmentKey(seg.Base, ".log")))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(local, obj) {
		t.Fatal("the sealed segment was copied, not linked")
	}
	if _, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, now); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(seg.LogPath); !os.IsNotExist(err) {
		t.Fatalf("local segment not released: %v", err)
	}
	f.readAll(0) // cold, through the checksum check
	// A wrong size or a missing file is refused (the uploader then copies).
	if err := ld.LinkFile(ctx, "x/y.log", "/nonexistent", 1); err == nil {
		t.Fatal("linked a missing file")
	}
}

// bigPartition opens partition t-0 under dir with cfg and appends batches
// of size bytes of records (batch i filled with byte i) until they total at
// least total bytes, each durable before the next.
func bigPartition(t *testing.T, dir string, cfg log.Config, size, total int) *log.Partition {
	t.Helper()
	ls := log.OpenStore(log.Options{Logger: zaptest.NewLogger(t)})
	t.Cleanup(func() { ls.Close() })
	lp, err := ls.OpenPartition(filepath.Join(dir, "t-0"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := 0, 0; n < total; i++ {
		b := batch(size, int64(i), byte(i))
		res, err := lp.Append(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := lp.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
		n += len(b)
	}
	return lp
}

// waitDownloadsDone waits until no chunk download is under way.
func waitDownloadsDone(t *testing.T, tier *Tier, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(time.Millisecond) {
		tier.mu.Lock()
		busy := len(tier.inflight)
		tier.mu.Unlock()
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("read-aheads never finished")
		}
	}
}

// TestNoWaitSmallCacheMakesProgress: with the smallest cache (two chunks)
// and batches spanning chunk boundaries, a no-wait catch-up reader still
// reads everything, without downloading the data over and over.
func TestNoWaitSmallCacheMakesProgress(t *testing.T) {
	// Batches of 3 MiB and change: many span an 8 MiB boundary.
	lp := bigPartition(t, t.TempDir(), log.Config{SegmentBytes: 30 << 20, MaxMessageBytes: 4 << 20, RetentionMs: -1}, 3<<20+12345, 50<<20)
	st := NewMemStore()
	tier := New(st, zaptest.NewLogger(t), 2*chunkSize)
	pk := PartitionKey{Topic: "t", Partition: 0}
	ctx := context.Background()
	if _, err := tier.Upload(ctx, pk, lp); err != nil {
		t.Fatal(err)
	}
	m, _ := tier.Manifest(ctx, pk)
	var tiered int64
	for _, s := range m.Segments {
		tiered += s.Size
	}
	var read int64
	readAllNoWait(t, tier, pk, m.Next(), 16<<20, func(r *ColdRead) { read += r.Len })
	if read != tiered {
		t.Fatalf("read %d bytes, %d tiered", read, tiered)
	}
	if d := tier.Stats().DownloadedBytes; d > 2*tiered {
		t.Fatalf("downloaded %d bytes to read %d: thrashing", d, tiered)
	}
}

// readAllNoWait reads pk from offset 0 to end as a fetch would (ReadNoWait
// of up to maxBytes, waiting out chunks not yet downloaded), handing each
// read to use before releasing it; it fails after 1000 reads.
func readAllNoWait(t *testing.T, tier *Tier, pk PartitionKey, end, maxBytes int64, use func(*ColdRead)) {
	t.Helper()
	ctx := context.Background()
	for off, steps := int64(0), 0; off < end; steps++ {
		if steps > 1000 {
			t.Fatalf("no progress: at offset %d of %d after %d reads", off, end, steps)
		}
		r, wait, err := tier.ReadNoWait(ctx, pk, off, maxBytes)
		if err != nil {
			t.Fatal(err)
		}
		if wait != nil {
			<-wait
			continue
		}
		use(r)
		off = r.Next
		r.Release()
	}
}

// TestLinkFileLeavesNoTemp: linking the same segment twice (a pass whose
// manifest did not commit, then a retry) leaves no hidden temporary link,
// and temporary names left by a crash are swept when the store opens.
func TestLinkFileLeavesNoTemp(t *testing.T) {
	root := filepath.Join(t.TempDir(), "tier")
	ld, err := NewLocalDir(root)
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "0.log")
	if err := os.WriteFile(src, []byte("sealed"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if err := ld.LinkFile(ctx, "t/0.log", src, 6); err != nil {
			t.Fatal(err)
		}
	}
	temps := func() []string {
		var out []string
		filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(de.Name(), tmpPrefix) {
				out = append(out, p)
			}
			return nil
		})
		return out
	}
	if tt := temps(); len(tt) != 0 {
		t.Fatalf("temporary links left: %v", tt)
	}
	// A crash between link and rename leaves one; opening sweeps it.
	if err := os.Link(src, filepath.Join(root, "t", tmpPrefix+"crash")); err != nil {
		t.Fatal(err)
	}
	if _, err := NewLocalDir(root); err != nil {
		t.Fatal(err)
	}
	if tt := temps(); len(tt) != 0 {
		t.Fatalf("temporary links survived the open: %v", tt)
	}
	if b, err := ld.GetRange(ctx, "t/0.log", 0, -1); err != nil || string(b) != "sealed" {
		t.Fatalf("object: %q %v", b, err)
	}
}

// TestFetchRateBoundsColdDownloads: with a cold-read rate, downloads wait
// their turn; nothing fails, and reading everything takes at least as long
// as the rate allows.
func TestFetchRateBoundsColdDownloads(t *testing.T) {
	f := newFixture(t)
	m := f.offload(60)
	var tiered int64
	for _, s := range m.Segments {
		tiered += s.Size
	}
	const bps = 100 << 10
	f.tier = New(f.store, zaptest.NewLogger(t), 1<<20)
	f.tier.SetFetchRate(bps)
	start := time.Now()
	f.readAll(0)
	if el, least := time.Since(start), time.Duration(tiered)*time.Second/bps; el < least*9/10 {
		t.Fatalf("read %d bytes cold in %v; the rate allows no less than %v", tiered, el, least)
	}
	if got := f.tier.Stats().DownloadedBytes; got < tiered {
		t.Fatalf("downloaded %d of %d bytes", got, tiered)
	}
}

// TestColdReadSurvivesABadIndex: a remote index whose entries (checksum and
// all) point into the middle of batches, at later batches than they claim,
// or into the last bytes of the object (short of a batch header), must not
// turn verified chunks into garbage or skip records: the first batch read
// from it fails its CRC or does not hold the offset, the index is dropped
// and the segment is walked from its start. Timestamp lookups, which start
// from the same index, find their batch too.
func TestColdReadSurvivesABadIndex(t *testing.T) {
	for _, bend := range []string{"inside", "later", "end"} {
		t.Run(bend, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			m := f.offload(60)
			const hdr = 48 // log's index header: magic, version, kind, fields, n, crc
			be := binary.BigEndian
			bent := 0
			for _, seg := range m.Segments {
				key := f.pk.segmentKey(seg.Base, ".index")
				idx, err := f.store.GetRange(ctx, key, 0, -1)
				if err != nil || len(idx) <= hdr {
					continue
				}
				obj, err := f.store.GetRange(ctx, f.pk.segmentKey(seg.Base, ".log"), 0, -1)
				if err != nil {
					t.Fatal(err)
				}
				for i, e := 0, idx[hdr:]; len(e) >= 8; i, e = i+1, e[8:] {
					pos := be.Uint32(e[4:])
					switch bend {
					case "inside":
						pos += 7
					case "later": // the next batch's start, still inside the object
						if next := pos + 12 + be.Uint32(obj[pos+8:]); int(next) < len(obj) {
							pos = next
						}
					case "end": // still increasing, as the index's own check wants
						pos = uint32(len(obj) - 30 + i)
					}
					be.PutUint32(e[4:], pos)
					bent++
				}
				table := crc32.MakeTable(crc32.Castagnoli)
				be.PutUint32(idx[44:], crc32.Update(crc32.Checksum(idx[:44], table), table, idx[hdr:]))
				f.store.Put(ctx, key, bytes.NewReader(idx), int64(len(idx)))
			}
			if bent == 0 {
				t.Fatal("no index entries to bend")
			}
			f.tier = New(f.store, zaptest.NewLogger(t), 1<<20)
			// Every offset read on its own, so each read starts from an
			// index lookup.
			for off := m.LogStartOffset; off < m.Next(); off++ {
				got, _, err := f.tier.Read(ctx, f.pk, off, 1)
				if err != nil {
					t.Fatalf("read %d: %v", off, err)
				}
				h, err := log.ParseBatchHeader(got)
				if err != nil || h.BaseOffset > off || h.LastOffset() < off || !bytes.Equal(got, f.want[h.BaseOffset]) {
					t.Fatalf("read %d: wrong batch (header %+v, err %v)", off, h, err)
				}
			}
			f.tier = New(f.store, zaptest.NewLogger(t), 1<<20)
			for off := m.LogStartOffset; off < m.Next(); off++ {
				ts := 1000 + off // offload: batch i has timestamp 1000+i
				got, err := f.tier.BatchForTimestamp(ctx, f.pk, ts)
				if err != nil {
					t.Fatalf("timestamp %d: %v", ts, err)
				}
				if !bytes.Equal(got, f.want[off]) {
					t.Fatalf("timestamp %d: not batch %d", ts, off)
				}
			}
		})
	}
}

// TestCacheEvictsWhatIsOnDiskFirst: when memory is full, a chunk already on
// the disk level is dropped before one that would have to be written there.
func TestCacheEvictsWhatIsOnDiskFirst(t *testing.T) {
	c := newChunkCache(2 * chunkSize)
	if err := c.setDisk(t.TempDir(), 1<<30); err != nil {
		t.Fatal(err)
	}
	put := func(ci int64) {
		buf := getChunkBuf()
		(*buf)[0] = byte(ci)
		c.put("k", ci, buf, chunkSize, true, crc32.Checksum((*buf)[:chunkSize], castagnoli), false)
	}
	inMem := func(ci int64) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.byKey[chunkID{"k", ci}] != nil
	}
	put(0)
	put(1)
	put(2) // evicts 0, which is spilled
	e := c.get("k", 0)
	if e == nil || e.data[0] != 0 {
		t.Fatal("chunk 0 not back from the disk level")
	}
	c.release(e) // loading 0 evicted 1 (spilled too): memory holds 2 and 0
	e = c.get("k", 1)
	if e == nil || e.data[0] != 1 {
		t.Fatal("chunk 1 not back from the disk level")
	}
	c.release(e)
	// Loading 1 had to evict 2 (least recent, not on disk) or 0 (on disk).
	if !inMem(2) || inMem(0) {
		t.Fatalf("evicted the chunk that needed a write: in memory 0=%v 2=%v", inMem(0), inMem(2))
	}
	if files, _ := filepath.Glob(filepath.Join(c.dir, "*")); len(files) != 2 {
		t.Fatalf("%d spill files, want 2 (chunks 0 and 1)", len(files))
	}
}

// TestReadAheadCrossesSegments: a read that ends in a segment's last chunk
// starts the read-ahead's chunks in the segments after it (small segments
// read as far ahead as large ones), and no further.
func TestReadAheadCrossesSegments(t *testing.T) {
	f := newFixture(t)
	f.tier = New(f.store, zaptest.NewLogger(t), 8*chunkSize) // room for the read-ahead
	m := f.offload(80)
	if len(m.Segments) < readAhead+3 {
		t.Fatalf("%d segments", len(m.Segments))
	}
	var mu sync.Mutex
	got := map[string]bool{}
	f.store.SetFault(func(op, key string) error {
		if op == "get" && strings.HasSuffix(key, ".log") {
			mu.Lock()
			got[key] = true
			mu.Unlock()
		}
		return nil
	})
	readWhenReady(t, f.tier, f.pk, 0, 1, 100).Release()
	want := map[string]bool{}
	for i := 0; i <= readAhead; i++ { // segment 0 and the next readAhead (one chunk each)
		want[segmentObject(f.pk, &m.Segments[i]).key] = true
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := 0
		for k := range want {
			if got[k] {
				n++
			}
		}
		mu.Unlock()
		if n == len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("read-ahead fetched %v, want %v", got, want)
		}
	}
	time.Sleep(50 * time.Millisecond) // anything beyond would have started by now
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("read-ahead fetched %d objects, want %d: %v", len(got), len(want), got)
	}
}

// TestReadAheadBringsBackDiskChunks: on a second catch-up pass, the
// read-ahead brings chunks from the disk level back into memory in the
// background (no download, no miss counted), every chunk reference is
// released afterwards, and the bytes are the same.
func TestReadAheadBringsBackDiskChunks(t *testing.T) {
	dir := t.TempDir()
	// One sealed segment of 9-10 chunks.
	lp := bigPartition(t, dir, log.Config{SegmentBytes: 80 << 20, MaxMessageBytes: 4 << 20, RetentionMs: -1}, 2<<20+777, 90<<20)
	tier := New(NewMemStore(), zaptest.NewLogger(t), 4*chunkSize) // read-ahead of 2
	if err := tier.SetDiskCache(filepath.Join(dir, "cache"), 1<<30); err != nil {
		t.Fatal(err)
	}
	pk := PartitionKey{Topic: "t", Partition: 0}
	ctx := context.Background()
	if _, err := tier.Upload(ctx, pk, lp); err != nil {
		t.Fatal(err)
	}
	m, _ := tier.Manifest(ctx, pk)
	if len(m.Segments) != 1 {
		t.Fatalf("%d segments", len(m.Segments))
	}
	pass := func() []byte {
		var all []byte
		readAllNoWait(t, tier, pk, m.Next(), 1<<20, func(r *ColdRead) { all = append(all, r.Bytes()...) })
		return all
	}
	first := pass()
	key := segmentObject(pk, &m.Segments[0]).key
	if tier.cache.inMemory(key, 0) || tier.cache.inMemory(key, 1) || tier.cache.inMemory(key, 2) {
		t.Fatal("the first chunks are still in memory after a pass over 9: nothing to bring back")
	}
	st := tier.Stats()
	r, wait, err := tier.ReadNoWait(ctx, pk, 0, 1)
	if err != nil || wait != nil {
		t.Fatalf("chunk 0 from the disk level: wait %v, %v", wait, err)
	}
	r.Release()
	for deadline := time.Now().Add(5 * time.Second); !tier.cache.inMemory(key, 1) || !tier.cache.inMemory(key, 2); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("read-ahead did not bring chunks 1 and 2 back into memory: %v %v %v %+v", tier.cache.inMemory(key, 0), tier.cache.inMemory(key, 1), tier.cache.inMemory(key, 2), tier.Stats())
		}
	}
	if st2 := tier.Stats(); st2.DownloadedBytes != st.DownloadedBytes || st2.CacheMisses != st.CacheMisses {
		t.Fatalf("bringing chunks back: %+v then %+v (downloads or misses)", st, st2)
	}
	if second := pass(); !bytes.Equal(first, second) {
		t.Fatal("second pass read different bytes")
	}
	if st3 := tier.Stats(); st3.DownloadedBytes != st.DownloadedBytes {
		t.Fatalf("second pass downloaded %d bytes", st3.DownloadedBytes-st.DownloadedBytes)
	}
	waitDownloadsDone(t, tier, 5*time.Second)
	tier.cache.mu.Lock()
	defer tier.cache.mu.Unlock()
	for el := tier.cache.lru.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*chunkEntry); e.refs != 0 {
			t.Fatalf("chunk %d still held %d times", e.id.ci, e.refs)
		}
	}
}

// TestDemandedChunkGoesFirstUnderTheRate: at a low cold-read rate, a chunk a
// read waits for is downloaded ahead of read-aheads already under way (they
// yield the rate to it after their current step), not in turn with them.
func TestDemandedChunkGoesFirstUnderTheRate(t *testing.T) {
	// 48 batches of 200 KiB: segments of 1 MiB, 5 batches each.
	lp := bigPartition(t, t.TempDir(), log.Config{SegmentBytes: 1 << 20, RetentionMs: -1}, 200<<10, 48*(200<<10))
	tier := New(NewMemStore(), zaptest.NewLogger(t), 8*chunkSize)
	pk := PartitionKey{Topic: "t", Partition: 0}
	ctx := context.Background()
	if _, err := tier.Upload(ctx, pk, lp); err != nil {
		t.Fatal(err)
	}
	m, _ := tier.Manifest(ctx, pk)
	if len(m.Segments) < 8 {
		t.Fatalf("%d segments", len(m.Segments))
	}
	tier.index(ctx, pk, &m.Segments[7]) // not part of what is timed
	// 5 read-aheads and then the demanded chunk, 1 MiB each: 24 steps of
	// 256 KiB at 4 MiB/s. Demanded first: it is done after about 9 (one
	// more per read-ahead, then its own 4); in turn with them, after 24.
	tier.SetFetchRate(4 << 20)
	start := time.Now()
	for i := 1; i <= 5; i++ {
		tier.prefetch(segmentObject(pk, &m.Segments[i]), 0)
	}
	r, wait, err := tier.ReadNoWait(ctx, pk, m.Segments[7].Base, 1)
	if err != nil || wait == nil {
		r.Release()
		t.Fatalf("segment 7 was not downloading: %v", err)
	}
	<-wait
	demanded := time.Since(start)
	waitDownloadsDone(t, tier, 10*time.Second)
	all := time.Since(start)
	t.Logf("demanded after %v of %v", demanded, all)
	if demanded > all*6/10 {
		t.Fatalf("the demanded chunk took %v of the %v all six downloads took: it waited its turn", demanded, all)
	}
	if r, wait, err := tier.ReadNoWait(ctx, pk, m.Segments[7].Base, 1); err != nil || wait != nil || r.Len == 0 {
		t.Fatalf("segment 7 after its download: wait %v, %v", wait, err)
	} else {
		r.Release()
	}
}

// TestUploadAfterDeleteRecordsAcrossAGap: DeleteRecords removes local
// segments that were never uploaded, leaving a gap between the bucket's log
// and the next local segment. The gap is below the log start, so the
// bucket's old segments go (manifest first, then their objects) and uploads
// go on from the next local segment instead of failing for ever.
func TestUploadAfterDeleteRecordsAcrossAGap(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	m := f.offload(30)
	if len(m.Segments) < 2 {
		t.Fatalf("want a few uploaded segments, got %d", len(m.Segments))
	}
	old := m.Segments
	f.produce(40, 5000) // sealed segments the bucket does not have yet
	sealed := f.lp.SealedSegments()
	var pending []log.SegmentInfo
	for _, s := range sealed {
		if s.Base >= m.Next() {
			pending = append(pending, s)
		}
	}
	if len(pending) < 2 {
		t.Fatalf("want at least 2 sealed segments past the bucket's log, got %d", len(pending))
	}
	cut := pending[1].Base + 1 // inside the second: the first goes entirely
	if _, err := f.lp.DeleteRecordsBefore(cut); err != nil {
		t.Fatal(err)
	}
	if got := f.lp.SealedSegments(); len(got) > 0 && got[0].Base == pending[0].Base {
		t.Fatalf("DeleteRecords kept the local segment at %d", got[0].Base)
	}
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		t.Fatalf("upload after DeleteRecords across a gap: %v", err)
	}
	m2, err := f.tier.Manifest(ctx, f.pk)
	if err != nil {
		t.Fatal(err)
	}
	if len(m2.Segments) == 0 || m2.Segments[0].Base != pending[1].Base || m2.LogStartOffset != cut {
		t.Fatalf("manifest after the gap: %+v (want it to start with segment %d, log start %d)", m2, pending[1].Base, cut)
	}
	for _, s := range old {
		if _, err := f.store.GetRange(ctx, f.pk.segmentKey(s.Base, ".log"), 0, 1); !errors.Is(err, ErrNotFound) {
			t.Fatalf("object of segment %d below the log start still there: %v", s.Base, err)
		}
	}
	if _, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	f.readAll(cut)
}

// TestReadAheadOnlyForReadersGoingOn: a reader that seeks into the middle of
// a tiered segment and reads one batch downloads only the chunk holding it;
// when it reads on from where it stopped, the read-ahead starts.
func TestReadAheadOnlyForReadersGoingOn(t *testing.T) {
	dir := t.TempDir()
	// One sealed segment of about 10 chunks, batches of 1 MiB and change.
	lp := bigPartition(t, dir, log.Config{SegmentBytes: 80 << 20, MaxMessageBytes: 4 << 20, RetentionMs: -1}, 1<<20+333, 90<<20)
	st := NewMemStore()
	tier := New(st, zaptest.NewLogger(t), 10*chunkSize)
	pk := PartitionKey{Topic: "t", Partition: 0}
	ctx := context.Background()
	if _, err := tier.Upload(ctx, pk, lp); err != nil {
		t.Fatal(err)
	}
	gets := countLogGets(st)
	read := func(offset int64) int64 {
		t.Helper()
		r := readWhenReady(t, tier, pk, offset, 1, 100)
		defer r.Release()
		return r.Next
	}
	next := read(40) // about 40 MiB in: chunk 5
	waitDownloadsDone(t, tier, 5*time.Second)
	time.Sleep(20 * time.Millisecond)
	if n := gets.Load(); n != 1 {
		t.Fatalf("a one-batch read in the middle made %d chunk GETs, want 1", n)
	}
	read(next) // going on: read-ahead
	waitDownloadsDone(t, tier, 5*time.Second)
	if n := gets.Load(); n < 1+readAhead {
		t.Fatalf("a reader going on made %d chunk GETs in all, want the read-ahead (%d more)", n, readAhead)
	}
}

// TestDownloadSlotsBoundDownloads: however many readers start cold reads
// at once, at most downloadSlots chunk downloads are under way, and all of
// them complete.
func TestDownloadSlotsBoundDownloads(t *testing.T) {
	f := newFixture(t)
	f.tier = New(f.store, zaptest.NewLogger(t), 64*chunkSize)
	ctx := context.Background()
	m := f.offload(400) // many one-chunk segments
	if len(m.Segments) < 2*downloadSlots {
		t.Fatalf("%d segments", len(m.Segments))
	}
	var now, peak atomic.Int64
	f.store.SetFault(func(op, key string) error {
		if op == "get" && strings.HasSuffix(key, ".log") {
			n := now.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(20 * time.Millisecond)
			now.Add(-1)
		}
		return nil
	})
	var waits []<-chan struct{}
	for _, s := range m.Segments {
		r, wait, err := f.tier.ReadNoWait(ctx, f.pk, s.Base, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r != nil {
			r.Release()
		}
		if wait != nil {
			waits = append(waits, wait)
		}
	}
	for _, w := range waits {
		select {
		case <-w:
		case <-time.After(10 * time.Second):
			t.Fatal("a download never finished")
		}
	}
	waitDownloadsDone(t, f.tier, 10*time.Second)
	if p := peak.Load(); p > downloadSlots || p < 2 {
		t.Fatalf("peak of %d downloads at once, want 2..%d", p, downloadSlots)
	}
}

// TestBatchForTimestampUsesTheTimeIndex: a timestamp lookup in the bucket
// starts from the segment's remote time index, so it downloads the chunk
// holding the batch (and the one before it at most), not the segment up to
// there; the answers are the same as a walk from the start, and a time
// index that is not ours falls back to that walk.
func TestBatchForTimestampUsesTheTimeIndex(t *testing.T) {
	dir := t.TempDir()
	// One sealed segment of about 10 chunks; batch i has timestamp i.
	lp := bigPartition(t, dir, log.Config{SegmentBytes: 80 << 20, MaxMessageBytes: 4 << 20, RetentionMs: -1, IndexIntervalBytes: 4096}, 1<<20+333, 90<<20)
	st := NewMemStore()
	pk := PartitionKey{Topic: "t", Partition: 0}
	ctx := context.Background()
	if _, err := New(st, zaptest.NewLogger(t), 0).Upload(ctx, pk, lp); err != nil {
		t.Fatal(err)
	}
	gets := countLogGets(st)
	for _, ts := range []int64{0, 1, 40, 63, 70} {
		tier := New(st, zaptest.NewLogger(t), 16*chunkSize) // cold cache each time
		gets.Store(0)
		b, err := tier.BatchForTimestamp(ctx, pk, ts)
		if err != nil {
			t.Fatal(err)
		}
		h, err := log.ParseBatchHeader(b)
		if err != nil || h.BaseOffset != ts || h.MaxTimestamp != ts {
			t.Fatalf("ts %d: batch %d (max ts %d), %v", ts, h.BaseOffset, h.MaxTimestamp, err)
		}
		if n := gets.Load(); n > 2 {
			t.Fatalf("ts %d: %d chunk GETs, want at most 2", ts, n)
		}
	}
	// A time index that does not decode: the walk from the start.
	m, _ := New(st, nil, 0).Manifest(ctx, pk)
	key := pk.segmentKey(m.Segments[0].Base, ".timeindex")
	if err := st.Put(ctx, key, bytes.NewReader([]byte("not an index")), 12); err != nil {
		t.Fatal(err)
	}
	b, err := New(st, zaptest.NewLogger(t), 16*chunkSize).BatchForTimestamp(ctx, pk, 63)
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := log.ParseBatchHeader(b); h.BaseOffset != 63 {
		t.Fatalf("without a time index: batch %d, want 63", h.BaseOffset)
	}
	if b, err := New(st, nil, 16*chunkSize).BatchForTimestamp(ctx, pk, 1<<40); err != nil || b != nil {
		t.Fatalf("past every timestamp: %d bytes, %v", len(b), err)
	}
}

// TestNoWaitReadNeverWaitsForTheBucket: a no-wait read whose manifest,
// remote index or chunk is not cached returns at once with a channel to
// wait on (the bucket answering slowly for all of them), and reads the
// data once they are loaded.
func TestNoWaitReadNeverWaitsForTheBucket(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	m := f.offload(60)
	seg := m.Segments[len(m.Segments)/2]
	var slow atomic.Bool
	f.store.SetFault(func(op, key string) error {
		if op == "get" && slow.Load() {
			time.Sleep(300 * time.Millisecond)
		}
		return nil
	})
	slow.Store(true)
	tier := New(f.store, zaptest.NewLogger(t), 1<<20) // nothing cached: not even the manifest
	offset := seg.Base + 2                            // past the segment's first batch: its index is needed
	waits := 0
	for {
		start := time.Now()
		r, wait, err := tier.ReadNoWait(ctx, f.pk, offset, 1)
		if took := time.Since(start); took > 100*time.Millisecond {
			t.Fatalf("no-wait read %d took %v", waits, took)
		}
		if err != nil {
			t.Fatal(err)
		}
		if wait == nil {
			if r == nil || r.Len == 0 {
				t.Fatal("nothing read")
			}
			h, _ := log.ParseBatchHeader(r.Bytes())
			r.Release()
			if h.BaseOffset != offset {
				t.Fatalf("read batch %d, want %d", h.BaseOffset, offset)
			}
			break
		}
		waits++
		if waits > 10 {
			t.Fatal("never ready")
		}
		<-wait
	}
	if waits < 3 {
		t.Fatalf("waited %d times, want 3 (manifest, index, chunk)", waits)
	}
}

// TestRetentionMsAndDeleteRecordsAcrossTiers: retention.ms drops the
// uploaded segments whose newest batch is older than it (manifest first,
// then the log start, then the objects), and DeleteRecords to an offset
// that only the bucket holds moves the log start there and drops the
// segments wholly below it; reads from the new start are byte-exact.
func TestRetentionMsAndDeleteRecordsAcrossTiers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	now := time.Now()
	f.produce(30, now.Add(-48*time.Hour).UnixMilli()) // old
	f.produce(60, now.Add(-time.Minute).UnixMilli())  // recent
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		t.Fatal(err)
	}
	if _, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, now); err != nil {
		t.Fatal(err)
	}
	m, _ := f.tier.Manifest(ctx, f.pk)
	if err := f.tier.ApplyRetention(ctx, f.pk, f.lp, -1, (24 * time.Hour).Milliseconds(), now); err != nil {
		t.Fatal(err)
	}
	m2, _ := f.tier.Manifest(ctx, f.pk)
	if m2.LogStartOffset == 0 || m2.LogStartOffset > 30 || f.lp.LogStartOffset() != m2.LogStartOffset {
		t.Fatalf("retention.ms: log start %d (local %d), want the start of the first segment with a recent batch", m2.LogStartOffset, f.lp.LogStartOffset())
	}
	for _, s := range m.Segments {
		_, err := f.store.GetRange(ctx, f.pk.segmentKey(s.Base, ".log"), 0, 1)
		if gone := errors.Is(err, ErrNotFound); gone != (s.Next <= m2.LogStartOffset) {
			t.Fatalf("segment [%d,%d) with log start %d: object gone %v", s.Base, s.Next, m2.LogStartOffset, gone)
		}
	}
	f.readAll(m2.LogStartOffset)

	// DeleteRecords to an offset inside a segment only the bucket has.
	if f.lp.LocalStartOffset() <= 45 {
		t.Fatalf("offset 45 is local (local start %d)", f.lp.LocalStartOffset())
	}
	if _, err := f.lp.DeleteRecordsBefore(45); err != nil {
		t.Fatal(err)
	}
	if err := f.tier.ApplyRetention(ctx, f.pk, f.lp, -1, -1, now); err != nil {
		t.Fatal(err)
	}
	m3, _ := f.tier.Manifest(ctx, f.pk)
	if m3.LogStartOffset != 45 || len(m3.Segments) == 0 || m3.Segments[0].Base > 45 || m3.Segments[0].Next <= 45 {
		t.Fatalf("after DeleteRecords(45): %+v", m3)
	}
	if _, _, err := f.tier.Read(ctx, f.pk, 10, 1000); err != nil {
		t.Fatalf("read below the new log start: %v", err) // clamped to the log start, as the broker answers
	}
	f.readAll(45)
}

// TestNoWaitReadWithoutARemoteIndex: a segment whose remote index is
// missing is read by scanning it, and the missing index leaves no error
// behind for later reads to trip over (nor fills the bounded error table).
func TestNoWaitReadWithoutARemoteIndex(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	m := f.offload(60)
	seg := m.Segments[len(m.Segments)/2]
	if err := f.store.Delete(ctx, f.pk.segmentKey(seg.Base, ".index")); err != nil {
		t.Fatal(err)
	}
	tier := New(f.store, zaptest.NewLogger(t), 1<<20)
	offset := seg.Base + 2
	r := readWhenReady(t, tier, f.pk, offset, 1, 12)
	h, _ := log.ParseBatchHeader(r.Bytes())
	r.Release()
	if h.BaseOffset != offset {
		t.Fatalf("read batch %d, want %d", h.BaseOffset, offset)
	}
	tier.mu.Lock()
	defer tier.mu.Unlock()
	if len(tier.failed) != 0 {
		t.Fatalf("errors left behind: %v", tier.failed)
	}
}

// countLogGets makes st count its GETs of segment (.log) objects.
func countLogGets(st *MemStore) *atomic.Int64 {
	var n atomic.Int64
	st.SetFault(func(op, key string) error {
		if op == "get" && strings.HasSuffix(key, ".log") {
			n.Add(1)
		}
		return nil
	})
	return &n
}

// readWhenReady is a no-wait read of pk at offset that waits out chunks (or
// a manifest or index) still loading, failing t after tries reads; the
// caller releases the result.
func readWhenReady(t *testing.T, tier *Tier, pk PartitionKey, offset, maxBytes int64, tries int) *ColdRead {
	t.Helper()
	for i := 0; i < tries; i++ {
		r, wait, err := tier.ReadNoWait(context.Background(), pk, offset, maxBytes)
		if err != nil {
			t.Fatal(err)
		}
		if wait == nil {
			return r
		}
		<-wait
	}
	t.Fatal("read never became ready")
	return nil
}

// TestManifestsThatAreNotThisLogs: a manifest with impossible fields does
// not decode; one that decodes but does not describe the local log (another
// broker's, one from before the local log was lost) neither stops local
// data from being kept nor lets any of it go: Upload refuses, ReleaseLocal
// releases nothing, and every record stays readable. A manifest naming
// offsets its objects do not hold makes a read fail rather than answer
// nothing for ever.
func TestManifestsThatAreNotThisLogs(t *testing.T) {
	for _, bad := range []string{
		`{"version":1,"log_start_offset":0,"segments":[{"base":5,"next":5,"size":10}]}`,
		`{"version":1,"log_start_offset":0,"segments":[{"base":0,"next":5,"size":0}]}`,
		`{"version":1,"log_start_offset":0,"segments":[{"base":-3,"next":5,"size":10}]}`,
		`{"version":1,"log_start_offset":-1,"segments":[]}`,
		`{"version":1,"log_start_offset":0,"segments":[{"base":0,"next":5,"size":10},{"base":6,"next":9,"size":10}]}`,
	} {
		if _, err := decodeManifest([]byte(bad)); err == nil {
			t.Errorf("decoded %s", bad)
		}
	}

	ctx := context.Background()
	for _, foreign := range []string{
		`{"version":1,"log_start_offset":1000000,"segments":[]}`,
		`{"version":1,"log_start_offset":0,"segments":[{"base":0,"next":1000000,"size":5000}]}`,
	} {
		f := newFixture(t)
		f.produce(60, 1000)
		sealed := len(f.lp.SealedSegments())
		if err := f.store.Put(ctx, f.pk.manifestKey(), strings.NewReader(foreign), int64(len(foreign))); err != nil {
			t.Fatal(err)
		}
		if n, err := f.tier.Upload(ctx, f.pk, f.lp); err == nil {
			t.Errorf("%s: upload of %d segments against it, no error", foreign, n)
		}
		if n, err := f.tier.ReleaseLocal(ctx, f.pk, f.lp, 0, -1, time.Now()); n != 0 || len(f.lp.SealedSegments()) != sealed {
			t.Fatalf("%s: released %d local segments (%v)", foreign, n, err)
		}
		f.readAll(0)
	}

	f := newFixture(t)
	m := f.offload(60)
	last := &m.Segments[len(m.Segments)-1]
	end := last.Next
	last.Next += 5 // offsets no object holds
	if err := f.tier.commit(ctx, f.pk, m); err != nil {
		t.Fatal(err)
	}
	f.tier = New(f.store, zaptest.NewLogger(t), 1<<20)
	if b, _, err := f.tier.Read(ctx, f.pk, end+2, 10000); err == nil {
		t.Fatalf("read of an offset the objects do not hold: %d bytes, no error", len(b))
	}
}

// TestNothingWrittenTooLargeToReadBack: metadata and manifests over the
// whole-object read bound are refused when written, not found unreadable
// at a restore.
func TestNothingWrittenTooLargeToReadBack(t *testing.T) {
	defer func(m int64) { maxWholeObject = m }(maxWholeObject)
	maxWholeObject = 1 << 10
	ctx := context.Background()
	f := newFixture(t)
	if err := f.tier.PutMeta(ctx, "_synapse/x.json", make([]byte, 2<<10)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("2 KiB of metadata under a 1 KiB bound: %v", err)
	}
	if err := f.tier.PutMeta(ctx, "_synapse/x.json", make([]byte, 1<<10)); err != nil {
		t.Fatal(err)
	}
	m := &Manifest{}
	for i := int64(0); i < 20; i++ {
		m.Segments = append(m.Segments, SegmentMeta{Base: i * 10, Next: i*10 + 10, Size: 100})
	}
	if err := f.tier.commit(ctx, f.pk, m); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("manifest over the bound: %v", err)
	}
}

// lostAnswerStore stores every Put but, while lose is set, answers a
// manifest's Put with an error (an answer lost after the write).
type lostAnswerStore struct {
	*MemStore
	lose atomic.Bool
}

func (s *lostAnswerStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	err := s.MemStore.Put(ctx, key, r, size)
	if err == nil && s.lose.Load() && strings.HasSuffix(key, "manifest.json") {
		return errors.New("injected: the answer was lost")
	}
	return err
}

// TestManifestAfterAnUncertainCommit: a manifest write that fails may have
// been stored all the same, so the cached manifest is dropped and the next
// reader loads what the bucket holds (an orphan sweep against the stale
// cached one deleted the objects the bucket's manifest names).
func TestManifestAfterAnUncertainCommit(t *testing.T) {
	f := newFixture(t)
	st := &lostAnswerStore{MemStore: f.store}
	f.tier = New(st, zaptest.NewLogger(t), 1<<20)
	ctx := context.Background()
	f.produce(20, 1000)
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err != nil {
		t.Fatal(err)
	}
	before, _ := f.tier.Manifest(ctx, f.pk)
	f.produce(20, 2000)
	st.lose.Store(true)
	if _, err := f.tier.Upload(ctx, f.pk, f.lp); err == nil {
		t.Fatal("upload with its manifest answer lost: no error")
	}
	st.lose.Store(false)
	m, err := f.tier.Manifest(ctx, f.pk)
	if err != nil {
		t.Fatal(err)
	}
	if m.Next() <= before.Next() {
		t.Fatalf("manifest ends at %d, as before the commit (%d); the bucket's is further", m.Next(), before.Next())
	}
	if n, err := f.tier.CleanOrphans(ctx, f.pk); err != nil || n != 0 {
		t.Fatalf("orphan sweep after the uncertain commit deleted %d objects (%v)", n, err)
	}
}
