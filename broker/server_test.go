package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/protocol"
)

// testServer runs a broker on a loopback port for the test.
type testServer struct {
	*Server
	addr string
	dir  string
	done chan error
}

func startServer(t *testing.T, dir string) *testServer {
	t.Helper()
	return startServerConfig(t, Config{DataDir: dir, AutoCreateTopics: true})
}

// startServerConfig runs a broker with cfg (DataDir defaults to a temp
// dir, Logger to the test's) on a loopback port until the test ends.
func startServerConfig(t *testing.T, cfg Config) *testServer {
	t.Helper()
	return startServerAt(t, cfg, "127.0.0.1:0")
}

// startServerAt starts a server listening on addr (a restart on the same
// address keeps clients' seeds valid; the old port may linger briefly).
func startServerAt(t *testing.T, cfg Config, addr string) *testServer {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: s, addr: ln.Addr().String(), dir: cfg.DataDir, done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(ln) }()
	t.Cleanup(func() { ts.stop(t) })
	return ts
}

func (ts *testServer) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ts.Server.shutting.Load() {
		return
	}
	if err := ts.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	<-ts.done
}

func client(t *testing.T, addr string, opts ...kgo.Opt) (*kgo.Client, *kadm.Client) {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl, kadm.NewClient(cl)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func consumeAll(t *testing.T, addr, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, _ := client(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	ctx := ctxT(t)
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d: %v", len(out), n, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		out = append(out, fs.Records()...)
	}
	return out
}

func TestProduceConsumeEveryCodecAndListOffsets(t *testing.T) {
	ts := startServer(t, "")
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	base := time.UnixMilli(1_750_000_000_000)
	codecs := map[string]kgo.CompressionCodec{"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(),
		"snappy": kgo.SnappyCompression(), "lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression()}
	for name, codec := range codecs {
		t.Run(name, func(t *testing.T) {
			topic := "codec-" + name
			if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
				t.Fatal(err)
			}
			pr, _ := client(t, ts.addr, kgo.ProducerBatchCompression(codec), kgo.ProducerLinger(50*time.Millisecond))
			var rs []*kgo.Record
			for i := 0; i < 20; i++ {
				rs = append(rs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(i)), Value: []byte(strings.Repeat("v", i*10)),
					Timestamp: base.Add(time.Duration(i) * 10 * time.Millisecond),
					Headers:   []kgo.RecordHeader{{Key: "h", Value: []byte{byte(i)}}}})
			}
			if err := pr.ProduceSync(ctx, rs...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			got := consumeAll(t, ts.addr, topic, 20)
			for i, r := range got {
				if r.Offset != int64(i) || string(r.Key) != fmt.Sprint(i) || len(r.Value) != i*10 || !r.Timestamp.Equal(rs[i].Timestamp) || r.Headers[0].Value[0] != byte(i) {
					t.Fatalf("record %d: %+v", i, r)
				}
			}
			// The record at or after a timestamp inside a batch.
			lo, err := adm.ListOffsetsAfterMilli(ctx, base.Add(75*time.Millisecond).UnixMilli(), topic)
			if err != nil || lo.Error() != nil {
				t.Fatal(err, lo.Error())
			}
			if o, _ := lo.Lookup(topic, 0); o.Offset != 8 || o.Timestamp != base.Add(80*time.Millisecond).UnixMilli() {
				t.Fatalf("offset after ts: %+v", o)
			}
			req := kmsg.NewPtrListOffsetsRequest()
			rt := kmsg.NewListOffsetsRequestTopic()
			rt.Topic = topic
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Timestamp = -3
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(ctx, pr)
			if err != nil {
				t.Fatal(err)
			}
			if p := resp.Topics[0].Partitions[0]; p.Offset != 19 || p.Timestamp != base.Add(190*time.Millisecond).UnixMilli() {
				t.Fatalf("max timestamp: %+v", p)
			}
		})
	}
}

func TestTopicAdminRules(t *testing.T) {
	ts := startServer(t, "")
	cl, adm := client(t, ts.addr)
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"no.such.config": kmsg.StringPtr("1")}, "bad-config"); !errors.Is(err, kerr.InvalidConfig) {
		t.Errorf("unknown config: %v", err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"retention.ms": kmsg.StringPtr("soon")}, "bad-value"); !errors.Is(err, kerr.InvalidConfig) {
		t.Errorf("bad config value: %v", err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "bad name!"); !errors.Is(err, kerr.InvalidTopicException) {
		t.Errorf("invalid name: %v", err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 3, nil, "rf3"); !errors.Is(err, kerr.InvalidReplicationFactor) {
		t.Errorf("replication factor 3: %v", err)
	}
	// Auto-creation refuses invalid names too.
	err := cl.ProduceSync(ctx, &kgo.Record{Topic: "no way", Value: []byte("x")}).FirstErr()
	if err == nil {
		t.Error("produce to an invalid topic name succeeded")
	}
	// max.message.bytes is honoured.
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": kmsg.StringPtr("1000")}, "small"); err != nil {
		t.Fatal(err)
	}
	pr, _ := client(t, ts.addr, kgo.RecordRetries(1), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err := pr.ProduceSync(ctx, &kgo.Record{Topic: "small", Value: make([]byte, 5000)}).FirstErr(); !errors.Is(err, kerr.MessageTooLarge) {
		t.Errorf("batch over max.message.bytes: %v", err)
	}
	// Configs are described with their sources and altered incrementally.
	rc, err := adm.DescribeTopicConfigs(ctx, "small")
	if err != nil {
		t.Fatal(err)
	}
	c, err := rc.On("small", nil)
	if err != nil {
		t.Fatal(err)
	}
	var sawSet, sawDefault bool
	for _, kv := range c.Configs {
		if kv.Key == "max.message.bytes" && kv.MaybeValue() == "1000" && kv.Source == kmsg.ConfigSourceDynamicTopicConfig {
			sawSet = true
		}
		if kv.Key == "retention.ms" && kv.Source == kmsg.ConfigSourceDefaultConfig {
			sawDefault = true
		}
	}
	if !sawSet || !sawDefault {
		t.Errorf("describe configs: %+v", c.Configs)
	}
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: kmsg.StringPtr("100000")}}, "small"); err != nil {
		t.Fatal(err)
	}
	if err := pr.ProduceSync(ctx, &kgo.Record{Topic: "small", Value: make([]byte, 5000)}).FirstErr(); err != nil {
		t.Errorf("after raising max.message.bytes: %v", err)
	}
	// A deleted topic vanishes from Metadata and Fetch.
	if _, err := adm.DeleteTopics(ctx, "small"); err != nil {
		t.Fatal(err)
	}
	md, err := adm.Metadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := md.Topics["small"]; ok {
		t.Error("deleted topic still in metadata")
	}
	if ts.reg.get("small") != nil {
		t.Error("deleted topic still in the registry")
	}
	// CreatePartitions grows a topic.
	if r, err := adm.CreatePartitions(ctx, 4, "codec-less"); err == nil && r["codec-less"].Err == nil {
		t.Error("create partitions on an unknown topic succeeded")
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "grow"); err != nil {
		t.Fatal(err)
	}
	if r, err := adm.CreatePartitions(ctx, 2, "grow"); err != nil || r["grow"].Err != nil {
		t.Fatalf("create partitions: %v %v", err, r)
	}
	if md, err := adm.Metadata(ctx, "grow"); err != nil || len(md.Topics["grow"].Partitions) != 3 {
		t.Fatalf("grown topic: %v %+v", err, md.Topics["grow"])
	}
}

// TestIdempotentProducerAcrossRestart: duplicates are answered with the
// original offset, also after a restart, from the snapshot or the log.
func TestIdempotentProducerAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "idem"); err != nil {
		t.Fatal(err)
	}
	md, err := adm.Metadata(ctx, "idem")
	if err != nil {
		t.Fatal(err)
	}
	topicID := md.Topics["idem"].ID
	send := func(addr string, seq int32, pid int64) *kmsg.ProduceResponseTopicPartition {
		t.Helper()
		cl, _ := client(t, addr)
		req := kmsg.NewPtrProduceRequest()
		req.Acks, req.TimeoutMillis = -1, 5000
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic, rt.TopicID = "idem", topicID
		rp := kmsg.NewProduceRequestTopicPartition()
		rb := kmsg.RecordBatch{Magic: 2, ProducerID: pid, ProducerEpoch: 0, FirstSequence: seq, NumRecords: 1,
			LastOffsetDelta: 0, FirstTimestamp: 1, MaxTimestamp: 1}
		rec := kmsg.Record{Value: []byte("x")}
		rec.Length = int32(len(rec.AppendTo(nil)) - 1)
		rb.Records = rec.AppendTo(nil)
		raw := rb.AppendTo(nil)
		rp.Records = fixCRC(raw)
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		return &resp.Topics[0].Partitions[0]
	}
	cl, _ := client(t, ts.addr)
	ipr, err := kmsg.NewPtrInitProducerIDRequest().RequestWith(ctx, cl)
	if err != nil || ipr.ErrorCode != 0 {
		t.Fatal(err, ipr)
	}
	pid := ipr.ProducerID
	for seq := int32(0); seq < 3; seq++ {
		if r := send(ts.addr, seq, pid); r.ErrorCode != 0 || r.BaseOffset != int64(seq) {
			t.Fatalf("seq %d: %+v", seq, r)
		}
	}
	if r := send(ts.addr, 1, pid); r.ErrorCode != 0 || r.BaseOffset != 1 {
		t.Fatalf("duplicate: %+v", r)
	}
	if r := send(ts.addr, 7, pid); r.ErrorCode != kerr.OutOfOrderSequenceNumber.Code {
		t.Fatalf("gap: %+v", r)
	}
	ts.stop(t)
	ts2 := startServer(t, dir)
	if r := send(ts2.addr, 2, pid); r.ErrorCode != 0 || r.BaseOffset != 2 {
		t.Fatalf("duplicate after restart: %+v", r)
	}
	if r := send(ts2.addr, 3, pid); r.ErrorCode != 0 || r.BaseOffset != 3 {
		t.Fatalf("next after restart: %+v", r)
	}
	cl2, _ := client(t, ts2.addr)
	ipr2, err := kmsg.NewPtrInitProducerIDRequest().RequestWith(ctx, cl2)
	if err != nil || ipr2.ProducerID == pid {
		t.Fatalf("producer id reused after restart: %v %+v", err, ipr2)
	}
}

// fixCRC sets batchLength and the CRC-32C of a batch encoded by kmsg, which
// writes both as given.
func fixCRC(b []byte) []byte {
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// TestHandlerPanicIsAnswered: a panicking handler is answered with
// UNKNOWN_SERVER_ERROR and the connection keeps serving.
func TestHandlerPanicIsAnswered(t *testing.T) {
	ts := startServer(t, "")
	hook := func(req *protocol.Request) {
		if req.Key == 3 {
			panic("injected")
		}
	}
	ts.beforeHandle.Store(&hook)
	cl, _ := client(t, ts.addr)
	ctx := ctxT(t)
	req := kmsg.NewPtrMetadataRequest()
	tp := kmsg.NewMetadataRequestTopic()
	tp.Topic = kmsg.StringPtr("x")
	req.Topics = append(req.Topics, tp)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != kerr.UnknownServerError.Code {
		t.Fatalf("panic answered with %+v", resp.Topics)
	}
	ts.beforeHandle.Store(nil)
	if _, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl); err != nil {
		t.Fatalf("connection unusable after a handler panic: %v", err)
	}
}

func TestLogAppendTimeDeleteRecordsDescribeCluster(t *testing.T) {
	ts := startServer(t, "")
	cl, adm := client(t, ts.addr)
	ctx := ctxT(t)
	lat := "LogAppendTime"
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"message.timestamp.type": &lat}, "lat"); err != nil {
		t.Fatal(err)
	}
	before := time.Now().Add(-time.Second)
	old := time.UnixMilli(1_000_000)
	for i := 0; i < 5; i++ {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "lat", Value: []byte("v"), Timestamp: old}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range consumeAll(t, ts.addr, "lat", 5) {
		if r.Timestamp.Before(before) || r.Attrs.TimestampType() != 1 {
			t.Fatalf("LogAppendTime topic kept the client's timestamp: %v type %d", r.Timestamp, r.Attrs.TimestampType())
		}
	}
	// DeleteRecords moves the log start; fetching below it is out of range.
	o := kadm.Offsets{}
	o.Add(kadm.Offset{Topic: "lat", Partition: 0, At: 3})
	dr, err := adm.DeleteRecords(ctx, o)
	if err != nil || dr.Error() != nil {
		t.Fatal(err, dr.Error())
	}
	if r, _ := dr.Lookup("lat", 0); r.LowWatermark != 3 {
		t.Fatalf("low watermark %d", r.LowWatermark)
	}
	start, err := adm.ListStartOffsets(ctx, "lat")
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := start.Lookup("lat", 0); s.Offset != 3 {
		t.Fatalf("start offset after DeleteRecords: %d", s.Offset)
	}
	dc, err := kmsg.NewPtrDescribeClusterRequest().RequestWith(ctx, cl)
	if err != nil || dc.ClusterID != ts.ClusterID() || len(dc.Brokers) != 1 || dc.ControllerID != 0 {
		t.Fatalf("describe cluster: %v %+v", err, dc)
	}
}

func TestIdleTimeoutAndConnectionLimit(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{DataDir: dir, IdleTimeout: 200 * time.Millisecond, MaxConnections: 2, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Shutdown(context.Background())
	var conns []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
		time.Sleep(20 * time.Millisecond)
	}
	// The third connection is over the limit: closed at once.
	conns[2].SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := conns[2].Read(make([]byte, 1)); err == nil {
		t.Fatal("connection over the limit was served")
	}
	// The others are closed after the idle timeout.
	conns[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := conns[0].Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("idle connection not closed: %v", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("idle connection closed late")
	}
}

// TestAcks1AnsweredIsVisible: under the durable policy an acks=1 produce is
// answered once its records are inside the high watermark, so a
// ListOffsets(latest) from another connection right after the answer
// includes them (as a single-replica Kafka does).
func TestAcks1AnsweredIsVisible(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	prod, adm := client(t, ts.addr, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite(), kgo.DefaultProduceTopic("a1"))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "a1"); err != nil {
		t.Fatal(err)
	}
	_, other := client(t, ts.addr)
	for i := 1; i <= 30; i++ {
		if err := prod.ProduceSync(ctx, kgo.StringRecord("x")).FirstErr(); err != nil {
			t.Fatal(err)
		}
		ends, err := other.ListEndOffsets(ctx, "a1")
		if err != nil {
			t.Fatal(err)
		}
		if got := ends["a1"][0].Offset; got != int64(i) {
			t.Fatalf("after acks=1 produce %d answered, the latest offset is %d", i, got)
		}
	}
}
