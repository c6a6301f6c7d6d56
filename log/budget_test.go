package log

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/internal/fdbudget"
	"github.com/synapsebroker/synapse/log/internal/testbatch"
)

// emfileFS fails every OpenFile with EMFILE while fail is set, as the kernel
// does at RLIMIT_NOFILE.
type emfileFS struct {
	FS
	fail *atomic.Bool
}

func (f emfileFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if f.fail.Load() {
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EMFILE}
	}
	return f.FS.OpenFile(name, flag, perm)
}

// closeIdleFiles closes every idle cached segment file of s, so the next
// append or read must open one.
func closeIdleFiles(s *Store) {
	s.cache.mu.Lock()
	for e := s.cache.lru.Back(); e != nil; e = s.cache.lru.Back() {
		s.cache.closeIdleLocked(e).Close()
	}
	s.cache.mu.Unlock()
}

// budgetStore opens a store on fsys with a descriptor budget of n.
func budgetStore(t *testing.T, fsys FS, n int) (*Store, *fdbudget.Budget) {
	t.Helper()
	b := fdbudget.New(n)
	s := OpenStore(Options{FS: fsys, FDs: b, MaxOpenFiles: 1024, Logger: zaptest.NewLogger(t)})
	t.Cleanup(func() { s.Close() })
	return s, b
}

// The kernel's EMFILE is a retriable refusal: the append gets ErrResource,
// the partition stays online, reads of it too, and it works again once
// descriptors are back.
func TestEMFILEIsRetriableNotOffline(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	_, fsys := newMemFS(t)
	var fail atomic.Bool
	s := openStore(t, emfileFS{fsys, &fail}, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 2000})
	want := map[int64][]byte{}
	if err := appendDurable(p, rng, 20, want); err != nil {
		t.Fatal(err)
	}
	// Close the cached files so the next append and read must open one.
	closeIdleFiles(s)
	fail.Store(true)
	for i := 0; i < 5; i++ {
		_, err := p.Append(randBatch(rng, 0, 500)) // some of these roll
		if !errors.Is(err, ErrResource) || errors.Is(err, ErrStorage) || !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("append at EMFILE: %v, want ErrResource wrapping EMFILE", err)
		}
	}
	if _, err := p.Read(0, 1<<20); !errors.Is(err, ErrResource) {
		t.Fatalf("read at EMFILE: %v, want ErrResource", err)
	}
	if p.Err() != nil {
		t.Fatalf("partition offline after EMFILE: %v", p.Err())
	}
	fail.Store(false)
	if err := appendDurable(p, rng, 20, want); err != nil {
		t.Fatalf("append once descriptors are back: %v", err)
	}
	readAll(t, p, rng, want)
}

// With a budget far smaller than the partition count, concurrent durable
// appends to every partition all succeed (they wait for slots), never hold
// more descriptors than the budget, and take no partition offline.
func TestBudgetBindsAppendsWait(t *testing.T) {
	_, fsys := newMemFS(t)
	s, b := budgetStore(t, fsys, 8)
	const parts = 64
	ps := make([]*Partition, parts)
	for i := range ps {
		ps[i] = mustOpen(t, s, fmt.Sprintf("/data/t-%d", i), Config{SegmentBytes: 1500})
	}
	var wg sync.WaitGroup
	errs := make(chan error, parts)
	wants := make([]map[int64][]byte, parts)
	for i, p := range ps {
		wants[i] = map[int64][]byte{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			if err := appendDurable(p, rng, 10, wants[i]); err != nil {
				errs <- fmt.Errorf("partition %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, peak, _ := b.Stats(); peak > b.Max() {
		t.Fatalf("peak %d descriptors over a budget of %d", peak, b.Max())
	}
	for i, p := range ps {
		if p.Err() != nil {
			t.Fatalf("partition %d offline: %v", i, p.Err())
		}
		readAll(t, p, rand.New(rand.NewPCG(uint64(i), 1)), wants[i])
	}
}

// Reads pinning files (a fetch's response in flight) are refused once less
// than a quarter of the budget is free, with ErrResource; appends still find
// room, and the refused read works once the pinned results are released.
func TestBudgetRefusesReadsBeforeWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	_, fsys := newMemFS(t)
	s, _ := budgetStore(t, fsys, 8)
	var ps []*Partition
	for i := 0; i < 10; i++ {
		p := mustOpen(t, s, fmt.Sprintf("/data/t-%d", i), Config{})
		// Batches above smallRead: reads pin their files even under
		// pressure.
		big := testbatch.Make(testbatch.Options{Records: 1, ValueSize: smallRead + 1})
		res, err := p.Append(big)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	closeIdleFiles(s)
	var held []*ReadResult
	refusedAt := -1
	for i, p := range ps {
		res, err := p.Read(0, 1<<20)
		if errors.Is(err, ErrResource) {
			refusedAt = i
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, res)
	}
	if refusedAt != 6 { // 8 slots, 2 kept free
		t.Fatalf("first refused read at partition %d, want 6", refusedAt)
	}
	if err := appendDurable(ps[9], rng, 2, map[int64][]byte{}); err != nil {
		t.Fatalf("append while reads hold the budget: %v", err)
	}
	for _, r := range held {
		r.Release()
	}
	res, err := ps[refusedAt].Read(0, 1<<20)
	if err != nil {
		t.Fatalf("read after release: %v", err)
	}
	res.Release()
}

// Under descriptor pressure small reads come back as bytes in memory, their
// files released at once: a fetch of many partitions pins none of them, and
// what it returns is the batches themselves.
func TestSmallReadsUnderPressureHoldNoFile(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 10))
	_, fsys := newMemFS(t)
	s, b := budgetStore(t, fsys, 8)
	var ps []*Partition
	var wants []map[int64][]byte
	for i := 0; i < 30; i++ {
		p := mustOpen(t, s, fmt.Sprintf("/data/t-%d", i), Config{})
		want := map[int64][]byte{}
		if err := appendDurable(p, rng, 3, want); err != nil {
			t.Fatal(err)
		}
		ps, wants = append(ps, p), append(wants, want)
	}
	var held []*ReadResult
	mem := 0
	for i, p := range ps {
		res, err := p.Read(0, 1<<20)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		got, err := res.AppendTo(nil)
		if err != nil {
			t.Fatal(err)
		}
		var exp []byte
		for off := int64(0); off < p.LogEndOffset(); {
			bb, ok := wants[i][off]
			if !ok {
				t.Fatalf("no batch at %d", off)
			}
			exp = append(exp, bb...)
			h, _ := ParseBatchHeader(bb)
			off = h.NextOffset()
		}
		if string(got) != string(exp) {
			t.Fatalf("partition %d: read %d bytes, want the %d appended", i, len(got), len(exp))
		}
		for _, c := range res.Chunks {
			if c.h == nil {
				mem++
			}
		}
		held = append(held, res)
	}
	if used, _, _ := b.Stats(); used > b.Max() || mem == 0 {
		t.Fatalf("%d memory chunks, %d descriptors used of %d", mem, used, b.Max())
	}
	for _, r := range held {
		r.Release()
	}
}
