package broker

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/synapsebroker/synapse/tiering"
)

// The cleaner compacts a compacted topic behind a real client: afterwards a
// consumer from offset 0 reads exactly the latest value of every key (at its
// original offset), tombstones are gone, the uncompacted tail is whole, and
// the same holds after a restart.
func TestCleanerCompactsBehindClients(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir, MaintenanceInterval: 50 * time.Millisecond, CleanerBackoff: 50 * time.Millisecond}
	ts := startServerConfig(t, cfg)
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	topicCfg := map[string]*string{
		"cleanup.policy":            kstr("compact"),
		"segment.bytes":             kstr("8192"),
		"min.cleanable.dirty.ratio": kstr("0.01"),
		"delete.retention.ms":       kstr("0"),
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, topicCfg, "changelog"); err != nil {
		t.Fatal(err)
	}
	pr, _ := client(t, ts.addr, kgo.DefaultProduceTopic("changelog"), kgo.ProducerLinger(0))
	rng := rand.New(rand.NewPCG(7, 7))
	type kept struct {
		off   int64
		value string
		tomb  bool
	}
	latest := map[string]kept{}
	const keys, writes = 50, 1500
	written := 0
	produce := func(n int, prefix string, tombs bool) {
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("%s%02d", prefix, rng.IntN(keys))
			r := &kgo.Record{Key: []byte(k), Value: []byte(fmt.Sprintf("%s=%d", k, i))}
			tomb := tombs && i > n/2 && rng.IntN(10) == 0
			if tomb {
				r.Value = nil
			}
			res := pr.ProduceSync(ctx, r)
			if err := res.FirstErr(); err != nil {
				t.Fatal(err)
			}
			got, _ := res.First()
			latest[k] = kept{got.Offset, string(r.Value), tomb}
			written++
		}
	}
	p := ts.reg.partition(ts.reg.get("changelog"), 0)
	caughtUp := func() {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			sealed := p.log.SealedSegments()
			if p.log.LastClean() != nil && len(sealed) > 0 && p.log.FirstDirtyOffset() >= sealed[len(sealed)-1].Next {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cleaner never caught up: last clean %+v, first dirty %d", p.log.LastClean(), p.log.FirstDirtyOffset())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	produce(writes, "k", true)
	caughtUp()
	// A tombstone goes at the clean after the one that first saw it (its
	// delete horizon, here 0 ms later): new dirty data brings that clean.
	cleans := ts.cleaner.cleans.Load()
	produce(writes/2, "z", false)
	caughtUp()
	for deadline := time.Now().Add(30 * time.Second); ts.cleaner.cleans.Load() == cleans; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no second clean")
		}
	}
	end := p.log.HighWatermark()
	check := func(addr string) {
		t.Helper()
		cl, _ := client(t, addr, kgo.ConsumeTopics("changelog"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
		seen := map[string]kept{}
		var last int64 = -1
		activeBase := p.log.SealedSegments()[len(p.log.SealedSegments())-1].Next
		n := 0
		for last < end-1 {
			fs := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				t.Fatalf("consumed up to %d of %d: %v", last, end, err)
			}
			fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
			fs.EachRecord(func(r *kgo.Record) {
				n++
				if r.Offset <= last {
					t.Fatalf("offset %d after %d", r.Offset, last)
				}
				last = r.Offset
				k := string(r.Key)
				if prev, ok := seen[k]; ok && r.Offset < activeBase {
					t.Fatalf("key %s twice in the cleaned range: offsets %d and %d", k, prev.off, r.Offset)
				}
				seen[k] = kept{r.Offset, string(r.Value), r.Value == nil}
			})
		}
		for k, want := range latest {
			got, ok := seen[k]
			switch {
			case want.tomb && want.off < activeBase:
				if ok && got.off < activeBase {
					t.Fatalf("tombstone of %s at %d still read (delete.retention.ms=0)", k, got.off)
				}
			case !ok || got.off != want.off || got.value != want.value:
				t.Fatalf("key %s: read %+v, want %+v", k, got, want)
			}
		}
		if n >= written {
			t.Fatalf("read %d records of %d written: nothing was removed", n, written)
		}
	}
	check(ts.addr)
	ts.stop(t)
	ts2 := startServerConfig(t, Config{DataDir: dir, CleanerBackoff: -1})
	p = ts2.reg.partition(ts2.reg.get("changelog"), 0)
	check(ts2.addr)
}

// With a tier, the cleaner rewrites only what the bucket does not hold yet
// and never beside an upload: uploaded segments still leave the disk, and a
// consumer reads every key's latest value, cold and hot.
func TestCleanerWithTiering(t *testing.T) {
	dir := t.TempDir()
	store := tiering.NewMemStore()
	ts := startServerConfig(t, Config{DataDir: dir, Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 50 * time.Millisecond,
		CleanerBackoff: 20 * time.Millisecond})
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	topicCfg := map[string]*string{
		"cleanup.policy":            kstr("compact"),
		"segment.bytes":             kstr("4096"),
		"min.cleanable.dirty.ratio": kstr("0.01"),
		"local.retention.bytes":     kstr("0"),
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, topicCfg, "tiered-changelog"); err != nil {
		t.Fatal(err)
	}
	pr, _ := client(t, ts.addr, kgo.DefaultProduceTopic("tiered-changelog"), kgo.ProducerLinger(0))
	latest := map[string]int64{}
	for i := 0; i < 800; i++ {
		k := fmt.Sprintf("k%02d", i%40)
		res := pr.ProduceSync(ctx, &kgo.Record{Key: []byte(k), Value: []byte(fmt.Sprintf("%s=%d", k, i))})
		if err := res.FirstErr(); err != nil {
			t.Fatal(err)
		}
		r, _ := res.First()
		latest[k] = r.Offset
	}
	p := ts.reg.partition(ts.reg.get("tiered-changelog"), 0)
	for deadline := time.Now().Add(20 * time.Second); p.log.LocalStartOffset() == 0 || len(p.log.SealedSegments()) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("uploaded segments never left the disk: local start %d, %d sealed local segments", p.log.LocalStartOffset(), len(p.log.SealedSegments()))
		}
	}
	cl, _ := client(t, ts.addr, kgo.ConsumeTopics("tiered-changelog"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	seen := map[string]int64{}
	end := p.log.HighWatermark()
	var last int64 = -1
	for last < end-1 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed up to %d of %d: %v", last, end, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset <= last {
				t.Fatalf("offset %d after %d", r.Offset, last)
			}
			last = r.Offset
			seen[string(r.Key)] = r.Offset
		})
	}
	for k, off := range latest {
		if seen[k] != off {
			t.Fatalf("key %s: latest read at %d, written at %d", k, seen[k], off)
		}
	}
}
