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
	"slices"
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
// duration. `produce --transactional-id P` produces in transactions (each
// producer client its own transactional id, P-0, P-1, ...), aborting every
// --abort-every-th; `consume --isolation read_committed` reads only what
// committed.

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

	// produce only: transactions (txnID empty: none)
	txnID      string
	txnRecords int
	abortEvery int
	txnTimeout time.Duration

	// consume only
	isolation string
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

// addTxn registers produce's transaction flags.
func (o *clientBenchOptions) addTxn(fs *pflag.FlagSet) {
	fs.StringVar(&o.txnID, "transactional-id", "", "produce in transactions; producer client i uses the transactional id PREFIX-i (empty: no transactions)")
	fs.IntVar(&o.txnRecords, "txn-records", 100, "records per transaction (with --transactional-id)")
	fs.IntVar(&o.abortEvery, "abort-every", 0, "abort every K-th transaction, counted over all producers (10: 10% aborted; 0: commit all)")
	fs.DurationVar(&o.txnTimeout, "txn-timeout", 40*time.Second, "transaction.timeout.ms the producers ask for (with --transactional-id)")
}

// addConsume registers consume's flags.
func (o *clientBenchOptions) addConsume(fs *pflag.FlagSet) {
	fs.StringVar(&o.isolation, "isolation", "read_uncommitted", "read_uncommitted or read_committed (stops at the last stable offset, skips aborted transactions)")
}

// validate checks the flags that depend on each other; fs says which were
// set on the command line.
func (o *clientBenchOptions) validate(fs *pflag.FlagSet) error {
	if o.duration <= 0 {
		return errors.New("--duration must be positive: every run is bounded in time")
	}
	if o.txnID == "" {
		for _, f := range []string{"txn-records", "abort-every", "txn-timeout"} {
			if fs.Changed(f) {
				return fmt.Errorf("--%s needs --transactional-id", f)
			}
		}
	} else {
		if o.txnRecords < 1 {
			return fmt.Errorf("--txn-records %d: at least 1", o.txnRecords)
		}
		if o.abortEvery < 0 {
			return fmt.Errorf("--abort-every %d: 0 (never) or more", o.abortEvery)
		}
		if o.txnTimeout <= 0 {
			return fmt.Errorf("--txn-timeout %s: must be positive", o.txnTimeout)
		}
		if !o.idempotent || o.acks != "all" && o.acks != "-1" {
			return errors.New("--transactional-id needs an idempotent producer with --acks all")
		}
	}
	if fs.Lookup("isolation") != nil {
		if _, err := isolationLevel(o.isolation); err != nil {
			return err
		}
	}
	return nil
}

func isolationLevel(name string) (kgo.IsolationLevel, error) {
	switch name {
	case "read_uncommitted", "":
		return kgo.ReadUncommitted(), nil
	case "read_committed":
		return kgo.ReadCommitted(), nil
	}
	return kgo.ReadUncommitted(), fmt.Errorf("--isolation %q: read_uncommitted or read_committed", name)
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

	// Transactional produce: transactions ended (committed and aborted),
	// how many aborted, the records of each kind (Records counts both),
	// and the time from BeginTransaction to EndTransaction's answer.
	Transactions        int64              `json:"transactions,omitempty"`
	AbortedTransactions int64              `json:"aborted_transactions,omitempty"`
	CommittedRecords    int64              `json:"committed_records,omitempty"`
	AbortedRecords      int64              `json:"aborted_records,omitempty"`
	TxnLatencyMs        map[string]float64 `json:"txn_latency_ms,omitempty"`

	// Consume: the isolation level, the transaction markers (control
	// records) read past and the bytes of every record batch the client
	// decoded (aborted and control batches included, uncompressed);
	// Records and Bytes count data records only.
	Isolation      string `json:"isolation,omitempty"`
	ControlRecords int64  `json:"control_records,omitempty"`
	FetchedBytes   int64  `json:"fetched_bytes,omitempty"`
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
	if r.Transactions > 0 {
		fmt.Fprintf(w, "transactions: %d (%d aborted), records committed %d, aborted %d\n", r.Transactions, r.AbortedTransactions, r.CommittedRecords, r.AbortedRecords)
	}
	if r.ControlRecords > 0 {
		fmt.Fprintf(w, "%s: %d transaction markers read past\n", r.Isolation, r.ControlRecords)
	}
	if r.LatencyMs != nil {
		fmt.Fprintf(w, "latency ms: p50 %.3f  p90 %.3f  p99 %.3f  p999 %.3f  max %.3f\n",
			r.LatencyMs["p50"], r.LatencyMs["p90"], r.LatencyMs["p99"], r.LatencyMs["p999"], r.LatencyMs["max"])
	}
	if t := r.TxnLatencyMs; t != nil {
		fmt.Fprintf(w, "transaction ms (begin to end): p50 %.3f  p90 %.3f  p99 %.3f  p999 %.3f  max %.3f\n", t["p50"], t["p90"], t["p99"], t["p999"], t["max"])
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
// With --transactional-id every producer produces in transactions of
// o.txnRecords records, one transaction at a time as a transactional
// producer must: BeginTransaction, produce, Flush, EndTransaction.
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
	p := &produceRun{o: o, value: value}
	stop := make(chan struct{})
	go progressLine(stderr, o.progress, "produce", &p.acked, stop)
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < max(o.producers, 1); i++ {
		copts := opts
		if o.txnID != "" {
			copts = append(slices.Clip(opts), kgo.TransactionalID(fmt.Sprintf("%s-%d", o.txnID, i)), kgo.TransactionTimeout(o.txnTimeout))
		}
		cl, err := kgo.NewClient(copts...)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if o.txnID != "" {
				p.transactions(ctx, cl)
			} else {
				p.plain(ctx, cl)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	r := &benchResult{Workload: "produce", Records: p.acked.Load(), Bytes: p.acked.Load() * int64(o.recordSize), Errors: p.failed.Load()}
	r.finish(elapsed, &p.h)
	if o.txnID != "" {
		r.Transactions, r.AbortedTransactions = p.txns.Load(), p.abortedTxns.Load()
		r.CommittedRecords, r.AbortedRecords = p.committed.Load(), p.aborted.Load()
		r.TxnLatencyMs = p.txnH.quantilesMs()
	}
	if e := p.firstErr.Load(); e != nil {
		fmt.Fprintf(stderr, "first produce error: %v\n", *e)
	}
	return r, nil
}

// produceRun is the state runProduce's producers share.
type produceRun struct {
	o     *clientBenchOptions
	value func() []byte
	h     latencyHist // Produce to ack, per record
	txnH  latencyHist // BeginTransaction to EndTransaction's answer

	sent, acked, failed atomic.Int64
	firstErr            atomic.Pointer[error]

	txnSeq, txns, abortedTxns atomic.Int64
	committed, aborted        atomic.Int64 // records
}

// claim takes up to k of the records left to send: how many it got.
func (p *produceRun) claim(k int64) int64 {
	if p.o.records <= 0 {
		return k
	}
	end := p.sent.Add(k)
	return max(0, min(k, p.o.records-(end-k)))
}

func (p *produceRun) fail(n int64, err error) {
	if p.failed.Add(n) == n {
		p.firstErr.Store(&err)
	}
}

// pacer spaces one producer's records at o.rate / o.producers.
type pacer struct {
	interval time.Duration
	next     time.Time
}

func (p *produceRun) pacer() *pacer {
	var interval time.Duration
	if p.o.rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(max(p.o.producers, 1)) / p.o.rate)
	}
	return &pacer{interval: interval, next: time.Now()}
}

func (pc *pacer) wait() {
	if pc.interval <= 0 {
		return
	}
	if d := time.Until(pc.next); d > 0 {
		time.Sleep(d)
	}
	pc.next = pc.next.Add(pc.interval)
}

// produce sends one record; its ack adds to p.acked (and to txnAcked if
// not nil), its failure to p.failed (and to txnFailed) unless ctx ended.
func (p *produceRun) produce(ctx context.Context, cl *kgo.Client, txnAcked, txnFailed *atomic.Int64) {
	t0 := time.Now()
	cl.Produce(ctx, &kgo.Record{Value: p.value()}, func(_ *kgo.Record, err error) {
		if err != nil {
			if txnFailed != nil {
				txnFailed.Add(1)
			}
			if ctx.Err() == nil {
				p.fail(1, err)
			}
			return
		}
		p.h.add(time.Since(t0))
		p.acked.Add(1)
		if txnAcked != nil {
			txnAcked.Add(1)
		}
	})
}

// plain is one producer without transactions.
func (p *produceRun) plain(ctx context.Context, cl *kgo.Client) {
	pace := p.pacer()
	for ctx.Err() == nil && p.claim(1) == 1 {
		pace.wait()
		p.produce(ctx, cl, nil, nil)
	}
	cl.Flush(context.Background())
}

// endTimeout bounds a Flush and EndTransaction: they run without the run's
// context, since canceling an EndTransaction leaves its outcome unknown.
const endTimeout = 30 * time.Second

// transactions is one transactional producer: transactions of o.txnRecords
// records until the records or the time are used up. Every
// o.abortEvery-th transaction (numbered over all producers as they begin)
// aborts, as does one the run's end or a failed record cut short; after a
// failure the producer stops.
func (p *produceRun) transactions(ctx context.Context, cl *kgo.Client) {
	pace := p.pacer()
	for ctx.Err() == nil {
		n := p.claim(int64(p.o.txnRecords))
		if n == 0 {
			return
		}
		t0 := time.Now()
		if err := cl.BeginTransaction(); err != nil {
			p.fail(n, fmt.Errorf("BeginTransaction: %w", err))
			return
		}
		seq := p.txnSeq.Add(1)
		var acked, failed atomic.Int64
		for range n {
			if ctx.Err() != nil {
				break
			}
			pace.wait()
			p.produce(ctx, cl, &acked, &failed)
		}
		fctx, fcancel := context.WithTimeout(context.Background(), endTimeout)
		ferr := cl.Flush(fctx)
		fcancel()
		commit := kgo.TryCommit
		if ferr != nil || failed.Load() > 0 || ctx.Err() != nil || p.o.abortEvery > 0 && seq%int64(p.o.abortEvery) == 0 {
			commit = kgo.TryAbort
		}
		ectx, ecancel := context.WithTimeout(context.Background(), endTimeout)
		err := cl.EndTransaction(ectx, commit)
		ecancel()
		if err != nil {
			what := "commit"
			if commit == kgo.TryAbort {
				what = "abort"
			}
			p.fail(max(acked.Load(), 1), fmt.Errorf("EndTransaction (%s): %w", what, err))
			return
		}
		p.txnH.add(time.Since(t0))
		p.txns.Add(1)
		if commit == kgo.TryCommit {
			p.committed.Add(acked.Load())
		} else {
			p.abortedTxns.Add(1)
			p.aborted.Add(acked.Load())
		}
		if ferr != nil {
			p.fail(1, fmt.Errorf("flush: %w", ferr))
			return
		}
		if failed.Load() > 0 {
			return
		}
	}
}

// runConsume reads the topic from offset 0 until o.records records (or,
// with --records 0, until the ends as of the start: the high watermarks,
// or with read_committed the last stable offsets) or o.duration. It keeps
// control records to see where each partition's end is (a partition can
// end in a transaction marker, and a read_committed consumer never sees
// an aborted record), but counts only data records.
func runConsume(ctx context.Context, o *clientBenchOptions, stderr io.Writer) (*benchResult, error) {
	level, err := isolationLevel(o.isolation)
	if err != nil {
		return nil, err
	}
	committed := level == kgo.ReadCommitted()
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var fetched fetchedBytes
	opts, err := o.clientOpts(kgo.ConsumeTopics(o.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(16<<20),
		kgo.FetchIsolationLevel(level), kgo.KeepControlRecords(), kgo.WithHooks(&fetched))
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	want := o.records
	ends := map[int32]int64{} // with --records 0: partition → the end offset still to reach
	if want <= 0 {
		adm := kadm.NewClient(cl)
		list := adm.ListEndOffsets
		if committed {
			list = adm.ListCommittedOffsets
		}
		listed, err := list(ctx, o.topic)
		if err == nil {
			err = listed.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("list end offsets of %s: %w", o.topic, err)
		}
		listed.Each(func(e kadm.ListedOffset) {
			if e.Offset > 0 {
				ends[e.Partition] = e.Offset
			}
		})
	}
	var n, bytes atomic.Int64
	var control int64
	stop := make(chan struct{})
	go progressLine(stderr, o.progress, "consume", &n, stop)
	start := time.Now()
	var errs int64
	for ctx.Err() == nil && (want > 0 && n.Load() < want || want <= 0 && len(ends) > 0) {
		fs := cl.PollFetches(ctx)
		fs.EachError(func(_ string, _ int32, err error) {
			if ctx.Err() == nil {
				errs++
				fmt.Fprintf(stderr, "fetch error: %v\n", err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := ends[r.Partition]; ok && r.Offset+1 >= end {
				delete(ends, r.Partition)
			}
			if r.Attrs.IsControl() {
				control++
				return
			}
			n.Add(1)
			bytes.Add(int64(len(r.Value)))
		})
	}
	elapsed := time.Since(start)
	close(stop)
	r := &benchResult{Workload: "consume", Records: n.Load(), Bytes: bytes.Load(), Errors: errs, ControlRecords: control, FetchedBytes: fetched.Load()}
	r.Isolation = "read_uncommitted"
	if committed {
		r.Isolation = "read_committed"
	}
	r.finish(elapsed, nil)
	return r, nil
}

// fetchedBytes adds up the record batches a consumer decodes.
type fetchedBytes struct{ atomic.Int64 }

func (f *fetchedBytes) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	f.Add(int64(m.UncompressedBytes))
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
	txn        bool // and the transaction flags
	consume    bool // takes the consumer flags
	records    int64
	duration   time.Duration
	rate       float64
	run        func(context.Context, *clientBenchOptions, io.Writer) (*benchResult, error)
}

// benchClientSpecs are produce, consume and e2e.
func benchClientSpecs() []benchClientSpec {
	return []benchClientSpec{
		{use: "produce", short: "Produce records as fast as possible (or at --rate) and report throughput and ack latency",
			produce: true, txn: true, records: 1_000_000, duration: 5 * time.Minute, run: runProduce},
		{use: "consume", short: "Consume a topic from offset 0 and report throughput",
			consume: true, records: 0, duration: 5 * time.Minute, run: runConsume},
		{use: "e2e", short: "Produce at --rate and consume the tail; report produce-to-consume latency",
			produce: true, records: 0, duration: 20 * time.Second, rate: 5000, run: runE2E},
	}
}

func newBenchClientCommands() []*cobra.Command {
	var cmds []*cobra.Command
	for _, sp := range benchClientSpecs() {
		cmds = append(cmds, newBenchClientCommand(sp))
	}
	return append(cmds, newBenchAuthCommand())
}

func newBenchClientCommand(sp benchClientSpec) *cobra.Command {
	cmd, _ := newBenchClientCommandOpts(sp)
	return cmd
}

// newBenchClientCommandOpts is newBenchClientCommand with the options its
// flags fill in.
func newBenchClientCommandOpts(sp benchClientSpec) (*cobra.Command, *clientBenchOptions) {
	o := &clientBenchOptions{}
	cmd := &cobra.Command{
		Use:   sp.use,
		Short: sp.short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(cmd.Flags()); err != nil {
				return err
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
	if sp.txn {
		o.addTxn(cmd.Flags())
	}
	if sp.consume {
		o.addConsume(cmd.Flags())
	}
	return cmd, o
}
