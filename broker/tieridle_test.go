package broker

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/synapsebroker/synapse/tiering"
)

// An unchanged partition whose last pass found nothing to tier is skipped
// by later passes; an append, a config change or the recheck interval makes
// it due again.
func TestTierIdlePartitionsAreSkipped(t *testing.T) {
	store := tiering.NewMemStore()
	ts := startServerConfig(t, Config{Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: time.Hour})
	cl, adm := client(t, ts.addr, kgo.ProducerLinger(0))
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"retention.ms": kstr("-1")}, "idle"); err != nil {
		t.Fatal(err)
	}
	p := ts.reg.partition(ts.reg.get("idle"), 0)
	now := time.Now()
	// The first pass mirrors the producer state of a new partition, so it
	// is not idle yet; a pass also yields to a background pass or the
	// cleaner holding the partition. Within a few passes it must be idle.
	for i := 0; ; i++ {
		ts.tierPartition(p, now)
		if ts.tierIdle(p, now) {
			break
		}
		if i == 100 {
			t.Fatal("unchanged partition with nothing to tier is not idle")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if at := p.tierIdle.Load().at; ts.tierIdle(p, at.Add(tierIdleRecheck)) {
		t.Fatal("idle partition not rechecked after tierIdleRecheck")
	}
	// A background pass (a seal or a config change kicks one) may run
	// meanwhile and record the new state as idle itself: what must hold is
	// that the change is in the signature, so the state recorded before it
	// no longer matches.
	before := *p.tierIdle.Load()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "idle", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if ts.tierSigOf(p, before.at) == before {
		t.Fatal("an append leaves the tiering signature unchanged")
	}
	for ts.tierPartition(p, now); !ts.tierIdle(p, now); ts.tierPartition(p, now) {
		if ctx.Err() != nil {
			t.Fatal("never idle again")
		}
	}
	before = *p.tierIdle.Load()
	if rs, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: kstr("1000")}}, "idle"); err != nil || rs[0].Err != nil {
		t.Fatal(err, rs)
	}
	if ts.tierSigOf(p, before.at) == before {
		t.Fatal("a config change leaves the tiering signature unchanged")
	}
	later := time.Now().Add(time.Hour) // after any background pass's clock
	ts.tierPartition(p, later)
	if ts.tierIdle(p, later.Add(251*time.Millisecond)) {
		t.Fatal("retention.ms=1000: an idle partition must be rechecked after a quarter of it")
	}
}
