package compattests

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A cluster of real `synapse serve --cluster` processes on loopback over a
// real etcd process (ETCD_BIN: etcd's own server, which make tools builds
// from the version go.mod pins).

// etcdProc is one etcd member this test started.
type etcdProc struct {
	bin    string
	args   []string
	cmd    *exec.Cmd
	url    string
	dir    string
	log    *os.File
	exited chan struct{}
}

// startEtcd starts a one-member etcd for t (stopped when t ends).
func startEtcd(t testing.TB) *etcdProc {
	t.Helper()
	return startEtcdMembers(t, 1)[0]
}

// startEtcdMembers starts an etcd cluster of n members for t (each stopped
// when t ends, by its PID).
func startEtcdMembers(t testing.TB, n int) []*etcdProc {
	t.Helper()
	bin := os.Getenv("ETCD_BIN")
	if bin == "" {
		skipUnlessRequired(t, "ETCD_BIN is not set: make tools builds etcd into ~/.cache/synapse-tools/bin/etcd")
	}
	ports := freePorts(t, 2*n)
	var initial []string
	for i := range n {
		initial = append(initial, fmt.Sprintf("e%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	members := make([]*etcdProc, n)
	for i := range n {
		dir := t.TempDir()
		e := &etcdProc{url: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]), dir: dir, exited: make(chan struct{})}
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])
		f, err := os.Create(filepath.Join(dir, "etcd.log"))
		if err != nil {
			t.Fatal(err)
		}
		e.log = f
		e.args = []string{"--name", fmt.Sprintf("e%d", i), "--data-dir", filepath.Join(dir, "data"),
			"--listen-client-urls", e.url, "--advertise-client-urls", e.url,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--log-level", "warn",
			"--auto-compaction-mode", "periodic", "--auto-compaction-retention", "5m"}
		e.bin = bin
		e.start(t)
		t.Cleanup(func() {
			e.stop()
			if t.Failed() {
				dumpLogFile(t, filepath.Join(dir, "etcd.log"))
			}
			f.Close()
		})
		members[i] = e
	}
	for _, e := range members {
		e.waitHealthy(t)
	}
	return members
}

// start runs the member (again, on its data directory).
func (e *etcdProc) start(t testing.TB) {
	t.Helper()
	e.exited = make(chan struct{})
	e.cmd = exec.Command(e.bin, e.args...)
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	if err := e.cmd.Start(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	cmd, exited := e.cmd, e.exited
	go func() { cmd.Wait(); close(exited) }()
}

// stop ends the member it started: SIGTERM, then SIGKILL after 10 s.
func (e *etcdProc) stop() {
	select {
	case <-e.exited:
		return
	default:
	}
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		e.cmd.Process.Kill()
		<-e.exited
	}
}

// kill9 kills the member (SIGKILL) and waits for it.
func (e *etcdProc) kill9() {
	e.cmd.Process.Kill()
	<-e.exited
}

// waitHealthy waits until the member answers /health with 200 (a member
// of a cluster only once it has a leader).
func (e *etcdProc) waitHealthy(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for {
		var resp *http.Response
		resp, err = http.Get(e.url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-e.exited:
			dumpLogFile(t, filepath.Join(e.dir, "etcd.log"))
			t.Fatal("etcd exited while starting")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd not healthy after 30 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// synCluster is N brokers of one cluster.
type synCluster struct {
	name        string
	etcd        *etcdProc // the first member
	etcdMembers []*etcdProc
	brokers     []*synapseBroker // by node id
	// With startSynClusterProxied: each broker reaches etcd through its
	// own proxy, and its peers reach it through another.
	etcdProxy, peerProxy []*faultProxy
}

// startSynCluster starts n brokers (node ids 0..n-1) over a new etcd.
func startSynCluster(t testing.TB, n int, extra ...string) *synCluster {
	t.Helper()
	return startCluster(t, n, false, nil, extra...)
}

// startSynClusterOn is startSynCluster over the etcd members given.
func startSynClusterOn(t testing.TB, members []*etcdProc, n int, extra ...string) *synCluster {
	t.Helper()
	return startCluster(t, n, false, members, extra...)
}

// startSynClusterProxied is startSynCluster with fault proxies in front of
// etcd and of each broker's peer traffic (synCluster.etcdProxy,
// peerProxy).
func startSynClusterProxied(t testing.TB, n int, extra ...string) *synCluster {
	t.Helper()
	return startCluster(t, n, true, nil, extra...)
}

func startCluster(t testing.TB, n int, proxied bool, members []*etcdProc, extra ...string) *synCluster {
	t.Helper()
	bin := os.Getenv("SYNAPSE_BIN")
	if bin == "" {
		skipUnlessRequired(t, "SYNAPSE_BIN is not set: build the broker (make build)")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	if members == nil {
		members = []*etcdProc{startEtcd(t)}
	}
	var urls []string
	for _, m := range members {
		urls = append(urls, m.url)
	}
	c := &synCluster{name: "c" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36), etcd: members[0], etcdMembers: members}
	var wg sync.WaitGroup
	// Every broker's two ports from one call, all bound at once: brokers
	// starting side by side must not draw the same freed port.
	ports := freePorts(t, 2*n)
	c.brokers = make([]*synapseBroker, n)
	c.etcdProxy, c.peerProxy = make([]*faultProxy, n), make([]*faultProxy, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.brokers[i] = startSynapseWith(t, abs, func(b *synapseBroker) {
				b.port, b.httpPort = ports[2*i], ports[2*i+1]
				etcdURL := strings.Join(urls, ",")
				var peer []string
				if proxied {
					c.etcdProxy[i] = newFaultProxy(t, strings.TrimPrefix(c.etcd.url, "http://"))
					etcdURL = "http://" + c.etcdProxy[i].Addr()
					c.peerProxy[i] = newFaultProxy(t, b.Addr())
					peer = []string{"--peer-advertised-addr", c.peerProxy[i].Addr()}
				}
				b.extraArgs = append(append([]string{"--cluster", c.name, "--etcd", etcdURL,
					"--node-id", strconv.Itoa(i), "--session-ttl", "3s", "--log-level", clusterLogLevel()}, peer...), extra...)
			})
		}()
	}
	wg.Wait()
	c.waitBrokers(t, n)
	return c
}

// addBroker starts one more broker (the next node id) with the first
// broker's cluster arguments.
func (c *synCluster) addBroker(t testing.TB) *synapseBroker {
	t.Helper()
	id := len(c.brokers)
	args := slices.Clone(c.brokers[0].extraArgs)
	for i, a := range args {
		if a == "--node-id" {
			args[i+1] = strconv.Itoa(id)
		}
	}
	bin := c.brokers[0].bin
	b := startSynapseWith(t, bin, func(b *synapseBroker) { b.extraArgs = args })
	c.brokers = append(c.brokers, b)
	c.waitBrokers(t, len(c.brokers))
	return b
}

// seeds are every broker's address.
func (c *synCluster) seeds() []string {
	out := make([]string, len(c.brokers))
	for i, b := range c.brokers {
		out[i] = b.Addr()
	}
	return out
}

// admin is a kadm client over every broker.
func (c *synCluster) admin(t testing.TB) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.seeds()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// waitBrokers waits until every broker's own Metadata lists n live
// brokers (each answers from its own view of etcd).
func (c *synCluster) waitBrokers(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, b := range c.brokers {
		if b == nil {
			continue
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := cl.SeedBrokers()[0].Request(ctx, kmsg.NewPtrMetadataRequest())
			cancel()
			if err == nil && len(resp.(*kmsg.MetadataResponse).Brokers) == n {
				break
			}
			if time.Now().After(deadline) {
				cl.Close()
				t.Fatalf("cluster: broker %s does not see %d live brokers (err %v)", b.Addr(), n, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		cl.Close()
	}
}

// partitionState is one partition's leader, epoch and ISR from Metadata.
type partitionState struct {
	leader, epoch int32
	isr, replicas []int32
}

// states reads topic's partitions from Metadata, asking again for up to
// 5 s while it fails (the broker asked may not have applied a new topic
// yet: each answers from its own view).
func (c *synCluster) states(t testing.TB, adm *kadm.Client, topic string) (map[int32]partitionState, error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := c.statesOnce(t, adm, topic)
		if err == nil || time.Now().After(deadline) {
			return st, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *synCluster) statesOnce(t testing.TB, adm *kadm.Client, topic string) (map[int32]partitionState, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := adm.Metadata(ctx, topic)
	if err != nil {
		return nil, err
	}
	td, ok := m.Topics[topic]
	if !ok || td.Err != nil {
		return nil, fmt.Errorf("topic %s: %v", topic, td.Err)
	}
	out := map[int32]partitionState{}
	for p, pd := range td.Partitions {
		out[p] = partitionState{leader: pd.Leader, epoch: pd.LeaderEpoch, isr: pd.ISR, replicas: pd.Replicas}
	}
	return out, nil
}

// statesFrom is states asked of the broker at addr only.
func (c *synCluster) statesFrom(t testing.TB, addr, topic string) (map[int32]partitionState, error) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := cl.SeedBrokers()[0].Request(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[int32]partitionState{}
	for _, mt := range resp.(*kmsg.MetadataResponse).Topics {
		for _, mp := range mt.Partitions {
			out[mp.Partition] = partitionState{leader: mp.Leader, epoch: mp.LeaderEpoch, isr: mp.ISR, replicas: mp.Replicas}
		}
	}
	return out, nil
}

// createTopic creates topic with partitions of 3 replicas and waits until
// every partition has a leader and its whole ISR.
func (c *synCluster) createTopic(t testing.TB, adm *kadm.Client, topic string, partitions int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.CreateTopic(ctx, partitions, 3, nil, topic); err != nil {
		t.Fatal(err)
	}
	c.waitISR(t, topic, 3, 20*time.Second)
}

// ledBy lists, in order, the partitions of st that broker leads.
func ledBy(st map[int32]partitionState, broker int32) []int32 {
	var led []int32
	for p, s := range st {
		if s.leader == broker {
			led = append(led, p)
		}
	}
	slices.Sort(led)
	return led
}

// waitISR waits until every partition of topic has a leader and an ISR of
// size want.
func (c *synCluster) waitISR(t testing.TB, topic string, want int, within time.Duration) {
	t.Helper()
	adm := c.admin(t)
	deadline := time.Now().Add(within)
	for {
		st, err := c.states(t, adm, topic)
		ok := err == nil && len(st) > 0
		for _, s := range st {
			if s.leader < 0 || len(s.isr) != want {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s: ISR not %d within %s: %v (err %v)", topic, want, within, st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clusterLogLevel is the brokers' log level (CLUSTER_LOG_LEVEL, default
// info).
func clusterLogLevel() string {
	if v := os.Getenv("CLUSTER_LOG_LEVEL"); v != "" {
		return v
	}
	return "info"
}
