package compattests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The client libraries through a leader's kill -9 on a 3-broker cluster:
// each produces acks=all records, the leader of one of the topic's
// partitions is killed, the same client produces more (its retries find
// the new leader), and everything is consumed back byte-exact.

// clusterBroker is a cluster as a client sees it: one bootstrap address
// (a broker that stays up).
type clusterBroker struct {
	c    *synCluster
	boot int
}

func (b clusterBroker) Target() string       { return targetSynapse }
func (b clusterBroker) Addr() string         { return b.c.brokers[b.boot].Addr() }
func (b clusterBroker) Restart(t testing.TB) { t.Skip("a cluster restarts broker by broker") }
func (b clusterBroker) Kill9(t testing.TB)   { t.Skip("a cluster kills broker by broker") }
func (b clusterBroker) Start(t testing.TB)   { t.Skip("a cluster starts broker by broker") }

func runClusterFailover(t *testing.T, spec clientSpec) {
	if compatTarget() != targetSynapse {
		t.Skip("cluster mode is Synapse's")
	}
	c := startSynCluster(t, 3)
	adm := c.admin(t)
	ctx := testCtx(t, 2*scenarioTimeout)
	topic := uniqueTopic(t)
	c.createTopic(t, adm, topic, numPartitions)
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	// The victim leads a partition; the client bootstraps from another.
	victim := int32(-1)
	for p := int32(0); p < numPartitions; p++ {
		if st[p].leader != 0 {
			victim = st[p].leader
			break
		}
	}
	if victim < 0 {
		t.Fatalf("broker 0 leads every partition: %v", st)
	}
	cl := spec.open(t, clusterBroker{c: c, boot: 0})
	gen := spec.gen()
	var want []record
	for _, codec := range []string{"none", "gzip"} {
		recs := gen.batch(codec, 8, false)
		cl.produce(t, ctx, topic, codec, recs)
		want = append(want, recs...)
	}
	if t.Failed() {
		t.FailNow()
	}
	c.brokers[victim].Kill9(t)
	killed := time.Now()
	for _, codec := range []string{"none", "snappy"} {
		recs := gen.batch(codec, 8, false)
		cl.produce(t, ctx, topic, codec, recs)
		want = append(want, recs...)
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("broker %d killed; the produce after it took %s", victim, time.Since(killed).Round(time.Millisecond))
	got := cl.consume(t, ctx, topic, perPartition(want))
	checkRecords(t, want, got, checkOpts{nullsDistinct: spec.nullsDistinct})
	c.brokers[victim].Start(t)
}

func TestClusterFailoverFranzGo(t *testing.T) {
	runClusterFailover(t, clientSpec{newClient: newFranzGo, nullsDistinct: true})
}

func TestClusterFailoverSarama(t *testing.T) {
	runClusterFailover(t, clientSpec{
		newClient: func(t testing.TB, b broker) client {
			return &saramaClient{addr: b.Addr(), version: sarama.V2_8_0_0, producers: make(map[string]sarama.SyncProducer)}
		},
		nullsDistinct: true,
	})
}

func TestClusterFailoverKafkaGo(t *testing.T) {
	runClusterFailover(t, kafkaGoSpec())
}

func TestClusterFailoverConfluentGo(t *testing.T) {
	runClusterFailover(t, confluentSpec())
}

// runClusterScript runs a producing script (ACK lines on stdout) against
// a 3-broker cluster, kills the leader of partition 0 a second in, and
// reads back: every acknowledged value at its offset; with exactlyOnce
// (an idempotent producer) no value twice either.
func runClusterScript(t *testing.T, exactlyOnce bool, cmdFor func(boot, topic string) *exec.Cmd) {
	t.Helper()
	c := startSynCluster(t, 3)
	adm := c.admin(t)
	topic := uniqueTopic(t)
	c.createTopic(t, adm, topic, numPartitions)
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	victim := st[0].leader
	boot := (victim + 1) % 3
	cmd := cmdFor(c.brokers[boot].Addr(), topic)
	var out, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	time.Sleep(time.Second)
	c.brokers[victim].Kill9(t)
	if err := <-done; err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", cmd.Args[1], err, out.String(), stderr.String())
	}
	acks := newAckLog()
	for _, line := range strings.Split(out.String(), "\n") {
		var p int32
		var off int64
		var v string
		if n, _ := fmt.Sscanf(line, "ACK %d %d %s", &p, &off, &v); n == 3 {
			if err := acks.add(&kgo.Record{Partition: p, Offset: off, Value: []byte(v)}); err != nil {
				t.Error(err)
			}
		}
	}
	if acks.count() == 0 {
		t.Fatalf("no acknowledgement printed:\n%s\n%s", out.String(), stderr.String())
	}
	t.Logf("broker %d killed while %s produced; %d acknowledged", victim, filepath.Base(cmd.Args[1]), acks.count())
	if exactlyOnce {
		verifyAcked(t, c.seeds(), topic, numPartitions, acks)
	} else {
		verifyAckedAtLeastOnce(t, c.seeds(), topic, numPartitions, acks)
	}
	c.brokers[victim].Start(t)
}

func TestClusterFailoverKafkaPython(t *testing.T) {
	pythonModule(t, "kafka", "python3-kafka")
	// kafka-python 2.0.2 has no idempotent producer: a retry after a lost
	// answer may write a record twice (at two offsets).
	runClusterScript(t, false, func(boot, topic string) *exec.Cmd {
		cmd := exec.Command(systemPython, "testdata/cluster_produce.py", "kafka-python", boot, topic, "300")
		cmd.Env = pythonEnv()
		return cmd
	})
}

func TestClusterFailoverConfluentPython(t *testing.T) {
	pythonModule(t, "confluent_kafka", "python3-confluent-kafka")
	runClusterScript(t, true, func(boot, topic string) *exec.Cmd {
		cmd := exec.Command(systemPython, "testdata/cluster_produce.py", "confluent", boot, topic, "300")
		cmd.Env = pythonEnv()
		return cmd
	})
}

func TestClusterFailoverKafkaJS(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		skipUnlessRequired(t, "node not found: run compat-tests/install-kafkajs.sh")
	}
	modules := filepath.Join(kafkajsDir(), "node_modules")
	if _, err := os.Stat(filepath.Join(modules, "kafkajs", "package.json")); err != nil {
		skipUnlessRequired(t, "kafkajs not installed in "+modules+": run compat-tests/install-kafkajs.sh")
	}
	runClusterScript(t, true, func(boot, topic string) *exec.Cmd {
		cmd := exec.Command(node, "testdata/kafkajs_cluster_produce.js", boot, topic, "300")
		cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "KAFKAJS_NO_PARTITIONER_WARNING=1")
		return cmd
	})
}

// TestClusterFailoverKcat pipes lines into kcat -P (idempotent, acks=all)
// while the leader of partition 0 is killed, and reads them back with
// kcat -C: every line once.
func TestClusterFailoverKcat(t *testing.T) {
	bin := kcatPath(t)
	c := startSynCluster(t, 3)
	adm := c.admin(t)
	ctx := testCtx(t, 2*scenarioTimeout)
	topic := uniqueTopic(t)
	c.createTopic(t, adm, topic, numPartitions)
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	victim := st[0].leader
	boot := c.brokers[(victim+1)%3].Addr()
	cmd := exec.CommandContext(ctx, bin, "-b", boot, "-P", "-t", topic, "-X", "acks=all", "-X", "enable.idempotence=true",
		"-X", "message.timeout.ms=60000", "-X", "topic.partitioner=murmur2_random")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		if i == n/3 {
			c.brokers[victim].Kill9(t)
		}
		fmt.Fprintf(in, "line-%d\n", i)
		time.Sleep(10 * time.Millisecond)
	}
	in.Close()
	// librdkafka reports the dead broker's refused connections as errors
	// ("Broker transport failure"); only a failed delivery counts.
	if err := cmd.Wait(); err != nil || strings.Contains(stderr.String(), "Delivery failed") {
		t.Fatalf("kcat -P: %v\n%s", err, stderr.String())
	}
	out, err := exec.CommandContext(ctx, bin, "-b", boot, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%s\n").Output()
	if err != nil {
		t.Fatalf("kcat -C: %v", err)
	}
	seen := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		seen[l]++
	}
	for i := range n {
		if k := fmt.Sprintf("line-%d", i); seen[k] != 1 {
			t.Errorf("%s read %d times, want once", k, seen[k])
		}
	}
	t.Logf("broker %d killed a third of the way; %d lines read back", victim, len(seen))
	c.brokers[victim].Start(t)
}
