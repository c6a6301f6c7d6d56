package broker

import (
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/synapsebroker/synapse/log"
)

// TestMaxTimestampRepaired: a batch whose header says MaxTimestamp -1 (as
// sarama sends) is stored with its greatest record timestamp, so
// ListOffsets by time finds its records (Kafka's log validator does the
// same).
func TestMaxTimestampRepaired(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	cl, adm := client(t, ts.addr, kgo.MaxVersions(kversion.V3_0_0())) // Produce by topic name
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "mt"); err != nil {
		t.Fatal(err)
	}
	const t0 = int64(1_700_000_000_000)
	var body []byte
	for i := range 3 {
		rec := kmsg.Record{OffsetDelta: int32(i), TimestampDelta64: int64(1000 * i), Value: []byte("v")}
		enc := rec.AppendTo(nil)
		body = binary.AppendVarint(body, int64(len(enc)-1))
		body = append(body, enc[1:]...)
	}
	b := kmsg.RecordBatch{PartitionLeaderEpoch: -1, Magic: 2, LastOffsetDelta: 2, FirstTimestamp: t0, MaxTimestamp: -1,
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: 3, Records: body}
	batch := b.AppendTo(nil)
	binary.BigEndian.PutUint32(batch[8:], uint32(len(batch)-12))
	binary.BigEndian.PutUint32(batch[17:], crc32.Checksum(batch[21:], crc32.MakeTable(crc32.Castagnoli)))

	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "mt"
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = batch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || resp.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("produce: %v %+v", err, resp)
	}
	p := ts.reg.partition(ts.reg.get("mt"), 0)
	var stored log.BatchHeader
	p.log.ScanHeaders(0, func(h *log.BatchHeader) bool { stored = *h; return false })
	if stored.MaxTimestamp != t0+2000 {
		t.Fatalf("stored MaxTimestamp %d, want %d", stored.MaxTimestamp, t0+2000)
	}
	offs, err := adm.ListOffsetsAfterMilli(ctx, t0+1500, "mt")
	if err != nil {
		t.Fatal(err)
	}
	if o := offs["mt"][0]; o.Offset != 2 || o.Timestamp != t0+2000 {
		t.Fatalf("ListOffsets by time %d: offset %d timestamp %d, want 2 at %d", t0+1500, o.Offset, o.Timestamp, t0+2000)
	}
	if got := consumeAll(t, ts.addr, "mt", 3); len(got) != 3 {
		t.Fatalf("read %d records", len(got))
	}
}
