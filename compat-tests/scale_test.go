package compattests

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestScale (issue 16): many partitions on one broker whose file
// descriptor limit is far below what one descriptor per segment file would
// need, so the broker's own budget has to bind. It creates the topics
// (100 partitions each), produces one known record to every partition
// (acks=all), reads every partition from the start in one consumer, checks
// Metadata, then kill -9 and restart (timed until Metadata answers every
// partition), reads everything again, stops gracefully (SIGTERM: exit 0
// within --shutdown-timeout), restarts and reads once more. Any error a
// request answered fails the test: produce results and the partitions the
// broker answered with a retriable error (kgo retries those silently; its
// debug log shows them), fetch errors (fetches.Errors()) and the errors
// kgo logs, and Metadata partition errors, offline replicas or missing
// leaders.
//
// Environment (defaults in parentheses):
//
//	SCALE_PARTITIONS          partitions in all, 100 per topic (20000; 0 skips)
//	SCALE_NOFILE              the broker's RLIMIT_NOFILE, soft and hard, via prlimit (4096)
//	SCALE_SHUTDOWN_TIMEOUT    --shutdown-timeout; a SIGTERM must end in exit 0 within it (10s)
//	SCALE_BUDGET              bound on the whole test but its cleanup (110s)
//	SCALE_PHASE_TIMEOUT       bound on each create, produce, read or restart phase (40s)
//	SCALE_STALL               a read phase ends once no new record arrived for this long (5s)
//
// Brokers listen on random loopback ports below 32768.
func TestScale(t *testing.T) {
	if compatTarget() != targetSynapse {
		t.Skip("TestScale runs bin/synapse as a process (prlimit, kill -9); COMPAT_TARGET=" + compatTarget())
	}
	cfg := scaleConfigFromEnv(t)
	if cfg.partitions == 0 {
		t.Skip("SCALE_PARTITIONS=0")
	}
	bin := os.Getenv("SYNAPSE_BIN")
	if bin == "" {
		skipUnlessRequired(t, "SYNAPSE_BIN is not set: build the broker (make build) and run `SYNAPSE_BIN=../bin/synapse go test -run TestScale ./...`")
	}
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		skipUnlessRequired(t, "prlimit (util-linux) is needed to lower the broker's descriptor limit: "+err.Error())
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	testStart := time.Now()
	budget := time.Now().Add(cfg.budget)
	// phase is a context for one phase: its own bound, within the budget.
	phase := func(name string, d time.Duration) (context.Context, context.CancelFunc) {
		left := time.Until(budget)
		if left <= 0 {
			t.Fatalf("scale: the %s budget (SCALE_BUDGET) is spent before %s", cfg.budget, name)
		}
		return context.WithTimeout(context.Background(), min(d, left))
	}

	b := newScaleBroker(t, prlimit, abs, cfg)
	w := newScaleWorkload(cfg)
	t.Logf("scale: %d partitions (%d topics x %d), broker RLIMIT_NOFILE %d, --shutdown-timeout %s, %s %s",
		w.total, len(w.topics), w.perTopic, cfg.nofile, cfg.shutdown, abs, strings.Join(b.args(), " "))

	// Start on an empty directory.
	ctx, cancel := phase("the first start", cfg.phase)
	ready, err := b.startAndWait(ctx, nil)
	cancel()
	if err != nil {
		t.Fatalf("scale: first start: %v", err)
	}
	t.Logf("scale: start on an empty data dir: Metadata answers after %s; %s", ready.answered.Round(time.Millisecond), b.procStats())

	// Create the topics.
	ctx, cancel = phase("create", cfg.phase)
	created := w.create(ctx, t, b.Addr())
	cancel()
	t.Logf("scale: created %d/%d topics (%d partitions) in %s; %s", created.ok, len(w.topics), created.ok*w.perTopic, created.took.Round(time.Millisecond), b.procStats())
	if created.ok != len(w.topics) {
		t.Errorf("scale: CreateTopics: %d of %d topics failed; first errors:\n  %s", len(w.topics)-created.ok, len(w.topics), strings.Join(created.errs, "\n  "))
	}

	// checkMetadata fails t unless Metadata shows every partition led, in
	// sync and without error or offline replica.
	checkMetadata := func(when string) {
		t.Helper()
		ctx, cancel := phase("Metadata "+when, cfg.phase)
		defer cancel()
		md, err := w.metadata(ctx, b.Addr())
		if err != nil {
			t.Errorf("scale: Metadata %s: %v", when, err)
			return
		}
		t.Logf("scale: Metadata of all topics %s: %s", when, md)
		if !md.ok(w) {
			t.Errorf("scale: Metadata %s: %s", when, md.problems(w))
		}
	}
	checkMetadata("after create")

	// Produce one record to every partition.
	ctx, cancel = phase("produce", cfg.phase)
	prod := w.produce(ctx, b.Addr())
	cancel()
	t.Logf("scale: produced to %d/%d partitions (acks=all, one ProduceSync) in %s; %s", prod.ok, w.total, prod.took.Round(time.Millisecond), b.procStats())
	if prod.ok != w.total {
		t.Errorf("scale: produce: %d of %d records failed: %s", w.total-prod.ok, w.total, prod.errSummary())
	}
	if prod.retried > 0 {
		t.Errorf("scale: produce: the broker answered %d partition(s) with an error that kgo retried: %s", prod.retried, strings.Join(prod.retrySamples, "; "))
	}
	prod.log.report(t, "producer")
	checkMetadata("after produce")

	readBack := func(when string) {
		t.Helper()
		ctx, cancel := phase("read "+when, cfg.phase)
		defer cancel()
		rd := w.readAll(ctx, b.Addr(), cfg.stall)
		t.Logf("scale: read %s: %d/%d partitions in %s (one consumer, from the start); %s", when, rd.got, w.total, rd.took.Round(time.Millisecond), b.procStats())
		if rd.got != w.total {
			lost := 0
			for name, ps := range rd.missing {
				for _, p := range ps {
					if prod.acked[name][p] {
						lost++
					}
				}
			}
			t.Errorf("scale: read %s: %d of %d partitions not read back (%s); %d of them had acknowledged their record",
				when, w.total-rd.got, w.total, rd.stopped, lost)
			pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
			t.Logf("scale: read %s: what a Fetch of offset 0 of the missing partitions answers: %s", when, w.probeMissing(pctx, b.Addr(), rd.missing))
			pcancel()
		}
		if rd.nWrong > 0 {
			t.Errorf("scale: read %s: %d wrong records: %s", when, rd.nWrong, strings.Join(firstN(rd.wrong, 5), "; "))
		}
		if rd.nFetchErr > 0 {
			t.Errorf("scale: read %s: %d fetch errors (fetches.Errors()): %s", when, rd.nFetchErr, strings.Join(firstN(rd.fetchErrs, 5), "; "))
		}
		rd.log.report(t, "consumer ("+when+")")
		checkMetadata("after the read " + when)
	}
	readBack("after produce")

	// kill -9, then restart: timed until Metadata answers every partition.
	b.kill9(t)
	ctx, cancel = phase("restart after kill -9", cfg.phase)
	ready, err = b.startAndWait(ctx, w)
	cancel()
	if err != nil {
		t.Fatalf("scale: restart after kill -9: %v", err)
	}
	t.Logf("scale: restart after kill -9: first Metadata answer after %s, every partition led and error-free after %s; %s",
		ready.answered.Round(time.Millisecond), ready.allLed.Round(time.Millisecond), b.procStats())
	readBack("after kill -9")

	// Graceful stop: exit 0 within --shutdown-timeout.
	took, err := b.sigterm(t)
	switch {
	case err != nil:
		t.Errorf("scale: SIGTERM: %v (after %s)", err, took.Round(time.Millisecond))
	case took > cfg.shutdown:
		t.Errorf("scale: SIGTERM: exited 0 but after %s, more than --shutdown-timeout %s", took.Round(time.Millisecond), cfg.shutdown)
	default:
		t.Logf("scale: SIGTERM: exit status 0 after %s", took.Round(time.Millisecond))
	}

	ctx, cancel = phase("restart after SIGTERM", cfg.phase)
	ready, err = b.startAndWait(ctx, w)
	cancel()
	if err != nil {
		t.Fatalf("scale: restart after SIGTERM: %v", err)
	}
	t.Logf("scale: restart after a clean stop: first Metadata answer after %s, every partition led and error-free after %s; %s",
		ready.answered.Round(time.Millisecond), ready.allLed.Round(time.Millisecond), b.procStats())
	readBack("after a clean restart")

	b.reportLog(t)
	t.Logf("scale: whole test %s", time.Since(testStart).Round(time.Millisecond))
}

type scaleConfig struct {
	partitions int
	nofile     int
	shutdown   time.Duration
	budget     time.Duration
	phase      time.Duration
	stall      time.Duration
}

func scaleConfigFromEnv(t *testing.T) scaleConfig {
	t.Helper()
	c := scaleConfig{partitions: 20000, nofile: 4096, shutdown: 10 * time.Second, budget: 110 * time.Second, phase: 40 * time.Second, stall: 5 * time.Second}
	ints := []struct {
		env string
		v   *int
	}{{"SCALE_PARTITIONS", &c.partitions}, {"SCALE_NOFILE", &c.nofile}}
	for _, e := range ints {
		if s := os.Getenv(e.env); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a count", e.env, s)
			}
			*e.v = n
		}
	}
	durs := []struct {
		env string
		v   *time.Duration
	}{{"SCALE_SHUTDOWN_TIMEOUT", &c.shutdown}, {"SCALE_BUDGET", &c.budget}, {"SCALE_PHASE_TIMEOUT", &c.phase}, {"SCALE_STALL", &c.stall}}
	for _, e := range durs {
		if s := os.Getenv(e.env); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 {
				t.Fatalf("%s=%q: want a positive duration", e.env, s)
			}
			*e.v = d
		}
	}
	return c
}

// lowPorts returns n distinct loopback ports below 32768 (outside Linux's
// default ephemeral range) that were free a moment ago.
func lowPorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for attempt := 0; len(ports) < n; attempt++ {
		if attempt == 500 {
			t.Fatalf("no free loopback port below 32768 after %d tries", attempt)
		}
		p := 20000 + rand.IntN(12768)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		lns = append(lns, ln)
		ports = append(ports, p)
	}
	return ports
}

// ---- the broker process -----------------------------------------------------

// scaleBroker is bin/synapse run under prlimit (which execs it: the PID is
// the broker's).
type scaleBroker struct {
	prlimit, bin     string
	cfg              scaleConfig
	port, httpPort   int
	dataDir, logPath string
	logFile          *os.File
	starts           int

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	peakFDs int // most descriptors seen open since the last procStats
}

func newScaleBroker(t *testing.T, prlimit, bin string, cfg scaleConfig) *scaleBroker {
	t.Helper()
	ports := lowPorts(t, 2)
	dir := t.TempDir()
	b := &scaleBroker{prlimit: prlimit, bin: bin, cfg: cfg, port: ports[0], httpPort: ports[1],
		dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "synapse.log")}
	f, err := os.Create(b.logPath)
	if err != nil {
		t.Fatal(err)
	}
	b.logFile = f
	t.Cleanup(func() {
		b.mu.Lock()
		cmd, exited := b.cmd, b.exited
		b.mu.Unlock()
		if cmd != nil {
			// The graceful stop was tested already: the last broker is
			// killed, so a slow stop does not stretch the test.
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b.dumpLog(t)
		}
		b.logFile.Close()
	})
	return b
}

func (b *scaleBroker) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

func (b *scaleBroker) args() []string {
	return []string{"serve",
		"--listen", b.Addr(), "--advertised-addr", b.Addr(),
		"--data-dir", b.dataDir,
		"--http-listen", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.httpPort)),
		"--log-level", "warn",
		"--shutdown-timeout", b.cfg.shutdown.String(),
	}
}

func (b *scaleBroker) pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return 0
	}
	return b.cmd.Process.Pid
}

// readiness is how long a start took: until Metadata answered at all, and
// (with a workload) until it answered every partition of it with a leader
// and no error.
type readiness struct {
	answered, allLed time.Duration
}

// startAndWait starts the broker and waits, within ctx, for Metadata to
// answer; with w, for Metadata to show every partition of w led, in sync
// and error-free.
func (b *scaleBroker) startAndWait(ctx context.Context, w *scaleWorkload) (readiness, error) {
	var r readiness
	b.mu.Lock()
	if b.cmd != nil {
		b.mu.Unlock()
		return r, errors.New("start while running")
	}
	b.starts++
	lim := strconv.Itoa(b.cfg.nofile)
	args := append([]string{"--nofile=" + lim + ":" + lim, b.bin}, b.args()...)
	fmt.Fprintf(b.logFile, "=== scale test: start #%d: %s %s\n", b.starts, b.prlimit, strings.Join(args, " "))
	cmd := exec.Command(b.prlimit, args...)
	cmd.Stdout, cmd.Stderr = b.logFile, b.logFile
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		b.mu.Unlock()
		return r, err
	}
	exited := make(chan struct{})
	b.cmd, b.exited, b.peakFDs = cmd, exited, 0
	go func() {
		err := cmd.Wait()
		b.mu.Lock()
		b.waitErr = err
		b.mu.Unlock()
		close(exited)
	}()
	go b.sampleFDs(cmd.Process.Pid, exited)
	b.mu.Unlock()

	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.DialTimeout(time.Second), kgo.RetryTimeout(time.Second))
	if err != nil {
		return r, err
	}
	defer cl.Close()
	var last string
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		md, err := scaleMetadata(actx, cl)
		cancel()
		if err == nil {
			if r.answered == 0 {
				r.answered = time.Since(t0)
			}
			if w == nil || md.ok(w) {
				if w == nil {
					r.allLed = r.answered
				} else {
					r.allLed = time.Since(t0)
				}
				return r, nil
			}
			last = md.problems(w)
		} else {
			last = err.Error()
		}
		select {
		case <-exited:
			b.mu.Lock()
			werr := b.waitErr
			b.cmd, b.exited = nil, nil
			b.mu.Unlock()
			return r, fmt.Errorf("the broker exited while starting (%v); last Metadata: %s", werr, last)
		case <-ctx.Done():
			return r, fmt.Errorf("not ready after %s (%d Metadata attempts); last: %s", time.Since(t0).Round(time.Millisecond), attempt, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sampleFDs keeps peakFDs, counting /proc/PID/fd every 20 ms until the
// process exits.
func (b *scaleBroker) sampleFDs(pid int, exited <-chan struct{}) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-exited:
			return
		case <-tick.C:
		}
		n := countFDs(dir)
		b.mu.Lock()
		b.peakFDs = max(b.peakFDs, n)
		b.mu.Unlock()
	}
}

func countFDs(dir string) int {
	f, err := os.Open(dir)
	if err != nil {
		return 0
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return len(names)
}

func (b *scaleBroker) kill9(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	cmd, exited := b.cmd, b.exited
	b.mu.Unlock()
	if cmd == nil {
		t.Fatal("scale: kill -9 of a broker that is not running")
	}
	select {
	case <-exited:
		t.Errorf("scale: the broker had exited on its own before kill -9: %v", b.waitErr)
	default:
		cmd.Process.Kill()
		<-exited
	}
	fmt.Fprintf(b.logFile, "=== scale test: pid %d killed (SIGKILL)\n", cmd.Process.Pid)
	b.mu.Lock()
	b.cmd, b.exited = nil, nil
	b.mu.Unlock()
}

// sigterm stops the broker with SIGTERM and returns how long it took to
// exit and its exit error. Past --shutdown-timeout + 5 s it is killed.
func (b *scaleBroker) sigterm(t *testing.T) (time.Duration, error) {
	t.Helper()
	b.mu.Lock()
	cmd, exited := b.cmd, b.exited
	b.mu.Unlock()
	if cmd == nil {
		t.Fatal("scale: SIGTERM to a broker that is not running")
	}
	t0 := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case <-exited:
		b.mu.Lock()
		err = b.waitErr
		b.mu.Unlock()
	case <-time.After(b.cfg.shutdown + 5*time.Second):
		cmd.Process.Kill()
		<-exited
		err = fmt.Errorf("still running %s after SIGTERM; killed", b.cfg.shutdown+5*time.Second)
	}
	took := time.Since(t0)
	fmt.Fprintf(b.logFile, "=== scale test: pid %d stopped by SIGTERM after %s: %v\n", cmd.Process.Pid, took, err)
	b.mu.Lock()
	b.cmd, b.exited = nil, nil
	b.mu.Unlock()
	return took, err
}

// procStats is the broker's resident memory, open descriptors and the
// descriptor limit it runs under.
func (b *scaleBroker) procStats() string {
	pid := b.pid()
	if pid == 0 {
		return "not running"
	}
	rss := "?"
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for l := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				if kb, err := strconv.ParseFloat(strings.Fields(v)[0], 64); err == nil {
					rss = fmt.Sprintf("%.0f MiB", kb/1024)
				}
			}
		}
	}
	fds := countFDs(fmt.Sprintf("/proc/%d/fd", pid))
	b.mu.Lock()
	peak := max(b.peakFDs, fds)
	b.peakFDs = 0
	b.mu.Unlock()
	limit := "?"
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid)); err == nil {
		for l := range strings.SplitSeq(string(data), "\n") {
			if strings.HasPrefix(l, "Max open files") {
				if f := strings.Fields(l); len(f) >= 4 {
					limit = f[3]
				}
			}
		}
	}
	return fmt.Sprintf("broker RSS %s, open fds %d, at most %d since the last report (limit %s)", rss, fds, peak, limit)
}

// reportLog sums up the broker's log: lines per level, logger and message
// (and "op" where there is one), and how many mention EMFILE.
func (b *scaleBroker) reportLog(t *testing.T) {
	t.Helper()
	f, err := os.Open(b.logPath)
	if err != nil {
		t.Logf("scale: broker log: %v", err)
		return
	}
	defer f.Close()
	kinds := map[string]int{}
	first := map[string]string{}
	emfile := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "too many open files") {
			emfile++
		}
		// console format: time, level, logger, message, JSON fields
		f := strings.SplitN(l, "\t", 5)
		if len(f) < 4 || (f[1] != "WARN" && f[1] != "ERROR" && f[1] != "DPANIC" && f[1] != "FATAL") {
			continue
		}
		key := f[1] + " " + f[2] + ": " + f[3]
		if len(f) == 5 {
			if _, op, ok := strings.Cut(f[4], `"op": "`); ok {
				op, _, _ = strings.Cut(op, `"`)
				key += " (op " + op + ")"
			}
		}
		if kinds[key] == 0 {
			first[key] = l
		}
		kinds[key]++
	}
	keys := slices.Collect(maps.Keys(kinds))
	slices.SortFunc(keys, func(a, b string) int { return kinds[b] - kinds[a] })
	t.Logf("scale: broker log: %d kinds of warning or error, %d lines mention \"too many open files\"", len(keys), emfile)
	for _, k := range keys {
		t.Logf("scale: broker log: %6d× %s; first: %s", kinds[k], k, truncate(first[k], 300))
	}
}

func (b *scaleBroker) dumpLog(t *testing.T) { dumpLogFile(t, b.logPath) }

// ---- the workload ------------------------------------------------------------

type scaleWorkload struct {
	topics   []string
	perTopic int
	total    int
}

func newScaleWorkload(cfg scaleConfig) *scaleWorkload {
	per := min(100, cfg.partitions)
	n := cfg.partitions / per
	run := time.Now().UnixNano() & 0xffffff
	w := &scaleWorkload{perTopic: per, total: n * per}
	for i := range n {
		w.topics = append(w.topics, fmt.Sprintf("scale-%x-%04d", run, i))
	}
	return w
}

func scaleValue(topic string, p int32) string { return fmt.Sprintf("scale %s/%d", topic, p) }

type createResult struct {
	ok   int
	took time.Duration
	errs []string
}

// create creates the topics with kadm, 20 topics (2000 partitions) per
// CreateTopics request, one request at a time.
func (w *scaleWorkload) create(ctx context.Context, t *testing.T, addr string) createResult {
	t.Helper()
	var r createResult
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RetryTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	adm.SetTimeoutMillis(30_000)
	t0 := time.Now()
	for batch := range slices.Chunk(w.topics, 20) {
		resps, err := adm.CreateTopics(ctx, int32(w.perTopic), 1, nil, batch...)
		if err != nil {
			r.errs = append(r.errs, fmt.Sprintf("CreateTopics of %d topics: %v", len(batch), err))
			break
		}
		for _, name := range batch {
			resp, found := resps[name]
			switch {
			case !found:
				r.errs = appendCapped(r.errs, name+": not in the response")
			case resp.Err != nil:
				r.errs = appendCapped(r.errs, fmt.Sprintf("%s: %v %s", name, resp.Err, resp.ErrMessage))
			default:
				r.ok++
			}
		}
	}
	r.took = time.Since(t0)
	return r
}

// scaleMD sums up a Metadata response of all topics.
type scaleMD struct {
	took       time.Duration
	brokers    int
	topics     map[string]int // topic → partitions listed
	topicErrs  map[string]int // error name → topics
	partErrs   map[string]int // error name → partitions
	offline    int            // partitions with offline replicas
	leaderless int            // partitions without a leader
	notInISR   int            // partitions whose leader is not in the ISR
	samples    []string
	ids        map[string][16]byte
}

func (m scaleMD) String() string {
	n := 0
	for _, c := range m.topics {
		n += c
	}
	return fmt.Sprintf("%d topics, %d partitions in %s", len(m.topics), n, m.took.Round(time.Millisecond))
}

// ok reports whether every partition of w is listed, led, in sync and
// without error or offline replica.
func (m scaleMD) ok(w *scaleWorkload) bool { return m.problems(w) == "" }

func (m scaleMD) problems(w *scaleWorkload) string {
	var p []string
	missing := 0
	for _, name := range w.topics {
		if m.topics[name] != w.perTopic {
			missing++
		}
	}
	if missing > 0 {
		p = append(p, fmt.Sprintf("%d topics missing or short of partitions", missing))
	}
	if len(m.topicErrs) > 0 {
		p = append(p, fmt.Sprintf("topic errors %v", m.topicErrs))
	}
	if len(m.partErrs) > 0 {
		p = append(p, fmt.Sprintf("partition errors %v", m.partErrs))
	}
	if m.offline > 0 {
		p = append(p, fmt.Sprintf("%d partitions with offline replicas", m.offline))
	}
	if m.leaderless > 0 {
		p = append(p, fmt.Sprintf("%d partitions without a leader", m.leaderless))
	}
	if m.notInISR > 0 {
		p = append(p, fmt.Sprintf("%d partitions whose leader is not in the ISR", m.notInISR))
	}
	if len(p) > 0 && len(m.samples) > 0 {
		p = append(p, "e.g. "+strings.Join(m.samples, ", "))
	}
	return strings.Join(p, "; ")
}

// metadata asks for the Metadata of all topics once.
func (w *scaleWorkload) metadata(ctx context.Context, addr string) (scaleMD, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return scaleMD{}, err
	}
	defer cl.Close()
	return scaleMetadata(ctx, cl)
}

// scaleMetadata sends one Metadata request for all topics (no cache).
func scaleMetadata(ctx context.Context, cl *kgo.Client) (scaleMD, error) {
	req := kmsg.NewPtrMetadataRequest() // Topics nil: all topics
	t0 := time.Now()
	resp, err := req.RequestWith(ctx, cl)
	m := scaleMD{took: time.Since(t0), topics: map[string]int{}, topicErrs: map[string]int{}, partErrs: map[string]int{}, ids: map[string][16]byte{}}
	if err != nil {
		return m, err
	}
	m.brokers = len(resp.Brokers)
	if m.brokers == 0 {
		return m, errors.New("Metadata lists no brokers")
	}
	for _, tp := range resp.Topics {
		name := ""
		if tp.Topic != nil {
			name = *tp.Topic
		}
		if tp.ErrorCode != 0 {
			m.topicErrs[kerr.ErrorForCode(tp.ErrorCode).Error()]++
			m.samples = appendCapped(m.samples, fmt.Sprintf("topic %s: %v", name, kerr.ErrorForCode(tp.ErrorCode)))
		}
		m.topics[name] = len(tp.Partitions)
		m.ids[name] = tp.TopicID
		for _, p := range tp.Partitions {
			bad := ""
			switch {
			case p.ErrorCode != 0:
				m.partErrs[kerr.ErrorForCode(p.ErrorCode).Error()]++
				bad = kerr.ErrorForCode(p.ErrorCode).Error()
			case p.Leader < 0:
				m.leaderless++
				bad = "no leader"
			case len(p.OfflineReplicas) > 0:
				m.offline++
				bad = fmt.Sprintf("offline replicas %v", p.OfflineReplicas)
			case !slices.Contains(p.ISR, p.Leader):
				m.notInISR++
				bad = fmt.Sprintf("leader %d not in ISR %v", p.Leader, p.ISR)
			}
			if bad != "" {
				m.samples = appendCapped(m.samples, fmt.Sprintf("%s/%d: %s", name, p.Partition, bad))
			}
		}
	}
	return m, nil
}

type produceResult struct {
	ok           int
	took         time.Duration
	errs         map[string]int // error → records
	retried      int            // partitions the broker answered with an error kgo retried
	retrySamples []string
	acked        map[string][]bool // topic → partition → acknowledged
	log          *scaleClientLog
}

func (r produceResult) errSummary() string {
	var s []string
	for e, n := range r.errs {
		s = append(s, fmt.Sprintf("%d× %s", n, e))
	}
	slices.Sort(s)
	return strings.Join(firstN(s, 5), "; ")
}

// produce sends one record with a known value to every partition through
// one kgo client (acks=all, idempotent), all buffered at once.
func (w *scaleWorkload) produce(ctx context.Context, addr string) produceResult {
	r := produceResult{errs: map[string]int{}, acked: map[string][]bool{}, log: &scaleClientLog{level: kgo.LogLevelDebug}}
	for _, name := range w.topics {
		r.acked[name] = make([]bool, w.perTopic)
	}
	deadline, _ := ctx.Deadline()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.MaxBufferedRecords(w.total+1),
		kgo.RecordDeliveryTimeout(time.Until(deadline)),
		// Any retry is already a failure of the test (the broker answered
		// an error): fail the records soon rather than at the deadline.
		kgo.RecordRetries(2),
		kgo.WithLogger(r.log))
	if err != nil {
		r.errs[err.Error()] = w.total
		return r
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, w.total)
	for _, name := range w.topics {
		for p := range int32(w.perTopic) {
			recs = append(recs, &kgo.Record{Topic: name, Partition: p, Key: []byte(strconv.Itoa(int(p))), Value: []byte(scaleValue(name, p))})
		}
	}
	t0 := time.Now()
	results := cl.ProduceSync(ctx, recs...)
	r.took = time.Since(t0)
	for _, res := range results {
		if res.Err != nil {
			r.errs[res.Err.Error()]++
		} else {
			r.ok++
			r.acked[res.Record.Topic][res.Record.Partition] = true
		}
	}
	r.retried, r.retrySamples = r.log.produceRetries()
	return r
}

type readResult struct {
	got       int
	took      time.Duration
	stopped   string
	missing   map[string][]int32
	wrong     []string // the first 20
	nWrong    int
	fetchErrs []string // the first 20
	nFetchErr int
	log       *scaleClientLog
}

// readAll reads every partition from the start in one consumer (no group)
// until it has one record of each, ctx ends, or no record came for stall.
func (w *scaleWorkload) readAll(ctx context.Context, addr string, stall time.Duration) readResult {
	r := readResult{log: &scaleClientLog{level: kgo.LogLevelInfo}, missing: map[string][]int32{}}
	seen := make(map[string][]bool, len(w.topics))
	for _, name := range w.topics {
		seen[name] = make([]bool, w.perTopic)
	}
	t0 := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr),
		kgo.ConsumeTopics(w.topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(time.Second),
		kgo.WithLogger(r.log))
	if err != nil {
		r.stopped = err.Error()
		return r
	}
	defer cl.Close()
	lastNew := time.Now()
	for r.got < w.total {
		if time.Since(lastNew) > stall {
			r.stopped = fmt.Sprintf("no new record for %s", stall)
			break
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			r.stopped = "phase deadline"
			break
		}
		for _, fe := range fs.Errors() {
			if errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled) {
				continue
			}
			r.nFetchErr++
			r.fetchErrs = appendCapped(r.fetchErrs, fmt.Sprintf("%s/%d: %v", fe.Topic, fe.Partition, fe.Err))
		}
		fs.EachRecord(func(rec *kgo.Record) {
			ps, ok := seen[rec.Topic]
			good := false
			defer func() {
				if !good {
					r.nWrong++
				}
			}()
			switch {
			case !ok || rec.Partition < 0 || int(rec.Partition) >= len(ps):
				r.wrong = appendCapped(r.wrong, fmt.Sprintf("record from %s/%d", rec.Topic, rec.Partition))
			case rec.Offset != 0 || string(rec.Value) != scaleValue(rec.Topic, rec.Partition):
				r.wrong = appendCapped(r.wrong, fmt.Sprintf("%s/%d offset %d value %q", rec.Topic, rec.Partition, rec.Offset, truncate(string(rec.Value), 60)))
			case ps[rec.Partition]:
				r.wrong = appendCapped(r.wrong, fmt.Sprintf("%s/%d offset 0 read twice", rec.Topic, rec.Partition))
			default:
				good = true
				ps[rec.Partition] = true
				r.got++
				lastNew = time.Now()
			}
		})
	}
	r.took = time.Since(t0)
	for name, ps := range seen {
		for p, ok := range ps {
			if !ok {
				r.missing[name] = append(r.missing[name], int32(p))
			}
		}
	}
	return r
}

// probeMissing sends one Fetch (no session, by topic name and id) of offset
// 0 of every missing partition and sums up what it answers.
func (w *scaleWorkload) probeMissing(ctx context.Context, addr string, missing map[string][]int32) string {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	md, err := scaleMetadata(ctx, cl)
	if err != nil {
		return "Metadata: " + err.Error()
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 0
	req.MaxBytes = 50 << 20
	for name, ps := range missing {
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = name, md.ids[name]
		for _, p := range ps {
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition = p
			rp.FetchOffset = 0
			rp.PartitionMaxBytes = 1 << 20
			rp.CurrentLeaderEpoch = -1
			rp.LogStartOffset = -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return "Fetch: " + err.Error()
	}
	if resp.ErrorCode != 0 {
		return "Fetch: top-level " + kerr.ErrorForCode(resp.ErrorCode).Error()
	}
	codes := map[string]int{}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			switch {
			case rp.ErrorCode != 0:
				codes[kerr.ErrorForCode(rp.ErrorCode).Error()]++
			case len(rp.RecordBatches) == 0:
				codes[fmt.Sprintf("no error, no records (high watermark %d)", rp.HighWatermark)]++
			default:
				codes["no error, records"]++
			}
		}
	}
	return fmt.Sprint(codes)
}

// ---- client logs ---------------------------------------------------------------

// scaleClientLog is a kgo.Logger that keeps what says a request failed:
// warnings and errors, lines at info or above with a non-nil err, and (at
// debug) the partitions of produce responses kgo retried or failed.
type scaleClientLog struct {
	level kgo.LogLevel

	mu          sync.Mutex
	n           int
	lines       []string
	retried     int
	retrySample []string
}

func (l *scaleClientLog) Level() kgo.LogLevel { return l.level }

func (l *scaleClientLog) Log(level kgo.LogLevel, msg string, kv ...any) {
	if level == kgo.LogLevelDebug {
		if msg != "produced" {
			return
		}
		// "to" lists topic[partition{base=>end}, retrying@base,n(err)}, err@base,n(err)}, ...]
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] != "to" {
				continue
			}
			s, _ := kv[i+1].(string)
			nr, ne := strings.Count(s, "retrying@"), strings.Count(s, "err@")
			if nr+ne == 0 {
				continue
			}
			l.mu.Lock()
			l.retried += nr + ne
			if len(l.retrySample) < 3 {
				l.retrySample = append(l.retrySample, truncate(s, 300))
			}
			l.mu.Unlock()
		}
		return
	}
	failed := level <= kgo.LogLevelWarn
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] == "err" {
			if err, ok := kv[i+1].(error); ok && err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
				failed = true
			}
		}
	}
	if !failed {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if len(l.lines) < 5 {
		l.lines = append(l.lines, truncate(fmt.Sprintf("[%s] %s %v", level, msg, kv), 400))
	}
}

func (l *scaleClientLog) produceRetries() (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.retried, slices.Clone(l.retrySample)
}

// report fails t if the client logged errors.
func (l *scaleClientLog) report(t *testing.T, who string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n > 0 {
		t.Errorf("scale: the %s logged %d errors, first: %s", who, l.n, strings.Join(l.lines, " | "))
	}
}

// ---- helpers -----------------------------------------------------------------

// appendCapped appends s to a list kept to 20 entries (an error summary,
// not a copy of 20 000 identical lines).
func appendCapped(list []string, s string) []string {
	if len(list) >= 20 {
		return list
	}
	return append(list, s)
}

func firstN(s []string, n int) []string { return s[:min(n, len(s))] }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
