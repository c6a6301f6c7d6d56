package compattests

import (
	"testing"
	"time"
)

// TestClusterEtcdQuorum runs the cluster over a 3-member etcd cluster.
// One member killed (-9): etcd keeps its quorum, and produce goes on on
// every partition. Two members killed: no quorum, so no broker can renew
// its session and produce stalls; nothing acknowledged is lost. With the
// members back, the brokers register again and produce resumes.
func TestClusterEtcdQuorum(t *testing.T) {
	members := startEtcdMembers(t, 3)
	c, topic, partitions, acks, times, stop := clusterLoadOn(t, startSynClusterOn(t, members, 3))
	time.Sleep(2 * time.Second)

	members[0].kill9()
	killed := time.Now()
	time.Sleep(5 * time.Second)
	for p := range partitions {
		if at, ok := times.firstAfter(p, killed.Add(2*time.Second)); !ok {
			t.Errorf("partition %d: no ack from 2 s to 5 s after one etcd member of three was killed", p)
		} else {
			t.Logf("partition %d: acks go on (one at %s after the member's kill)", p, at.Sub(killed).Round(time.Millisecond))
		}
	}
	members[0].start(t)
	members[0].waitHealthy(t)

	before := acks.count()
	members[1].kill9()
	members[2].kill9()
	lost := time.Now()
	time.Sleep(8 * time.Second)
	during := acks.count()
	members[1].start(t)
	members[2].start(t)
	for _, m := range members {
		m.waitHealthy(t)
	}
	back := time.Now()
	c.waitISR(t, topic, 3, 90*time.Second)
	time.Sleep(2 * time.Second)
	stop()
	gap, p := times.maxGap(lost, time.Now())
	t.Logf("quorum lost 8 s after %d acks (%d acknowledged meanwhile); %d acks in all, %d failed; longest gap between acks %s (partition %d); ISR whole %s after the quorum was back",
		before, during-before, acks.count(), acks.fails.Load(), gap.Round(time.Millisecond), p, time.Since(back).Round(time.Millisecond))
	for p := range partitions {
		if _, ok := times.firstAfter(p, back); !ok {
			t.Errorf("partition %d: nothing acknowledged after etcd's quorum came back", p)
		}
	}
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}
