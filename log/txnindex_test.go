package log

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/synapsebroker/synapse/internal/memfs"
	"github.com/synapsebroker/synapse/log/internal/testbatch"
)

// txnDataBatch is a transactional batch of n records of producer pid.
func txnDataBatch(pid int64, n int) []byte {
	return testbatch.Make(testbatch.Options{Records: n, ValueSize: 40, Timestamp: 1_700_000_000_000,
		ProducerID: pid, Attributes: 0x10, Fill: byte(pid)})
}

// markerBatch is a control batch (COMMIT or ABORT marker) of producer pid,
// as a transaction coordinator writes it.
func markerBatch(pid int64, typ int16) []byte {
	var rec []byte
	rec = append(rec, 0)              // attributes
	rec = binary.AppendVarint(rec, 0) // timestamp delta
	rec = binary.AppendVarint(rec, 0) // offset delta
	rec = binary.AppendVarint(rec, 4) // key length
	rec = binary.BigEndian.AppendUint16(rec, 0)
	rec = binary.BigEndian.AppendUint16(rec, uint16(typ))
	rec = binary.AppendVarint(rec, 6) // value: version int16, coordinator epoch int32
	rec = binary.BigEndian.AppendUint16(rec, 0)
	rec = binary.BigEndian.AppendUint32(rec, 7)
	rec = binary.AppendUvarint(rec, 0) // headers
	recs := binary.AppendVarint(nil, int64(len(rec)))
	recs = append(recs, rec...)
	b := make([]byte, 61, 61+len(recs))
	be := binary.BigEndian
	be.PutUint32(b[8:], uint32(49+len(recs)))
	b[16] = 2
	be.PutUint16(b[21:], 0x30) // transactional, control
	be.PutUint64(b[27:], 1_700_000_000_000)
	be.PutUint64(b[35:], 1_700_000_000_000)
	be.PutUint64(b[43:], uint64(pid))
	be.PutUint32(b[53:], ^uint32(0)) // base sequence -1
	be.PutUint32(b[57:], 1)
	b = append(b, recs...)
	be.PutUint32(b[17:], crc32.Checksum(b[21:], castagnoli))
	return b
}

func mustAppend(t testing.TB, p *Partition, b []byte) AppendResult {
	t.Helper()
	res, err := p.Append(b)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// txnWorkload appends transactions of a few producers, interleaved, each
// ended by a marker (about half aborted, recorded with AddAborted), with
// the LSO each marker leaves computed as a coordinator would. It returns
// the aborted entries in marker order.
type txnWorkload struct {
	rng     *rand.Rand
	open    map[int64]int64 // producer → first offset of its open transaction
	aborted []AbortedTxn
}

func newTxnWorkload(seed uint64) *txnWorkload {
	return &txnWorkload{rng: rand.New(rand.NewPCG(seed, 17)), open: map[int64]int64{}}
}

// step appends one batch: data of a producer (opening its transaction) or
// the marker ending one.
func (w *txnWorkload) step(t testing.TB, p *Partition) error {
	pid := int64(1 + w.rng.IntN(3))
	first, isOpen := w.open[pid]
	if !isOpen || w.rng.IntN(3) > 0 {
		res, err := p.Append(txnDataBatch(pid, 1+w.rng.IntN(3)))
		if err != nil {
			return err
		}
		if !isOpen {
			w.open[pid] = res.BaseOffset
		}
		return nil
	}
	abort := w.rng.IntN(2) == 0
	typ := ControlCommit
	if abort {
		typ = ControlAbort
	}
	res, err := p.Append(markerBatch(pid, typ))
	if err != nil {
		return err
	}
	delete(w.open, pid)
	lso := res.LastOffset + 1
	for _, f := range w.open {
		lso = min(lso, f)
	}
	if abort {
		a := AbortedTxn{ProducerID: pid, FirstOffset: first, LastOffset: res.LastOffset, LastStableOffset: lso}
		if err := p.AddAborted(a); err != nil {
			return err
		}
		w.aborted = append(w.aborted, a)
	}
	return nil
}

// refAborted is AbortedTxns computed from all entries (in marker order)
// and the local segments' bases.
func refAborted(p *Partition, all []AbortedTxn, from, upper int64) []AbortedTxn {
	segs := p.segments()
	start := segs[0].base
	for _, s := range segs {
		if s.base <= from {
			start = s.base
		}
	}
	var out []AbortedTxn
	for _, e := range all {
		if e.LastOffset < start {
			continue
		}
		if e.LastOffset >= from && e.FirstOffset < upper {
			out = append(out, e)
		}
		if e.LastStableOffset >= upper {
			break
		}
	}
	return out
}

func checkAborted(t *testing.T, p *Partition, all []AbortedTxn, from, upper int64) {
	t.Helper()
	got, err := p.AbortedTxns(nil, from, upper)
	if err != nil {
		t.Fatal(err)
	}
	if want := refAborted(p, all, from, upper); !slices.Equal(got, want) {
		t.Fatalf("AbortedTxns(%d, %d):\n got %v\nwant %v", from, upper, got, want)
	}
}

func allAborted(t testing.TB, p *Partition) []AbortedTxn {
	t.Helper()
	var out []AbortedTxn
	for _, seg := range p.segments() {
		es, err := p.SegmentAbortedTxns(seg.base)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, es...)
	}
	return out
}

var txnCfg = Config{SegmentBytes: 700, IndexIntervalBytes: 100}

func TestTxnIndexAddAndCollect(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", txnCfg)
	w := newTxnWorkload(1)
	for i := 0; i < 300; i++ {
		if err := w.step(t, p); err != nil {
			t.Fatal(err)
		}
	}
	if len(w.aborted) < 20 || p.SegmentCount() < 10 {
		t.Fatalf("workload too small: %d aborted, %d segments", len(w.aborted), p.SegmentCount())
	}
	if got := allAborted(t, p); !slices.Equal(got, w.aborted) {
		t.Fatalf("entries per segment: got %v, want %v", got, w.aborted)
	}
	// Each entry is in the segment holding its marker, and a file exists
	// exactly for the segments with one.
	names, _ := fsys.ReadDir("/data/t-0")
	for _, seg := range p.segments() {
		es, _ := p.SegmentAbortedTxns(seg.base)
		for _, e := range es {
			if e.LastOffset < seg.base || e.LastOffset >= seg.next.Load() {
				t.Fatalf("entry %v in segment [%d, %d)", e, seg.base, seg.next.Load())
			}
		}
		has := slices.Contains(names, filepath.Base(seg.txnIndexPath()))
		if has != (len(es) > 0) || (seg.txn.Load() != nil) != has {
			t.Fatalf("segment %d: %d entries, file %v", seg.base, len(es), has)
		}
	}
	leo := p.LogEndOffset()
	rng := rand.New(rand.NewPCG(2, 2))
	for i := 0; i < 2000; i++ {
		from := rng.Int64N(leo + 1)
		upper := from + rng.Int64N(leo-from+2)
		checkAborted(t, p, w.aborted, from, upper)
	}
	checkAborted(t, p, w.aborted, -5, math.MaxInt64)
	checkAborted(t, p, w.aborted, leo+10, math.MaxInt64)
	// The same after a clean reopen (sealed indexes loaded lazily).
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, s, "/data/t-0", txnCfg)
	for i := 0; i < 500; i++ {
		from := rng.Int64N(leo + 1)
		checkAborted(t, p, w.aborted, from, from+rng.Int64N(leo-from+2))
	}
}

// TestTxnIndexEarlyStop: the search stops at the first entry whose LSO
// reaches the upper bound, in the segment where it is, and later segments
// are not looked at.
func TestTxnIndexEarlyStop(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 1 << 20})
	for i := 0; i < 40; i++ {
		mustAppend(t, p, txnDataBatch(1, 1))
		if i%10 == 9 {
			if err := p.Roll(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Segments [0,10) [10,20) [20,30) [30,40). Entries crafted to show
	// the stop, not a coordinator's.
	es := []AbortedTxn{
		{ProducerID: 1, FirstOffset: 0, LastOffset: 3, LastStableOffset: 4},
		{ProducerID: 2, FirstOffset: 2, LastOffset: 12, LastStableOffset: 25}, // stops uppers <= 25
		{ProducerID: 3, FirstOffset: 1, LastOffset: 15, LastStableOffset: 16}, // after the stop: left out
		{ProducerID: 4, FirstOffset: 5, LastOffset: 22, LastStableOffset: 30},
		{ProducerID: 5, FirstOffset: 6, LastOffset: 35, LastStableOffset: 36},
	}
	for _, e := range es {
		if err := p.AddAborted(e); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		from, upper int64
		want        []int64 // producer ids
	}{
		{0, 10, []int64{1, 2}},
		{4, 10, []int64{2}},
		{0, 26, []int64{1, 2, 3, 4}},    // 2's LSO 25 < 26: goes on; 4's 30 stops
		{13, 26, []int64{3, 4}},         // from the segment holding 13
		{0, 40, []int64{1, 2, 3, 4, 5}}, // nothing stops
		{23, 40, []int64{5}},            // 4 is in the segment holding 23 but ends before it
		{36, 40, nil},
	} {
		got, err := p.AbortedTxns(nil, tc.from, tc.upper)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, e := range got {
			ids = append(ids, e.ProducerID)
		}
		if !slices.Equal(ids, tc.want) {
			t.Errorf("[%d, %d): got %v, want %v", tc.from, tc.upper, ids, tc.want)
		}
	}
	// After a reopen, a search stopped in the second segment never loads
	// the later ones.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 1 << 20})
	if _, err := p.AbortedTxns(nil, 0, 10); err != nil {
		t.Fatal(err)
	}
	segs := p.segments()
	for i, loaded := range []bool{true, true, false, false} {
		if got := segs[i].txn.Load().entries.Load() != nil; got != loaded {
			t.Errorf("segment %d loaded %v, want %v", segs[i].base, got, loaded)
		}
	}
}

// countFS counts opens of .txnindex files (and those for writing).
type countFS struct {
	FS
	mu            sync.Mutex
	opens, writes int
}

func (c *countFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if strings.HasSuffix(name, txnIndexExt) {
		c.mu.Lock()
		c.opens++
		if flag&(os.O_RDWR|os.O_WRONLY) != 0 {
			c.writes++
		}
		c.mu.Unlock()
	}
	return c.FS.OpenFile(name, flag, perm)
}

func (c *countFS) counts() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opens, c.writes
}

func (c *countFS) reset() {
	c.mu.Lock()
	c.opens, c.writes = 0, 0
	c.mu.Unlock()
}

func TestTxnIndexLazyLoad(t *testing.T) {
	_, mem := newMemFS(t)
	cfs := &countFS{FS: mem}
	s := openStore(t, cfs, 0)
	p := mustOpen(t, s, "/data/t-0", txnCfg)
	w := newTxnWorkload(3)
	for i := 0; i < 200; i++ {
		if err := w.step(t, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	cfs.reset()
	p = mustOpen(t, s, "/data/t-0", txnCfg)
	opens, writes := cfs.counts()
	active := p.active.txn.Load() != nil
	if want := map[bool]int{true: 1, false: 0}[active]; opens != want || writes != 0 {
		t.Fatalf("open read %d .txnindex files (%d for writing), want %d", opens, writes, want)
	}
	withFile := 0
	for _, seg := range p.segments() {
		if st := seg.txn.Load(); st != nil {
			withFile++
			if seg != p.active && st.entries.Load() != nil {
				t.Fatalf("sealed segment %d loaded at open", seg.base)
			}
		}
	}
	checkAborted(t, p, w.aborted, 0, math.MaxInt64)
	if opens, _ := cfs.counts(); opens != withFile {
		t.Fatalf("a full search opened %d files, %d segments have one", opens, withFile)
	}
	for i := 0; i < 10; i++ {
		checkAborted(t, p, w.aborted, 0, math.MaxInt64)
	}
	if opens, _ := cfs.counts(); opens != withFile {
		t.Fatalf("searches after the first opened files again (%d opens)", opens)
	}
}

func TestTxnIndexAbortedTxnsAllocs(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", txnCfg)
	for i := 0; i < 100; i++ {
		mustAppend(t, p, txnDataBatch(1, 2))
	}
	dst := make([]AbortedTxn, 0, 16)
	var err error
	if n := testing.AllocsPerRun(1000, func() { dst, err = p.AbortedTxns(dst[:0], 37, 150) }); n != 0 || err != nil || len(dst) != 0 {
		t.Fatalf("AbortedTxns without entries: %v allocations, %v, %d entries", n, err, len(dst))
	}
	// With entries (loaded), a dst with room: none either.
	p2 := mustOpen(t, s, "/data/t-1", txnCfg)
	w := newTxnWorkload(4)
	for i := 0; i < 200; i++ {
		if err := w.step(t, p2); err != nil {
			t.Fatal(err)
		}
	}
	dst = make([]AbortedTxn, 0, len(w.aborted))
	if n := testing.AllocsPerRun(1000, func() { dst, err = p2.AbortedTxns(dst[:0], 0, math.MaxInt64) }); n != 0 || err != nil || len(dst) != len(w.aborted) {
		t.Fatalf("AbortedTxns with entries: %v allocations, %v, %d entries", n, err, len(dst))
	}
}

func BenchmarkAbortedTxnsNone(b *testing.B) {
	_, fsys := newMemFS(b)
	s := openStore(b, fsys, 0)
	p := mustOpen(b, s, "/data/t-0", txnCfg)
	for i := 0; i < 100; i++ {
		mustAppend(b, p, txnDataBatch(1, 2))
	}
	dst := make([]AbortedTxn, 0, 16)
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = p.AbortedTxns(dst[:0], 37, 150)
	}
}

// TestTxnIndexTornAndBadFiles: a torn tail, entries past the log end and
// garbage are cut at open (or first load), never fail it, and never come
// back as entries; verify reports them.
func TestTxnIndexTornAndBadFiles(t *testing.T) {
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", txnCfg)
	w := newTxnWorkload(5)
	for i := 0; i < 200; i++ {
		if err := w.step(t, p); err != nil {
			t.Fatal(err)
		}
	}
	// The active segment must have an entry for the past-the-end case.
	pid := int64(9)
	first := mustAppend(t, p, txnDataBatch(pid, 1)).BaseOffset
	res := mustAppend(t, p, markerBatch(pid, ControlAbort))
	lastA := AbortedTxn{ProducerID: pid, FirstOffset: first, LastOffset: res.LastOffset, LastStableOffset: res.LastOffset + 1}
	if err := p.AddAborted(lastA); err != nil {
		t.Fatal(err)
	}
	w.aborted = append(w.aborted, lastA)
	segs := p.segments()
	var sealed *segment
	for _, seg := range segs[:len(segs)-1] {
		if seg.txn.Load() != nil {
			sealed = seg
		}
	}
	if sealed == nil {
		t.Fatal("no sealed segment with entries")
	}
	activePath, sealedPath := p.active.txnIndexPath(), sealed.txnIndexPath()
	leo := p.LogEndOffset()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	appendTo := func(path string, b []byte) {
		t.Helper()
		f, err := fsys.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		size, _ := f.Size()
		if _, err := f.WriteAt(b, size); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	sizeOf := func(path string) int64 {
		b, err := mfs.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return int64(len(b))
	}
	activeSize, sealedSize := sizeOf(activePath), sizeOf(sealedPath)
	// Active: a whole entry past the log end, then a torn one.
	beyond := EncodeAbortedTxns(nil, []AbortedTxn{{ProducerID: 1, FirstOffset: leo, LastOffset: leo + 3, LastStableOffset: leo + 4}})
	appendTo(activePath, append(beyond, beyond[:20]...))
	// Sealed: a bad version, then more.
	bad := EncodeAbortedTxns(nil, []AbortedTxn{{ProducerID: 1, FirstOffset: sealed.base, LastOffset: sealed.next.Load() - 1, LastStableOffset: 1}})
	bad[1] = 3
	appendTo(sealedPath, append(bad, bad...))
	rep, err := VerifyDir(fsys, "/data/t-0")
	if err != nil {
		t.Fatal(err)
	}
	notes, damage := strings.Join(rep.Notes, "\n"), strings.Join(rep.Damage, "\n")
	if !strings.Contains(notes, filepath.Base(activePath)) || !strings.Contains(damage, filepath.Base(sealedPath)) || strings.Contains(damage, filepath.Base(activePath)) {
		t.Fatalf("verify: notes %q, damage %q", notes, damage)
	}
	p = mustOpen(t, s, "/data/t-0", txnCfg)
	if got := sizeOf(activePath); got != activeSize {
		t.Fatalf("active .txnindex after open: %d bytes, want %d", got, activeSize)
	}
	checkAborted(t, p, w.aborted, 0, math.MaxInt64)
	if got := sizeOf(sealedPath); got != sealedSize {
		t.Fatalf("sealed .txnindex after load: %d bytes, want %d", got, sealedSize)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := VerifyDir(fsys, "/data/t-0"); err != nil || !rep.OK() || len(rep.Notes) != 0 {
		t.Fatalf("verify after repair: %v %v %v", rep.Damage, rep.Notes, err)
	}
	// A file of garbage only, and an empty one: no entries, open fine.
	if err := WriteFileAtomic(fsys, sealedPath, []byte("not an index at all, 34 bytes long")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(fsys, activePath, nil); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, s, "/data/t-0", txnCfg)
	if es, err := p.SegmentAbortedTxns(sealed.base); err != nil || len(es) != 0 {
		t.Fatalf("garbage index: %v, %v", es, err)
	}
	// And the order check of verify.
	p.Close()
	two := EncodeAbortedTxns(nil, []AbortedTxn{
		{ProducerID: 1, FirstOffset: sealed.base, LastOffset: sealed.base + 2, LastStableOffset: sealed.base + 3},
		{ProducerID: 1, FirstOffset: sealed.base, LastOffset: sealed.base + 1, LastStableOffset: sealed.base + 3},
	})
	if err := WriteFileAtomic(fsys, sealedPath, two); err != nil {
		t.Fatal(err)
	}
	if rep, _ := VerifyDir(fsys, "/data/t-0"); !strings.Contains(strings.Join(rep.Damage, "\n"), "not after") {
		t.Fatalf("verify missed an out-of-order entry: %v", rep.Damage)
	}
	if es, reason, err := DumpTxnIndex(fsys, sealedPath, sealed.base, sealed.next.Load()); err != nil || len(es) != 1 || reason == "" {
		t.Fatalf("DumpTxnIndex: %v %q %v", es, reason, err)
	}
}

func TestTxnIndexRebuild(t *testing.T) {
	_, mem := newMemFS(t)
	cfs := &countFS{FS: mem}
	s := openStore(t, cfs, 0)
	p := mustOpen(t, s, "/data/t-0", txnCfg)
	w := newTxnWorkload(6)
	for i := 0; i < 300; i++ {
		if err := w.step(t, p); err != nil {
			t.Fatal(err)
		}
	}
	all := w.aborted
	from := all[len(all)/2].LastOffset
	above := func(es []AbortedTxn) []AbortedTxn {
		var out []AbortedTxn
		for _, e := range es {
			if e.LastOffset >= from {
				out = append(out, e)
			}
		}
		return out
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, s, "/data/t-0", txnCfg)
	// Unchanged: nothing written.
	cfs.reset()
	if err := p.RebuildAborted(from, above(all)); err != nil {
		t.Fatal(err)
	}
	if _, writes := cfs.counts(); writes != 0 {
		t.Fatalf("an unchanged rebuild wrote %d files", writes)
	}
	checkAborted(t, p, all, 0, math.MaxInt64)
	// Some entries missing (lost), one changed, one new one in a segment
	// without a file: the files follow.
	var changed []AbortedTxn
	for i, e := range above(all) {
		switch {
		case i%3 == 1:
			continue
		case i == 2:
			e.LastStableOffset++
		}
		changed = append(changed, e)
	}
	var extra AbortedTxn
	for _, seg := range p.segments() {
		if seg.txn.Load() == nil && seg.base > from && seg.next.Load() > seg.base {
			extra = AbortedTxn{ProducerID: 42, FirstOffset: seg.base, LastOffset: seg.base, LastStableOffset: seg.base + 1}
			break
		}
	}
	if extra.ProducerID == 0 {
		t.Fatal("no segment without entries above from")
	}
	changed = append(changed, extra)
	slices.SortFunc(changed, func(a, b AbortedTxn) int { return int(a.LastOffset - b.LastOffset) })
	var want []AbortedTxn
	for _, e := range all {
		if e.LastOffset < from {
			want = append(want, e)
		}
	}
	want = append(want, changed...)
	if err := p.RebuildAborted(from, changed); err != nil {
		t.Fatal(err)
	}
	if got := allAborted(t, p); !slices.Equal(got, want) {
		t.Fatalf("after rebuild:\n got %v\nwant %v", got, want)
	}
	checkAborted(t, p, want, 0, math.MaxInt64)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, s, "/data/t-0", txnCfg)
	if got := allAborted(t, p); !slices.Equal(got, want) {
		t.Fatalf("after rebuild and reopen:\n got %v\nwant %v", got, want)
	}
	if rep, err := VerifyDir(cfs, "/data/t-0"); err != nil || !rep.OK() {
		t.Fatalf("verify: %v %v", rep.Damage, err)
	}
	// Everything from 0 dropped: no file left.
	if err := p.RebuildAborted(0, nil); err != nil {
		t.Fatal(err)
	}
	if got := allAborted(t, p); len(got) != 0 {
		t.Fatalf("after dropping all: %v", got)
	}
	names, _ := cfs.ReadDir("/data/t-0")
	for _, n := range names {
		if strings.HasSuffix(n, txnIndexExt) {
			t.Fatalf("%s left after dropping every entry", n)
		}
	}
	// Bad input is refused.
	if err := p.RebuildAborted(10, []AbortedTxn{{FirstOffset: 1, LastOffset: 5, LastStableOffset: 6}}); err == nil {
		t.Fatal("an entry below from was accepted")
	}
}

func TestTxnIndexAddAbortedChecks(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", txnCfg)
	for i := 0; i < 30; i++ {
		mustAppend(t, p, txnDataBatch(1, 1))
	}
	leo := p.LogEndOffset()
	if err := p.AddAborted(AbortedTxn{FirstOffset: 0, LastOffset: leo, LastStableOffset: leo + 1}); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("an entry past the log end: %v", err)
	}
	if err := p.AddAborted(AbortedTxn{FirstOffset: 5, LastOffset: 4}); err == nil {
		t.Fatal("first offset after last offset accepted")
	}
	// Out of order, across segments and within one; a repeat is a no-op,
	// a conflicting one is refused.
	es := []AbortedTxn{
		{ProducerID: 1, FirstOffset: 20, LastOffset: 25, LastStableOffset: 26},
		{ProducerID: 2, FirstOffset: 0, LastOffset: 3, LastStableOffset: 4},
		{ProducerID: 3, FirstOffset: 20, LastOffset: 22, LastStableOffset: 23},
		{ProducerID: 4, FirstOffset: 20, LastOffset: 27, LastStableOffset: 28},
	}
	for _, e := range es {
		if err := p.AddAborted(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.AddAborted(es[0]); err != nil {
		t.Fatalf("a repeated entry: %v", err)
	}
	if err := p.AddAborted(AbortedTxn{ProducerID: 9, FirstOffset: 21, LastOffset: 25, LastStableOffset: 26}); err == nil {
		t.Fatal("a second entry at the same marker offset accepted")
	}
	want := []AbortedTxn{es[1], es[2], es[0], es[3]}
	if got := allAborted(t, p); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, s, "/data/t-0", txnCfg)
	if got := allAborted(t, p); !slices.Equal(got, want) {
		t.Fatalf("after reopen: got %v, want %v", got, want)
	}
}

// TestTxnIndexDeletedWithSegment: retention, DeleteRecords, release after
// upload and Delete take the .txnindex with the segment; one left without
// its .log is removed at open.
func TestTxnIndexDeletedWithSegment(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", txnCfg)
	w := newTxnWorkload(7)
	for i := 0; i < 300; i++ {
		if err := w.step(t, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	files := func() map[string]bool {
		names, _ := fsys.ReadDir("/data/t-0")
		m := map[string]bool{}
		for _, n := range names {
			if strings.HasSuffix(n, txnIndexExt) {
				m[n] = true
			}
		}
		return m
	}
	check := func(what string) {
		t.Helper()
		have := files()
		for _, seg := range p.segments() {
			delete(have, filepath.Base(seg.txnIndexPath()))
		}
		if len(have) != 0 {
			t.Fatalf("%s: .txnindex files of deleted segments left: %v", what, have)
		}
		checkAborted(t, p, w.aborted, p.LogStartOffset(), math.MaxInt64)
	}
	before := len(files())
	segs := p.segments()
	if _, err := p.DeleteRecordsBefore(segs[3].base); err != nil {
		t.Fatal(err)
	}
	check("DeleteRecordsBefore")
	if _, err := p.DeleteLocalBefore(p.segments()[3].base); err != nil {
		t.Fatal(err)
	}
	check("DeleteLocalBefore")
	p.SetConfig(Config{SegmentBytes: 700, IndexIntervalBytes: 100, RetentionBytes: 3000, ExactRetention: true, RetentionMs: -1})
	if n, err := p.Maintain(s.now()); err != nil || n == 0 {
		t.Fatalf("Maintain: %d, %v", n, err)
	}
	check("retention")
	if after := len(files()); after >= before || after == 0 {
		t.Fatalf("%d .txnindex files before, %d after: want fewer, but some", before, after)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// An orphan (its .log gone) is removed at open.
	orphan := "/data/t-0/00000000000000000000" + txnIndexExt
	if err := WriteFileAtomic(fsys, orphan, EncodeAbortedTxns(nil, w.aborted[:1])); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, s, "/data/t-0", txnCfg)
	if _, err := fsys.OpenFile(orphan, os.O_RDONLY, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("orphan .txnindex kept: %v", err)
	}
	check("reopen")
	if err := p.Delete(); err != nil {
		t.Fatal(err)
	}
	if names, err := fsys.ReadDir("/data/t-0"); err == nil {
		t.Fatalf("directory left after Delete: %v", names)
	}
}

// TestTxnIndexCrash crashes (memfs) after AddAborted calls not followed by
// a close, at many points: after reopening, every entry below the last
// roll (the broker's snapshot point here) is there exactly, every one
// above it is one that was added (whole) or gone, never garbage; the
// broker's rebuild then makes it exact, and that survives a reopen.
func TestTxnIndexCrash(t *testing.T) {
	modes := []memfs.UnsyncedMode{memfs.DropUnsynced, memfs.KeepRandomPrefix, memfs.KeepRandomPrefixZeroed}
	for seed := uint64(0); seed < 60; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			mfs, fsys := newMemFS(t)
			s := openStore(t, fsys, 0)
			cfg := txnCfg
			if seed%2 == 1 {
				cfg.SegmentBytes = 5000 // more entries in the active segment
			}
			p := mustOpen(t, s, "/data/t-0", cfg)
			w := newTxnWorkload(seed)
			steps := 50 + rng.IntN(250)
			for i := 0; i < steps; i++ {
				if err := w.step(t, p); err != nil {
					t.Fatal(err)
				}
				if rng.IntN(10) == 0 {
					if err := p.Sync(); err != nil {
						t.Fatal(err)
					}
				}
			}
			snapshot := p.active.base // entries below are durable (fsync'd at the roll)
			mode := modes[int(seed)%len(modes)]
			clone := memFS{mfs.CrashClone(memfs.CrashConfig{Rand: rng, UnsyncedMode: mode})}
			s2 := openStore(t, clone, 0)
			p2 := mustOpen(t, s2, "/data/t-0", cfg)
			leo := p2.LogEndOffset()
			added := map[AbortedTxn]bool{}
			var below, exact []AbortedTxn
			for _, e := range w.aborted {
				added[e] = true
				if e.LastOffset < snapshot {
					below = append(below, e)
				}
				if e.LastOffset < leo {
					exact = append(exact, e)
				}
			}
			got := allAborted(t, p2)
			var gotBelow []AbortedTxn
			for _, e := range got {
				if !added[e] {
					t.Fatalf("mode %d: entry %v after the crash was never added", mode, e)
				}
				if e.LastOffset >= leo {
					t.Fatalf("entry %v at or past the log end %d", e, leo)
				}
				if e.LastOffset < snapshot {
					gotBelow = append(gotBelow, e)
				}
			}
			if !slices.Equal(gotBelow, below) {
				t.Fatalf("entries below the snapshot point %d:\n got %v\nwant %v", snapshot, gotBelow, below)
			}
			// The broker's replay from its snapshot point.
			var replay []AbortedTxn
			for _, e := range exact {
				if e.LastOffset >= snapshot {
					replay = append(replay, e)
				}
			}
			if err := p2.RebuildAborted(snapshot, replay); err != nil {
				t.Fatal(err)
			}
			if got := allAborted(t, p2); !slices.Equal(got, exact) {
				t.Fatalf("after rebuild:\n got %v\nwant %v", got, exact)
			}
			checkAborted(t, p2, exact, 0, math.MaxInt64)
			if err := p2.Close(); err != nil {
				t.Fatal(err)
			}
			// What Close made durable survives another crash.
			clone2 := memFS{clone.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
			p3 := mustOpen(t, openStore(t, clone2, 0), "/data/t-0", cfg)
			if got := allAborted(t, p3); !slices.Equal(got, exact) {
				t.Fatalf("after close and crash:\n got %v\nwant %v", got, exact)
			}
			if rep, err := VerifyDir(clone2, "/data/t-0"); err != nil || !rep.OK() {
				t.Fatalf("verify: %v %v", rep.Damage, err)
			}
		})
	}
}

// TestTxnIndexCloseBatch: CloseBatch (syncfs) makes the entries durable.
func TestTxnIndexCloseBatch(t *testing.T) {
	mfs, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", txnCfg)
	w := newTxnWorkload(8)
	for i := 0; i < 100; i++ {
		if err := w.step(t, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CloseBatch([]*Partition{p}, nil); err != nil {
		t.Fatal(err)
	}
	clone := memFS{mfs.CrashClone(memfs.CrashConfig{UnsyncedMode: memfs.DropUnsynced})}
	p2 := mustOpen(t, openStore(t, clone, 0), "/data/t-0", txnCfg)
	if got := allAborted(t, p2); !slices.Equal(got, w.aborted) {
		t.Fatalf("after CloseBatch and a crash:\n got %v\nwant %v", got, w.aborted)
	}
}

func TestScanBatchesControlType(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", Config{SegmentBytes: 2000, IndexIntervalBytes: 100})
	type rec struct {
		base int64
		ctl  int16
	}
	var want []rec
	rng := rand.New(rand.NewPCG(9, 9))
	for i := 0; i < 200; i++ {
		var b []byte
		ctl := int16(-1)
		switch rng.IntN(4) {
		case 0:
			b = markerBatch(int64(i), ControlAbort)
			ctl = ControlAbort
		case 1:
			b = markerBatch(int64(i), ControlCommit)
			ctl = ControlCommit
		case 2:
			b = txnDataBatch(int64(i), 1+rng.IntN(3))
		default:
			b = testbatch.Make(testbatch.Options{Records: 2, ValueSize: rng.IntN(300)})
		}
		res := mustAppend(t, p, b)
		want = append(want, rec{res.BaseOffset, ctl})
	}
	for _, from := range []int64{0, want[57].base, want[150].base + 0} {
		var got []rec
		if err := p.ScanBatches(from, func(h *BatchHeader, control int16) bool {
			got = append(got, rec{h.BaseOffset, control})
			return true
		}); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(want, func(r rec) bool { return r.base == from })
		if !slices.Equal(got, want[i:]) {
			t.Fatalf("from %d: got %v\nwant %v", from, got, want[i:])
		}
	}
	n := 0
	if err := p.ScanBatches(0, func(*BatchHeader, int16) bool { n++; return n < 5 }); err != nil || n != 5 {
		t.Fatalf("stop: %d, %v", n, err)
	}
	// A control batch whose key is not a control key.
	if got := ControlType([]byte{0x10, 0, 0, 0, 2, 0}); got != -1 {
		t.Fatalf("short key: %d", got)
	}
}

// TestTxnIndexConcurrentReaders: fetches collecting while entries are added
// and segments roll (run with -race).
func TestTxnIndexConcurrentReaders(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/t-0", txnCfg)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []AbortedTxn
			for {
				select {
				case <-done:
					return
				default:
				}
				var err error
				if dst, err = p.AbortedTxns(dst[:0], 0, math.MaxInt64); err != nil {
					t.Error(err)
					return
				}
				for i := 1; i < len(dst); i++ {
					if dst[i].LastOffset <= dst[i-1].LastOffset {
						t.Errorf("entries out of order: %v", dst)
						return
					}
				}
			}
		}()
	}
	w := newTxnWorkload(10)
	for i := 0; i < 400; i++ {
		if err := w.step(t, p); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	checkAborted(t, p, w.aborted, 0, math.MaxInt64)
}
