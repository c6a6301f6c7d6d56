package log

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/synapsebroker/synapse/internal/memfs"
)

// appendSynced appends n random batches and waits for them to be durable;
// it returns their stored bytes keyed by base offset.
func appendSynced(t *testing.T, p *Partition, rng *rand.Rand, n int, want map[int64][]byte) {
	t.Helper()
	for range n {
		b := randBatch(rng, time.Now().UnixMilli(), 300)
		res, err := p.Append(b)
		if err != nil {
			t.Fatal(err)
		}
		want[res.BaseOffset] = storedCopy(b, res.BaseOffset)
		if err := p.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReplicatedHighWatermarkFollowsCommit(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 4096})
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[int64][]byte{}
	appendSynced(t, p, rng, 10, want)
	if err := p.SetReplicated(0); err != nil {
		t.Fatal(err)
	}
	if hw := p.HighWatermark(); hw != 0 {
		t.Fatalf("high watermark %d after SetReplicated(0), want 0", hw)
	}
	res, err := p.Read(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes != 0 {
		t.Fatalf("read %d bytes above the committed offset", res.Bytes)
	}
	res.Release()
	res, err = p.ReadReplica(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes == 0 || res.HighWatermark != 0 {
		t.Fatalf("replica read: %d bytes, high watermark %d; want data and 0", res.Bytes, res.HighWatermark)
	}
	res.Release()
	// Commit to a batch boundary in the middle.
	var mid int64
	for off := range want {
		if off > mid && off < p.LogEndOffset()/2+1 {
			mid = off
		}
	}
	if err := p.Commit(mid); err != nil {
		t.Fatal(err)
	}
	if hw := p.HighWatermark(); hw != mid {
		t.Fatalf("high watermark %d, want %d", hw, mid)
	}
	// More appends do not move the high watermark; a commit past the
	// durable end stops at it.
	appendSynced(t, p, rng, 5, want)
	if hw := p.HighWatermark(); hw != mid {
		t.Fatalf("high watermark moved to %d on append", hw)
	}
	if err := p.Commit(p.LogEndOffset() + 100); err != nil {
		t.Fatal(err)
	}
	if hw := p.HighWatermark(); hw != p.LogEndOffset() {
		t.Fatalf("high watermark %d, want the log end %d", hw, p.LogEndOffset())
	}
	readAll(t, p, rng, want)
}

func TestTruncateTo(t *testing.T) {
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 2048})
	rng := rand.New(rand.NewPCG(3, 4))
	want := map[int64][]byte{}
	appendSynced(t, p, rng, 40, want)
	if p.SegmentCount() < 4 {
		t.Fatalf("want several segments, have %d", p.SegmentCount())
	}
	if err := p.SetReplicated(0); err != nil {
		t.Fatal(err)
	}
	// Commit up to a boundary a quarter in; cut in the middle of a batch
	// half way; truncation below the commit is refused.
	var bases []int64
	for off := range want {
		bases = append(bases, off)
	}
	slices.Sort(bases)
	commit := bases[len(bases)/4]
	if err := p.Commit(commit); err != nil {
		t.Fatal(err)
	}
	if _, err := p.TruncateTo(commit - 1); !errors.Is(err, ErrBelowHighWatermark) {
		t.Fatalf("truncate below the high watermark: %v", err)
	}
	cutBase := bases[len(bases)/2]
	leo, err := p.TruncateTo(cutBase + 1) // inside the batch at cutBase (or at the next one)
	if err != nil {
		t.Fatal(err)
	}
	wantEnd := cutBase
	if storedNext(t, want[cutBase]) <= cutBase+1 {
		wantEnd = storedNext(t, want[cutBase])
	}
	if leo != wantEnd || p.LogEndOffset() != wantEnd || p.DurableEnd() != wantEnd {
		t.Fatalf("after truncate: returned %d, log end %d, durable %d; want %d", leo, p.LogEndOffset(), p.DurableEnd(), wantEnd)
	}
	for off := range want {
		if off >= wantEnd {
			delete(want, off)
		}
	}
	// Appends continue at the new end; everything reads back, and again
	// after a crash (memfs drops what was not synced) and reopen.
	appendSynced(t, p, rng, 10, want)
	if err := p.Commit(p.LogEndOffset()); err != nil {
		t.Fatal(err)
	}
	readAll(t, p, rng, want)
	clone := memFS{mfs.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	s2 := openStore(t, clone, 0)
	p2 := mustOpen(t, s2, "/data/t-0", Config{SegmentBytes: 2048})
	if p2.LogEndOffset() != p.LogEndOffset() {
		t.Fatalf("reopened log end %d, want %d", p2.LogEndOffset(), p.LogEndOffset())
	}
	readAll(t, p2, rng, want)
	// A cut at a segment boundary and down to the commit point.
	if err := p2.SetReplicated(commit); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.TruncateTo(commit); err != nil {
		t.Fatal(err)
	}
	if p2.LogEndOffset() != commit {
		t.Fatalf("log end %d, want %d", p2.LogEndOffset(), commit)
	}
	for off := range want {
		if off >= commit {
			delete(want, off)
		}
	}
	appendSynced(t, p2, rng, 3, want)
	if err := p2.Commit(p2.LogEndOffset()); err != nil {
		t.Fatal(err)
	}
	readAll(t, p2, rng, want)
}

func storedNext(t *testing.T, b []byte) int64 {
	h, err := ParseBatchHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	return h.NextOffset()
}

func TestCommitRoundsDownToABatch(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{})
	rng := rand.New(rand.NewPCG(5, 6))
	want := map[int64][]byte{}
	appendSynced(t, p, rng, 6, want)
	if err := p.SetReplicated(0); err != nil {
		t.Fatal(err)
	}
	var bases []int64
	for off := range want {
		bases = append(bases, off)
	}
	slices.Sort(bases)
	// Inside the third batch (when it holds more than one record): the
	// high watermark stops at its start, so the batch is not half visible.
	b := bases[2]
	mid := b + 1
	if storedNext(t, want[b]) == b+1 {
		mid = b // a one-record batch: its start is the boundary
	}
	if err := p.Commit(mid); err != nil {
		t.Fatal(err)
	}
	if hw := p.HighWatermark(); hw != b {
		t.Fatalf("high watermark %d after Commit(%d), want the batch start %d", hw, mid, b)
	}
	res, err := p.Read(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if res.NextOffset != b {
		t.Fatalf("read ends at %d, want %d", res.NextOffset, b)
	}
	res.Release()
}

func TestResetTo(t *testing.T) {
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 2048})
	rng := rand.New(rand.NewPCG(7, 8))
	appendSynced(t, p, rng, 20, map[int64][]byte{})
	if err := p.SetReplicated(0); err != nil {
		t.Fatal(err)
	}
	leo := p.LogEndOffset()
	before := p.Truncations()
	if err := p.ResetTo(leo - 1); err == nil {
		t.Fatal("reset below the log end accepted")
	}
	if err := p.ResetTo(leo + 100); err != nil {
		t.Fatal(err)
	}
	if p.LogStartOffset() != leo+100 || p.LogEndOffset() != leo+100 || p.HighWatermark() != leo+100 || p.Truncations() == before {
		t.Fatalf("after reset: start %d end %d hw %d truncations %d", p.LogStartOffset(), p.LogEndOffset(), p.HighWatermark(), p.Truncations())
	}
	want := map[int64][]byte{}
	appendSynced(t, p, rng, 3, want)
	if err := p.Commit(p.LogEndOffset()); err != nil {
		t.Fatal(err)
	}
	readAll(t, p, rng, want)
	clone := memFS{mfs.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	p2 := mustOpen(t, openStore(t, clone, 0), "/data/t-0", Config{SegmentBytes: 2048})
	if p2.LogStartOffset() != leo+100 || p2.LogEndOffset() != p.LogEndOffset() {
		t.Fatalf("reopened: start %d end %d, want %d and %d", p2.LogStartOffset(), p2.LogEndOffset(), leo+100, p.LogEndOffset())
	}
	readAll(t, p2, rng, want)
}

// TestWipe: a removed replica's log goes back to empty at offset 0,
// cleaner checkpoint and all, and a crash after it reopens it so.
func TestWipe(t *testing.T) {
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 2048})
	rng := rand.New(rand.NewPCG(9, 10))
	appendSynced(t, p, rng, 20, map[int64][]byte{})
	if err := p.SetReplicated(0); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(p.LogEndOffset()); err != nil {
		t.Fatal(err)
	}
	if err := p.writeCleanerCheckpoint(p.LogEndOffset(), p.LogEndOffset()); err != nil {
		t.Fatal(err)
	}
	before := p.Truncations()
	if err := p.Wipe(); err != nil {
		t.Fatal(err)
	}
	if p.LogStartOffset() != 0 || p.LogEndOffset() != 0 || p.HighWatermark() != 0 || p.Committed() != 0 || p.Truncations() == before {
		t.Fatalf("after wipe: start %d end %d hw %d committed %d truncations %d", p.LogStartOffset(), p.LogEndOffset(), p.HighWatermark(), p.Committed(), p.Truncations())
	}
	if n := len(p.segments()); n != 1 {
		t.Fatalf("%d segments after the wipe, want 1", n)
	}
	if p.cleaner.cleanedBelow.Load() != 0 || p.cleaner.firstDirty.Load() != 0 {
		t.Fatalf("cleaner checkpoint kept: first dirty %d, cleaned below %d", p.cleaner.firstDirty.Load(), p.cleaner.cleanedBelow.Load())
	}
	if names, err := fsys.ReadDir("/data/t-0"); err != nil || slices.Contains(names, cleanerCheckpointFile) {
		t.Fatalf("cleaner checkpoint file kept: %v %v", names, err)
	}
	// Copied again from offset 0, as from a leader.
	want := map[int64][]byte{}
	appendSynced(t, p, rng, 3, want)
	if err := p.Commit(p.LogEndOffset()); err != nil {
		t.Fatal(err)
	}
	readAll(t, p, rng, want)
	clone := memFS{mfs.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	p2 := mustOpen(t, openStore(t, clone, 0), "/data/t-0", Config{SegmentBytes: 2048})
	if p2.LogStartOffset() != 0 || p2.LogEndOffset() != p.LogEndOffset() {
		t.Fatalf("reopened: start %d end %d, want 0 and %d", p2.LogStartOffset(), p2.LogEndOffset(), p.LogEndOffset())
	}
	readAll(t, p2, rng, want)
}

// TestWaitDurableAcrossWipe: a durability wait whose offset a wipe (or a
// truncation) cuts away while its fsync runs returns an error instead of
// waiting for ever.
func TestWaitDurableAcrossWipe(t *testing.T) {
	_, base := newMemFS(t)
	fsys := &slowSyncFS{FS: base}
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{})
	if err := p.SetReplicated(0); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	res, err := p.Append(randBatch(rng, 5, 100))
	if err != nil {
		t.Fatal(err)
	}
	fsys.delay.Store(int64(200 * time.Millisecond))
	done := make(chan error, 1)
	go func() { done <- p.WaitDurable(res.LastOffset + 1) }()
	time.Sleep(50 * time.Millisecond) // the wait's fsync is running
	if err := p.Wipe(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrOffsetOutOfRange) {
			t.Fatalf("WaitDurable across a wipe: %v, want ErrOffsetOutOfRange", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitDurable still waiting 5 s after a wipe cut its offset away")
	}
	fsys.delay.Store(0)
}
