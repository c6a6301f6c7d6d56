package main

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/synapsebroker/synapse/broker"
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
