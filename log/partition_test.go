package log

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/synapsebroker/synapse/internal/memfs"
	"github.com/synapsebroker/synapse/log/internal/testbatch"
)

// TestPartitionPermutations appends, reads, closes, reopens (cleanly and after
// a crash) across segment size × index interval × durability policy.
func TestPartitionPermutations(t *testing.T) {
	for _, segBytes := range []int64{600, 8 << 10, 1 << 20} {
		for _, interval := range []int64{1, 512, 4096} {
			for _, policy := range []time.Duration{0, 2 * time.Millisecond} {
				name := fmt.Sprintf("seg=%d/index=%d/interval=%v", segBytes, interval, policy)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					testPermutation(t, segBytes, interval, policy)
				})
			}
		}
	}
}

func testPermutation(t *testing.T, segBytes, interval int64, policy time.Duration) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	mfs, fsys := newMemFS(t)
	cfg := Config{SegmentBytes: segBytes, IndexIntervalBytes: interval}
	s := openStore(t, fsys, policy)
	p := mustOpen(t, s, "/data/t-0", cfg)
	want := map[int64][]byte{}
	ts := int64(1_700_000_000_000)
	var last AppendResult
	for i := 0; i < 300; i++ {
		b := randBatch(rng, ts+int64(i)*10+int64(rng.IntN(200))-100, 300) // timestamps out of order
		res, err := p.Append(b)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && res.BaseOffset != last.LastOffset+1 {
			t.Fatalf("offsets not contiguous: %d after %d", res.BaseOffset, last.LastOffset)
		}
		want[res.BaseOffset] = storedCopy(b, res.BaseOffset)
		last = res
		if i%7 == 0 {
			if err := p.WaitDurable(res.LastOffset + 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.WaitDurable(last.LastOffset + 1); err != nil {
		t.Fatal(err)
	}
	if got := p.HighWatermark(); got != last.LastOffset+1 {
		t.Fatalf("hw %d, want %d", got, last.LastOffset+1)
	}
	if n := readAll(t, p, rng, want); n != 300 {
		t.Fatalf("read %d batches, want 300", n)
	}
	checkInsideBatchReads(t, p, want)
	checkTimestamps(t, p, want)

	// A crash now loses nothing: under the durable policy everything
	// acknowledged was synced; under the interval policy, after a Sync.
	if policy > 0 {
		if err := p.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	crashed := memFS{mfs.CrashClone(memfs.CrashConfig{Rand: rng, UnsyncedMode: memfs.KeepRandomPrefix})}
	s2 := openStore(t, crashed, policy)
	p2 := mustOpen(t, s2, "/data/t-0", cfg)
	if p2.LogEndOffset() != last.LastOffset+1 {
		t.Fatalf("after crash leo %d, want %d", p2.LogEndOffset(), last.LastOffset+1)
	}
	readAll(t, p2, rng, want)
	checkVerify(t, crashed, "/data/t-0")

	// Clean close and reopen: no scan needed, same contents, appends continue.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	checkVerify(t, fsys, "/data/t-0")
	p = mustOpen(t, s, "/data/t-0", cfg)
	if p.LogEndOffset() != last.LastOffset+1 {
		t.Fatalf("after reopen leo %d, want %d", p.LogEndOffset(), last.LastOffset+1)
	}
	b := randBatch(rng, ts, 100)
	res, err := p.Append(b)
	if err != nil {
		t.Fatal(err)
	}
	if res.BaseOffset != last.LastOffset+1 {
		t.Fatalf("append after reopen at %d, want %d", res.BaseOffset, last.LastOffset+1)
	}
	want[res.BaseOffset] = storedCopy(b, res.BaseOffset)
	if err := p.WaitDurable(res.LastOffset + 1); err != nil {
		t.Fatal(err)
	}
	if n := readAll(t, p, rng, want); n != 301 {
		t.Fatalf("read %d batches, want 301", n)
	}
}

// checkInsideBatchReads asks for every offset inside multi-record batches:
// the read must start with the batch that contains it.
func checkInsideBatchReads(t *testing.T, p *Partition, want map[int64][]byte) {
	t.Helper()
	for base, b := range want {
		h, _ := ParseBatchHeader(b)
		for off := base; off <= h.LastOffset(); off++ {
			res, err := p.Read(off, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Chunks) != 1 || res.Chunks[0].FirstOffset != base || res.Bytes != int64(len(b)) {
				t.Fatalf("read %d: got %+v, want the one batch at %d (%d bytes)", off, res.Chunks, base, len(b))
			}
			res.Release()
		}
	}
}

func checkTimestamps(t *testing.T, p *Partition, want map[int64][]byte) {
	t.Helper()
	// Brute force: the first batch (by offset) whose max timestamp >= ts.
	var bases []int64
	for b := range want {
		bases = append(bases, b)
	}
	sortInt64(bases)
	for _, probe := range bases {
		h, _ := ParseBatchHeader(want[probe])
		for _, ts := range []int64{h.MaxTimestamp, h.MaxTimestamp - 3, h.MaxTimestamp + 1} {
			wantOff, found := int64(-1), false
			for _, b := range bases {
				hh, _ := ParseBatchHeader(want[b])
				if hh.MaxTimestamp >= ts {
					wantOff, found = b, true
					break
				}
			}
			off, _, ok, err := p.OffsetForTimestamp(ts)
			if err != nil {
				t.Fatal(err)
			}
			if ok != found || (ok && off != wantOff) {
				t.Fatalf("offset for ts %d: got %d,%v want %d,%v", ts, off, ok, wantOff, found)
			}
		}
	}
}

func sortInt64(a []int64) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func checkVerify(t *testing.T, fsys FS, dir string) *VerifyReport {
	t.Helper()
	rep, err := VerifyDir(fsys, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("verify %s: %v", dir, rep.Damage)
	}
	return rep
}

func TestCheckBatch(t *testing.T) {
	good := testbatch.Make(testbatch.Options{Records: 3, ValueSize: 10})
	if _, err := CheckBatch(good, 0); err != nil {
		t.Fatal(err)
	}
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, tc := range []struct {
		name string
		b    []byte
		max  int
		want error
	}{
		{"crc", mut(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), 0, ErrBatchCorrupt},
		{"short", good[:40], 0, ErrBatchCorrupt},
		{"truncated", good[:len(good)-1], 0, ErrBatchCorrupt},
		{"trailing", append(append([]byte(nil), good...), 0), 0, ErrBatchCorrupt},
		{"negative length", mut(func(b []byte) []byte { b[8] = 0xff; return b }), 0, ErrBatchCorrupt},
		{"magic1", mut(func(b []byte) []byte { b[16] = 1; return b }), 0, ErrInvalidBatch},
		{"too large", good, len(good) - 1, ErrBatchTooLarge},
		{"count", testbatch.Make(testbatch.Options{Records: 3, Attributes: 0}), 0, nil},
		{"codec", testbatch.Make(testbatch.Options{Records: 1, Attributes: 7}), 0, ErrInvalidBatch},
	} {
		_, err := CheckBatch(tc.b, tc.max)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	// A header-only batch claiming more records than its bytes can hold.
	hdrOnly := testbatch.Make(testbatch.Options{Records: 1})[:BatchHeaderSize]
	binary.BigEndian.PutUint32(hdrOnly[8:], BatchHeaderSize-12)
	binary.BigEndian.PutUint32(hdrOnly[23:], 1<<30)
	binary.BigEndian.PutUint32(hdrOnly[57:], 1<<30+1)
	SetLogAppendTime(hdrOnly, 5)
	if _, err := CheckBatch(hdrOnly, 0); !errors.Is(err, ErrInvalidBatch) {
		t.Errorf("header-only batch claiming 2^30 records: %v", err)
	}
	// Record count inconsistent with lastOffsetDelta (CRC kept valid).
	b := mut(func(b []byte) []byte { b[60] = 9; return b })
	SetLogAppendTime(b, 5) // recomputes the CRC
	if _, err := CheckBatch(b, 0); !errors.Is(err, ErrInvalidBatch) {
		t.Errorf("count: got %v", err)
	}
}

func TestGroupCommitSharesFsyncs(t *testing.T) {
	mfs, fsys := newMemFS(t)
	var mu sync.Mutex
	syncs := 0
	mfs.SetInjector(func(op memfs.Op, path string) error {
		if op == memfs.OpSync {
			mu.Lock()
			syncs++
			mu.Unlock()
		}
		return nil
	})
	s := openStore(t, fsys, 0)
	const parts, writers, per = 4, 16, 50
	var ps []*Partition
	for i := 0; i < parts; i++ {
		ps = append(ps, mustOpen(t, s, fmt.Sprintf("/data/t-%d", i), Config{}))
	}
	mu.Lock()
	syncs = 0
	mu.Unlock()
	var wg sync.WaitGroup
	errs := make(chan error, parts*writers)
	for i := 0; i < parts*writers; i++ {
		wg.Add(1)
		go func(p *Partition) {
			defer wg.Done()
			for j := 0; j < per; j++ {
				res, err := p.Append(testbatch.Make(testbatch.Options{Records: 1, ValueSize: 100}))
				if err == nil {
					err = p.WaitDurable(res.LastOffset + 1)
				}
				if err != nil {
					errs <- err
					return
				}
				if p.HighWatermark() <= res.LastOffset {
					errs <- fmt.Errorf("durable append %d not below hw %d", res.LastOffset, p.HighWatermark())
					return
				}
			}
		}(ps[i%parts])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mu.Lock()
	n := syncs
	mu.Unlock()
	total := parts * writers * per
	t.Logf("%d durable appends, %d fsyncs", total, n)
	if n >= total/2 {
		t.Fatalf("%d fsyncs for %d concurrent durable appends: group commit is not sharing", n, total)
	}
	for _, p := range ps {
		if p.HighWatermark() != writers*per {
			t.Fatalf("hw %d, want %d", p.HighWatermark(), writers*per)
		}
	}
}

func TestIntervalPolicyVisibleAtOnce(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, time.Hour)
	p := mustOpen(t, s, "/data/t-0", Config{})
	res, err := p.Append(testbatch.Make(testbatch.Options{Records: 2}))
	if err != nil {
		t.Fatal(err)
	}
	if p.HighWatermark() != res.LastOffset+1 {
		t.Fatalf("interval policy: hw %d, want log end %d", p.HighWatermark(), res.LastOffset+1)
	}
	if err := p.WaitDurable(res.LastOffset + 1); err != nil {
		t.Fatal(err)
	}
}

func TestReadOffsets(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 1000})
	for i := 0; i < 20; i++ {
		res, err := p.Append(testbatch.Make(testbatch.Options{Records: 2, ValueSize: 50}))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Read(41, 100); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("read past end: %v", err)
	}
	res, err := p.Read(40, 100)
	if err != nil || len(res.Chunks) != 0 {
		t.Fatalf("read at end: %v %+v", err, res)
	}
	// A budget smaller than one batch still returns that batch.
	res, err = p.Read(0, 1)
	if err != nil || res.Bytes == 0 || len(res.Chunks) != 1 {
		t.Fatalf("read with tiny budget: %v %+v", err, res)
	}
	res.Release()
	// A large budget crosses segments.
	res, err = p.Read(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Chunks) < 2 {
		t.Fatalf("read did not cross segments: %d chunks", len(res.Chunks))
	}
	res.Release()
}

func TestRetention(t *testing.T) {
	mfs, fsys := newMemFS(t)
	now := time.UnixMilli(1_700_000_000_000)
	s := OpenStore(Options{FS: fsys, Now: func() time.Time { return now }})
	defer s.Close()
	cfg := Config{SegmentBytes: 1000, RetentionBytes: 3000}
	p := mustOpen(t, s, "/data/t-0", cfg)
	for i := 0; i < 40; i++ {
		b := testbatch.Make(testbatch.Options{Records: 1, ValueSize: 150, Timestamp: now.UnixMilli() - int64(40-i)*60_000})
		res, err := p.Append(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
	}
	nsegs := len(p.segments())
	n, err := p.Maintain(now)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, seg := range p.segments() {
		total += seg.size.Load()
	}
	if n == 0 || total > 3000+1000 || len(p.segments()) != nsegs-n {
		t.Fatalf("retention.bytes: deleted %d of %d segments, %d bytes left", n, nsegs, total)
	}
	if p.LogStartOffset() != p.segments()[0].base {
		t.Fatalf("log start %d, first segment %d", p.LogStartOffset(), p.segments()[0].base)
	}
	if _, err := p.Read(0, 100); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("read below log start: %v", err)
	}
	// Age: everything older than 10 minutes goes (not the active segment).
	cfg.RetentionBytes = -1
	cfg.RetentionMs = 10 * 60_000
	p.SetConfig(cfg)
	if _, err := p.Maintain(now); err != nil {
		t.Fatal(err)
	}
	for _, seg := range p.segments()[:len(p.segments())-1] {
		if now.UnixMilli()-seg.maxTs.Load() > cfg.RetentionMs {
			t.Fatalf("segment %d with max ts %d kept", seg.base, seg.maxTs.Load())
		}
	}
	// DeleteRecords inside a segment; survives a crash.
	target := p.HighWatermark() - 2
	if _, err := p.DeleteRecordsBefore(target); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DeleteRecordsBefore(p.HighWatermark() + 1); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("delete past hw: %v", err)
	}
	crashed := memFS{mfs.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	s2 := openStore(t, crashed, 0)
	p2 := mustOpen(t, s2, "/data/t-0", cfg)
	if p2.LogStartOffset() != target {
		t.Fatalf("log start after crash %d, want %d", p2.LogStartOffset(), target)
	}
	res, err := p2.Read(target, 1)
	if err != nil || len(res.Chunks) != 1 || res.Chunks[0].FirstOffset != target {
		t.Fatalf("read at new log start: %v %+v", err, res)
	}
	res.Release()
}

func TestSegmentRollByAge(t *testing.T) {
	_, fsys := newMemFS(t)
	now := time.UnixMilli(1_700_000_000_000)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := OpenStore(Options{FS: fsys, Now: clock})
	defer s.Close()
	p := mustOpen(t, s, "/data/t-0", Config{SegmentMs: 1000})
	if _, err := p.Append(testbatch.Make(testbatch.Options{Records: 1, Timestamp: now.UnixMilli()})); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	if _, err := p.Maintain(clock()); err != nil {
		t.Fatal(err)
	}
	if len(p.segments()) != 2 {
		t.Fatalf("idle segment did not roll by segment.ms: %d segments", len(p.segments()))
	}
	if p.HighWatermark() != 1 {
		t.Fatalf("hw %d after roll", p.HighWatermark())
	}
}

// TestHugeSegmentMsNeverRolls: segment.ms of Long.MaxValue (valid in
// Kafka: never roll by age) does not wrap into a roll on every append.
func TestHugeSegmentMsNeverRolls(t *testing.T) {
	_, fsys := newMemFS(t)
	s := OpenStore(Options{FS: fsys})
	defer s.Close()
	p := mustOpen(t, s, "/data/t-0", Config{SegmentMs: math.MaxInt64, RetentionMs: -1})
	for i := 0; i < 5; i++ {
		if _, err := p.Append(testbatch.Make(testbatch.Options{Records: 1, Timestamp: 1})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Maintain(time.Now()); err != nil {
		t.Fatal(err)
	}
	if n := len(p.segments()); n != 1 {
		t.Fatalf("%d segments after 5 small appends with segment.ms = Long.MaxValue", n)
	}
}

// TestConcurrentAppendReadRetention runs appenders, long-polling readers,
// retention and DeleteRecords at once (meant for -race): readers must only
// ever see whole, correct batches below the high watermark, or be told their
// offset is out of range.
func TestConcurrentAppendReadRetention(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 4000, IndexIntervalBytes: 256, RetentionBytes: 20000})
	const appenders, per = 4, 150
	stop := make(chan struct{})
	var wg, readers sync.WaitGroup
	errs := make(chan error, 16)
	for i := 0; i < appenders; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < per; j++ {
				b := testbatch.Make(testbatch.Options{Records: 1 + j%4, ValueSize: 40 + j, Fill: byte(i), Timestamp: int64(j)})
				res, err := p.Append(b)
				if err == nil && j%3 == 0 {
					err = p.WaitDurable(res.LastOffset + 1)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(i)
	}
	for r := 0; r < 3; r++ {
		readers.Add(1)
		go func() {
			defer readers.Done()
			off := int64(0)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ch := p.Notify()
				res, err := p.Read(off, 3000)
				if errors.Is(err, ErrOffsetOutOfRange) {
					off = p.LogStartOffset()
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				buf, err := res.AppendTo(nil)
				hw, next := res.HighWatermark, res.NextOffset
				res.Release()
				if err != nil {
					errs <- err
					return
				}
				if len(buf) == 0 {
					select {
					case <-ch:
					case <-stop:
						return
					}
					continue
				}
				if _, n, _ := ScanBatches(buf, mustBase(buf)); n != next || next > hw {
					errs <- fmt.Errorf("read at %d: batches end at %d, NextOffset %d, hw %d", off, n, next, hw)
					return
				}
				off = next
			}
		}()
	}
	readers.Add(1)
	go func() {
		defer readers.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if _, err := p.Maintain(time.Now()); err != nil {
				errs <- err
				return
			}
			if hw := p.HighWatermark(); hw > 10 {
				if _, err := p.DeleteRecordsBefore(hw - 10); err != nil {
					errs <- err
					return
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	if p.LogEndOffset() == 0 || p.HighWatermark() != p.LogEndOffset() {
		t.Fatalf("leo %d hw %d", p.LogEndOffset(), p.HighWatermark())
	}
	p.Close()
	checkVerify(t, fsys, "/data/t-0")
}

func mustBase(b []byte) int64 {
	h, _ := ParseBatchHeader(b)
	return h.BaseOffset
}

func TestDeletePartition(t *testing.T) {
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 500})
	for i := 0; i < 10; i++ {
		if _, err := p.Append(testbatch.Make(testbatch.Options{Records: 1, ValueSize: 100})); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Delete(); err != nil {
		t.Fatal(err)
	}
	if names, _ := fsys.ReadDir("/data"); len(names) != 0 {
		t.Fatalf("left behind: %v", names)
	}
	crashed := memFS{mfs.CrashClone(memfs.CrashConfig{})}
	if names, _ := crashed.ReadDir("/data"); len(names) != 0 {
		t.Fatalf("deletion not durable: %v", names)
	}
}
