package tiering_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/broker"
	"github.com/synapsebroker/synapse/tiering"
)

// End-to-end against a real S3-compatible server (versitygw): a broker
// offloads small segments, serves them cold, survives the bucket going away
// and coming back, and a new broker on an empty disk restores from it.

type e2eBroker struct {
	srv  *broker.Server
	addr string
	done chan error
}

func startBroker(t *testing.T, dir string, tier *tiering.Tier) *e2eBroker {
	return startBrokerTB(t, dir, tier)
}

func startBrokerTB(t testing.TB, dir string, tier *tiering.Tier) *e2eBroker {
	return startBrokerConfig(t, broker.Config{DataDir: dir, Tier: tier})
}

// startBrokerConfig starts a broker with cfg (auto-creating topics,
// maintenance every 100 ms).
func startBrokerConfig(t testing.TB, cfg broker.Config) *e2eBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.AutoCreateTopics, cfg.MaintenanceInterval, cfg.Logger = true, 100*time.Millisecond, zap.NewNop()
	s, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := &e2eBroker{srv: s, addr: ln.Addr().String(), done: make(chan error, 1)}
	go func() { b.done <- s.Serve(ln) }()
	t.Cleanup(func() { b.stopTB(t) })
	return b
}

func (b *e2eBroker) stop(t *testing.T) { b.stopTB(t) }

func (b *e2eBroker) stopTB(t testing.TB) {
	if b.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.srv.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	<-b.done
	b.srv = nil
}

func kclient(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	return kclientTB(t, addr, opts...)
}

func kclientTB(t testing.TB, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func localSegments(dir string) int {
	n := 0
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, ".log") {
			n++
		}
		return nil
	})
	return n
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func produce(t *testing.T, cl *kgo.Client, from, n int) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var rs []*kgo.Record
	for i := from; i < from+n; i++ {
		v := make([]byte, 700)
		rand.Read(v) // incompressible: segments fill as sized
		rs = append(rs, &kgo.Record{Topic: "tiered", Key: []byte(fmt.Sprint(i)), Value: v})
	}
	for i := 0; i < len(rs); i += 10 { // ~7 KB batches: many small segments
		if err := cl.ProduceSync(ctx, rs[i:min(i+10, len(rs))]...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return rs
}

// consumeExact reads topic "tiered" from the start until it has a record
// for every key of want (failing after a minute), fails unless each is
// byte-exact, and returns every record read (by key).
func consumeExact(t *testing.T, addr string, want []*kgo.Record) map[string][]byte {
	t.Helper()
	cl := kclient(t, addr, kgo.ConsumeTopics("tiered"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := map[string][]byte{}
	missing := map[string]bool{}
	for _, r := range want {
		missing[string(r.Key)] = true
	}
	for len(missing) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d records, %d of %d wanted missing", len(got), len(missing), len(want))
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		fs.EachRecord(func(r *kgo.Record) {
			got[string(r.Key)] = r.Value
			delete(missing, string(r.Key))
		})
	}
	for _, r := range want {
		if !bytes.Equal(got[string(r.Key)], r.Value) {
			t.Fatalf("record %s not read back byte-exact", r.Key)
		}
	}
	return got
}

func TestS3OffloadOutageRestore(t *testing.T) {
	vgw := tiering.RunVersitygw(t)
	// As `synapse serve` wraps the store: retries with backoff.
	store := tiering.Retrying(vgw.Store(vgw.Bucket(), "cluster-a"), 5)
	dir := t.TempDir()
	const budget = 400_000 // local segment bytes: the outage below fills it
	b := startBrokerConfig(t, broker.Config{DataDir: dir, Tier: tiering.New(store, nil, 4<<20), LocalDiskBudget: budget})
	cl := kclient(t, b.addr)
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := map[string]*string{"segment.bytes": ptr("30000"), "local.retention.bytes": ptr("0"), "retention.ms": ptr("-1")}
	if _, err := adm.CreateTopic(ctx, 2, 1, cfg, "tiered"); err != nil {
		t.Fatal(err)
	}
	sent := produce(t, cl, 0, 400)
	// Sealed segments leave the disk once the bucket has them.
	waitFor(t, "local segments offloaded", 30*time.Second, func() bool {
		st, _ := b.srv.TierStatus(ctx)
		return st.UploadedSegments >= 6 && st.LagSegments == 0 && localSegments(dir) <= 4
	})
	// ListOffsets by time finds records now only in the bucket.
	firstTs := time.UnixMilli(1_700_000_000_000)
	lo, err := adm.ListOffsetsAfterMilli(ctx, firstTs.UnixMilli(), "tiered")
	if err != nil || lo.Error() != nil {
		t.Fatal(err, lo.Error())
	}
	for _, p := range []int32{0, 1} {
		if o, _ := lo.Lookup("tiered", p); o.Offset != 0 {
			t.Fatalf("partition %d: offset for an old timestamp %d, want 0 (in the bucket)", p, o.Offset)
		}
	}
	consumeExact(t, b.addr, sent) // cold, from the bucket
	before, _ := b.srv.TierStatus(ctx)
	consumeExact(t, b.addr, sent) // again: from the cache
	after, _ := b.srv.TierStatus(ctx)
	if after.DownloadedBytes != before.DownloadedBytes || after.CacheHits <= before.CacheHits {
		t.Fatalf("second cold pass downloaded again: %+v then %+v", before.Stats, after.Stats)
	}

	// Outage: the bucket goes away; produce keeps working up to the local
	// disk budget, then is refused with a retriable error; when the bucket
	// is back, uploads catch up and produce is accepted again.
	vgw.Stop()
	pr := kclient(t, b.addr, kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RecordRetries(1))
	refused := false
	for i := 400; i < 2000 && !refused; i++ {
		v := make([]byte, 700)
		rand.Read(v)
		r := &kgo.Record{Topic: "tiered", Key: []byte(fmt.Sprint(i)), Value: v}
		switch err := pr.ProduceSync(ctx, r).FirstErr(); {
		case err == nil:
			sent = append(sent, r)
		case errors.Is(err, kerr.KafkaStorageError):
			refused = true
		default:
			t.Fatalf("produce during the outage: %v", err)
		}
	}
	if !refused {
		t.Fatal("produce never refused at the local disk budget while the bucket was away")
	}
	t.Logf("outage: %d records accepted, then refused at the local disk budget", len(sent)-400)
	if st, _ := b.srv.TierStatus(ctx); st.LagSegments == 0 || st.Errors == 0 {
		t.Fatalf("no upload lag or errors during the outage: %+v", st)
	}
	vgw.Start()
	waitFor(t, "uploads to catch up after the outage", 60*time.Second, func() bool {
		st, _ := b.srv.TierStatus(ctx)
		return st.LagSegments == 0
	})
	pr2 := kclient(t, b.addr, kgo.RecordRetries(1)) // the first may be backing off
	waitFor(t, "produce accepted again", 30*time.Second, func() bool {
		r := &kgo.Record{Topic: "tiered", Key: []byte("after-outage"), Value: []byte("x")}
		if pr2.ProduceSync(ctx, r).FirstErr() != nil {
			return false
		}
		sent = append(sent, r)
		return true
	})
	consumeExact(t, b.addr, sent)

	// Lose the disk: a broker on an empty directory restores from the bucket
	// (a graceful stop offloaded the active segments too).
	b.stop(t)
	b2 := startBroker(t, t.TempDir(), tiering.New(store, nil, 4<<20))
	consumeExact(t, b2.addr, sent)
	cl2 := kclient(t, b2.addr)
	more := produce(t, cl2, 5000, 20) // keys past the outage loop's
	consumeExact(t, b2.addr, append(sent, more...))
}

func ptr(s string) *string { return &s }
