package main

// The HTTP API block (issue 18): a fresh Synapse broker per round with its
// HTTP API on a loopback side port (docs/http-api.md), against the same
// broker's Kafka protocol with the same records. There is no reference
// broker with an HTTP API (kfake has none), so the comparison is HTTP
// against Kafka on Synapse itself:
//
//   - H1: POST /produce/batch throughput: -http-records records of 1 KiB in
//     batches of -http-batch records (the binary framing), -http-workers
//     concurrent HTTP clients, each to a partition of its own; against
//     franz-go producing the same records (acks=all, not idempotent as
//     the HTTP API's produce is not, one producer per worker, each
//     flushing a batch of -http-batch records at a time).
//     Records/s and MB/s.
//   - H2: POST /produce latency: -http-latency-requests single 100 B
//     records one after another (acks=all semantics: answered once
//     durable); against franz-go's ProduceSync of one record at a time.
//     p50 and p99.
//
// Within a round the two protocols run A B B A (halves), reversed in odd
// rounds.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type httpOptions struct {
	rounds   int // < 0: as -rounds; 0: no HTTP block
	only     bool
	records  int64
	batch    int
	workers  int
	requests int
}

func httpFlags(o *httpOptions) {
	flag.IntVar(&o.rounds, "http-rounds", -1, "rounds of the HTTP API block, H1 and H2 (-1: as -rounds; 0: skip it)")
	flag.BoolVar(&o.only, "http-only", false, "run only the HTTP API block")
	flag.Int64Var(&o.records, "http-records", 200_000, "records (1 KiB) of each H1 run")
	flag.IntVar(&o.batch, "http-batch", 500, "records per POST /produce/batch (and per franz-go flush)")
	flag.IntVar(&o.workers, "http-workers", 4, "concurrent HTTP clients (and franz-go producers) of H1, one partition each")
	flag.IntVar(&o.requests, "http-latency-requests", 2000, "POST /produce requests (and franz-go single-record produces) of H2")
}

// HTTP block metric names; brokers "http" and "kafka".
const (
	h1Records = "H1 produce/batch records/s"
	h1MB      = "H1 produce/batch MB/s"
	h2P50     = "H2 produce latency p50 ms"
	h2P99     = "H2 produce latency p99 ms"
)

func (r *runner) httpBlock() error {
	for round := 0; round < r.o.http.rounds; round++ {
		fmt.Fprintf(os.Stderr, "HTTP API round %d/%d\n", round+1, r.o.http.rounds)
		if err := r.httpSlot(round); err != nil {
			return fmt.Errorf("HTTP API: %w", err)
		}
	}
	return nil
}

func (r *runner) httpSlot(round int) error {
	addrs, err := freeAddrs(2)
	if err != nil {
		return err
	}
	httpAddr := addrs[1]
	t := target{"synapse", r.o.synapse, func(addr, dir string) []string {
		return []string{"serve", "--listen", addr, "--advertised-addr", addr, "--data-dir", dir, "--http-listen", httpAddr,
			"--http-api", "on", "--log-level", "warn"}
	}, nil, nil}
	dir, err := os.MkdirTemp("", "synapse-bench-http-")
	if err != nil {
		return err
	}
	b, _, err := start(t, addrs[0], dir)
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	defer b.done()
	base := "http://" + httpAddr
	o := r.o.http
	// Not idempotent, as the HTTP API's produce is not (a retried POST
	// cannot be told from a new one): the same work on both sides.
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addr), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DisableIdempotentWrite(), kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(4<<20), kgo.MaxBufferedRecords(o.batch*2))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	adm := kadm.NewClient(cl)
	mb := strconv.Itoa(8 << 20)
	for _, topic := range []string{"h1-http", "h1-kafka", "h2-http", "h2-kafka"} {
		parts := int32(o.workers)
		if topic[1] == '2' {
			parts = 1
		}
		if _, err := adm.CreateTopic(ctx, parts, 1, map[string]*string{"max.message.bytes": &mb}, topic); err != nil {
			return err
		}
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.workers * 2}, Timeout: time.Minute}

	value := make([]byte, 1024)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	var framed []byte
	for range o.batch {
		framed = binary.AppendVarint(framed, -1) // null key
		framed = binary.AppendVarint(framed, int64(len(value)))
		framed = append(framed, value...)
		framed = binary.AppendVarint(framed, 0) // no headers
	}
	per := max(o.records/int64(o.workers)/int64(o.batch)/2, 1) // batches per worker per half

	var acc [2]sums // 0 http, 1 kafka
	var lat [2][]time.Duration
	for _, i := range schedule(2, 2, round%2 == 1) {
		t0 := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, o.workers)
		for w := range o.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					var err error
					if i == 0 {
						err = postBatch(hc, fmt.Sprintf("%s/produce/batch?topic=h1-http&partition=%d", base, w), framed)
					} else {
						rs := make([]*kgo.Record, o.batch)
						for k := range rs {
							rs[k] = &kgo.Record{Topic: "h1-kafka", Partition: int32(w), Value: value}
						}
						err = cl.ProduceSync(ctx, rs...).FirstErr()
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		n := per * int64(o.workers) * int64(o.batch)
		acc[i].bytes += n * int64(len(value))
		acc[i].seconds += time.Since(t0).Seconds()

		// H2: one record at a time.
		small := value[:100]
		for range o.requests / 2 {
			t1 := time.Now()
			if i == 0 {
				err = postBatch(hc, base+"/produce?topic=h2-http&partition=0", small, "application/octet-stream")
			} else {
				err = cl.ProduceSync(ctx, &kgo.Record{Topic: "h2-kafka", Value: small}).FirstErr()
			}
			if err != nil {
				return err
			}
			lat[i] = append(lat[i], time.Since(t1))
		}
	}
	for i, n := range []string{"http", "kafka"} {
		recs := float64(acc[i].bytes) / 1024
		r.add(h1Records, n, recs/acc[i].seconds)
		r.add(h1MB, n, acc[i].mbPerSec())
		r.add(h2P50, n, pct(lat[i], 0.50))
		r.add(h2P99, n, pct(lat[i], 0.99))
	}
	return nil
}

// postBatch posts body (binary framing unless ct says otherwise) and
// checks for a 200.
func postBatch(hc *http.Client, url string, body []byte, ct ...string) error {
	typ := "application/x-synapse-records"
	if len(ct) > 0 {
		typ = ct[0]
	}
	res, err := hc.Post(url, typ, bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer res.Body.Close()
	msg, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return errors.New(res.Status + ": " + string(msg))
	}
	return nil
}

// pct is the q-quantile of ds in milliseconds.
func pct(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[min(int(q*float64(len(s))), len(s)-1)].Microseconds()) / 1e3
}

func (r *runner) reportHTTP(w io.Writer) {
	o := r.o.http
	fmt.Fprintf(w, "\nHTTP API (Synapse only; no reference broker has one): a fresh broker per round, %d rounds, HTTP against the same broker's Kafka protocol (franz-go), A B B A in halves.\n", o.rounds)
	fmt.Fprintf(w, "H1: %d records of 1 KiB per protocol and round in batches of %d (POST /produce/batch with the binary framing; franz-go ProduceSync of %d records), %d workers on a partition each.\n",
		o.records, o.batch, o.batch, o.workers)
	fmt.Fprintf(w, "H2: %d single 100 B records one after another (POST /produce; franz-go ProduceSync of one record), acks=all, durable.\n\n", o.requests)
	fmt.Fprintln(w, "| workload | HTTP median (min–max) | Kafka protocol median (min–max) | HTTP/Kafka |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, m := range []string{h1Records, h1MB, h2P50, h2P99} {
		h, k := r.samples[m]["http"], r.samples[m]["kafka"]
		ratio := "—"
		if median(k) > 0 {
			ratio = fmt.Sprintf("%.2f×", median(h)/median(k))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", m, span(h), span(k), ratio)
	}
}
