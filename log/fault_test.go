package log

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/synapsebroker/synapse/internal/memfs"
	"github.com/synapsebroker/synapse/log/internal/testbatch"
)

// appendDurable appends n batches and waits for each; it returns what the log
// must hold and the first error.
func appendDurable(p *Partition, rng *rand.Rand, n int, want map[int64][]byte) error {
	for i := 0; i < n; i++ {
		b := randBatch(rng, 1_700_000_000_000, 200)
		res, err := p.Append(b)
		if err != nil {
			return err
		}
		if err := p.WaitDurable(res.LastOffset + 1); err != nil {
			return err
		}
		want[res.BaseOffset] = storedCopy(b, res.BaseOffset)
	}
	return nil
}

func TestFsyncErrorTakesPartitionOffline(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 4000})
	want := map[int64][]byte{}
	if err := appendDurable(p, rng, 10, want); err != nil {
		t.Fatal(err)
	}
	eio := errors.New("injected EIO")
	mfs.SetInjector(memfs.FailNth(memfs.OpSync, 1, eio))
	err := appendDurable(p, rng, 5, map[int64][]byte{})
	if !errors.Is(err, ErrStorage) || !errors.Is(err, eio) {
		t.Fatalf("durable append with failing fsync: %v, want ErrStorage wrapping the I/O error", err)
	}
	mfs.SetInjector(nil)
	// Latched: no retry, no silent success even though fsync works again.
	if _, err := p.Append(randBatch(rng, 0, 10)); !errors.Is(err, ErrStorage) {
		t.Fatalf("append after fsync failure: %v, want ErrStorage", err)
	}
	if _, err := p.Read(0, 100); !errors.Is(err, ErrStorage) {
		t.Fatalf("read on offline partition: %v", err)
	}
	// What was acknowledged before the failure survives a crash.
	clone := memFS{mfs.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	p2 := mustOpen(t, openStore(t, clone, 0), "/data/t-0", Config{SegmentBytes: 4000})
	readAll(t, p2, rng, want)
	if p2.LogEndOffset() < int64(len(want)) {
		t.Fatalf("acked data lost: leo %d", p2.LogEndOffset())
	}
}

// durablePartition opens partition /data/t-0 with cfg on a fresh memory
// file system and appends n random batches durably (rng seeded with seed),
// recorded in want.
func durablePartition(t *testing.T, seed uint64, n int, cfg Config) (*rand.Rand, *memfs.FS, FS, *Store, *Partition, map[int64][]byte) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed+1))
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", cfg)
	want := map[int64][]byte{}
	if err := appendDurable(p, rng, n, want); err != nil {
		t.Fatal(err)
	}
	return rng, mfs, fsys, s, p, want
}

// secondSegment returns p's second segment (p must have at least four)
// and its batches.
func secondSegment(t *testing.T, p *Partition, fsys FS) (*segment, []SegmentBatch) {
	t.Helper()
	segs := p.segments()
	if len(segs) < 4 {
		t.Fatalf("want several segments, got %d", len(segs))
	}
	var batches []SegmentBatch
	if _, _, err := DumpSegment(fsys, segs[1].logPath, func(b SegmentBatch) { batches = append(batches, b) }); err != nil {
		t.Fatal(err)
	}
	return segs[1], batches
}

// A full disk refuses the batch (ErrResource, retriable) and leaves the
// partition online: whatever part of the batch landed is cut back, the next
// append goes where the log ends, and a crash then loses nothing acknowledged.
func TestWriteErrorENOSPC(t *testing.T) {
	for _, tc := range []struct {
		name string
		inj  memfs.Injector
	}{
		{"nothing written", memfs.FailNth(memfs.OpWrite, 1, syscall.ENOSPC)},
		{"short write", memfs.ShortWriteNth(1, 70, syscall.ENOSPC)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng, mfs, _, _, p, want := durablePartition(t, 3, 10, Config{})
			leo := p.LogEndOffset()
			mfs.SetInjector(tc.inj)
			_, err := p.Append(randBatch(rng, 0, 200))
			if !errors.Is(err, ErrResource) || errors.Is(err, ErrStorage) || !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("append on full disk: %v, want ErrResource wrapping ENOSPC", err)
			}
			mfs.SetInjector(nil)
			if p.Err() != nil || p.LogEndOffset() != leo {
				t.Fatalf("after ENOSPC: err %v, leo %d (want online at %d)", p.Err(), p.LogEndOffset(), leo)
			}
			if err := appendDurable(p, rng, 3, want); err != nil {
				t.Fatalf("append once space is back: %v", err)
			}
			readAll(t, p, rng, want)
			clone := memFS{mfs.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
			p2 := mustOpen(t, openStore(t, clone, 0), "/data/t-0", Config{})
			readAll(t, p2, rng, want)
			if p2.LogEndOffset() != p.LogEndOffset() {
				t.Fatalf("leo %d after crash, want %d", p2.LogEndOffset(), p.LogEndOffset())
			}
		})
	}
}

func TestShortWriteTornTail(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{})
	want := map[int64][]byte{}
	if err := appendDurable(p, rng, 10, want); err != nil {
		t.Fatal(err)
	}
	leo := p.LogEndOffset()
	mfs.SetInjector(memfs.ShortWriteNth(1, 70, syscall.EIO))
	if _, err := p.Append(randBatch(rng, 0, 200)); !errors.Is(err, ErrStorage) {
		t.Fatalf("short write: %v", err)
	}
	mfs.SetInjector(nil)
	s.Close()
	rep, err := VerifyDir(fsys, "/data/t-0")
	if err != nil || !rep.OK() || len(rep.Notes) == 0 {
		t.Fatalf("verify of a torn tail: %v %+v (want a note, no damage)", err, rep)
	}
	p2 := mustOpen(t, openStore(t, fsys, 0), "/data/t-0", Config{})
	if p2.LogEndOffset() != leo {
		t.Fatalf("leo %d after torn write, want %d", p2.LogEndOffset(), leo)
	}
	if err := appendDurable(p2, rng, 3, want); err != nil {
		t.Fatal(err)
	}
	readAll(t, p2, rng, want)
	p2.Close()
	checkVerify(t, fsys, "/data/t-0")
}

// TestBitRotInSealedSegment flips a byte inside a sealed segment: verify
// reports it, reads return the good batches before it and then an error,
// never the damaged bytes; other segments stay readable.
func TestBitRotInSealedSegment(t *testing.T) {
	cfg := Config{SegmentBytes: 3000, IndexIntervalBytes: 300}
	_, mfs, fsys, _, p, want := durablePartition(t, 7, 60, cfg)
	victim, batches := secondSegment(t, p, fsys)
	p.Close()
	// Damage the last byte of the middle batch of the segment: inside its
	// records, so only the CRC can tell.
	mid := batches[len(batches)/2]
	if err := mfs.Corrupt(victim.logPath, mid.Pos+int64(mid.Header.Length)-1, 0x40); err != nil {
		t.Fatal(err)
	}
	rep, err := VerifyDir(fsys, "/data/t-0")
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() {
		t.Fatalf("verify missed bit rot in %s", victim.logPath)
	}
	t.Logf("verify: %v", rep.Damage)

	// Without its index the segment must be rebuilt at open, which meets the
	// damage: the partition still opens, and only reads reaching it fail.
	if err := fsys.Remove(victim.indexPath()); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, openStore(t, fsys, 0), "/data/t-0", cfg)
	off := p.LogStartOffset()
	var sawErr bool
	for off < p.HighWatermark() {
		res, err := p.Read(off, 1<<20)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("read %d: %v, want ErrCorrupt", off, err)
			}
			sawErr = true
			off = victim.next.Load() // skip the damaged segment
			continue
		}
		buf, _ := res.AppendTo(nil)
		res.Release()
		for len(buf) > 0 {
			h, err := ParseBatchHeader(buf)
			if err != nil {
				t.Fatal(err)
			}
			if string(want[h.BaseOffset]) != string(buf[:h.Length]) {
				t.Fatalf("read returned damaged bytes for batch %d", h.BaseOffset)
			}
			off = h.NextOffset()
			buf = buf[h.Length:]
		}
	}
	if !sawErr {
		t.Fatal("reads never reported the damage")
	}
}

func TestCorruptIndexRebuilt(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	cfg := Config{SegmentBytes: 3000, IndexIntervalBytes: 100}
	p := mustOpen(t, s, "/data/t-0", cfg)
	want := map[int64][]byte{}
	if err := appendDurable(p, rng, 40, want); err != nil {
		t.Fatal(err)
	}
	segs := p.segments()
	p.Close()
	for _, seg := range segs {
		if err := mfs.Corrupt(seg.indexPath(), indexHeaderSize+3, 0x7); err != nil {
			t.Fatal(err)
		}
		if err := mfs.Corrupt(seg.timeIndexPath(), 20, 0x1); err != nil {
			t.Fatal(err)
		}
	}
	p = mustOpen(t, openStore(t, fsys, 0), "/data/t-0", cfg)
	readAll(t, p, rng, want)
	checkInsideBatchReads(t, p, want)
	p.Close()
	checkVerify(t, fsys, "/data/t-0")
}

// TestManyIdlePartitions opens 10 000 partitions: no goroutine per partition
// and open files stay under the bound.
func TestManyIdlePartitions(t *testing.T) {
	_, fsys := newMemFS(t)
	s := OpenStore(Options{FS: fsys, MaxOpenFiles: 100})
	defer s.Close()
	g0 := runtime.NumGoroutine()
	var ps []*Partition
	for i := 0; i < 10000; i++ {
		p := mustOpen(t, s, fmt.Sprintf("/data/t-%d", i), Config{})
		res, err := p.Append(testbatch.Make(testbatch.Options{Records: 1, ValueSize: 10}))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if n := s.OpenFiles(); n > 100 {
		t.Fatalf("%d files open, bound is 100", n)
	}
	if g := runtime.NumGoroutine(); g > g0+5 {
		t.Fatalf("goroutines grew from %d to %d with 10000 partitions", g0, g)
	}
	for _, i := range []int{0, 4999, 9999} {
		res, err := ps[i].Read(0, 1000)
		if err != nil || res.Bytes == 0 {
			t.Fatalf("read partition %d: %v", i, err)
		}
		res.Release()
	}
}

// TestOpenFileBoundOnDisk checks real descriptors on the real file system.
func TestOpenFileBoundOnDisk(t *testing.T) {
	dir := t.TempDir()
	s := OpenStore(Options{MaxOpenFiles: 20, SyncInterval: 1e9})
	defer s.Close()
	fds := func() int { n, _ := os.ReadDir("/proc/self/fd"); return len(n) }
	before := fds()
	for i := 0; i < 200; i++ {
		p := mustOpen(t, s, filepath.Join(dir, fmt.Sprintf("t-%d", i)), Config{})
		if _, err := p.Append(testbatch.Make(testbatch.Options{Records: 1})); err != nil {
			t.Fatal(err)
		}
		if err := p.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if n := fds() - before; n > 25 {
		t.Fatalf("%d descriptors open for 200 partitions, bound is 20", n)
	}
}

// TestKillThenPowerLoss: a process crash right after a roll (the new
// segment's directory entry not yet fsync'd), a restart that appends durably,
// then a power loss: nothing acknowledged after the restart may be lost.
func TestKillThenPowerLoss(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	mfs, fsys := newMemFS(t)
	cfg := Config{SegmentBytes: 1000}
	// The interval policy with a long interval: nothing syncs behind our back.
	s := OpenStore(Options{FS: fsys, SyncInterval: time.Hour})
	p := mustOpen(t, s, "/data/t-0", cfg)
	for len(p.segments()) < 3 { // the last roll's directory fsync is pending
		if _, err := p.Append(randBatch(rng, 0, 200)); err != nil {
			t.Fatal(err)
		}
	}
	// kill -9: freeze the file system as the process left it (page cache and
	// all), the dead process can do nothing more.
	mfs.SetInjector(func(memfs.Op, string) error { return memfs.ErrCrashed })
	s.Close()
	mfs.SetInjector(nil)

	s2 := openStore(t, fsys, 0)
	p2 := mustOpen(t, s2, "/data/t-0", cfg)
	acked := map[int64][]byte{}
	for i := 0; i < 3; i++ { // small: stays in the recovered last segment
		b := randBatch(rng, 0, 10)
		res, err := p2.Append(b)
		if err == nil {
			err = p2.WaitDurable(res.LastOffset + 1)
		}
		if err != nil {
			t.Fatal(err)
		}
		acked[res.BaseOffset] = storedCopy(b, res.BaseOffset)
	}
	if len(p2.segments()) != 3 {
		t.Fatalf("test needs the appends in the recovered segment; %d segments", len(p2.segments()))
	}
	// Power loss.
	clone := memFS{mfs.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	p3 := mustOpen(t, openStore(t, clone, 0), "/data/t-0", cfg)
	for off := range acked {
		if off >= p3.LogEndOffset() {
			t.Fatalf("batch %d acknowledged after the restart is gone after a power loss (leo %d)", off, p3.LogEndOffset())
		}
	}
	readAll(t, p3, rng, acked)
}

func TestWaitDurableBeyondLogEnd(t *testing.T) {
	_, fsys := newMemFS(t)
	p := mustOpen(t, openStore(t, fsys, 0), "/data/t-0", Config{})
	if err := p.WaitDurable(5); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("WaitDurable past the log end: %v", err)
	}
}

// TestLeftoverSegmentsBelowLogStart: a crash after the log start moved but
// before the files went; the next open removes them.
func TestLeftoverSegmentsBelowLogStart(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	mfs, fsys := newMemFS(t)
	cfg := Config{SegmentBytes: 1000}
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", cfg)
	if err := appendDurable(p, rng, 30, map[int64][]byte{}); err != nil {
		t.Fatal(err)
	}
	mfs.SetInjector(memfs.FailNth(memfs.OpRemove, 1, errors.New("injected")))
	target := p.segments()[2].base
	if _, err := p.DeleteRecordsBefore(target); err == nil {
		t.Fatal("removal failure not reported")
	}
	mfs.SetInjector(nil)
	p.Close()
	p = mustOpen(t, openStore(t, fsys, 0), "/data/t-0", cfg)
	if p.LogStartOffset() != target || p.segments()[0].base != target {
		t.Fatalf("log start %d, first segment %d, want both %d", p.LogStartOffset(), p.segments()[0].base, target)
	}
	names, _ := fsys.ReadDir("/data/t-0")
	for _, n := range names {
		if b, ok := parseSegmentName(n, ".log"); ok && b < target {
			t.Fatalf("segment %s below the log start still on disk", n)
		}
	}
}

// TestSealedSegmentsSurviveACrash: a segment SealedSegments reports (which
// tiering may upload and commit to a manifest at once) is still sealed
// after a power loss right after the roll, with nothing synced since: the
// new active segment's directory entry is durable with the roll. If it
// were not, the sealed segment would come back as the active one and grow
// past what the bucket holds of it.
func TestSealedSegmentsSurviveACrash(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, time.Hour) // no sync round unless one is waited for
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 4000})
	for i := 0; i < 200 && len(p.SealedSegments()) == 0; i++ {
		if _, err := p.Append(randBatch(rng, 0, 300)); err != nil {
			t.Fatal(err)
		}
	}
	sealed := p.SealedSegments()
	if len(sealed) == 0 {
		t.Fatal("no roll")
	}
	clone := memFS{mfs.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	p2 := mustOpen(t, openStore(t, clone, 0), "/data/t-0", Config{SegmentBytes: 4000})
	after := p2.SealedSegments()
	if len(after) < len(sealed) {
		t.Fatalf("after a crash right after the roll: %d sealed segments, %d before", len(after), len(sealed))
	}
	for i, sg := range sealed {
		if after[i].Base != sg.Base || after[i].Next != sg.Next || after[i].Size != sg.Size {
			t.Fatalf("sealed segment %d: %+v before the crash, %+v after", i, sg, after[i])
		}
	}
}

// TestConcurrentFsyncFailureIsNotLost: an fsync of the active file that
// fails while a roll fsyncs the same file is latched before the roll's
// fsync runs, so the roll (whose fsync the kernel would answer with
// success: a writeback error is reported once) neither seals the segment
// nor moves the high watermark over pages that never reached the disk.
func TestConcurrentFsyncFailureIsNotLost(t *testing.T) {
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0) // durable: the high watermark waits for fsync
	p := mustOpen(t, s, "/data/t-0", Config{})
	if _, err := p.Append(testbatch.Make(testbatch.Options{Records: 1, Timestamp: 1})); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var syncs atomic.Int32
	mfs.SetInjector(func(op memfs.Op, path string) error {
		if op != memfs.OpSync || !strings.HasSuffix(path, ".log") {
			return nil
		}
		if syncs.Add(1) == 1 {
			close(entered)
			<-release
			return syscall.EIO // this fsync loses the pages
		}
		return nil // a later fsync of the same file: no error left to report
	})
	synced := make(chan struct{})
	go func() { p.Sync(); close(synced) }()
	<-entered
	rolled := make(chan error, 1)
	go func() { rolled <- p.Roll() }()
	time.Sleep(50 * time.Millisecond) // the roll reaches its fsync
	close(release)
	<-synced
	if err := <-rolled; err == nil {
		t.Fatal("the roll succeeded beside a failed fsync of the same file")
	}
	if hw := p.HighWatermark(); hw != 0 {
		t.Fatalf("high watermark %d over pages whose fsync failed", hw)
	}
	if n := len(p.SealedSegments()); n != 0 {
		t.Fatalf("%d segments sealed over a failed fsync", n)
	}
}

// TestSealedSegmentShortOrMissing: a sealed segment cut at a batch
// boundary, or a whole segment missing between two, leaves the partition
// openable (the broker starts); the missing offsets read as ErrCorrupt and
// every other batch reads back whole.
func TestSealedSegmentShortOrMissing(t *testing.T) {
	for _, damage := range []string{"cut", "missing"} {
		t.Run(damage, func(t *testing.T) {
			cfg := Config{SegmentBytes: 3000, IndexIntervalBytes: 300, RetentionMs: -1}
			_, mfs, fsys, _, p, want := durablePartition(t, 11, 60, cfg)
			victim, batches := secondSegment(t, p, fsys)
			lost := map[int64]bool{} // base offsets of the batches gone
			p.Close()
			switch damage {
			case "cut": // the last batch gone, the cut at a batch boundary
				last := batches[len(batches)-1]
				lost[last.Header.BaseOffset] = true
				f, err := mfs.OpenFile(victim.logPath, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := f.Truncate(last.Pos); err != nil {
					t.Fatal(err)
				}
				f.Close()
				fsys.Remove(victim.indexPath()) // rebuilt from the short file
			case "missing":
				for _, b := range batches {
					lost[b.Header.BaseOffset] = true
				}
				for _, path := range []string{victim.logPath, victim.indexPath(), victim.timeIndexPath()} {
					if err := fsys.Remove(path); err != nil {
						t.Fatal(err)
					}
				}
			}
			p, err := openStore(t, fsys, 0).OpenPartition("/data/t-0", cfg)
			if err != nil {
				t.Fatalf("open with a %s sealed segment: %v", damage, err)
			}
			defer p.Close()
			for off := range want {
				res, err := p.Read(off, 1)
				if lost[off] {
					if !errors.Is(err, ErrCorrupt) {
						t.Fatalf("read of lost batch %d: %v, want ErrCorrupt", off, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("read %d: %v", off, err)
				}
				buf, _ := res.AppendTo(nil)
				res.Release()
				if h, _ := ParseBatchHeader(buf); h.BaseOffset != off || string(buf[:h.Length]) != string(want[off]) {
					t.Fatalf("read %d: wrong batch %d", off, h.BaseOffset)
				}
			}
		})
	}
}

// TestFailedFsyncBytesGoAtRestart: after an fsync fails, a restart without
// a reboot (the failed pages still in the page cache, and a later fsync
// would not report them again) cuts the bytes past the last successful
// fsync, which were never acknowledged, instead of counting them durable
// and appending acknowledged records after a hole the next reboot opens.
func TestFailedFsyncBytesGoAtRestart(t *testing.T) {
	rng, mfs, fsys, s, p, want := durablePartition(t, 13, 10, Config{})
	acked := p.LogEndOffset()
	mfs.SetInjector(memfs.FailNth(memfs.OpSync, 1, syscall.EIO))
	if err := appendDurable(p, rng, 3, map[int64][]byte{}); !errors.Is(err, ErrStorage) {
		t.Fatalf("append with a failing fsync: %v", err)
	}
	mfs.SetInjector(nil)
	s.Close()
	// The restart reads the same (page-cache) view of the files.
	p2 := mustOpen(t, openStore(t, fsys, 0), "/data/t-0", Config{})
	if leo := p2.LogEndOffset(); leo != acked {
		t.Fatalf("log end %d after a restart, want %d: bytes whose fsync failed count as durable", leo, acked)
	}
	readAll(t, p2, rng, want)
	if err := appendDurable(p2, rng, 3, want); err != nil {
		t.Fatal(err)
	}
	end := p2.LogEndOffset()
	p2.Close()
	// The mark is gone: a further restart keeps what was appended since.
	p3 := mustOpen(t, openStore(t, fsys, 0), "/data/t-0", Config{})
	if leo := p3.LogEndOffset(); leo != end {
		t.Fatalf("log end %d after the next restart, want %d", leo, end)
	}
	readAll(t, p3, rng, want)
}
