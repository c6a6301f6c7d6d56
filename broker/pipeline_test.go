package broker

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/protocol"
	"github.com/synapsebroker/synapse/tiering"
)

// oneRecordProduce is a Produce v8 request of one record to partition 0.
func oneRecordProduce(topic string, acks int16, v byte) *kmsg.ProduceRequest {
	return recordProduce(topic, acks, []byte{v})
}

// recordProduce is a Produce v8 request of one record with value v.
func recordProduce(topic string, acks int16, v []byte) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 8, acks, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rb := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: 1, FirstTimestamp: 1, MaxTimestamp: 1}
	rec := kmsg.Record{Value: v}
	rec.Length = int32(len(rec.AppendTo(nil)) - 1)
	rb.Records = rec.AppendTo(nil)
	rp.Records = fixCRC(rb.AppendTo(nil))
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return req
}

// reqFrame is req as a whole request frame with correlation id corr.
// (kmsg's AppendRequest writes the size at dst[0], so each frame starts
// from nil.)
func reqFrame(req kmsg.Request, corr int32) []byte {
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID("pipe")).AppendRequest(nil, req, corr)
}

// rawConn starts a server holding topic (one partition, unless topic is
// "") and opens a raw connection to it.
func rawConn(t *testing.T, topic string) (*testServer, net.Conn) {
	t.Helper()
	ts := startServerConfig(t, Config{AutoCreateTopics: true})
	if topic != "" {
		_, adm := client(t, ts.addr)
		if _, err := adm.CreateTopic(ctxT(t), 1, 1, nil, topic); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return ts, nc
}

// readAnswer reads one response frame within d: its correlation id and
// body.
func readAnswer(nc net.Conn, d time.Duration) (int32, []byte, error) {
	nc.SetReadDeadline(time.Now().Add(d))
	var size [4]byte
	if _, err := io.ReadFull(nc, size[:]); err != nil {
		return 0, nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(nc, b); err != nil {
		return 0, nil, err
	}
	return int32(binary.BigEndian.Uint32(b)), b[4:], nil
}

// readProduceAnswer reads a Produce v8 answer and returns its correlation
// id and its one partition.
func readProduceAnswer(t *testing.T, nc net.Conn) (int32, kmsg.ProduceResponseTopicPartition) {
	t.Helper()
	corr, body, err := readAnswer(nc, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = 8
	if err := resp.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	return corr, resp.Topics[0].Partitions[0]
}

// TestProducePipelining: produce requests sent back to back on one
// connection, without waiting for answers (acks=all, acks=0 and acks=1
// mixed, then a Metadata request), are all answered in request order with
// contiguous offsets, the acks=0 one not at all.
func TestProducePipelining(t *testing.T) {
	ts, nc := rawConn(t, "pipe")
	acks := []int16{-1, -1, -1, 0, -1, 1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}
	var out []byte
	for i, a := range acks {
		out = append(out, reqFrame(oneRecordProduce("pipe", a, byte(i)), int32(100+i))...)
	}
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 1
	out = append(out, reqFrame(md, 999)...)
	if _, err := nc.Write(out); err != nil { // all at once: they queue behind the first
		t.Fatal(err)
	}
	want := int64(0)
	for i, a := range acks {
		if a == 0 {
			want++
			continue // no answer
		}
		corr, p := readProduceAnswer(t, nc)
		if corr != int32(100+i) {
			t.Fatalf("answer %d has correlation id %d, want %d (out of order)", i, corr, 100+i)
		}
		if p.ErrorCode != 0 || p.BaseOffset != want {
			t.Fatalf("request %d: error %d offset %d, want offset %d", i, p.ErrorCode, p.BaseOffset, want)
		}
		want++
	}
	if corr, _, err := readAnswer(nc, 5*time.Second); err != nil || corr != 999 {
		t.Fatalf("metadata answered with correlation id %d (%v)", corr, err)
	}
	if ts.pipelined.Load() == 0 {
		t.Fatal("no produce request was appended behind another: nothing pipelined")
	}
	p := ts.reg.partition(ts.reg.get("pipe"), 0)
	if hw := p.log.HighWatermark(); hw != int64(len(acks)) {
		t.Fatalf("high watermark %d, want %d", hw, len(acks))
	}
}

// TestProducePipeliningBadFrameAfter: a malformed request queued behind
// produce requests closes the connection only after they are answered.
func TestProducePipeliningBadFrameAfter(t *testing.T) {
	_, nc := rawConn(t, "pipe2")
	var out []byte
	for i := 0; i < 3; i++ {
		out = append(out, reqFrame(oneRecordProduce("pipe2", -1, byte(i)), int32(200+i))...)
	}
	// A produce header (key 0, v8) with a body that does not decode.
	bad := []byte{0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	binary.BigEndian.PutUint32(bad, uint32(len(bad)-4))
	out = append(out, bad...)
	if _, err := nc.Write(out); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		corr, _, err := readAnswer(nc, 20*time.Second)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		if corr != int32(200+i) {
			t.Fatalf("answer %d has correlation id %d", i, corr)
		}
	}
	if _, err := nc.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection stayed open after an undecodable request")
	}
}

// TestPipeliningNeverWaitsForAPartialFrame: an acks=all produce followed by
// only the start of another request is answered at once; the broker does
// not wait for the rest before fsyncing and answering the first.
func TestPipeliningNeverWaitsForAPartialFrame(t *testing.T) {
	_, nc := rawConn(t, "pipe3")
	out := reqFrame(oneRecordProduce("pipe3", -1, 1), 300)
	next := reqFrame(oneRecordProduce("pipe3", -1, 2), 301)
	if _, err := nc.Write(append(out, next[:10]...)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readAnswer(nc, 2*time.Second); err != nil {
		t.Fatalf("the first produce was not answered while the second was incomplete: %v", err)
	}
}

// TestPipelinedFrameClaimsMemoryAsItArrives: a pipelined produce whose
// header announces a frame of 100 MiB and whose bytes never come costs the
// broker the bytes that came, not 100 MiB held for the idle timeout; the
// frame, once it does arrive in pieces, is read whole.
func TestPipelinedFrameClaimsMemoryAsItArrives(t *testing.T) {
	_, nc := rawConn(t, "pipe4")
	out := reqFrame(oneRecordProduce("pipe4", -1, 1), 400)
	var hdr [6]byte
	binary.BigEndian.PutUint32(hdr[:], 100<<20) // api key 0 follows
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := nc.Write(append(out, hdr[:]...)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readAnswer(nc, 2*time.Second); err != nil {
		t.Fatalf("the first produce was not answered: %v", err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 32<<20 {
		t.Fatalf("a frame announced at 100 MiB, 2 bytes of it sent: %d MB allocated", grew>>20)
	}

	// A frame that comes in pieces, slower than the pipelining wait, is
	// still read whole and answered.
	_, nc2 := rawConn(t, "pipe5")
	first := reqFrame(oneRecordProduce("pipe5", -1, 1), 500)
	second := reqFrame(recordProduce("pipe5", -1, bytes.Repeat([]byte{7}, 300<<10)), 501)
	if _, err := nc2.Write(append(first, second[:100]...)); err != nil {
		t.Fatal(err)
	}
	for rest := second[100:]; len(rest) > 0; {
		time.Sleep(30 * time.Millisecond)
		n := min(len(rest), 100<<10)
		if _, err := nc2.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	for _, want := range []int32{500, 501} {
		corr, _, err := readAnswer(nc2, 5*time.Second)
		if err != nil || corr != want {
			t.Fatalf("answer %d: %v, want %d", corr, err, want)
		}
	}
}

// TestAcksZeroPanicIsNotAnswered: a panicking acks=0 produce gets no answer
// (none is expected; the connection closes instead of sending one the
// client would take for its next request's).
func TestAcksZeroPanicIsNotAnswered(t *testing.T) {
	ts, nc := rawConn(t, "")
	hook := func(req *protocol.Request) {
		if req.Key == 0 {
			panic("injected")
		}
	}
	ts.beforeHandle.Store(&hook)
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 1
	out := append(reqFrame(oneRecordProduce("pipe4", 0, 1), 1), reqFrame(md, 2)...)
	if _, err := nc.Write(out); err != nil {
		t.Fatal(err)
	}
	if corr, _, err := readAnswer(nc, 5*time.Second); err == nil {
		t.Fatalf("got an answer with correlation id %d; want the connection closed", corr)
	}
}

// TestPipeliningLateRestOfALargeFrame: a large produce (bigger than the read
// buffer) whose rest arrives late does not hold up the answer to the one
// before it, and is itself read, appended and answered once it arrives.
func TestPipeliningLateRestOfALargeFrame(t *testing.T) {
	ts, nc := rawConn(t, "pipe5")
	first := reqFrame(oneRecordProduce("pipe5", -1, 1), 400)
	big := reqFrame(recordProduce("pipe5", -1, bytes.Repeat([]byte{7}, 300<<10)), 401)
	if _, err := nc.Write(append(first, big[:len(big)/2]...)); err != nil {
		t.Fatal(err)
	}
	if corr, p := readProduceAnswer(t, nc); corr != 400 || p.BaseOffset != 0 {
		t.Fatalf("first answer: corr %d, %+v", corr, p)
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := nc.Write(big[len(big)/2:]); err != nil {
		t.Fatal(err)
	}
	if corr, p := readProduceAnswer(t, nc); corr != 401 || p.ErrorCode != 0 || p.BaseOffset != 1 {
		t.Fatalf("large request's answer: corr %d, %+v", corr, p)
	}
	if hw := ts.reg.partition(ts.reg.get("pipe5"), 0).log.HighWatermark(); hw != 2 {
		t.Fatalf("high watermark %d, want 2", hw)
	}
}

// TestFetchDuplicatesAndLongWaits: a fetch naming one partition several
// times is answered (and read) once, and a long poll asking for 24 days
// ends at the broker's bound with an empty answer.
func TestFetchDuplicatesAndLongWaits(t *testing.T) {
	defer func(d time.Duration) { maxFetchWait = d }(maxFetchWait)
	maxFetchWait = 300 * time.Millisecond
	ts, nc := rawConn(t, "dup")
	if _, err := nc.Write(reqFrame(oneRecordProduce("dup", -1, 1), 1)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readAnswer(nc, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	cl, _ := client(t, ts.addr)
	fetch := func(offset int64, wait int32) *kmsg.FetchResponse {
		t.Helper()
		req := kmsg.NewPtrFetchRequest()
		req.Version, req.ReplicaID, req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 12, -1, wait, 1<<30, 1<<20
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = "dup", ts.reg.get("dup").id // kgo sends its newest version
		for i := 0; i < 1000; i++ {
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.FetchOffset, rp.PartitionMaxBytes = offset, 1<<20
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctxT(t), cl)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	start := time.Now()
	resp := fetch(0, 1<<31-1)
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("a long poll of 24 days lasted %v", el)
	}
	if n := len(resp.Topics[0].Partitions); n != 1 {
		t.Fatalf("%d partitions answered for one partition named 1000 times", n)
	}
	if p := resp.Topics[0].Partitions[0]; p.ErrorCode != 0 || len(p.RecordBatches) == 0 {
		t.Fatalf("the partition's answer: error %d, %d bytes", p.ErrorCode, len(p.RecordBatches))
	}
}

// TestListOffsetsDuplicates: a partition named twice in a ListOffsets gets
// INVALID_REQUEST for both entries (Kafka's answer), others their offsets.
func TestListOffsetsDuplicates(t *testing.T) {
	ts, _ := rawConn(t, "lo")
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctxT(t), 2, 1, nil, "lo2"); err != nil {
		t.Fatal(err)
	}
	cl, _ := client(t, ts.addr)
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	for _, tp := range []struct {
		topic string
		p     int32
	}{{"lo", 0}, {"lo2", 0}, {"lo", 0}, {"lo2", 1}} {
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = tp.topic
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = tp.p, -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctxT(t), cl)
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string][]int16{} // kgo regroups the request by topic
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			codes[rt.Topic] = append(codes[rt.Topic], rp.ErrorCode)
		}
	}
	inv := kerr.InvalidRequest.Code
	if got, want := fmt.Sprint(codes), fmt.Sprint(map[string][]int16{"lo": {inv, inv}, "lo2": {0, 0}}); got != want {
		t.Fatalf("error codes %v, want %v", got, want)
	}
}

// TestCorruptRetryOfADuplicateIsRefused: an idempotent batch that repeats
// a written one's sequence but fails its CRC gets CORRUPT_MESSAGE, not the
// earlier batch's success (Kafka validates before it checks sequences).
func TestCorruptRetryOfADuplicateIsRefused(t *testing.T) {
	ts, _ := rawConn(t, "idem2")
	cl, _ := client(t, ts.addr)
	ctx := ctxT(t)
	ipr, err := kmsg.NewPtrInitProducerIDRequest().RequestWith(ctx, cl)
	if err != nil || ipr.ErrorCode != 0 {
		t.Fatal(err, ipr)
	}
	send := func(corrupt bool) int16 {
		t.Helper()
		req := recordProduce("idem2", -1, []byte("v"))
		rp := &req.Topics[0].Partitions[0]
		rb := kmsg.RecordBatch{Magic: 2, ProducerID: ipr.ProducerID, FirstSequence: 0, NumRecords: 1, FirstTimestamp: 1, MaxTimestamp: 1}
		rec := kmsg.Record{Value: []byte("v")}
		rec.Length = int32(len(rec.AppendTo(nil)) - 1)
		rb.Records = rec.AppendTo(nil)
		rp.Records = fixCRC(rb.AppendTo(nil))
		if corrupt {
			rp.Records[len(rp.Records)-1] ^= 0xff
		}
		req.Topics[0].TopicID = ts.reg.get("idem2").id
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Topics[0].Partitions[0].ErrorCode
	}
	if code := send(false); code != 0 {
		t.Fatalf("first batch: error %d", code)
	}
	if code := send(true); code != kerr.CorruptMessage.Code {
		t.Fatalf("corrupt retry of it: error %d, want CORRUPT_MESSAGE", code)
	}
	if code := send(false); code != 0 {
		t.Fatalf("whole retry of it: error %d", code)
	}
}

// TestIdleProducerStateExpires: a partition forgets an idempotent producer
// idle past producer.id.expiration.ms (as Kafka does: every producer id
// ever seen is not kept for ever), and keeps one that is not.
func TestIdleProducerStateExpires(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	ts := startServerConfig(t, Config{MaintenanceInterval: 20 * time.Millisecond, ProducerIDExpiration: time.Hour,
		Now: func() time.Time { return time.UnixMilli(clock.Load()) }})
	cl, adm := client(t, ts.addr, kgo.ProducerBatchCompression(kgo.NoCompression())) // kgo: idempotent
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "exp"); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "exp", Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	p := ts.reg.partitionsOf(ts.reg.get("exp"))[0]
	producers := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.producers)
	}
	if producers() != 1 {
		t.Fatalf("%d producers after an idempotent produce", producers())
	}
	clock.Add((59 * time.Minute).Milliseconds())
	time.Sleep(200 * time.Millisecond) // several passes
	if producers() != 1 {
		t.Fatal("a producer idle for less than the expiration was forgotten")
	}
	clock.Add((2 * time.Minute).Milliseconds())
	waitUntil(t, 5*time.Second, func() bool { return producers() == 0 })
}

// TestTopicCreationPerRequestBounds: a Metadata request auto-creates at
// most maxAutoCreates topics (the rest LEADER_NOT_AVAILABLE, created when
// asked again), and a CreateTopics creates at most maxPartitionsPerRequest
// partitions in all (the rest POLICY_VIOLATION).
func TestTopicCreationPerRequestBounds(t *testing.T) {
	defer func(n int) { maxPartitionsPerRequest = n }(maxPartitionsPerRequest)
	maxPartitionsPerRequest = 10
	ts, _ := rawConn(t, "")
	cl, adm := client(t, ts.addr)
	ctx := ctxT(t)
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = true
	for i := 0; i < maxAutoCreates+6; i++ {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(fmt.Sprintf("auto-%d", i))
		req.Topics = append(req.Topics, rt)
	}
	count := func() (ok, later int) {
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		for _, rt := range resp.Topics {
			switch rt.ErrorCode {
			case 0:
				ok++
			case kerr.LeaderNotAvailable.Code:
				later++
			default:
				t.Fatalf("%s: error %d", *rt.Topic, rt.ErrorCode)
			}
		}
		return
	}
	if ok, later := count(); ok != maxAutoCreates || later != 6 {
		t.Fatalf("first request: %d created, %d for later; want %d and 6", ok, later, maxAutoCreates)
	}
	if ok, later := count(); ok != maxAutoCreates+6 || later != 0 {
		t.Fatalf("second request: %d there, %d for later", ok, later)
	}
	resp, err := adm.CreateTopics(ctx, 4, 1, nil, "c1", "c2", "c3")
	if err != nil {
		t.Fatal(err)
	}
	var refused int
	for _, r := range resp {
		if errors.Is(r.Err, kerr.PolicyViolation) {
			refused++
		} else if r.Err != nil {
			t.Fatalf("%s: %v", r.Topic, r.Err)
		}
	}
	if refused != 1 {
		t.Fatalf("3 topics of 4 partitions under a bound of 10: %d refused, want 1", refused)
	}
}

// TestCompactTopicsKeepEverythingAndZeroRetention: a topic with
// cleanup.policy=compact is never cut by age or size (only the cleaner removes records) and keeps all its data
// whatever retention.* say, instead of losing keys' latest values by age;
// retention.ms=0 on a delete topic deletes all but the active segment (it
// meant "the default, 7 days" without a tier). Both with and without a
// tiered store.
func TestCompactTopicsKeepEverythingAndZeroRetention(t *testing.T) {
	for _, tiered := range []bool{false, true} {
		t.Run(fmt.Sprintf("tiered=%v", tiered), func(t *testing.T) {
			var clock atomic.Int64
			clock.Store(time.Now().UnixMilli())
			cfg := Config{MaintenanceInterval: 20 * time.Millisecond, Now: func() time.Time { return time.UnixMilli(clock.Load()) }}
			if tiered {
				cfg.Tier = tiering.New(tiering.NewMemStore(), nil, 8<<20)
			}
			ts := startServerConfig(t, cfg)
			cl, adm := client(t, ts.addr, kgo.ProducerBatchCompression(kgo.NoCompression()))
			ctx := ctxT(t)
			for topic, policy := range map[string]string{"kept": "compact", "gone": "delete"} {
				c := map[string]*string{"cleanup.policy": kstr(policy), "retention.ms": kstr("0"), "segment.bytes": kstr("5000")}
				if tiered {
					c["local.retention.bytes"] = kstr("0")
				}
				if _, err := adm.CreateTopic(ctx, 1, 1, c, topic); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 20; i++ { // keyed: a compacted topic refuses records without a key
					if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte{byte(i)}, Value: bytes.Repeat([]byte{byte(i)}, 900)}).FirstErr(); err != nil {
						t.Fatal(err)
					}
				}
			}
			clock.Add(time.Minute.Milliseconds())
			start := func(topic string) int64 {
				return ts.reg.partitionsOf(ts.reg.get(topic))[0].log.LogStartOffset()
			}
			waitUntil(t, 10*time.Second, func() bool { return start("gone") > 0 })
			time.Sleep(200 * time.Millisecond) // more passes
			if s := start("kept"); s != 0 {
				t.Fatalf("a compact topic's log starts at %d: data deleted by age", s)
			}
		})
	}
}

// TestDescribeConfigsEmptyNamesMeansAll: an empty (not null) list of config
// names asks for every config, as Kafka's ConfigHelper answers.
func TestDescribeConfigsEmptyNamesMeansAll(t *testing.T) {
	ts, _ := rawConn(t, "dc")
	cl, _ := client(t, ts.addr)
	req := kmsg.NewPtrDescribeConfigsRequest()
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType, rr.ResourceName, rr.ConfigNames = kmsg.ConfigResourceTypeTopic, "dc", []string{}
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctxT(t), cl)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.Resources[0].Configs); n < 10 {
		t.Fatalf("%d configs for an empty list of names, want all", n)
	}
}

// TestTimestampBounds: with message.timestamp.before/after.max.ms set, a
// CreateTime batch too far from the broker's clock gets INVALID_TIMESTAMP
// (the settings were stored and ignored); one within them is written.
func TestTimestampBounds(t *testing.T) {
	ts, _ := rawConn(t, "")
	cl, adm := client(t, ts.addr, kgo.RecordRetries(1))
	ctx := ctxT(t)
	cfg := map[string]*string{"message.timestamp.before.max.ms": kstr("60000"), "message.timestamp.after.max.ms": kstr("60000")}
	if _, err := adm.CreateTopic(ctx, 1, 1, cfg, "tsb"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, c := range []struct {
		at   time.Time
		want error
	}{{now, nil}, {now.Add(time.Hour), kerr.InvalidTimestamp}, {now.Add(-time.Hour), kerr.InvalidTimestamp}} {
		err := cl.ProduceSync(ctx, &kgo.Record{Topic: "tsb", Value: []byte("v"), Timestamp: c.at}).FirstErr()
		if !errors.Is(err, c.want) && !(c.want == nil && err == nil) {
			t.Fatalf("timestamp %v from now: %v, want %v", c.at.Sub(now).Round(time.Minute), err, c.want)
		}
	}
	// before/after, when set, win over the older difference bound (as
	// Kafka's LogConfig has it), which applies where they are not set.
	cfg = map[string]*string{"message.timestamp.difference.max.ms": kstr("1000"), "message.timestamp.before.max.ms": kstr("600000")}
	if _, err := adm.CreateTopic(ctx, 1, 1, cfg, "tsd"); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "tsd", Value: []byte("v"), Timestamp: time.Now().Add(-time.Minute)}).FirstErr(); err != nil {
		t.Fatalf("a minute old under before.max.ms = 10 min, difference 1 s: %v", err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "tsd", Value: []byte("v"), Timestamp: time.Now().Add(time.Minute)}).FirstErr(); !errors.Is(err, kerr.InvalidTimestamp) {
		t.Fatalf("a minute ahead with only difference = 1 s bounding it: %v", err)
	}
}

// TestCleanupPolicyList: cleanup.policy is a list (spaces allowed, as in
// Kafka) that IncrementalAlterConfigs can APPEND to and SUBTRACT from;
// APPEND on a config that is no list is INVALID_CONFIG.
func TestCleanupPolicyList(t *testing.T) {
	ts, _ := rawConn(t, "")
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": kstr("compact, delete")}, "cp"); err != nil {
		t.Fatal(err)
	}
	policy := func() string { return ts.reg.configsOf(ts.reg.get("cp"))["cleanup.policy"] }
	alter := func(op kadm.IncrementalOp, name, v string) error {
		r, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: op, Name: name, Value: kstr(v)}}, "cp")
		if err != nil {
			return err
		}
		return r[0].Err
	}
	if err := alter(kadm.SubtractConfig, "cleanup.policy", "delete"); err != nil || policy() != "compact" {
		t.Fatalf("SUBTRACT delete: %v, policy %q", err, policy())
	}
	if err := alter(kadm.AppendConfig, "cleanup.policy", "delete"); err != nil || policy() != "compact,delete" {
		t.Fatalf("APPEND delete: %v, policy %q", err, policy())
	}
	if err := alter(kadm.AppendConfig, "retention.ms", "5"); !errors.Is(err, kerr.InvalidConfig) {
		t.Fatalf("APPEND on retention.ms: %v, want INVALID_CONFIG", err)
	}
}

// TestFetchMaxBytesIsBounded: a fetch asking for up to 2 GiB gets at most
// fetch.max.bytes of record bytes (lowered here), so a response never
// nears the int32 size its headers must fit in (the connection closed and
// the client asked again for ever).
func TestFetchMaxBytesIsBounded(t *testing.T) {
	defer func(n int64) { fetchMaxBytes = n }(fetchMaxBytes)
	fetchMaxBytes = 100 << 10
	ts, _ := rawConn(t, "")
	cl, adm := client(t, ts.addr, kgo.ProducerBatchCompression(kgo.NoCompression()))
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 4, 1, nil, "big"); err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 4; p++ {
		for i := 0; i < 10; i++ {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "big", Partition: p, Value: bytes.Repeat([]byte{1}, 20<<10)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID, req.MaxBytes = -1, 1<<31-1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = "big", ts.reg.get("big").id
	for p := int32(0); p < 4; p++ {
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.PartitionMaxBytes = p, 1<<30
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, p := range resp.Topics[0].Partitions {
		total += len(p.RecordBatches)
	}
	if total == 0 || total > 100<<10+30<<10 {
		t.Fatalf("%d record bytes for MaxBytes 2 GiB under a 100 KiB fetch.max.bytes", total)
	}
}

// TestKafka3TopicConfigsAccepted: configs Kafka 3.x still accepts (some
// deprecated, some with nothing to do on one replica) are accepted and
// described, not refused; bad values and unknown names still are.
func TestKafka3TopicConfigsAccepted(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	cfg := map[string]*string{
		"message.format.version":                  kmsg.StringPtr("2.8-IV1"),
		"leader.replication.throttled.replicas":   kmsg.StringPtr("0:0"),
		"follower.replication.throttled.replicas": kmsg.StringPtr("*"),
		"compression.zstd.level":                  kmsg.StringPtr("5"),
	}
	if r, err := adm.CreateTopic(ctx, 1, 1, cfg, "k3"); err != nil || r.Err != nil {
		t.Fatalf("create with Kafka 3.x configs: %v %v", err, r.Err)
	}
	rc, err := adm.DescribeTopicConfigs(ctx, "k3")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range rc[0].Configs {
		got[c.Key] = c.MaybeValue()
	}
	if got["message.format.version"] != "2.8-IV1" || got["compression.zstd.level"] != "5" {
		t.Fatalf("described: %v", got)
	}
	for name, v := range map[string]string{"message.format.version": "new", "leader.replication.throttled.replicas": "x", "no.such.config": "one"} {
		if r, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{name: kmsg.StringPtr(v)}, "bad-"+v); err == nil && r.Err == nil {
			t.Fatalf("%s=%s accepted", name, v)
		}
	}
}
