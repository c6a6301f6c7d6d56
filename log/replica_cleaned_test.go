package log

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/internal/memfs"
)

// TestAppendReplicaCleaned: a cluster follower copies a cleaned leader's
// log batch by batch (AppendReplica): at the leader's offsets, gaps and
// empty header-only batches included, across its own segment rolls. The
// copy reads back byte for byte, also after a crash that drops whatever
// was not synced, and takes new appends at its end. A batch below the end
// is refused; a normal Append is still held to contiguous offsets.
func TestAppendReplicaCleaned(t *testing.T) {
	old, newer := referenceClean(t)
	if len(newer) >= len(old) {
		t.Fatalf("the clean removed nothing (%d -> %d batches)", len(old), len(newer))
	}
	mfs, fsys := newMemFS(t)
	s := OpenStore(Options{FS: fsys, Logger: zap.NewNop()})
	defer s.Close()
	const dir = "/data/r-0"
	cfg := Config{SegmentBytes: 1100, IndexIntervalBytes: 150} // rolls where the leader's do not
	p := mustOpen(t, s, dir, cfg)
	bases := slices.Sorted(maps.Keys(newer))
	gaps := 0
	for i, base := range bases {
		if i > 0 {
			h, _ := ParseBatchHeader(newer[bases[i-1]])
			if h.NextOffset() != base {
				gaps++
			}
		}
		if _, err := p.AppendReplica(newer[base]); err != nil {
			t.Fatalf("replica append at %d: %v", base, err)
		}
	}
	if gaps == 0 {
		t.Fatal("the cleaned log has no offset gaps: nothing tested")
	}
	if _, err := p.AppendReplica(newer[bases[len(bases)-1]]); !errors.Is(err, errReplicaOverlap) {
		t.Fatalf("a batch below the log end: %v, want errReplicaOverlap", err)
	}
	if err := p.WaitDurable(p.LogEndOffset()); err != nil {
		t.Fatal(err)
	}
	checkCopy(t, p, bases, newer, "copied")
	if len(p.SealedSegments()) < 2 {
		t.Fatalf("%d sealed segments: the copy did not roll", len(p.SealedSegments()))
	}
	// The active segment with a gap of its own (a cleaned batch copied
	// past the end): recovery walks it as a cleaned one too.
	var cleaned []byte
	for _, base := range bases {
		if h, _ := ParseBatchHeader(newer[base]); int64(h.NumRecords) < int64(h.LastOffsetDelta)+1 {
			cleaned = newer[base]
		}
	}
	if cleaned == nil {
		t.Fatal("no cleaned batch with fewer records than offsets")
	}
	at := p.LogEndOffset() + 5
	last := storedCopy(cleaned, at)
	if _, err := p.AppendReplica(last); err != nil {
		t.Fatal(err)
	}
	bases = append(bases, at)
	newer[at] = last
	if err := p.WaitDurable(p.LogEndOffset()); err != nil {
		t.Fatal(err)
	}
	end := p.LogEndOffset()
	for _, mode := range []memfs.UnsyncedMode{memfs.DropUnsynced, memfs.KeepRandomPrefix} {
		clone := memFS{mfs.CrashClone(memfs.CrashConfig{Rand: rand.New(rand.NewPCG(1, 2)), UnsyncedMode: mode})}
		s2 := OpenStore(Options{FS: clone, Logger: zap.NewNop()})
		p2, err := s2.OpenPartition(dir, cfg)
		if err != nil {
			t.Fatalf("reopen after a crash: %v", err)
		}
		if p2.LogEndOffset() != end {
			t.Fatalf("log end %d after the crash, want %d", p2.LogEndOffset(), end)
		}
		checkCopy(t, p2, bases, newer, "after a crash")
		checkVerify(t, clone, dir)
		b := buildBatch(t, []trec{{key: []byte("k"), value: []byte("v"), ts: 1}}, CodecNone, -1, -1, -1, 0)
		res, err := p2.Append(b)
		if err != nil || res.BaseOffset != end {
			t.Fatalf("append after the copy: %+v %v, want base %d", res, err, end)
		}
		s2.Close()
	}
	// An ordinary Append of a cleaned batch is still refused: only a
	// replica's copy may have gaps.
	q := mustOpen(t, s, "/data/q-0", cfg)
	for _, base := range bases {
		h, _ := ParseBatchHeader(newer[base])
		if int64(h.NumRecords) == int64(h.LastOffsetDelta)+1 {
			continue
		}
		if _, err := q.Append(newer[base]); err == nil {
			t.Fatalf("Append took the cleaned batch at %d (%d records over %d offsets)", base, h.NumRecords, h.LastOffsetDelta+1)
		}
		return
	}
	t.Fatal("no cleaned batch with fewer records than offsets")
}

// TestTruncateCleaned: a follower's copy of a cleaned log is cut at an
// offset the clean removed (inside a gap between kept batches, or before
// the first kept batch of the first segment). The log then ends where the
// kept batches before the offset end, stays usable, and the leader's
// batches from there copy in again to the same log.
func TestTruncateCleaned(t *testing.T) {
	_, newer := referenceClean(t)
	bases := slices.Sorted(maps.Keys(newer))
	type cut struct{ off, want int64 }
	var cuts []cut
	if bases[0] > 0 {
		cuts = append(cuts, cut{0, 0}, cut{bases[0], 0})
	}
	for i := 1; i < len(bases) && len(cuts) < 8; i++ {
		end := storedNext(t, newer[bases[i-1]])
		if end < bases[i] {
			cuts = append(cuts, cut{end, end}, cut{bases[i] - 1, end})
		}
	}
	if len(cuts) < 4 {
		t.Fatalf("%d cut points in gaps: nothing tested", len(cuts))
	}
	const dir = "/data/r-0"
	cfg := Config{SegmentBytes: 1100, IndexIntervalBytes: 150}
	for _, c := range cuts {
		_, fsys := newMemFS(t)
		s := OpenStore(Options{FS: fsys, Logger: zap.NewNop()})
		p := mustOpen(t, s, dir, cfg)
		if err := p.SetReplicated(0); err != nil {
			t.Fatal(err)
		}
		copyFrom := func(from int64) {
			t.Helper()
			for _, base := range bases {
				if base < from {
					continue
				}
				if _, err := p.AppendReplica(newer[base]); err != nil {
					t.Fatalf("cut at %d: replica append at %d: %v", c.off, base, err)
				}
			}
			if err := p.WaitDurable(p.LogEndOffset()); err != nil {
				t.Fatal(err)
			}
		}
		copyFrom(0)
		leo, err := p.TruncateTo(c.off)
		if err != nil {
			t.Fatalf("truncate to %d: %v", c.off, err)
		}
		if leo != c.want || p.LogEndOffset() != c.want || p.DurableEnd() != c.want {
			t.Fatalf("truncate to %d: returned %d, log end %d, durable %d; want %d", c.off, leo, p.LogEndOffset(), p.DurableEnd(), c.want)
		}
		copyFrom(leo)
		if err := p.Commit(p.LogEndOffset()); err != nil {
			t.Fatal(err)
		}
		checkCopy(t, p, bases, newer, fmt.Sprintf("cut at %d, copied again", c.off))
		s.Close()
	}
}

// checkCopy reads p's log (to its high watermark) and wants exactly the
// leader's batches: at the offsets in bases, byte for byte.
func checkCopy(t *testing.T, p *Partition, bases []int64, leader map[int64][]byte, when string) {
	t.Helper()
	got := readLog(t, p)
	if len(got) != len(bases) {
		t.Fatalf("%s: %d batches, want %d", when, len(got), len(bases))
	}
	for i, lb := range got {
		if lb.h.BaseOffset != bases[i] || !bytes.Equal(lb.b, leader[bases[i]]) {
			t.Fatalf("%s: batch %d at %d differs from the leader's at %d", when, i, lb.h.BaseOffset, bases[i])
		}
	}
}
