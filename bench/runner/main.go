// Command runner is `make bench`'s side-by-side: Synapse and a reference
// broker (franz-go's kfake, standalone, persisting to a data directory)
// start fresh in turn on free loopback ports, A B B A over several rounds,
// and run the same workloads through the same client (`synapse bench
// produce|consume|e2e`, franz-go underneath). It prints per-workload
// medians, min–max and the Synapse/reference ratio, with the brokers' CPU
// time per MB and resident memory read from /proc. A blackhole broker
// (kfake acknowledging produce without storing) calibrates the machine's
// ceiling. A transactions block (txn.go) compares transactional with
// idempotent produce and read_committed with read_uncommitted consume, on
// both brokers. A security block (Synapse only) compares its PLAINTEXT,
// SSL and SASL_PLAINTEXT listeners on one broker and measures SCRAM
// authentication of new connections under produce load. An HTTP API block
// (http.go, Synapse only) compares POST /produce/batch throughput and POST
// /produce latency with the same broker's Kafka protocol. The machine is shared and noisy:
// nothing here is a pass/fail gate; the "goal" column only says whether a
// figure met the goal.
package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	synapse, kfake string
	rounds         int
	p1Records      int64
	e2eDuration    time.Duration

	secRounds      int // < 0: as rounds; 0: no security block
	secSlices      int
	secKfake       bool
	secOnly        bool
	secRecords     int64
	secDuration    time.Duration
	authRate       float64
	authDialers    int
	authMaxDialers int

	scale   scaleOptions   // scale.go
	txn     txnOptions     // txn.go
	http    httpOptions    // http.go
	cluster clusterOptions // cluster.go
	cleaner cleanerOptions // cleaner.go
}

func main() {
	var o options
	flag.StringVar(&o.synapse, "synapse", "bin/synapse", "synapse binary (also the load client)")
	flag.StringVar(&o.kfake, "kfake", "bin/kfake", "standalone kfake binary (bench/kfake)")
	flag.IntVar(&o.rounds, "rounds", 5, "rounds (each runs both brokers, order alternating A B B A)")
	flag.Int64Var(&o.p1Records, "p1-records", 1_000_000, "records of P1 (1 KiB each)")
	flag.DurationVar(&o.e2eDuration, "e2e-duration", 20*time.Second, "duration of E1 and D1's end-to-end run")
	flag.IntVar(&o.secRounds, "security-rounds", -1, "rounds of the security block (-1: as -rounds; 0: skip it)")
	flag.BoolVar(&o.secOnly, "security-only", false, "run only the security block")
	flag.Int64Var(&o.secRecords, "security-records", 500_000, "records (1 KiB) of the security block's produce and consume runs")
	flag.BoolVar(&o.secKfake, "security-kfake", true, "also kfake over PLAINTEXT and TLS in the security block, as a reference ratio")
	flag.IntVar(&o.secSlices, "security-slices", 3, "slices of each round's produce comparison, run in rotating order")
	flag.DurationVar(&o.secDuration, "security-duration", 5*time.Second, "duration of the security block's e2e and auth runs")
	flag.Float64Var(&o.authRate, "auth-rate", 1000, "new SCRAM connections per second of the auth load under produce")
	flag.IntVar(&o.authDialers, "auth-dialers", 8, "concurrent dialers of the auth load")
	flag.IntVar(&o.authMaxDialers, "auth-max-dialers", 16, "concurrent dialers of the as-fast-as-possible auth run")
	scaleFlags(&o.scale)
	txnFlags(&o.txn)
	clusterFlags(&o.cluster)
	httpFlags(&o.http)
	cleanerFlags(&o.cleaner)
	flag.Parse()
	if o.secRounds < 0 {
		o.secRounds = o.rounds
	}
	if o.txn.rounds < 0 {
		o.txn.rounds = o.rounds
	}
	if o.http.rounds < 0 {
		o.http.rounds = o.rounds
	}
	if o.cleaner.rounds < 0 {
		o.cleaner.rounds = o.rounds
	}
	if o.cluster.rounds < 0 {
		o.cluster.rounds = o.rounds
	}
	o.http.batch, o.http.workers = max(o.http.batch, 1), max(o.http.workers, 1)
	o.txn.perTxn, o.txn.readProducers, o.txn.abortEvery = max(o.txn.perTxn, 1), max(o.txn.readProducers, 1), max(o.txn.abortEvery, 0)
	o.txn.readPasses = max(o.txn.readPasses, 1)
	o.secSlices = max(o.secSlices, 1)
	start := time.Now()
	r := &runner{o: o, samples: map[string]map[string][]float64{}}
	if err := r.run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	r.report(os.Stdout, time.Since(start))
}

type runner struct {
	o       options
	samples map[string]map[string][]float64 // metric → broker → values

	scaleNofile   uint64   // the brokers' descriptor limit in the scale block
	scaleFailures []string // sizes a broker could not finish

	txnVals     map[txnKey]float64 // the transactions block's samples by round
	txnFailures []string           // its parts that failed
}

func (r *runner) add(metric, broker string, v float64) {
	if r.samples[metric] == nil {
		r.samples[metric] = map[string][]float64{}
	}
	r.samples[metric][broker] = append(r.samples[metric][broker], v)
	fmt.Fprintf(os.Stderr, "  %-8s %-28s %12.3f\n", broker, metric, v)
}

// target is a broker to start.
type target struct {
	name string
	bin  string
	args func(addr, dir string) []string
	env  []string    // added to the broker's environment
	tls  *tls.Config // the listener at addr serves TLS: readiness is checked over it
}

func (r *runner) targets() (synapse, kfake, kfakeSync, blackhole target) {
	synapse = target{"synapse", r.o.synapse, func(addr, dir string) []string {
		return []string{"serve", "--listen", addr, "--advertised-addr", addr, "--data-dir", dir, "--http-listen", "", "--log-level", "warn"}
	}, nil, nil}
	kfake = target{"kfake", r.o.kfake, func(addr, dir string) []string { return []string{"--listen", addr, "--data-dir", dir} }, nil, nil}
	kfakeSync = target{"kfake-sync", r.o.kfake, func(addr, dir string) []string { return []string{"--listen", addr, "--data-dir", dir, "--sync"} }, nil, nil}
	blackhole = target{"blackhole", r.o.kfake, func(addr, _ string) []string { return []string{"--listen", addr, "--blackhole"} }, nil, nil}
	return
}

func (r *runner) run() error {
	if r.o.scale.only {
		return r.scaleBlock()
	}
	if r.o.txn.only {
		return r.txnBlock()
	}
	if r.o.http.only {
		return r.httpBlock()
	}
	if r.o.cleaner.only {
		return r.cleanerBlock()
	}
	if r.o.cluster.only {
		return r.clusterBlock()
	}
	if !r.o.secOnly {
		if err := r.sideBySide(); err != nil {
			return err
		}
		if r.o.txn.rounds > 0 {
			if err := r.txnBlock(); err != nil {
				return err
			}
		}
		if r.o.http.rounds > 0 {
			if err := r.httpBlock(); err != nil {
				return err
			}
		}
		if r.o.cleaner.rounds > 0 {
			if err := r.cleanerBlock(); err != nil {
				return err
			}
		}
		if r.o.cluster.rounds > 0 {
			if err := r.clusterBlock(); err != nil {
				return err
			}
		}
	}
	for round := 0; round < r.o.secRounds; round++ {
		fmt.Fprintf(os.Stderr, "security round %d/%d\n", round+1, r.o.secRounds)
		if err := r.securitySlot(round); err != nil {
			return fmt.Errorf("security: %w", err)
		}
		if r.o.secKfake {
			if err := r.kfakeTLSSlot(round); err != nil {
				return fmt.Errorf("security, kfake: %w", err)
			}
		}
	}
	if len(r.o.scale.sizes) > 0 {
		return r.scaleBlock()
	}
	return nil
}

func (r *runner) sideBySide() error {
	syn, kf, kfs, bh := r.targets()
	for round := 0; round < r.o.rounds; round++ {
		order := []target{syn, kf}
		if round%2 == 1 {
			order = []target{kf, syn}
		}
		fmt.Fprintf(os.Stderr, "round %d/%d: %s, %s, kfake-sync, blackhole\n", round+1, r.o.rounds, order[0].name, order[1].name)
		for _, t := range order {
			if err := r.fullSlot(t); err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
		}
		if err := r.syncSlot(kfs); err != nil {
			return fmt.Errorf("kfake-sync: %w", err)
		}
		if err := r.blackholeSlot(bh); err != nil {
			return fmt.Errorf("blackhole: %w", err)
		}
	}
	return nil
}

// broker is a running broker process.
type broker struct {
	t    target
	addr string
	dir  string
	cmd  *exec.Cmd
	log  *bytes.Buffer
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// start runs t on dir and returns once it answers ApiVersions, with the
// time that took.
func start(t target, addr, dir string) (*broker, time.Duration, error) {
	b := &broker{t: t, addr: addr, dir: dir, log: &bytes.Buffer{}}
	b.cmd = exec.Command(t.bin, t.args(addr, dir)...)
	if t.env != nil {
		b.cmd.Env = append(os.Environ(), t.env...)
	}
	b.cmd.Stdout, b.cmd.Stderr = io.Discard, b.log
	t0 := time.Now()
	if err := b.cmd.Start(); err != nil {
		return nil, 0, err
	}
	for deadline := t0.Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if apiVersions(addr, t.tls) == nil {
			return b, time.Since(t0), nil
		}
	}
	b.kill()
	return nil, 0, fmt.Errorf("not ready within 30 s; log:\n%s", b.log)
}

// apiVersions sends ApiVersions v0 and reads the answer (over TLS with
// cfg).
func apiVersions(addr string, cfg *tls.Config) error {
	var c net.Conn
	var err error
	if cfg != nil {
		c, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, cfg)
	} else {
		c, err = net.DialTimeout("tcp", addr, time.Second)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	req := []byte{0, 0, 0, 0, 0, 18, 0, 0, 0, 0, 0, 1, 0, 5, 'b', 'e', 'n', 'c', 'h'}
	binary.BigEndian.PutUint32(req, uint32(len(req)-4))
	if _, err := c.Write(req); err != nil {
		return err
	}
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return err
	}
	_, err = io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(size[:])))
	return err
}

func (b *broker) pid() int { return b.cmd.Process.Pid }

// stop ends the broker gracefully (SIGTERM, then SIGKILL after 60 s).
func (b *broker) stop() {
	b.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		b.kill()
	}
}

func (b *broker) kill() {
	b.cmd.Process.Signal(syscall.SIGKILL)
	b.cmd.Wait()
}

const clockTicks = 100 // USER_HZ on Linux

// cpu is the process's user+system CPU time so far.
func cpu(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // from field 3 (state)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// rssMiB is the process's resident set.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return kb / 1024
		}
	}
	return 0
}

type result struct {
	Records       int64              `json:"records"`
	Bytes         int64              `json:"bytes"`
	Seconds       float64            `json:"seconds"`
	RecordsPerSec float64            `json:"records_per_sec"`
	MBPerSec      float64            `json:"mb_per_sec"`
	LatencyMs     map[string]float64 `json:"latency_ms"`
	Errors        int64              `json:"errors"`

	// Transactional produce and consume (`--transactional-id`, `--isolation`).
	Transactions        int64              `json:"transactions"`
	AbortedTransactions int64              `json:"aborted_transactions"`
	CommittedRecords    int64              `json:"committed_records"`
	AbortedRecords      int64              `json:"aborted_records"`
	TxnLatencyMs        map[string]float64 `json:"txn_latency_ms"`
	ControlRecords      int64              `json:"control_records"`
}

// client runs `synapse bench <args>` against b, returning its result and
// the broker CPU it cost.
func (r *runner) client(b *broker, args ...string) (result, time.Duration, error) {
	return r.clientAt(b, b.addr, nil, args...)
}

// clientAt is client against the listener at addr, with env added to the
// client's environment.
func (r *runner) clientAt(b *broker, addr string, env []string, args ...string) (result, time.Duration, error) {
	c0 := cpu(b.pid())
	cmd := exec.Command(r.o.synapse, append(append([]string{"bench"}, args...), "--brokers", addr, "--json", "--progress", "0")...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	used := cpu(b.pid()) - c0
	var res result
	if jerr := json.Unmarshal(out.Bytes(), &res); jerr != nil {
		return res, used, fmt.Errorf("bench %v: %v %v\n%s", args, err, jerr, errb.String())
	}
	if res.Errors > 0 || err != nil {
		return res, used, fmt.Errorf("bench %v: %d errors (%v)\n%s", args, res.Errors, err, errb.String())
	}
	return res, used, nil
}

func msPerMB(cpu time.Duration, bytes int64) float64 {
	if bytes == 0 {
		return 0
	}
	return float64(cpu.Microseconds()) / 1e3 / (float64(bytes) / 1e6)
}

// fresh starts t on a new temporary data directory and a free port; the
// caller removes b.dir when done.
func fresh(t target) (*broker, time.Duration, error) {
	dir, err := os.MkdirTemp("", "synapse-bench-"+t.name+"-")
	if err != nil {
		return nil, 0, err
	}
	addr, err := freeAddr()
	if err != nil {
		os.RemoveAll(dir)
		return nil, 0, err
	}
	b, ready, err := start(t, addr, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, 0, err
	}
	return b, ready, nil
}

// done stops b and removes its data directory.
func (b *broker) done() {
	b.stop()
	os.RemoveAll(b.dir)
}

// fullSlot: a fresh broker runs every workload, then is killed and
// restarted on its data (>= 1 GiB by then) for the crash start-up time.
func (r *runner) fullSlot(t target) error {
	b, ready, err := fresh(t)
	if err != nil {
		return err
	}
	addr, dir := b.addr, b.dir
	defer os.RemoveAll(dir)
	defer func() {
		if b != nil {
			b.stop()
		}
	}()
	n := t.name
	r.add("R1 start-up, empty dir (ms)", n, float64(ready.Microseconds())/1e3)
	p1 := strconv.FormatInt(r.o.p1Records, 10)

	res, c, err := r.client(b, "produce", "--topic", "p1", "--records", p1, "--record-size", "1024", "--acks", "all", "--idempotent")
	if err != nil {
		return err
	}
	r.add("P1 produce MB/s", n, res.MBPerSec)
	r.add("P1 broker CPU ms/MB", n, msPerMB(c, res.Bytes))
	r.add("R1 RSS after P1 (MiB)", n, rssMiB(b.pid()))

	if res, c, err = r.client(b, "consume", "--topic", "p1"); err != nil {
		return err
	}
	r.add("C1 consume MB/s", n, res.MBPerSec)
	r.add("C1 broker CPU ms/MB", n, msPerMB(c, res.Bytes))

	if res, _, err = r.client(b, "e2e", "--topic", "e1", "--rate", "5000", "--duration", r.o.e2eDuration.String()); err != nil {
		return err
	}
	r.add("E1 e2e p50 ms", n, res.LatencyMs["p50"])
	r.add("E1 e2e p99 ms", n, res.LatencyMs["p99"])

	if res, _, err = r.client(b, "produce", "--topic", "s1", "--records", strconv.FormatInt(2*r.o.p1Records, 10), "--record-size", "100", "--linger", "5ms"); err != nil {
		return err
	}
	r.add("S1 100 B records/s", n, res.RecordsPerSec)

	if res, _, err = r.client(b, "produce", "--topic", "m1", "--partitions", "8", "--producers", "4", "--records", p1, "--record-size", "1024"); err != nil {
		return err
	}
	r.add("M1 8 partitions x 4 producers MB/s", n, res.MBPerSec)

	for _, codec := range []string{"zstd", "lz4"} {
		if res, c, err = r.client(b, "produce", "--topic", "z1"+codec, "--compression", codec, "--payload", "text", "--records", strconv.FormatInt(r.o.p1Records/2, 10), "--record-size", "1024"); err != nil {
			return err
		}
		r.add("Z1 "+codec+" broker CPU ms/MB", n, msPerMB(c, res.Bytes))
	}

	// Crash and restart on the data written above.
	b.kill()
	b = nil
	nb, ready, err := start(t, addr, dir)
	if err != nil {
		return fmt.Errorf("restart after kill -9: %w", err)
	}
	b = nb
	r.add("R1 start-up after kill -9 (ms)", n, float64(ready.Microseconds())/1e3)
	return nil
}

// syncSlot: P1 (a quarter of the records) and E1 against a broker that
// fsyncs every batch, for D1.
func (r *runner) syncSlot(t target) error {
	b, _, err := fresh(t)
	if err != nil {
		return err
	}
	defer b.done()
	res, _, err := r.client(b, "produce", "--topic", "p1", "--records", strconv.FormatInt(r.o.p1Records/4, 10), "--record-size", "1024")
	if err != nil {
		return err
	}
	r.add("P1 produce MB/s", t.name, res.MBPerSec)
	if res, _, err = r.client(b, "e2e", "--topic", "e1", "--rate", "5000", "--duration", r.o.e2eDuration.String()); err != nil {
		return err
	}
	r.add("E1 e2e p50 ms", t.name, res.LatencyMs["p50"])
	r.add("E1 e2e p99 ms", t.name, res.LatencyMs["p99"])
	return nil
}

// blackholeSlot: P1 against a broker that stores nothing: this machine's
// produce ceiling with this client.
func (r *runner) blackholeSlot(t target) error {
	b, _, err := fresh(t) // the directory stays unused: nothing is stored
	if err != nil {
		return err
	}
	defer b.done()
	res, _, err := r.client(b, "produce", "--topic", "p1", "--records", strconv.FormatInt(r.o.p1Records, 10), "--record-size", "1024")
	if err != nil {
		return err
	}
	r.add("P1 produce MB/s", t.name, res.MBPerSec)
	return nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func span(v []float64) string {
	if len(v) == 0 {
		return "—"
	}
	return fmt.Sprintf("%s (%s–%s)", num(median(v)), num(slices.Min(v)), num(slices.Max(v)))
}

func num(f float64) string {
	switch {
	case f >= 10000:
		return strconv.FormatFloat(f, 'f', 0, 64)
	case f >= 100:
		return strconv.FormatFloat(f, 'f', 1, 64)
	default:
		return strconv.FormatFloat(f, 'f', 3, 64)
	}
}

// goal is one of the goals: check says whether it is met.
type goal struct {
	text  string
	check func(syn, ref float64) bool
}

var goals = map[string]goal{
	"P1 produce MB/s":                    {"≥ 1.0×", func(s, k float64) bool { return s >= k }},
	"P1 broker CPU ms/MB":                {"≤ 0.8 ms/MB", func(s, _ float64) bool { return s <= 0.8 }},
	"C1 consume MB/s":                    {"≥ 1.5×", func(s, k float64) bool { return s >= 1.5*k }},
	"C1 broker CPU ms/MB":                {"≤ 0.3 ms/MB", func(s, _ float64) bool { return s <= 0.3 }},
	"E1 e2e p50 ms":                      {"≤ 0.5 ms (fsync'd)", func(s, _ float64) bool { return s <= 0.5 }},
	"E1 e2e p99 ms":                      {"≤ 5 ms", func(s, _ float64) bool { return s <= 5 }},
	"S1 100 B records/s":                 {"≥ 1.0×", func(s, k float64) bool { return s >= k }},
	"M1 8 partitions x 4 producers MB/s": {"≥ 1.0×", func(s, k float64) bool { return s >= k }},
	"Z1 zstd broker CPU ms/MB":           {"≤ 1.0×", func(s, k float64) bool { return s <= k }},
	"Z1 lz4 broker CPU ms/MB":            {"≤ 1.0×", func(s, k float64) bool { return s <= k }},
	"R1 start-up, empty dir (ms)":        {"≤ 100 ms", func(s, _ float64) bool { return s <= 100 }},
	"R1 start-up after kill -9 (ms)":     {"≤ 1000 ms", func(s, _ float64) bool { return s <= 1000 }},
	"R1 RSS after P1 (MiB)":              {"≤ 64 MiB", func(s, _ float64) bool { return s <= 64 }},
}

var order = []string{
	"P1 produce MB/s", "P1 broker CPU ms/MB", "C1 consume MB/s", "C1 broker CPU ms/MB", "E1 e2e p50 ms", "E1 e2e p99 ms",
	"S1 100 B records/s", "M1 8 partitions x 4 producers MB/s", "Z1 zstd broker CPU ms/MB", "Z1 lz4 broker CPU ms/MB",
	"R1 start-up, empty dir (ms)", "R1 start-up after kill -9 (ms)", "R1 RSS after P1 (MiB)",
}

func (r *runner) report(w io.Writer, took time.Duration) {
	host, _ := os.Hostname()
	what := fmt.Sprintf("side by side, %d rounds (A B B A)", r.o.rounds)
	switch {
	case r.o.scale.only:
		what = "scale block"
	case r.o.txn.only:
		what = "transactions block"
	case r.o.http.only:
		what = "HTTP API block"
	case r.o.cleaner.only:
		what = "log cleaner block"
	case r.o.cluster.only:
		what = "cluster block"
	}
	fmt.Fprintf(w, "\n`make bench` %s, %s, %d CPUs, %s, host %s, %s in all.\n",
		what, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), host, took.Round(time.Second))
	switch {
	case r.o.scale.only:
		if len(r.o.scale.sizes) > 0 {
			r.reportScale(w)
		}
	case r.o.txn.only:
		r.reportTxn(w)
	case r.o.http.only:
		r.reportHTTP(w)
	case r.o.cleaner.only:
		r.reportCleaner(w)
	case r.o.cluster.only:
		r.reportCluster(w)
	default:
		if !r.o.secOnly {
			r.reportSideBySide(w)
			if r.o.txn.rounds > 0 {
				r.reportTxn(w)
			}
			if r.o.http.rounds > 0 {
				r.reportHTTP(w)
			}
			if r.o.cleaner.rounds > 0 {
				r.reportCleaner(w)
			}
			if r.o.cluster.rounds > 0 {
				r.reportCluster(w)
			}
		}
		if r.o.secRounds > 0 {
			r.reportSecurity(w)
		}
		if len(r.o.scale.sizes) > 0 {
			r.reportScale(w)
		}
	}
	fmt.Fprintf(w, "Broker binaries: %s, %s.\n", filepath.Base(r.o.synapse), filepath.Base(r.o.kfake))
}

func (r *runner) reportSideBySide(w io.Writer) {
	fmt.Fprintf(w, "Synapse in its default durable mode (fsync before ack, group commit; local file tier); kfake persisting to its data directory through the page cache.\n\n")
	fmt.Fprintln(w, "| workload | Synapse median (min–max) | kfake median (min–max) | Synapse/kfake | goal | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, m := range order {
		s, k := r.samples[m]["synapse"], r.samples[m]["kfake"]
		ratio := "—"
		if median(k) > 0 {
			ratio = fmt.Sprintf("%.2f×", median(s)/median(k))
		}
		g, met := goals[m], "—"
		if g.check != nil && len(s) > 0 {
			met = "no"
			if g.check(median(s), median(k)) {
				met = "yes"
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", m, span(s), span(k), ratio, g.text, met)
	}
	// D1: Synapse (durable by default) against kfake with an fsync per batch.
	fmt.Fprintln(w, "\nD1: Synapse's default durable mode against kfake with an fsync per batch (`--sync`; P1 with a quarter of the records):")
	fmt.Fprintln(w, "\n| workload | Synapse median (min–max) | kfake-sync median (min–max) | Synapse/kfake-sync |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, m := range []string{"P1 produce MB/s", "E1 e2e p50 ms", "E1 e2e p99 ms"} {
		s, k := r.samples[m]["synapse"], r.samples[m]["kfake-sync"]
		ratio := "—"
		if median(k) > 0 {
			ratio = fmt.Sprintf("%.2f×", median(s)/median(k))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", m, span(s), span(k), ratio)
	}
	bh := r.samples["P1 produce MB/s"]["blackhole"]
	fmt.Fprintf(w, "\nCalibration: P1 against a blackhole broker (kfake acknowledging without storing): %s MB/s — this client's ceiling on this machine.\n", span(bh))
}

//////////////
// Security //
//////////////

// secBroker is a Synapse broker with a PLAINTEXT, an SSL and a
// SASL_PLAINTEXT listener, a certificate for 127.0.0.1 signed by a CA made
// for the run, and the super user admin (SCRAM-SHA-256/512, 4096
// iterations) from SYNAPSE_ADMIN_PASSWORD.
type secBroker struct {
	*broker
	root             string
	plain, ssl, sasl string
	ca               string
	env              []string // the password, for the clients
}

// listener is one way for a client to reach a secBroker.
type listener struct {
	name string
	addr string
	args []string
}

func (b *secBroker) listeners() (plain, ssl, sasl listener) {
	return listener{"PLAINTEXT", b.plain, nil},
		listener{"SSL", b.ssl, []string{"--tls-ca-file", b.ca}},
		listener{"SASL_PLAINTEXT", b.sasl, []string{"--sasl-mechanism", "SCRAM-SHA-256", "--sasl-user", "admin"}}
}

// freeAddrs are n distinct free loopback addresses.
func freeAddrs(n int) ([]string, error) {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // held until all are picked: distinct
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

func (r *runner) startSecure() (*secBroker, error) {
	root, err := os.MkdirTemp("", "synapse-bench-security-")
	if err != nil {
		return nil, err
	}
	b := &secBroker{root: root}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(root)
		}
	}()
	ca, cert, key, err := writeCerts(root)
	if err != nil {
		return nil, err
	}
	b.ca = ca
	pw := make([]byte, 12)
	rand.Read(pw)
	b.env = []string{"SYNAPSE_ADMIN_PASSWORD=" + hex.EncodeToString(pw)}
	addrs, err := freeAddrs(3)
	if err != nil {
		return nil, err
	}
	b.plain, b.ssl, b.sasl = addrs[0], addrs[1], addrs[2]
	t := target{"synapse", r.o.synapse, func(_, dir string) []string {
		return []string{"serve", "--listeners", "PLAINTEXT://" + b.plain + ",SSL://" + b.ssl + ",SASL_PLAINTEXT://" + b.sasl,
			"--tls-cert-file", cert, "--tls-key-file", key, "--sasl-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512",
			"--data-dir", dir, "--http-listen", "", "--log-level", "warn"}
	}, b.env, nil}
	if b.broker, _, err = start(t, b.plain, filepath.Join(root, "data")); err != nil {
		return nil, err
	}
	ok = true
	return b, nil
}

func (b *secBroker) done() {
	b.stop()
	os.RemoveAll(b.root)
}

// writeCerts writes a CA and a server certificate for 127.0.0.1 (ECDSA
// P-256, valid for a day) into dir.
func writeCerts(dir string) (caFile, certFile, keyFile string, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "synapse bench CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key")
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{caFile, "CERTIFICATE", caDER}, {certFile, "CERTIFICATE", der}, {keyFile, "PRIVATE KEY", keyDER}} {
		if err = os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return
		}
	}
	return
}

// authResult is what `synapse bench auth --json` prints.
type authResult struct {
	Auths       int64              `json:"auths"`
	Failures    int64              `json:"failures"`
	Seconds     float64            `json:"seconds"`
	AuthsPerSec float64            `json:"auths_per_sec"`
	LatencyMs   map[string]float64 `json:"latency_ms"`
}

// authLoad is a `synapse bench auth` running in the background.
type authLoad struct {
	cmd       *exec.Cmd
	out, errb bytes.Buffer
}

// startAuth starts `synapse bench auth` against b's SASL listener; it runs
// until stop.
func (r *runner) startAuth(b *secBroker, args ...string) (*authLoad, error) {
	a := &authLoad{}
	a.cmd = exec.Command(r.o.synapse, append([]string{"bench", "auth", "--brokers", b.sasl, "--sasl-mechanism", "SCRAM-SHA-256",
		"--sasl-user", "admin", "--duration", "10m", "--json", "--progress", "0"}, args...)...)
	a.cmd.Env = append(os.Environ(), b.env...)
	a.cmd.Stdout, a.cmd.Stderr = &a.out, &a.errb
	return a, a.cmd.Start()
}

// stop interrupts the auth load, which then reports what it did.
func (a *authLoad) stop() (authResult, error) {
	a.cmd.Process.Signal(os.Interrupt)
	err := a.cmd.Wait()
	var res authResult
	if jerr := json.Unmarshal(a.out.Bytes(), &res); jerr != nil {
		return res, fmt.Errorf("bench auth: %v %v\n%s", err, jerr, a.errb.String())
	}
	if res.Failures > 0 {
		fmt.Fprintf(os.Stderr, "  bench auth: %d failures: %s", res.Failures, a.errb.String())
	}
	return res, nil
}

// runAuth runs `synapse bench auth` for d.
func (r *runner) runAuth(b *secBroker, d time.Duration, args ...string) (authResult, error) {
	a, err := r.startAuth(b, args...)
	if err != nil {
		return authResult{}, err
	}
	time.Sleep(d)
	return a.stop()
}

// under runs fn with an auth load at --auth-rate in the background,
// started authLead before it.
func (r *runner) under(b *secBroker, fn func() error) (authResult, error) {
	a, err := r.startAuth(b, "--rate", strconv.FormatFloat(r.o.authRate, 'f', -1, 64), "--concurrency", strconv.Itoa(r.o.authDialers))
	if err != nil {
		return authResult{}, err
	}
	time.Sleep(authLead)
	ferr := fn()
	res, err := a.stop()
	if ferr != nil {
		return res, ferr
	}
	return res, err
}

// authLead is how long the auth load runs before the workload under it
// starts.
const authLead = 300 * time.Millisecond

// Security metric names (broker "synapse").
const (
	secProduce    = "sec produce MB/s "             // + listener
	secProduceCPU = "sec produce broker CPU ms/MB " // + listener
	secConsume    = "sec consume MB/s "
	secConsumeCPU = "sec consume broker CPU ms/MB "
	secAuthMax    = "sec auths/s as fast as possible"
	secAuthMaxP99 = "sec auth p99 ms as fast as possible"
	secAuthCPU    = "sec broker CPU ms per auth"
	secE2ERate    = "sec e2e records/s "
	secE2EP50     = "sec e2e p50 ms "    // + alone / under auth
	secE2EP99     = "sec e2e p99 ms "    // + alone / under auth
	secAuthUnder  = "sec auths/s under " // + e2e / produce
	secAuthP99    = "sec auth p99 ms under "
	secPair       = "sec produce MB/s, auth pair, " // + alone / under auth
	secFailures   = "sec auth failures"
)

// securitySlot: one round of the security block on a fresh broker.
//
// This VM's disk writes a burst at twice the speed it sustains (and comes
// back to it only after idling), so produce runs in turn do not see the
// same disk: each comparison is split into slices run in a rotating order
// (every variant in every position once per round: A B C, B C A, C A B;
// reversed in odd rounds), and a round's figure for a variant is its bytes
// over its time across its slices.
func (r *runner) securitySlot(round int) error {
	b, err := r.startSecure()
	if err != nil {
		return err
	}
	defer b.done()
	const n = "synapse"
	rev := round%2 == 1
	plain, ssl, sasl := b.listeners()

	// Produce over each listener, P1's records in slices.
	ls := []listener{plain, ssl, sasl}
	per := strconv.FormatInt(max(r.o.secRecords/int64(r.o.secSlices), 1), 10)
	var acc [3]sums
	for _, i := range schedule(len(ls), r.o.secSlices, rev) {
		l := ls[i]
		res, c, err := r.clientAt(b.broker, l.addr, b.env, append([]string{"produce", "--topic", "sec-" + strings.ToLower(l.name),
			"--records", per, "--record-size", "1024", "--acks", "all", "--idempotent"}, l.args...)...)
		if err != nil {
			return fmt.Errorf("produce over %s: %w", l.name, err)
		}
		acc[i].add(res, c)
	}
	for i, l := range ls {
		r.add(secProduce+l.name, n, acc[i].mbPerSec())
		r.add(secProduceCPU+l.name, n, msPerMB(acc[i].cpu, acc[i].bytes))
	}

	// Consume the PLAINTEXT produce's topic from 0 over PLAINTEXT and SSL:
	// A B B A.
	ls = []listener{plain, ssl}
	acc = [3]sums{}
	for _, i := range schedule(len(ls), 2, rev) {
		l := ls[i]
		res, c, err := r.clientAt(b.broker, l.addr, b.env, append([]string{"consume", "--topic", "sec-plaintext"}, l.args...)...)
		if err != nil {
			return fmt.Errorf("consume over %s: %w", l.name, err)
		}
		acc[i].add(res, c)
	}
	for i, l := range ls {
		r.add(secConsume+l.name, n, acc[i].mbPerSec())
		r.add(secConsumeCPU+l.name, n, msPerMB(acc[i].cpu, acc[i].bytes))
	}

	// New SCRAM connections as fast as the machine allows.
	c0 := cpu(b.pid())
	ar, err := r.runAuth(b, r.o.secDuration, "--concurrency", strconv.Itoa(r.o.authMaxDialers))
	if err != nil {
		return err
	}
	r.add(secAuthMax, n, ar.AuthsPerSec)
	r.add(secAuthMaxP99, n, ar.LatencyMs["p99"])
	if ar.Auths > 0 {
		r.add(secAuthCPU, n, float64((cpu(b.pid())-c0).Microseconds())/1e3/float64(ar.Auths))
	}
	failures := ar.Failures

	// e2e at 5000 records/s over PLAINTEXT, alone and under the auth load
	// at --auth-rate.
	for _, loaded := range schedule(2, 1, rev) {
		var res result
		e2e := func() (err error) {
			res, _, err = r.clientAt(b.broker, b.plain, nil, "e2e", "--topic", fmt.Sprintf("sec-e2e-%d", loaded), "--rate", "5000", "--duration", r.o.secDuration.String())
			return err
		}
		key := "alone"
		if loaded == 1 {
			key = "under auth"
			ar, err := r.under(b, e2e)
			if err != nil {
				return err
			}
			r.add(secAuthUnder+"e2e", n, ar.AuthsPerSec)
			r.add(secAuthP99+"e2e", n, ar.LatencyMs["p99"])
			failures += ar.Failures
		} else if err := e2e(); err != nil {
			return err
		}
		r.add(secE2ERate+key, n, res.RecordsPerSec)
		r.add(secE2EP50+key, n, res.LatencyMs["p50"])
		r.add(secE2EP99+key, n, res.LatencyMs["p99"])
	}

	// Produce as fast as possible over PLAINTEXT, alone and under the auth
	// load: half P1's records, in quarters, A B B A.
	quarter := strconv.FormatInt(max(r.o.secRecords/4, 1), 10)
	acc = [3]sums{}
	var under authResult
	for _, loaded := range schedule(2, 2, rev) {
		var res result
		var c time.Duration
		produce := func() (err error) {
			res, c, err = r.clientAt(b.broker, b.plain, nil, "produce", "--topic", fmt.Sprintf("sec-pair-%d", loaded), "--records", quarter, "--record-size", "1024")
			return err
		}
		if loaded == 1 {
			ar, err := r.under(b, produce)
			if err != nil {
				return err
			}
			under.Auths += ar.Auths
			under.Seconds += ar.Seconds
			under.LatencyMs = maxP99(under.LatencyMs, ar.LatencyMs)
			failures += ar.Failures
		} else if err := produce(); err != nil {
			return err
		}
		acc[loaded].add(res, c)
	}
	r.add(secPair+"alone", n, acc[0].mbPerSec())
	r.add(secPair+"under auth", n, acc[1].mbPerSec())
	r.add(secAuthUnder+"produce", n, float64(under.Auths)/under.Seconds)
	r.add(secAuthP99+"produce", n, under.LatencyMs["p99"])
	r.add(secFailures, n, float64(failures))
	return nil
}

// kfakeTLSSlot: kfake over PLAINTEXT and over TLS (two processes, the
// certificate of startSecure), produce then consume half the records of
// the Synapse rounds each, A B B A: the ratios of a broker on the same
// crypto/tls that never uses sendfile.
func (r *runner) kfakeTLSSlot(round int) error {
	root, err := os.MkdirTemp("", "synapse-bench-kfake-tls-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	caFile, cert, key, err := writeCerts(root)
	if err != nil {
		return err
	}
	pemCA, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemCA)
	addrs, err := freeAddrs(2)
	if err != nil {
		return err
	}
	kargs := func(addr, dir string) []string { return []string{"--listen", addr, "--data-dir", dir} }
	ts := []target{{"kfake", r.o.kfake, kargs, nil, nil}, {"kfake", r.o.kfake, func(addr, dir string) []string {
		return append(kargs(addr, dir), "--tls-cert-file", cert, "--tls-key-file", key)
	}, nil, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	ls := []listener{{"PLAINTEXT", addrs[0], nil}, {"SSL", addrs[1], []string{"--tls-ca-file", caFile}}}
	var bs []*broker
	defer func() {
		for _, b := range bs {
			b.stop()
		}
	}()
	for i, t := range ts {
		dir := filepath.Join(root, fmt.Sprint("data", i))
		b, _, err := start(t, ls[i].addr, dir)
		if err != nil {
			return err
		}
		bs = append(bs, b)
	}
	const n = "kfake"
	half := strconv.FormatInt(max(r.o.secRecords/4, 1), 10)
	for _, w := range []string{"produce", "consume"} {
		var acc [2]sums
		for _, i := range schedule(2, 2, round%2 == 1) {
			args := []string{w, "--topic", "k", "--records", half}
			if w == "produce" {
				args = append(args, "--record-size", "1024", "--acks", "all", "--idempotent")
			}
			res, c, err := r.clientAt(bs[i], ls[i].addr, nil, append(args, ls[i].args...)...)
			if err != nil {
				return fmt.Errorf("%s over %s: %w", w, ls[i].name, err)
			}
			acc[i].add(res, c)
		}
		for i, l := range ls {
			r.add("sec "+w+" MB/s "+l.name, n, acc[i].mbPerSec())
			r.add("sec "+w+" broker CPU ms/MB "+l.name, n, msPerMB(acc[i].cpu, acc[i].bytes))
		}
	}
	return nil
}

// schedule is the order of a round's runs of n variants: passes passes,
// each rotated one further than the last (A B C, B C A, C A B); reversed
// when rev.
func schedule(n, passes int, rev bool) []int {
	var seq []int
	for p := range passes {
		for i := range n {
			seq = append(seq, (i+p)%n)
		}
	}
	if rev {
		slices.Reverse(seq)
	}
	return seq
}

// sums adds up a variant's slices.
type sums struct {
	bytes   int64
	seconds float64
	cpu     time.Duration
}

func (s *sums) add(res result, cpu time.Duration) {
	s.bytes += res.Bytes
	s.seconds += res.Seconds
	s.cpu += cpu
}

func (s *sums) mbPerSec() float64 {
	if s.seconds == 0 {
		return 0
	}
	return float64(s.bytes) / 1e6 / s.seconds
}

// maxP99 keeps the larger p99 of two auth runs.
func maxP99(a, b map[string]float64) map[string]float64 {
	if a == nil || b["p99"] > a["p99"] {
		return b
	}
	return a
}

// secRow is a row of the security table: a variant against its baseline
// (base empty: a figure of its own).
type secRow struct {
	text, base, variant string
	goal                string
	check               func(base, variant, ratio float64) bool
	broker              string // default synapse
}

func (r *runner) secRows() []secRow {
	auth := fmt.Sprintf("%g new SCRAM-SHA-256 connections/s (%d dialers)", r.o.authRate, r.o.authDialers)
	rate := func(_, v, _ float64) bool { return v >= 0.99*r.o.authRate }
	rows := []secRow{
		{"produce MB/s: PLAINTEXT → SSL", secProduce + "PLAINTEXT", secProduce + "SSL", "≥ 0.9×", func(_, _, q float64) bool { return q >= 0.9 }, ""},
		{"consume MB/s: PLAINTEXT → SSL", secConsume + "PLAINTEXT", secConsume + "SSL", "≥ 0.6×", func(_, _, q float64) bool { return q >= 0.6 }, ""},
		{"produce MB/s: PLAINTEXT → SASL_PLAINTEXT (SCRAM-SHA-256)", secProduce + "PLAINTEXT", secProduce + "SASL_PLAINTEXT", "≥ 0.95× (nothing measurable)", func(_, _, q float64) bool { return q >= 0.95 }, ""},
		{"produce broker CPU ms/MB: PLAINTEXT → SSL", secProduceCPU + "PLAINTEXT", secProduceCPU + "SSL", "", nil, ""},
		{"produce broker CPU ms/MB: PLAINTEXT → SASL_PLAINTEXT", secProduceCPU + "PLAINTEXT", secProduceCPU + "SASL_PLAINTEXT", "", nil, ""},
		{"consume broker CPU ms/MB: PLAINTEXT → SSL", secConsumeCPU + "PLAINTEXT", secConsumeCPU + "SSL", "", nil, ""},
		{fmt.Sprintf("SCRAM-SHA-256 auths/s, as fast as possible (%d dialers)", r.o.authMaxDialers), "", secAuthMax, fmt.Sprintf("≥ %g/s", r.o.authRate), func(_, v, _ float64) bool { return v >= r.o.authRate }, ""},
		{"  its auth latency p99 ms (dial to authenticated)", "", secAuthMaxP99, "", nil, ""},
		{"  broker CPU ms per authenticated connection", "", secAuthCPU, "", nil, ""},
		{"auths/s reached, target " + auth + ", under e2e", "", secAuthUnder + "e2e", fmt.Sprintf("%g/s (−1%%)", r.o.authRate), rate, ""},
		{"  its auth latency p99 ms", "", secAuthP99 + "e2e", "", nil, ""},
		{"e2e records/s reached (target 5000): alone → under auth load", secE2ERate + "alone", secE2ERate + "under auth", "", nil, ""},
		{"e2e 5000 records/s p50 ms: alone → under auth load", secE2EP50 + "alone", secE2EP50 + "under auth", "", nil, ""},
		{"e2e 5000 records/s p99 ms: alone → under auth load", secE2EP99 + "alone", secE2EP99 + "under auth", "≤ 1.2× (not starved)", func(_, _, q float64) bool { return q <= 1.2 }, ""},
		{"auths/s reached, target " + auth + ", under max produce", "", secAuthUnder + "produce", fmt.Sprintf("%g/s (−1%%)", r.o.authRate), rate, ""},
		{"  its auth latency p99 ms (the worse of two runs)", "", secAuthP99 + "produce", "", nil, ""},
		{"produce MB/s as fast as possible (2 × a quarter of the records each): alone → under auth load", secPair + "alone", secPair + "under auth", "", nil, ""},
	}
	if r.o.secKfake {
		kf := func(text, base, variant string) secRow {
			return secRow{text: "reference, kfake: " + text, base: base, variant: variant, broker: "kfake"}
		}
		rows = append(rows,
			kf("produce MB/s: PLAINTEXT → SSL", secProduce+"PLAINTEXT", secProduce+"SSL"),
			kf("consume MB/s: PLAINTEXT → SSL (a copy either way)", secConsume+"PLAINTEXT", secConsume+"SSL"),
			kf("produce broker CPU ms/MB: PLAINTEXT → SSL", secProduceCPU+"PLAINTEXT", secProduceCPU+"SSL"),
			kf("consume broker CPU ms/MB: PLAINTEXT → SSL", secConsumeCPU+"PLAINTEXT", secConsumeCPU+"SSL"))
	}
	return rows
}

func (r *runner) reportSecurity(w io.Writer) {
	fmt.Fprintf(w, "\nSecurity (Synapse only): a fresh broker per round with a PLAINTEXT, an SSL and a SASL_PLAINTEXT listener, %d rounds. Produce: %d records of 1 KiB over each listener (acks=all, idempotent)\n",
		r.o.secRounds, r.o.secRecords)
	fmt.Fprintf(w, "in %d slices run in rotating order (A B C, B C A, ...; reversed in odd rounds); consume: that topic from 0 over PLAINTEXT and SSL, A B B A. TLS 1.3 with an ECDSA P-256 certificate made at run time;\n", r.o.secSlices)
	fmt.Fprintf(w, "SCRAM-SHA-256 (4096 iterations) as the super user admin. e2e and auth runs last %s. Ratios are medians of the per-round ratios.\n", r.o.secDuration)
	fmt.Fprintln(w, "The auth loads (`synapse bench auth`) open new connections on the SASL listener: ApiVersions, SaslHandshake, 2 SaslAuthenticate, close. The client derives the salted password once")
	fmt.Fprintln(w, "(`--scram-key-cache`; franz-go runs PBKDF2 per connection, ~0.5 ms of client CPU); client and broker share the 2 CPUs, so \"as fast as possible\" is this machine's, not the broker's alone.")
	if r.o.secKfake {
		fmt.Fprintln(w, "Reference rows: kfake (same crypto/tls, never sendfile) as two processes, PLAINTEXT and TLS, a quarter of the records per run, A B B A.")
	}
	fmt.Fprintln(w, "\n| workload | baseline median (min–max) | median (min–max) | ratio median (min–max) | goal | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, row := range r.secRows() {
		if row.broker == "" {
			row.broker = "synapse"
		}
		v := r.samples[row.variant][row.broker]
		basev, ratio, ratios := "—", "—", []float64(nil)
		if row.base != "" {
			bs := r.samples[row.base][row.broker]
			basev = span(bs)
			for i := range min(len(bs), len(v)) {
				if bs[i] > 0 {
					ratios = append(ratios, v[i]/bs[i])
				}
			}
			if len(ratios) > 0 {
				ratio = fmt.Sprintf("%.2f× (%.2f–%.2f)", median(ratios), slices.Min(ratios), slices.Max(ratios))
			}
		}
		met := "—"
		if row.check != nil && len(v) > 0 {
			met = "no"
			if row.check(median(r.samples[row.base][row.broker]), median(v), median(ratios)) {
				met = "yes"
			}
		}
		goal := row.goal
		if goal == "" {
			goal = "—"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", row.text, basev, span(v), ratio, goal, met)
	}
	var failed float64
	for _, f := range r.samples[secFailures]["synapse"] {
		failed += f
	}
	fmt.Fprintf(w, "\nAuthentication failures over all auth runs: %.0f.\n", failed)
}
