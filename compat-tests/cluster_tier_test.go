package compattests

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A cluster over one bucket: versitygw (VERSITYGW_BIN, installed by make
// tools), the S3-compatible server the tiering tests use, in posix mode;
// the bucket is its root's directory.

type s3Server struct {
	cmd    *exec.Cmd
	root   string
	addr   string
	exited chan struct{}
}

const s3Bucket = "cluster"

// startS3 starts versitygw for t (stopped when t ends, by its PID).
func startS3(t testing.TB) *s3Server {
	t.Helper()
	bin := os.Getenv("VERSITYGW_BIN")
	if bin == "" {
		skipUnlessRequired(t, "VERSITYGW_BIN is not set: make tools installs versitygw into ~/.cache/synapse-tools/bin")
	}
	dir := t.TempDir()
	s := &s3Server{root: filepath.Join(dir, "root"), exited: make(chan struct{})}
	if err := os.MkdirAll(filepath.Join(s.root, s3Bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = l.Addr().String()
	l.Close()
	logf, err := os.Create(filepath.Join(dir, "versitygw.log"))
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(bin, "--port", s.addr, "--quiet", "posix", s.root)
	s.cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY=k", "ROOT_SECRET_KEY=s")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start versitygw: %v", err)
	}
	go func() { s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		s.cmd.Process.Signal(syscall.SIGCONT)
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			s.cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			dumpLogFile(t, logf.Name())
		}
		logf.Close()
	})
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := hc.Get("http://" + s.addr + "/"); err == nil {
			resp.Body.Close() // any answer will do (an S3 error for an anonymous request)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("versitygw did not answer within 20 s")
		}
	}
	// The brokers' S3 client reads its credentials from the environment.
	t.Setenv("AWS_ACCESS_KEY_ID", "k")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "s")
	return s
}

// url is the --tier URL of prefix in the bucket.
func (s *s3Server) url(prefix string) string {
	return fmt.Sprintf("s3://%s/%s?endpoint=http://%s&path_style=true&region=us-east-1", s3Bucket, prefix, s.addr)
}

// objects lists the bucket's object keys under prefix (relative to it).
func (s *s3Server) objects(t testing.TB, prefix string) []string {
	t.Helper()
	base := filepath.Join(s.root, s3Bucket, prefix)
	var keys []string
	filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.Contains(path, ".sgwtmp") {
			return nil
		}
		rel, _ := filepath.Rel(base, path)
		keys = append(keys, rel)
		return nil
	})
	return keys
}

// dirBytes is the size of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// TestClusterTiered: three brokers over one bucket (a real S3 server),
// segments of 32 KiB released locally once uploaded. Under load:
//   - only leaders upload, at their epoch (in every key), and each
//     partition's commit point is its pointer in etcd;
//   - the leader of partition 0 is killed; its disk is emptied; started
//     again, it starts each partition over where the bucket's log ends and
//     copies only the tail from the leaders, then rejoins every ISR;
//   - another leader is paused past its lease (the zombie) and resumed;
//   - the bucket stops answering for 6 s: produce goes on, uploads resume;
//
// and every acknowledged record is read back at its offset, most of them
// from the bucket through leaders that did not upload them.
func TestClusterTiered(t *testing.T) {
	s3 := startS3(t)
	c := startSynCluster(t, 3, "--tier", s3.url("c"), "--maintenance-interval", "500ms")
	const topic, partitions = "tiered", int32(6)
	adm := c.admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.CreateTopic(ctx, partitions, 3, map[string]*string{
		"segment.bytes": kadm.StringPtr("32768"), "local.retention.bytes": kadm.StringPtr("0"),
	}, topic); err != nil {
		t.Fatal(err)
	}
	c.waitISR(t, topic, 3, 20*time.Second)
	acks, times := newAckLog(), &ackTimes{times: map[int32][]time.Time{}}
	stop := make(chan struct{})
	wg := runProducers(t, c.seeds(), topic, partitions, 2, acks, times, stop)
	stopped := false
	defer func() {
		if !stopped {
			close(stop)
			wg.Wait()
		}
	}()
	manifests := func() map[string]bool { // epochs of the committed-or-not manifests, by partition dir
		out := map[string]bool{}
		for _, k := range s3.objects(t, "c") {
			if i := strings.Index(k, "/manifest-e"); i > 0 {
				out[k] = true
			}
		}
		return out
	}
	for deadline := time.Now().Add(30 * time.Second); len(manifests()) < int(partitions); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s of load, manifests in the bucket: %v", manifests())
		}
	}
	for _, k := range s3.objects(t, "c") {
		if strings.HasSuffix(k, ".log") && !strings.Contains(k, "-e") {
			t.Errorf("segment object without an epoch in its key: %s", k)
		}
		if strings.HasSuffix(k, "manifest.json") {
			t.Errorf("a single-node manifest in a cluster's bucket: %s", k)
		}
	}
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	victim := st[0].leader
	time.Sleep(3 * time.Second)
	c.brokers[victim].Kill9(t)
	if err := os.RemoveAll(c.brokers[victim].dataDir); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // the others lead and upload on
	c.brokers[victim].Start(t)
	c.waitISR(t, topic, 3, 60*time.Second)
	logb, _ := os.ReadFile(c.brokers[victim].logPath)
	if n := strings.Count(string(logb), "started over where the bucket's log ends"); n == 0 {
		t.Errorf("broker %d, back on an empty disk, copied every partition from its start (no start over at the bucket's end)", victim)
	} else {
		t.Logf("broker %d, back on an empty disk: %d partitions started over at the bucket's end; %d bytes on its disk", victim, n, dirBytes(c.brokers[victim].dataDir))
	}

	// The zombie: another leader paused past its lease, then resumed.
	st, err = c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	zombie := st[1].leader
	if zombie == victim {
		zombie = st[2].leader
	}
	c.brokers[zombie].signal(t, syscall.SIGSTOP)
	time.Sleep(7 * time.Second)
	c.brokers[zombie].signal(t, syscall.SIGCONT)
	c.waitISR(t, topic, 3, 60*time.Second)

	// The bucket stops answering (SIGSTOP) for 6 s: produce goes on (an
	// acknowledgement never waits for the bucket); once it is back, uploads
	// resume.
	seen := manifests()
	if err := s3.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	hung := time.Now()
	time.Sleep(6 * time.Second)
	if err := s3.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for p := range partitions {
		if _, ok := times.firstAfter(p, hung.Add(3*time.Second)); !ok {
			t.Errorf("partition %d: nothing acknowledged from 3 s into the bucket's stop", p)
		}
	}
	resumed := false
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && !resumed; time.Sleep(200 * time.Millisecond) {
		for k := range manifests() {
			resumed = resumed || !seen[k]
		}
	}
	if !resumed {
		t.Error("no manifest committed within 60 s of the bucket's return")
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	stopped = true

	var total int64
	for _, b := range c.brokers {
		total += dirBytes(b.dataDir)
	}
	bucket := dirBytes(filepath.Join(s3.root, s3Bucket))
	t.Logf("%d acks, %d failed; %d bytes in the bucket, %d on the three disks", acks.count(), acks.fails.Load(), bucket, total)
	if bucket == 0 {
		t.Fatal("nothing in the bucket")
	}
	var ms []string
	for k := range manifests() {
		ms = append(ms, k)
	}
	t.Logf("manifests in the bucket: %v", ms)
	for i, b := range c.brokers {
		logb, _ := os.ReadFile(b.logPath)
		t.Logf("broker %d: %d uploads of a segment's part past the bucket's end, %d upload warnings, %d fenced",
			i, strings.Count(string(logb), "past the bucket's end"), strings.Count(string(logb), "upload to the tiered store"),
			strings.Count(string(logb), "fenced"))
	}
	verifyAcked(t, c.seeds(), topic, partitions, acks)
}

// manifestEnds reads, from the bucket's files, the end offset of each
// partition's newest fenced manifest (by epoch, then sequence).
func (s *s3Server) manifestEnds(t testing.TB, prefix string) map[string]int64 {
	t.Helper()
	type seqd struct {
		epoch, seq int64
		next       int64
	}
	best := map[string]seqd{}
	for _, k := range s.objects(t, prefix) {
		dir, name := filepath.Split(k)
		var e, q int64
		if _, err := fmt.Sscanf(name, "manifest-e%d-%d-", &e, &q); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.root, s3Bucket, prefix, k))
		if err != nil {
			continue // replaced meanwhile
		}
		var m struct {
			LogStart int64 `json:"log_start_offset"`
			Segments []struct {
				Next int64 `json:"next"`
			} `json:"segments"`
		}
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		next := m.LogStart
		if n := len(m.Segments); n > 0 {
			next = m.Segments[n-1].Next
		}
		if cur, ok := best[dir]; !ok || e > cur.epoch || e == cur.epoch && q > cur.seq {
			best[dir] = seqd{e, q, next}
		}
	}
	out := map[string]int64{}
	for d, v := range best {
		out[strings.TrimSuffix(d, "/")] = v.next
	}
	return out
}

// TestClusterDisasterRestore: a 3-broker cluster over one bucket loses
// every broker's disk and etcd. Started again on empty disks and an empty
// etcd, the cluster restores the topic from the bucket: every partition
// goes on where its manifest ends, at a higher leader epoch, and every
// acknowledged record the bucket held is read back at its offset.
func TestClusterDisasterRestore(t *testing.T) {
	s3 := startS3(t)
	c := startSynCluster(t, 3, "--tier", s3.url("d"), "--maintenance-interval", "300ms")
	const topic, partitions = "precious", int32(4)
	adm := c.admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := adm.CreateTopic(ctx, partitions, 3, map[string]*string{
		"segment.bytes": kadm.StringPtr("32768"), "segment.ms": kadm.StringPtr("1000"), "local.retention.bytes": kadm.StringPtr("0"),
	}, topic); err != nil {
		t.Fatal(err)
	}
	c.waitISR(t, topic, 3, 20*time.Second)
	acks, times := newAckLog(), &ackTimes{times: map[int32][]time.Time{}}
	stop := make(chan struct{})
	wg := runProducers(t, c.seeds(), topic, partitions, 2, acks, times, stop)
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()
	// Idle, every partition's last segment is sealed by segment.ms and
	// uploaded: the bucket then holds everything acknowledged.
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { want[o.Partition] = o.Offset })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got := s3.manifestEnds(t, "d")
		full := len(got) == int(partitions)
		for dir, end := range got {
			p, err := strconv.Atoi(dir[strings.LastIndexByte(dir, '/')+1:])
			full = full && err == nil && want[int32(p)] == end
		}
		if full {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bucket's manifests end at %v; the partitions at %v", got, want)
		}
	}
	epochs := map[int32]int32{}
	before, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	for p, s := range before {
		epochs[p] = s.epoch
	}
	// A group's committed offsets, which the group coordinator mirrors to
	// the bucket.
	const group = "precious-readers"
	commits := kadm.Offsets{}
	for p := range partitions {
		commits.Add(kadm.Offset{Topic: topic, Partition: p, At: want[p] / 2, LeaderEpoch: -1})
	}
	if _, err := adm.CommitOffsets(ctx, group, commits); err != nil {
		t.Fatal(err)
	}
	// A transactional id, which the transaction coordinator mirrors too
	// (its records in a topic of their own).
	const txnID, txnTopic = "precious-txn", "precious-txns"
	if _, err := adm.CreateTopic(ctx, 1, 3, nil, txnTopic); err != nil {
		t.Fatal(err)
	}
	c.waitISR(t, txnTopic, 3, 20*time.Second)
	pid, pepoch := txnRound(t, ctx, c.seeds(), txnTopic, txnID)
	time.Sleep(time.Second) // the controller's mirror of the topics (every second), the groups' (maintenance)

	// The disaster: every broker and etcd killed, every disk emptied.
	for _, b := range c.brokers {
		b.Kill9(t)
		if err := os.RemoveAll(b.dataDir); err != nil {
			t.Fatal(err)
		}
	}
	c.etcd.cmd.Process.Kill()
	<-c.etcd.exited
	c.etcd = startEtcd(t)
	for _, b := range c.brokers {
		for i, a := range b.extraArgs {
			if a == "--etcd" {
				b.extraArgs[i+1] = c.etcd.url
			}
		}
	}
	for _, b := range c.brokers {
		b.Start(t)
	}
	c.waitBrokers(t, 3)
	adm = c.admin(t)
	c.waitISR(t, topic, 3, 90*time.Second)
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	for p := range partitions {
		if st[p].epoch <= epochs[p] {
			t.Errorf("partition %d restored at leader epoch %d, not above %d", p, st[p].epoch, epochs[p])
		}
	}
	// The brokers' views converge one by one: a broker still reading the
	// topics from etcd answers retriable errors, as in Kafka while
	// metadata propagates. Ask until every partition answers.
	var ends2 kadm.ListedOffsets
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ends2, err = adm.ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		retry := false
		ends2.Each(func(o kadm.ListedOffset) { retry = retry || (o.Err != nil && kerr.IsRetriable(o.Err)) })
		if !retry || time.Now().After(deadline) {
			break
		}
	}
	ends2.Each(func(o kadm.ListedOffset) {
		if o.Err != nil || o.Offset != want[o.Partition] {
			t.Errorf("partition %d restored ending at %d (%v), want %d", o.Partition, o.Offset, o.Err, want[o.Partition])
		}
	})
	t.Logf("restored %d partitions ending at %v, epochs %v -> %v; %d acks before the disaster", partitions, want, epochs, st, acks.count())
	// The group's offsets are back (asked again while its coordinator loads).
	var fetched kadm.OffsetResponses
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		fetched, err = adm.FetchOffsets(ctx, group)
		if err == nil || !kerr.IsRetriable(err) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("OffsetFetch of %s after the restore: %v", group, err)
	}
	for p := range partitions {
		if o, ok := fetched.Lookup(topic, p); !ok || o.Err != nil || o.At != want[p]/2 {
			t.Errorf("group %s, partition %d after the restore: %+v (found %v), want offset %d", group, p, o, ok, want[p]/2)
		}
	}
	// The transactional id is known: the same producer id, a later epoch.
	pid2, pepoch2 := txnRound(t, ctx, c.seeds(), txnTopic, txnID)
	if pid2 != pid || pepoch2 <= pepoch {
		t.Errorf("transactional id %s after the restore: producer id %d epoch %d; before: %d epoch %d (want the same id, a later epoch)", txnID, pid2, pepoch2, pid, pepoch)
	}
	verifyAcked(t, c.seeds(), topic, partitions, acks)

	// New records go on after the restored ones, at the new epoch.
	acks2 := newAckLog()
	stop2 := make(chan struct{})
	wg2 := runProducers(t, c.seeds(), topic, partitions, 1, acks2, &ackTimes{times: map[int32][]time.Time{}}, stop2)
	time.Sleep(2 * time.Second)
	close(stop2)
	wg2.Wait()
	acks2.mu.Lock()
	for p, m := range acks2.acks {
		for off := range m {
			if off < want[p] {
				t.Errorf("partition %d: a new record acknowledged at %d, below the restored end %d", p, off, want[p])
			}
		}
	}
	acks2.mu.Unlock()
	if acks2.count() == 0 {
		t.Error("nothing acknowledged after the restore")
	}
}

// txnRound commits one transaction of one record to topic's partition 0
// as txnID and returns the producer id and epoch it ran under.
func txnRound(t *testing.T, ctx context.Context, seeds []string, topic, txnID string) (int64, int16) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("txn")}).FirstErr(); err != nil {
		t.Fatalf("transactional produce as %s: %v", txnID, err)
	}
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit as %s: %v", txnID, err)
	}
	return pid, epoch
}
