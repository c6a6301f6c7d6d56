package compattests

import (
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestClusterCompaction: a compacted topic (RF 3, 4 KiB segments, dirty
// ratio 0.01, delete.retention.ms 0) on three brokers over one bucket,
// with franz-go producing keyed records (50 keys, acks=all) throughout.
// Every replica cleans its own disk; the leader also uploads what it
// cleaned. Then:
//   - a follower is killed (SIGKILL) while the leader cleans, and on its
//     return copies the leader's cleaned segments, offset gaps and all;
//   - the leader is killed: a follower with such a copy leads;
//   - local.retention.bytes goes to 0: segments leave the disks, and the
//     leader cleans the bucket's copies there (its commits fenced by its
//     epoch);
//   - the leader is killed once more.
//
// Every ISR is whole again after each return (a follower that could not
// append a cleaned batch would drop out), and a read from offset 0 holds,
// for every key, its latest acknowledged record (or a later one sent),
// every record read was sent, and no acknowledged offset reads as another
// record.
func TestClusterCompaction(t *testing.T) {
	s3 := startS3(t)
	c := startSynCluster(t, 3, "--tier", s3.url("k"), "--maintenance-interval", "300ms", "--cleaner-backoff", "50ms")
	adm := c.admin(t)
	ctx := testCtx(t, 4*time.Minute)
	topic := uniqueTopic(t)
	if _, err := adm.CreateTopic(ctx, 1, 3, map[string]*string{"cleanup.policy": strPtr("compact"), "segment.bytes": strPtr("4096"),
		"min.cleanable.dirty.ratio": strPtr("0.01"), "delete.retention.ms": strPtr("0")}, topic); err != nil {
		t.Fatal(err)
	}
	c.waitISR(t, topic, 3, 20*time.Second)

	var mu sync.Mutex
	led := newCompactLedger()
	failed := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.seeds()...), kgo.ProducerLinger(0), kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.RecordDeliveryTimeout(20*time.Second))
		if err != nil {
			t.Error(err)
			return
		}
		defer cl.Close()
		rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 3))
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			rs := led.records(topic, rng, 10)
			mu.Unlock()
			res := cl.ProduceSync(ctx, rs...)
			mu.Lock()
			for _, r := range res {
				if r.Err != nil {
					failed++
					continue
				}
				led.ack(r.Record)
			}
			mu.Unlock()
			if ctx.Err() != nil {
				return
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	waitFor := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(within); !ok(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s", what, within)
			}
		}
	}
	leaderOrNone := func() int32 {
		st, err := c.states(t, adm, topic)
		if err != nil {
			return -1
		}
		return st[0].leader
	}
	leader := func() int32 {
		t.Helper()
		if l := leaderOrNone(); l >= 0 {
			return l
		}
		t.Fatal("no leader")
		return -1
	}
	// failover kills the leader, waits for another to take over while it
	// is down and starts it again.
	failover := func() (old, next int32) {
		t.Helper()
		old = leader()
		c.brokers[old].Kill9(t)
		waitFor("a new leader", 15*time.Second, func() bool { next = leaderOrNone(); return next >= 0 && next != old })
		time.Sleep(time.Second)
		c.brokers[old].Start(t)
		c.waitISR(t, topic, 3, 60*time.Second)
		return old, next
	}
	cleans := func(id int32) float64 { return metricValue(t, c.brokers[id], "synapse_cleaner_cleans_total") }
	check := func(when string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		checkCompactedAcked(t, c.seeds()[0], topic, led)
		t.Logf("%s: %d records acknowledged (%d failed), every key's latest read back", when, led.total, failed)
	}

	time.Sleep(2 * time.Second)
	l := leader()
	f := (l + 1) % 3
	waitFor("every replica cleans", 30*time.Second, func() bool { return cleans(l) > 0 && cleans(f) > 0 && cleans((l+2)%3) > 0 })
	// A follower away while the leader cleans: it comes back to copy
	// cleaned segments.
	c.brokers[f].Kill9(t)
	time.Sleep(4 * time.Second)
	c.brokers[f].Start(t)
	c.waitISR(t, topic, 3, 60*time.Second)
	check("follower back")

	old, next := failover()
	check(fmt.Sprintf("leader %d killed, %d took over", old, next))

	if rs, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "local.retention.bytes", Value: strPtr("0")}}, topic); err != nil || rs[0].Err != nil {
		t.Fatalf("alter configs: %v %v", err, rs)
	}
	bucketSegs := func() (n float64) {
		for i := range c.brokers {
			n += metricValue(t, c.brokers[i], "synapse_cleaner_bucket_segments_total")
		}
		return n
	}
	waitFor("a bucket clean", 60*time.Second, func() bool { return bucketSegs() > 0 })
	old, next = failover()
	close(stop)
	wg.Wait()
	check(fmt.Sprintf("bucket cleaned (%v segments swapped), leader %d killed, %d took over", bucketSegs(), old, next))
	for i, b := range c.brokers {
		logb, _ := os.ReadFile(b.logPath)
		if n := strings.Count(string(logb), "straddles the log end"); n > 0 {
			t.Errorf("broker %d: %d replica appends refused", i, n)
		}
	}
}
