package log

import (
	"bytes"
	"os"
	"testing"

	"github.com/synapsebroker/synapse/internal/memfs"
	"github.com/synapsebroker/synapse/log/internal/testbatch"
	"go.uber.org/zap"
)

// fuzzSegment returns a valid segment of n batches starting at offset 0.
func fuzzSegment(n int) []byte {
	var seg []byte
	next := int64(0)
	for i := 0; i < n; i++ {
		b := testbatch.Make(testbatch.Options{Records: 1 + i%3, ValueSize: 5 * i, Timestamp: int64(1000 + i)})
		PatchBaseOffset(b, next)
		h, _ := ParseBatchHeader(b)
		next = h.NextOffset()
		seg = append(seg, b...)
	}
	return seg
}

func addSegmentSeeds(f *testing.F) {
	seg := fuzzSegment(5)
	f.Add(seg)
	f.Add(seg[:len(seg)-7])                       // torn tail
	f.Add(append(append([]byte(nil), seg...), 0)) // trailing byte
	f.Add(append(append([]byte(nil), seg...), make([]byte, 100)...))
	bad := append([]byte(nil), seg...)
	bad[len(bad)/2] ^= 0xff
	f.Add(bad)
	f.Add([]byte{})
	f.Add(seg[:BatchHeaderSize])
}

// FuzzBatchHeader: parsing never panics; an accepted batch is exactly one
// whole batch that a scan accepts too.
func FuzzBatchHeader(f *testing.F) {
	f.Add(testbatch.Make(testbatch.Options{Records: 3, ValueSize: 7}))
	f.Add(testbatch.Make(testbatch.Options{Records: 1, Attributes: 4}))
	f.Add(make([]byte, BatchHeaderSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseBatchHeader(b)
		if err == nil && (h.Length < BatchHeaderSize || h.Magic != 2) {
			t.Fatalf("parse accepted length %d magic %d", h.Length, h.Magic)
		}
		h, err = CheckBatch(b, 0)
		if err != nil {
			return
		}
		if int(h.Length) != len(b) || h.NumRecords != h.LastOffsetDelta+1 {
			t.Fatalf("accepted batch with length %d (have %d), count %d delta %d", h.Length, len(b), h.NumRecords, h.LastOffsetDelta)
		}
		c := append([]byte(nil), b...)
		PatchBaseOffset(c, 42)
		if valid, next, _ := ScanBatches(c, 42); valid != len(c) || next != 42+int64(h.NumRecords) {
			t.Fatalf("scan of an accepted batch: valid %d of %d, next %d", valid, len(c), next)
		}
	})
}

// FuzzScanBatches: the valid prefix never exceeds the input, and scanning
// the valid prefix again gives the same result (idempotent).
func FuzzScanBatches(f *testing.F) {
	addSegmentSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		valid, next, maxTs := ScanBatches(b, 0)
		if valid < 0 || valid > len(b) {
			t.Fatalf("valid prefix %d of %d bytes", valid, len(b))
		}
		v2, n2, m2 := ScanBatches(b[:valid], 0)
		if v2 != valid || n2 != next || m2 != maxTs {
			t.Fatalf("rescan of valid prefix: %d,%d,%d then %d,%d,%d", valid, next, maxTs, v2, n2, m2)
		}
	})
}

// FuzzRecoverSegment: any bytes as the last segment of a partition open
// without panic; recovery keeps exactly the valid prefix, is idempotent
// (a second open changes nothing), reads serve it, and verify is clean.
func FuzzRecoverSegment(f *testing.F) {
	addSegmentSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		mfs := memfs.New()
		fsys := memFS{mfs}
		if err := mfs.MkdirAll("/data/t-0", 0o755); err != nil {
			t.Fatal(err)
		}
		name := "/data/t-0/00000000000000000000.log"
		w, err := mfs.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteAt(b, 0); err != nil {
			t.Fatal(err)
		}
		w.Close()
		mfs.MarkAllSynced()
		valid, next, _ := ScanBatches(b, 0)

		for round := 0; round < 2; round++ {
			s := OpenStore(Options{FS: fsys, Logger: zap.NewNop()})
			p, err := s.OpenPartition("/data/t-0", Config{})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			if p.LogEndOffset() != next {
				t.Fatalf("round %d: leo %d, valid prefix ends at %d", round, p.LogEndOffset(), next)
			}
			got, _ := mfs.ReadFile(name)
			if !bytes.Equal(got, b[:valid]) {
				t.Fatalf("round %d: file is %d bytes after recovery, valid prefix %d", round, len(got), valid)
			}
			if next > 0 {
				res, err := p.Read(0, int64(len(b)))
				if err != nil {
					t.Fatal(err)
				}
				out, _ := res.AppendTo(nil)
				res.Release()
				if !bytes.Equal(out, b[:valid]) {
					t.Fatalf("read returned %d bytes, valid prefix %d", len(out), valid)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			rep, err := VerifyDir(fsys, "/data/t-0")
			if err != nil || !rep.OK() || len(rep.Notes) != 0 {
				t.Fatalf("verify after recovery: %v %+v", err, rep)
			}
		}
	})
}
