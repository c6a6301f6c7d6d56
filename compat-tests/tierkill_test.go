package compattests

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestTieringKill9DuringUploads: small segments with local.retention.bytes 0
// keep the broker uploading (to its default tier, a local directory) and
// deleting local copies; it is killed with SIGKILL at random moments while
// franz-go produces with acks=all. After every restart everything
// acknowledged is read back byte-exact from offset 0, part of it cold from
// the tier.
func TestTieringKill9DuringUploads(t *testing.T) {
	t.Setenv("SYNAPSE_MAINTENANCE_INTERVAL", "50ms") // upload continuously
	b := newBroker(t)
	if b.Target() == targetKfake {
		t.Skip("kfake has no tiering and cannot be SIGKILLed")
	}
	sb := b.(*synapseBroker)
	ctx := testCtx(t, 3*time.Minute)
	admin, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	topic := uniqueTopic(t)
	cfg := map[string]*string{"segment.bytes": strPtr("16384"), "local.retention.bytes": strPtr("0"), "retention.ms": strPtr("-1")}
	if _, err := kadm.NewClient(admin).CreateTopic(ctx, 2, 1, cfg, topic); err != nil {
		t.Fatal(err)
	}
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 1))
	acked := map[string][]byte{}
	n := 0
	for round := 0; round < 5; round++ {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.ProducerBatchCompression(kgo.NoCompression()),
			kgo.ProducerLinger(0), kgo.RecordRetries(3))
		if err != nil {
			t.Fatal(err)
		}
		killAt := time.Now().Add(time.Duration(300+rng.IntN(700)) * time.Millisecond)
		for time.Now().Before(killAt) {
			var rs []*kgo.Record
			for i := 0; i < 8; i++ {
				v := make([]byte, 1000)
				rand.Read(v)
				rs = append(rs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(n)), Value: v})
				n++
			}
			for _, r := range cl.ProduceSync(ctx, rs...) {
				if r.Err == nil {
					acked[string(r.Record.Key)] = r.Record.Value
				}
			}
		}
		cl.Close()
		b.Kill9(t)
		b.Start(t)
		checkAllAcked(t, b.Addr(), topic, acked)
	}
	if tiered := countFiles(filepath.Join(sb.dataDir, "tier"), ".log"); tiered == 0 {
		t.Fatal("nothing was ever uploaded to the tier")
	}
	t.Logf("%d records acknowledged over 5 kills", len(acked))
}

func checkAllAcked(t *testing.T, addr, topic string, acked map[string][]byte) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := map[string][]byte{}
	for {
		missing := 0
		for k := range acked {
			if _, ok := got[k]; !ok {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%d acknowledged records never read back", missing)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		fs.EachRecord(func(r *kgo.Record) { got[string(r.Key)] = r.Value })
	}
	for k, v := range acked {
		if !bytes.Equal(got[k], v) {
			t.Fatalf("record %s differs after kill -9", k)
		}
	}
}

func countFiles(dir, suffix string) int {
	n := 0
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, suffix) {
			n++
		}
		return nil
	})
	return n
}

func strPtr(s string) *string { return &s }
