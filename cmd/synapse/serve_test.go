package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/protocol"
)

// cancelled is a context that is already done: serve opens everything, finds
// its stop signal at once and shuts down.
func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// logEntries parses JSON log lines.
func logEntries(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		m := map[string]any{}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %q", err, line)
		}
		out = append(out, m)
	}
	return out
}

func findEntry(t *testing.T, entries []map[string]any, msgPrefix string) map[string]any {
	t.Helper()
	for _, e := range entries {
		if msg, _ := e["msg"].(string); strings.HasPrefix(msg, msgPrefix) {
			return e
		}
	}
	t.Fatalf("no log entry %q in %v", msgPrefix, entries)
	return nil
}

// freeAddr returns a loopback address nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// roundTrip sends one request and decodes the response.
func roundTrip(t *testing.T, nc net.Conn, corr int32, req kmsg.Request) kmsg.Response {
	t.Helper()
	var b []byte
	b = append(b, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = binary.BigEndian.AppendUint16(b, 4)
	b = append(b, "test"...)
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	frame, err := protocol.ReadFrame(nc, nil, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got := int32(binary.BigEndian.Uint32(frame)); got != corr {
		t.Fatalf("correlation id %d, want %d", got, corr)
	}
	body := frame[4:]
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	if protocol.FlexibleHeader(resp) {
		body = body[1:]
	}
	if err := resp.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	return resp
}

// serveResult is how a command run in the background ended.
type serveResult struct {
	stderr string
	err    error
}

// serveInBackground runs the command with args until cancel is called;
// done then delivers how it ended.
func serveInBackground(t *testing.T, args ...string) (cancel func(), done <-chan serveResult) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan serveResult, 1)
	go func() {
		_, stderr, err := run(t, ctx, args...)
		ch <- serveResult{stderr, err}
	}()
	return cancel, ch
}

func TestServeServesAndStops(t *testing.T) {
	data := t.TempDir()
	addr, httpAddr := freeAddr(t), freeAddr(t)
	cancel, done := serveInBackground(t, "--log-format", "json", "serve", "--data-dir", data, "--listen", addr, "--http-listen", httpAddr)
	var nc net.Conn
	for i := 0; i < 200; i++ {
		var err error
		if nc, err = net.Dial("tcp", addr); err == nil {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if nc == nil {
		cancel()
		t.Fatalf("broker never listened:\n%s", (<-done).stderr)
	}
	defer nc.Close()
	av := kmsg.NewPtrApiVersionsRequest()
	av.Version = 3
	avr := roundTrip(t, nc, 1, av).(*kmsg.ApiVersionsResponse)
	if avr.ErrorCode != 0 || len(avr.ApiKeys) == 0 {
		t.Fatalf("ApiVersions: %+v", avr)
	}
	ct := kmsg.NewPtrCreateTopicsRequest()
	ct.Version = 5
	tp := kmsg.NewCreateTopicsRequestTopic()
	tp.Topic, tp.NumPartitions, tp.ReplicationFactor = "orders", 2, 1
	ct.Topics = append(ct.Topics, tp)
	ctr := roundTrip(t, nc, 2, ct).(*kmsg.CreateTopicsResponse)
	if len(ctr.Topics) != 1 || ctr.Topics[0].ErrorCode != 0 {
		t.Fatalf("CreateTopics: %+v", ctr.Topics)
	}
	resp, err := http.Get("http://" + httpAddr + "/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/readyz: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"synapse_partitions 2", "synapse_tier_upload_lag_segments", "synapse_tier_cold_read_rate_bytes 0", `synapse_groups{state="Stable"} 0`, "synapse_group_members 0", "go_goroutines"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %q", m)
		}
	}
	if resp, err := http.Get("http://" + httpAddr + "/debug/pprof/goroutine?debug=1"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --pprof: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}
	resp, err = http.Get("http://" + httpAddr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var status map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&status); err != nil || status["tier"] == nil {
		t.Fatalf("/status: %v %v", status, err)
	}
	resp.Body.Close()
	// One naming style in the JSON the broker serves: snake_case keys.
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		for k, sub := range m {
			if k != strings.ToLower(k) || strings.ContainsAny(k, "- ") {
				t.Errorf("/status key %s%s is not snake_case", prefix, k)
			}
			walk(prefix+k+".", sub)
		}
	}
	walk("", status)

	// A second broker on the same data directory exits at once, naming the
	// directory and the holder; the first keeps serving.
	began := time.Now()
	_, _, err = run(t, context.Background(), "serve", "--data-dir", data, "--listen", freeAddr(t), "--http-listen", "")
	if err == nil || !strings.Contains(err.Error(), data) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Errorf("second serve on the same data directory: %v", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("second serve took %v to fail", d)
	}
	if avr := roundTrip(t, nc, 3, av).(*kmsg.ApiVersionsResponse); avr.ErrorCode != 0 {
		t.Errorf("first broker after the second one failed: ApiVersions %+v", avr)
	}

	cancel()
	r := <-done
	if r.err != nil {
		t.Fatalf("serve: %v\n%s", r.err, r.stderr)
	}
	entries := logEntries(t, r.stderr)
	e := findEntry(t, entries, "serving")
	if e["advertised"] != addr || e["data_dir"] != data {
		t.Errorf("start-up line = %v", e)
	}
	findEntry(t, entries, "stopped")
	for _, dir := range []string{"orders-0", "orders-1"} {
		rep, err := log.VerifyDir(log.OSFS, filepath.Join(data, dir))
		if err != nil || !rep.OK() || len(rep.Notes) != 0 {
			t.Errorf("%s after serve: %+v, %v", dir, rep, err)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "topics.json")); err != nil {
		t.Error(err)
	}
}

func TestServeCreatesDataDir(t *testing.T) {
	data := filepath.Join(t.TempDir(), "a", "b")
	_, stderr, err := run(t, cancelled(), "serve", "--data-dir", data, "--listen", "127.0.0.1:0", "--http-listen", "")
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr)
	}
	if fi, err := os.Stat(data); err != nil || !fi.IsDir() {
		t.Fatalf("data dir not created: %v", err)
	}
	if !strings.Contains(stderr, "INFO\tbroker") && !strings.Contains(stderr, "serving") {
		t.Errorf("console log lacks the start-up line:\n%s", stderr)
	}
}

func TestServeEnvironment(t *testing.T) {
	fromEnv := filepath.Join(t.TempDir(), "env")
	fromFlag := filepath.Join(t.TempDir(), "flag")
	t.Setenv("SYNAPSE_DATA_DIR", fromEnv)
	t.Setenv("SYNAPSE_FSYNC_INTERVAL", "250ms")
	t.Setenv("SYNAPSE_LOG_FORMAT", "json")
	t.Setenv("SYNAPSE_LISTEN", "127.0.0.1:0")
	t.Setenv("SYNAPSE_HTTP_LISTEN", "127.0.0.1:0")

	_, stderr, err := run(t, cancelled(), "serve")
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr)
	}
	e := findEntry(t, logEntries(t, stderr), "serving")
	if e["data_dir"] != fromEnv || e["fsync"] != "interval 250ms" {
		t.Errorf("environment not applied: %v", e)
	}

	// The command line wins over the environment.
	_, stderr, err = run(t, cancelled(), "serve", "--data-dir", fromFlag, "--fsync-interval=0")
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr)
	}
	e = findEntry(t, logEntries(t, stderr), "serving")
	if e["data_dir"] != fromFlag || e["fsync"] != "durable" {
		t.Errorf("flags did not override the environment: %v", e)
	}
	if _, err := os.Stat(fromFlag); err != nil {
		t.Error(err)
	}

	t.Setenv("SYNAPSE_MAX_OPEN_FILES", "many")
	_, _, err = run(t, cancelled(), "serve")
	if err == nil || !strings.Contains(err.Error(), "SYNAPSE_MAX_OPEN_FILES") {
		t.Errorf("bad environment value: err = %v", err)
	}
}

func TestServeRejectsBadFlags(t *testing.T) {
	data := t.TempDir()
	for _, args := range [][]string{
		{"serve", "--data-dir", data, "--listen", "9092"},
		{"serve", "--data-dir", data, "--max-open-files", "0"},
		{"serve", "--data-dir", data, "--fsync-interval", "-1s"},
		{"serve", "--data-dir", data, "extra"},
		{"--log-level", "trace", "serve", "--data-dir", data},
		{"--log-format", "xml", "serve", "--data-dir", data},
	} {
		if _, _, err := run(t, cancelled(), args...); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// TestServeWildcardAndPprof: listening on every address without
// --advertised-addr advertises the host's name (a wildcard is no address a
// client can connect to), and --pprof serves the profiler.
func TestServeWildcardAndPprof(t *testing.T) {
	_, port, _ := net.SplitHostPort(freeAddr(t))
	httpAddr := freeAddr(t)
	cancel, done := serveInBackground(t, "--log-format", "json", "serve", "--data-dir", t.TempDir(), "--listen", "0.0.0.0:"+port,
		"--http-listen", httpAddr, "--pprof")
	var ok bool
	for i := 0; i < 200 && !ok; i++ {
		if resp, err := http.Get("http://" + httpAddr + "/debug/pprof/goroutine?debug=1"); err == nil {
			resp.Body.Close()
			ok = resp.StatusCode == 200
		}
		if !ok {
			time.Sleep(25 * time.Millisecond)
		}
	}
	cancel()
	r := <-done
	if !ok {
		t.Fatalf("/debug/pprof/ with --pprof never answered 200:\n%s", r.stderr)
	}
	if r.err != nil {
		t.Fatalf("serve: %v\n%s", r.err, r.stderr)
	}
	host, _ := os.Hostname()
	if e := findEntry(t, logEntries(t, r.stderr), "serving"); e["advertised"] != net.JoinHostPort(host, port) {
		t.Errorf("advertised %v on a wildcard listener, want the host name %q", e["advertised"], net.JoinHostPort(host, port))
	}
}
