package log

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/synapsebroker/synapse/internal/memfs"
	"github.com/synapsebroker/synapse/log/internal/testbatch"
	"go.uber.org/zap/zaptest"
)

// memFS adapts *memfs.FS to FS.
type memFS struct{ *memfs.FS }

func (m memFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := m.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func newMemFS(t testing.TB) (*memfs.FS, FS) {
	t.Helper()
	m := memfs.New()
	if err := m.MkdirAll("/data", 0o755); err != nil {
		t.Fatal(err)
	}
	m.MarkAllSynced()
	return m, memFS{m}
}

func openStore(t testing.TB, fsys FS, interval time.Duration) *Store {
	t.Helper()
	s := OpenStore(Options{FS: fsys, SyncInterval: interval, Logger: zaptest.NewLogger(t)})
	t.Cleanup(func() { s.Close() })
	return s
}

func mustOpen(t testing.TB, s *Store, dir string, cfg Config) *Partition {
	t.Helper()
	p, err := s.OpenPartition(dir, cfg)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return p
}

// randBatch returns a batch of 1..maxRecords records with random sizes.
func randBatch(rng *rand.Rand, ts int64, maxValue int) []byte {
	return testbatch.Make(testbatch.Options{
		Records:   1 + rng.IntN(5),
		ValueSize: rng.IntN(maxValue + 1),
		Timestamp: ts,
		Fill:      byte(rng.Uint32()),
	})
}

// readAll reads [from, hw) with random budgets and checks every batch against
// want (keyed by base offset): same bytes, contiguous offsets, whole batches,
// the first batch containing the requested offset.
func readAll(t testing.TB, p *Partition, rng *rand.Rand, want map[int64][]byte) int {
	t.Helper()
	off := p.LogStartOffset()
	hw := p.HighWatermark()
	n := 0
	for off < hw {
		maxBytes := int64(1 + rng.IntN(20000))
		// Sometimes ask for an offset inside the batch instead of its start.
		ask := off
		res, err := p.Read(ask, maxBytes)
		if err != nil {
			t.Fatalf("read %d: %v", ask, err)
		}
		buf, err := res.AppendTo(nil)
		next := res.NextOffset
		res.Release()
		if err != nil {
			t.Fatalf("read %d: copy: %v", ask, err)
		}
		if len(buf) == 0 {
			t.Fatalf("read %d below hw %d returned nothing", ask, hw)
		}
		nb := 0
		for len(buf) > 0 {
			h, err := ParseBatchHeader(buf)
			if err != nil {
				t.Fatalf("read %d: returned bytes do not parse: %v", ask, err)
			}
			b := buf[:h.Length]
			if nb == 0 && (h.BaseOffset > ask || h.LastOffset() < ask) {
				t.Fatalf("read %d: first batch %d..%d does not contain it", ask, h.BaseOffset, h.LastOffset())
			}
			if nb > 0 && int64(len(b)) > maxBytes {
				t.Fatalf("read %d: over budget", ask)
			}
			if h.BaseOffset != off && !(n == 0 && nb == 0) { // the very first batch may start before the log start
				t.Fatalf("read %d: batch at %d, want contiguous %d", ask, h.BaseOffset, off)
			}
			if w, ok := want[h.BaseOffset]; ok && !bytes.Equal(w, b) {
				t.Fatalf("batch %d: bytes differ from what was appended", h.BaseOffset)
			}
			off = h.NextOffset()
			buf = buf[h.Length:]
			nb++
			n++
		}
		if off > hw {
			t.Fatalf("read past high watermark: %d > %d", off, hw)
		}
		if next != off {
			t.Fatalf("read %d: NextOffset %d, batches end at %d", ask, next, off)
		}
	}
	return n
}

// storedCopy is what the log stores for batch b appended at base.
func storedCopy(b []byte, base int64) []byte {
	c := append([]byte(nil), b...)
	binary.BigEndian.PutUint64(c, uint64(base))
	return c
}
