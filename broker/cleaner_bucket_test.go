package broker

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/synapsebroker/synapse/tiering"
)

// Compaction reaches the bucket: segments only the bucket holds are
// downloaded, cleaned, uploaded as a new generation and swapped in; local
// segments the bucket also holds are cleaned and uploaded again. A
// consumer from offset 0 then reads one record per key below the dirty
// range, the latest, tombstones gone; the old objects are deleted; and a
// broker restored from the bucket on an empty disk reads the same.
func TestCleanerCompactsTheBucket(t *testing.T) {
	store := tiering.NewMemStore()
	dir := t.TempDir()
	ts := startServerConfig(t, Config{DataDir: dir, Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 30 * time.Millisecond,
		CleanerBackoff: 20 * time.Millisecond})
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	topicCfg := map[string]*string{
		"cleanup.policy":            kstr("compact"),
		"segment.bytes":             kstr("4096"),
		"min.cleanable.dirty.ratio": kstr("0.01"),
		"local.retention.bytes":     kstr("0"),
		"delete.retention.ms":       kstr("0"),
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, topicCfg, "bucket-changelog"); err != nil {
		t.Fatal(err)
	}
	pr, _ := client(t, ts.addr, kgo.DefaultProduceTopic("bucket-changelog"), kgo.ProducerLinger(0))
	latest := map[string]int64{}
	deleted := map[string]bool{}
	produce := func(round int, tombstones bool) {
		t.Helper()
		for k := 0; k < 40; k++ {
			key := fmt.Sprintf("k%02d", k)
			r := &kgo.Record{Key: []byte(key), Value: []byte(fmt.Sprintf("%s=%d", key, round))}
			if tombstones && k%4 == 0 {
				r.Value = nil
			}
			res := pr.ProduceSync(ctx, r)
			if err := res.FirstErr(); err != nil {
				t.Fatal(err)
			}
			latest[key] = res[0].Record.Offset
			deleted[key] = r.Value == nil
		}
	}
	p := ts.reg.partition(ts.reg.get("bucket-changelog"), 0)
	pk := p.tierKey()
	// Rounds while the cleaner and the tier run: each round's dirty data
	// supersedes what the bucket holds of the rounds before.
	for round := 0; round < 12; round++ {
		produce(round, round == 11)
	}
	// Everything produced is below the dirty range and in the bucket only
	// once a pass has cleaned it and released it; one more segment of
	// other keys rolls the last one.
	for k := 0; k < 60; k++ {
		if err := pr.ProduceSync(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("filler%02d", k)), Value: []byte(strings.Repeat("f", 100))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var cleanedEnd int64
	check := func(addr string, end int64) (ok bool, why string) {
		cl, _ := client(t, addr, kgo.ConsumeTopics("bucket-changelog"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		defer cl.Close()
		seen := map[string]int{}
		last := map[string]*kgo.Record{}
		hw := p.log.HighWatermark()
		for off := int64(-1); off < hw-1; {
			fs := cl.PollFetches(cctx)
			if cctx.Err() != nil {
				t.Fatalf("consumed up to %d of %d", off, hw)
			}
			fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
			fs.EachRecord(func(r *kgo.Record) {
				off = r.Offset
				if r.Offset < end {
					seen[string(r.Key)]++
				}
				last[string(r.Key)] = r
			})
		}
		for k, off := range latest {
			r := last[k]
			switch {
			case deleted[k] && r != nil && r.Offset < end:
				return false, fmt.Sprintf("tombstone of %s (offset %d) still there", k, r.Offset)
			case !deleted[k] && (r == nil || r.Offset != off):
				t.Fatalf("key %s: latest written at %d, read %v", k, off, r)
			case seen[k] > 1:
				return false, fmt.Sprintf("key %s read %d times below %d", k, seen[k], end)
			}
		}
		return true, ""
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		cleanedEnd = p.log.FirstDirtyOffset()
		ok, why := false, "nothing cleaned yet"
		if cleanedEnd > latest["k39"] && p.log.LocalStartOffset() > latest["k39"] {
			ok, why = check(ts.addr, cleanedEnd)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			m, _ := ts.cfg.Tier.Manifest(ctx, pk)
			t.Logf("sealed %+v\nmanifest %+v", p.log.SealedSegments(), m)
			t.Fatalf("bucket never compacted (first dirty %d, local start %d): %s", cleanedEnd, p.log.LocalStartOffset(), why)
		}
	}
	m, err := ts.cfg.Tier.Manifest(ctx, pk)
	if err != nil {
		t.Fatal(err)
	}
	var cleaned int
	for _, s := range m.Segments {
		if s.Cleaned && s.Gen > 0 {
			cleaned++
		}
	}
	if cleaned == 0 || m.Gen == 0 {
		t.Fatalf("no compacted generation in the manifest: %+v", m)
	}
	// The objects of replaced segments are gone.
	p.tierMu.Lock()
	orphans, err := ts.cfg.Tier.CleanOrphans(ctx, pk)
	p.tierMu.Unlock()
	if err != nil || orphans != 0 {
		t.Fatalf("%d objects no manifest names (err %v)", orphans, err)
	}
	if n := ts.cleaner.bucketSegments.Load(); n == 0 {
		t.Fatal("no segment only the bucket held was cleaned")
	}

	// Lose the disk: the bucket's log is the compacted one.
	ts.stop(t)
	ts2 := startServerConfig(t, Config{DataDir: t.TempDir(), Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: time.Hour, CleanerBackoff: -1})
	p = ts2.reg.partition(ts2.reg.get("bucket-changelog"), 0)
	if ok, why := check(ts2.addr, cleanedEnd); !ok {
		t.Fatalf("restored from the bucket: %s", why)
	}
}

// When compaction empties every segment the bucket holds (each key's
// latest record is in the local log), a consumer from offset 0 still
// reaches the end: the fetch goes on in the local log where the bucket's
// empty segments end.
func TestCleanerEmptiesTheBucket(t *testing.T) {
	ts := startServerConfig(t, Config{Tier: tiering.New(tiering.NewMemStore(), nil, 8<<20), MaintenanceInterval: 30 * time.Millisecond,
		CleanerBackoff: 20 * time.Millisecond})
	cl, adm := client(t, ts.addr, kgo.DefaultProduceTopic("emptied"), kgo.ProducerLinger(0))
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": kstr("compact"), "segment.bytes": kstr("4096"),
		"min.cleanable.dirty.ratio": kstr("0.01"), "local.retention.bytes": kstr("0")}, "emptied"); err != nil {
		t.Fatal(err)
	}
	var last int64
	produce := func(round int) {
		for k := 0; k < 40; k++ {
			res := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("k%02d", k)), Value: []byte(fmt.Sprintf("v%d", round))})
			if err := res.FirstErr(); err != nil {
				t.Fatal(err)
			}
			last = res[0].Record.Offset
		}
	}
	for round := 0; round < 10; round++ {
		produce(round)
	}
	p := ts.reg.partition(ts.reg.get("emptied"), 0)
	for deadline := time.Now().Add(15 * time.Second); p.log.LocalStartOffset() < 200; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("nothing released: local start %d", p.log.LocalStartOffset())
		}
	}
	// The last round and records of other keys after it stay local.
	if rs, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "local.retention.bytes", Value: kstr("-1")}}, "emptied"); err != nil || rs[0].Err != nil {
		t.Fatal(err, rs)
	}
	produce(10)
	for i := 0; i < 60; i++ {
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("other%02d", i)), Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var below int64
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		m, err := ts.cfg.Tier.Manifest(ctx, p.tierKey())
		if err != nil {
			t.Fatal(err)
		}
		below = p.log.LocalStartOffset()
		var n, bytes int64
		for _, s := range m.Segments {
			if s.Next <= below {
				n++
				bytes += s.Size
			}
		}
		if n > 0 && bytes == 0 && p.log.FirstDirtyOffset() > last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bucket never emptied: %+v, local start %d", m, below)
		}
	}
	got := consumeAll(t, ts.addr, "emptied", 100)
	lastVal := map[string]string{}
	for _, r := range got {
		if r.Offset < below {
			t.Fatalf("offset %d (%s) read, below the local start %d: the bucket's part is empty", r.Offset, r.Key, below)
		}
		lastVal[string(r.Key)] = string(r.Value)
	}
	for k := 0; k < 40; k++ {
		// (A cold read may go on into a bucket copy the local log has
		// cleaned since: older values may show, the latest is last.)
		if v := lastVal[fmt.Sprintf("k%02d", k)]; v != "v10" {
			t.Fatalf("k%02d: latest read %q", k, v)
		}

	}
}
