package log

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/internal/memfs"
)

// syncfsMem is a memory file system with syncfs: SyncFS makes everything
// durable (as syncfs(2) does) unless fail is set.
type syncfsMem struct {
	memFS
	mu    sync.Mutex
	calls int
	fail  error
}

// newSyncfsMem returns a memory file system with /data (synced) and its
// syncfs wrapper.
func newSyncfsMem(t testing.TB) (*memfs.FS, *syncfsMem) {
	t.Helper()
	m, _ := newMemFS(t)
	return m, &syncfsMem{memFS: memFS{m}}
}

func (m *syncfsMem) Device(string) (uint64, bool) { return 1, true }

func (m *syncfsMem) OpenSyncFS(string) (SyncFSHandle, error) { return memSyncHandle{m}, nil }

type memSyncHandle struct{ m *syncfsMem }

func (h memSyncHandle) SyncFS() error {
	m := h.m
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if m.fail != nil {
		return m.fail
	}
	m.FS.MarkAllSynced()
	return nil
}

func (memSyncHandle) Close() error { return nil }

// appendAll appends batches to every partition, then waits for each to be
// durable (so rounds find many partitions dirty); it returns the batches
// and errors by partition.
func appendAll(ps []*Partition, seed uint64) ([]map[int64][]byte, []error) {
	wants := make([]map[int64][]byte, len(ps))
	errs := make([]error, len(ps))
	rng := rand.New(rand.NewPCG(seed, 1))
	for round := 0; round < 3; round++ {
		ends := make([]int64, len(ps))
		for i, p := range ps {
			if wants[i] == nil {
				wants[i] = map[int64][]byte{}
			}
			if errs[i] != nil {
				continue
			}
			b := randBatch(rng, 1_700_000_000_000, 200)
			res, err := p.Append(b)
			if err != nil {
				errs[i] = err
				continue
			}
			ends[i] = res.LastOffset + 1
			wants[i][res.BaseOffset] = storedCopy(b, res.BaseOffset)
		}
		for i, p := range ps {
			if errs[i] == nil {
				if err := p.WaitDurable(ends[i]); err != nil {
					errs[i] = err
				}
			}
		}
	}
	return wants, errs
}

// A round of many dirty partitions is made durable with one syncfs per file
// system: everything acknowledged survives a power loss.
func TestSyncFSRoundIsDurable(t *testing.T) {
	m, fsys := newSyncfsMem(t)
	s := OpenStore(Options{FS: fsys, SyncFSMin: 8, Logger: zaptest.NewLogger(t)})
	defer s.Close()
	var ps []*Partition
	for i := 0; i < 64; i++ {
		ps = append(ps, mustOpen(t, s, fmt.Sprintf("/data/t-%d", i), Config{}))
	}
	wants, errs := appendAll(ps, 1)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("partition %d: %v", i, err)
		}
	}
	if s.SyncFSRounds() == 0 || fsys.calls == 0 {
		t.Fatalf("no round used syncfs (rounds %d, calls %d)", s.SyncFSRounds(), fsys.calls)
	}
	clone := memFS{m.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	s2 := openStore(t, clone, 0)
	for i := range ps {
		p := mustOpen(t, s2, fmt.Sprintf("/data/t-%d", i), Config{})
		readAll(t, p, rand.New(rand.NewPCG(3, 3)), wants[i])
	}
}

// A failed syncfs falls back to an fdatasync per partition: the partitions
// whose own fsync works go on (their acknowledged data durable), the one
// whose file lost its pages goes offline, alone.
func TestSyncFSFailureFallsBackPerFile(t *testing.T) {
	m, fsys := newSyncfsMem(t)
	fsys.fail = errors.New("injected syncfs EIO")
	s := OpenStore(Options{FS: fsys, SyncFSMin: 8, Logger: zaptest.NewLogger(t)})
	defer s.Close()
	var ps []*Partition
	for i := 0; i < 32; i++ {
		ps = append(ps, mustOpen(t, s, fmt.Sprintf("/data/t-%d", i), Config{}))
	}
	eio := errors.New("injected EIO on t-7")
	m.SetInjector(func(op memfs.Op, path string) error {
		if op == memfs.OpSync && len(path) > 9 && path[:9] == "/data/t-7" && path[9] == '/' {
			return eio
		}
		return nil
	})
	wants, errs := appendAll(ps, 2)
	m.SetInjector(nil)
	for i, err := range errs {
		if i == 7 {
			if !errors.Is(err, ErrStorage) {
				t.Fatalf("t-7 whose fsync fails: %v, want ErrStorage", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("partition %d: %v", i, err)
		}
	}
	if fsys.calls == 0 {
		t.Fatal("syncfs never tried")
	}
	clone := memFS{m.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	s2 := openStore(t, clone, 0)
	for i := range ps {
		if i == 7 {
			continue
		}
		p := mustOpen(t, s2, fmt.Sprintf("/data/t-%d", i), Config{})
		readAll(t, p, rand.New(rand.NewPCG(3, 3)), wants[i])
	}
}

// On the operating system's file system (Linux 5.8+) a round of many dirty
// partitions uses syncfs(2).
func TestSyncFSOnOS(t *testing.T) {
	if _, ok := OSFS.(FSSyncer).Device(t.TempDir()); !ok {
		t.Skip("syncfs does not report errors here (Linux before 5.8, or not Linux)")
	}
	dir := t.TempDir()
	s := OpenStore(Options{Logger: zaptest.NewLogger(t)})
	defer s.Close()
	var ps []*Partition
	for i := 0; i < 100; i++ {
		ps = append(ps, mustOpen(t, s, fmt.Sprintf("%s/t-%d", dir, i), Config{}))
	}
	// A background round (the 500 µs commit delay) can take part of the
	// dirty set while the appends run on a slow machine under -race, so a
	// few tries of three rounds each are allowed; syncfs must be used in one.
	all := make([]map[int64][]byte, len(ps))
	for try := uint64(0); try < 5 && (try == 0 || s.SyncFSRounds() == 0); try++ {
		wants, errs := appendAll(ps, 4+try)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("partition %d: %v", i, err)
			}
			if all[i] == nil {
				all[i] = map[int64][]byte{}
			}
			maps.Copy(all[i], wants[i])
		}
	}
	if s.SyncFSRounds() == 0 {
		t.Fatal("no round used syncfs")
	}
	for i, p := range ps {
		readAll(t, p, rand.New(rand.NewPCG(5, 5)), all[i])
	}
}

// A batch open (a broker's start) after a crash makes what it recovered
// durable with one syncfs: everything survives a power loss right after,
// on both the syncfs path and the one-by-one fallback.
func TestOpenPartitionsAfterCrash(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail error
	}{{"syncfs", nil}, {"fallback", errors.New("injected syncfs failure")}} {
		t.Run(tc.name, func(t *testing.T) {
			m, fsys := newSyncfsMem(t)
			s := OpenStore(Options{FS: fsys, SyncInterval: time.Hour, Logger: zaptest.NewLogger(t)})
			var dirs []string
			var cfgs []Config
			for i := 0; i < 40; i++ {
				dirs = append(dirs, fmt.Sprintf("/data/t-%d", i))
				cfgs = append(cfgs, Config{SegmentBytes: 2000})
			}
			ps, err := s.OpenPartitions(dirs, cfgs)
			if err != nil {
				t.Fatal(err)
			}
			// Appends under the interval policy: in the page cache only.
			wants := make([]map[int64][]byte, len(ps))
			rng := rand.New(rand.NewPCG(6, 6))
			for i, p := range ps {
				wants[i] = map[int64][]byte{}
				for j := 0; j < 10; j++ {
					b := randBatch(rng, 1_700_000_000_000, 200)
					res, err := p.Append(b)
					if err != nil {
						t.Fatal(err)
					}
					wants[i][res.BaseOffset] = storedCopy(b, res.BaseOffset)
				}
			}
			// kill -9: the page cache (m) survives, the process (s, left
			// open and unused) does not.
			killed := &syncfsMem{memFS: memFS{m}, fail: tc.fail}
			s2 := OpenStore(Options{FS: killed, Logger: zaptest.NewLogger(t)})
			if _, err := s2.OpenPartitions(dirs, cfgs); err != nil {
				t.Fatal(err)
			}
			if tc.fail == nil && killed.calls != 1 {
				t.Fatalf("%d syncfs calls for the batch, want 1", killed.calls)
			}
			// Then a power loss: what the restart recovered must be durable.
			lost := memFS{killed.FS.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
			s3 := openStore(t, lost, 0)
			for i, d := range dirs {
				p := mustOpen(t, s3, d, cfgs[i])
				readAll(t, p, rng, wants[i])
			}
		})
	}
}

// A batch close writes every clean-close record (and the caller's files)
// with two syncfs calls; after a power loss right after it, every partition
// opens clean (no scan) with everything.
func TestCloseBatchIsCleanAndDurable(t *testing.T) {
	m, fsys := newSyncfsMem(t)
	s := OpenStore(Options{FS: fsys, SyncInterval: time.Hour, Logger: zaptest.NewLogger(t)})
	var dirs []string
	var cfgs []Config
	for i := 0; i < 50; i++ {
		dirs = append(dirs, fmt.Sprintf("/data/t-%d", i))
		cfgs = append(cfgs, Config{SegmentBytes: 3000})
	}
	ps, err := s.OpenPartitions(dirs, cfgs)
	if err != nil {
		t.Fatal(err)
	}
	wants := make([]map[int64][]byte, len(ps))
	rng := rand.New(rand.NewPCG(8, 8))
	for i, p := range ps {
		wants[i] = map[int64][]byte{}
		for j := 0; j < 12; j++ {
			b := randBatch(rng, 1_700_000_000_000, 200)
			res, err := p.Append(b)
			if err != nil {
				t.Fatal(err)
			}
			wants[i][res.BaseOffset] = storedCopy(b, res.BaseOffset)
		}
	}
	before := fsys.calls
	if err := s.CloseBatch(ps, map[string][]byte{"/data/extra.json": []byte(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	if n := fsys.calls - before; n != 2 {
		t.Fatalf("%d syncfs calls for the close, want 2", n)
	}
	lost := memFS{m.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	if b, err := lost.FS.ReadFile("/data/extra.json"); err != nil || string(b) != `{"x":1}` {
		t.Fatalf("extra file after power loss: %q %v", b, err)
	}
	for _, d := range dirs {
		st, err := readState(lost, d)
		if err != nil || st.Clean == nil {
			t.Fatalf("%s: clean-close record %+v %v", d, st.Clean, err)
		}
	}
	s2 := openStore(t, lost, 0)
	for i, d := range dirs {
		readAll(t, mustOpen(t, s2, d, cfgs[i]), rng, wants[i])
	}
}

// After a round's syncfs fails, every partition on that file system goes
// through its own fdatasync before its high watermark moves again — also
// those outside the failed round, whose failure that syncfs may have been
// the one to report (Linux reports a writeback error once per handle).
func TestSyncFSFailureMakesEveryPartitionVerifyItself(t *testing.T) {
	m, fsys := newSyncfsMem(t)
	s := OpenStore(Options{FS: fsys, SyncFSMin: 8, Logger: zaptest.NewLogger(t)})
	defer s.Close()
	var a, b []*Partition
	for i := 0; i < 16; i++ {
		a = append(a, mustOpen(t, s, fmt.Sprintf("/data/a-%d", i), Config{}))
		b = append(b, mustOpen(t, s, fmt.Sprintf("/data/b-%d", i), Config{}))
	}
	fsys.mu.Lock()
	fsys.fail = errors.New("injected syncfs failure")
	fsys.mu.Unlock()
	if _, errs := appendAll(a, 1); errors.Join(errs...) != nil {
		t.Fatalf("round with a failing syncfs (per-file fallback): %v", errors.Join(errs...))
	}
	fsys.mu.Lock()
	fsys.fail = nil
	fsys.mu.Unlock()
	// b-3's file lost its pages: only its own fsync can say so.
	eio := errors.New("injected EIO on b-3")
	m.SetInjector(func(op memfs.Op, path string) error {
		if op == memfs.OpSync && strings.HasPrefix(path, "/data/b-3/") {
			return eio
		}
		return nil
	})
	_, errs := appendAll(b, 2)
	m.SetInjector(nil)
	if !errors.Is(errs[3], ErrStorage) {
		t.Fatalf("b-3 after the epoch moved: %v, want ErrStorage from its own fsync", errs[3])
	}
	for i, err := range errs {
		if i != 3 && err != nil {
			t.Fatalf("b-%d: %v", i, err)
		}
	}
}
