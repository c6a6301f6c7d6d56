package compattests

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
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
