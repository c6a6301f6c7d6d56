package compattests

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestClusterGroupCoordinatorFailover: a consumer group commits offsets,
// the group coordinator's broker is killed with SIGKILL, and the offsets
// are still there (the group log is replicated): kadm reads them from the
// new coordinator and a new member of the group resumes exactly at them.
func TestClusterGroupCoordinatorFailover(t *testing.T) {
	c := startSynCluster(t, 3)
	adm := c.admin(t)
	ctx := testCtx(t, 2*time.Minute)
	topic, group := uniqueTopic(t), "g-"+uniqueTopic(t)
	c.createTopic(t, adm, topic, 3)
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.seeds()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	const n = 300
	for i := range n {
		r := &kgo.Record{Partition: int32(i % 3), Value: fmt.Appendf(nil, "v-%d", i)}
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	consumer := func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.seeds()...), kgo.ConsumeTopics(topic), kgo.ConsumerGroup(group),
			kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			// A member whose leave did not reach the new coordinator (the
			// group record of a leave is written after its answer, as in
			// Kafka) holds a rebalance for its session timeout.
			kgo.SessionTimeout(3*time.Second), kgo.HeartbeatInterval(300*time.Millisecond),
			kgo.FetchMaxWait(200*time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }))
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	first := consumer()
	read := 0
	for read < n/2 {
		fs := first.PollRecords(ctx, n/2-read)
		if ctx.Err() != nil {
			t.Fatalf("first member: %v after %d records", ctx.Err(), read)
		}
		read += len(fs.Records())
		if err := first.CommitRecords(ctx, fs.Records()...); err != nil {
			t.Fatalf("commit: %v", err)
		}
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	coords := adm.FindGroupCoordinators(ctx, group)
	var coordID int32 = -1
	coords.Each(func(d kadm.FindCoordinatorResponse) {
		if d.Err == nil {
			coordID = d.NodeID
		}
	})
	if coordID < 0 {
		t.Fatalf("no coordinator for %s", group)
	}
	first.Close()
	c.brokers[coordID].Kill9(t)
	t.Logf("read and committed %d records; killed the coordinator, broker %d", read, coordID)
	// A new admin client each try: kgo keeps a coordinator it found
	// cached for as long as dialling it fails (it finds one again on
	// NOT_COORDINATOR, not on a refused connection), and the first try
	// may come before the failover.
	var after kadm.OffsetResponses
	deadline := time.Now().Add(20 * time.Second)
	for {
		acl, err := kgo.NewClient(kgo.SeedBrokers(c.seeds()...))
		if err != nil {
			t.Fatal(err)
		}
		after, err = kadm.NewClient(acl).FetchOffsets(ctx, group)
		acl.Close()
		if err == nil && after.Error() == nil && len(after) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("offsets after the failover: %v %v", err, after.Error())
		}
		time.Sleep(200 * time.Millisecond)
	}
	want := map[int32]int64{}
	committed.Each(func(o kadm.OffsetResponse) { want[o.Partition] = o.At })
	after.Each(func(o kadm.OffsetResponse) {
		if o.At != want[o.Partition] {
			t.Errorf("partition %d: committed %d before the kill, %d after", o.Partition, want[o.Partition], o.At)
		}
	})
	second := consumer()
	defer second.Close()
	firstSeen := map[int32]int64{}
	rest := 0
	for rest < n-read {
		fs := second.PollRecords(ctx, n)
		if ctx.Err() != nil {
			t.Fatalf("second member: %v after %d records", ctx.Err(), rest)
		}
		for _, r := range fs.Records() {
			if _, ok := firstSeen[r.Partition]; !ok {
				firstSeen[r.Partition] = r.Offset
			}
			rest++
		}
	}
	for p, off := range firstSeen {
		if off != want[p] {
			t.Errorf("partition %d: the new member started at %d, committed %d", p, off, want[p])
		}
	}
	if rest != n-read {
		t.Errorf("the new member read %d records, want %d", rest, n-read)
	}
	c.brokers[coordID].Start(t)
}
