package log

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/synapsebroker/synapse/internal/memfs"
	"go.uber.org/zap"
)

// crashWorkload is a deterministic sequence of appends (with durability
// waits), segment rolls, a clean close and reopen, and a DeleteRecords. It
// records what was acknowledged; it stops at the first error.
type crashWorkload struct {
	seed     uint64
	appended map[int64][]byte // every batch Append accepted, as stored
	acked    int64            // offsets below this were acknowledged durable
	deleted  int64            // acknowledged DeleteRecords offset
}

var crashCfg = Config{SegmentBytes: 1500, IndexIntervalBytes: 200}

func (w *crashWorkload) run(fsys FS) error {
	rng := rand.New(rand.NewPCG(w.seed, 7))
	w.appended = map[int64][]byte{}
	s := OpenStore(Options{FS: fsys, Logger: zap.NewNop()})
	defer s.Close()
	p, err := s.OpenPartition("/data/t-0", crashCfg)
	if err != nil {
		return err
	}
	for i := 0; i < 90; i++ {
		if i == 45 { // a clean close and reopen in the middle
			if err := p.Close(); err != nil {
				return err
			}
			if p, err = s.OpenPartition("/data/t-0", crashCfg); err != nil {
				return err
			}
		}
		if i == 65 {
			off := w.acked - 3
			if _, err := p.DeleteRecordsBefore(off); err != nil {
				return err
			}
			w.deleted = off
		}
		b := randBatch(rng, 1_700_000_000_000+int64(i), 200)
		res, err := p.Append(b)
		if err != nil {
			return err
		}
		w.appended[res.BaseOffset] = storedCopy(b, res.BaseOffset)
		if rng.IntN(3) > 0 || i == 89 {
			if err := p.WaitDurable(res.LastOffset + 1); err != nil {
				return err
			}
			w.acked = res.LastOffset + 1
		}
	}
	return p.Close()
}

// TestCrashAtEveryOp crashes the workload at its k-th file-system mutation for
// every k, keeps only what a power loss would (synced data and synced
// directory entries, plus a random part of unsynced tails), reopens and
// checks that every acknowledged batch is there with the same bytes, offsets
// are contiguous, nothing else is visible and the indexes agree with the log.
func TestCrashAtEveryOp(t *testing.T) {
	seed := rand.Uint64()
	if s := os.Getenv("CRASH_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (rerun with CRASH_SEED=%d)", seed, seed)

	count := memfs.CrashAfter(-1)
	mfs, fsys := newMemFS(t)
	mfs.SetInjector(count.Inject)
	full := &crashWorkload{seed: seed}
	if err := full.run(fsys); err != nil {
		t.Fatalf("workload without crash: %v", err)
	}
	total := count.Count()
	t.Logf("workload: %d file-system mutations", total)
	if total < 300 {
		t.Fatalf("workload too small for a crash test: %d ops", total)
	}
	modes := []memfs.UnsyncedMode{memfs.DropUnsynced, memfs.KeepRandomPrefix, memfs.KeepRandomPrefixZeroed}
	for k := 0; k <= total; k++ {
		t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) {
			mfs, fsys := newMemFS(t)
			c := memfs.CrashAfter(k)
			mfs.SetInjector(c.Inject)
			w := &crashWorkload{seed: seed}
			err := w.run(fsys)
			if err != nil && !c.Crashed() {
				t.Fatalf("workload failed without a crash: %v", err)
			}
			if err == nil && k < total && c.Crashed() {
				t.Fatalf("crash at %d not reported", k)
			}
			rng := rand.New(rand.NewPCG(seed, uint64(k)))
			clone := mfs.CrashClone(memfs.CrashConfig{Rand: rng, UnsyncedMode: modes[k%len(modes)]})
			checkAfterCrash(t, memFS{clone}, w)
		})
	}
}

func checkAfterCrash(t *testing.T, fsys FS, w *crashWorkload) {
	t.Helper()
	s := OpenStore(Options{FS: fsys, Logger: zap.NewNop()})
	defer s.Close()
	p, err := s.OpenPartition("/data/t-0", crashCfg)
	if err != nil {
		t.Fatalf("reopen after crash: %v", err)
	}
	if p.LogEndOffset() < w.acked {
		t.Fatalf("log end %d after crash, but offsets below %d were acknowledged", p.LogEndOffset(), w.acked)
	}
	if p.LogStartOffset() < w.deleted {
		t.Fatalf("log start %d after crash, DeleteRecords(%d) was acknowledged", p.LogStartOffset(), w.deleted)
	}
	if p.HighWatermark() != p.LogEndOffset() {
		t.Fatalf("hw %d != leo %d after recovery", p.HighWatermark(), p.LogEndOffset())
	}
	// Everything visible must be exactly what was appended; readAll checks
	// contiguity and that reads start at the right batch.
	rng := rand.New(rand.NewPCG(w.seed, 99))
	visible := map[int64][]byte{}
	for off, b := range w.appended {
		visible[off] = b
	}
	readAll(t, p, rng, visible)
	off := p.LogStartOffset()
	for off < p.LogEndOffset() {
		res, err := p.Read(off, 1)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := res.AppendTo(nil)
		res.Release()
		h, _ := ParseBatchHeader(b)
		want, ok := w.appended[h.BaseOffset]
		if !ok || !bytes.Equal(want, b) {
			t.Fatalf("batch at %d visible after crash was never appended as such", h.BaseOffset)
		}
		off = h.NextOffset()
	}
	for o := range w.appended {
		if o >= p.LogStartOffset() && o < w.acked {
			if _, ok := w.appended[o]; !ok {
				t.Fatalf("acked batch %d missing", o)
			}
		}
	}
	checkVerify(t, fsys, "/data/t-0")
	// The log takes appends after recovery at the right offset.
	next := p.LogEndOffset()
	res, err := p.Append(randBatch(rng, 0, 10))
	if err != nil || res.BaseOffset != next {
		t.Fatalf("append after recovery: %v at %d, want %d", err, res.BaseOffset, next)
	}
	if err := p.WaitDurable(res.LastOffset + 1); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil && !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	checkVerify(t, fsys, "/data/t-0")
}
