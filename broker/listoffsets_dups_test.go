package broker

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestDuplicatePartitions(t *testing.T) {
	req := kmsg.NewPtrListOffsetsRequest()
	add := func(topic string, ps ...int32) {
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for _, p := range ps {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition = p
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	add("a", 0, 1, 99999, -1, 1<<30)
	add("b", 0, 1)
	if d := duplicatePartitions(req); d != nil {
		t.Fatalf("no duplicates, got %v", d)
	}
	add("a", 1, -1, 1<<30, 64)
	add("b", 63, 63)
	want := map[topicPartition]bool{{"a", 1}: true, {"a", -1}: true, {"a", 1 << 30}: true, {"b", 63}: true}
	d := duplicatePartitions(req)
	if len(d) != len(want) {
		t.Fatalf("duplicates %v, want %v", d, want)
	}
	for k := range want {
		if !d[k] {
			t.Fatalf("duplicates %v, want %v", d, want)
		}
	}
}
