package main

import (
	"context"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/synapsebroker/synapse/broker"
	"github.com/synapsebroker/synapse/internal/testcert"
)

func TestLatencyHistQuantiles(t *testing.T) {
	var h latencyHist
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Microsecond) // exact below 1 ms
	}
	for i := 0; i < 10; i++ {
		h.add(50 * time.Millisecond)
	}
	if got := h.quantile(0.5); got != 505 {
		t.Fatalf("p50 = %d µs, want 505", got)
	}
	if got := h.quantile(0.99); got < 990 || got > 1000 {
		t.Fatalf("p99 = %d µs", got)
	}
	if got := h.quantile(1); got < 49000 || got > 51000 { // 1.6% buckets above 1 ms
		t.Fatalf("max = %d µs, want about 50000", got)
	}
}

// TestBenchClientAgainstBroker runs produce, consume and e2e (small counts)
// against an in-process broker and checks what they report.
func TestBenchClientAgainstBroker(t *testing.T) {
	s, err := broker.New(broker.Config{DataDir: t.TempDir(), AutoCreateTopics: true})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Shutdown(context.Background())
	ctx := context.Background()
	o := &clientBenchOptions{brokers: ln.Addr().String(), topic: "b", partitions: 2, recordSize: 100, records: 2000,
		duration: time.Minute, producers: 2, compression: "lz4", acks: "all", idempotent: true, payload: "text"}
	r, err := runProduce(ctx, o, io.Discard)
	if err != nil || r.Records != 2000 || r.Errors != 0 || r.Bytes != 200000 || r.LatencyMs["p99"] <= 0 {
		t.Fatalf("produce: %+v %v", r, err)
	}
	o.records = 0 // to the end
	if r, err = runConsume(ctx, o, io.Discard); err != nil || r.Records != 2000 || r.Bytes != 200000 {
		t.Fatalf("consume: %+v %v", r, err)
	}
	o.topic, o.rate, o.duration, o.compression = "e", 500, time.Second, "none"
	if r, err = runE2E(ctx, o, io.Discard); err != nil || r.Records < 400 || r.Errors != 0 || r.LatencyMs["p50"] <= 0 {
		t.Fatalf("e2e: %+v %v", r, err)
	}
}

// TestBenchClientSecurity runs the clients over an SSL and a
// SASL_PLAINTEXT listener, and `bench auth` with each mechanism.
func TestBenchClientSecurity(t *testing.T) {
	cert := testcert.NewServer(t)
	caFile, tlsCfg := cert.CAFile(t), cert.TLS
	s, err := broker.New(broker.Config{DataDir: t.TempDir(), AutoCreateTopics: true, AdminPassword: "pw", FailedAuthDelay: -1,
		SASLMechanisms: []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	listen := func(l broker.Listener) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go s.ServeListener(ln, l)
		return ln.Addr().String()
	}
	sslAddr := listen(broker.Listener{Name: broker.SSL, Protocol: broker.SSL, TLS: tlsCfg})
	saslAddr := listen(broker.Listener{Name: broker.SASLPlaintext, Protocol: broker.SASLPlaintext})
	ctx := context.Background()

	o := &clientBenchOptions{brokers: sslAddr, topic: "tls", partitions: 1, recordSize: 100, records: 500,
		duration: time.Minute, producers: 1, compression: "none", acks: "all", idempotent: true, payload: "random"}
	o.sec.caFile = caFile
	if r, err := runProduce(ctx, o, io.Discard); err != nil || r.Records != 500 || r.Errors != 0 {
		t.Fatalf("produce over TLS: %+v %v", r, err)
	}
	o.records = 0
	if r, err := runConsume(ctx, o, io.Discard); err != nil || r.Records != 500 {
		t.Fatalf("consume over TLS: %+v %v", r, err)
	}
	for _, mech := range []string{"SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"} {
		o := &clientBenchOptions{brokers: saslAddr, topic: "sasl", partitions: 1, recordSize: 100, records: 200,
			duration: time.Minute, producers: 1, compression: "none", acks: "all", idempotent: true, payload: "random"}
		o.sec = clientSecurity{mechanism: mech, user: "admin", password: "pw"}
		if r, err := runProduce(ctx, o, io.Discard); err != nil || r.Records != 200 || r.Errors != 0 {
			t.Fatalf("produce over SASL %s: %+v %v", mech, r, err)
		}
	}

	auth := func(mech, pass string, cache bool) *authResult {
		t.Helper()
		o := &authBenchOptions{brokers: saslAddr, duration: 300 * time.Millisecond, concurrency: 2, apiVersions: true,
			keyCache: cache, timeout: 5 * time.Second}
		o.sec = clientSecurity{mechanism: mech, user: "admin", password: pass}
		r, err := runAuth(ctx, o, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, c := range []struct {
		mech  string
		cache bool
	}{{"SCRAM-SHA-256", true}, {"SCRAM-SHA-256", false}, {"SCRAM-SHA-512", true}, {"PLAIN", false}} {
		if r := auth(c.mech, "pw", c.cache); r.Auths == 0 || r.Failures != 0 || r.AuthsPerSec <= 0 || r.LatencyMs["p99"] <= 0 {
			t.Fatalf("auth %s (key cache %v): %+v", c.mech, c.cache, r)
		}
	}
	if r := auth("SCRAM-SHA-256", "wrong", true); r.Auths != 0 || r.Failures == 0 {
		t.Fatalf("auth with a wrong password: %+v", r)
	}
}

// benchFlags parses args as `synapse bench <use>` would and validates them.
func benchFlags(t *testing.T, use string, args ...string) (*clientBenchOptions, error) {
	t.Helper()
	for _, sp := range benchClientSpecs() {
		if sp.use == use {
			cmd, o := newBenchClientCommandOpts(sp)
			if err := cmd.ParseFlags(args); err != nil {
				return o, err
			}
			return o, o.validate(cmd.Flags())
		}
	}
	t.Fatalf("no bench command %q", use)
	return nil, nil
}

func TestBenchClientTxnFlags(t *testing.T) {
	o, err := benchFlags(t, "produce")
	if err != nil || o.txnID != "" || o.txnRecords != 100 || o.abortEvery != 0 || o.txnTimeout != 40*time.Second {
		t.Fatalf("produce defaults: %+v %v", o, err)
	}
	o, err = benchFlags(t, "produce", "--transactional-id", "p", "--txn-records", "50", "--abort-every", "10", "--txn-timeout", "5s")
	if err != nil || o.txnID != "p" || o.txnRecords != 50 || o.abortEvery != 10 || o.txnTimeout != 5*time.Second {
		t.Fatalf("transactional produce: %+v %v", o, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--txn-records", "5"}, "--txn-records needs --transactional-id"},
		{[]string{"--abort-every", "10"}, "--abort-every needs --transactional-id"},
		{[]string{"--txn-timeout", "1s"}, "--txn-timeout needs --transactional-id"},
		{[]string{"--transactional-id", "p", "--txn-records", "0"}, "at least 1"},
		{[]string{"--transactional-id", "p", "--abort-every", "-1"}, "0 (never) or more"},
		{[]string{"--transactional-id", "p", "--txn-timeout", "0s"}, "must be positive"},
		{[]string{"--transactional-id", "p", "--idempotent=false"}, "idempotent producer with --acks all"},
		{[]string{"--transactional-id", "p", "--acks", "1"}, "idempotent producer with --acks all"},
		{[]string{"--duration", "0s"}, "--duration must be positive"},
	} {
		if _, err := benchFlags(t, "produce", c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("produce %v: %v, want an error with %q", c.args, err, c.want)
		}
	}
	if _, err := benchFlags(t, "e2e", "--transactional-id", "p"); err == nil {
		t.Error("e2e takes --transactional-id")
	}
	if _, err := benchFlags(t, "consume", "--transactional-id", "p"); err == nil {
		t.Error("consume takes --transactional-id")
	}

	if o, err = benchFlags(t, "consume"); err != nil || o.isolation != "read_uncommitted" {
		t.Fatalf("consume defaults: %+v %v", o, err)
	}
	if o, err = benchFlags(t, "consume", "--isolation", "read_committed"); err != nil || o.isolation != "read_committed" {
		t.Fatalf("consume read_committed: %+v %v", o, err)
	}
	if _, err = benchFlags(t, "consume", "--isolation", "committed"); err == nil || !strings.Contains(err.Error(), "read_uncommitted or read_committed") {
		t.Fatalf("consume --isolation committed: %v", err)
	}
	if _, err := benchFlags(t, "e2e", "--isolation", "read_committed"); err == nil {
		t.Error("e2e takes --isolation")
	}
}

func TestBenchClientClaim(t *testing.T) {
	p := &produceRun{o: &clientBenchOptions{records: 250}}
	var got []int64
	for range 4 {
		got = append(got, p.claim(100))
	}
	if want := []int64{100, 100, 50, 0}; !slices.Equal(got, want) {
		t.Fatalf("claims of 100 out of 250: %v, want %v", got, want)
	}
	if p := (&produceRun{o: &clientBenchOptions{}}); p.claim(100) != 100 || p.claim(1) != 1 {
		t.Fatal("without a record bound every claim is whole")
	}
}

// TestBenchClientTransactions produces in transactions with every 4th
// aborted, then reads the topic both ways.
func TestBenchClientTransactions(t *testing.T) {
	s, err := broker.New(broker.Config{DataDir: t.TempDir(), AutoCreateTopics: true})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Shutdown(context.Background())
	ctx := context.Background()
	o := &clientBenchOptions{brokers: ln.Addr().String(), topic: "tx", partitions: 2, recordSize: 100, records: 2000,
		duration: time.Minute, producers: 2, compression: "none", acks: "all", idempotent: true, payload: "random",
		txnID: "bench", txnRecords: 50, abortEvery: 4, txnTimeout: 10 * time.Second}
	var stderr strings.Builder
	r, err := runProduce(ctx, o, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Records != 2000 || r.Transactions != 40 || r.AbortedTransactions != 10 || r.CommittedRecords != 1500 ||
		r.AbortedRecords != 500 || r.TxnLatencyMs["p50"] <= 0 {
		t.Fatalf("transactional produce: %+v\n%s", r, stderr.String())
	}
	o.records, o.duration = 0, 20*time.Second // to the end
	o.isolation = "read_uncommitted"
	if r, err = runConsume(ctx, o, io.Discard); err != nil || r.Records != 2000 || r.Bytes != 200000 || r.ControlRecords != 80 || r.FetchedBytes < r.Bytes {
		t.Fatalf("consume read_uncommitted: %+v %v", r, err)
	}
	o.isolation = "read_committed"
	if r, err = runConsume(ctx, o, io.Discard); err != nil || r.Records != 1500 || r.Bytes != 150000 || r.ControlRecords != 80 ||
		r.Isolation != "read_committed" || r.FetchedBytes < r.Bytes {
		t.Fatalf("consume read_committed: %+v %v", r, err)
	}
}
