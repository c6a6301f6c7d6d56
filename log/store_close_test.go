package log

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/synapsebroker/synapse/internal/memfs"
)

// slowSyncFS makes every fsync (file or directory) take a moment and
// records how many ran at once.
type slowSyncFS struct {
	FS
	delay     atomic.Int64 // nanoseconds; 0: none
	now, peak atomic.Int32
}

func (s *slowSyncFS) enter() func() {
	n := s.now.Add(1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	if d := s.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	return func() { s.now.Add(-1) }
}

func (s *slowSyncFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := s.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return slowSyncFile{f, s}, nil
}

func (s *slowSyncFS) SyncDir(dir string) error {
	defer s.enter()()
	return s.FS.SyncDir(dir)
}

type slowSyncFile struct {
	File
	fs *slowSyncFS
}

func (f slowSyncFile) Sync() error {
	defer f.fs.enter()()
	return f.File.Sync()
}

// TestStoreCloseManyPartitions: Close of a store with thousands of open
// partitions (unsynced appends under the relaxed policy) closes every one
// cleanly, many at once, so it stays fast; after a power loss right after
// it, every partition opens from its clean state with all its records.
func TestStoreCloseManyPartitions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
	}{{"durable", 0}, {"relaxed", time.Hour}} {
		t.Run(tc.name, func(t *testing.T) {
			mfs, base := newMemFS(t)
			const n = 2000
			fsys := &slowSyncFS{FS: base}
			s := OpenStore(Options{FS: fsys, SyncInterval: tc.interval, MaxOpenFiles: 64})
			rng := rand.New(rand.NewPCG(1, 2))
			ps := make([]*Partition, n)
			ends := make([]int64, n)
			for i := range ps {
				ps[i] = mustOpen(t, s, fmt.Sprintf("/data/t-%d", i), Config{})
				for j := 0; j <= i%3; j++ {
					res, err := ps[i].Append(randBatch(rng, 1000, 100))
					if err != nil {
						t.Fatal(err)
					}
					ends[i] = res.LastOffset + 1
				}
			}
			fsys.peak.Store(0)
			fsys.delay.Store(int64(100 * time.Microsecond))
			start := time.Now()
			if err := s.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			took := time.Since(start)
			if p := fsys.peak.Load(); p < 2 {
				t.Fatalf("at most %d fsync at once during Close of %d partitions: serial", p, n)
			}
			t.Logf("closed %d partitions in %s, up to %d fsyncs at once", n, took, fsys.peak.Load())
			if err := s.Close(); !errors.Is(err, ErrClosed) {
				t.Fatalf("second close: %v, want ErrClosed", err)
			}
			for _, i := range []int{0, n / 2, n - 1} {
				if _, err := ps[i].Append(randBatch(rng, 1000, 10)); !errors.Is(err, ErrClosed) {
					t.Fatalf("append to partition %d after the store's close: %v", i, err)
				}
			}
			// What a power loss right now would leave: only fsync'd bytes
			// and entries. Close made it all durable, and clean.
			crashed := memFS{mfs.CrashClone(memfs.CrashConfig{})}
			for i := range ps {
				st, err := readState(crashed, fmt.Sprintf("/data/t-%d", i))
				if err != nil || st.Clean == nil {
					t.Fatalf("partition %d: state %+v, %v: not closed cleanly", i, st, err)
				}
			}
			s2 := openStore(t, crashed, tc.interval)
			for i := range ps {
				p := mustOpen(t, s2, fmt.Sprintf("/data/t-%d", i), Config{})
				if p.LogEndOffset() != ends[i] || p.HighWatermark() != ends[i] {
					t.Fatalf("partition %d: log end %d, high watermark %d after reopening, want %d", i, p.LogEndOffset(), p.HighWatermark(), ends[i])
				}
			}
		})
	}
}
