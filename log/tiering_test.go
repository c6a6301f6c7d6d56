package log

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/synapsebroker/synapse/internal/memfs"
)

func TestDeleteLocalKeepsLogStart(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	mfs, fsys := newMemFS(t)
	cfg := Config{SegmentBytes: 1000}
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", cfg)
	want := map[int64][]byte{}
	if err := appendDurable(p, rng, 30, want); err != nil {
		t.Fatal(err)
	}
	sealed := p.SealedSegments()
	if len(sealed) < 3 {
		t.Fatalf("%d sealed segments", len(sealed))
	}
	cut := sealed[2].Base
	n, err := p.DeleteLocalBefore(cut)
	if err != nil || n != 2 {
		t.Fatalf("DeleteLocalBefore: %d, %v", n, err)
	}
	if p.LogStartOffset() != 0 || p.LocalStartOffset() != cut {
		t.Fatalf("log start %d, local start %d", p.LogStartOffset(), p.LocalStartOffset())
	}
	if _, err := p.Read(0, 100); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("read below local start: %v", err)
	}
	// A crash (no clean close) must not turn the local start into the log
	// start: the checkpoint written before the deletion says otherwise.
	crashed := memFS{mfs.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	pc := mustOpen(t, openStore(t, crashed, 0), "/data/t-0", cfg)
	if pc.LogStartOffset() != 0 || pc.LocalStartOffset() != cut {
		t.Fatalf("after a crash: log start %d, local start %d", pc.LogStartOffset(), pc.LocalStartOffset())
	}
	p.Close()
	p = mustOpen(t, openStore(t, fsys, 0), "/data/t-0", cfg)
	if p.LogStartOffset() != 0 || p.LocalStartOffset() != cut {
		t.Fatalf("after reopen: log start %d, local start %d", p.LogStartOffset(), p.LocalStartOffset())
	}
	res, err := p.Read(cut, 1<<20)
	if err != nil || res.Bytes == 0 {
		t.Fatalf("read at local start: %v", err)
	}
	res.Release()
}

func TestRebaseEmptyPartition(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{})
	if err := p.Rebase(500, 100); err != nil {
		t.Fatal(err)
	}
	if p.LogEndOffset() != 500 || p.LogStartOffset() != 100 || p.HighWatermark() != 500 {
		t.Fatalf("rebased: leo %d ls %d hw %d", p.LogEndOffset(), p.LogStartOffset(), p.HighWatermark())
	}
	want := map[int64][]byte{}
	if err := appendDurable(p, rng, 3, want); err != nil {
		t.Fatal(err)
	}
	if _, ok := want[500]; !ok {
		t.Fatal("first append after rebase not at 500")
	}
	if err := p.Rebase(900, 0); err == nil {
		t.Fatal("rebase of a non-empty partition accepted")
	}
	p.Close()
	p = mustOpen(t, openStore(t, fsys, 0), "/data/t-0", Config{})
	if p.LogStartOffset() != 100 || p.LocalStartOffset() != 500 {
		t.Fatalf("after reopen: ls %d local %d", p.LogStartOffset(), p.LocalStartOffset())
	}
	if _, err := p.Read(200, 10); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("read below local start: %v", err)
	}
}
