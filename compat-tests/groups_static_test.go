package compattests

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestGroupStaticMembership: franz-go static members (group.instance.id).
// A static member that restarts (closes without LeaveGroup, as static
// members do, and comes back with the same instance id) takes its old place
// without a rebalance: the other member keeps its partitions and member id,
// and together they read exactly the records produced after the commit.
func TestGroupStaticMembership(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	f := newGroupFixture(t, 4)
	f.produce(t, ctx, 10)

	var mu sync.Mutex
	seen := map[int32]map[int64]int{}
	var bRevoked atomic.Int32
	member := func(instance string, onRevoked *atomic.Int32) *kgo.Client {
		t.Helper()
		opts := []kgo.Opt{kgo.SeedBrokers(f.b.Addr()), kgo.ConsumerGroup(f.group), kgo.ConsumeTopics(f.topic),
			kgo.InstanceID(instance), kgo.Balancers(kgo.RangeBalancer()), kgo.DisableAutoCommit(),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(20 * time.Second)}
		if onRevoked != nil {
			opts = append(opts, kgo.OnPartitionsRevoked(func(context.Context, *kgo.Client, map[string][]int32) { onRevoked.Add(1) }))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatalf("kgo.NewClient: %v", err)
		}
		return cl
	}
	// poll reads on cl until want records arrived (across both members).
	poll := func(cl *kgo.Client, stop <-chan struct{}) {
		for {
			select {
			case <-stop:
				return
			default:
			}
			pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			fs := cl.PollFetches(pctx)
			cancel()
			mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				if seen[r.Partition] == nil {
					seen[r.Partition] = map[int64]int{}
				}
				seen[r.Partition][r.Offset]++
			})
			mu.Unlock()
			if len(fs.Records()) > 0 {
				if err := cl.CommitUncommittedOffsets(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("commit: %v", err)
				}
			}
		}
	}

	a, b := member("static-a", nil), member("static-b", &bRevoked)
	defer b.Close()
	stopA, stopB := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); poll(a, stopA) }()
	go func() { defer wg.Done(); poll(b, stopB) }()
	defer func() { close(stopB); wg.Wait() }()
	waitDistinct(t, &mu, seen, 40, "first generation")
	d := f.waitGroupState(t, ctx, 30*time.Second, "Stable", memberIDsOf(t, ctx, f, 2)...)
	before := map[string]string{} // instance -> member id
	for _, m := range d.Members {
		if m.InstanceID != nil {
			before[*m.InstanceID] = m.MemberID
		}
	}
	// Everything read is committed before a restarts.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c, err := f.fetchCommits(ctx)
		total := int64(0)
		for _, o := range c[f.topic] {
			total += o
		}
		if err == nil && total == 40 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("commits never reached the end: %v %v", c, err)
		}
	}
	revokedBefore := bRevoked.Load()

	// a restarts: closes (a static member does not leave), comes back.
	close(stopA)
	a.Close()
	d = f.describe(t, ctx)
	if d.State != "Stable" || len(d.Members) != 2 {
		t.Fatalf("after the static member closed: %s with %d members, want Stable with 2 (no LeaveGroup)", d.State, len(d.Members))
	}
	a2 := member("static-a", nil)
	defer a2.Close()
	stopA2 := make(chan struct{})
	wg.Add(1)
	go func() { defer wg.Done(); poll(a2, stopA2) }()
	defer close(stopA2)

	f.produce(t, ctx, 5)
	waitDistinct(t, &mu, seen, 60, "after the static restart")
	d = f.describe(t, ctx)
	after := map[string]string{}
	for _, m := range d.Members {
		if m.InstanceID != nil {
			after[*m.InstanceID] = m.MemberID
		}
	}
	switch {
	case d.State != "Stable" || len(d.Members) != 2:
		t.Fatalf("after the restart: %s with %d members", d.State, len(d.Members))
	case after["static-b"] != before["static-b"]:
		t.Errorf("b's member id changed: %s -> %s (a rebalance happened)", before["static-b"], after["static-b"])
	case after["static-a"] == before["static-a"] || after["static-a"] == "":
		t.Errorf("a's member id %q after the restart, want a new one (was %q)", after["static-a"], before["static-a"])
	}
	if n := bRevoked.Load(); n != revokedBefore {
		t.Errorf("b had partitions revoked %d times during a's static restart: a rebalance happened", n-revokedBefore)
	}
	mu.Lock()
	defer mu.Unlock()
	for p, offs := range seen {
		for o, n := range offs {
			if n != 1 {
				t.Errorf("p%d offset %d read %d times", p, o, n)
			}
		}
	}
}

// memberIDsOf waits for n members and returns their ids.
func memberIDsOf(t testing.TB, ctx context.Context, f *groupFixture, n int) []string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		d := f.describe(t, ctx)
		if d.State == "Stable" && len(d.Members) == n {
			return memberIDs(d)
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s: %s with %d members, want Stable with %d", f.group, d.State, len(d.Members), n)
		}
	}
}
