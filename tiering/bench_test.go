package tiering_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/synapsebroker/synapse/tiering"
)

// BenchmarkColdCatchUp measures a consumer reading a fully offloaded topic
// from offset 0 through the broker (cold cache) beside a plain loop of
// GetObject calls over the same objects from the same S3 server, and
// reports the ratio (issue goal: >= 0.7).
func BenchmarkColdCatchUp(b *testing.B) {
	vgw := tiering.RunVersitygw(b)
	store := vgw.Store(vgw.Bucket(), "bench")
	bin := synapseBin(b)
	const total = 96 << 20
	br := startSynapseProc(b, bin, vgw, "bench")
	cl := kclientTB(b, br.addr, kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.ProducerBatchMaxBytes(1<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := map[string]*string{"segment.bytes": ptr(fmt.Sprint(16 << 20)), "local.retention.bytes": ptr("0"), "retention.ms": ptr("-1")}
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, cfg, "tiered"); err != nil {
		b.Fatal(err)
	}
	v := make([]byte, 16<<10)
	for n := 0; n < total; n += len(v) {
		rand.Read(v)
		cl.Produce(ctx, &kgo.Record{Topic: "tiered", Value: append([]byte(nil), v...)}, func(_ *kgo.Record, err error) {
			if err != nil {
				b.Error(err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	cl.Close()
	br.stop(b) // graceful: everything offloaded
	keys, err := store.List(ctx, "")
	if err != nil {
		b.Fatal(err)
	}
	var objs []string
	for _, k := range keys {
		if strings.HasSuffix(k, ".log") {
			objs = append(objs, k)
		}
	}
	for i := 0; i < b.N; i++ {
		// Plain loop: GetObject of every segment object.
		start := time.Now()
		var plainBytes int64
		for _, k := range objs {
			bs, err := store.GetRange(ctx, k, 0, -1)
			if err != nil {
				b.Fatal(err)
			}
			plainBytes += int64(len(bs))
		}
		plain := float64(plainBytes) / 1e6 / time.Since(start).Seconds()

		// Through a broker restored on an empty disk: everything is cold.
		br2 := startSynapseProc(b, bin, vgw, "bench")
		cons := kclientTB(b, br2.addr, kgo.ConsumeTopics("tiered"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxBytes(32<<20), kgo.FetchMaxPartitionBytes(32<<20))
		start = time.Now()
		cpu0 := procCPU(br2.cmd.Process.Pid)
		var got int64
		for got < plainBytes*9/10 {
			fs := cons.PollFetches(ctx)
			if ctx.Err() != nil {
				b.Fatalf("consumed %d of %d bytes", got, plainBytes)
			}
			fs.EachRecord(func(r *kgo.Record) { got += int64(len(r.Value)) })
		}
		cold := float64(got) / 1e6 / time.Since(start).Seconds()
		coldCPU := float64((procCPU(br2.cmd.Process.Pid) - cpu0).Microseconds()) / 1e3 / (float64(got) / 1e6)
		cons.Close()
		// The same read again, from the broker's chunk cache: the ceiling
		// of this client and broker on this machine without the bucket.
		cons = kclientTB(b, br2.addr, kgo.ConsumeTopics("tiered"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxBytes(32<<20), kgo.FetchMaxPartitionBytes(32<<20))
		start, got = time.Now(), 0
		for got < plainBytes*9/10 {
			fs := cons.PollFetches(ctx)
			if ctx.Err() != nil {
				b.Fatalf("consumed %d of %d bytes", got, plainBytes)
			}
			fs.EachRecord(func(r *kgo.Record) { got += int64(len(r.Value)) })
		}
		warm := float64(got) / 1e6 / time.Since(start).Seconds()
		cons.Close()
		br2.stop(b)
		b.ReportMetric(plain, "plain-GetObject-MB/s")
		b.ReportMetric(cold, "cold-consume-MB/s")
		b.ReportMetric(warm, "cached-consume-MB/s")
		b.ReportMetric(coldCPU, "broker-CPU-ms/MB-cold")
		b.ReportMetric(cold/plain, "ratio")
	}
}

// BenchmarkUploadKeepsUp produces at full speed into small segments while
// the uploader runs, and reports produce MB/s, the uploader's MB/s over the
// same data (until the lag is zero) and their ratio (goal: >= 1, the
// uploader keeps up).
func BenchmarkUploadKeepsUp(b *testing.B) {
	vgw := tiering.RunVersitygw(b)
	bin := synapseBin(b)
	// The S3 server's own ceiling on this machine, with nothing else running:
	// 128 MiB as 8 MiB PutObjects, 4 at a time (the uploader's parallelism).
	seg := make([]byte, 8<<20)
	rand.Read(seg)
	plainStore := vgw.Store(vgw.Bucket(), "plain-put")
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := w; j < 16; j += 4 {
				if err := plainStore.Put(context.Background(), fmt.Sprintf("seg-%d", j), bytes.NewReader(seg), int64(len(seg))); err != nil {
					b.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	plainPut := float64(16*len(seg)) / 1e6 / time.Since(start).Seconds()
	for i := 0; i < b.N; i++ {
		br := startSynapseProc(b, bin, vgw, fmt.Sprintf("keepup-%d", i))
		cl := kclientTB(b, br.addr, kgo.ProducerBatchCompression(kgo.NoCompression()))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cfg := map[string]*string{"segment.bytes": ptr(fmt.Sprint(8 << 20)), "local.retention.bytes": ptr("0"), "retention.ms": ptr("-1")}
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, 4, 1, cfg, "tiered"); err != nil {
			b.Fatal(err)
		}
		const total = 128 << 20
		v := make([]byte, 4<<10)
		rand.Read(v)
		start := time.Now()
		for n := 0; n < total; n += len(v) {
			cl.Produce(ctx, &kgo.Record{Topic: "tiered", Value: v}, func(_ *kgo.Record, err error) {
				if err != nil {
					b.Error(err)
				}
			})
		}
		if err := cl.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		produced := time.Since(start)
		// Sealed segments all uploaded: what remains local is the active ones.
		var st procTierStatus
		for {
			st = br.status(b)
			if st.Tier.LagSegments == 0 && st.Tier.UploadedBytes >= total*3/4 {
				break
			}
			if ctx.Err() != nil {
				b.Fatal("uploads never caught up")
			}
			time.Sleep(20 * time.Millisecond)
		}
		uploadedBy := time.Since(start)
		cancel()
		prodMBs := float64(total) / 1e6 / produced.Seconds()
		upMBs := float64(st.Tier.UploadedBytes) / 1e6 / uploadedBy.Seconds()
		b.ReportMetric(prodMBs, "produce-MB/s")
		b.ReportMetric(upMBs, "upload-MB/s")
		b.ReportMetric(plainPut, "plain-PutObject-MB/s")
		b.ReportMetric(upMBs/prodMBs, "ratio")
		cl.Close()
		br.stop(b)
	}
}

// BenchmarkTailLatencyUnderColdLoad measures end-to-end latency of a tail
// consumer (produce acks=all → fetch) with and without a concurrent cold
// catch-up reader on another topic, and reports both p99s and their ratio
// (issue goal: within 1.5×). The broker (`synapse serve`), versitygw and the
// cold reader are separate processes; the tail producer and consumer run
// here.
func BenchmarkTailLatencyUnderColdLoad(b *testing.B) {
	vgw := tiering.RunVersitygw(b)
	// A small cache, so cold reads keep downloading.
	br := startSynapseProc(b, synapseBin(b), vgw, "tail", "--tier-cache-bytes", fmt.Sprint(16<<20), "--tier-disk-cache-bytes", "0")
	cl := kclientTB(b, br.addr, kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.ProducerLinger(0))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	adm := kadm.NewClient(cl)
	cfg := map[string]*string{"segment.bytes": ptr(fmt.Sprint(8 << 20)), "local.retention.bytes": ptr("0"), "retention.ms": ptr("-1")}
	if _, err := adm.CreateTopic(ctx, 1, 1, cfg, "cold"); err != nil {
		b.Fatal(err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "tail"); err != nil {
		b.Fatal(err)
	}
	// The control: the same catch-up read of a topic kept on local disk.
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"local.retention.bytes": ptr("-1"), "retention.ms": ptr("-1")}, "hot"); err != nil {
		b.Fatal(err)
	}
	v := make([]byte, 16<<10)
	for n := 0; n < 64<<20; n += len(v) {
		rand.Read(v)
		cl.Produce(ctx, &kgo.Record{Topic: "cold", Value: append([]byte(nil), v...)}, nil)
		cl.Produce(ctx, &kgo.Record{Topic: "hot", Value: append([]byte(nil), v...)}, nil)
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	for {
		st := br.status(b)
		if st.Tier.LagSegments == 0 && st.Tier.UploadedSegments >= 6 {
			break
		}
		if ctx.Err() != nil {
			b.Fatal("uploads never caught up")
		}
		time.Sleep(50 * time.Millisecond)
	}
	measure := func() time.Duration {
		cons := kclientTB(b, br.addr, kgo.ConsumeTopics("tail"), kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(time.Second))
		defer cons.Close()
		jctx, jcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		cons.PollFetches(jctx) // join at the end before timing
		jcancel()
		var lats []time.Duration
		done := make(chan struct{})
		go func() {
			defer close(done)
			for len(lats) < 500 {
				fs := cons.PollFetches(ctx)
				if ctx.Err() != nil {
					return
				}
				now := time.Now()
				fs.EachRecord(func(r *kgo.Record) {
					sent, _ := time.Parse(time.RFC3339Nano, string(r.Value))
					lats = append(lats, now.Sub(sent))
				})
			}
		}()
		for i := 0; i < 500; i++ {
			cl.ProduceSync(ctx, &kgo.Record{Topic: "tail", Value: []byte(time.Now().Format(time.RFC3339Nano))})
			time.Sleep(2 * time.Millisecond)
		}
		<-done
		slices.Sort(lats)
		if len(lats) == 0 {
			b.Fatal("no tail records consumed")
		}
		return lats[len(lats)*99/100]
	}
	for i := 0; i < b.N; i++ {
		quiet := measure()
		stop := startColdReader(b, br.addr, "cold")
		time.Sleep(500 * time.Millisecond) // the cold reader is reading
		loaded := measure()
		stop()
		stop = startColdReader(b, br.addr, "hot")
		time.Sleep(500 * time.Millisecond)
		hot := measure()
		stop()
		b.ReportMetric(float64(quiet.Microseconds())/1000, "p99-quiet-ms")
		b.ReportMetric(float64(loaded.Microseconds())/1000, "p99-cold-load-ms")
		b.ReportMetric(float64(hot.Microseconds())/1000, "p99-local-load-ms")
		b.ReportMetric(float64(loaded)/float64(quiet), "ratio")
	}
}
