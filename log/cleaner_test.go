package log

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/synapsebroker/synapse/internal/memfs"
	"go.uber.org/zap"
)

// trec is a record to build: key nil = no key, value nil = tombstone.
type trec struct {
	key, value []byte
	ts         int64
}

// buildBatch encodes a v2 batch of recs (base offset 0).
func buildBatch(t testing.TB, recs []trec, codec Codec, pid int64, epoch int16, seq int32, attrs int16) []byte {
	t.Helper()
	var raw []byte
	base := recs[0].ts
	maxTs := base
	for i, r := range recs {
		var b []byte
		b = append(b, 0)
		b = binary.AppendVarint(b, r.ts-base)
		b = binary.AppendVarint(b, int64(i))
		if r.key == nil {
			b = binary.AppendVarint(b, -1)
		} else {
			b = binary.AppendVarint(b, int64(len(r.key)))
			b = append(b, r.key...)
		}
		if r.value == nil {
			b = binary.AppendVarint(b, -1)
		} else {
			b = binary.AppendVarint(b, int64(len(r.value)))
			b = append(b, r.value...)
		}
		b = binary.AppendVarint(b, 0)
		raw = binary.AppendVarint(raw, int64(len(b)))
		raw = append(raw, b...)
		maxTs = max(maxTs, r.ts)
	}
	body, err := compressRecords(codec, raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, BatchHeaderSize, BatchHeaderSize+len(body))
	be := binary.BigEndian
	be.PutUint32(b[8:], uint32(BatchHeaderSize-12+len(body)))
	b[16] = 2
	be.PutUint16(b[21:], uint16(attrs|int16(codec)))
	be.PutUint32(b[23:], uint32(len(recs)-1))
	be.PutUint64(b[27:], uint64(base))
	be.PutUint64(b[35:], uint64(maxTs))
	be.PutUint64(b[43:], uint64(pid))
	be.PutUint16(b[51:], uint16(epoch))
	be.PutUint32(b[53:], uint32(seq))
	be.PutUint32(b[57:], uint32(len(recs)))
	b = append(b, body...)
	be.PutUint32(b[17:], crc32.Checksum(b[21:], castagnoli))
	return b
}

func controlBatch(t testing.TB, pid int64, epoch int16, ctype int16, ts int64) []byte {
	key := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, 0), uint16(ctype))
	val := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint16(nil, 0), 0)
	return buildBatch(t, []trec{{key: key, value: val, ts: ts}}, CodecNone, pid, epoch, -1, 0x30)
}

// mrec is one appended record in the model.
type mrec struct {
	off      int64
	key      []byte
	value    []byte
	keyless  bool
	tomb     bool
	txn      int // -1: not transactional
	batch    int64
	ts       int64
	control  bool
	producer int64
}

type mtxn struct {
	pid       int64
	first     int64
	marker    int64 // -1 while open
	aborted   bool
	epoch     int16
	dataCount int
}

// cleanerModel drives a partition with random keyed appends, idempotent
// and transactional producers, and cleans, checking each clean's result
// against what must survive.
type cleanerModel struct {
	t        *testing.T
	rng      *rand.Rand
	p        *Partition
	s        *Store
	fsys     FS
	dir      string
	cfg      Config
	clock    time.Time
	recs     []*mrec
	byOff    map[int64]*mrec
	batches  map[int64][]byte // base -> stored bytes
	batchEnd map[int64]int64  // base -> last offset
	txns     []*mtxn
	open     map[int64]*mtxn // pid -> open txn
	seq      map[int64]int32
	end      int64           // greatest End so far
	firstCut map[int64]int64 // batch base -> ms of the first clean whose End passed it
	retMs    int64
	keys     int
	km       *KeyMap
}

func newCleanerModel(t *testing.T, seed uint64, fsys FS) *cleanerModel {
	m := &cleanerModel{t: t, rng: rand.New(rand.NewPCG(seed, 42)), fsys: fsys, dir: "/data/c-0",
		cfg: Config{SegmentBytes: 1500 + int64(seed%4)*700, IndexIntervalBytes: 150}, clock: time.UnixMilli(1_700_000_000_000),
		byOff: map[int64]*mrec{}, batches: map[int64][]byte{}, batchEnd: map[int64]int64{}, open: map[int64]*mtxn{},
		seq: map[int64]int32{}, firstCut: map[int64]int64{}, retMs: 30_000, keys: 5 + int(seed%20)}
	m.s = OpenStore(Options{FS: fsys, Logger: zap.NewNop(), Now: func() time.Time { return m.clock }})
	t.Cleanup(func() { m.s.Close() })
	m.p = mustOpen(t, m.s, m.dir, m.cfg)
	return m
}

func (m *cleanerModel) appendBatch(b []byte, build func(base int64)) {
	m.t.Helper()
	res, err := m.p.Append(b)
	if err != nil {
		m.t.Fatal(err)
	}
	if err := m.p.WaitDurable(res.LastOffset + 1); err != nil {
		m.t.Fatal(err)
	}
	m.batches[res.BaseOffset] = storedCopy(b, res.BaseOffset)
	m.batchEnd[res.BaseOffset] = res.LastOffset
	build(res.BaseOffset)
}

var codecs = []Codec{CodecNone, CodecGzip, CodecSnappy, CodecLZ4, CodecZstd}

func (m *cleanerModel) step() {
	m.clock = m.clock.Add(time.Duration(200+m.rng.IntN(1500)) * time.Millisecond)
	ts := m.clock.UnixMilli()
	op := m.rng.IntN(100)
	var pid int64 = -1
	var txn *mtxn
	var epoch int16
	seq := int32(-1)
	attrs := int16(0)
	switch {
	case op < 12: // end a transaction
		pids := make([]int64, 0, len(m.open))
		for pid := range m.open {
			pids = append(pids, pid)
		}
		sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
		if len(pids) > 0 {
			tx := m.open[pids[0]]
			ctype := ControlCommit
			if m.rng.IntN(2) == 0 {
				ctype = ControlAbort
			}
			b := controlBatch(m.t, tx.pid, tx.epoch, ctype, ts)
			m.appendBatch(b, func(base int64) {
				tx.marker, tx.aborted = base, ctype == ControlAbort
				r := &mrec{off: base, control: true, txn: -1, batch: base, ts: ts, producer: tx.pid}
				m.recs = append(m.recs, r)
				m.byOff[base] = r
			})
			delete(m.open, tx.pid)
			if tx.aborted {
				if err := m.p.AddAborted(AbortedTxn{ProducerID: tx.pid, FirstOffset: tx.first, LastOffset: tx.marker, LastStableOffset: m.lso()}); err != nil {
					m.t.Fatal(err)
				}
			}
			return
		}
		return
	case op < 35: // transactional data
		pid = 10 + int64(m.rng.IntN(3))
		txn = m.open[pid]
		if txn == nil {
			txn = &mtxn{pid: pid, first: m.p.LogEndOffset(), marker: -1, epoch: 1}
			m.open[pid] = txn
			m.txns = append(m.txns, txn)
		}
		epoch, attrs = 1, 0x10
		seq = m.seq[pid]
	case op < 55: // idempotent
		pid = 1 + int64(m.rng.IntN(3))
		seq = m.seq[pid]
	}
	n := 1 + m.rng.IntN(6)
	recs := make([]trec, n)
	for i := range recs {
		r := trec{ts: ts + int64(i)}
		if m.rng.IntN(30) > 0 {
			r.key = fmt.Appendf(nil, "k%d", m.rng.IntN(m.keys))
		}
		if m.rng.IntN(6) > 0 {
			r.value = fmt.Appendf(nil, "v%d-%x", m.rng.Uint32(), make([]byte, m.rng.IntN(40)))
		}
		recs[i] = r
	}
	if pid >= 0 {
		m.seq[pid] += int32(n)
	}
	b := buildBatch(m.t, recs, codecs[m.rng.IntN(len(codecs))], pid, epoch, seq, attrs)
	ti := -1
	if txn != nil {
		ti = len(m.txns) - 1
		for i, x := range m.txns {
			if x == txn {
				ti = i
			}
		}
		txn.dataCount += n
	}
	m.appendBatch(b, func(base int64) {
		for i, r := range recs {
			mr := &mrec{off: base + int64(i), key: r.key, value: r.value, keyless: r.key == nil, tomb: r.value == nil, txn: ti, batch: base, ts: r.ts, producer: pid}
			m.recs = append(m.recs, mr)
			m.byOff[mr.off] = mr
		}
	})
}

// lso is the first offset of the oldest open transaction (the log end if none).
func (m *cleanerModel) lso() int64 {
	l := m.p.LogEndOffset()
	for _, tx := range m.open {
		l = min(l, tx.first)
	}
	return l
}

func (m *cleanerModel) clean(lag time.Duration) CleanResult {
	m.t.Helper()
	cfg := CleanConfig{DeleteRetention: time.Duration(m.retMs) * time.Millisecond, MinCompactionLag: lag,
		KeyMap: m.km, StableOffset: m.lso}
	res, err := m.p.Clean(context.Background(), cfg)
	if err != nil {
		m.t.Fatalf("clean: %v", err)
	}
	m.noteClean(res)
	return res
}

func (m *cleanerModel) noteClean(res CleanResult) {
	if res.End < m.end {
		m.t.Fatalf("clean end %d went back from %d", res.End, m.end)
	}
	m.end = res.End
	for base := range m.batches {
		if _, ok := m.firstCut[base]; !ok && base < m.end {
			m.firstCut[base] = m.clock.UnixMilli()
		}
	}
}

// logBatch is a batch as read back.
type logBatch struct {
	h    BatchHeader
	b    []byte
	recs []cleanRecord
}

// readLog reads every batch from the log start, checking framing, CRCs and
// that offsets only grow.
func readLog(t testing.TB, p *Partition) []logBatch {
	t.Helper()
	var out []logBatch
	off := p.LogStartOffset()
	last := int64(-1)
	for off < p.HighWatermark() {
		res, err := p.Read(off, 1<<20)
		if err != nil {
			t.Fatalf("read %d: %v", off, err)
		}
		buf, err := res.AppendTo(nil)
		next := res.NextOffset
		res.Release()
		if err != nil {
			t.Fatal(err)
		}
		if len(buf) == 0 {
			// Only possible in a gap at the end of the last sealed segment.
			if off >= p.segments()[len(p.segments())-1].base {
				t.Fatalf("read %d below hw %d returned nothing", off, p.HighWatermark())
			}
			off = p.segments()[len(p.segments())-1].base
			continue
		}
		for len(buf) > 0 {
			h, err := ParseBatchHeader(buf)
			if err != nil || int(h.Length) > len(buf) || !VerifyBatch(buf[:h.Length], &h) || checkCleanedFields(&h) != nil {
				t.Fatalf("read %d: bad batch (%v)", off, err)
			}
			if h.BaseOffset <= last {
				t.Fatalf("batch at %d after %d: offsets repeat", h.BaseOffset, last)
			}
			b := append([]byte(nil), buf[:h.Length]...)
			recs, _, err := batchRecords(b, &h)
			if err != nil {
				t.Fatalf("batch %d: %v", h.BaseOffset, err)
			}
			out = append(out, logBatch{h: h, b: b, recs: recs})
			last = h.LastOffset()
			buf = buf[h.Length:]
		}
		off = next
	}
	return out
}

// check compares the log with the model.
func (m *cleanerModel) check() {
	t := m.t
	t.Helper()
	got := readLog(t, m.p)
	present := map[int64]cleanRecord{} // offset -> record
	batchAt := map[int64]logBatch{}    // last offset -> batch
	for _, lb := range got {
		batchAt[lb.h.LastOffset()] = lb
		if lb.h.BaseOffset >= m.end {
			if w := m.batches[lb.h.BaseOffset]; !bytes.Equal(w, lb.b) {
				t.Fatalf("batch %d at or above the clean end %d changed", lb.h.BaseOffset, m.end)
			}
		}
		for _, r := range lb.recs {
			present[lb.h.BaseOffset+r.offDelta] = r
		}
	}
	for base, b := range m.batches {
		if base >= m.end {
			if _, ok := batchAt[m.batchEnd[base]]; !ok {
				t.Fatalf("batch %d above the clean end %d missing", base, m.end)
			}
			_ = b
		}
	}
	// The latest non-aborted record of each key below the end.
	latest := map[string]*mrec{}
	for _, r := range m.recs {
		if r.off >= m.end || r.control || r.keyless || (r.txn >= 0 && m.txns[r.txn].aborted) {
			continue
		}
		latest[string(r.key)] = r
	}
	now := m.clock.UnixMilli()
	for off, pr := range present {
		r := m.byOff[off]
		if r == nil {
			t.Fatalf("record at %d was never appended", off)
		}
		if !r.control && (!bytes.Equal(pr.key, r.key) || (pr.key == nil) != (r.key == nil) || !bytes.Equal(pr.value(), r.value) || pr.hasValue == r.tomb || pr.ts != r.ts) {
			t.Fatalf("record at %d differs from what was appended", off)
		}
		if off >= m.end || r.control {
			continue
		}
		switch {
		case r.keyless:
			t.Fatalf("keyless record at %d below the clean end %d kept", off, m.end)
		case r.txn >= 0 && m.txns[r.txn].aborted:
			t.Fatalf("record at %d of an aborted transaction kept below the clean end %d", off, m.end)
		case latest[string(r.key)] != r:
			t.Fatalf("record at %d of key %s kept, but %d is its latest below %d", off, r.key, latest[string(r.key)].off, m.end)
		}
	}
	for k, r := range latest {
		if _, ok := present[r.off]; ok {
			continue
		}
		if !r.tomb {
			t.Fatalf("latest record of key %s at %d (below clean end %d) missing", k, r.off, m.end)
		}
		if cut, ok := m.firstCut[r.batch]; !ok || now < cut+m.retMs {
			t.Fatalf("tombstone of key %s at %d removed before its delete retention passed", k, r.off)
		}
	}
	// Each producer's last data batch and trailing marker stay.
	lastData, lastCtl := map[int64]int64{}, map[int64]int64{}
	for _, r := range m.recs {
		if r.producer < 0 {
			continue
		}
		if r.control {
			lastCtl[r.producer] = r.off
		} else {
			lastData[r.producer] = m.batchEnd[r.batch]
			delete(lastCtl, r.producer)
		}
	}
	for pid, off := range lastData {
		if lb, ok := batchAt[off]; !ok || lb.h.ProducerID != pid {
			t.Fatalf("producer %d: its last batch (last offset %d) is gone", pid, off)
		}
	}
	for pid, off := range lastCtl {
		if _, ok := batchAt[off]; !ok {
			t.Fatalf("producer %d: its last marker at %d is gone", pid, off)
		}
	}
	// A transaction with records left keeps its marker, and an aborted one
	// its index entry.
	abortedIx, err := m.p.AbortedTxns(nil, 0, m.p.LogEndOffset())
	if err != nil {
		t.Fatal(err)
	}
	for i, tx := range m.txns {
		left := false
		for off, r := range m.byOff {
			if _, ok := present[off]; ok && r.txn == i {
				left = true
			}
		}
		if !left || tx.marker < 0 {
			continue
		}
		if _, ok := batchAt[tx.marker]; !ok {
			t.Fatalf("transaction of producer %d has records left but its marker at %d is gone", tx.pid, tx.marker)
		}
		if tx.aborted {
			found := false
			for _, e := range abortedIx {
				found = found || (e.ProducerID == tx.pid && e.LastOffset == tx.marker && e.FirstOffset == tx.first)
			}
			if !found {
				t.Fatalf("aborted transaction at %d..%d has records left but no index entry", tx.first, tx.marker)
			}
		}
	}
	// Reads at any offset start at the first batch holding it or after it.
	for range 30 {
		off := m.p.LogStartOffset() + m.rng.Int64N(max(m.p.HighWatermark()-m.p.LogStartOffset(), 1))
		res, err := m.p.Read(off, 1)
		if err != nil {
			t.Fatalf("read %d: %v", off, err)
		}
		buf, _ := res.AppendTo(nil)
		res.Release()
		var want *logBatch
		for i := range got {
			if got[i].h.LastOffset() >= off {
				want = &got[i]
				break
			}
		}
		if len(buf) == 0 {
			if want != nil && want.h.BaseOffset < m.p.segments()[len(m.p.segments())-1].base {
				// Empty only at the end of a segment's gap.
				res2, err := m.p.Read(m.p.segments()[len(m.p.segments())-1].base, 1)
				if err == nil {
					res2.Release()
				}
			}
			continue
		}
		h, _ := ParseBatchHeader(buf)
		if want == nil || h.BaseOffset != want.h.BaseOffset {
			t.Fatalf("read %d returned batch %d, want the first batch ending at or after it", off, h.BaseOffset)
		}
	}
	checkVerify(t, m.fsys, m.dir)
}

func (r cleanRecord) value() []byte {
	b := r.tail
	_, n := binary.Varint(b) // offset delta
	b = b[n:]
	kl, n := binary.Varint(b)
	b = b[n:]
	if kl > 0 {
		b = b[kl:]
	}
	vl, n := binary.Varint(b)
	if vl < 0 {
		return nil
	}
	return b[n : n+int(vl)]
}

func (m *cleanerModel) reopen() {
	m.t.Helper()
	if err := m.p.Close(); err != nil {
		m.t.Fatal(err)
	}
	m.p = mustOpen(m.t, m.s, m.dir, m.cfg)
}

func TestCleanerModel(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			_, fsys := newMemFS(t)
			m := newCleanerModel(t, seed, fsys)
			if seed%3 == 0 {
				m.km = NewKeyMap(keyMapSlot * 8) // a small map: partial cleans
			}
			for round := 0; round < 6; round++ {
				for range 40 {
					m.step()
				}
				var lag time.Duration
				if m.rng.IntN(3) == 0 {
					lag = 20 * time.Second
				}
				m.clean(lag)
				m.check()
				if round == 3 {
					m.reopen()
					m.check()
				}
			}
			// Time passes beyond delete.retention.ms: tombstones go.
			for range 2 {
				m.clock = m.clock.Add(time.Minute)
				for range 10 {
					m.step()
				}
				if err := m.p.Roll(); err != nil {
					t.Fatal(err)
				}
				m.clean(0)
				m.check()
			}
			m.reopen()
			m.check()
		})
	}
}

// TestCleanerRemovesDuplicates is a small fixed case: exact survivors.
func TestCleanerRemovesDuplicates(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/d-0", Config{SegmentBytes: 300})
	ts := time.Now().UnixMilli()
	var want [][]byte
	for i := range 30 {
		b := buildBatch(t, []trec{{key: fmt.Appendf(nil, "k%d", i%3), value: fmt.Appendf(nil, "v%d", i), ts: ts}}, codecs[i%len(codecs)], -1, 0, -1, 0)
		res, err := p.Append(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WaitDurable(res.LastOffset + 1); err != nil {
			t.Fatal(err)
		}
		want = append(want, storedCopy(b, res.BaseOffset))
	}
	if err := p.Roll(); err != nil {
		t.Fatal(err)
	}
	before := p.SegmentCount()
	ratio, _, _ := p.CleanableDirtyRatio()
	if ratio != 1 {
		t.Fatalf("dirty ratio before any clean: %v, want 1", ratio)
	}
	res, err := p.Clean(context.Background(), CleanConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if res.End != 30 || res.Partial || res.DirtyRatioAfter != 0 {
		t.Fatalf("clean result %+v", res)
	}
	got := readLog(t, p)
	if len(got) != 3 {
		t.Fatalf("%d batches left, want 3", len(got))
	}
	for i, lb := range got {
		if lb.h.BaseOffset != int64(27+i) || !bytes.Equal(lb.b, want[27+i]) {
			t.Fatalf("survivor %d: batch %d, want 27+%d byte for byte", i, lb.h.BaseOffset, i)
		}
	}
	if p.SegmentCount() >= before {
		t.Fatalf("segments not merged: %d -> %d", before, p.SegmentCount())
	}
	for _, off := range []int64{0, 5, 26} {
		r, err := p.Read(off, 1)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := r.AppendTo(nil)
		r.Release()
		h, _ := ParseBatchHeader(b)
		if h.BaseOffset != 27 {
			t.Fatalf("read %d inside the removed range: batch %d, want 27", off, h.BaseOffset)
		}
	}
	if off, _, ok, err := p.OffsetForTimestamp(ts); err != nil || !ok || off != 27 {
		t.Fatalf("offset for timestamp: %d %v %v", off, ok, err)
	}
	checkVerify(t, fsys, "/data/d-0")
	// Without the cleaner's marks (checkpoint, index flags) the gaps are damage.
	for _, si := range p.SealedSegments() {
		fsys.Remove(si.IndexPath)
	}
	fsys.Remove("/data/d-0/" + cleanerCheckpointFile)
	rep, err := VerifyDir(fsys, "/data/d-0")
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() {
		t.Fatal("gaps in a segment not marked cleaned passed verification")
	}
}

// TestCleanerKeyMapBound: a map too small for the dirty keys cleans up to
// where it filled; the next clean goes on from there.
func TestCleanerKeyMapBound(t *testing.T) {
	_, fsys := newMemFS(t)
	s := openStore(t, fsys, 0)
	p := mustOpen(t, s, "/data/k-0", Config{SegmentBytes: 400})
	ts := time.Now().UnixMilli()
	for round := range 2 {
		for i := range 40 {
			b := buildBatch(t, []trec{{key: fmt.Appendf(nil, "k%d", i), value: fmt.Appendf(nil, "v%d-%d", round, i), ts: ts}}, CodecNone, -1, 0, -1, 0)
			res, err := p.Append(b)
			if err != nil {
				t.Fatal(err)
			}
			p.WaitDurable(res.LastOffset + 1)
		}
	}
	p.Roll()
	km := NewKeyMap(keyMapSlot * 20) // 18 keys
	var ends []int64
	for range 10 {
		res, err := p.Clean(context.Background(), CleanConfig{KeyMap: km})
		if err != nil {
			t.Fatal(err)
		}
		if res.End == res.FirstDirty {
			break
		}
		ends = append(ends, res.End)
		if res.End < 80 && !res.Partial {
			t.Fatalf("clean to %d not partial", res.End)
		}
	}
	if len(ends) < 3 || ends[0] != 18 || ends[len(ends)-1] != 80 {
		t.Fatalf("clean ends %v: want partial cleans of 18 keys up to 80", ends)
	}
	got := readLog(t, p)
	if len(got) != 40 || got[0].h.BaseOffset != 40 {
		t.Fatalf("%d batches from %d left, want the 40 latest", len(got), got[0].h.BaseOffset)
	}
}

// cleanWorkload builds a fixed log to clean (deterministic ops).
func cleanWorkload(t *testing.T, fsys FS) (*Store, *Partition, *cleanerModel) {
	m := newCleanerModel(t, 7, fsys)
	for range 120 {
		m.step()
	}
	return m.s, m.p, m
}

// TestCleanerCrashAtEveryOp crashes a clean at each of its file-system
// operations: after reopening, each batch is the old or the new one at
// its offset, offsets never repeat, and everything the clean keeps is
// there.
func TestCleanerCrashAtEveryOp(t *testing.T) {
	old, newer := referenceClean(t)
	if len(newer) >= len(old) {
		t.Fatalf("the clean removed nothing (%d -> %d batches)", len(old), len(newer))
	}
	total := 0
	for k := 0; ; k++ {
		mfs, fsys := newMemFS(t)
		_, p, m := cleanWorkload(t, fsys)
		c := memfs.CrashAfter(k)
		mfs.SetInjector(c.Inject)
		m.clock = m.clock.Add(time.Hour)
		_, err := p.Clean(context.Background(), CleanConfig{DeleteRetention: time.Duration(m.retMs) * time.Millisecond, StableOffset: m.lso})
		if !c.Crashed() {
			if err != nil {
				t.Fatalf("clean failed without a crash: %v", err)
			}
			total = k
			break
		}
		for _, mode := range []memfs.UnsyncedMode{memfs.DropUnsynced, memfs.KeepRandomPrefix} {
			clone := memFS{mfs.CrashClone(memfs.CrashConfig{Rand: rand.New(rand.NewPCG(uint64(k), 1)), UnsyncedMode: mode})}
			s2 := OpenStore(Options{FS: clone, Logger: zap.NewNop()})
			p2, err := s2.OpenPartition(m.dir, m.cfg)
			if err != nil {
				t.Fatalf("k=%d: reopen: %v", k, err)
			}
			got := readLog(t, p2)
			seen := map[int64]bool{}
			for _, lb := range got {
				o, n := old[lb.h.BaseOffset], newer[lb.h.BaseOffset]
				if !bytes.Equal(lb.b, o) && !bytes.Equal(lb.b, n) {
					t.Fatalf("k=%d: batch %d is neither the old nor the cleaned one", k, lb.h.BaseOffset)
				}
				seen[lb.h.BaseOffset] = true
			}
			for base := range newer {
				if !seen[base] {
					t.Fatalf("k=%d: batch %d, kept by the clean, missing after the crash", k, base)
				}
			}
			checkVerify(t, clone, m.dir)
			// And a clean after recovery finishes the job.
			if _, err := p2.Clean(context.Background(), CleanConfig{Now: func() time.Time { return m.clock }, DeleteRetention: time.Duration(m.retMs) * time.Millisecond, StableOffset: m.lso}); err != nil {
				t.Fatalf("k=%d: clean after recovery: %v", k, err)
			}
			for _, lb := range readLog(t, p2) {
				if !bytes.Equal(lb.b, newer[lb.h.BaseOffset]) && !bytes.Equal(lb.b, old[lb.h.BaseOffset]) {
					// A second clean may rewrite again (horizons): still valid v2.
					continue
				}
			}
			s2.Close()
		}
	}
	if total < 10 {
		t.Fatalf("clean did only %d file-system operations", total)
	}
	t.Logf("clean: %d file-system operations", total)
}

// referenceClean returns the batches of cleanWorkload's log before and
// after a clean an hour later.
func referenceClean(t *testing.T) (old, newer map[int64][]byte) {
	_, fsys := newMemFS(t)
	_, p, m := cleanWorkload(t, fsys)
	old = map[int64][]byte{}
	for _, lb := range readLog(t, p) {
		old[lb.h.BaseOffset] = lb.b
	}
	m.clock = m.clock.Add(time.Hour)
	m.clean(0)
	newer = map[int64][]byte{}
	for _, lb := range readLog(t, p) {
		newer[lb.h.BaseOffset] = lb.b
	}
	return old, newer
}

// TestCleanerFsyncFailure: a failing fsync during a clean leaves the
// partition online, serving old segments (or, for groups swapped before
// the failure, the new ones); a clean after it finishes the job.
func TestCleanerFsyncFailure(t *testing.T) {
	old, newer := referenceClean(t)
	for n := 1; ; n++ {
		mfs, fsys := newMemFS(t)
		_, p, m := cleanWorkload(t, fsys)
		eio := errors.New("injected EIO")
		mfs.SetInjector(memfs.FailNth(memfs.OpSync, n, eio))
		m.clock = m.clock.Add(time.Hour)
		cfg := CleanConfig{DeleteRetention: time.Duration(m.retMs) * time.Millisecond, StableOffset: m.lso}
		_, err := p.Clean(context.Background(), cfg)
		mfs.SetInjector(nil)
		if err == nil {
			if n < 3 {
				t.Fatalf("clean did %d fsyncs only", n-1)
			}
			return
		}
		if !errors.Is(err, eio) {
			t.Fatalf("n=%d: clean error %v", n, err)
		}
		if p.Err() != nil {
			t.Fatalf("n=%d: partition offline after a failed clean fsync: %v", n, p.Err())
		}
		for _, lb := range readLog(t, p) {
			if !bytes.Equal(lb.b, old[lb.h.BaseOffset]) && !bytes.Equal(lb.b, newer[lb.h.BaseOffset]) {
				t.Fatalf("n=%d: batch %d is neither the old nor the cleaned one", n, lb.h.BaseOffset)
			}
		}
		checkVerify(t, fsys, m.dir)
		names, _ := fsys.ReadDir(m.dir)
		for _, name := range names {
			if strings.HasSuffix(name, cleanedExt) || strings.HasSuffix(name, swapExt) {
				t.Fatalf("n=%d: %s left behind", n, name)
			}
		}
		m.reopen()
		res, err := m.p.Clean(context.Background(), cfg)
		if err != nil {
			t.Fatalf("n=%d: clean after the failure: %v", n, err)
		}
		m.noteClean(res)
		m.check()
	}
}

// TestCleanerConcurrentReads reads while cleans swap segments.
func TestCleanerConcurrentReads(t *testing.T) {
	_, fsys := newMemFS(t)
	_, p, m := cleanWorkload(t, fsys)
	stop := make(chan struct{})
	done := make(chan error)
	go func() {
		rng := rand.New(rand.NewPCG(1, 1))
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			off := p.LogStartOffset() + rng.Int64N(p.HighWatermark()-p.LogStartOffset())
			res, err := p.Read(off, 4096)
			if err != nil {
				done <- err
				return
			}
			buf, err := res.AppendTo(nil)
			res.Release()
			if err != nil {
				done <- err
				return
			}
			for len(buf) > 0 {
				h, err := ParseBatchHeader(buf)
				if err != nil || !VerifyBatch(buf[:h.Length], &h) {
					done <- fmt.Errorf("read %d: bad batch", off)
					return
				}
				buf = buf[h.Length:]
			}
		}
	}()
	for range 4 {
		for range 30 {
			m.step()
		}
		m.clock = m.clock.Add(time.Minute)
		m.clean(0)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	m.check()
}

func TestKeyMap(t *testing.T) {
	km := NewKeyMap(keyMapSlot * 10)
	if km.Capacity() != 9 {
		t.Fatalf("capacity %d", km.Capacity())
	}
	for i := range 9 {
		if !km.Put(fmt.Appendf(nil, "k%d", i), int64(i)) {
			t.Fatalf("put %d refused", i)
		}
	}
	if km.Put([]byte("new"), 100) {
		t.Fatal("put past capacity accepted")
	}
	if !km.Put([]byte("k3"), 50) || km.Get([]byte("k3")) != 50 || km.Get([]byte("zz")) != -1 || km.Latest() != 50 {
		t.Fatal("update or lookup wrong")
	}
	keys := make([]int, 0)
	for i := range 9 {
		keys = append(keys, int(km.Get(fmt.Appendf(nil, "k%d", i))))
	}
	sort.Ints(keys)
	if keys[0] != 0 || keys[8] != 50 {
		t.Fatalf("values %v", keys)
	}
}
