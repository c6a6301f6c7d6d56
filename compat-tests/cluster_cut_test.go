package compattests

import (
	"testing"
	"time"
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
	var led []int32
	for p, s := range st {
		if s.leader == victim {
			led = append(led, p)
		}
	}
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
