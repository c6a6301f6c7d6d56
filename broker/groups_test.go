package broker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// pollN polls c until n records arrived or the context ends.
func pollN(ctx context.Context, t *testing.T, c *kgo.Client, n int) []*kgo.Record {
	t.Helper()
	var got []*kgo.Record
	for len(got) < n && ctx.Err() == nil {
		fs := c.PollFetches(ctx)
		fs.EachError(func(topic string, p int32, err error) {
			if ctx.Err() == nil {
				t.Errorf("poll %s-%d: %v", topic, p, err)
			}
		})
		got = append(got, fs.Records()...)
	}
	return got
}

// TestGroupCommitRestartResume: a franz-go group consumer reads and commits;
// after a broker restart the offsets are there and a new member of the
// group resumes exactly at them.
func TestGroupCommitRestartResume(t *testing.T) {
	cfg := Config{DataDir: t.TempDir(), GroupInitialRebalanceDelay: -1, AutoCreateTopics: true}
	ts := startServerConfig(t, cfg)
	addr := ts.addr
	ctx := ctxT(t)
	_, adm := client(t, addr)
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, "gt"); err != nil {
		t.Fatal(err)
	}
	pr, _ := client(t, addr, kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	produce := func(n, from int) {
		t.Helper()
		var rs []*kgo.Record
		for i := 0; i < n; i++ {
			rs = append(rs, &kgo.Record{Topic: "gt", Value: []byte(fmt.Sprint(from + i))})
		}
		if err := pr.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce(300, 0)
	consumer := func() *kgo.Client {
		c, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("gt"),
			kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(6*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := consumer()
	if got := pollN(ctx, t, c, 300); len(got) != 300 {
		t.Fatalf("consumed %d of 300", len(got))
	}
	if err := c.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	dg, err := adm.DescribeGroups(ctx, "g")
	if err != nil || dg["g"].State != "Stable" || len(dg["g"].Members) != 1 || dg["g"].Protocol != "cooperative-sticky" {
		t.Fatalf("describe: %+v %v", dg["g"], err)
	}
	c.Close()
	pr.Close()
	adm.Close()

	ts.stop(t)
	startServerAt(t, cfg, addr)
	pr, adm = client(t, addr, kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	offs, err := adm.FetchOffsets(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
	if sum != 300 {
		t.Fatalf("committed offsets after restart sum to %d, want 300: %+v", sum, offs)
	}
	c = consumer()
	defer c.Close()
	produce(30, 300)
	got := pollN(ctx, t, c, 30)
	seen := map[string]bool{}
	for _, r := range got {
		seen[string(r.Value)] = true
	}
	if len(got) != 30 || len(seen) != 30 || seen["0"] {
		t.Fatalf("after restart got %d records (%d distinct), want exactly the 30 new", len(got), len(seen))
	}
	// Nothing more arrives.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if more := c.PollFetches(short).Records(); len(more) != 0 {
		t.Fatalf("%d records re-delivered", len(more))
	}
}

// TestGroupTwoMembersSplitPartitions: two members of an eager range group
// share the partitions; every record is read once.
func TestGroupTwoMembersSplitPartitions(t *testing.T) {
	ts := startServerConfig(t, Config{GroupInitialRebalanceDelay: 200 * time.Millisecond})
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctx, 4, 1, nil, "two"); err != nil {
		t.Fatal(err)
	}
	pr, _ := client(t, ts.addr, kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	var rs []*kgo.Record
	for i := 0; i < 400; i++ {
		rs = append(rs, &kgo.Record{Topic: "two", Value: []byte(fmt.Sprint(i))})
	}
	if err := pr.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	parts := map[int32]string{}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for _, name := range []string{"a", "b"} {
		c, err := kgo.NewClient(kgo.SeedBrokers(ts.addr), kgo.ConsumerGroup("pair"), kgo.ConsumeTopics("two"),
			kgo.Balancers(kgo.RangeBalancer()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.ClientID(name))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				fs := c.PollFetches(pctx)
				cancel()
				mu.Lock()
				for _, r := range fs.Records() {
					seen[string(r.Value)]++
					if owner, ok := parts[r.Partition]; ok && owner != name {
						t.Errorf("partition %d read by %s and %s", r.Partition, owner, name)
					}
					parts[r.Partition] = name
				}
				mu.Unlock()
			}
		}()
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n, owners := len(seen), map[string]bool{}
		for _, o := range parts {
			owners[o] = true
		}
		mu.Unlock()
		if n == 400 && len(owners) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("read %d distinct of 400, owners %v", n, owners)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(done)
	wg.Wait()
	for v, n := range seen {
		if n != 1 {
			t.Fatalf("record %s read %d times", v, n)
		}
	}
	gs, err := adm.DescribeGroups(ctx, "pair")
	if err != nil || gs["pair"].State != "Stable" || len(gs["pair"].Members) != 2 || gs["pair"].Protocol != "range" {
		t.Fatalf("describe: %+v %v", gs["pair"], err)
	}
}

// TestFindCoordinator answers this broker for group and transaction keys,
// batched and not, and refuses other key types.
func TestFindCoordinator(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	for _, v := range []int16{0, 3, 4, 6} {
		// kgo sends the highest version both sides support: pin it.
		vs := kversion.Stable()
		vs.SetMaxKeyVersion(10, v)
		c, _ := client(t, ts.addr, kgo.MaxVersions(vs))
		for _, kt := range []int8{0, 1, 2} {
			req := kmsg.NewPtrFindCoordinatorRequest()
			req.Version, req.CoordinatorKey, req.CoordinatorKeys, req.CoordinatorType = v, "k", []string{"k1", "k2"}, kt
			if v == 0 && kt != 0 {
				continue
			}
			resp, err := req.RequestWith(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			type ans struct {
				code int16
				port int32
			}
			var got []ans
			if v < 4 {
				got = append(got, ans{resp.ErrorCode, resp.Port})
			} else {
				for _, co := range resp.Coordinators {
					got = append(got, ans{co.ErrorCode, co.Port})
				}
				if len(got) != 2 {
					t.Fatalf("v%d: %d answers for 2 keys", v, len(got))
				}
			}
			_, port, _ := hostPort(ts.addr)
			for _, a := range got {
				if kt == 2 && a.code == 0 || kt != 2 && (a.code != 0 || a.port != port) {
					t.Fatalf("v%d type %d: %+v (broker port %d)", v, kt, a, port)
				}
			}
		}
	}
}
