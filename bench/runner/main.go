// Command runner is `make bench`'s side-by-side: Synapse and a reference
// broker (franz-go's kfake, standalone, persisting to a data directory)
// start fresh in turn on free loopback ports, A B B A over several rounds,
// and run the same workloads through the same client (`synapse bench
// produce|consume|e2e`, franz-go underneath). It prints per-workload
// medians, min–max and the Synapse/reference ratio, with the brokers' CPU
// time per MB and resident memory read from /proc. A blackhole broker
// (kfake acknowledging produce without storing) calibrates the machine's
// ceiling. A security block (Synapse only) compares its PLAINTEXT, SSL and
// SASL_PLAINTEXT listeners on one broker and measures SCRAM authentication
// of new connections under produce load. The machine is shared and noisy:
// nothing here is a pass/fail gate; the "goal" column only says whether a
// figure met the goal.
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
	secOnly        bool
	secRecords     int64
	secDuration    time.Duration
	authRate       float64
	authDialers    int
	authMaxDialers int
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
	flag.DurationVar(&o.secDuration, "security-duration", 5*time.Second, "duration of the security block's e2e and auth runs")
	flag.Float64Var(&o.authRate, "auth-rate", 1000, "new SCRAM connections per second of the auth load under produce")
	flag.IntVar(&o.authDialers, "auth-dialers", 8, "concurrent dialers of the auth load")
	flag.IntVar(&o.authMaxDialers, "auth-max-dialers", 16, "concurrent dialers of the as-fast-as-possible auth run")
	flag.Parse()
	if o.secRounds < 0 {
		o.secRounds = o.rounds
	}
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
	env  []string // added to the broker's environment
}

func (r *runner) targets() (synapse, kfake, kfakeSync, blackhole target) {
	synapse = target{"synapse", r.o.synapse, func(addr, dir string) []string {
		return []string{"serve", "--listen", addr, "--advertised-addr", addr, "--data-dir", dir, "--http-listen", "", "--log-level", "warn"}
	}, nil}
	kfake = target{"kfake", r.o.kfake, func(addr, dir string) []string { return []string{"--listen", addr, "--data-dir", dir} }, nil}
	kfakeSync = target{"kfake-sync", r.o.kfake, func(addr, dir string) []string { return []string{"--listen", addr, "--data-dir", dir, "--sync"} }, nil}
	blackhole = target{"blackhole", r.o.kfake, func(addr, _ string) []string { return []string{"--listen", addr, "--blackhole"} }, nil}
	return
}

func (r *runner) run() error {
	if !r.o.secOnly {
		if err := r.sideBySide(); err != nil {
			return err
		}
	}
	for round := 0; round < r.o.secRounds; round++ {
		fmt.Fprintf(os.Stderr, "security round %d/%d\n", round+1, r.o.secRounds)
		if err := r.securitySlot(round); err != nil {
			return fmt.Errorf("security: %w", err)
		}
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
		if apiVersions(addr) == nil {
			return b, time.Since(t0), nil
		}
	}
	b.kill()
	return nil, 0, fmt.Errorf("not ready within 30 s; log:\n%s", b.log)
}

// apiVersions sends ApiVersions v0 and reads the answer.
func apiVersions(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
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
	fmt.Fprintf(w, "\n`make bench` side by side, %s, %d CPUs, %s, host %s, %d rounds (A B B A), %s in all.\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), host, r.o.rounds, took.Round(time.Second))
	if !r.o.secOnly {
		r.reportSideBySide(w)
	}
	if r.o.secRounds > 0 {
		r.reportSecurity(w)
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
