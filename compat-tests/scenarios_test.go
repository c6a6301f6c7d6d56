package compattests

import (
	"context"
	"testing"
	"time"
)

// The scenarios every Go client runs, written once against the client
// interface; each client's file adapts its library to it.

// client is one Kafka client library bound to one broker. Methods report
// failures on t (and stop it with t.Fatal where going on makes no sense).
type client interface {
	// createTopic creates the topic with the client's admin API.
	createTopic(t testing.TB, ctx context.Context, topic string, partitions int32)
	// produce sends records of one codec with acks=all to their partitions
	// and waits until each is acknowledged; it sets Offset on each record
	// whose offset the client reports. A client keeps its producer for a
	// codec across calls (and across broker restarts).
	produce(t testing.TB, ctx context.Context, topic, codec string, recs []record)
	// consume reads counts[p] records of every partition p from offset 0,
	// without a consumer group.
	consume(t testing.TB, ctx context.Context, topic string, counts map[int32]int) []record
	// listOffset asks ListOffsets for ts: -2 earliest, -1 latest, else a
	// timestamp in milliseconds (the first offset at or after it).
	listOffset(t testing.TB, ctx context.Context, topic string, partition int32, ts int64) int64
	close()
}

// clientSpec describes one client library for the shared scenarios.
type clientSpec struct {
	newClient func(t testing.TB, b broker) client
	// nullsDistinct: null and empty keys/values are told apart end to end.
	nullsDistinct bool
	// noNullKey / noNullValue: the client cannot produce a null key / value.
	noNullKey, noNullValue bool
}

func (s clientSpec) gen() *recordGen {
	g := newRecordGen(numPartitions)
	g.noNullKey, g.noNullValue = s.noNullKey, s.noNullValue
	return g
}

func (s clientSpec) open(t *testing.T, b broker) client {
	c := s.newClient(t, b)
	t.Cleanup(c.close)
	return c
}

const (
	// recordsPerCodec ordinary records per codec (plus the special ones).
	recordsPerCodec = 12
	// scenarioTimeout bounds each scenario step.
	scenarioTimeout = 60 * time.Second
)

// runClientSuite runs every scenario for one client:
//
//	roundtrip/<codec>   create a 3-partition topic, produce keyed records with
//	                    headers, empty and null keys and values and a ~900 KB
//	                    value in that codec, consume from the beginning and
//	                    compare byte-exact (partition, offsets, timestamps)
//	roundtrip/list_offsets
//	                    earliest, latest and by timestamp on every topic that
//	                    passed its round trip
//	restart             produce half, restart the broker, produce the rest
//	                    with the same client, consume all
func runClientSuite(t *testing.T, spec clientSpec) {
	t.Run("roundtrip", func(t *testing.T) { runRoundTrip(t, spec) })
	t.Run("restart", func(t *testing.T) { runRestart(t, spec) })
}

func runRoundTrip(t *testing.T, spec clientSpec) {
	b := newBroker(t)
	c := spec.open(t, b)
	gen := spec.gen()

	type verified struct {
		topic string
		recs  []record // as consumed (and checked)
	}
	var done []verified
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx := testCtx(t, scenarioTimeout)
			topic := uniqueTopic(t)
			c.createTopic(t, ctx, topic, numPartitions)
			recs := gen.batch(codec, recordsPerCodec, true)
			c.produce(t, ctx, topic, codec, recs)
			if t.Failed() {
				t.FailNow()
			}
			got := c.consume(t, ctx, topic, perPartition(recs))
			checkRecords(t, recs, got, checkOpts{nullsDistinct: spec.nullsDistinct})
			if !t.Failed() {
				done = append(done, verified{topic, got})
			}
		})
	}
	t.Run("list_offsets", func(t *testing.T) {
		if len(done) == 0 {
			t.Skip("no topic passed its round trip")
		}
		ctx := testCtx(t, scenarioTimeout)
		for _, v := range done {
			for _, q := range offsetQueries(v.recs) {
				if got := c.listOffset(t, ctx, v.topic, q.partition, q.ts); got != q.want {
					t.Errorf("%s p%d ListOffsets %s (ts %d): offset %d, want %d", v.topic, q.partition, q.name, q.ts, got, q.want)
				}
			}
		}
	})
}

func runRestart(t *testing.T, spec clientSpec) {
	b := newBroker(t)
	c := spec.open(t, b)
	gen := spec.gen()
	ctx := testCtx(t, 2*scenarioTimeout)
	topic := uniqueTopic(t)
	c.createTopic(t, ctx, topic, numPartitions)

	var want []record
	produceAll := func() {
		for _, codec := range codecs {
			recs := gen.batch(codec, 4, false)
			c.produce(t, ctx, topic, codec, recs)
			if t.Failed() {
				t.FailNow()
			}
			want = append(want, recs...)
		}
	}
	produceAll()
	before := len(want)
	b.Restart(t)
	produceAll()
	t.Logf("produced %d records before the restart and %d after", before, len(want)-before)

	got := c.consume(t, ctx, topic, perPartition(want))
	checkRecords(t, want, got, checkOpts{nullsDistinct: spec.nullsDistinct})
}
