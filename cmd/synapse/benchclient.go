package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	mrand "math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// `synapse bench produce|consume|e2e`: a Kafka load generator on franz-go
// (kgo), the way kafka-producer-perf-test works for Kafka. It talks to any
// Kafka-compatible broker. Every run is bounded by a record count and by a
// duration.

type clientBenchOptions struct {
	brokers     string
	topic       string
	partitions  int32
	recordSize  int
	records     int64
	duration    time.Duration
	producers   int
	linger      time.Duration
	compression string
	acks        string
	idempotent  bool
	rate        float64
	payload     string
	jsonOut     bool
	progress    time.Duration
	sec         clientSecurity
}

func (o *clientBenchOptions) addCommon(fs *pflag.FlagSet, records int64, duration time.Duration) {
	fs.StringVar(&o.brokers, "brokers", "127.0.0.1:9092", "seed brokers, comma separated")
	fs.StringVar(&o.topic, "topic", "synapse-bench", "topic (created with --partitions if missing)")
	fs.Int32Var(&o.partitions, "partitions", 1, "partitions of the topic if it is created")
	fs.Int64Var(&o.records, "records", records, "stop after this many records (0: no count bound; consume: read to the end)")
	fs.DurationVar(&o.duration, "duration", duration, "stop after this long")
	fs.BoolVar(&o.jsonOut, "json", false, "print the result as one JSON object")
	fs.DurationVar(&o.progress, "progress", time.Second, "progress line interval on stderr (0: none)")
	o.sec.addFlags(fs, "")
}

func (o *clientBenchOptions) addProduce(fs *pflag.FlagSet, rate float64) {
	fs.IntVar(&o.recordSize, "record-size", 1024, "value bytes per record")
	fs.IntVar(&o.producers, "producers", 1, "producer clients")
	fs.DurationVar(&o.linger, "linger", 0, "producer linger")
	fs.StringVar(&o.compression, "compression", "none", "none, gzip, snappy, lz4 or zstd")
	fs.StringVar(&o.acks, "acks", "all", "all, 1 or 0")
	fs.BoolVar(&o.idempotent, "idempotent", true, "idempotent producer (needs acks=all)")
	fs.Float64Var(&o.rate, "rate", rate, "records per second across all producers (0: as fast as possible)")
	fs.StringVar(&o.payload, "payload", "random", "random (incompressible) or text (compresses like log lines)")
}

// benchResult is what a run prints (--json: as is).
type benchResult struct {
	Workload      string             `json:"workload"`
	Records       int64              `json:"records"`
	Bytes         int64              `json:"bytes"`
	Seconds       float64            `json:"seconds"`
	RecordsPerSec float64            `json:"records_per_sec"`
	MBPerSec      float64            `json:"mb_per_sec"`
	LatencyMs     map[string]float64 `json:"latency_ms,omitempty"`
	Errors        int64              `json:"errors"`
}

func (r *benchResult) finish(elapsed time.Duration, h *latencyHist) {
	r.Seconds = elapsed.Seconds()
	if r.Seconds > 0 {
		r.RecordsPerSec = float64(r.Records) / r.Seconds
		r.MBPerSec = float64(r.Bytes) / 1e6 / r.Seconds
	}
	if h != nil {
		r.LatencyMs = h.quantilesMs()
	}
}

// quantilesMs are p50, p90, p99, p999 and max in milliseconds; nil when
// nothing was recorded.
func (h *latencyHist) quantilesMs() map[string]float64 {
	h.mu.Lock()
	n := h.n
	h.mu.Unlock()
	if n == 0 {
		return nil
	}
	m := map[string]float64{}
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}, {"p999", 0.999}, {"max", 1}} {
		m[q.name] = float64(h.quantile(q.q)) / 1e3
	}
	return m
}

func (r *benchResult) print(w io.Writer, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(r)
	}
	fmt.Fprintf(w, "%s: %d records, %.1f MB in %.2f s: %.0f records/s, %.1f MB/s", r.Workload, r.Records, float64(r.Bytes)/1e6, r.Seconds, r.RecordsPerSec, r.MBPerSec)
	if r.Errors > 0 {
		fmt.Fprintf(w, ", %d errors", r.Errors)
	}
	fmt.Fprintln(w)
	if r.LatencyMs != nil {
		fmt.Fprintf(w, "latency ms: p50 %.3f  p90 %.3f  p99 %.3f  p999 %.3f  max %.3f\n",
			r.LatencyMs["p50"], r.LatencyMs["p90"], r.LatencyMs["p99"], r.LatencyMs["p999"], r.LatencyMs["max"])
	}
	if r.Errors > 0 {
		return fmt.Errorf("%d records failed", r.Errors)
	}
	return nil
}

// latencyHist is a log-linear histogram of microseconds: exact below 1 ms,
// then 64 buckets per power of two (1.6% precision). Fixed memory.
type latencyHist struct {
	mu     sync.Mutex
	counts [1024 + 40*64]int64
	n      int64
}

func histIndex(us int64) int {
	if us < 1024 {
		return int(max(us, 0))
	}
	e := 63 - bits.LeadingZeros64(uint64(us)) // >= 10
	sub := (us >> (e - 6)) & 63
	return min(1024+(e-10)*64+int(sub), len(latencyHist{}.counts)-1)
}

func histValue(i int) int64 {
	if i < 1024 {
		return int64(i)
	}
	e := (i-1024)/64 + 10
	sub := int64((i - 1024) % 64)
	return (1 << e) + sub<<(e-6) + (1<<(e-6))/2
}

func (h *latencyHist) add(d time.Duration) {
	i := histIndex(d.Microseconds())
	h.mu.Lock()
	h.counts[i]++
	h.n++
	h.mu.Unlock()
}

// quantile returns the value at q (0..1) in microseconds.
func (h *latencyHist) quantile(q float64) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	want := int64(math.Ceil(q * float64(h.n)))
	want = max(want, 1)
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= want {
			return histValue(i)
		}
	}
	return 0
}

func compressionCodec(name string) (kgo.CompressionCodec, error) {
	switch strings.ToLower(name) {
	case "none", "":
		return kgo.NoCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	}
	return kgo.NoCompression(), fmt.Errorf("unknown compression %q (none, gzip, snappy, lz4, zstd)", name)
}

func (o *clientBenchOptions) seeds() []string { return strings.Split(o.brokers, ",") }

// clientOpts are the options of every client: the seeds, then TLS and SASL
// as the flags ask.
func (o *clientBenchOptions) clientOpts(more ...kgo.Opt) ([]kgo.Opt, error) {
	sec, err := o.sec.kgoOpts()
	if err != nil {
		return nil, err
	}
	return append(append([]kgo.Opt{kgo.SeedBrokers(o.seeds()...)}, sec...), more...), nil
}

func (o *clientBenchOptions) producerOpts() ([]kgo.Opt, error) {
	codec, err := compressionCodec(o.compression)
	if err != nil {
		return nil, err
	}
	opts, err := o.clientOpts(kgo.DefaultProduceTopic(o.topic), kgo.ProducerBatchCompression(codec),
		kgo.ProducerLinger(o.linger), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.MaxBufferedRecords(100_000))
	if err != nil {
		return nil, err
	}
	switch o.acks {
	case "all", "-1":
		opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
	case "1":
		opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()))
	case "0":
		opts = append(opts, kgo.RequiredAcks(kgo.NoAck()))
	default:
		return nil, fmt.Errorf("--acks %q: all, 1 or 0", o.acks)
	}
	if !o.idempotent || o.acks != "all" && o.acks != "-1" {
		opts = append(opts, kgo.DisableIdempotentWrite())
	}
	return opts, nil
}

// ensureTopic creates the topic if it does not exist.
func (o *clientBenchOptions) ensureTopic(ctx context.Context) error {
	opts, err := o.clientOpts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, o.partitions, 1, nil, o.topic)
	if err == nil {
		err = resp.Err
	}
	if errors.Is(err, kerr.TopicAlreadyExists) {
		return nil
	}
	return err
}

// payloadSource builds record values: random bytes, or text that
// compresses like log lines.
func payloadSource(kind string, size int) (func() []byte, error) {
	var buf []byte
	switch kind {
	case "random":
		buf = make([]byte, 1<<20+size)
		rand.Read(buf)
	case "text":
		words := strings.Fields("the quick broker appends a record batch to the partition log and fsyncs it with group commit " +
			"then answers the producer while a consumer fetches the tail of the log over loopback at offset")
		var text strings.Builder
		r := mrand.New(mrand.NewPCG(1, 2))
		for text.Len() < 1<<20+size {
			fmt.Fprintf(&text, "%d level=info msg=%q id=%d\n", 1700000000000+r.IntN(1e6), words[r.IntN(len(words))]+" "+words[r.IntN(len(words))], r.IntN(1e9))
		}
		buf = []byte(text.String())
	default:
		return nil, fmt.Errorf("--payload %q: random or text", kind)
	}
	var off atomic.Int64
	return func() []byte {
		i := int(off.Add(int64(size)*7+13) % int64(len(buf)-size))
		return buf[i : i+size]
	}, nil
}

// progressLine prints records/s every interval until stop is closed.
func progressLine(w io.Writer, every time.Duration, name string, count *atomic.Int64, stop <-chan struct{}) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	start, last, lastN := time.Now(), time.Now(), int64(0)
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			n := count.Load()
			fmt.Fprintf(w, "%s: %6.1fs %12d records  %10.0f records/s\n", name, now.Sub(start).Seconds(), n, float64(n-lastN)/now.Sub(last).Seconds())
			last, lastN = now, n
		}
	}
}

// runProduce produces o.records records (split over the producers) or for
// o.duration, at o.rate if set, timing each record from Produce to its ack.
func runProduce(ctx context.Context, o *clientBenchOptions, stderr io.Writer) (*benchResult, error) {
	if err := o.ensureTopic(ctx); err != nil {
		return nil, fmt.Errorf("create topic %s: %w", o.topic, err)
	}
	opts, err := o.producerOpts()
	if err != nil {
		return nil, err
	}
	value, err := payloadSource(o.payload, o.recordSize)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var h latencyHist
	var sent, acked, failed atomic.Int64
	stop := make(chan struct{})
	go progressLine(stderr, o.progress, "produce", &acked, stop)
	var firstErr atomic.Pointer[error]
	start := time.Now()
	var wg sync.WaitGroup
	for p := 0; p < max(o.producers, 1); p++ {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			var interval time.Duration
			if o.rate > 0 {
				interval = time.Duration(float64(time.Second) * float64(max(o.producers, 1)) / o.rate)
			}
			next := time.Now()
			for ctx.Err() == nil {
				if o.records > 0 && sent.Add(1) > o.records {
					break
				}
				if interval > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					}
					next = next.Add(interval)
				}
				t0 := time.Now()
				cl.Produce(ctx, &kgo.Record{Value: value()}, func(_ *kgo.Record, err error) {
					if err != nil {
						if ctx.Err() == nil && failed.Add(1) == 1 {
							firstErr.Store(&err)
						}
						return
					}
					h.add(time.Since(t0))
					acked.Add(1)
				})
			}
			cl.Flush(context.Background())
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	r := &benchResult{Workload: "produce", Records: acked.Load(), Bytes: acked.Load() * int64(o.recordSize), Errors: failed.Load()}
	r.finish(elapsed, &h)
	if e := firstErr.Load(); e != nil {
		fmt.Fprintf(stderr, "first produce error: %v\n", *e)
	}
	return r, nil
}

// runConsume reads the topic from offset 0 until o.records records (or,
// with --records 0, until the ends as of the start) or o.duration.
func runConsume(ctx context.Context, o *clientBenchOptions, stderr io.Writer) (*benchResult, error) {
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	opts, err := o.clientOpts(kgo.ConsumeTopics(o.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(16<<20))
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	want := o.records
	if want <= 0 {
		ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, o.topic)
		if err != nil {
			return nil, err
		}
		ends.Each(func(e kadm.ListedOffset) { want += e.Offset })
	}
	var n, bytes atomic.Int64
	stop := make(chan struct{})
	go progressLine(stderr, o.progress, "consume", &n, stop)
	start := time.Now()
	var errs int64
	for n.Load() < want && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachError(func(_ string, _ int32, err error) {
			if ctx.Err() == nil {
				errs++
				fmt.Fprintf(stderr, "fetch error: %v\n", err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			n.Add(1)
			bytes.Add(int64(len(r.Value)))
		})
	}
	elapsed := time.Since(start)
	close(stop)
	r := &benchResult{Workload: "consume", Records: n.Load(), Bytes: bytes.Load(), Errors: errs}
	r.finish(elapsed, nil)
	return r, nil
}

// runE2E produces at o.rate for o.duration (or o.records) and consumes the
// same topic from its end, timing each record from send to receipt (the
// send time travels in the first 8 bytes of the value).
func runE2E(ctx context.Context, o *clientBenchOptions, stderr io.Writer) (*benchResult, error) {
	if err := o.ensureTopic(ctx); err != nil {
		return nil, fmt.Errorf("create topic %s: %w", o.topic, err)
	}
	opts, err := o.producerOpts()
	if err != nil {
		return nil, err
	}
	pr, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	copts, err := o.clientOpts(kgo.ConsumeTopics(o.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(time.Second))
	if err != nil {
		return nil, err
	}
	cons, err := kgo.NewClient(copts...)
	if err != nil {
		return nil, err
	}
	defer cons.Close()
	// Join at the end before producing.
	jctx, jcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	cons.PollFetches(jctx)
	jcancel()

	ctx, cancel := context.WithTimeout(ctx, o.duration+10*time.Second)
	defer cancel()
	size := max(o.recordSize, 8)
	var h latencyHist
	var sent, got, failed atomic.Int64
	stop := make(chan struct{})
	go progressLine(stderr, o.progress, "e2e", &got, stop)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if prodDone(stop) && got.Load() >= sent.Load()-failed.Load() {
				return
			}
			pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			fs := cons.PollFetches(pctx)
			pcancel()
			now := time.Now().UnixNano()
			fs.EachRecord(func(r *kgo.Record) {
				if len(r.Value) >= 8 {
					h.add(time.Duration(now - int64(binary.BigEndian.Uint64(r.Value))))
				}
				got.Add(1)
			})
		}
	}()
	rate := o.rate
	if rate <= 0 {
		rate = 5000
	}
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	next := start
	end := start.Add(o.duration)
	for time.Now().Before(end) && (o.records <= 0 || sent.Load() < o.records) && ctx.Err() == nil {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(interval)
		v := make([]byte, size)
		binary.BigEndian.PutUint64(v, uint64(time.Now().UnixNano()))
		sent.Add(1)
		pr.Produce(ctx, &kgo.Record{Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Add(1)
			}
		})
	}
	pr.Flush(ctx)
	elapsed := time.Since(start)
	close(stop)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	cancel()
	<-done
	r := &benchResult{Workload: "e2e", Records: got.Load(), Bytes: got.Load() * int64(size), Errors: failed.Load()}
	r.finish(elapsed, &h)
	if missing := sent.Load() - failed.Load() - got.Load(); missing > 0 {
		fmt.Fprintf(stderr, "e2e: %d records produced but not consumed\n", missing)
		r.Errors += missing
	}
	return r, nil
}

func prodDone(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// benchClientSpec describes one client benchmark command.
type benchClientSpec struct {
	use, short string
	produce    bool // takes the producer flags
	records    int64
	duration   time.Duration
	rate       float64
	run        func(context.Context, *clientBenchOptions, io.Writer) (*benchResult, error)
}

func newBenchClientCommands() []*cobra.Command {
	var cmds []*cobra.Command
	for _, sp := range []benchClientSpec{
		{use: "produce", short: "Produce records as fast as possible (or at --rate) and report throughput and ack latency",
			produce: true, records: 1_000_000, duration: 5 * time.Minute, run: runProduce},
		{use: "consume", short: "Consume a topic from offset 0 and report throughput",
			records: 0, duration: 5 * time.Minute, run: runConsume},
		{use: "e2e", short: "Produce at --rate and consume the tail; report produce-to-consume latency",
			produce: true, records: 0, duration: 20 * time.Second, rate: 5000, run: runE2E},
	} {
		cmds = append(cmds, newBenchClientCommand(sp))
	}
	return append(cmds, newBenchAuthCommand())
}

func newBenchClientCommand(sp benchClientSpec) *cobra.Command {
	o := &clientBenchOptions{}
	cmd := &cobra.Command{
		Use:   sp.use,
		Short: sp.short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.duration <= 0 {
				return errors.New("--duration must be positive: every run is bounded in time")
			}
			ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			r, err := sp.run(ctx, o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return r.print(cmd.OutOrStdout(), o.jsonOut)
		},
	}
	o.addCommon(cmd.Flags(), sp.records, sp.duration)
	if sp.produce {
		o.addProduce(cmd.Flags(), sp.rate)
	}
	return cmd
}
