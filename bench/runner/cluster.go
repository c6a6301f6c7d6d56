package main

// The cluster block (issue 20): three `synapse serve --cluster` brokers
// over one etcd process (-etcd, etcd's own server), against one
// single-node Synapse broker, each fresh per round, all on this machine:
//
//   - CL1: acks=all latency: -cluster-requests single 100 B records one
//     after another (franz-go ProduceSync), to a topic of 3 replicas (min
//     ISR 2) on the cluster, of 1 on the single node. p50 and p99. Goal
//     p50 ≤ 1 ms and p99 ≤ 5 ms on the cluster.
//   - CL2: aggregate produce: -cluster-records records of 1 KiB over 12
//     partitions by 3 producers (one per broker as bootstrap), acks=all,
//     idempotent. MB/s. Goal: the cluster ≥ 0.8 × N/RF = 0.8 × the single
//     broker (N = RF = 3). Also the bytes stored (every replica's copy)
//     per CPU-second of the brokers: the cost of a byte to a broker,
//     what decides the aggregate when each broker has a machine of its
//     own (here they share one).
//   - CL3: transactions: one transactional producer writes
//     -cluster-txn-records records of 1 KiB to 3 partitions, 100 a
//     transaction, committing each. MB/s and the commit's (EndTxn) p50.
//
// Every process shares this machine's cores: the cluster runs three
// brokers' work (each batch is written three times) on the cores one
// broker has to itself. Within a round the two run A B B A (halves).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

type clusterOptions struct {
	rounds     int // < 0: as -rounds; 0: no cluster block
	only       bool
	etcd       string
	requests   int
	records    int64
	txnRecords int64
}

func clusterFlags(o *clusterOptions) {
	flag.IntVar(&o.rounds, "cluster-rounds", -1, "rounds of the cluster block, CL1 and CL2 (-1: as -rounds; 0: skip it)")
	flag.BoolVar(&o.only, "cluster-only", false, "run only the cluster block")
	flag.StringVar(&o.etcd, "etcd", "", "etcd binary for the cluster block (make tools builds one); empty: skip the block")
	flag.IntVar(&o.requests, "cluster-requests", 2000, "single-record acks=all produces of CL1")
	flag.Int64Var(&o.records, "cluster-records", 300_000, "records (1 KiB) of each CL2 run")
	flag.Int64Var(&o.txnRecords, "cluster-txn-records", 50_000, "records (1 KiB) of each CL3 run, 100 a transaction")
}

const (
	cl1P50 = "CL1 acks=all p50 ms"
	cl1P99 = "CL1 acks=all p99 ms"
	cl2MB  = "CL2 aggregate produce MB/s"
	cl2CPU = "CL2 MB stored per broker CPU-second"
	cl3MB  = "CL3 transactional produce MB/s"
	cl3P50 = "CL3 commit p50 ms"
)

// clTxnRecords is CL3's records per transaction.
const clTxnRecords = 100

func (r *runner) clusterBlock() error {
	if r.o.cluster.etcd == "" {
		fmt.Fprintln(os.Stderr, "cluster block skipped: no -etcd")
		return nil
	}
	for round := 0; round < r.o.cluster.rounds; round++ {
		fmt.Fprintf(os.Stderr, "cluster round %d/%d\n", round+1, r.o.cluster.rounds)
		if err := r.clusterSlot(round); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	return nil
}

// etcdProc is one etcd member of the block.
type etcdProc struct {
	cmd *exec.Cmd
	dir string
	url string
}

func startEtcd(bin string) (*etcdProc, error) {
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "synapse-bench-etcd-")
	if err != nil {
		return nil, err
	}
	e := &etcdProc{dir: dir, url: "http://" + addrs[0]}
	peer := "http://" + addrs[1]
	e.cmd = exec.Command(bin, "--name", "e0", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", e.url, "--advertise-client-urls", e.url,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "e0="+peer,
		"--log-level", "error")
	if err := e.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(e.url + "/health")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return e, nil
			}
		}
	}
	e.stop()
	return nil, errors.New("etcd not healthy within 30 s")
}

func (e *etcdProc) stop() {
	e.cmd.Process.Signal(syscall.SIGTERM)
	e.cmd.Wait()
	os.RemoveAll(e.dir)
}

func (r *runner) clusterSlot(round int) error {
	e, err := startEtcd(r.o.cluster.etcd)
	if err != nil {
		return err
	}
	defer e.stop()
	name := "bench" + strconv.Itoa(round)
	var brokers []*broker
	defer func() {
		for _, b := range brokers {
			b.done()
		}
	}()
	addrs, err := freeAddrs(4)
	if err != nil {
		return err
	}
	for i := range 3 {
		t := target{"synapse-cluster", r.o.synapse, func(addr, dir string) []string {
			return []string{"serve", "--listen", addr, "--advertised-addr", addr, "--data-dir", dir, "--http-listen", "",
				"--log-level", "warn", "--cluster", name, "--etcd", e.url, "--node-id", strconv.Itoa(i)}
		}, nil, nil}
		dir, err := os.MkdirTemp("", "synapse-bench-cluster-")
		if err != nil {
			return err
		}
		b, _, err := start(t, addrs[i], dir)
		if err != nil {
			os.RemoveAll(dir)
			return err
		}
		brokers = append(brokers, b)
	}
	synapse, _, _, _ := r.targets()
	dir, err := os.MkdirTemp("", "synapse-bench-single-")
	if err != nil {
		return err
	}
	single, _, err := start(synapse, addrs[3], dir)
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	brokers = append(brokers, single)
	seeds := [][]string{{addrs[0], addrs[1], addrs[2]}, {addrs[3]}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	for i, s := range seeds {
		cl, err := kgo.NewClient(kgo.SeedBrokers(s...))
		if err != nil {
			return err
		}
		adm := kadm.NewClient(cl)
		rf := int16(3)
		if i == 1 {
			rf = 1
		}
		// The cluster's brokers register in turn: ask until all three serve.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			_, err1 := adm.CreateTopic(ctx, 1, rf, nil, "cl1")
			if err1 == nil || errors.Is(err1, kerr.TopicAlreadyExists) {
				err = nil
			} else {
				err = err1
			}
			if err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err == nil {
			_, err = adm.CreateTopic(ctx, 12, rf, nil, "cl2")
		}
		if err == nil {
			_, err = adm.CreateTopic(ctx, 3, rf, nil, "cl3")
		}
		cl.Close()
		if err != nil {
			return fmt.Errorf("create topics: %w", err)
		}
	}
	o := r.o.cluster
	var lat, commits [2][]time.Duration
	var acc, txn [2]sums
	procs := [][]*broker{brokers[:3], brokers[3:]}
	for _, i := range schedule(2, 2, round%2 == 1) {
		l, err := cl1(ctx, seeds[i], o.requests/2)
		if err != nil {
			return err
		}
		lat[i] = append(lat[i], l...)
		c0 := cpuOf(procs[i])
		n, secs, err := cl2(ctx, seeds[i], o.records/2, uint64(round))
		if err != nil {
			return err
		}
		acc[i].bytes += n * int64(len(procs[i]))
		acc[i].seconds += secs
		acc[i].cpu += cpuOf(procs[i]) - c0
		n, secs, c, err := cl3(ctx, seeds[i], o.txnRecords/2, fmt.Sprintf("cl3-%d-%d-%d", round, i, len(commits[i])))
		if err != nil {
			return err
		}
		txn[i].bytes += n
		txn[i].seconds += secs
		commits[i] = append(commits[i], c...)
	}
	for i, n := range []string{"cluster", "single"} {
		r.add(cl1P50, n, pct(lat[i], 0.50))
		r.add(cl1P99, n, pct(lat[i], 0.99))
		// acc counts every replica's copy: the aggregate is a third of it
		// on the cluster.
		r.add(cl2MB, n, float64(acc[i].bytes)/float64(len(procs[i]))/1e6/acc[i].seconds)
		r.add(cl2CPU, n, float64(acc[i].bytes)/1e6/acc[i].cpu.Seconds())
		r.add(cl3MB, n, txn[i].mbPerSec())
		r.add(cl3P50, n, pct(commits[i], 0.50))
	}
	return nil
}

// cpuOf is the CPU time the processes used so far.
func cpuOf(bs []*broker) time.Duration {
	var t time.Duration
	for _, b := range bs {
		t += cpu(b.cmd.Process.Pid)
	}
	return t
}

// cl1 is CL1: n single 100 B records one after another, acks=all.
func cl1(ctx context.Context, seeds []string, n int) ([]time.Duration, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ProducerLinger(0))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	small := make([]byte, 100)
	var lat []time.Duration
	for range n {
		t1 := time.Now()
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "cl1", Value: small}).FirstErr(); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t1))
	}
	return lat, nil
}

// cl2 is CL2: records of 1 KiB over the 12 partitions of cl2 by 3
// idempotent acks=all producers, one per seed broker. It returns the bytes
// acknowledged and the seconds taken.
func cl2(ctx context.Context, seeds []string, records int64, seed uint64) (int64, float64, error) {
	// Incompressible values, sent uncompressed: the bytes counted are the
	// bytes replicated.
	value := make([]byte, 1024)
	rng := rand.New(rand.NewPCG(seed, 1))
	for k := range value {
		value[k] = byte(rng.Uint32())
	}
	per := records / 3
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for p := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pc, err := kgo.NewClient(kgo.SeedBrokers(seeds[p%len(seeds)]), kgo.DefaultProduceTopic("cl2"), kgo.ProducerLinger(time.Millisecond),
				kgo.ProducerBatchCompression(kgo.NoCompression()))
			if err != nil {
				errs <- err
				return
			}
			defer pc.Close()
			if err := produceAll(ctx, pc, per, value); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, err
	}
	return per * 3 * int64(len(value)), time.Since(t0).Seconds(), nil
}

// cl3 is CL3: one transactional producer writes records of 1 KiB to the
// 3 partitions of cl3, clTxnRecords a transaction, committing each. It
// returns the bytes committed, the seconds taken and each commit's
// latency (EndTxn).
func cl3(ctx context.Context, seeds []string, records int64, id string) (int64, float64, []time.Duration, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic("cl3"), kgo.TransactionalID(id),
		kgo.ProducerLinger(time.Millisecond), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		return 0, 0, nil, err
	}
	defer cl.Close()
	value := make([]byte, 1024)
	var commits []time.Duration
	var n int64
	t0 := time.Now()
	for n < records {
		if err := cl.BeginTransaction(); err != nil {
			return 0, 0, nil, err
		}
		if err := produceAll(ctx, cl, clTxnRecords, value); err != nil {
			return 0, 0, nil, err
		}
		t1 := time.Now()
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			return 0, 0, nil, err
		}
		commits = append(commits, time.Since(t1))
		n += clTxnRecords
	}
	return n * int64(len(value)), time.Since(t0).Seconds(), commits, nil
}

// produceAll produces n records of value (to the client's default topic)
// and waits for every answer; it returns the first error.
func produceAll(ctx context.Context, cl *kgo.Client, n int64, value []byte) error {
	var wg sync.WaitGroup
	var first error
	var mu sync.Mutex
	for range n {
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Value: value}, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				first = cmpErr(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (r *runner) reportCluster(w io.Writer) {
	o := r.o.cluster
	if o.etcd == "" {
		return
	}
	fmt.Fprintf(w, "\nCluster (issue 20): 3 brokers over one etcd, topics of 3 replicas (min ISR 2), against one single-node broker (1 replica), fresh per round, %d rounds, A B B A in halves; every process on this machine.\n", o.rounds)
	fmt.Fprintf(w, "CL1: %d single 100 B records one after another, acks=all (franz-go ProduceSync). CL2: %d records of 1 KiB over 12 partitions by 3 idempotent acks=all producers. CL3: %d records of 1 KiB by one transactional producer, 100 a transaction.\n\n", o.requests, o.records, o.txnRecords)
	fmt.Fprintln(w, "| workload | cluster median (min–max) | single median (min–max) | cluster/single | goal | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, m := range []string{cl1P50, cl1P99, cl2MB, cl2CPU, cl3MB, cl3P50} {
		c, s := r.samples[m]["cluster"], r.samples[m]["single"]
		ratio := "—"
		if median(s) > 0 {
			ratio = fmt.Sprintf("%.2f×", median(c)/median(s))
		}
		goal, met := "", ""
		switch m {
		case cl1P50:
			goal, met = "≤ 1 ms", yesNo(median(c) <= 1)
		case cl1P99:
			goal, met = "≤ 5 ms", yesNo(median(c) <= 5)
		case cl2MB:
			goal, met = "≥ 0.8×", yesNo(median(s) > 0 && median(c)/median(s) >= 0.8)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", m, span(c), span(s), ratio, goal, met)
	}
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}
