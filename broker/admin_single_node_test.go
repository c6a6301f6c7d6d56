package broker

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSingleNodeAdminAPIs: DescribeLogDirs, ElectLeaders and the partition
// reassignment APIs answer as one Kafka broker does, through kadm (what
// kafkactl, topicctl and kafka-ui style tools send).
func TestSingleNodeAdminAPIs(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	cl, adm := client(t, ts.addr, kgo.DefaultProduceTopic("adm"), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, "adm"); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: make([]byte, 1000)}).FirstErr(); err != nil { // one record: one partition
		t.Fatal(err)
	}

	dirs, err := adm.DescribeAllLogDirs(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int64
	var dirName string
	dirs.Each(func(d kadm.DescribedLogDir) {
		dirName = d.Dir
		if d.Err != nil || d.TotalBytes <= 0 || d.UsableBytes <= 0 {
			t.Errorf("log dir %+v", d)
		}
	})
	for p := int32(0); p < 2; p++ {
		dp, ok := dirs[0].Lookup(dirName, "adm", p)
		if !ok {
			t.Fatalf("partition %d not described: %+v", p, dirs)
		}
		sizes = append(sizes, dp.Size)
	}
	if max(sizes[0], sizes[1]) < 1000 || min(sizes[0], sizes[1]) != 0 {
		t.Fatalf("sizes %v: want the written partition over 1000 bytes, the other 0", sizes)
	}

	el, err := adm.ElectLeaders(ctx, kadm.ElectPreferredReplica, kadm.TopicsSet{"adm": {0: {}, 1: {}}, "missing": {0: {}}})
	if err != nil {
		t.Fatal(err)
	}
	if e := el["adm"][0].Err; !errors.Is(e, kerr.ElectionNotNeeded) {
		t.Fatalf("elect adm-0: %v, want ELECTION_NOT_NEEDED", e)
	}
	if e := el["missing"][0].Err; !errors.Is(e, kerr.UnknownTopicOrPartition) {
		t.Fatalf("elect missing-0: %v", e)
	}

	var req kadm.AlterPartitionAssignmentsReq
	req.Assign("adm", 0, []int32{ts.meta.m.NodeID})
	req.Assign("adm", 1, []int32{7})
	ar, err := adm.AlterPartitionAssignments(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if e := ar["adm"][0].Err; e != nil {
		t.Fatalf("assign adm-0 to this node: %v", e)
	}
	if e := ar["adm"][1].Err; !errors.Is(e, kerr.InvalidReplicaAssignment) {
		t.Fatalf("assign adm-1 to node 7: %v", e)
	}
	lr, err := adm.ListPartitionReassignments(ctx, kadm.TopicsSet{"adm": {0: {}, 1: {}}})
	if err != nil || len(lr) != 0 {
		t.Fatalf("reassignments in progress: %v %v", lr, err)
	}
}
