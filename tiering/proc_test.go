package tiering_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/synapsebroker/synapse/tiering"
)

// The benchmarks run the broker, the S3 server and the cold reader as
// separate processes, as they are deployed: in one Go process the cold
// reader's allocations would stop the tail path for garbage collection,
// which is a property of the test, not of the broker.

// synapseBin is $SYNAPSE_BIN (make bench sets it) or a fresh build.
func synapseBin(tb testing.TB) string {
	tb.Helper()
	if b := os.Getenv("SYNAPSE_BIN"); b != "" {
		return b
	}
	bin := filepath.Join(tb.TempDir(), "synapse")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/synapse").CombinedOutput(); err != nil {
		tb.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// procBroker is a `synapse serve` child process tiering to versitygw.
type procBroker struct {
	addr, http string
	cmd        *exec.Cmd
}

func startSynapseProc(tb testing.TB, bin string, vgw *tiering.VersitygwServer, prefix string, args ...string) *procBroker {
	tb.Helper()
	b := &procBroker{addr: tiering.FreeAddr(tb), http: tiering.FreeAddr(tb)}
	tierURL := fmt.Sprintf("s3://%s/%s?endpoint=%s&path_style=true&region=%s", vgw.Bucket(), prefix, vgw.Endpoint(), tiering.VersitygwRegion)
	b.cmd = exec.Command(bin, append([]string{"serve", "--listen", b.addr, "--data-dir", tb.TempDir(), "--http-listen", b.http,
		"--tier", tierURL, "--maintenance-interval", "100ms", "--log-level", "warn", "--pprof"}, args...)...)
	if os.Getenv("PIN_BROKER") != "" {
		b.cmd = exec.Command("taskset", append([]string{"-c", os.Getenv("PIN_BROKER"), bin}, b.cmd.Args[1:]...)...)
	}
	b.cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+tiering.VersitygwAccessKey, "AWS_SECRET_ACCESS_KEY="+tiering.VersitygwSecretKey)
	logf, err := os.Create(filepath.Join(tb.TempDir(), "synapse.log"))
	if err != nil {
		tb.Fatal(err)
	}
	b.cmd.Stdout, b.cmd.Stderr = logf, logf
	if err := b.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.stop(tb) })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get("http://" + b.http + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return b
			}
		}
		if time.Now().After(deadline) {
			tb.Fatal("broker did not start")
		}
	}
}

// stop ends the broker gracefully (it offloads everything first).
func (b *procBroker) stop(tb testing.TB) {
	if b.cmd == nil {
		return
	}
	b.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		b.cmd.Process.Kill()
		<-done
		tb.Error("broker did not stop within 60 s")
	}
	b.cmd = nil
}

type procTierStatus struct {
	Tier struct {
		UploadedBytes    int64 `json:"uploaded_bytes"`
		UploadedSegments int64 `json:"uploaded_segments"`
		LagSegments      int64 `json:"lag_segments"`
		LagBytes         int64 `json:"lag_bytes"`
		DownloadedBytes  int64 `json:"downloaded_bytes"`
		ColdRate         int64 `json:"cold_rate_bytes_per_second"`
		TailSamples      int64 `json:"tail_samples"`
		TailLate         int64 `json:"tail_late"`
		Crowded          int64 `json:"crowded_windows"`
		Backoffs         int64 `json:"backoffs"`
	} `json:"tier"`
}

func (b *procBroker) status(tb testing.TB) procTierStatus {
	tb.Helper()
	st, err := b.tryStatus()
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

// tryStatus is status for goroutines other than the test's.
func (b *procBroker) tryStatus() (procTierStatus, error) {
	var st procTierStatus
	resp, err := http.Get("http://" + b.http + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// procCPU is a process's user+system CPU time so far (from /proc).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// startColdReader runs TestColdReaderProcess in a child process: a consumer
// reading topic from offset 0 to its end, over and over, until stopped.
func startColdReader(tb testing.TB, addr, topic string) (stop func()) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestColdReaderProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "COLD_READER_ADDR="+addr, "COLD_READER_TOPIC="+topic)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	return func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
}

// TestColdReaderProcess is the cold reader's body when run as a child by
// startColdReader; otherwise it skips.
func TestColdReaderProcess(t *testing.T) {
	addr, topic := os.Getenv("COLD_READER_ADDR"), os.Getenv("COLD_READER_TOPIC")
	if addr == "" {
		t.Skip("only as a child process of a benchmark")
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }() // the parent closes stdin to stop us
	for ctx.Err() == nil {
		c, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxBytes(32<<20), kgo.FetchMaxPartitionBytes(32<<20))
		if err != nil {
			t.Fatal(err)
		}
		end := int64(-1)
		for ctx.Err() == nil {
			fs := c.PollFetches(ctx)
			fs.EachPartition(func(p kgo.FetchTopicPartition) {
				end = p.HighWatermark
				if n := len(p.Records); n > 0 && p.Records[n-1].Offset+1 >= end {
					end = -2 // read to the end
				}
			})
			if end == -2 {
				break
			}
		}
		c.Close()
	}
}
