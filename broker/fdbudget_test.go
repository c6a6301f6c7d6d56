package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/synapsebroker/synapse/internal/fdbudget"
)

// With a descriptor budget far below the partition count, producing to
// every partition and one consumer fetching all of them get no error: the
// fetch serves fewer partitions per response (the rest answer empty and are
// read by the next fetch), appends wait for slots, and nothing goes offline.
func TestFetchAllPartitionsUnderATightBudget(t *testing.T) {
	const parts = 400
	b := fdbudget.New(48)
	ts := startServerConfig(t, Config{FDs: b, MaxOpenFiles: 1024})
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, parts, 1, nil, "wide"); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := 0; i < parts; i++ {
		recs = append(recs, &kgo.Record{Topic: "wide", Partition: int32(i), Value: []byte(fmt.Sprint(i))})
	}
	cl2, _ := client(t, ts.addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl2.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce to %d partitions under a budget of %d: %v", parts, b.Max(), err)
	}
	cons, _ := client(t, ts.addr, kgo.ConsumeTopics("wide"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))
	seen := map[int32]bool{}
	for len(seen) < parts && ctx.Err() == nil {
		fs := cons.PollFetches(ctx)
		fs.EachError(func(topic string, p int32, err error) {
			if ctx.Err() == nil {
				t.Fatalf("fetch %s/%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Value) != fmt.Sprint(r.Partition) {
				t.Fatalf("partition %d holds %q", r.Partition, r.Value)
			}
			seen[r.Partition] = true
		})
	}
	if len(seen) != parts {
		t.Fatalf("read %d of %d partitions", len(seen), parts)
	}
	if _, peak, refused := b.Stats(); peak > b.Max() || refused == 0 {
		t.Fatalf("budget %d: peak %d, refused %d (the budget should have bound)", b.Max(), peak, refused)
	}
	for _, tp := range ts.reg.all() {
		for _, p := range ts.reg.partitionsOf(tp) {
			if p.log.Err() != nil {
				t.Fatalf("partition offline: %v", p.log.Err())
			}
		}
	}
}
