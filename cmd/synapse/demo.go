package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/broker"
	"github.com/synapsebroker/synapse/tiering"
)

// demoOptions are the flags of `synapse demo`.
type demoOptions struct {
	records int
	keep    bool
	wait    time.Duration
}

func newDemoCommand(root *rootOptions) *cobra.Command {
	o := &demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Walk through the tier lifecycle on a real broker in a temporary directory",
		Long: `demo starts a broker in a temporary data directory with tiny segments and the
local-directory tier, appends records with a real Kafka client (franz-go), and
shows step by step: segments rolled, segments uploaded, local files released,
a hot read (no object GET), a cold read (GETs from the bucket) and the same
read again from the cache (no new GET). Every figure is read from the broker.
It removes the directory when it ends.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), cmd.OutOrStdout(), root.logger, o)
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&o.records, "records", 2000, "records to append (about 200 bytes each)")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary directory (its path is printed)")
	fs.DurationVar(&o.wait, "wait", 30*time.Second, "how long each step may wait for the broker")
	return cmd
}

const demoTopic = "demo"

// demo is the walkthrough's state: the broker, a client and the output.
type demo struct {
	out  io.Writer
	srv  *broker.Server
	tier *tiering.Tier
	cl   *kgo.Client
	wait time.Duration
	step int
}

func (d *demo) printf(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }

func (d *demo) section(title string) {
	d.step++
	d.printf("\n%d. %s\n", d.step, title)
}

func runDemo(ctx context.Context, out io.Writer, logger *zap.Logger, o *demoOptions) (err error) {
	if o.records < 100 {
		return fmt.Errorf("--records %d: at least 100, so that several segments roll", o.records)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	dir, err := os.MkdirTemp("", "synapse-demo-")
	if err != nil {
		return err
	}
	defer func() {
		if o.keep {
			fmt.Fprintf(out, "\nkept %s\n", dir)
			return
		}
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = rerr
		}
	}()
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		return err
	}
	store, err := tiering.NewLocalDir(filepath.Join(dir, "tier"))
	if err != nil {
		return err
	}
	tier := tiering.New(store, logger.Named("tiering"), 8<<20)
	srv, err := broker.New(broker.Config{
		DataDir:             filepath.Join(dir, "data"),
		Tier:                tier,
		MaintenanceInterval: 100 * time.Millisecond,
		Logger:              logger.Named("broker"),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if serr := srv.Shutdown(sctx); serr != nil && err == nil {
			err = serr
		}
		<-served
	}()
	cl, err := kgo.NewClient(kgo.SeedBrokers(ln.Addr().String()),
		kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.MaxVersions(kversion.V3_0_0())) // Fetch by topic name (v12)
	if err != nil {
		return err
	}
	defer cl.Close()
	d := &demo{out: out, srv: srv, tier: tier, cl: cl, wait: o.wait}
	d.printf("Synapse demo: a broker on %s, data in %s\n", ln.Addr(), dir)
	d.printf("tier: the local directory %s (an S3 bucket in production)\n", store.Root())
	return d.run(ctx, o.records)
}

func (d *demo) run(ctx context.Context, records int) error {
	d.section("Create a topic with tiny segments")
	adm := kadm.NewClient(d.cl)
	cfg := map[string]*string{
		"segment.bytes":         kadm.StringPtr("16384"),
		"local.retention.bytes": kadm.StringPtr("0"), // release uploaded segments at once
		"retention.ms":          kadm.StringPtr("-1"),
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, cfg, demoTopic); err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	d.printf("   topic %q: 1 partition, segment.bytes=16384, local.retention.bytes=0\n", demoTopic)

	d.section(fmt.Sprintf("Append %d records with a Kafka client (franz-go, acks=all)", records))
	const perBatch = 20
	for i := 0; i < records; i += perBatch {
		var rs []*kgo.Record
		for j := i; j < min(i+perBatch, records); j++ {
			rs = append(rs, &kgo.Record{Topic: demoTopic, Key: []byte("key-" + strconv.Itoa(j)), Value: demoValue(j)})
		}
		if err := d.cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
	}
	st := d.status(ctx)
	d.printf("   high watermark %d\n", st.HighWatermark)

	d.section("Segments rolled")
	// Uploads may already have released some: those count too.
	rolled := st.SealedSegments + st.ReleasedSegments
	if rolled < 2 {
		return fmt.Errorf("only %d segments rolled", rolled)
	}
	d.printf("   %d segments sealed (immutable; %d still on local disk), 1 active segment taking appends\n", rolled, st.SealedSegments)

	d.section("Segments uploaded to the tier")
	st, err := d.until(ctx, "sealed segments uploaded", func(st broker.PartitionStatus) bool {
		return st.TieredSegments >= rolled
	})
	if err != nil {
		return err
	}
	ts, _ := d.srv.TierStatus(ctx)
	d.printf("   manifest names %d segments, offsets [%d, %d); %d bytes uploaded\n",
		st.TieredSegments, st.LogStart, st.TieredNext, ts.UploadedBytes)

	d.section("Local files released")
	st, err = d.until(ctx, "uploaded segments released", func(st broker.PartitionStatus) bool {
		return st.SealedSegments == 0 && st.LocalStart >= st.TieredNext
	})
	if err != nil {
		return err
	}
	d.printf("   local disk holds %d segment (the active one) from offset %d; offsets [%d, %d) are only in the tier\n",
		st.LocalSegments, st.LocalStart, st.LogStart, st.LocalStart)

	hot := st.HighWatermark - 1
	if hot < st.LocalStart {
		return fmt.Errorf("nothing on local disk to read (local start %d, high watermark %d)", st.LocalStart, st.HighWatermark)
	}
	d.section(fmt.Sprintf("Hot read: offset %d, from local disk", hot))
	if err := d.read(ctx, hot, false); err != nil {
		return err
	}
	d.section("Cold read: offset 0, from the tier")
	if err := d.read(ctx, 0, true); err != nil {
		return err
	}
	d.section("The same read again: from the cache")
	if err := d.read(ctx, 0, false); err != nil {
		return err
	}
	d.printf("\nDone: every record is readable, old ones from the tier. The directory is removed.\n")
	return nil
}

// status is the demo partition's status as the broker reports it.
func (d *demo) status(ctx context.Context) broker.PartitionStatus {
	st, _ := d.srv.PartitionStatus(ctx, demoTopic, 0)
	return st
}

// until polls the partition's status until ok holds or the wait ends.
func (d *demo) until(ctx context.Context, what string, ok func(broker.PartitionStatus) bool) (broker.PartitionStatus, error) {
	deadline := time.Now().Add(d.wait)
	for {
		st := d.status(ctx)
		if ok(st) {
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("%s: not after %s (%+v)", what, d.wait, st)
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// read fetches the batch holding offset off with a Kafka Fetch, checks the
// record, and prints the object GETs it cost. wantGets says whether the read
// must reach the bucket.
func (d *demo) read(ctx context.Context, off int64, wantGets bool) error {
	before, _ := d.srv.TierStatus(ctx)
	start := time.Now()
	// A cold read may answer empty while its chunk downloads: the client
	// asks again, as consumers do.
	var rec *kgo.Record
	fetches := 0
	for rec == nil {
		r, err := d.fetchOne(ctx, off)
		fetches++
		if err != nil {
			return err
		}
		rec = r
		if rec == nil {
			if time.Since(start) > d.wait {
				return fmt.Errorf("fetch %d: no record after %s", off, d.wait)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	took := time.Since(start)
	after, _ := d.srv.TierStatus(ctx)
	gets := after.ObjectGets - before.ObjectGets
	want := demoValue(int(off))
	if string(rec.Value) != string(want) {
		return fmt.Errorf("offset %d: read %q, want %q", off, rec.Value, want)
	}
	d.printf("   record %d: key %q, %d-byte value, in %s, fetch requests: %d\n", rec.Offset, rec.Key, len(rec.Value), took.Round(10*time.Microsecond), fetches)
	d.printf("   object GETs: %d (total %d); cache hits %d, misses %d; bytes downloaded %d (total %d)\n",
		gets, after.ObjectGets, after.CacheHits, after.CacheMisses,
		after.DownloadedBytes-before.DownloadedBytes, after.DownloadedBytes)
	switch {
	case wantGets && gets == 0:
		return fmt.Errorf("offset %d: a cold read without an object GET", off)
	case !wantGets && gets != 0:
		return fmt.Errorf("offset %d: %d object GETs where none were expected", off, gets)
	}
	return nil
}

// fetchOne sends one Fetch at off (one byte asked: the broker answers the
// whole batch holding off) and returns the record at off, or nil if the
// answer was empty.
func (d *demo) fetchOne(ctx context.Context, off int64) (*kgo.Record, error) {
	req := kmsg.NewPtrFetchRequest()
	req.Version = 12
	req.MaxWaitMillis = 500
	req.MaxBytes = 1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = demoTopic
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.FetchOffset = off
	rp.PartitionMaxBytes = 1
	rp.CurrentLeaderEpoch = -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, d.cl)
	if err != nil {
		return nil, fmt.Errorf("fetch %d: %w", off, err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return nil, fmt.Errorf("fetch %d: malformed answer", off)
	}
	p := resp.Topics[0].Partitions[0]
	if p.ErrorCode != 0 {
		return nil, fmt.Errorf("fetch %d: error code %d", off, p.ErrorCode)
	}
	fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Topic: demoTopic, Partition: 0, KeepControlRecords: false}, &p, kgo.DefaultDecompressor(), nil)
	for _, r := range fp.Records {
		if r.Offset == off {
			return r, nil
		}
	}
	if fp.Err != nil {
		return nil, fmt.Errorf("fetch %d: %w", off, fp.Err)
	}
	if len(p.RecordBatches) > 0 {
		return nil, fmt.Errorf("fetch %d: record not in the answer (%d bytes)", off, len(p.RecordBatches))
	}
	return nil, nil // nothing yet (a cold chunk downloading)
}

// demoValue is record i's value: ~200 bytes that name it.
func demoValue(i int) []byte {
	b := make([]byte, 0, 200)
	b = fmt.Appendf(b, "record %06d ", i)
	for len(b) < 200 {
		b = append(b, byte('a'+i%26))
	}
	return b
}
