package main

// The log cleaner block (issue 19, Synapse only): a fresh broker data
// directory per round, with the tier off (--tier none) and the HTTP side
// port on loopback for /metrics.
//
//   - CL1: cleaner throughput. -cleaner-records records of 1 KiB whose keys
//     are drawn from a tenth as many unique keys go to a compacted topic
//     (segment.bytes 16 MiB, so the data seals; min.cleanable.dirty.ratio
//     0.01) on a broker with its cleaner off. The broker is stopped, the
//     partition's .log files are copied (read + write to a new file in the
//     same directory, 1 MiB buffer, fsync at the end: the plain copy), and
//     the broker restarts with --cleaner-io-max-bytes-per-second 0
//     (unbounded) and --cleaner-backoff 200ms. Cleaner MB/s: the sealed
//     segments' bytes (those copied) over the time from the
//     broker's exec plus the 200 ms backoff to the first completed clean
//     (synapse_cleaner_cleans_total, polled every 20 ms). The counters move
//     at the end of a clean only, so the start is the earliest the cleaner
//     could begin: the figure is a lower bound. The cleaner's own read
//     counter (synapse_cleaner_read_bytes_total, about 3× the segments'
//     bytes: it reads the dirty range more than once) over the same time
//     is shown for reference.
//   - CL2: produce latency while the cleaner runs at its default rate
//     (64 MiB/s). As many records again go to the compacted topic with the
//     cleaner off; then, cleaner still off, single 1 KiB records go to
//     another topic at -cleaner-latency-rate for -cleaner-latency-duration
//     (acks=all, idempotent, linger 0): the baseline. The broker restarts
//     with the cleaner on at its default rate and the same produce runs
//     once the cleaner has had its 200 ms backoff; the clean must not have
//     finished by the end of the window (checked) for the run to count.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type cleanerOptions struct {
	rounds  int // < 0: as -rounds; 0: no cleaner block
	only    bool
	records int
	latRate int
	latDur  time.Duration
}

func cleanerFlags(o *cleanerOptions) {
	flag.IntVar(&o.rounds, "cleaner-rounds", 1, "rounds of the log cleaner block, CL1 and CL2 (-1: as -rounds; 0: skip it)")
	flag.BoolVar(&o.only, "cleaner-only", false, "run only the log cleaner block")
	flag.IntVar(&o.records, "cleaner-records", 200_000, "records (1 KiB, keys from a tenth as many unique keys) of each dirty fill")
	flag.IntVar(&o.latRate, "cleaner-latency-rate", 2000, "single-record produces per second of CL2")
	flag.DurationVar(&o.latDur, "cleaner-latency-duration", 3*time.Second, "duration of each CL2 produce run")
}

// Cleaner block metric names; brokers "cleaner"/"copy" (CL1) and
// "idle"/"cleaning" (CL2).
const (
	cl1MB      = "CL1 MB/s"
	cl1Written = "CL1 cleaner written MB"
	cl1Read    = "CL1 cleaner read MB"
	cl1ReadMB  = "CL1 cleaner read counter MB/s"
	cl2P50     = "CL2 produce p50 ms"
	cl2P99     = "CL2 produce p99 ms"
)

const cleanerBackoff = 200 * time.Millisecond

func (r *runner) cleanerBlock() error {
	for round := 0; round < r.o.cleaner.rounds; round++ {
		fmt.Fprintf(os.Stderr, "log cleaner round %d/%d\n", round+1, r.o.cleaner.rounds)
		if err := r.cleanerSlot(); err != nil {
			return fmt.Errorf("log cleaner: %w", err)
		}
	}
	return nil
}

func (r *runner) cleanerSlot() error {
	o := r.o.cleaner
	addrs, err := freeAddrs(2)
	if err != nil {
		return err
	}
	addr, httpAddr := addrs[0], addrs[1]
	dir, err := os.MkdirTemp("", "synapse-bench-cleaner-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// boot starts the broker on dir with extra flags; t0 is just before
	// its exec.
	boot := func(extra ...string) (b *broker, t0 time.Time, err error) {
		t := target{"synapse", r.o.synapse, func(addr, dir string) []string {
			return append([]string{"serve", "--listen", addr, "--advertised-addr", addr, "--data-dir", dir,
				"--http-listen", httpAddr, "--tier", "none", "--log-level", "warn"}, extra...)
		}, nil, nil}
		t0 = time.Now()
		b, _, err = start(t, addr, dir)
		return b, t0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	metrics := "http://" + httpAddr + "/metrics"
	const topic, latTopic = "cl-compact", "cl-latency"

	// A: the first dirty fill, cleaner off.
	b, _, err := boot("--cleaner-backoff", "0")
	if err != nil {
		return err
	}
	err = createCleanerTopics(ctx, b.addr, topic, latTopic)
	if err == nil {
		err = fillCompacted(ctx, b.addr, topic, o.records)
	}
	b.stop()
	if err != nil {
		return err
	}

	// The plain copy of the same bytes on the same disk.
	copied, copySecs, err := plainCopy(filepath.Join(dir, topic+"-0"), filepath.Join(dir, "plain-copy.tmp"))
	if err != nil {
		return err
	}
	r.add(cl1MB, "copy", float64(copied)/1e6/copySecs)

	// B: CL1, the cleaner unbounded.
	b, t0, err := boot("--cleaner-backoff", cleanerBackoff.String(), "--cleaner-io-max-bytes-per-second", "0")
	if err != nil {
		return err
	}
	var m map[string]float64
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if m, err = scrapeMetrics(metrics); err == nil && m["synapse_cleaner_cleans_total"] >= 1 {
			break
		}
		if m["synapse_cleaner_failures_total"] > 0 || time.Now().After(deadline) {
			b.stop()
			return fmt.Errorf("no clean completed (%v); log:\n%s", err, b.log)
		}
	}
	secs := time.Since(t0.Add(cleanerBackoff)).Seconds()
	read, written := m["synapse_cleaner_read_bytes_total"], m["synapse_cleaner_written_bytes_total"]
	b.stop()
	r.add(cl1MB, "cleaner", float64(copied)/1e6/secs)
	r.add(cl1ReadMB, "cleaner", read/1e6/secs)
	r.add(cl1Read, "cleaner", read/1e6)
	r.add(cl1Written, "cleaner", written/1e6)

	// C: the second dirty fill and the baseline produce, cleaner off.
	if b, _, err = boot("--cleaner-backoff", "0"); err != nil {
		return err
	}
	err = fillCompacted(ctx, b.addr, topic, o.records)
	var idle []time.Duration
	if err == nil {
		idle, err = rateProduce(ctx, b.addr, latTopic, o.latRate, o.latDur)
	}
	b.stop()
	if err != nil {
		return err
	}

	// D: the same produce while the cleaner runs at its default rate.
	if b, t0, err = boot("--cleaner-backoff", cleanerBackoff.String()); err != nil {
		return err
	}
	defer b.stop()
	time.Sleep(time.Until(t0.Add(cleanerBackoff + 50*time.Millisecond)))
	busy, err := rateProduce(ctx, b.addr, latTopic, o.latRate, o.latDur)
	if err != nil {
		return err
	}
	if m, err = scrapeMetrics(metrics); err != nil {
		return err
	}
	if m["synapse_cleaner_cleans_total"] > 0 {
		return fmt.Errorf("CL2: the clean finished within the produce window; raise -cleaner-records or lower -cleaner-latency-duration")
	}
	r.add(cl2P50, "idle", pct(idle, 0.50))
	r.add(cl2P99, "idle", pct(idle, 0.99))
	r.add(cl2P50, "cleaning", pct(busy, 0.50))
	r.add(cl2P99, "cleaning", pct(busy, 0.99))
	return nil
}

func createCleanerTopics(ctx context.Context, addr, topic, latTopic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	compact, seg, ratio := "compact", strconv.Itoa(16<<20), "0.01"
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &compact, "segment.bytes": &seg,
		"min.cleanable.dirty.ratio": &ratio}, topic); err != nil {
		return err
	}
	_, err = adm.CreateTopic(ctx, 1, 1, nil, latTopic)
	return err
}

// fillCompacted produces n records of 1 KiB (random bytes, uncompressed)
// with keys drawn from n/10 unique keys.
func fillCompacted(ctx context.Context, addr, topic string, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.MaxBufferedRecords(10_000))
	if err != nil {
		return err
	}
	defer cl.Close()
	keys := max(n/10, 1)
	var mu sync.Mutex
	var first error
	for range n {
		v := make([]byte, 1024)
		for i := 0; i < len(v); i += 8 {
			u := rand.Uint64()
			for j := range 8 {
				v[i+j] = byte(u >> (8 * j))
			}
		}
		key := fmt.Appendf(nil, "key-%08d", rand.IntN(keys))
		cl.Produce(ctx, &kgo.Record{Key: key, Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				first = cmp(first, err)
				mu.Unlock()
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	return first
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// rateProduce sends single 1 KiB records at rate per second for d
// (acks=all, idempotent, no linger) and returns each one's latency from
// send to acknowledgement.
func rateProduce(ctx context.Context, addr, topic string, rate int, d time.Duration) ([]time.Duration, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0),
		kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("warm-up")}).FirstErr(); err != nil {
		return nil, err
	}
	value := make([]byte, 1024)
	n := int(float64(rate) * d.Seconds())
	lat := make([]time.Duration, 0, n)
	var mu sync.Mutex
	var first error
	t0 := time.Now()
	for i := range n {
		time.Sleep(time.Until(t0.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		sent := time.Now()
		cl.Produce(ctx, &kgo.Record{Value: value}, func(_ *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				first = cmp(first, err)
				return
			}
			lat = append(lat, time.Since(sent))
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return nil, err
	}
	return lat, first
}

// plainCopy reads the sealed .log files of a partition directory and writes them
// to dst (1 MiB buffer, fsync at the end), then removes dst; it returns
// the bytes copied and the seconds it took. Through plain Reader and
// Writer wrappers, so io.Copy cannot hand the work to copy_file_range.
func plainCopy(partDir, dst string) (int64, float64, error) {
	logs, err := filepath.Glob(filepath.Join(partDir, "*.log"))
	if err != nil || len(logs) < 2 {
		return 0, 0, cmp(err, errors.New("no sealed .log files in "+partDir))
	}
	logs = logs[:len(logs)-1] // the active segment, which the cleaner leaves alone
	defer os.Remove(dst)
	t0 := time.Now()
	out, err := os.Create(dst)
	if err != nil {
		return 0, 0, err
	}
	defer out.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for _, name := range logs {
		in, err := os.Open(name)
		if err != nil {
			return 0, 0, err
		}
		c, err := io.CopyBuffer(struct{ io.Writer }{out}, struct{ io.Reader }{in}, buf)
		in.Close()
		n += c
		if err != nil {
			return 0, 0, err
		}
	}
	if err := out.Sync(); err != nil {
		return 0, 0, err
	}
	return n, time.Since(t0).Seconds(), nil
}

// scrapeMetrics reads the unlabelled samples of a Prometheus endpoint.
func scrapeMetrics(url string) (map[string]float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	res, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, errors.New(res.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			m[f[0]] = v
		}
	}
	return m, sc.Err()
}

func (r *runner) reportCleaner(w io.Writer) {
	o := r.o.cleaner
	fmt.Fprintf(w, "\nLog cleaner (Synapse only), %d rounds, --tier none. A compacted topic (segment.bytes 16 MiB, min.cleanable.dirty.ratio 0.01) filled with %d records of 1 KiB, keys from %d unique keys.\n",
		o.rounds, o.records, max(o.records/10, 1))
	fmt.Fprintf(w, "CL1: the cleaner unbounded (the sealed segments' bytes / time from exec + %v backoff to the first completed clean: a lower bound) against a plain copy of the same sealed .log files (1 MiB buffer, fsync). Cleaner read %s MB, wrote %s MB.\n",
		cleanerBackoff, span(r.samples[cl1Read]["cleaner"]), span(r.samples[cl1Written]["cleaner"]))
	fmt.Fprintf(w, "CL2: single 1 KiB records at %d/s for %v (acks=all), cleaner off against cleaning %d more dirty records at its default rate (64 MiB/s).\n\n",
		o.latRate, o.latDur, o.records)
	fmt.Fprintln(w, "| workload | baseline median (min–max) | variant median (min–max) | ratio | goal | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	row := func(name, base, variant, goal string, ok func(float64) bool) {
		m := r.samples[name]
		b, v := m[base], m[variant]
		ratio, met := "—", ""
		if median(b) > 0 {
			q := median(v) / median(b)
			ratio = fmt.Sprintf("%.2f×", q)
			if ok != nil {
				met = map[bool]string{true: "yes", false: "no"}[ok(q)]
			}
		}
		fmt.Fprintf(w, "| %s: %s → %s | %s | %s | %s | %s | %s |\n", name, base, variant, span(b), span(v), ratio, goal, met)
	}
	row(cl1MB, "copy", "cleaner", "≥ 0.5×", func(q float64) bool { return q >= 0.5 })
	fmt.Fprintf(w, "| %s (re-reads counted; reference) | | %s | | | |\n", cl1ReadMB, span(r.samples[cl1ReadMB]["cleaner"]))
	row(cl2P50, "idle", "cleaning", "", nil)
	row(cl2P99, "idle", "cleaning", "≤ 1.5×", func(q float64) bool { return q <= 1.5 })
}
