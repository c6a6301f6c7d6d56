package coord

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// One etcd serves every test; each test uses its own cluster prefix.
var testEndpoint string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "coord-etcd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "tempdir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ports, err := freePorts(2)
	if err != nil {
		fmt.Fprintln(os.Stderr, "free ports:", err)
		return 1
	}
	e, err := StartEmbedded(dir,
		fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		zap.NewNop())
	if err != nil {
		fmt.Fprintln(os.Stderr, "start etcd:", err)
		return 1
	}
	defer e.Close()
	testEndpoint = e.Endpoint()
	return m.Run()
}

// freePorts finds loopback ports by binding them all before releasing any,
// so the same port is not returned twice.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

var clusterSeq atomic.Int64

func newCluster(t *testing.T) string {
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), clusterSeq.Add(1))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, cluster string) *Client {
	t.Helper()
	c, err := Dial(ctxT(t), Config{Endpoints: []string{testEndpoint}, Cluster: cluster, TTL: 2 * time.Second})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func rawClient(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testEndpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("raw client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// startWatch runs c.Watch until the test ends and feeds its Views to a channel.
func startWatch(t *testing.T, c *Client) <-chan *View {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan *View, 256)
	done := make(chan error, 1)
	go func() {
		done <- c.Watch(ctx, func(v *View) {
			select {
			case ch <- v:
			case <-ctx.Done():
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	})
	return ch
}

func waitView(t *testing.T, ch <-chan *View, what string, pred func(*View) bool) *View {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case v := <-ch:
			if pred(v) {
				return v
			}
		case <-timeout:
			t.Fatalf("timed out waiting for view: %s", what)
		}
	}
}

func TestClusterID(t *testing.T) {
	cl := newCluster(t)
	a, b := dial(t, cl), dial(t, cl)
	if a.ClusterID() != b.ClusterID() {
		t.Fatalf("cluster ids differ: %q vs %q", a.ClusterID(), b.ClusterID())
	}
	if len(a.ClusterID()) != 22 {
		t.Fatalf("cluster id %q: want 22 chars", a.ClusterID())
	}
	if other := dial(t, newCluster(t)); other.ClusterID() == a.ClusterID() {
		t.Fatalf("two clusters share id %q", a.ClusterID())
	}
}

func TestRegister(t *testing.T) {
	ctx := ctxT(t)
	cl := newCluster(t)
	a, b := dial(t, cl), dial(t, cl)
	info := BrokerInfo{ID: 1, Host: "h1", Port: 9092}
	if err := a.Register(ctx, info); err != nil {
		t.Fatalf("a.Register: %v", err)
	}
	info.Port = 9093 // re-registering our own id overwrites
	if err := a.Register(ctx, info); err != nil {
		t.Fatalf("a.Register again: %v", err)
	}
	if err := b.Register(ctx, BrokerInfo{ID: 1, Host: "h2", Port: 9092}); !errors.Is(err, ErrNodeIDInUse) {
		t.Fatalf("b.Register: got %v, want ErrNodeIDInUse", err)
	}
	v, err := b.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Brokers[1]; got.Host != "h1" || got.Port != 9093 || got.Incarnation != a.LeaseID() {
		t.Fatalf("broker 1 = %+v, want h1:9093 incarnation %d", got, a.LeaseID())
	}

	if err := a.Close(); err != nil {
		t.Fatalf("a.Close: %v", err)
	}
	resp, err := rawClient(t).Get(ctx, PrefixFor(cl)+"brokers/1")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatalf("brokers/1 still present after Close: %s", resp.Kvs[0].Value)
	}
	if err := b.Register(ctx, BrokerInfo{ID: 1, Host: "h2", Port: 9092}); err != nil {
		t.Fatalf("b.Register after a.Close: %v", err)
	}
	if v, err = b.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if got := v.Brokers[1]; got.Host != "h2" || got.Incarnation != b.LeaseID() {
		t.Fatalf("broker 1 = %+v, want h2 incarnation %d", got, b.LeaseID())
	}
}

func TestWatch(t *testing.T) {
	ctx := ctxT(t)
	cl := newCluster(t)
	c, c2 := dial(t, cl), dial(t, cl)
	views := startWatch(t, c)

	v0 := waitView(t, views, "initial", func(v *View) bool { return true })
	if v0.ClusterID != c.ClusterID() || v0.Controller != -1 || len(v0.Brokers) != 0 {
		t.Fatalf("initial view = %+v", v0)
	}

	if err := c.Register(ctx, BrokerInfo{ID: 1, Host: "a", Port: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c2.Register(ctx, BrokerInfo{ID: 2, Host: "b", Port: 2}); err != nil {
		t.Fatal(err)
	}
	vBrokers := waitView(t, views, "two brokers", func(v *View) bool { return len(v.Brokers) == 2 })

	ti := TopicInfo{Name: "t", ID: "00112233445566778899aabbccddeeff", Partitions: 2, RF: 1}
	if err := c.CreateTopic(ctx, ti); err != nil {
		t.Fatal(err)
	}
	st := PartState{Leader: 1, Epoch: 0, Replicas: []int32{1}, ISR: []int32{1}}
	rev, err := c.SetPart(ctx, PartKey{"t", 0}, st, 0)
	if err != nil {
		t.Fatal(err)
	}
	vPart := waitView(t, views, "topic and partition", func(v *View) bool {
		_, ok := v.Parts[PartKey{"t", 0}]
		return ok && len(v.Topics) == 1
	})
	if p := vPart.Parts[PartKey{"t", 0}]; p.ModRev != rev || p.State.Leader != 1 {
		t.Fatalf("partition = %+v, want leader 1 modrev %d", p, rev)
	}
	if vPart.Rev < rev {
		t.Fatalf("view rev %d < write rev %d", vPart.Rev, rev)
	}
	if tp := vPart.Topics["t"]; tp.Info.ID != ti.ID || tp.ModRev == 0 {
		t.Fatalf("topic = %+v", tp)
	}

	l, err := c.Campaign(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	waitView(t, views, "controller 1", func(v *View) bool { return v.Controller == 1 })

	// Broker 2 leaves; the topic is deleted with its partitions.
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTopic(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if err := l.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	vEnd := waitView(t, views, "broker 2 gone, topic gone, no controller", func(v *View) bool {
		return len(v.Brokers) == 1 && len(v.Topics) == 0 && len(v.Parts) == 0 && v.Controller == -1
	})
	if vEnd.Rev <= vPart.Rev {
		t.Fatalf("rev did not advance: %d <= %d", vEnd.Rev, vPart.Rev)
	}

	// Copy-on-write: earlier views are untouched.
	if len(v0.Brokers) != 0 || len(v0.Topics) != 0 || len(v0.Parts) != 0 {
		t.Fatalf("initial view mutated: %+v", v0)
	}
	if len(vBrokers.Brokers) != 2 || len(vBrokers.Topics) != 0 {
		t.Fatalf("brokers view mutated: %+v", vBrokers)
	}
	if len(vPart.Brokers) != 2 || len(vPart.Topics) != 1 || len(vPart.Parts) != 1 || vPart.Controller != -1 {
		t.Fatalf("partition view mutated: %+v", vPart)
	}
}

// A watch from a compacted revision must fail so Watch reloads.
func TestWatchCompacted(t *testing.T) {
	ctx := ctxT(t)
	c := dial(t, newCluster(t))
	if err := c.CreateTopic(ctx, TopicInfo{Name: "x", Partitions: 1, RF: 1}); err != nil {
		t.Fatal(err)
	}
	st, err := c.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rawClient(t).Compact(ctx, st.view.Rev); err != nil {
		t.Fatal(err)
	}
	st.view.Rev = 1
	err = c.follow(ctx, st, func(*View) {})
	if !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("follow from compacted rev: got %v, want ErrCompacted", err)
	}
}

func TestTopics(t *testing.T) {
	ctx := ctxT(t)
	c := dial(t, newCluster(t))
	ti := TopicInfo{Name: "a", ID: "aa", Partitions: 2, RF: 1, Configs: map[string]string{"retention.ms": "1000"}}
	if err := c.CreateTopic(ctx, ti); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTopic(ctx, ti); !errors.Is(err, ErrExists) {
		t.Fatalf("second CreateTopic: got %v, want ErrExists", err)
	}
	if err := c.CreateTopic(ctx, TopicInfo{Name: "ab", Partitions: 1, RF: 1}); err != nil {
		t.Fatal(err)
	}
	for p := range int32(2) {
		if _, err := c.SetPart(ctx, PartKey{"a", p}, PartState{Leader: -1}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SetPart(ctx, PartKey{"ab", 0}, PartState{Leader: -1}, 0); err != nil {
		t.Fatal(err)
	}

	v, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old := v.Topics["a"]
	if old.Info.Configs["retention.ms"] != "1000" {
		t.Fatalf("topic a = %+v", old)
	}
	upd := old.Info
	upd.Partitions = 3
	if err := c.UpdateTopic(ctx, upd, old.ModRev); err != nil {
		t.Fatalf("UpdateTopic: %v", err)
	}
	if err := c.UpdateTopic(ctx, upd, old.ModRev); !errors.Is(err, ErrConflict) {
		t.Fatalf("UpdateTopic with stale rev: got %v, want ErrConflict", err)
	}

	if err := c.DeleteTopic(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTopic(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second DeleteTopic: got %v, want ErrNotFound", err)
	}
	if v, err = c.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := v.Topics["a"]; ok {
		t.Fatal("topic a survived delete")
	}
	if p, ok := v.Parts[PartKey{"ab", 0}]; len(v.Parts) != 1 || !ok || p.ModRev == 0 {
		t.Fatalf("parts after deleting a = %+v, want only ab-0", v.Parts)
	}
	if err := c.CreateTopic(ctx, TopicInfo{Name: "bad/name"}); err == nil {
		t.Fatal("topic name with '/' accepted")
	}
}

func TestSetPartCAS(t *testing.T) {
	ctx := ctxT(t)
	c := dial(t, newCluster(t))
	k := PartKey{"t", 3}
	st := PartState{Leader: 1, Epoch: 1, Replicas: []int32{1, 2}, ISR: []int32{1, 2}}
	r1, err := c.SetPart(ctx, k, st, 0)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := c.SetPart(ctx, k, st, 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("create again: got %v, want ErrConflict", err)
	}
	st.Epoch = 2
	r2, err := c.SetPart(ctx, k, st, r1)
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if r2 <= r1 {
		t.Fatalf("new mod rev %d <= %d", r2, r1)
	}
	if _, err := c.SetPart(ctx, k, st, r1); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale update: got %v, want ErrConflict", err)
	}
	v, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := v.Parts[k]; p.ModRev != r2 || p.State.Epoch != 2 || !slices.Equal(p.State.ISR, []int32{1, 2}) {
		t.Fatalf("partition = %+v, want epoch 2 modrev %d", p, r2)
	}
}

func TestSetParts(t *testing.T) {
	ctx := ctxT(t)
	c := dial(t, newCluster(t))
	l, err := c.Campaign(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	const n = 150 // more than one transaction's worth
	ups := make([]PartUpdate, n)
	for i := range ups {
		ups[i] = PartUpdate{Key: PartKey{"big", int32(i)}, State: PartState{Leader: 7, Epoch: 1}}
	}
	if err := c.SetParts(ctx, ups, l.Fence()); err != nil {
		t.Fatalf("SetParts create: %v", err)
	}
	v, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Parts) != n || v.Controller != 7 {
		t.Fatalf("got %d parts, controller %d; want %d, 7", len(v.Parts), v.Controller, n)
	}
	for i := range ups {
		ups[i].ModRev = v.Parts[ups[i].Key].ModRev
		ups[i].State.Epoch = 2
	}
	if err := c.SetParts(ctx, ups, l.Fence()); err != nil {
		t.Fatalf("SetParts update: %v", err)
	}
	// The same revisions are stale now.
	if err := c.SetParts(ctx, ups[:3], l.Fence()); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale SetParts: got %v, want ErrConflict", err)
	}
	if err := c.SetParts(ctx, []PartUpdate{ups[0], ups[0]}); err == nil {
		t.Fatal("duplicate keys accepted")
	}
}

func TestCampaign(t *testing.T) {
	ctx := ctxT(t)
	cl := newCluster(t)
	a, b := dial(t, cl), dial(t, cl)

	la, err := a.Campaign(ctx, 1)
	if err != nil {
		t.Fatalf("a.Campaign: %v", err)
	}
	type result struct {
		l   *Leadership
		err error
	}
	bres := make(chan result, 1)
	go func() {
		l, err := b.Campaign(ctx, 2)
		bres <- result{l, err}
	}()
	select {
	case r := <-bres:
		t.Fatalf("b won while a leads: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}

	k := PartKey{"t", 0}
	rev, err := a.SetPart(ctx, k, PartState{Leader: 1, Epoch: 1}, 0, la.Fence())
	if err != nil {
		t.Fatalf("fenced write by a: %v", err)
	}
	if v, err := a.Snapshot(ctx); err != nil || v.Controller != 1 {
		t.Fatalf("controller = %v (err %v), want 1", v, err)
	}

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-bres:
	case <-time.After(10 * time.Second):
		t.Fatal("b did not win after a closed")
	}
	if r.err != nil {
		t.Fatalf("b.Campaign: %v", r.err)
	}
	lb := r.l
	if lb.Rev() <= la.Rev() {
		t.Fatalf("b's rev %d <= a's %d", lb.Rev(), la.Rev())
	}

	// a is deposed: its fence must stop the write even with the right CAS token.
	if _, err := b.SetPart(ctx, k, PartState{Leader: 1, Epoch: 2}, rev, la.Fence()); !errors.Is(err, ErrConflict) {
		t.Fatalf("write with a's old fence: got %v, want ErrConflict", err)
	}
	if _, err := b.SetPart(ctx, k, PartState{Leader: 2, Epoch: 2}, rev, lb.Fence()); err != nil {
		t.Fatalf("write with b's fence: %v", err)
	}
	if v, err := b.Snapshot(ctx); err != nil || v.Controller != 2 {
		t.Fatalf("controller = %v (err %v), want 2", v, err)
	}
	if err := lb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.SetPart(ctx, k, PartState{Leader: 2, Epoch: 3}, 0, lb.Fence()); !errors.Is(err, ErrConflict) {
		t.Fatalf("write after resign: got %v, want ErrConflict", err)
	}
}

func TestAllocProducerIDs(t *testing.T) {
	ctx := ctxT(t)
	cl := newCluster(t)
	const (
		workers = 4
		perW    = 50
		size    = 10
	)
	var (
		mu     sync.Mutex
		firsts []int64
		wg     sync.WaitGroup
		errs   = make(chan error, workers)
	)
	for range workers {
		c := dial(t, cl) // separate clients, like separate brokers
		wg.Go(func() {
			for range perW {
				f, err := c.AllocProducerIDs(ctx, size)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				firsts = append(firsts, f)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	slices.Sort(firsts)
	if len(firsts) != workers*perW {
		t.Fatalf("got %d ranges, want %d", len(firsts), workers*perW)
	}
	for i, f := range firsts {
		if want := int64(firstProducerID + i*size); f != want {
			t.Fatalf("range %d starts at %d, want %d (overlap or gap)", i, f, want)
		}
	}
	if _, err := dial(t, cl).AllocProducerIDs(ctx, 0); err == nil {
		t.Fatal("n=0 accepted")
	}
}

func TestSessionLoss(t *testing.T) {
	ctx := ctxT(t)
	c := dial(t, newCluster(t))
	if err := c.Register(ctx, BrokerInfo{ID: 5, Host: "h", Port: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := rawClient(t).Revoke(ctx, clientv3.LeaseID(c.LeaseID())); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the lease was revoked")
	}
	if err := c.Register(ctx, BrokerInfo{ID: 5, Host: "h", Port: 1}); !errors.Is(err, ErrSessionLost) {
		t.Fatalf("Register after loss: got %v, want ErrSessionLost", err)
	}
	if _, err := c.Campaign(ctx, 5); !errors.Is(err, ErrSessionLost) {
		t.Fatalf("Campaign after loss: got %v, want ErrSessionLost", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close after loss: %v", err)
	}
}

func TestStartEmbeddedRejectsPortZero(t *testing.T) {
	if _, err := StartEmbedded(t.TempDir(), "http://127.0.0.1:0", "http://127.0.0.1:2380", nil); err == nil {
		t.Fatal("port 0 accepted")
	}
}

// A candidate whose session dies while it waits must not come out as leader,
// even when the leader before it goes away at the same time.
func TestCampaignSessionLost(t *testing.T) {
	ctx := ctxT(t)
	cl := newCluster(t)
	a, b := dial(t, cl), dial(t, cl)
	if _, err := a.Campaign(ctx, 1); err != nil {
		t.Fatal(err)
	}
	bres := make(chan error, 1)
	go func() {
		_, err := b.Campaign(ctx, 2)
		bres <- err
	}()
	time.Sleep(200 * time.Millisecond) // let b enqueue its candidacy
	raw := rawClient(t)
	if _, err := raw.Revoke(ctx, clientv3.LeaseID(b.LeaseID())); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-bres:
		if !errors.Is(err, ErrSessionLost) {
			t.Fatalf("b.Campaign: got %v, want ErrSessionLost", err)
		}
		t.Logf("b.Campaign: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("b.Campaign did not return after its session was lost")
	}
	v, err := dial(t, cl).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.Controller != -1 {
		t.Fatalf("controller = %d, want none", v.Controller)
	}
}

// TestCommitManifest: a manifest pointer is written only by a leader whose
// partition state is unchanged since it read it, and only over the pointer
// it last saw; the watch carries it; a topic's delete removes it.
func TestCommitManifest(t *testing.T) {
	ctx := ctxT(t)
	c := dial(t, newCluster(t))
	if err := c.CreateTopic(ctx, TopicInfo{Name: "t", ID: "00", Partitions: 1, RF: 1}); err != nil {
		t.Fatal(err)
	}
	k := PartKey{"t", 0}
	r1, err := c.SetPart(ctx, k, PartState{Leader: 1, Epoch: 4, Replicas: []int32{1}, ISR: []int32{1}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	m1, err := c.CommitManifest(ctx, k, "t/0/manifest-e4-1.json", 4, r1, 0)
	if err != nil {
		t.Fatalf("first commit: %v", err)
	}
	if _, err := c.CommitManifest(ctx, k, "t/0/manifest-e4-2.json", 4, r1, 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("commit over a pointer not seen: got %v, want ErrConflict", err)
	}
	m2, err := c.CommitManifest(ctx, k, "t/0/manifest-e4-2.json", 4, r1, m1)
	if err != nil {
		t.Fatalf("second commit: %v", err)
	}
	// A new epoch (the controller moved the leader): the old leader's
	// commit is refused, whatever pointer it names.
	if _, err := c.SetPart(ctx, k, PartState{Leader: 2, Epoch: 5, Replicas: []int32{1, 2}, ISR: []int32{2}}, r1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CommitManifest(ctx, k, "t/0/manifest-e4-3.json", 4, r1, m2); !errors.Is(err, ErrConflict) {
		t.Fatalf("deposed leader's commit: got %v, want ErrConflict", err)
	}
	v, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := v.Tier[k]; p.Manifest != "t/0/manifest-e4-2.json" || p.Epoch != 4 || p.ModRev != m2 {
		t.Fatalf("pointer = %+v, want manifest-e4-2 at epoch 4, modrev %d", p, m2)
	}
	if err := c.DeleteTopic(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if v, err = c.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if len(v.Tier) != 0 {
		t.Fatalf("pointers after the topic's delete: %+v", v.Tier)
	}
}

// TestRestoreTopic: a restore writes partition states and pointers, then
// the topic, never over an existing topic; restore_checked and the
// producer-id floor.
func TestRestoreTopic(t *testing.T) {
	ctx := ctxT(t)
	c := dial(t, newCluster(t))
	l, err := c.Campaign(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.RestoreChecked(ctx); err != nil || ok {
		t.Fatalf("a new keyspace checked: %v, %v", ok, err)
	}
	info := TopicInfo{Name: "r", ID: "0123456789abcdef0123456789abcdef", Partitions: 2, RF: 1}
	parts := map[int32]PartState{0: {Leader: 1, Epoch: 7, Replicas: []int32{1}, ISR: []int32{1}}, 1: {Leader: 1, Epoch: 3, Replicas: []int32{1}, ISR: []int32{1}}}
	ptrs := map[int32]TierPtr{0: {Manifest: "r-x/0/manifest-e6-2.json", Epoch: 6, Next: 100, LogStart: 10}}
	if err := c.RestoreTopic(ctx, info, parts, ptrs, l.Fence()); err != nil {
		t.Fatal(err)
	}
	if err := c.RestoreTopic(ctx, info, parts, ptrs, l.Fence()); !errors.Is(err, ErrConflict) {
		t.Fatalf("a restore over an existing topic: %v, want ErrConflict", err)
	}
	v, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.Topics["r"].Info.Partitions != 2 || v.Parts[PartKey{"r", 0}].State.Epoch != 7 || v.Parts[PartKey{"r", 1}].State.Epoch != 3 {
		t.Fatalf("restored: %+v, %+v", v.Topics["r"], v.Parts)
	}
	if p := v.Tier[PartKey{"r", 0}]; p.Next != 100 || p.LogStart != 10 || p.Epoch != 6 {
		t.Fatalf("restored pointer %+v", p)
	}
	if err := c.MarkRestoreChecked(ctx, l.Fence()); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.RestoreChecked(ctx); err != nil || !ok {
		t.Fatalf("checked after the mark: %v, %v", ok, err)
	}
	if err := c.RaiseProducerIDs(ctx, 5000); err != nil {
		t.Fatal(err)
	}
	if first, err := c.AllocProducerIDs(ctx, 10); err != nil || first != 5000 {
		t.Fatalf("first id after the raise: %d, %v; want 5000", first, err)
	}
	if err := c.RaiseProducerIDs(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if n, err := c.ProducerIDNext(ctx); err != nil || n != 5010 {
		t.Fatalf("a raise below the counter moved it: %d, %v", n, err)
	}
}

// TestKeyspaceAt10kPartitions sizes the keyspace of a cluster with 10 000
// partitions of 3 replicas (100 topics of 100), each with a committed
// manifest pointer moved 3 times (3 sealed segments), in a fresh etcd.
// The bound: etcd's database under 100 MiB at 10 000 partitions.
func TestKeyspaceAt10kPartitions(t *testing.T) {
	dir := t.TempDir()
	ports, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	e, err := StartEmbedded(dir, fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1]), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := Dial(ctx, Config{Endpoints: []string{e.Endpoint()}, Cluster: "big", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Campaign(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	const topics, parts = 100, 100
	revs := map[PartKey]int64{}
	for i := range topics {
		name := fmt.Sprintf("topic-%03d", i)
		if err := c.CreateTopic(ctx, TopicInfo{Name: name, ID: fmt.Sprintf("%032x", i), Partitions: parts, RF: 3,
			Configs: map[string]string{"retention.ms": "604800000", "segment.bytes": "134217728"}}); err != nil {
			t.Fatal(err)
		}
		ups := make([]PartUpdate, parts)
		for p := range int32(parts) {
			r := []int32{p % 3, (p + 1) % 3, (p + 2) % 3}
			ups[p] = PartUpdate{Key: PartKey{name, p}, State: PartState{Leader: r[0], Epoch: 7, Replicas: r, ISR: r}}
		}
		if err := c.SetParts(ctx, ups, l.Fence()); err != nil {
			t.Fatal(err)
		}
	}
	v, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k, p := range v.Parts {
		revs[k] = p.ModRev
	}
	// Three manifest commits per partition, in parallel as leaders do.
	type job struct {
		k   PartKey
		rev int64
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				var tok int64
				for s := range 3 {
					key := fmt.Sprintf("%s-%s/%d/manifest-e7-%d-0badcafe.json", j.k.Topic, strings.Repeat("0", 32), j.k.Partition, s+1)
					var err error
					if tok, err = c.CommitManifest(ctx, j.k, key, 7, j.rev, tok); err != nil {
						failed.Add(1)
						return
					}
				}
			}
		}()
	}
	for k, r := range revs {
		jobs <- job{k, r}
	}
	close(jobs)
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d commits failed", failed.Load())
	}
	st, err := c.cli.Status(ctx, e.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("10 000 partitions, 30 000 manifest commits in %s: etcd database %.1f MiB (%.1f MiB in use), revision %d",
		time.Since(start).Round(time.Millisecond), float64(st.DbSize)/(1<<20), float64(st.DbSizeInUse)/(1<<20), st.Header.Revision)
	if st.DbSize >= 100<<20 {
		t.Errorf("etcd database %d bytes at 10 000 partitions, over 100 MiB", st.DbSize)
	}
}
