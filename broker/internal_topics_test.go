package broker

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// __consumer_offsets is listed as an internal topic once groups are used,
// never created as an ordinary one, refuses produce and reads empty.
func TestVirtualOffsetsTopic(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	cl, adm := client(t, ts.addr, kgo.AllowAutoTopicCreation())
	ctx := ctxT(t)
	md, err := adm.Metadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := md.Topics[offsetsTopic]; ok {
		t.Fatal("__consumer_offsets listed before any group was used")
	}
	// Neither internal name is auto-created.
	for _, name := range []string{offsetsTopic, txnTopic} {
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(name)
		req.Topics, req.AllowAutoTopicCreation = append(req.Topics, rt), true
		if _, err := req.RequestWith(ctx, cl); err != nil {
			t.Fatal(err)
		}
		if ts.reg.get(name) != nil {
			t.Fatalf("%s was created as an ordinary topic", name)
		}
	}
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.CoordinatorKey = "g"
	if _, err := fc.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	all, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl) // not kadm's cached metadata
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mt := range all.Topics {
		if mt.Topic != nil && *mt.Topic == offsetsTopic {
			found = mt.IsInternal && len(mt.Partitions) == 1 && mt.ErrorCode == 0
		}
	}
	if !found {
		t.Fatalf("__consumer_offsets after FindCoordinator: %+v", all.Topics)
	}
	named, err := adm.Metadata(ctx, offsetsTopic)
	if mt := named.Topics[offsetsTopic]; err != nil || mt.Err != nil || !mt.IsInternal || len(mt.Partitions) != 1 {
		t.Fatalf("Metadata of __consumer_offsets by name: %v %+v", err, mt)
	}
	// Deleting it is refused, by name and by id; it stays listed.
	if dr, err := adm.DeleteTopics(ctx, offsetsTopic); err != nil || !errors.Is(dr[offsetsTopic].Err, kerr.InvalidTopicException) {
		t.Fatalf("DeleteTopics __consumer_offsets: %v %+v", err, dr)
	}
	dreq := kmsg.NewPtrDeleteTopicsRequest()
	dt := kmsg.NewDeleteTopicsRequestTopic()
	dt.TopicID = named.Topics[offsetsTopic].ID
	dreq.Topics = append(dreq.Topics, dt)
	if dr, err := dreq.RequestWith(ctx, cl); err != nil || len(dr.Topics) != 1 || dr.Topics[0].ErrorCode != kerr.InvalidTopicException.Code {
		t.Fatalf("DeleteTopics __consumer_offsets by id: %v %+v", err, dr)
	}
	if !ts.virtualOffsets(offsetsTopic) {
		t.Fatal("__consumer_offsets gone after a refused delete")
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: offsetsTopic, Value: []byte("x")}).FirstErr(); !errors.Is(err, kerr.InvalidTopicException) {
		t.Fatalf("produce to __consumer_offsets: %v, want INVALID_TOPIC_EXCEPTION", err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, offsetsTopic); !errors.Is(err, kerr.TopicAlreadyExists) {
		t.Fatalf("CreateTopics __consumer_offsets: %v", err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, txnTopic); !errors.Is(err, kerr.InvalidRequest) {
		t.Fatalf("CreateTopics __transaction_state: %v", err)
	}
	ends, err := adm.ListEndOffsets(ctx, offsetsTopic)
	if o, _ := ends.Lookup(offsetsTopic, 0); err != nil || o.Err != nil || o.Offset != 0 {
		t.Fatalf("ListOffsets __consumer_offsets: %v %+v", err, o)
	}
	// Groups in the group log keep it listed from the next start on.
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "plain"); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CommitOffsets(ctx, "g", kadm.OffsetsFromRecords(kgo.Record{Topic: "plain", Partition: 0, Offset: 1})); err != nil {
		t.Fatal(err)
	}
	ts.stop(t)
	ts = startServer(t, dir)
	if !ts.offsetsShown.Load() {
		t.Fatal("__consumer_offsets not listed after a restart with a group")
	}
}
