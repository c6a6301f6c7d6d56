package compattests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// TestClusterAddBroker: a fourth broker joins three that hold every
// replica of a topic under load. The controller moves replicas to it
// (reassignments: the new replica catches up, joins the ISR, an old one
// leaves), it leads the partitions it became the first replica of, and
// every acknowledged record is read back. A broker a replica moved away
// from removes its copy, and copies the log again when it moves back.
func TestClusterAddBroker(t *testing.T) {
	c, topic, partitions, acks, _, stop := clusterLoad(t)
	time.Sleep(2 * time.Second)
	c.addBroker(t)
	id := int32(len(c.brokers) - 1)
	adm := c.admin(t)
	var replicas, leads int
	deadline := time.Now().Add(90 * time.Second)
	for ; time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		st, err := c.states(t, adm, topic)
		if err != nil {
			continue
		}
		replicas, leads = 0, 0
		whole := true
		for _, s := range st {
			if slices.Contains(s.replicas, id) {
				replicas++
			}
			if s.leader == id {
				leads++
			}
			whole = whole && len(s.isr) == 3 && len(s.replicas) == 3
		}
		// 18 replicas over 4 brokers: 4 or 5 each.
		if whole && replicas >= 4 && leads >= 1 {
			break
		}
	}
	if replicas < 4 || leads < 1 {
		t.Fatalf("broker %d, added, holds %d replicas and leads %d partitions after 90 s", id, replicas, leads)
	}
	// Each call its own deadline: the waits between them may be long.
	call := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	lr, err := adm.ListPartitionReassignments(call(), kadm.TopicsSet{topic: {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("broker %d added: %d replicas, leads %d; reassignments listed at the end: %d", id, replicas, leads, len(lr))
	stop()
	t.Logf("%d acks, %d failed", acks.count(), acks.fails.Load())
	verifyAcked(t, c.seeds(), topic, partitions, acks)

	// An operator's move (kafka-reassign-partitions): partition 0 onto
	// brokers 3, 2, 1.
	target := []int32{3, 2, 1}
	if _, err := adm.AlterPartitionAssignments(call(), kadm.AlterPartitionAssignmentsReq{topic: {0: target}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		st, err := c.states(t, adm, topic)
		if err == nil && slices.Equal(st[0].replicas, target) && len(st[0].isr) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 0 not on %v 60 s after AlterPartitionReassignments: %+v", target, st[0])
		}
	}
	// ElectLeaders: the first replica (3) leads partition 0 at once, or
	// already does (the controller's own pass).
	res, err := adm.ElectLeaders(call(), kadm.ElectPreferredReplica, kadm.TopicsSet{topic: {0: {}}})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[topic][0]; r.Err != nil && !errors.Is(r.Err, kerr.ElectionNotNeeded) {
		t.Fatalf("ElectLeaders: %v", r.Err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		st, err := c.states(t, adm, topic)
		if err == nil && st[0].leader == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 0 not led by its first replica 3 after ElectLeaders: %+v", st[0])
		}
	}
	if res, err := adm.ElectLeaders(call(), kadm.ElectLiveReplica, kadm.TopicsSet{topic: {0: {}}}); err != nil || !errors.Is(res[topic][0].Err, kerr.ElectionNotNeeded) {
		t.Fatalf("an unclean election of a led partition: %v, %v; want ELECTION_NOT_NEEDED", res, err)
	}

	// Broker 0 is not one of partition 0's replicas now (the rebalance or
	// the move took it away): its copy is removed.
	dir := filepath.Join(c.brokers[0].dataDir, topic+"-0")
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := segmentBytes(dir)
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker 0 still holds %d bytes of segments of partition 0 (%v) 15 s after it stopped being a replica", n, err)
		}
	}
	// Back onto broker 0, which leads it: it copied the whole log again.
	back := []int32{0, 1, 2}
	if _, err := adm.AlterPartitionAssignments(call(), kadm.AlterPartitionAssignmentsReq{topic: {0: back}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		st, err := c.states(t, adm, topic)
		if err == nil && slices.Equal(st[0].replicas, back) && len(st[0].isr) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 0 not back on %v 60 s after AlterPartitionReassignments: %+v", back, st[0])
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := adm.ElectLeaders(call(), kadm.ElectPreferredReplica, kadm.TopicsSet{topic: {0: {}}}); err != nil {
			t.Fatal(err)
		}
		st, err := c.states(t, adm, topic)
		if err == nil && st[0].leader == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 0 not led by broker 0 after ElectLeaders: %+v", st[0])
		}
	}
	if n, err := segmentBytes(dir); err != nil || n == 0 {
		t.Fatalf("broker 0 leads partition 0 with %d bytes of segments (%v)", n, err)
	}
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}

// segmentBytes is the size of the segment files in a partition's
// directory.
func segmentBytes(dir string) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return 0, err
		}
		n += info.Size()
	}
	return n, nil
}
