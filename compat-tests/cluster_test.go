package compattests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ackLog records every acknowledged record: partition, offset, value.
type ackLog struct {
	mu    sync.Mutex
	acks  map[int32]map[int64]string
	fails atomic.Int64
	// lastAck per partition (for failover time).
	last map[int32]time.Time
}

func newAckLog() *ackLog {
	return &ackLog{acks: map[int32]map[int64]string{}, last: map[int32]time.Time{}}
}

func (a *ackLog) add(r *kgo.Record) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.acks[r.Partition]
	if m == nil {
		m = map[int64]string{}
		a.acks[r.Partition] = m
	}
	if v, ok := m[r.Offset]; ok && v != string(r.Value) {
		return fmt.Errorf("partition %d offset %d acknowledged twice: %q and %q", r.Partition, r.Offset, v, r.Value)
	}
	m[r.Offset] = string(r.Value)
	a.last[r.Partition] = time.Now()
	return nil
}

func (a *ackLog) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, m := range a.acks {
		n += len(m)
	}
	return n
}

// firstAckAfter is, for partition p, the time of the first ack recorded at
// or after t0 by the callback (the producers record times in order).
type ackTimes struct {
	mu    sync.Mutex
	times map[int32][]time.Time
}

func (at *ackTimes) add(p int32, t time.Time) {
	at.mu.Lock()
	at.times[p] = append(at.times[p], t)
	at.mu.Unlock()
}

func (at *ackTimes) firstAfter(p int32, t0 time.Time) (time.Time, bool) {
	at.mu.Lock()
	defer at.mu.Unlock()
	for _, t := range at.times[p] {
		if !t.Before(t0) {
			return t, true
		}
	}
	return time.Time{}, false
}

// runProducers produces until stop is closed: idempotent, acks=all, every
// value unique, round-robin over partitions; every ack is recorded.
func runProducers(t *testing.T, seeds []string, topic string, partitions int32, n int, acks *ackLog, times *ackTimes, stop <-chan struct{}) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.ProduceRequestTimeout(2*time.Second), kgo.RequestTimeoutOverhead(time.Second), kgo.RecordDeliveryTimeout(60*time.Second),
			kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
			kgo.MetadataMinAge(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cl.Close()
			var inner sync.WaitGroup
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					inner.Wait()
					return
				default:
				}
				r := &kgo.Record{Partition: int32(seq) % partitions, Value: fmt.Appendf(nil, "p%d-%d", i, seq)}
				inner.Add(1)
				cl.Produce(context.Background(), r, func(r *kgo.Record, err error) {
					defer inner.Done()
					if err != nil {
						acks.fails.Add(1)
						return
					}
					times.add(r.Partition, time.Now())
					if err := acks.add(r); err != nil {
						t.Error(err)
					}
				})
				time.Sleep(300 * time.Microsecond)
			}
		}()
	}
	return &wg
}

// scrapeMetrics reads b's /metrics: the value of each unlabelled series.
func scrapeMetrics(t *testing.T, b *synapseBroker) map[string]float64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", b.httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		var name string
		var v float64
		if n, _ := fmt.Sscanf(line, "%s %g", &name, &v); n == 2 && !strings.HasPrefix(name, "#") {
			out[name] = v
		}
	}
	return out
}

// verifyAcked reads every partition from the start to its high watermark
// and checks each acknowledged record at its offset, each value once, and
// leader epochs that never go down along the log.
func verifyAcked(t *testing.T, seeds []string, topic string, partitions int32, acks *ackLog) {
	t.Helper()
	verifyRead(t, seeds, topic, partitions, acks, func(v, where string) { t.Errorf("value %q at %s (a duplicate)", v, where) })
}

// verifyRead is verifyAcked with dup called for a value read at a second
// offset.
func verifyRead(t *testing.T, seeds []string, topic string, partitions int32, acks *ackLog, dup func(v, where string)) {
	t.Helper()
	acl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer acl.Close()
	adm := kadm.NewClient(acl)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	want := map[int32]int64{}
	offsets := map[string]map[int32]kgo.Offset{topic: {}}
	// A leader may be moving (the controller restores preferred leaders):
	// retriable errors are asked again, as a client would.
	for p := int32(0); p < partitions; p++ {
		for {
			ends, err := adm.ListEndOffsets(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			o, ok := ends.Lookup(topic, p)
			if ok && o.Err == nil {
				want[p] = o.Offset
				break
			}
			if !ok || !kerr.IsRetriable(o.Err) || ctx.Err() != nil {
				t.Fatalf("end offset of %d: %v", p, o.Err)
			}
			t.Logf("end offset of %d: %v (asking again)", p, o.Err)
			time.Sleep(200 * time.Millisecond)
		}
		offsets[topic][p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumePartitions(offsets), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[int32]map[int64]string{}
	seen := map[string]string{}
	lastEpoch := map[int32]int32{}
	next := map[int32]int64{}
	done := func() bool {
		for p, end := range want {
			if next[p] < end {
				return false
			}
		}
		return true
	}
	for !done() {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading back: %v (at %v, want %v)", ctx.Err(), next, want)
		}
		fs.EachError(func(_ string, p int32, err error) { t.Logf("fetch partition %d: %v", p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			m := got[r.Partition]
			if m == nil {
				m = map[int64]string{}
				got[r.Partition] = m
			}
			if v, ok := m[r.Offset]; ok && v != string(r.Value) {
				t.Errorf("partition %d offset %d read as %q and %q", r.Partition, r.Offset, v, r.Value)
			}
			m[r.Offset] = string(r.Value)
			where := fmt.Sprintf("%d@%d", r.Partition, r.Offset)
			if w, ok := seen[string(r.Value)]; ok && w != where {
				dup(string(r.Value), w+" and "+where)
			}
			seen[string(r.Value)] = where
			if r.LeaderEpoch < lastEpoch[r.Partition] {
				t.Errorf("partition %d offset %d: leader epoch %d after %d", r.Partition, r.Offset, r.LeaderEpoch, lastEpoch[r.Partition])
			}
			lastEpoch[r.Partition] = r.LeaderEpoch
			next[r.Partition] = r.Offset + 1
		})
	}
	acks.mu.Lock()
	defer acks.mu.Unlock()
	lost := 0
	for p, m := range acks.acks {
		for off, v := range m {
			if got[p][off] != v {
				if lost < 10 {
					t.Errorf("acknowledged %q at %d@%d, read %q", v, p, off, got[p][off])
				}
				lost++
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d acknowledged records not read back at their offsets", lost)
	}
}

// TestClusterKillLeaderUnderLoad: three brokers, a topic of RF 3; two
// idempotent acks=all producers run while the leader of partition 0 is
// killed with SIGKILL and, later, restarted. Every acknowledged record is
// read back at its offset exactly once; the failover time (kill to the
// first ack on each partition the dead broker led) is logged.
func TestClusterKillLeaderUnderLoad(t *testing.T) {
	c := startSynCluster(t, 3)
	const topic, partitions = "load", int32(6)
	adm := c.admin(t)
	c.createTopic(t, adm, topic, partitions)
	acks, times := newAckLog(), &ackTimes{times: map[int32][]time.Time{}}
	stop := make(chan struct{})
	wg := runProducers(t, c.seeds(), topic, partitions, 2, acks, times, stop)
	time.Sleep(3 * time.Second)
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	victim := st[0].leader
	led := ledBy(st, victim)
	before := acks.count()
	killed := time.Now()
	c.brokers[victim].Kill9(t)
	t.Logf("killed broker %d (leader of partitions %v) after %d acks", victim, led, before)
	time.Sleep(8 * time.Second)
	var worst time.Duration
	for _, p := range led {
		at, ok := times.firstAfter(p, killed)
		if !ok {
			t.Errorf("partition %d: no acknowledged produce in 8 s after its leader's kill", p)
			continue
		}
		d := at.Sub(killed)
		worst = max(worst, d)
		t.Logf("partition %d: failover %s (kill to first ack)", p, d.Round(time.Millisecond))
	}
	t.Logf("failover: worst %s over %d partitions", worst.Round(time.Millisecond), len(led))
	// /metrics of the survivors: two live brokers, and the partitions
	// they lead short of the dead one's replica.
	under := 0.0
	for id, b := range c.brokers {
		if int32(id) == victim {
			continue
		}
		m := scrapeMetrics(t, b)
		if m["synapse_cluster_live_brokers"] != 2 {
			t.Errorf("broker %d: synapse_cluster_live_brokers %v, want 2", id, m["synapse_cluster_live_brokers"])
		}
		under += m["synapse_cluster_under_replicated_partitions"]
	}
	if under < float64(partitions) {
		t.Errorf("under-replicated partitions %v after a broker's death, want %d (every partition has a replica there)", under, partitions)
	}
	c.brokers[victim].Start(t)
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	c.waitISR(t, topic, 3, 30*time.Second)
	t.Logf("%d records acknowledged, %d failed", acks.count(), acks.fails.Load())
	if acks.count() <= before {
		t.Fatalf("no record acknowledged after the kill")
	}
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}

// signal sends sig to b's process (the one this test started).
func (b *synapseBroker) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	b.mu.Lock()
	cmd := b.cmd
	b.mu.Unlock()
	if cmd == nil {
		t.Fatalf("signal %v: broker not running", sig)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to pid %d: %v", sig, cmd.Process.Pid, err)
	}
}

// clusterLoad starts a 3-broker cluster with a 6-partition RF 3 topic and
// two producers; stop ends them.
func clusterLoad(t *testing.T) (c *synCluster, topic string, partitions int32, acks *ackLog, times *ackTimes, stop func()) {
	return clusterLoadOn(t, startSynCluster(t, 3))
}

// clusterLoadOn is clusterLoad on a cluster started by the caller.
func clusterLoadOn(t *testing.T, cl *synCluster) (c *synCluster, topic string, partitions int32, acks *ackLog, times *ackTimes, stop func()) {
	c = cl
	topic, partitions = "load", 6
	adm := c.admin(t)
	c.createTopic(t, adm, topic, partitions)
	acks, times = newAckLog(), &ackTimes{times: map[int32][]time.Time{}}
	ch := make(chan struct{})
	wg := runProducers(t, c.seeds(), topic, partitions, 2, acks, times, ch)
	var once sync.Once
	stop = func() { once.Do(func() { close(ch); wg.Wait() }) }
	t.Cleanup(stop)
	return
}

// maxGap is the longest time between two acks of any partition in
// [from, to).
func (at *ackTimes) maxGap(from, to time.Time) (time.Duration, int32) {
	at.mu.Lock()
	defer at.mu.Unlock()
	var worst time.Duration
	wp := int32(-1)
	for p, ts := range at.times {
		prev := from
		for _, t := range ts {
			if t.Before(from) || !t.Before(to) {
				continue
			}
			if d := t.Sub(prev); d > worst {
				worst, wp = d, p
			}
			prev = t
		}
	}
	return worst, wp
}

// TestClusterZombieLeader pauses the leader of partition 0 (SIGSTOP) for
// more than twice the session TTL while producers run, then lets it run
// again: the cluster moved on (a new leader at a higher epoch), so nothing
// the paused broker does on waking may be acknowledged and lost, and it
// joins again with a new session and catches up.
func TestClusterZombieLeader(t *testing.T) {
	c, topic, partitions, acks, _, stop := clusterLoad(t)
	adm := c.admin(t)
	time.Sleep(2 * time.Second)
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	victim := st[0].leader
	c.brokers[victim].signal(t, syscall.SIGSTOP)
	resumed := false
	defer func() {
		if !resumed { // a failure below must not leave it stopped
			c.brokers[victim].signal(t, syscall.SIGCONT)
		}
	}()
	paused := acks.count()
	time.Sleep(7 * time.Second)
	// Asked of a broker that runs (a client could pick the stopped one).
	st2, err := c.statesFrom(t, c.brokers[(victim+1)%3].Addr(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if st2[0].leader == victim || st2[0].epoch <= st[0].epoch {
		t.Errorf("partition 0 after its leader's pause: leader %d epoch %d (was %d at %d)", st2[0].leader, st2[0].epoch, victim, st[0].epoch)
	}
	c.brokers[victim].signal(t, syscall.SIGCONT)
	resumed = true
	time.Sleep(4 * time.Second)
	stop()
	t.Logf("broker %d paused 7 s after %d acks; %d acks in all, %d failed", victim, paused, acks.count(), acks.fails.Load())
	c.waitISR(t, topic, 3, 30*time.Second)
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}

// TestClusterRollingRestart restarts every broker in turn (SIGTERM, then
// start) under load: leadership is handed over before each stop
// (controlled shutdown), nothing acknowledged is lost, and the longest
// pause between acks of a partition is logged.
func TestClusterRollingRestart(t *testing.T) {
	c, topic, partitions, acks, times, stop := clusterLoad(t)
	time.Sleep(2 * time.Second)
	for id, b := range c.brokers {
		from := time.Now()
		b.Restart(t)
		c.waitISR(t, topic, 3, 30*time.Second)
		gap, p := times.maxGap(from, time.Now())
		t.Logf("restart of broker %d: longest gap between acks %s (partition %d)", id, gap.Round(time.Millisecond), p)
	}
	time.Sleep(time.Second)
	stop()
	t.Logf("%d acks, %d failed", acks.count(), acks.fails.Load())
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}

// verifyAckedAtLeastOnce is verifyAcked for producers without
// idempotence: a value may be read twice (a retry after a lost answer),
// but every acknowledged one is at its offset.
func verifyAckedAtLeastOnce(t *testing.T, seeds []string, topic string, partitions int32, acks *ackLog) {
	t.Helper()
	dups := 0
	verifyRead(t, seeds, topic, partitions, acks, func(string, string) { dups++ })
	if dups > 0 {
		t.Logf("%d values read twice (retries of a producer without idempotence)", dups)
	}
}

// TestClusterEtcdLost stops etcd (SIGSTOP, as a lost quorum looks to its
// clients) for longer than the session TTL under load, then lets it run
// again. Brokers whose sessions end stop leading, so acks=all produce
// stalls rather than acknowledging what no quorum agreed; once etcd is
// back they register again, leadership resumes, and every acknowledged
// record is read back.
func TestClusterEtcdLost(t *testing.T) {
	c, topic, partitions, acks, times, stop := clusterLoad(t)
	time.Sleep(2 * time.Second)
	before := acks.count()
	if err := c.etcd.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			c.etcd.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	paused := time.Now()
	time.Sleep(8 * time.Second)
	if err := c.etcd.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	back := time.Now()
	c.waitISR(t, topic, 3, 60*time.Second)
	time.Sleep(2 * time.Second)
	stop()
	gap, p := times.maxGap(paused, time.Now())
	t.Logf("etcd stopped 8 s after %d acks; %d acks in all, %d failed; longest gap between acks %s (partition %d); ISR whole %s after etcd was back",
		before, acks.count(), acks.fails.Load(), gap.Round(time.Millisecond), p, time.Since(back).Round(time.Millisecond))
	if acks.count() <= before {
		t.Fatal("nothing acknowledged after etcd came back")
	}
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}

// TestClusterFiveBrokers: five brokers, a topic of 10 partitions with 3
// replicas each (spread over all five), two idempotent acks=all
// producers; the leader of partition 0 is killed and restarted. Every
// broker leads something, and every acknowledged record is read back.
func TestClusterFiveBrokers(t *testing.T) {
	c := startSynCluster(t, 5)
	adm := c.admin(t)
	const topic, partitions = "five", int32(10)
	c.createTopic(t, adm, topic, partitions)
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	leaders := map[int32]int{}
	for _, s := range st {
		leaders[s.leader]++
	}
	if len(leaders) != 5 {
		t.Errorf("leaders of 10 partitions over 5 brokers: %v", leaders)
	}
	acks, times := newAckLog(), &ackTimes{times: map[int32][]time.Time{}}
	ch := make(chan struct{})
	wg := runProducers(t, c.seeds(), topic, partitions, 2, acks, times, ch)
	time.Sleep(2 * time.Second)
	victim := st[0].leader
	killed := time.Now()
	c.brokers[victim].Kill9(t)
	time.Sleep(6 * time.Second)
	if at, ok := times.firstAfter(0, killed); !ok {
		t.Errorf("partition 0: no ack in 6 s after its leader's kill")
	} else {
		t.Logf("partition 0: failover %s", at.Sub(killed).Round(time.Millisecond))
	}
	c.brokers[victim].Start(t)
	c.waitISR(t, topic, 3, 30*time.Second)
	close(ch)
	wg.Wait()
	t.Logf("%d acks, %d failed", acks.count(), acks.fails.Load())
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}
