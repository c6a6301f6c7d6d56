package broker

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/synapsebroker/synapse/tiering"
)

// slowStore delays every Put by delay (or until its context ends), as a
// far bucket does; with hang set, a Put waits for release whatever its
// context says (a call stuck in the kernel).
type slowStore struct {
	tiering.ObjectStore
	delay    time.Duration
	hang     atomic.Bool
	release  chan struct{}
	inflight atomic.Int32
}

func (s *slowStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	if s.hang.Load() {
		<-s.release
		return fmt.Errorf("slowStore: released")
	}
	if s.delay > 0 {
		t := time.NewTimer(s.delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return s.ObjectStore.Put(ctx, key, r, size)
}

// observed returns a logger writing to the test's log and to the returned
// observer.
func observed(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	return zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core)), logs
}

// manyPartitions creates topics × parts partitions on ts and produces one
// record to each.
func manyPartitions(t *testing.T, ts *testServer, topics, parts int) {
	t.Helper()
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	var recs []*kgo.Record
	for i := 0; i < topics; i++ {
		name := fmt.Sprintf("many-%d", i)
		if _, err := adm.CreateTopic(ctx, int32(parts), 1, nil, name); err != nil {
			t.Fatal(err)
		}
		for p := 0; p < parts; p++ {
			recs = append(recs, &kgo.Record{Topic: name, Partition: int32(p), Value: []byte(name)})
		}
	}
	pr, _ := client(t, ts.addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := pr.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// entry returns the one log entry whose message starts with prefix.
func entry(t *testing.T, logs *observer.ObservedLogs, prefix string) observer.LoggedEntry {
	t.Helper()
	var found []observer.LoggedEntry
	for _, e := range logs.All() {
		if strings.HasPrefix(e.Message, prefix) {
			found = append(found, e)
		}
	}
	if len(found) != 1 {
		var msgs []string
		for _, e := range logs.All() {
			msgs = append(msgs, e.Message)
		}
		t.Fatalf("%d log entries %q, want 1; all: %q", len(found), prefix, msgs)
	}
	return found[0]
}

func intField(t *testing.T, e observer.LoggedEntry, key string) int {
	t.Helper()
	v, ok := e.ContextMap()[key].(int64)
	if !ok {
		t.Fatalf("%q: no integer field %s in %v", e.Message, key, e.ContextMap())
	}
	return int(v)
}

// TestShutdownWithinItsDeadline: a graceful stop of a broker with 300
// partitions and a slow bucket, where the final offload cannot finish,
// returns by its deadline (plus scheduling slack), says how much it
// uploaded and left local; the next start uploads what was left, and the
// next stop with time enough leaves the bucket complete.
func TestShutdownWithinItsDeadline(t *testing.T) {
	const topics, parts = 3, 100
	mem := tiering.NewMemStore()
	slow := &slowStore{ObjectStore: mem, delay: 50 * time.Millisecond}
	dir := t.TempDir()
	logger, logs := observed(t)
	ts := startServerConfig(t, Config{DataDir: dir, Tier: tiering.New(slow, nil, 8<<20), Logger: logger,
		MaintenanceInterval: time.Hour}) // nothing uploads before the stop
	manyPartitions(t, ts, topics, parts)

	// 3 s: 1 s to close 300 partitions (closeReserve), 2 s for the final
	// offload, where 32 uploaders of 5 objects a partition at 50 ms each
	// get through some 250 partitions.
	const deadline = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	if err := ts.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	took := time.Since(start)
	<-ts.done
	if took > deadline+time.Second {
		t.Fatalf("stop took %s, deadline %s", took, deadline)
	}
	e := entry(t, logs, "final offload cut short by the shutdown deadline")
	up, left, unsealed := intField(t, e, "segments_uploaded"), intField(t, e, "segments_left_local"), intField(t, e, "partitions_unsealed")
	t.Logf("stop took %s: %d segments uploaded, %d left local, %d partitions unsealed", took, up, left, unsealed)
	if up == 0 || left == 0 {
		t.Fatalf("uploaded %d, left %d: want some of each (the test's timing is off)", up, left)
	}
	// Each partition had one record: sealed, it is one segment, uploaded
	// or left; unsealed, none.
	if up+left+unsealed != topics*parts || intField(t, e, "partitions_uploaded") != up {
		t.Fatalf("counts do not add up to %d partitions: %v", topics*parts, e.ContextMap())
	}

	// The next start uploads what was left (the first passes).
	ts2 := startServerConfig(t, Config{DataDir: dir, Tier: tiering.New(mem, nil, 8<<20), MaintenanceInterval: 50 * time.Millisecond})
	waitUntil(t, 30*time.Second, func() bool {
		st, _ := ts2.TierStatus(context.Background())
		return st.LagSegments == 0
	})
	for _, tp := range ts2.reg.all() {
		for _, p := range ts2.reg.partitionsOf(tp) {
			if p.log.LogEndOffset() != 1 {
				t.Fatalf("%s-%d: log end %d after the restart, want 1", tp.name, p.index, p.log.LogEndOffset())
			}
		}
	}
	// A stop with time enough seals and uploads the rest.
	logger3, logs3 := observed(t)
	ts2.logger = logger3
	ts2.stop(t)
	e = entry(t, logs3, "final offload: every partition sealed and uploaded")
	if intField(t, e, "partitions") != topics*parts {
		t.Fatalf("final offload after the restart: %v", e.ContextMap())
	}
	check := tiering.New(mem, nil, 8<<20)
	for _, tp := range ts2.reg.all() {
		for _, p := range ts2.reg.partitionsOf(tp) {
			m, err := check.Manifest(context.Background(), p.tierKey())
			if err != nil || m.Next() != 1 {
				t.Fatalf("%s-%d: the bucket's log ends at %d (%v), want 1", tp.name, p.index, m.Next(), err)
			}
		}
	}
}

// TestShutdownWithStuckStoreCalls: store calls that do not return on
// cancellation do not hold the stop past its deadline.
func TestShutdownWithStuckStoreCalls(t *testing.T) {
	slow := &slowStore{ObjectStore: tiering.NewMemStore(), release: make(chan struct{})}
	logger, logs := observed(t)
	ts := startServerConfig(t, Config{Tier: tiering.New(slow, nil, 8<<20), Logger: logger, MaintenanceInterval: time.Hour})
	manyPartitions(t, ts, 1, 50)
	slow.hang.Store(true)
	t.Cleanup(func() {
		// The stuck calls return, and the offload's goroutines end (their
		// partitions closed): none may log once the test is over.
		close(slow.release)
		for idle := 0; idle < 10; time.Sleep(10 * time.Millisecond) {
			if idle++; slow.inflight.Load() != 0 {
				idle = 0
			}
		}
	})

	const deadline = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	if err := ts.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	<-ts.done
	if took := time.Since(start); took > deadline+time.Second {
		t.Fatalf("stop took %s, deadline %s", took, deadline)
	}
	e := entry(t, logs, "final offload cut short")
	if e.ContextMap()["store_calls_stuck"] != true || intField(t, e, "segments_left_local") != 50 {
		t.Fatalf("offload with stuck store calls: %v", e.ContextMap())
	}
}

// TestRepeatedWarningsAreCounted: with the bucket away, every partition's
// upload fails on every pass, and at the stop: each warning is logged once,
// then counted (the stop reports the counts), not once per partition per
// pass.
func TestRepeatedWarningsAreCounted(t *testing.T) {
	store, away := storeThatGoesAway()
	dir := t.TempDir()
	ts := startServerConfig(t, Config{DataDir: dir, Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 20 * time.Millisecond})
	manyPartitions(t, ts, 2, 20)
	ts.stop(t)
	// Restarted with the bucket away: no manifest is known, every upload
	// fails.
	away.Store(true)
	logger, logs := observed(t)
	ts = startServerConfig(t, Config{DataDir: dir, Tier: tiering.New(store, nil, 8<<20), Logger: logger, MaintenanceInterval: 20 * time.Millisecond})
	count := func(msg string) int { return logs.FilterMessage(msg).Len() }
	waitUntil(t, 10*time.Second, func() bool { return count("upload to the tiered store") > 0 })
	time.Sleep(500 * time.Millisecond) // passes go on failing
	if n := count("upload to the tiered store"); n != 1 {
		t.Fatalf("%d upload warnings logged: want one, the rest counted", n)
	}
	ts.stop(t)
	sum := entry(t, logs, "upload to the tiered store (repeated ")
	if n := intField(t, sum, "repeated"); n < 40 {
		t.Fatalf("%d repeats counted over several passes of 40 partitions", n)
	}
	if !strings.Contains(sum.Message, "in the last ") || !strings.Contains(sum.Message, "e.g. topic=many-") {
		t.Fatalf("summary %q", sum.Message)
	}
	if n := count("final upload"); n != 1 {
		t.Fatalf("%d final upload warnings: want one, the rest counted", n)
	}
	if n := intField(t, entry(t, logs, "final upload (repeated "), "repeated"); n != 39 {
		t.Fatalf("final upload repeated %d times, want 39", n)
	}
	e := entry(t, logs, "final offload incomplete")
	if intField(t, e, "partitions_failed") != 40 || intField(t, e, "segments_left_local") < 40 {
		t.Fatalf("final offload with the bucket away: %v", e.ContextMap())
	}
}

func TestCloseReserve(t *testing.T) {
	for _, c := range []struct {
		total      time.Duration
		partitions int
		want       time.Duration
	}{
		{30 * time.Second, 10, 6 * time.Second},            // a fifth
		{2 * time.Second, 10, time.Second},                 // at least 1 s (at most half)
		{time.Second, 0, 500 * time.Millisecond},           // at most half
		{5 * time.Minute, 10, 10 * time.Second},            // at most 10 s for the fifth...
		{30 * time.Second, 10000, 10 * time.Second},        // ... or 1 ms a partition
		{5 * time.Minute, 50000, 50 * time.Second},         // however many
		{10 * time.Second, 10000, 7500 * time.Millisecond}, // but at most three quarters
	} {
		if got := closeReserve(c.total, c.partitions); got != c.want {
			t.Errorf("closeReserve(%s, %d) = %s, want %s", c.total, c.partitions, got, c.want)
		}
	}
}
