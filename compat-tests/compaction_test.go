package compattests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Compaction read by real clients (issue 19). One broker with --tier none
// (every sealed segment is compacted locally) and --cleaner-backoff 100ms;
// one compacted partition with 4 KiB segments, min.cleanable.dirty.ratio
// 0.01 and delete.retention.ms 0. franz-go writes round 1 (50 keys, 1-6
// versions each in a shuffled order, every codec, tombstones as the last
// version of some keys, tombstones followed by a new value for others, an
// empty value that is not a tombstone, a key that is only ever a tombstone),
// then round 2 (new keys, one record each) until a franz-go read from 0 is
// exactly the latest value of every key at its original offset with no
// tombstone: the clean after the one that first saw a tombstone removes it.
// Then a tail of duplicates and a tombstone goes into the active segment,
// which the cleaner must leave alone.
//
// Every client reads from the beginning and from two offsets the clean
// removed (inside the longest removed run, and a removed tombstone) and
// must return exactly the surviving records from there: at their original
// offsets and timestamps, null and empty values apart, offsets strictly
// increasing with the gaps compaction left, the first one the next
// surviving offset.

const (
	compactionKeys     = 50
	compactionVersions = 6 // key kNN has 1+NN%6 versions
	// compactionSettle bounds the wait for the cleaner to reach the
	// expected state.
	compactionSettle = 30 * time.Second
)

// crec is one record as compaction tests see it: keys are never null.
type crec struct {
	Off int64
	Key string
	Val *string // nil: tombstone
	Ts  int64   // CreateTime, unix ms
}

func (r crec) String() string {
	return fmt.Sprintf("offset %d key %q value %s ts %d", r.Off, r.Key, showStrp(r.Val), r.Ts)
}

func bytesStrp(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

type compactedTopic struct {
	addr, topic string
	producers   map[string]*kgo.Client
	produced    []crec // every record produced, in offset order
	tailFrom    int64  // records from here on are in the active segment (-1: no tail yet)
	want        []crec // what a read from the beginning must return
	picks       []int64
}

func TestCompactionClients(t *testing.T) {
	c := newCompactedTopic(t)
	ctx := testCtx(t, compactionSettle+10*time.Second)
	c.settle(t, ctx)
	c.addTail(t, ctx)
	// Several cleaner passes: the active segment must stay as written.
	time.Sleep(time.Second)
	starts := append([]int64{-2}, c.picks...)

	t.Run("franz-go", func(t *testing.T) {
		ctx := testCtx(t, scenarioTimeout)
		for _, s := range starts {
			c.check(t, "franz-go", s, c.readKgo(t, ctx, s))
		}
	})
	for _, v := range []struct {
		name    string
		version sarama.KafkaVersion
	}{{"V2_8_0_0", sarama.V2_8_0_0}, {"MaxVersion-" + sarama.MaxVersion.String(), sarama.MaxVersion}} {
		t.Run("sarama/"+v.name, func(t *testing.T) {
			ctx := testCtx(t, scenarioTimeout)
			for _, s := range starts {
				c.check(t, "sarama "+v.name, s, c.readSarama(t, ctx, v.version, s))
			}
		})
	}
	t.Run("kcat", func(t *testing.T) {
		bin := kcatPath(t)
		ctx := testCtx(t, scenarioTimeout)
		for _, s := range starts {
			c.check(t, "kcat", s, c.readKcat(t, ctx, bin, s))
		}
	})
	for _, py := range []struct{ name, client, module, deb string }{
		{"kafka-python", "kafka-python", "kafka", "python3-kafka"},
		{"confluent-python", "confluent", "confluent_kafka", "python3-confluent-kafka"},
	} {
		t.Run(py.name, func(t *testing.T) {
			pythonModule(t, py.module, py.deb)
			ctx := testCtx(t, scenarioTimeout)
			got := c.readPython(t, ctx, py.client, starts)
			for _, s := range starts {
				c.check(t, py.name, s, got[s])
			}
		})
	}
}

// newCompactedTopic starts the broker and creates the topic.
// compactingSynapse is the broker binary for the compaction tests, which
// only Synapse can run (kfake does not compact): its absolute path, or a
// skip.
func compactingSynapse(t *testing.T) string {
	t.Helper()
	if compatTarget() != targetSynapse {
		t.Skip("synapse only: kfake does not compact")
	}
	bin := os.Getenv("SYNAPSE_BIN")
	if bin == "" {
		skipUnlessRequired(t, "SYNAPSE_BIN is not set: build the broker (make build)")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

func newCompactedTopic(t *testing.T) *compactedTopic {
	t.Helper()
	abs := compactingSynapse(t)
	b := startSynapseWith(t, abs, func(b *synapseBroker) {
		b.extraArgs = append(b.extraArgs, "--tier", "none", "--cleaner-backoff", "100ms")
	})
	c := &compactedTopic{addr: b.Addr(), topic: uniqueTopic(t), producers: map[string]*kgo.Client{}, tailFrom: -1}
	t.Cleanup(func() {
		for _, p := range c.producers {
			p.Close()
		}
	})
	admin, err := kgo.NewClient(kgo.SeedBrokers(c.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx := testCtx(t, 10*time.Second)
	cfg := map[string]*string{
		"cleanup.policy":            strPtr("compact"),
		"segment.bytes":             strPtr("4096"),
		"min.cleanable.dirty.ratio": strPtr("0.01"),
		"delete.retention.ms":       strPtr("0"),
	}
	resp, err := kadm.NewClient(admin).CreateTopic(ctx, 1, 1, cfg, c.topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create compacted topic %s: %v", c.topic, err)
	}
	return c
}

// produce sends recs (Off and Ts are set from the acknowledgement) with
// franz-go's idempotent producer in the given codec, in one ProduceSync.
func (c *compactedTopic) produce(t testing.TB, ctx context.Context, codec string, recs []crec) {
	t.Helper()
	p := c.producers[codec]
	if p == nil {
		var err error
		p, err = kgo.NewClient(kgo.SeedBrokers(c.addr), kgo.ProducerBatchCompression(kgoCodecs[codec]),
			kgo.ProducerLinger(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		c.producers[codec] = p
	}
	krs := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		krs[i] = &kgo.Record{Topic: c.topic, Partition: 0, Key: []byte(r.Key)}
		if r.Val != nil {
			krs[i].Value = []byte(*r.Val)
		}
	}
	if err := p.ProduceSync(ctx, krs...).FirstErr(); err != nil {
		t.Fatalf("produce %d records (%s): %v", len(recs), codec, err)
	}
	for i, kr := range krs {
		if kr.Partition != 0 {
			t.Fatalf("record %q produced to partition %d", kr.Key, kr.Partition)
		}
		recs[i].Off, recs[i].Ts = kr.Offset, kr.Timestamp.UnixMilli()
		c.produced = append(c.produced, recs[i])
	}
	slices.SortFunc(c.produced, func(a, b crec) int { return int(a.Off - b.Off) })
}

func val(key string, version int) *string {
	return strp(fmt.Sprintf("%s-v%d-%s", key, version, strings.Repeat("x", 90)))
}

// round1 is the first round: key kNN in 1+NN%6 versions, the versions of
// all keys shuffled together (each key's in order), so survivors and
// removed runs alternate; batches of 10 over every codec. k00-k07 end in a
// tombstone, k08-k11 have a tombstone before their last value, k12 ends in
// an empty value (not a tombstone), and one key is only ever a tombstone.
func (c *compactedTopic) round1(t testing.TB, ctx context.Context) {
	t.Helper()
	rng := mrand.New(mrand.NewPCG(19, 1))
	var order []int
	for k := range compactionKeys {
		for range 1 + k%compactionVersions {
			order = append(order, k)
		}
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	written := map[int]int{}
	var all []crec
	for i, k := range order {
		n, v := 1+k%compactionVersions, written[k]
		written[k]++
		key := fmt.Sprintf("k%02d", k)
		r := crec{Key: key, Val: val(key, v)}
		switch {
		case k < 8 && v == n-1: // deleted
			r.Val = nil
		case k >= 8 && k < 12 && v == n-2: // deleted, then written again
			r.Val = nil
		case k == 12 && v == n-1: // empty, not a tombstone
			r.Val = strp("")
		}
		all = append(all, r)
		if i == len(order)/2 {
			all = append(all, crec{Key: "only-tombstone"})
		}
	}
	for i := 0; i < len(all); i += 10 {
		c.produce(t, ctx, codecs[(i/10)%len(codecs)], all[i:min(i+10, len(all))])
	}
}

// expected is what must survive: the latest record of every key unless it
// is a tombstone, then the tail as written.
func (c *compactedTopic) expected() []crec {
	latest := map[string]crec{}
	var tail []crec
	for _, r := range c.produced {
		if c.tailFrom >= 0 && r.Off >= c.tailFrom {
			tail = append(tail, r)
			continue
		}
		latest[r.Key] = r
	}
	var want []crec
	for _, r := range latest {
		if r.Val != nil {
			want = append(want, r)
		}
	}
	slices.SortFunc(want, func(a, b crec) int { return int(a.Off - b.Off) })
	return append(want, tail...)
}

// settle writes round 1, then round 2 (new keys, one record each, about a
// segment at a time) until franz-go reads exactly the expected records.
func (c *compactedTopic) settle(t testing.TB, ctx context.Context) {
	t.Helper()
	start := time.Now()
	c.round1(t, ctx)
	round1End := c.produced[len(c.produced)-1].Off + 1
	deadline := start.Add(compactionSettle)
	n, chunks := 0, 0
	var diff string
	for time.Now().Before(deadline) {
		if chunks < 20 {
			var recs []crec
			for range 25 {
				key := fmt.Sprintf("n%04d", n)
				recs = append(recs, crec{Key: key, Val: val(key, 0)})
				n++
			}
			c.produce(t, ctx, "none", recs)
			chunks++
		}
		want := c.expected()
		for range 5 {
			time.Sleep(200 * time.Millisecond)
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			got := c.readKgo(t, rctx, -2)
			cancel()
			if diff = diffRecs(got, want); diff == "" {
				break
			}
		}
		if diff == "" {
			break
		}
	}
	if diff != "" {
		t.Fatalf("after %s and %d round-2 chunks the topic is not compacted as expected: %s", compactionSettle, chunks, diff)
	}
	c.want = c.expected()
	t.Logf("compacted in %s: %d records produced (round 1: offsets [0, %d), round 2: %d chunks of 25 new keys), %d survive",
		time.Since(start).Round(10*time.Millisecond), len(c.produced), round1End, chunks, len(c.want))

	// Offsets the clean removed: inside the longest removed run of round 1
	// between two survivors, and the last removed tombstone of round 1.
	survives := map[int64]bool{}
	for _, r := range c.want {
		survives[r.Off] = true
	}
	bestFrom, bestLen := int64(-1), int64(0)
	for off := c.want[0].Off; off < round1End; {
		if survives[off] {
			off++
			continue
		}
		from := off
		for off < round1End && !survives[off] {
			off++
		}
		if off-from > bestLen && off < round1End {
			bestFrom, bestLen = from, off-from
		}
	}
	if bestLen < 2 {
		t.Fatalf("no removed run of 2+ offsets between survivors in round 1 (longest %d at %d)", bestLen, bestFrom)
	}
	c.picks = append(c.picks, bestFrom+bestLen/2)
	var tomb int64 = -1
	for _, r := range c.produced {
		if r.Off < round1End && r.Val == nil {
			tomb = r.Off
		}
	}
	if tomb < 0 || survives[tomb] {
		t.Fatalf("round 1's last tombstone at %d: not removed", tomb)
	}
	if tomb != c.picks[0] {
		c.picks = append(c.picks, tomb)
	}
	t.Logf("reading from the beginning and from removed offsets %v (longest removed run [%d, %d))", c.picks, bestFrom, bestFrom+bestLen)
}

// addTail writes duplicates of round-1 keys, a tombstone and an empty value
// in one batch into the active segment: they must all stay.
func (c *compactedTopic) addTail(t testing.TB, ctx context.Context) {
	t.Helper()
	recs := []crec{
		{Key: "k20", Val: val("k20", 100)},
		{Key: "k21", Val: val("k21", 100)},
		{Key: "k20", Val: val("k20", 101)},
		{Key: "k22"}, // tombstone
		{Key: "k21", Val: strp("")},
	}
	c.produce(t, ctx, "none", recs)
	c.tailFrom = recs[0].Off
	c.want = c.expected()
}

// diffRecs describes how got differs from want ("" if not at all).
func diffRecs(got, want []crec) string {
	var sb strings.Builder
	for i := 1; i < len(got); i++ {
		if got[i].Off <= got[i-1].Off {
			fmt.Fprintf(&sb, "offsets not strictly increasing: %d after %d; ", got[i].Off, got[i-1].Off)
			break
		}
	}
	wantAt := map[int64]crec{}
	for _, r := range want {
		wantAt[r.Off] = r
	}
	gotAt := map[int64]bool{}
	bad := 0
	for _, g := range got {
		gotAt[g.Off] = true
		w, ok := wantAt[g.Off]
		switch {
		case !ok && g.Val == nil:
			fmt.Fprintf(&sb, "tombstone not removed: %s; ", g)
		case !ok:
			fmt.Fprintf(&sb, "unexpected record (not its key's latest): %s; ", g)
		case g.Key != w.Key || !sameStrp(g.Val, w.Val) || g.Ts != w.Ts:
			fmt.Fprintf(&sb, "got %s, want %s; ", g, w)
		default:
			continue
		}
		if bad++; bad >= 5 {
			break
		}
	}
	missing := 0
	for _, w := range want {
		if !gotAt[w.Off] {
			if missing < 5 {
				fmt.Fprintf(&sb, "missing %s; ", w)
			}
			missing++
		}
	}
	if sb.Len() == 0 {
		return ""
	}
	return fmt.Sprintf("read %d records, want %d: %s", len(got), len(want), strings.TrimSuffix(sb.String(), "; "))
}

// check compares what client read from start with the survivors from
// there; the first must be the next surviving offset.
func (c *compactedTopic) check(t testing.TB, client string, start int64, got []crec) {
	t.Helper()
	from := max(start, 0)
	i, _ := slices.BinarySearchFunc(c.want, from, func(r crec, off int64) int { return int(r.Off - off) })
	want := c.want[i:]
	what := "from the beginning"
	if start >= 0 {
		what = fmt.Sprintf("from removed offset %d", start)
	}
	if len(got) > 0 && got[0].Off != want[0].Off {
		t.Errorf("%s %s: first record at offset %d, want the next surviving offset %d", client, what, got[0].Off, want[0].Off)
	}
	if d := diffRecs(got, want); d != "" {
		t.Errorf("%s %s: %s", client, what, d)
		return
	}
	gaps := 0
	for j := 1; j < len(got); j++ {
		if got[j].Off > got[j-1].Off+1 {
			gaps++
		}
	}
	if start < 0 && gaps == 0 {
		t.Errorf("%s %s: no offset gaps", client, what)
	}
	t.Logf("%s %s: %d records at offsets %d..%d with %d gaps, as expected", client, what, len(got), got[0].Off, got[len(got)-1].Off, gaps)
}

func (c *compactedTopic) last() int64 { return c.produced[len(c.produced)-1].Off }

func (c *compactedTopic) readKgo(t testing.TB, ctx context.Context, start int64) []crec {
	t.Helper()
	o := kgo.NewOffset().At(start)
	if start < 0 {
		o = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.addr),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{c.topic: {0: o}}),
		kgo.FetchMaxWait(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	last := c.last()
	var got []crec
	for len(got) == 0 || got[len(got)-1].Off < last {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("franz-go from %d: %d records, none at the last offset %d: %v", start, len(got), last, err)
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if !kerr.IsRetriable(err) && !errors.Is(err, context.Canceled) {
				t.Fatalf("franz-go fetch from %d: %v", start, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			got = append(got, crec{Off: r.Offset, Key: string(r.Key), Val: bytesStrp(r.Value), Ts: r.Timestamp.UnixMilli()})
		})
	}
	return got
}

func (c *compactedTopic) readSarama(t testing.TB, ctx context.Context, version sarama.KafkaVersion, start int64) []crec {
	t.Helper()
	consumer, err := sarama.NewConsumer([]string{c.addr}, (&saramaClient{addr: c.addr, version: version}).config())
	if err != nil {
		t.Fatalf("sarama.NewConsumer: %v", err)
	}
	defer consumer.Close()
	// sarama.OffsetOldest is -2, as start is for the beginning.
	pc, err := consumer.ConsumePartition(c.topic, 0, start)
	if err != nil {
		t.Fatalf("sarama ConsumePartition at %d: %v", start, err)
	}
	defer pc.AsyncClose()
	last := c.last()
	var got []crec
	for len(got) == 0 || got[len(got)-1].Off < last {
		select {
		case m := <-pc.Messages():
			got = append(got, crec{Off: m.Offset, Key: string(m.Key), Val: bytesStrp(m.Value), Ts: m.Timestamp.UnixMilli()})
		case err := <-pc.Errors():
			t.Logf("sarama from %d: %v", start, err)
		case <-ctx.Done():
			t.Fatalf("sarama from %d: %d records, none at the last offset %d: %v", start, len(got), last, ctx.Err())
		}
	}
	return got
}

func (c *compactedTopic) readKcat(t testing.TB, ctx context.Context, bin string, start int64) []crec {
	t.Helper()
	k := &kcat{bin: bin, addr: c.addr, topic: c.topic}
	o := "beginning"
	if start >= 0 {
		o = strconv.FormatInt(start, 10)
	}
	out := k.run(t, ctx, nil, "-C", "-t", c.topic, "-p", "0", "-o", o, "-e", "-J", "-X", "fetch.wait.max.ms=250")
	var got []crec
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var j kcatJSON
		if err := json.Unmarshal(line, &j); err != nil {
			t.Fatalf("kcat -J line %q: %v", line, err)
		}
		if j.Key == nil {
			t.Fatalf("kcat -o %s: offset %d has a null key", o, j.Offset)
		}
		if j.TsType != "create" {
			t.Errorf("kcat -o %s: offset %d timestamp type %q, want create", o, j.Offset, j.TsType)
		}
		got = append(got, crec{Off: j.Offset, Key: *j.Key, Val: j.Payload, Ts: j.Ts})
	}
	return got
}

// readPython runs testdata/compaction_read.py once for every start.
func (c *compactedTopic) readPython(t testing.TB, ctx context.Context, client string, starts []int64) map[int64][]crec {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("testdata", "compaction_read.py"))
	if err != nil {
		t.Fatal(err)
	}
	args := []string{path, client, c.addr, c.topic, strconv.FormatInt(c.last(), 10)}
	for _, s := range starts {
		args = append(args, strconv.FormatInt(s, 10))
	}
	cmd := exec.CommandContext(ctx, systemPython, args...)
	cmd.Env = pythonEnv()
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if stderr.Len() > 0 {
		t.Logf("compaction_read.py %s stderr:\n%s", client, stderr.Bytes())
	}
	if err != nil {
		t.Fatalf("compaction_read.py %s: %v", client, err)
	}
	got := map[int64][]crec{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var j struct {
			S int64   `json:"s"`
			O int64   `json:"o"`
			K *string `json:"k"`
			V *string `json:"v"`
			T int64   `json:"t"`
		}
		if err := json.Unmarshal(sc.Bytes(), &j); err != nil {
			t.Fatalf("compaction_read.py %s: output line %q: %v", client, sc.Bytes(), err)
		}
		if j.K == nil {
			t.Fatalf("compaction_read.py %s from %d: offset %d has a null key", client, j.S, j.O)
		}
		got[j.S] = append(got[j.S], crec{Off: j.O, Key: *j.K, Val: j.V, Ts: j.T})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestCompactionChecksCatchMismatches is a self-test of diffRecs and check
// (no broker): every way a compacted read can be wrong must be reported.
func TestCompactionChecksCatchMismatches(t *testing.T) {
	want := []crec{
		{Off: 3, Key: "a", Val: strp("a1"), Ts: 10},
		{Off: 7, Key: "b", Val: strp(""), Ts: 11},
		{Off: 9, Key: "c", Val: strp("c2"), Ts: 12},
	}
	mod := func(f func([]crec) []crec) []crec { return f(slices.Clone(want)) }
	if d := diffRecs(want, want); d != "" {
		t.Fatalf("identical reads differ: %s", d)
	}
	for name, got := range map[string][]crec{
		"older duplicate kept": mod(func(g []crec) []crec {
			return slices.Insert(g, 0, crec{Off: 1, Key: "a", Val: strp("a0"), Ts: 9})
		}),
		"tombstone kept": mod(func(g []crec) []crec { return slices.Insert(g, 1, crec{Off: 5, Key: "d", Ts: 10}) }),
		"record missing": mod(func(g []crec) []crec { return slices.Delete(g, 1, 2) }),
		"empty as null":  mod(func(g []crec) []crec { g[1].Val = nil; return g }),
		"other value":    mod(func(g []crec) []crec { g[2].Val = strp("c1"); return g }),
		"other key":      mod(func(g []crec) []crec { g[2].Key = "a"; return g }),
		"timestamp":      mod(func(g []crec) []crec { g[0].Ts++; return g }),
		"offset moved":   mod(func(g []crec) []crec { g[2].Off = 8; return g }),
		"out of order":   mod(func(g []crec) []crec { g[1], g[2] = g[2], g[1]; return g }),
		"read twice":     mod(func(g []crec) []crec { return append(g, g[2]) }),
	} {
		if d := diffRecs(got, want); d == "" {
			t.Errorf("%s: not reported", name)
		} else {
			t.Logf("%s: %s", name, d)
		}
	}
	c := &compactedTopic{want: want}
	for _, tc := range []struct {
		start int64
		got   []crec
		fails bool
	}{
		{-2, want, false},
		{5, want[1:], false},
		{5, want, true},     // read from below the position
		{8, want[1:], true}, // 7 is below 8
		{8, want[2:], false},
	} {
		rec := &errRecorder{TB: t}
		c.check(rec, "self-test", tc.start, tc.got)
		if failed := len(rec.errs) > 0; failed != tc.fails {
			t.Errorf("check from %d with %d records: reported %q, want failure %v", tc.start, len(tc.got), rec.errs, tc.fails)
		}
	}
}
