package broker

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/protocol"
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

// TestProducePipelining: produce requests sent back to back on one
// connection, without waiting for answers (acks=all, acks=0 and acks=1
// mixed, then a Metadata request), are all answered in request order with
// contiguous offsets, the acks=0 one not at all.
func TestProducePipelining(t *testing.T) {
	ts := startServerConfig(t, Config{AutoCreateTopics: true})
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctxT(t), 1, 1, nil, "pipe"); err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("pipe"))
	acks := []int16{-1, -1, -1, 0, -1, 1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}
	var out []byte
	for i, a := range acks {
		out = append(out, f.AppendRequest(nil, oneRecordProduce("pipe", a, byte(i)), int32(100+i))...) // AppendRequest sizes from dst[0]
	}
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 1
	out = append(out, f.AppendRequest(nil, md, 999)...)
	if _, err := nc.Write(out); err != nil { // all at once: they queue behind the first
		t.Fatal(err)
	}
	readResp := func() (int32, []byte) {
		t.Helper()
		var size [4]byte
		if _, err := io.ReadFull(nc, size[:]); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(nc, b); err != nil {
			t.Fatal(err)
		}
		return int32(binary.BigEndian.Uint32(b)), b[4:]
	}
	want := int64(0)
	for i, a := range acks {
		if a == 0 {
			want++
			continue // no answer
		}
		corr, body := readResp()
		if corr != int32(100+i) {
			t.Fatalf("answer %d has correlation id %d, want %d (out of order)", i, corr, 100+i)
		}
		resp := kmsg.NewPtrProduceResponse()
		resp.Version = 8
		if err := resp.ReadFrom(body); err != nil {
			t.Fatal(err)
		}
		p := resp.Topics[0].Partitions[0]
		if p.ErrorCode != 0 || p.BaseOffset != want {
			t.Fatalf("request %d: error %d offset %d, want offset %d", i, p.ErrorCode, p.BaseOffset, want)
		}
		want++
	}
	if corr, _ := readResp(); corr != 999 {
		t.Fatalf("metadata answered with correlation id %d", corr)
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
	ts := startServerConfig(t, Config{AutoCreateTopics: true})
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctxT(t), 1, 1, nil, "pipe2"); err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("pipe"))
	var out []byte
	for i := 0; i < 3; i++ {
		out = append(out, f.AppendRequest(nil, oneRecordProduce("pipe2", -1, byte(i)), int32(200+i))...)
	}
	// A produce header (key 0, v8) with a body that does not decode.
	bad := []byte{0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	binary.BigEndian.PutUint32(bad, uint32(len(bad)-4))
	out = append(out, bad...)
	if _, err := nc.Write(out); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		var size [4]byte
		if _, err := io.ReadFull(nc, size[:]); err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		b := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(nc, b); err != nil {
			t.Fatal(err)
		}
		if corr := int32(binary.BigEndian.Uint32(b)); corr != int32(200+i) {
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
	ts := startServerConfig(t, Config{AutoCreateTopics: true})
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctxT(t), 1, 1, nil, "pipe3"); err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("pipe"))
	out := f.AppendRequest(nil, oneRecordProduce("pipe3", -1, 1), 300)
	next := f.AppendRequest(nil, oneRecordProduce("pipe3", -1, 2), 301)
	if _, err := nc.Write(append(out, next[:10]...)); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	var size [4]byte
	if _, err := io.ReadFull(nc, size[:]); err != nil {
		t.Fatalf("the first produce was not answered while the second was incomplete: %v", err)
	}
}

// TestAcksZeroPanicIsNotAnswered: a panicking acks=0 produce gets no answer
// (none is expected; the connection closes instead of sending one the
// client would take for its next request's).
func TestAcksZeroPanicIsNotAnswered(t *testing.T) {
	ts := startServerConfig(t, Config{AutoCreateTopics: true})
	hook := func(req *protocol.Request) {
		if req.Key == 0 {
			panic("injected")
		}
	}
	ts.beforeHandle.Store(&hook)
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("pipe"))
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 1
	out := append(f.AppendRequest(nil, oneRecordProduce("pipe4", 0, 1), 1), f.AppendRequest(nil, md, 2)...)
	if _, err := nc.Write(out); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var size [4]byte
	if _, err := io.ReadFull(nc, size[:]); err == nil {
		b := make([]byte, 4)
		io.ReadFull(nc, b)
		t.Fatalf("got an answer with correlation id %d; want the connection closed", binary.BigEndian.Uint32(b))
	}
}

// TestPipeliningLateRestOfALargeFrame: a large produce (bigger than the read
// buffer) whose rest arrives late does not hold up the answer to the one
// before it, and is itself read, appended and answered once it arrives.
func TestPipeliningLateRestOfALargeFrame(t *testing.T) {
	ts := startServerConfig(t, Config{AutoCreateTopics: true})
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctxT(t), 1, 1, nil, "pipe5"); err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("pipe"))
	first := f.AppendRequest(nil, oneRecordProduce("pipe5", -1, 1), 400)
	big := f.AppendRequest(nil, recordProduce("pipe5", -1, bytes.Repeat([]byte{7}, 300<<10)), 401)
	if _, err := nc.Write(append(first, big[:len(big)/2]...)); err != nil {
		t.Fatal(err)
	}
	read := func() (int32, *kmsg.ProduceResponse) {
		t.Helper()
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		var size [4]byte
		if _, err := io.ReadFull(nc, size[:]); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(nc, b); err != nil {
			t.Fatal(err)
		}
		resp := kmsg.NewPtrProduceResponse()
		resp.Version = 8
		if err := resp.ReadFrom(b[4:]); err != nil {
			t.Fatal(err)
		}
		return int32(binary.BigEndian.Uint32(b)), resp
	}
	if corr, resp := read(); corr != 400 || resp.Topics[0].Partitions[0].BaseOffset != 0 {
		t.Fatalf("first answer: corr %d, %+v", corr, resp.Topics[0].Partitions[0])
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := nc.Write(big[len(big)/2:]); err != nil {
		t.Fatal(err)
	}
	if corr, resp := read(); corr != 401 || resp.Topics[0].Partitions[0].ErrorCode != 0 || resp.Topics[0].Partitions[0].BaseOffset != 1 {
		t.Fatalf("large request's answer: corr %d, %+v", corr, resp.Topics[0].Partitions[0])
	}
	if hw := ts.reg.partition(ts.reg.get("pipe5"), 0).log.HighWatermark(); hw != 2 {
		t.Fatalf("high watermark %d, want 2", hw)
	}
}
