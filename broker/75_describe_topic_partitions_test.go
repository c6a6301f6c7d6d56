package broker

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// describeTopicPartitions sends one DescribeTopicPartitions straight to the
// broker (kadm has no helper; the request is not sharded).
func describeTopicPartitions(t *testing.T, cl *kgo.Client, node int32, limit int32, cursor *kmsg.DescribeTopicPartitionsRequestCursor, topics ...string) *kmsg.DescribeTopicPartitionsResponse {
	t.Helper()
	req := kmsg.NewPtrDescribeTopicPartitionsRequest()
	req.ResponsePartitionLimit, req.Cursor = limit, cursor
	for _, n := range topics {
		rt := kmsg.NewDescribeTopicPartitionsRequestTopic()
		rt.Topic = n
		req.Topics = append(req.Topics, rt)
	}
	kr, err := cl.Broker(int(node)).Request(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return kr.(*kmsg.DescribeTopicPartitionsResponse)
}

// dtpPages follows NextCursor from no cursor to the end: each page as
// "topic:first-last" (or "topic:ERR" for an error, "topic:" for none).
func dtpPages(t *testing.T, cl *kgo.Client, node, limit int32, topics ...string) [][]string {
	t.Helper()
	var pages [][]string
	var cursor *kmsg.DescribeTopicPartitionsRequestCursor
	for range 50 {
		r := describeTopicPartitions(t, cl, node, limit, cursor, topics...)
		var page []string
		for _, st := range r.Topics {
			s := *st.Topic + ":"
			switch {
			case st.ErrorCode != 0:
				s += kerr.ErrorForCode(st.ErrorCode).Error()[:5]
			case len(st.Partitions) > 0:
				s += fmt.Sprintf("%d-%d", st.Partitions[0].Partition, st.Partitions[len(st.Partitions)-1].Partition)
			}
			page = append(page, s)
		}
		pages = append(pages, page)
		if r.NextCursor == nil {
			return pages
		}
		c := kmsg.NewDescribeTopicPartitionsRequestCursor()
		c.Topic, c.Partition = r.NextCursor.Topic, r.NextCursor.Partition
		cursor = &c
	}
	t.Fatalf("no end of pages: %v", pages)
	return nil
}

// TestDescribeTopicPartitions: the listing of every topic and of named ones,
// in name order, paged by ResponsePartitionLimit through NextCursor as
// Kafka pages them; unknown and invalid names; a bad cursor.
func TestDescribeTopicPartitions(t *testing.T) {
	ts := startServer(t, t.TempDir())
	cl, adm := client(t, ts.addr)
	ctx := ctxT(t)
	for name, n := range map[string]int32{"b": 3, "a": 2, "c": 1} {
		if _, err := adm.CreateTopic(ctx, n, 1, nil, name); err != nil {
			t.Fatal(err)
		}
	}
	node := ts.meta.m.NodeID

	r := describeTopicPartitions(t, cl, node, 100, nil)
	if r.NextCursor != nil || len(r.Topics) != 3 {
		t.Fatalf("all topics: %+v", r)
	}
	td, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"a", "b", "c"} {
		st := r.Topics[i]
		if *st.Topic != want || st.ErrorCode != 0 || st.TopicID != td[want].ID || st.IsInternal || st.AuthorizedOperations <= 0 {
			t.Fatalf("topic %d: %+v, want %s", i, st, want)
		}
		if len(st.Partitions) != len(td[want].Partitions) {
			t.Fatalf("%s: %d partitions", want, len(st.Partitions))
		}
		for j, p := range st.Partitions {
			if p.Partition != int32(j) || p.LeaderID != node || p.LeaderEpoch != ts.meta.m.LeaderEpoch ||
				!slices.Equal(p.Replicas, []int32{node}) || !slices.Equal(p.ISR, []int32{node}) || p.ErrorCode != 0 {
				t.Fatalf("%s partition %d: %+v", want, j, p)
			}
		}
	}

	// Paging: 2 partitions a response. A topic cut short ends its page with
	// the cursor at its next partition; a topic reached with nothing left
	// gets the cursor at 0 and is not in the page.
	got := dtpPages(t, cl, node, 2)
	want := [][]string{{"a:0-1"}, {"b:0-1"}, {"b:2-2", "c:0-0"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages of 2: %v, want %v", got, want)
	}
	// A limit of 0 is 1.
	if got := dtpPages(t, cl, node, 0); len(got) != 6 {
		t.Fatalf("pages of 0 (1): %v", got)
	}
	// Named topics: each once, sorted; unknown and invalid ones have codes.
	got = dtpPages(t, cl, node, 10, "c", "missing", "a", "c", "bad/name")
	want = [][]string{{"a:0-1", "bad/name:INVAL", "c:0-0", "missing:UNKNO"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("named: %v, want %v", got, want)
	}
	// The budget spent before an unknown topic: the cursor points at it.
	r = describeTopicPartitions(t, cl, node, 2, nil, "a", "missing")
	if len(r.Topics) != 1 || r.NextCursor == nil || r.NextCursor.Topic != "missing" || r.NextCursor.Partition != 0 {
		t.Fatalf("a then missing, 2 partitions: %+v %+v", r.Topics, r.NextCursor)
	}
	// A cursor past the topic's partitions: the topic with none, no cursor.
	r = describeTopicPartitions(t, cl, node, 10, &kmsg.DescribeTopicPartitionsRequestCursor{Topic: "c", Partition: 5})
	if len(r.Topics) != 1 || *r.Topics[0].Topic != "c" || len(r.Topics[0].Partitions) != 0 || r.NextCursor != nil {
		t.Fatalf("cursor c:5: %+v %+v", r.Topics, r.NextCursor)
	}
	// A cursor partition near MaxInt32: no overflow into a negative cursor.
	for _, part := range []int32{math.MaxInt32, math.MaxInt32 - 5} {
		r = describeTopicPartitions(t, cl, node, 10, &kmsg.DescribeTopicPartitionsRequestCursor{Topic: "b", Partition: part}, "b", "c")
		if len(r.Topics) != 2 || *r.Topics[0].Topic != "b" || len(r.Topics[0].Partitions) != 0 || len(r.Topics[1].Partitions) != 1 || r.NextCursor != nil {
			t.Fatalf("cursor b:%d: %+v %+v", part, r.Topics, r.NextCursor)
		}
	}
	// A cursor topic not among those named, or a negative partition.
	for _, c := range []kmsg.DescribeTopicPartitionsRequestCursor{{Topic: "b"}, {Topic: "a", Partition: -1}} {
		r = describeTopicPartitions(t, cl, node, 10, &c, "a", "c")
		if len(r.Topics) != 2 || r.Topics[0].ErrorCode != kerr.InvalidRequest.Code || r.Topics[1].ErrorCode != kerr.InvalidRequest.Code || r.NextCursor != nil {
			t.Fatalf("cursor %+v: %+v", c, r.Topics)
		}
	}

	// __consumer_offsets once a group is in use: internal, one partition.
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.CoordinatorKey = "g"
	if _, err := fc.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	r = describeTopicPartitions(t, cl, node, 100, nil)
	if len(r.Topics) != 4 || *r.Topics[0].Topic != offsetsTopic || !r.Topics[0].IsInternal || len(r.Topics[0].Partitions) != 1 {
		t.Fatalf("with __consumer_offsets: %+v", r.Topics)
	}
}

// TestDescribeTopicPartitionsACLs: DESCRIBE per topic; the listing leaves
// the others out, a named one is TOPIC_AUTHORIZATION_FAILED (no id), after
// the rest; AuthorizedOperations is what the principal may do.
func TestDescribeTopicPartitionsACLs(t *testing.T) {
	w := newACLWorld(t)
	w.grant(t, kadm.NewACLs().Allow("User:u").Topics("visible").Operations(kadm.OpDescribe, kadm.OpRead))
	node := w.ss.meta.m.NodeID
	r := describeTopicPartitions(t, w.user, node, 100, nil)
	if len(r.Topics) != 1 || *r.Topics[0].Topic != "visible" {
		t.Fatalf("all topics as u: %+v", r.Topics)
	}
	if ops := r.Topics[0].AuthorizedOperations; ops != 1<<int32(opRead)|1<<int32(opDescribe) {
		t.Fatalf("authorized operations %b", ops)
	}
	r = describeTopicPartitions(t, w.user, node, 100, nil, "hidden", "visible", "nothere")
	if len(r.Topics) != 3 || *r.Topics[0].Topic != "visible" || r.Topics[0].ErrorCode != 0 {
		t.Fatalf("named as u: %+v", r.Topics)
	}
	for _, st := range r.Topics[1:] {
		if st.ErrorCode != kerr.TopicAuthorizationFailed.Code || st.TopicID != [16]byte{} || len(st.Partitions) != 0 {
			t.Fatalf("denied %s: %+v", *st.Topic, st)
		}
	}
}
