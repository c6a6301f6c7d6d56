package compattests

import (
	"fmt"
	"testing"
	"time"
)

// The comparison must catch what it claims to: every mutation of a good
// consumed set below has to produce at least one error, and the good set
// none. Runs without a broker.

type errRecorder struct {
	testing.TB
	errs []string
}

func (r *errRecorder) Helper() {}

func (r *errRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestCheckRecordsCatchesMismatches(t *testing.T) {
	gen := newRecordGen(numPartitions)
	var want []record
	for _, codec := range codecs[:2] {
		want = append(want, gen.batch(codec, 6, false)...)
	}
	// What a correct broker gives back: offsets assigned per partition in
	// produce order.
	next := make(map[int32]int64)
	for i := range want {
		want[i].Offset = next[want[i].Partition]
		next[want[i].Partition]++
	}
	consumed := func() []record {
		out := make([]record, len(want))
		for i, r := range want {
			r.Headers = append([]header(nil), r.Headers...)
			r.Key = append([]byte(nil), r.Key...)
			if want[i].Key != nil && r.Key == nil {
				r.Key = []byte{}
			}
			if want[i].Value != nil {
				r.Value = append([]byte{}, r.Value...)
			}
			out[i] = r
		}
		return out
	}
	find := func(recs []record, pred func(record) bool) int {
		for i, r := range recs {
			if pred(r) {
				return i
			}
		}
		t.Fatal("no record matches")
		return -1
	}

	rec := &errRecorder{TB: t}
	checkRecords(rec, want, consumed(), checkOpts{nullsDistinct: true})
	if len(rec.errs) != 0 {
		t.Fatalf("a correct set gave errors: %q", rec.errs)
	}

	mutations := map[string]func([]record) []record{
		"record missing": func(g []record) []record { return g[1:] },
		"record twice":   func(g []record) []record { return append(g, g[0]) },
		"empty key as null": func(g []record) []record {
			i := find(g, func(r record) bool { return r.Key != nil && len(r.Key) == 0 })
			g[i].Key = nil
			return g
		},
		"null value as empty": func(g []record) []record {
			i := find(g, func(r record) bool { return r.Value == nil })
			g[i].Value = []byte{}
			return g
		},
		"value byte flipped": func(g []record) []record {
			i := find(g, func(r record) bool { return len(r.Value) > 0 })
			g[i].Value[len(g[i].Value)-1] ^= 1
			return g
		},
		"headers reordered": func(g []record) []record {
			i := find(g, func(r record) bool { return len(r.Headers) >= 3 })
			g[i].Headers[1], g[i].Headers[2] = g[i].Headers[2], g[i].Headers[1]
			return g
		},
		"header dropped":    func(g []record) []record { g[0].Headers = g[0].Headers[:len(g[0].Headers)-1]; return g },
		"partition changed": func(g []record) []record { g[2].Partition = (g[2].Partition + 1) % numPartitions; return g },
		"timestamp off by 1 ms": func(g []record) []record {
			g[4].Timestamp = g[4].Timestamp.Add(time.Millisecond)
			return g
		},
		"offset gap": func(g []record) []record {
			for i := range g {
				if g[i].Partition == 0 && g[i].Offset > 0 {
					g[i].Offset++
				}
			}
			return g
		},
		"produce order swapped": func(g []record) []record {
			a := find(g, func(r record) bool { return r.Partition == 1 && r.Offset == 0 })
			b := find(g, func(r record) bool { return r.Partition == 1 && r.Offset == 1 })
			g[a].Offset, g[b].Offset = 1, 0
			return g
		},
	}
	for name, mutate := range mutations {
		rec := &errRecorder{TB: t}
		checkRecords(rec, want, mutate(consumed()), checkOpts{nullsDistinct: true})
		if len(rec.errs) == 0 {
			t.Errorf("%s: not detected", name)
		}
	}
}
