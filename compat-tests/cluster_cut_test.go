package compattests

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestClusterCutFromEtcd cuts the leader of partition 0 off etcd (its
// proxy closes every connection) for longer than the session TTL, under
// load. Its session ends, so it stops leading; the controller moves its
// partitions; once healed it registers again and catches up. Nothing
// acknowledged is lost.
func TestClusterCutFromEtcd(t *testing.T) {
	c, topic, partitions, acks, times, stop := clusterLoadOn(t, startSynClusterProxied(t, 3))
	adm := c.admin(t)
	time.Sleep(2 * time.Second)
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	victim := st[0].leader
	led := ledBy(st, victim)
	cut := time.Now()
	c.etcdProxy[victim].Cut()
	time.Sleep(8 * time.Second)
	st2, err := c.statesFrom(t, c.brokers[(victim+1)%3].Addr(), topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range led {
		if st2[p].leader == victim {
			t.Errorf("partition %d: still led by broker %d 8 s after its cut from etcd", p, victim)
		}
		if at, ok := times.firstAfter(p, cut); ok {
			t.Logf("partition %d: first ack %s after the cut", p, at.Sub(cut).Round(time.Millisecond))
		} else {
			t.Errorf("partition %d: no ack in 8 s after its leader's cut from etcd", p)
		}
	}
	c.etcdProxy[victim].Heal()
	c.waitISR(t, topic, 3, 60*time.Second)
	stop()
	t.Logf("broker %d cut from etcd 8 s; %d acks, %d failed", victim, acks.count(), acks.fails.Load())
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}

// TestClusterCutPeers cuts the followers off the leader of partition 0
// (its peer proxy refuses them) with replica.lag.time.max at 2 s: its
// partitions' ISR shrinks to the leader alone through etcd (below
// min.insync.replicas, so acks=all is refused, retriably, rather than
// acknowledged by one copy); healed, the followers catch up and the ISR
// is whole again. Nothing acknowledged is lost.
func TestClusterCutPeers(t *testing.T) {
	c, topic, partitions, acks, _, stop := clusterLoadOn(t, startSynClusterProxied(t, 3, "--replica-lag-time-max", "2s"))
	adm := c.admin(t)
	time.Sleep(2 * time.Second)
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	victim := st[0].leader
	c.peerProxy[victim].Cut()
	shrunk := false
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && !shrunk; time.Sleep(200 * time.Millisecond) {
		st2, err := c.states(t, adm, topic)
		if err == nil && st2[0].leader == victim && len(st2[0].isr) == 1 {
			shrunk = true
		}
	}
	if !shrunk {
		t.Errorf("partition 0: the ISR did not shrink to its leader %d within 15 s of the cut", victim)
	}
	c.peerProxy[victim].Heal()
	c.waitISR(t, topic, 3, 60*time.Second)
	time.Sleep(time.Second)
	stop()
	t.Logf("broker %d cut from its followers; %d acks, %d failed", victim, acks.count(), acks.fails.Load())
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}

// TestClusterEmptyDiskRejoin kills a broker, empties its data directory
// and starts it again: it is not counted as the replica it was (another
// data directory), copies every partition from its leaders from the
// start, rejoins every ISR, and takes back the leadership of the
// partitions it is the first replica of; every acknowledged record is read
// back (some from it).
func TestClusterEmptyDiskRejoin(t *testing.T) {
	c, topic, partitions, acks, _, stop := clusterLoad(t)
	time.Sleep(2 * time.Second)
	victim := 1
	c.brokers[victim].Kill9(t)
	if err := os.RemoveAll(c.brokers[victim].dataDir); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	c.brokers[victim].Start(t)
	c.waitISR(t, topic, 3, 60*time.Second)
	time.Sleep(2 * time.Second)
	stop()
	// Preferred leaders come back within the controller's 10 s pass.
	adm := c.admin(t)
	leads := 0
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && leads == 0; time.Sleep(500 * time.Millisecond) {
		st, err := c.states(t, adm, topic)
		if err != nil {
			continue
		}
		for _, s := range st {
			if s.leader == int32(victim) {
				leads++
			}
		}
	}
	if leads == 0 {
		t.Errorf("broker %d leads nothing 15 s after it caught up", victim)
	}
	t.Logf("broker %d back on an empty disk, leads %d partitions; %d acks, %d failed", victim, leads, acks.count(), acks.fails.Load())
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}

// TestClusterEmptyDiskNotElected: a partition whose ISR is down to one
// broker goes offline when that broker dies; the broker back on an empty
// disk is not elected (it holds none of the records), nor are the other
// replicas (out of the ISR: no unclean election). The records stay
// unavailable rather than silently lost.
func TestClusterEmptyDiskNotElected(t *testing.T) {
	c := startSynCluster(t, 3)
	adm := c.admin(t)
	ctx := testCtx(t, time.Minute)
	const topic = "solo"
	c.createTopic(t, adm, topic, 1)
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.seeds()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: fmt.Appendf(nil, "v-%d", i)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	prod.Close()
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	last := st[0].leader
	others := []int{}
	for i := range c.brokers {
		if int32(i) != last {
			others = append(others, i)
		}
	}
	for _, i := range others {
		c.brokers[i].Kill9(t)
	}
	wait := func(what string, ok func(partitionState) bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			st, err := c.statesFrom(t, c.brokers[last].Addr(), topic)
			if err == nil && ok(st[0]) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v (%v)", what, st, err)
			}
		}
	}
	wait("the ISR down to the leader", func(s partitionState) bool { return len(s.isr) == 1 && s.leader == last })
	c.brokers[last].Kill9(t)
	if err := os.RemoveAll(c.brokers[last].dataDir); err != nil {
		t.Fatal(err)
	}
	c.brokers[last].Start(t)
	time.Sleep(5 * time.Second)
	st2, err := c.statesFrom(t, c.brokers[last].Addr(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if st2[0].leader >= 0 {
		t.Fatalf("partition led by broker %d (epoch %d) after its only in-sync replica came back on an empty disk", st2[0].leader, st2[0].epoch)
	}
	for _, i := range others {
		c.brokers[i].Start(t)
	}
	time.Sleep(3 * time.Second)
	if st3, err := c.statesFrom(t, c.brokers[last].Addr(), topic); err == nil && st3[0].leader >= 0 {
		t.Errorf("partition led by broker %d, which was out of its ISR (an unclean election)", st3[0].leader)
	}
}
