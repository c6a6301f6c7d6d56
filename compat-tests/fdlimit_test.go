package compattests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestFDLimitLoweredUnderLoad: the broker's descriptor limit is lowered at
// run time (prlimit --pid) to half of what it holds, while producers
// write to 1 000 partitions whose small segments roll all the time (each
// roll opens files) and a consumer reads them all. Requests slow down or
// get retriable errors, nothing goes offline, and once the limit is back
// every acknowledged record is read.
func TestFDLimitLoweredUnderLoad(t *testing.T) {
	if compatTarget() != targetSynapse {
		t.Skip("synapse only: the test lowers the broker process's RLIMIT_NOFILE")
	}
	bin := os.Getenv("SYNAPSE_BIN")
	if bin == "" {
		skipUnlessRequired(t, "SYNAPSE_BIN is not set")
	}
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		skipUnlessRequired(t, "prlimit (util-linux) is not installed")
	}
	abs, _ := filepath.Abs(bin)
	b := startSynapseWith(t, abs, func(b *synapseBroker) {
		b.extraArgs = append(b.extraArgs, "--log-level", "info")
	})
	ctx := testCtx(t, 3*time.Minute)
	const topics, parts = 10, 100
	adm, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	cfg := map[string]*string{"segment.bytes": ptr("4096")}
	var names []string
	for i := 0; i < topics; i++ {
		name := fmt.Sprintf("fdlimit-%d", i)
		names = append(names, name)
		if _, err := kadm.NewClient(adm).CreateTopic(ctx, parts, 1, cfg, name); err != nil {
			t.Fatal(err)
		}
	}
	pid := b.cmd.Process.Pid

	// Load: 4 producers writing to every partition, acks=all, idempotent.
	var acked sync.Map // "topic/partition/offset" -> value
	var nAcked, nErr atomic.Int64
	var lastErr atomic.Value
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.RecordPartitioner(kgo.ManualPartitioner()),
				kgo.RecordDeliveryTimeout(90*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			defer cl.Close()
			for i := 0; loadCtx.Err() == nil; i++ {
				var recs []*kgo.Record
				for j := 0; j < 50; j++ {
					n := i*50 + j
					recs = append(recs, &kgo.Record{Topic: names[n%topics], Partition: int32((n / topics) % parts),
						Value: []byte(fmt.Sprintf("w%d-%d-%s", w, n, strings.Repeat("x", 200)))})
				}
				for _, r := range cl.ProduceSync(ctx, recs...) {
					if r.Err != nil {
						nErr.Add(1)
						lastErr.Store(r.Err.Error())
						continue
					}
					acked.Store(fmt.Sprintf("%s/%d/%d", r.Record.Topic, r.Record.Partition, r.Record.Offset), string(r.Record.Value))
					nAcked.Add(1)
				}
			}
		}()
	}
	time.Sleep(2 * time.Second)
	open := countFDs(fmt.Sprintf("/proc/%d/fd", pid))
	low := open / 2 // below what it holds: every new open finds the limit
	run := func(limit int) {
		out, err := exec.Command(prlimit, "--pid", strconv.Itoa(pid), fmt.Sprintf("--nofile=%d:%d", limit, 20000)).CombinedOutput()
		if err != nil {
			t.Fatalf("prlimit: %v: %s", err, out)
		}
	}
	before := nAcked.Load()
	run(low)
	t.Logf("broker holds %d descriptors; limit lowered to %d", open, low)
	time.Sleep(6 * time.Second)
	during := nAcked.Load() - before
	run(20000)
	time.Sleep(3 * time.Second)
	stopLoad()
	wg.Wait()
	t.Logf("acknowledged: %d before, %d while lowered, %d in all; %d produce errors surfaced (last: %v)",
		before, during, nAcked.Load(), nErr.Load(), lastErr.Load())
	if nErr.Load() > 0 {
		t.Errorf("%d records failed for good (clients should only have retried); last: %v", nErr.Load(), lastErr.Load())
	}

	// The limit bound: the kernel refused opens (counted in /metrics).
	if n := metricValue(t, b, "synapse_fd_kernel_refused_total"); n == 0 {
		t.Errorf("the lowered limit never bound (synapse_fd_kernel_refused_total 0): the test proves nothing")
	}

	// Nothing offline, nothing lost.
	logb, _ := os.ReadFile(b.logPath)
	if strings.Contains(string(logb), "partition offline") {
		t.Errorf("a partition went offline:\n%s", grepLines(string(logb), "partition offline", 5))
	}
	md, err := kadm.NewClient(adm).Metadata(ctx, names...)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range md.Topics {
		for _, p := range tp.Partitions {
			if p.Err != nil || len(p.OfflineReplicas) > 0 {
				t.Errorf("%s/%d after the limit was raised: err %v, offline %v", tp.Topic, p.Partition, p.Err, p.OfflineReplicas)
			}
		}
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.ConsumeTopics(names...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	want := nAcked.Load()
	var got int64
	for got < want && ctx.Err() == nil {
		fs := cons.PollFetches(ctx)
		fs.EachError(func(topic string, p int32, err error) {
			if ctx.Err() == nil {
				t.Fatalf("fetch %s/%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			k := fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
			if v, ok := acked.LoadAndDelete(k); ok {
				if v.(string) != string(r.Value) {
					t.Fatalf("%s holds %q, acknowledged %q", k, r.Value, v)
				}
				got++
			}
		})
	}
	if got != want {
		t.Fatalf("read back %d of %d acknowledged records", got, want)
	}
}

// metricValue reads one unlabelled sample from the broker's /metrics.
func metricValue(t *testing.T, b *synapseBroker, name string) float64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", b.httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

func ptr[T any](v T) *T { return &v }

// grepLines returns up to n lines of s containing sub.
func grepLines(s, sub string, n int) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
			if len(out) == n {
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
