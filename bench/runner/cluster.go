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
//     broker (N = RF = 3).
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
	rounds   int // < 0: as -rounds; 0: no cluster block
	only     bool
	etcd     string
	requests int
	records  int64
}

func clusterFlags(o *clusterOptions) {
	flag.IntVar(&o.rounds, "cluster-rounds", -1, "rounds of the cluster block, CL1 and CL2 (-1: as -rounds; 0: skip it)")
	flag.BoolVar(&o.only, "cluster-only", false, "run only the cluster block")
	flag.StringVar(&o.etcd, "etcd", "", "etcd binary for the cluster block (make tools builds one); empty: skip the block")
	flag.IntVar(&o.requests, "cluster-requests", 2000, "single-record acks=all produces of CL1")
	flag.Int64Var(&o.records, "cluster-records", 300_000, "records (1 KiB) of each CL2 run")
}

const (
	cl1P50 = "CL1 acks=all p50 ms"
	cl1P99 = "CL1 acks=all p99 ms"
	cl2MB  = "CL2 aggregate produce MB/s"
)

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
		cl.Close()
		if err != nil {
			return fmt.Errorf("create topics: %w", err)
		}
	}
	o := r.o.cluster
	var lat [2][]time.Duration
	var acc [2]sums
	for _, i := range schedule(2, 2, round%2 == 1) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(seeds[i]...), kgo.ProducerLinger(0))
		if err != nil {
			return err
		}
		small := make([]byte, 100)
		for range o.requests / 2 {
			t1 := time.Now()
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "cl1", Value: small}).FirstErr(); err != nil {
				cl.Close()
				return err
			}
			lat[i] = append(lat[i], time.Since(t1))
		}
		cl.Close()
		// Incompressible values, sent uncompressed: the bytes counted are
		// the bytes replicated.
		value := make([]byte, 1024)
		rng := rand.New(rand.NewPCG(uint64(round), 1))
		for k := range value {
			value[k] = byte(rng.Uint32())
		}
		per := o.records / 2 / 3
		t0 := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, 3)
		for p := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				boot := seeds[i][p%len(seeds[i])]
				pc, err := kgo.NewClient(kgo.SeedBrokers(boot), kgo.DefaultProduceTopic("cl2"), kgo.ProducerLinger(time.Millisecond),
					kgo.ProducerBatchCompression(kgo.NoCompression()))
				if err != nil {
					errs <- err
					return
				}
				defer pc.Close()
				var inner sync.WaitGroup
				var first error
				var mu sync.Mutex
				for range per {
					inner.Add(1)
					pc.Produce(ctx, &kgo.Record{Value: value}, func(_ *kgo.Record, err error) {
						defer inner.Done()
						if err != nil {
							mu.Lock()
							first = cmpErr(first, err)
							mu.Unlock()
						}
					})
				}
				inner.Wait()
				if first != nil {
					errs <- first
				}
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		acc[i].bytes += per * 3 * int64(len(value))
		acc[i].seconds += time.Since(t0).Seconds()
	}
	for i, n := range []string{"cluster", "single"} {
		r.add(cl1P50, n, pct(lat[i], 0.50))
		r.add(cl1P99, n, pct(lat[i], 0.99))
		r.add(cl2MB, n, acc[i].mbPerSec())
	}
	return nil
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
	fmt.Fprintf(w, "CL1: %d single 100 B records one after another, acks=all (franz-go ProduceSync). CL2: %d records of 1 KiB over 12 partitions by 3 idempotent acks=all producers.\n\n", o.requests, o.records)
	fmt.Fprintln(w, "| workload | cluster median (min–max) | single median (min–max) | cluster/single | goal | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, m := range []string{cl1P50, cl1P99, cl2MB} {
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
