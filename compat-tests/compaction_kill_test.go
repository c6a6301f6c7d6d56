package compattests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestCompactionKill9DuringCleaning: franz-go produces keyed records with
// acks=all to a compacted topic (50 keys, 4 KiB segments, dirty ratio 0.01,
// cleaner every 50 ms) while the broker is SIGKILLed at random moments, six
// times. Locally (--tier none) every sealed segment is cleaned on disk; with
// the default tier and local.retention.bytes 0 the cleaned segments go to
// the bucket and are compacted there. After every restart a read from
// offset 0 must hold, for every key, its latest acknowledged record (or a
// later one the producer sent): compaction never loses what it must keep.
// Every record read must be one that was sent, at an offset never read
// with another value.
func TestCompactionKill9DuringCleaning(t *testing.T) {
	abs := compactingSynapse(t)
	t.Setenv("SYNAPSE_MAINTENANCE_INTERVAL", "50ms")
	for _, mode := range []struct {
		name string
		args []string
	}{{"local", []string{"--tier", "none"}}, {"bucket", nil}} {
		t.Run(mode.name, func(t *testing.T) {
			b := startSynapseWith(t, abs, func(b *synapseBroker) {
				b.extraArgs = append(b.extraArgs, append([]string{"--cleaner-backoff", "50ms"}, mode.args...)...)
			})
			compactionKillLoop(t, b, mode.name == "bucket")
		})
	}
}

type sentRec struct {
	key, val string
}

// compactLedger records what a keyed workload on a compacted topic sent
// and what was acknowledged where, for checkCompactedAcked.
type compactLedger struct {
	sent     map[string]bool   // key/value pairs ever sent
	acked    map[string]int64  // key -> offset of its latest acknowledged record
	ackedVal map[int64]sentRec // offset -> what was acknowledged there
	total    int               // records acknowledged
}

func newCompactLedger() *compactLedger {
	return &compactLedger{sent: map[string]bool{}, acked: map[string]int64{}, ackedVal: map[int64]sentRec{}}
}

// records returns n records for topic, each with one of 50 keys and a
// random value, noted as sent.
func (l *compactLedger) records(topic string, rng *mrand.Rand, n int) []*kgo.Record {
	rs := make([]*kgo.Record, 0, n)
	for range n {
		v := make([]byte, 60)
		rand.Read(v)
		key, val := fmt.Sprintf("k%02d", rng.IntN(50)), hex.EncodeToString(v)
		l.sent[key+"/"+val] = true
		rs = append(rs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(val)})
	}
	return rs
}

// ack notes an acknowledged record at its offset.
func (l *compactLedger) ack(r *kgo.Record) {
	k := string(r.Key)
	if cur, ok := l.acked[k]; !ok || r.Offset > cur {
		l.acked[k] = r.Offset
	}
	l.ackedVal[r.Offset] = sentRec{k, string(r.Value)}
	l.total++
}

func compactionKillLoop(t *testing.T, b *synapseBroker, bucket bool) {
	ctx := testCtx(t, 3*time.Minute)
	admin, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	topic := uniqueTopic(t)
	cfg := map[string]*string{"cleanup.policy": strPtr("compact"), "segment.bytes": strPtr("4096"),
		"min.cleanable.dirty.ratio": strPtr("0.01"), "delete.retention.ms": strPtr("0")}
	if bucket {
		cfg["local.retention.bytes"] = strPtr("0")
	}
	_, err = kadm.NewClient(admin).CreateTopic(ctx, 1, 1, cfg, topic)
	admin.Close()
	if err != nil {
		t.Fatal(err)
	}
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 2))
	led := newCompactLedger()
	var cleans, bucketSegs float64
	for round := 0; round < 6; round++ {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.ProducerLinger(0), kgo.RecordRetries(3))
		if err != nil {
			t.Fatal(err)
		}
		killAt := time.Now().Add(time.Duration(400+rng.IntN(800)) * time.Millisecond)
		for time.Now().Before(killAt) {
			for _, r := range cl.ProduceSync(ctx, led.records(topic, rng, 10)...) {
				if r.Err == nil {
					led.ack(r.Record)
				}
			}
		}
		cl.Close()
		cleans += metricValue(t, b, "synapse_cleaner_cleans_total")
		bucketSegs += metricValue(t, b, "synapse_cleaner_bucket_segments_total")
		b.Kill9(t)
		b.Start(t)
		checkCompactedAcked(t, b.Addr(), topic, led)
	}
	if cleans == 0 {
		t.Fatal("the cleaner never completed a clean between kills")
	}
	if bucket && bucketSegs == 0 {
		t.Fatal("no segment was compacted in the bucket between kills")
	}
	t.Logf("%d records acknowledged for %d keys over 6 kills; %v cleans, %v bucket segments swapped; 0 lost", led.total, len(led.acked), cleans, bucketSegs)
}

func checkCompactedAcked(t *testing.T, addr, topic string, led *compactLedger) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	last := map[string]int64{}
	off := int64(-1)
	readToEnd(t, ctx, addr, topic, func(r *kgo.Record) {
		if r.Offset <= off {
			t.Fatalf("offset %d after %d", r.Offset, off)
		}
		off = r.Offset
		k, v := string(r.Key), string(r.Value)
		if !led.sent[k+"/"+v] {
			t.Fatalf("offset %d: %s=%s was never sent", r.Offset, k, v)
		}
		if a, ok := led.ackedVal[r.Offset]; ok && a != (sentRec{k, v}) {
			t.Fatalf("offset %d: read %s=%s, acknowledged %s=%s", r.Offset, k, v, a.key, a.val)
		}
		last[k] = r.Offset
	})
	for k, off := range led.acked {
		if l, ok := last[k]; !ok || l < off {
			t.Fatalf("key %s: latest acknowledged at offset %d, latest read at %d (present %v)", k, off, l, ok)
		}
	}
}
