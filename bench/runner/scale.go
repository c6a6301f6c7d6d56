package main

// The scale block (issue 16: "100 000 partitions on one broker"): for each
// size in -scale, a fresh broker on a fresh data directory, Synapse then
// kfake, each run under `prlimit --nofile=H:H` with H this machine's hard
// descriptor limit. Topics have 100 partitions. Measured once per size:
//
//   - create: CreateTopics, 20 topics (2000 partitions) per request, one
//     request at a time;
//   - Metadata of all topics: the median of -scale-metadata-requests
//     requests (after one to warm the connection), right after the create
//     (with the broker's first maintenance pass over the new partitions)
//     and again idle after the produce;
//   - produce: one record to every partition, one kgo client, one
//     ProduceSync (acks=all, idempotent);
//   - idle RSS (VmRSS) 3 s after the produce, and per partition over the
//     empty broker's;
//   - fetch-all: one consumer (no group) reading every partition from the
//     start until it has the record of each;
//   - Synapse only: kill -9, then restart until Metadata answers every
//     partition led and error-free; idle RSS and fetch-all again;
//   - graceful stop: SIGTERM until exit.
//
// Errors the broker answered are counted, not fatal: a size that breaks the
// broker still reports how. With -scale-pprof DIR, Synapse runs with its
// profiler on the HTTP side port and the block saves CPU profiles of each
// phase (back-to-back 1 s profiles: `go tool pprof -top DIR/<phase>/*`) and
// heap profiles after the produce and after the restart; those runs' timings
// include the profiling.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

type scaleOptions struct {
	sizes      []int
	only       bool
	kfake      bool
	mdRequests int
	phase      time.Duration
	stall      time.Duration
	stopWait   time.Duration
	pprofDir   string
}

// scaleFlags registers the scale block's flags.
func scaleFlags(o *scaleOptions) {
	flag.Func("scale", "scale block: partition counts, comma separated (e.g. 1000,10000,100000; k for thousands); empty: no scale block", func(s string) error {
		o.sizes = nil
		for f := range strings.SplitSeq(s, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			mult := 1
			if v, ok := strings.CutSuffix(strings.ToLower(f), "k"); ok {
				f, mult = v, 1000
			}
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				return fmt.Errorf("bad partition count %q", f)
			}
			o.sizes = append(o.sizes, n*mult)
		}
		return nil
	})
	flag.BoolVar(&o.only, "scale-only", false, "run only the scale block")
	flag.BoolVar(&o.kfake, "scale-kfake", true, "also kfake in the scale block")
	flag.IntVar(&o.mdRequests, "scale-metadata-requests", 5, "Metadata requests of all topics per size (the median is reported)")
	flag.DurationVar(&o.phase, "scale-phase-timeout", 10*time.Minute, "bound on each phase of the scale block (create, produce, fetch-all, restart)")
	flag.DurationVar(&o.stall, "scale-stall", 30*time.Second, "a fetch-all ends once no new record came for this long")
	flag.DurationVar(&o.stopWait, "scale-stop-timeout", 2*time.Minute, "how long a graceful stop may take before the broker is killed (and the figure reported as at least this)")
	flag.StringVar(&o.pprofDir, "scale-pprof", "", "save Synapse CPU and heap profiles of each scale phase under this directory")
}

// Scale metric names: the sample key is scaleKey(size, name).
const (
	scStart       = "start-up, empty dir (s)"
	scCreate      = "create topics (s)"
	scMetadata    = "Metadata, all topics, right after create, median (ms)"
	scMetadataIdl = "Metadata, all topics, idle after produce, median (ms)"
	scProduce     = "produce 1 record to each partition (s)"
	scRSSEmpty    = "RSS, empty broker (MiB)"
	scRSS         = "idle RSS after produce (MiB)"
	scRSSPer      = "  per partition over empty (KiB)"
	scFetch       = "fetch-all, 1 consumer (s)"
	scRestart     = "restart after kill -9 until Metadata shows all (s)"
	scFirstAnswer = "  of which until the first Metadata answer (s)"
	scRSSRestart  = "idle RSS after restart (MiB)"
	scFetch2      = "fetch-all after restart (s)"
	scStop        = "graceful stop, SIGTERM to exit (s)"
	scFDs         = "open fds, idle after produce"
	scErrCreate   = "errors: topics not created"
	scErrProduce  = "errors: records not acknowledged"
	scErrFetch    = "errors: partitions not read back"
	scErrFetch2   = "errors: not read back after restart"
	scErrMD       = "errors: Metadata partitions with error/offline"
	scLogEMFILE   = "broker log lines with EMFILE"
)

var scaleOrder = []string{scStart, scCreate, scMetadata, scMetadataIdl, scProduce, scRSSEmpty, scRSS, scRSSPer, scFDs, scFetch,
	scRestart, scFirstAnswer, scRSSRestart, scFetch2, scStop,
	scErrCreate, scErrProduce, scErrMD, scErrFetch, scErrFetch2, scLogEMFILE}

func scaleKey(size int, name string) string { return fmt.Sprintf("scale %d %s", size, name) }

// scaleBlock runs every size on Synapse, then on kfake.
func (r *runner) scaleBlock() error {
	hard, err := hardNofile()
	if err != nil {
		return err
	}
	r.scaleNofile = hard
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		return fmt.Errorf("scale: prlimit (util-linux) runs the brokers at the hard descriptor limit: %w", err)
	}
	for _, n := range r.o.scale.sizes {
		fmt.Fprintf(os.Stderr, "scale: %d partitions (nofile %d)\n", n, hard)
		names := []string{"synapse"}
		if r.o.scale.kfake {
			names = append(names, "kfake")
		}
		for _, name := range names {
			if err := r.scaleSlot(prlimit, name, n); err != nil {
				// A broker that cannot do this size: noted, the block goes on.
				fmt.Fprintf(os.Stderr, "scale: %s at %d partitions: %v\n", name, n, err)
				r.scaleFailures = append(r.scaleFailures, fmt.Sprintf("%s at %d partitions: %v", name, n, err))
			}
		}
	}
	return nil
}

func hardNofile() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	return lim.Max, nil
}

// lowAddr is a free loopback address below port 32768 (outside Linux's
// default ephemeral range, where clients' ports come from).
func lowAddr() (string, error) {
	for range 500 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+rand.IntN(12768)))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		return addr, nil
	}
	return "", errors.New("no free loopback port below 32768")
}

// scaleProc is a broker process of the scale block.
type scaleProc struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

func (p *scaleProc) pid() int { return p.cmd.Process.Pid }

// wait waits up to d for the process to exit.
func (p *scaleProc) wait(d time.Duration) (error, bool) {
	select {
	case <-p.exited:
		return p.waitErr, true
	case <-time.After(d):
		return nil, false
	}
}

func (p *scaleProc) kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

// scaleBroker starts and restarts one broker (by name) on one data
// directory under prlimit.
type scaleBroker struct {
	name, prlimit string
	bin           string
	nofile        uint64
	addr, http    string
	dir           string
	logf          *os.File
	pprof         bool
}

func (b *scaleBroker) start() (*scaleProc, error) {
	lim := strconv.FormatUint(b.nofile, 10)
	args := []string{"--nofile=" + lim + ":" + lim, b.bin}
	switch b.name {
	case "synapse":
		args = append(args, "serve", "--listen", b.addr, "--advertised-addr", b.addr, "--data-dir", b.dir,
			"--http-listen", b.http, "--log-level", "warn")
		if b.pprof {
			args = append(args, "--pprof")
		}
	default:
		args = append(args, "--listen", b.addr, "--data-dir", b.dir)
	}
	fmt.Fprintf(b.logf, "=== bench scale: %s %s\n", b.prlimit, strings.Join(args, " "))
	cmd := exec.Command(b.prlimit, args...)
	cmd.Stdout, cmd.Stderr = b.logf, b.logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &scaleProc{cmd: cmd, exited: make(chan struct{})}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	return p, nil
}

// waitMetadata polls Metadata (all topics) until it answers and, with want
// > 0, lists want partitions all led and error-free; it returns how long
// after t0 the first answer and the full one came.
func waitMetadata(ctx context.Context, p *scaleProc, addr string, want int, t0 time.Time) (first, all time.Duration, err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DialTimeout(time.Second), kgo.RetryTimeout(time.Second))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	last := ""
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		md, err := scaleMetadata(actx, cl)
		cancel()
		if err == nil {
			if first == 0 {
				first = time.Since(t0)
			}
			if md.good >= want {
				return first, time.Since(t0), nil
			}
			last = fmt.Sprintf("%d of %d partitions good", md.good, want)
		} else {
			last = err.Error()
		}
		select {
		case <-p.exited:
			return first, 0, fmt.Errorf("exited while starting (%v); last Metadata: %s", p.waitErr, last)
		case <-ctx.Done():
			return first, 0, fmt.Errorf("not ready after %s; last Metadata: %s", time.Since(t0).Round(time.Millisecond), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

type scaleMD struct {
	partitions, good, bad int
}

// scaleMetadata sends one Metadata request of all topics.
func scaleMetadata(ctx context.Context, cl *kgo.Client) (scaleMD, error) {
	var m scaleMD
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		return m, err
	}
	if len(resp.Brokers) == 0 {
		return m, errors.New("no brokers")
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			m.partitions++
			if t.ErrorCode == 0 && p.ErrorCode == 0 && p.Leader >= 0 && len(p.OfflineReplicas) == 0 {
				m.good++
			} else {
				m.bad++
			}
		}
	}
	return m, nil
}

// scaleSlot measures one broker at n partitions.
func (r *runner) scaleSlot(prlimit, name string, n int) (err error) {
	so := r.o.scale
	root, err := os.MkdirTemp("", "synapse-bench-scale-"+name+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	logf, err := os.Create(filepath.Join(root, "broker.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	b := &scaleBroker{name: name, prlimit: prlimit, bin: r.o.kfake, nofile: r.scaleNofile, dir: filepath.Join(root, "data"), logf: logf}
	if name == "synapse" {
		b.bin, b.http, b.pprof = r.o.synapse, "", so.pprofDir != ""
	}
	if b.addr, err = lowAddr(); err != nil {
		return err
	}
	if b.pprof {
		if b.http, err = lowAddr(); err != nil {
			return err
		}
	}
	add := func(metric string, v float64) { r.add(scaleKey(n, metric), name, v) }
	profile := func(phase string) func() {
		if !b.pprof {
			return func() {}
		}
		return startCPUProfiles(b.http, filepath.Join(so.pprofDir, fmt.Sprintf("synapse-%d-%s", n, phase)))
	}
	phaseCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), so.phase)
	}

	t0 := time.Now()
	p, err := b.start()
	if err != nil {
		return err
	}
	defer func() {
		if p != nil {
			p.kill()
		}
		emfile := countInFile(logf.Name(), "too many open files")
		add(scLogEMFILE, float64(emfile))
	}()
	ctx, cancel := phaseCtx()
	_, ready, err := waitMetadata(ctx, p, b.addr, 0, t0)
	cancel()
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	add(scStart, ready.Seconds())
	time.Sleep(time.Second)
	rss0 := rssMiB(p.pid())
	add(scRSSEmpty, rss0)

	w := newScaleWork(n)
	stop := profile("create")
	ctx, cancel = phaseCtx()
	took, failed := w.create(ctx, b.addr)
	cancel()
	stop()
	add(scCreate, took.Seconds())
	add(scErrCreate, float64(failed))

	// Metadata latency (and its profile, over a few seconds of requests).
	stop = profile("metadata")
	md, lat, err := w.metadataLatency(b.addr, so.mdRequests, b.pprof)
	stop()
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	add(scMetadata, lat.Seconds()*1e3)

	stop = profile("produce")
	ctx, cancel = phaseCtx()
	took, acked := w.produce(ctx, b.addr)
	cancel()
	stop()
	add(scProduce, took.Seconds())
	add(scErrProduce, float64(w.total-acked))
	if md, err = w.metadataOnce(b.addr); err == nil {
		add(scErrMD, float64(md.bad+(w.total-md.partitions)))
	}

	time.Sleep(3 * time.Second)
	rss := rssMiB(p.pid())
	add(scRSS, rss)
	add(scRSSPer, (rss-rss0)*1024/float64(n))
	add(scFDs, float64(countFDs(p.pid())))
	if _, lat, err := w.metadataLatency(b.addr, so.mdRequests, false); err == nil {
		add(scMetadataIdl, lat.Seconds()*1e3)
	}
	if b.pprof {
		saveHeap(b.http, filepath.Join(so.pprofDir, fmt.Sprintf("synapse-%d-heap-after-produce.pb.gz", n)))
	}

	stop = profile("fetch-all")
	ctx, cancel = phaseCtx()
	took, got := w.fetchAll(ctx, b.addr, so.stall)
	cancel()
	stop()
	add(scFetch, took.Seconds())
	add(scErrFetch, float64(acked-got))

	if name == "synapse" {
		p.kill()
		p = nil
		t0 := time.Now()
		if p, err = b.start(); err != nil {
			return err
		}
		ctx, cancel := phaseCtx()
		first, all, err := waitMetadata(ctx, p, b.addr, w.total, t0)
		cancel()
		if err != nil {
			return fmt.Errorf("restart after kill -9: %w", err)
		}
		add(scRestart, all.Seconds())
		add(scFirstAnswer, first.Seconds())
		time.Sleep(3 * time.Second)
		add(scRSSRestart, rssMiB(p.pid()))
		if b.pprof {
			saveHeap(b.http, filepath.Join(so.pprofDir, fmt.Sprintf("synapse-%d-heap-after-restart.pb.gz", n)))
		}
		stop = profile("fetch-all-after-restart")
		ctx, cancel = phaseCtx()
		took, got := w.fetchAll(ctx, b.addr, so.stall)
		cancel()
		stop()
		add(scFetch2, took.Seconds())
		add(scErrFetch2, float64(acked-got))
	}

	stop = profile("stop")
	t1 := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	werr, exited := p.wait(so.stopWait)
	stop()
	if !exited {
		add(scStop, so.stopWait.Seconds())
		return fmt.Errorf("still running %s after SIGTERM (killed; the stop figure is that bound)", so.stopWait)
	}
	p = nil
	add(scStop, time.Since(t1).Seconds())
	if werr != nil {
		return fmt.Errorf("after SIGTERM: %v", werr)
	}
	return nil
}

type scaleWork struct {
	topics   []string
	perTopic int
	total    int
}

func newScaleWork(n int) *scaleWork {
	per := min(100, n)
	w := &scaleWork{perTopic: per, total: n / per * per}
	for i := range n / per {
		w.topics = append(w.topics, fmt.Sprintf("scale-%06d", i))
	}
	return w
}

// create creates the topics, 20 per request; it returns the time and how
// many topics failed.
func (w *scaleWork) create(ctx context.Context, addr string) (time.Duration, int) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RetryTimeout(10*time.Second))
	if err != nil {
		return 0, len(w.topics)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	adm.SetTimeoutMillis(60_000)
	failed := 0
	var first []string
	t0 := time.Now()
	for batch := range slices.Chunk(w.topics, 20) {
		resps, err := adm.CreateTopics(ctx, int32(w.perTopic), 1, nil, batch...)
		if err != nil {
			failed += len(batch)
			first = append(first, err.Error())
			continue
		}
		for _, name := range batch {
			if res, ok := resps[name]; !ok || res.Err != nil {
				failed++
				if ok && len(first) < 3 {
					first = append(first, fmt.Sprintf("%s: %v", name, res.Err))
				}
			}
		}
	}
	took := time.Since(t0)
	if failed > 0 {
		fmt.Fprintf(os.Stderr, "  create: %d topics failed, e.g. %s\n", failed, strings.Join(first, "; "))
	}
	return took, failed
}

func (w *scaleWork) metadataOnce(addr string) (scaleMD, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return scaleMD{}, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return scaleMetadata(ctx, cl)
}

// metadataLatency is the median of k Metadata requests of all topics on
// one connection, after one to warm it; with soak, more requests follow
// for 5 s (for the profile).
func (w *scaleWork) metadataLatency(addr string, k int, soak bool) (scaleMD, time.Duration, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return scaleMD{}, 0, err
	}
	defer cl.Close()
	var lats []float64
	var md scaleMD
	soakUntil := time.Time{}
	for i := 0; i <= k || time.Now().Before(soakUntil); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t0 := time.Now()
		m, err := scaleMetadata(ctx, cl)
		d := time.Since(t0)
		cancel()
		if err != nil {
			return md, 0, err
		}
		if i == 0 {
			md = m
			if soak {
				soakUntil = time.Now().Add(5 * time.Second)
			}
			continue
		}
		if i <= k {
			lats = append(lats, float64(d))
		}
	}
	if md.partitions != w.total || md.bad > 0 {
		fmt.Fprintf(os.Stderr, "  Metadata: %d partitions listed (want %d), %d with an error or offline\n", md.partitions, w.total, md.bad)
	}
	return md, time.Duration(median(lats)), nil
}

// produce sends one record to every partition in one ProduceSync; it
// returns the time and how many were acknowledged.
func (w *scaleWork) produce(ctx context.Context, addr string) (time.Duration, int) {
	deadline, _ := ctx.Deadline()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.MaxBufferedRecords(w.total+1),
		kgo.RecordDeliveryTimeout(time.Until(deadline)),
		kgo.RecordRetries(3)) // a broker answering errors: counted, not waited out
	if err != nil {
		return 0, 0
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, w.total)
	for _, name := range w.topics {
		for p := range int32(w.perTopic) {
			recs = append(recs, &kgo.Record{Topic: name, Partition: p, Value: []byte(name + "/" + strconv.Itoa(int(p)))})
		}
	}
	t0 := time.Now()
	res := cl.ProduceSync(ctx, recs...)
	took := time.Since(t0)
	ok := 0
	errs := map[string]int{}
	for _, r := range res {
		if r.Err == nil {
			ok++
		} else {
			errs[r.Err.Error()]++
		}
	}
	for e, c := range errs {
		fmt.Fprintf(os.Stderr, "  produce: %d× %s\n", c, e)
	}
	return took, ok
}

// fetchAll reads every partition from the start in one consumer until it
// has one record from each, ctx ends, or nothing new came for stall; it
// returns the time to the last record and the partitions read.
func (w *scaleWork) fetchAll(ctx context.Context, addr string, stall time.Duration) (time.Duration, int) {
	seen := make(map[string][]bool, len(w.topics))
	for _, name := range w.topics {
		seen[name] = make([]bool, w.perTopic)
	}
	t0 := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr),
		kgo.ConsumeTopics(w.topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(time.Second))
	if err != nil {
		return 0, 0
	}
	defer cl.Close()
	got, last := 0, time.Now()
	errs := map[string]int{}
	for got < w.total && ctx.Err() == nil && time.Since(last) < stall {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				errs[err.Error()]++
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			if ps, ok := seen[r.Topic]; ok && int(r.Partition) < len(ps) && !ps[r.Partition] {
				ps[r.Partition] = true
				got++
				last = time.Now()
			}
		})
	}
	for e, c := range errs {
		fmt.Fprintf(os.Stderr, "  fetch: %d× %s\n", c, e)
	}
	return last.Sub(t0), got
}

// startCPUProfiles saves back-to-back 1 s CPU profiles from the broker's
// /debug/pprof/profile into dir until the returned func is called (which
// waits for the one running).
func startCPUProfiles(httpAddr, dir string) func() {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "  pprof:", err)
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if err := httpSave("http://"+httpAddr+"/debug/pprof/profile?seconds=1", filepath.Join(dir, fmt.Sprintf("cpu-%03d.pb.gz", i))); err != nil {
				fmt.Fprintln(os.Stderr, "  pprof:", err)
				return
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func saveHeap(httpAddr, path string) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
		err = httpSave("http://"+httpAddr+"/debug/pprof/heap?gc=1", path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "  pprof heap:", err)
		}
	}
}

func httpSave(url, path string) error {
	c := &http.Client{Timeout: time.Minute}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func countFDs(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return len(names)
}

func countInFile(path, s string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			n++
		}
	}
	return n
}

func (r *runner) reportScale(w io.Writer) {
	fmt.Fprintf(w, "\nScale (issue 16): one broker, topics of 100 partitions, each size on a fresh broker and data directory, measured once; brokers under prlimit --nofile=%d:%d (this machine's hard limit).\n",
		r.scaleNofile, r.scaleNofile)
	fmt.Fprintln(w, "Synapse with its defaults (durable, local file tier, --max-open-files 1024); kfake persisting to its data directory. Create: 20 topics per CreateTopics, one at a time; produce: one kgo")
	fmt.Fprintf(w, "ProduceSync of one record per partition (acks=all); Metadata: all topics, median of %d; fetch-all: one consumer from the start until it has every record.", r.o.scale.mdRequests)
	if r.o.scale.pprofDir != "" {
		fmt.Fprintf(w, " Profiled runs (-scale-pprof %s): timings include the profiler.", r.o.scale.pprofDir)
	}
	fmt.Fprintln(w, "\n\n| partitions | measure | Synapse | kfake | Synapse/kfake |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, n := range r.o.scale.sizes {
		for _, m := range scaleOrder {
			s, k := r.samples[scaleKey(n, m)]["synapse"], r.samples[scaleKey(n, m)]["kfake"]
			if len(s) == 0 && len(k) == 0 {
				continue
			}
			ratio := "—"
			if len(s) > 0 && len(k) > 0 && median(k) > 0 && !strings.HasPrefix(m, "errors") {
				ratio = fmt.Sprintf("%.2f×", median(s)/median(k))
			}
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s |\n", n, m, scaleNum(s), scaleNum(k), ratio)
		}
	}
	for _, f := range r.scaleFailures {
		fmt.Fprintf(w, "\nFailed: %s\n", f)
	}
}

func scaleNum(v []float64) string {
	if len(v) == 0 {
		return "—"
	}
	f := median(v)
	if f == float64(int64(f)) && f < 1e9 {
		return strconv.FormatInt(int64(f), 10)
	}
	return num(f)
}
