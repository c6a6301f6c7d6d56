package tiering_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/synapsebroker/synapse/tiering"
)

// TestKill9DuringS3Uploads runs a real `synapse serve` process tiering to
// versitygw, produces with acks=all and SIGKILLs the broker at random
// moments while it uploads; after every restart all acknowledged records are
// read back from offset 0 (part of them cold from S3). At the end the broker
// stops gracefully and a new one on an empty disk restores everything from
// the bucket.
func TestKill9DuringS3Uploads(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the broker binary")
	}
	vgw := tiering.RunVersitygw(t)
	bin := filepath.Join(t.TempDir(), "synapse")
	build := exec.Command("go", "build", "-o", bin, "../cmd/synapse")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	tierURL := fmt.Sprintf("s3://%s/kill?endpoint=%s&path_style=true&region=%s", vgw.Bucket(), vgw.Endpoint(), tiering.VersitygwRegion)
	start := func(dataDir string) *exec.Cmd {
		cmd := exec.Command(bin, "serve", "--listen", addr, "--data-dir", dataDir, "--http-listen", "",
			"--tier", tierURL, "--maintenance-interval", "50ms", "--log-level", "warn")
		cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+tiering.VersitygwAccessKey, "AWS_SECRET_ACCESS_KEY="+tiering.VersitygwSecretKey)
		logf, _ := os.Create(filepath.Join(t.TempDir(), "synapse.log"))
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		deadline := time.Now().Add(20 * time.Second)
		for {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				return cmd
			}
			if time.Now().After(deadline) {
				t.Fatal("broker did not start")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	dataDir := t.TempDir()
	cmd := start(dataDir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := kclient(t, addr)
	cfg := map[string]*string{"segment.bytes": ptr("16384"), "local.retention.bytes": ptr("0"), "retention.ms": ptr("-1")}
	if _, err := kadm.NewClient(admin).CreateTopic(ctx, 2, 1, cfg, "tiered"); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 2))
	var acked []*kgo.Record
	n := 0
	for round := 0; round < 4; round++ {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RecordRetries(3))
		if err != nil {
			t.Fatal(err)
		}
		killAt := time.Now().Add(time.Duration(300+rng.IntN(600)) * time.Millisecond)
		for time.Now().Before(killAt) {
			var rs []*kgo.Record
			for i := 0; i < 8; i++ {
				v := make([]byte, 1000)
				rand.Read(v)
				rs = append(rs, &kgo.Record{Topic: "tiered", Key: []byte(strconv.Itoa(n)), Value: v})
				n++
			}
			for _, r := range cl.ProduceSync(ctx, rs...) {
				if r.Err == nil {
					acked = append(acked, r.Record)
				}
			}
		}
		cl.Close()
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		cmd = start(dataDir)
		consumeExact(t, addr, acked)
	}
	// Graceful stop offloads the rest; a broker on an empty disk restores.
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	cmd = start(t.TempDir())
	consumeExact(t, addr, acked)
	t.Logf("%d acknowledged records over 4 kills, all read back, and again after a restore", len(acked))

	// The disk lost with the crash: kill -9 the restored broker while it
	// uploads, and restore a broker on another empty disk from whatever the
	// bucket holds. Everything acknowledged before the graceful stop is
	// there; what the bucket has of the rest is intact (every record is one
	// that was produced, byte-exact); new records continue each partition
	// at the offset after the bucket's log.
	produced := map[string][]byte{}
	for _, r := range acked {
		produced[string(r.Key)] = r.Value
	}
	before := len(acked)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RecordRetries(3))
	if err != nil {
		t.Fatal(err)
	}
	for killAt := time.Now().Add(time.Duration(400+rng.IntN(400)) * time.Millisecond); time.Now().Before(killAt); {
		var rs []*kgo.Record
		for i := 0; i < 8; i++ {
			v := make([]byte, 1000)
			rand.Read(v)
			rs = append(rs, &kgo.Record{Topic: "tiered", Key: []byte(strconv.Itoa(n)), Value: v})
			produced[strconv.Itoa(n)] = v
			n++
		}
		cl.ProduceSync(ctx, rs...)
	}
	cl.Close()
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	start(t.TempDir())
	got := consumeExact(t, addr, acked[:before])
	for k, v := range got {
		if !bytes.Equal(produced[k], v) {
			t.Fatalf("restored record %s is not what was produced", k)
		}
	}
	adm := kadm.NewClient(kclient(t, addr))
	ends, err := adm.ListEndOffsets(ctx, "tiered")
	if err != nil || ends.Error() != nil {
		t.Fatal(err, ends.Error())
	}
	pr := kclient(t, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for p := int32(0); p < 2; p++ {
		end, _ := ends.Lookup("tiered", p)
		r, err := pr.ProduceSync(ctx, &kgo.Record{Topic: "tiered", Partition: p, Value: []byte("after the crash")}).First()
		if err != nil {
			t.Fatal(err)
		}
		if r.Offset != end.Offset {
			t.Fatalf("partition %d: new record at %d, the restored log ends at %d", p, r.Offset, end.Offset)
		}
	}
	t.Logf("crash restore: %d records read back, all as produced (%d acknowledged before the graceful stop, %d produced after it)", len(got), before, len(produced)-before)
}
