package compattests

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

// The records every Go client produces and reads back, and how they are
// compared. Each record carries a "seq" header (its index in the test) so
// consumed records are matched to produced ones whatever the client does
// with ordering; everything else is compared byte for byte.

// codecs are the compression codecs every client produces with, one
// producer (or one batch) per codec.
var codecs = []string{"none", "gzip", "snappy", "lz4", "zstd"}

const (
	// bigValueSize is the "~900 KB" record: incompressible bytes so the batch
	// stays that large after compression, below Kafka's default
	// max.message.bytes (1,048,588) with its overhead.
	bigValueSize = 900 * 1024
	// maxMessageBytes is what producers are told the largest record may be.
	maxMessageBytes = 1_000_000
	// numPartitions is the partition count of the topics the Go clients
	// create.
	numPartitions = 3
)

type header struct {
	Key   string
	Value []byte
}

type record struct {
	Seq       int
	Codec     string
	Partition int32
	Key       []byte // nil = null key
	Value     []byte // nil = null value
	Headers   []header
	Timestamp time.Time // millisecond precision
	Offset    int64     // -1 when the producer did not report it
}

func (r record) String() string {
	return fmt.Sprintf("seq %d (%s) p%d@%d key=%s value=%s ts=%d headers=%d",
		r.Seq, r.Codec, r.Partition, r.Offset, showBytes(r.Key), showBytes(r.Value), r.Timestamp.UnixMilli(), len(r.Headers))
}

func showBytes(b []byte) string {
	switch {
	case b == nil:
		return "null"
	case len(b) > 24:
		return fmt.Sprintf("%q...(%d bytes)", b[:24], len(b))
	default:
		return fmt.Sprintf("%q", b)
	}
}

// recordGen hands out records with increasing sequence numbers and strictly
// increasing timestamps (2 ms apart), so ListOffsets by time has exactly one
// right answer for any timestamp.
type recordGen struct {
	seq        int
	base       time.Time
	partitions int32
	// noNullKey / noNullValue leave out the null-key / null-value records
	// for clients that cannot express them.
	noNullKey, noNullValue bool
}

func newRecordGen(partitions int32) *recordGen {
	// A few minutes in the past: realistic, and clearly different from the
	// broker's clock, so a broker that stamps its own time is caught.
	return &recordGen{base: time.Now().Add(-5 * time.Minute).Truncate(time.Millisecond), partitions: partitions}
}

// kind of record to generate.
const (
	kindNormal = iota
	kindEmptyKey
	kindNullKey
	kindEmptyValue
	kindNullValue
	kindBig
)

func (g *recordGen) next(codec string, kind int) record {
	seq := g.seq
	g.seq++
	r := record{
		Seq:       seq,
		Codec:     codec,
		Partition: int32(seq) % g.partitions,
		Key:       fmt.Appendf(nil, "key-%s-%04d", codec, seq),
		Timestamp: g.base.Add(time.Duration(seq) * 2 * time.Millisecond),
		Offset:    -1,
	}
	rng := rand.New(rand.NewPCG(uint64(seq), 0x5eed))
	// Half text that compresses, half random bytes that do not.
	size := 1 + (seq*397)%4000
	unit := fmt.Appendf(nil, "codec=%s seq=%d ", codec, seq)
	text := bytes.Repeat(unit, size/2/len(unit)+1)[:size/2]
	random := make([]byte, size-size/2)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	r.Value = append(text, random...)
	r.Headers = []header{{"seq", []byte(strconv.Itoa(seq))}, {"codec", []byte(codec)}}
	switch seq % 3 {
	case 0:
		r.Headers = append(r.Headers,
			header{"bin", []byte{0, 1, 2, 0x7f, 0x80, 0xfe, 0xff}},
			header{"dup", []byte("first")},
			header{"dup", []byte("second")})
	case 1:
		r.Headers = append(r.Headers, header{"empty-value", []byte{}}, header{"ünïcode-ключ", []byte("värde")})
	}
	switch kind {
	case kindEmptyKey:
		r.Key = []byte{}
	case kindNullKey:
		r.Key = nil
	case kindEmptyValue:
		r.Value = []byte{}
	case kindNullValue:
		r.Value = nil
	case kindBig:
		r.Value = make([]byte, bigValueSize)
		for i := range r.Value {
			r.Value[i] = byte(rng.Uint32())
		}
	}
	return r
}

// batch returns the records of one codec: n ordinary records with the
// special ones (empty and null key, empty and null value) among them, and
// the ~900 KB record when big is set.
func (g *recordGen) batch(codec string, n int, big bool) []record {
	kinds := []int{kindEmptyKey, kindEmptyValue}
	if !g.noNullKey {
		kinds = append(kinds, kindNullKey)
	}
	if !g.noNullValue {
		kinds = append(kinds, kindNullValue)
	}
	if big {
		kinds = append(kinds, kindBig)
	}
	var out []record
	for i := 0; i < n || len(kinds) > 0; i++ {
		if i%2 == 1 && len(kinds) > 0 {
			out = append(out, g.next(codec, kinds[0]))
			kinds = kinds[1:]
			continue
		}
		out = append(out, g.next(codec, kindNormal))
	}
	return out
}

// perPartition counts records by partition.
func perPartition(recs []record) map[int32]int {
	m := make(map[int32]int)
	for _, r := range recs {
		m[r.Partition]++
	}
	return m
}

// checkOpts says how strictly a client's view can be compared.
type checkOpts struct {
	// nullsDistinct: the client reports a null key/value as nil and an empty
	// one as a non-nil empty slice, so the two are told apart.
	nullsDistinct bool
	// tsWindow, when set, replaces the exact timestamp check: each record's
	// timestamp must fall in [tsWindow[0], tsWindow[1]] (clients that cannot
	// set record timestamps).
	tsWindow *[2]time.Time
}

// checkRecords compares consumed records with produced ones: the same set
// (matched by the seq header), byte-exact keys, values and headers in
// order, the same partitions and timestamps, offsets contiguous from 0 in
// each partition, in produce order, and equal to the offsets the producer
// reported.
func checkRecords(t testing.TB, want, got []record, o checkOpts) {
	t.Helper()
	errs := 0
	fail := func(format string, args ...any) {
		t.Helper()
		errs++
		if errs <= 25 {
			t.Errorf(format, args...)
		} else if errs == 26 {
			t.Errorf("... more mismatches not shown")
		}
	}
	if len(got) != len(want) {
		fail("consumed %d records, produced %d", len(got), len(want))
	}

	byPart := make(map[int32][]record)
	for _, r := range got {
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	for p, rs := range byPart {
		slices.SortFunc(rs, func(a, b record) int { return cmp.Compare(a.Offset, b.Offset) })
		for i, r := range rs {
			if r.Offset != int64(i) {
				fail("partition %d: record #%d has offset %d, want %d (offsets contiguous from 0)", p, i, r.Offset, i)
				break
			}
		}
		for i := 1; i < len(rs); i++ {
			if rs[i].Seq < rs[i-1].Seq {
				fail("partition %d: seq %d at offset %d comes after seq %d at offset %d (not in produce order)",
					p, rs[i].Seq, rs[i].Offset, rs[i-1].Seq, rs[i-1].Offset)
				break
			}
		}
	}

	bySeq := make(map[int]record, len(got))
	for _, r := range got {
		if r.Seq < 0 {
			fail("consumed a record without a valid seq header: %v", r)
			continue
		}
		if prev, dup := bySeq[r.Seq]; dup {
			fail("seq %d consumed twice: %v and %v", r.Seq, prev, r)
		}
		bySeq[r.Seq] = r
	}
	for _, w := range want {
		g, ok := bySeq[w.Seq]
		if !ok {
			fail("produced record not consumed: %v", w)
			continue
		}
		if g.Partition != w.Partition {
			fail("seq %d: partition %d, want %d", w.Seq, g.Partition, w.Partition)
		}
		if w.Offset >= 0 && g.Offset != w.Offset {
			fail("seq %d: consumed at offset %d, producer was told %d", w.Seq, g.Offset, w.Offset)
		}
		if !sameBytes(g.Key, w.Key, o.nullsDistinct) {
			fail("seq %d: key %s, want %s", w.Seq, showBytes(g.Key), showBytes(w.Key))
		}
		if !sameBytes(g.Value, w.Value, o.nullsDistinct) {
			fail("seq %d: value %s, want %s", w.Seq, showBytes(g.Value), showBytes(w.Value))
		}
		if !sameHeaders(g.Headers, w.Headers) {
			fail("seq %d: headers %v, want %v", w.Seq, g.Headers, w.Headers)
		}
		if o.tsWindow != nil {
			if g.Timestamp.Before(o.tsWindow[0]) || g.Timestamp.After(o.tsWindow[1]) {
				fail("seq %d: timestamp %d outside the produce window [%d, %d]", w.Seq,
					g.Timestamp.UnixMilli(), o.tsWindow[0].UnixMilli(), o.tsWindow[1].UnixMilli())
			}
		} else if g.Timestamp.UnixMilli() != w.Timestamp.UnixMilli() {
			fail("seq %d: timestamp %d, want %d", w.Seq, g.Timestamp.UnixMilli(), w.Timestamp.UnixMilli())
		}
	}
}

func sameBytes(got, want []byte, nullsDistinct bool) bool {
	if nullsDistinct && (got == nil) != (want == nil) {
		return false
	}
	return bytes.Equal(got, want)
}

// sameHeaders compares header keys and values in order. Header values are
// never null here, so an empty value may come back as nil.
func sameHeaders(got, want []header) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i].Key != want[i].Key || !bytes.Equal(got[i].Value, want[i].Value) {
			return false
		}
	}
	return true
}

// seqOf reads the seq header; -1 if missing or malformed.
func seqOf(hs []header) int {
	for _, h := range hs {
		if h.Key == "seq" {
			if n, err := strconv.Atoi(string(h.Value)); err == nil {
				return n
			}
		}
	}
	return -1
}

// offsetQuery is one ListOffsets question and its right answer.
type offsetQuery struct {
	name      string
	partition int32
	ts        int64 // -2 earliest, -1 latest, else a millisecond timestamp
	want      int64
}

// offsetQueries derives ListOffsets questions from records that were
// consumed and checked: earliest and latest of every partition, and by time
// in every partition: before the first record (→ 0), exactly a record's
// timestamp (→ that record), and 1 ms after a record (→ the next record).
func offsetQueries(recs []record) []offsetQuery {
	byPart := make(map[int32][]record)
	for _, r := range recs {
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	var qs []offsetQuery
	for _, p := range slices.Sorted(maps.Keys(byPart)) {
		rs := byPart[p]
		slices.SortFunc(rs, func(a, b record) int { return cmp.Compare(a.Offset, b.Offset) })
		n := int64(len(rs))
		qs = append(qs,
			offsetQuery{"earliest", p, -2, 0},
			offsetQuery{"latest", p, -1, n},
			offsetQuery{"before-first", p, rs[0].Timestamp.UnixMilli() - 1000, 0})
		if len(rs) >= 2 {
			mid := len(rs) / 2
			a, b := rs[mid-1], rs[mid]
			qs = append(qs,
				offsetQuery{"exact", p, b.Timestamp.UnixMilli(), b.Offset},
				offsetQuery{"between", p, a.Timestamp.UnixMilli() + 1, b.Offset})
		}
	}
	return qs
}
