package compattests

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lovoo/goka"
	"github.com/lovoo/goka/codec"
	"github.com/lovoo/goka/storage"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A Goka processor (github.com/lovoo/goka v1.1.16, on sarama) keeps a group
// table: its changelog "<group>-table" is a compacted topic. The broker runs
// with its default local-directory tier and local.retention.bytes 0 on the
// table, so the table's old segments are compacted in the bucket. After
// the processor stops and the cleaner has run, a new processor restores its
// table from the topic: it reads one record per key (counted in its
// storage before it is marked recovered) and every key has its latest
// value.

// countingStorage counts the records a table restore writes.
type countingStorage struct {
	storage.Storage
	mu        sync.Mutex
	recovered bool
	restored  map[string]int
}

func (s *countingStorage) count(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.recovered {
		s.restored[key]++
	}
}

func (s *countingStorage) Set(key string, value []byte) error {
	s.count(key)
	return s.Storage.Set(key, value)
}

func (s *countingStorage) Delete(key string) error {
	s.count(key)
	return s.Storage.Delete(key)
}

func (s *countingStorage) MarkRecovered() error {
	s.mu.Lock()
	s.recovered = true
	s.mu.Unlock()
	return s.Storage.MarkRecovered()
}

func TestGokaGroupTableRestoresFromACompactedTopic(t *testing.T) {
	abs := compactingSynapse(t)
	b := startSynapseWith(t, abs, func(b *synapseBroker) {
		b.extraArgs = append(b.extraArgs, "--cleaner-backoff", "100ms")
	})
	addr := b.Addr()
	ctx := testCtx(t, 2*time.Minute)
	group := "goka-" + uniqueTopic(t)
	input, table := group+"-in", group+"-table"
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, input); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{
		"cleanup.policy":            strPtr("compact"),
		"segment.bytes":             strPtr("4096"),
		"min.cleanable.dirty.ratio": strPtr("0.01"),
		"local.retention.bytes":     strPtr("0"),
	}, table); err != nil {
		t.Fatal(err)
	}

	const keys, versions = 20, 30
	start := func(st func(topic string, partition int32) (storage.Storage, error)) (*goka.Processor, func()) {
		t.Helper()
		g := goka.DefineGroup(goka.Group(group),
			goka.Input(goka.Stream(input), new(codec.String), func(c goka.Context, msg interface{}) { c.SetValue(msg) }),
			goka.Persist(new(codec.String)))
		p, err := goka.NewProcessor([]string{addr}, g, goka.WithStorageBuilder(st))
		if err != nil {
			t.Fatal(err)
		}
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(pctx) }()
		if err := p.WaitForReadyContext(ctx); err != nil {
			t.Fatal(err)
		}
		return p, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("processor: %v", err)
			}
		}
	}
	_, stop := start(storage.MemoryBuilder())
	latest := map[string]string{}
	for v := 0; v < versions; v++ {
		for k := 0; k < keys; k++ {
			key, val := fmt.Sprintf("key-%02d", k), fmt.Sprintf("v%d-%s", v, strings.Repeat("x", 40))
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: input, Key: []byte(key), Value: []byte(val)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			latest[key] = val
		}
	}
	// The processor has written every update to its table topic.
	for {
		ends, err := adm.ListEndOffsets(ctx, table)
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := ends.Lookup(table, 0); ok && o.Offset >= keys*versions {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the processor never wrote its table")
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	// Records of other keys roll the table's last segment so the cleaner
	// reaches the last updates (it never cleans the active segment).
	for i := 0; i < 60; i++ {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: table, Key: []byte(fmt.Sprintf("zz-filler-%02d", i)), Value: []byte(strings.Repeat("f", 100))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until a read of the table topic from the start has one record
	// per processor key.
	for {
		per := readKeys(t, ctx, addr, table)
		n := 0
		for k, c := range per {
			if strings.HasPrefix(k, "key-") {
				n += c
			}
		}
		if n == keys {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the table topic never compacted: %d records of %d keys", n, keys)
		}
		time.Sleep(200 * time.Millisecond)
	}

	cs := &countingStorage{Storage: storage.NewMemory(), restored: map[string]int{}}
	p, stop := start(func(string, int32) (storage.Storage, error) { return cs, nil })
	defer stop()
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("key-%02d", k)
		v, err := p.Get(key)
		if err != nil || v != latest[key] {
			t.Fatalf("restored table: %s = %v (%v), want %q", key, v, err, latest[key])
		}
		cs.mu.Lock()
		n := cs.restored[key]
		cs.mu.Unlock()
		if n != 1 {
			t.Fatalf("restore read %d records of %s, want 1 (a compacted table)", n, key)
		}
	}
}

// readKeys reads a topic from its start to its end and counts records per key.
func readKeys(t *testing.T, ctx context.Context, addr, topic string) map[string]int {
	t.Helper()
	per := map[string]int{}
	readToEnd(t, ctx, addr, topic, func(r *kgo.Record) { per[string(r.Key)]++ })
	return per
}

// readToEnd reads partition 0 of topic from its start up to the end it
// has now, handing each record to each.
func readToEnd(t *testing.T, ctx context.Context, addr, topic string, each func(*kgo.Record)) {
	t.Helper()
	adm, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, topic)
	adm.Close()
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(topic, 0)
	c, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for last := int64(-1); last < end.Offset-1; {
		fs := c.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s up to %d of %d", topic, last, end.Offset)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch %s: %v", topic, err) })
		fs.EachRecord(func(r *kgo.Record) {
			last = r.Offset
			each(r)
		})
	}
}
