package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/tiering"
)

func strp(s string) *string { return &s }

func qUser(n *string) kadm.ClientQuotaEntityComponent {
	return kadm.ClientQuotaEntityComponent{Type: "user", Name: n}
}

func qClient(n *string) kadm.ClientQuotaEntityComponent {
	return kadm.ClientQuotaEntityComponent{Type: "client-id", Name: n}
}

func setQuota(key string, v float64) kadm.AlterClientQuotaOp {
	return kadm.AlterClientQuotaOp{Key: key, Value: v}
}

// alterQuotas applies entries and fails the test on any entry's error.
func alterQuotas(t *testing.T, adm *kadm.Client, entries ...kadm.AlterClientQuotaEntry) {
	t.Helper()
	res, err := adm.AlterClientQuotas(ctxT(t), entries)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("alter %v: %v (%s)", r.Entity, r.Err, r.ErrMessage)
		}
	}
}

// quotaSet is a described result as "entity: key=value ..." strings.
func quotaSet(qs kadm.DescribedClientQuotas) []string {
	var out []string
	for _, q := range qs {
		s := q.Entity.String() + ":"
		for _, v := range q.Values {
			s += " " + v.String()
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func describeQuotas(t *testing.T, adm *kadm.Client, strict bool, comps ...kadm.DescribeClientQuotaComponent) []string {
	t.Helper()
	qs, err := adm.DescribeClientQuotas(ctxT(t), strict, comps)
	if err != nil {
		t.Fatal(err)
	}
	return quotaSet(qs)
}

// Kafka's rate and throttle arithmetic, at its default quota window (11
// samples of 1 s): the first 10 s of quota may be spent at once, then the
// throttle is (rate - quota) / quota * window, capped (request quotas at
// one window, byte rates at the whole quota window), and old samples stop
// counting.
func TestQuotaRateMatchesKafka(t *testing.T) {
	q := &quotaStore{samples: 11, windowMs: 1000}
	newSensor := func(kind quotaKind, limit float64) *quotaSensor {
		return &quotaSensor{key: sensorKey{kind: kind}, limit: limit,
			rate: quotaRate{start: make([]int64, 11), val: make([]float64, 11)}}
	}
	s := newSensor(kindProduce, 1000)
	t0 := int64(1_000_000)
	if ms := s.record(q, 10_000, t0, true); ms != 0 {
		t.Fatalf("10 s of quota at once: throttled %d ms, want 0 (rate over at least 10 windows)", ms)
	}
	if ms := s.record(q, 1000, t0, true); ms != 1000 {
		t.Fatalf("one more second of quota: throttled %d ms, want 1000", ms)
	}
	// Half a second later the window is 10.5 s: (11000/10.5 - 1000)/1000*10500.
	if ms := s.record(q, 0, t0+500, true); ms != 500 {
		t.Fatalf("at +0.5 s: throttled %d ms, want 500", ms)
	}
	if ms := s.record(q, 1e9, t0+500, true); ms != 11_000 {
		t.Fatalf("far over: throttled %d ms, want the 11 s cap", ms)
	}
	// 11 windows on, the first sample (all of it) no longer counts.
	s2 := newSensor(kindProduce, 1000)
	s2.record(q, 20_000, t0, false)
	if ms := s2.record(q, 0, t0+10_999, true); ms == 0 {
		t.Fatal("the burst stopped counting before 11 windows")
	}
	if ms := s2.record(q, 0, t0+11_000, true); ms != 0 {
		t.Fatalf("after 11 windows: throttled %d ms, want 0", ms)
	}
	// request_percentage: 100% of a thread for 2 s against 50%: capped at
	// one window.
	r := newSensor(kindRequest, 50)
	if ms := r.record(q, handlerPercent(2*time.Second), t0, true); ms != 0 {
		t.Fatalf("request: throttled %d ms at 20%%", ms)
	}
	if ms := r.record(q, handlerPercent(10*time.Second), t0, true); ms != 1000 {
		t.Fatalf("request: throttled %d ms, want the 1 s cap", ms)
	}
}

// The most specific entity setting a key applies, in Kafka's order, and
// the rate is shared as Kafka's metric tags share it.
func TestQuotaResolutionOrder(t *testing.T) {
	u := func(n string) quotaName { return quotaName{set: true, name: n} }
	def := quotaName{set: true, def: true}
	q := &quotaStore{entries: map[quotaEntity]map[string]float64{
		{client: def}:                      {keyProducerRate: 8, keyConsumerRate: 8, keyRequestPct: 8},
		{client: u("a")}:                   {keyProducerRate: 7, keyConsumerRate: 7},
		{user: def}:                        {keyProducerRate: 6},
		{user: u("alice")}:                 {keyConsumerRate: 3},
		{user: u("alice"), client: def}:    {keyProducerRate: 2},
		{user: u("alice"), client: u("a")}: {keyRequestPct: 1},
	}}
	limits, keys, _, found := q.resolve("alice", "a")
	want := [numKinds]float64{2, 3, 1}
	wantKeys := [numKinds]sensorKey{{kindProduce, "alice", "a", ""}, {kindFetch, "alice", "", ""}, {kindRequest, "alice", "a", ""}}
	if limits != want || keys != wantKeys || found != [numKinds]bool{true, true, true} {
		t.Fatalf("alice/a: %v %v %v, want %v %v", limits, keys, found, want, wantKeys)
	}
	limits, keys, _, _ = q.resolve("bob", "a")
	if want := [numKinds]float64{6, 7, 8}; limits != want {
		t.Fatalf("bob/a: %v, want %v", limits, want)
	}
	if want := (sensorKey{kindProduce, "bob", "", ""}); keys[kindProduce] != want {
		t.Fatalf("bob/a produce measured as %v, want %v (each user its own default rate)", keys[kindProduce], want)
	}
	if want := (sensorKey{kindRequest, "", "a", ""}); keys[kindRequest] != want {
		t.Fatalf("bob/a request measured as %v, want %v", keys[kindRequest], want)
	}
	delete(q.entries, quotaEntity{client: def})
	delete(q.entries, quotaEntity{user: def})
	if _, _, _, found := q.resolve("bob", "z"); found != [numKinds]bool{} {
		t.Fatalf("bob/z: %v, want no quota", found)
	}
}

// AlterClientQuotas and DescribeClientQuotas through kadm: defaults and
// overrides, validate_only, removal, Kafka's validation and its strict and
// non-strict filters.
func TestClientQuotasAdminRoundTrip(t *testing.T) {
	ts := startServer(t, "")
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	alterQuotas(t, adm,
		kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qClient(nil)}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1024)}},
		kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qUser(strp("alice")), qClient(strp("a"))},
			Ops: []kadm.AlterClientQuotaOp{setQuota(keyConsumerRate, 2048), setQuota(keyRequestPct, 50.5)}},
		kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qClient(strp("b"))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 4096)}},
		kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qUser(nil)}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyMutationRate, 10)}},
		kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{{Type: "ip", Name: strp("127.0.0.1")}}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyConnRate, 5)}},
	)
	all := []string{
		"{client-id=<default>}: producer_byte_rate=1024.000000",
		"{client-id=b}: producer_byte_rate=4096.000000",
		"{ip=127.0.0.1}: connection_creation_rate=5.000000",
		"{user=<default>}: controller_mutation_rate=10.000000",
		"{user=alice, client-id=a}: consumer_byte_rate=2048.000000 request_percentage=50.500000",
	}
	if got := describeQuotas(t, adm, false); !slices.Equal(got, all) {
		t.Fatalf("describe all:\n%q\nwant\n%q", got, all)
	}
	if got := describeQuotas(t, adm, true); len(got) != 0 {
		t.Fatalf("strict, no components: %q, want nothing", got)
	}
	anyClient := kadm.DescribeClientQuotaComponent{Type: "client-id", MatchType: kmsg.QuotasMatchTypeAny}
	if got, want := describeQuotas(t, adm, false, anyClient), []string{all[0], all[1], all[4]}; !slices.Equal(got, want) {
		t.Fatalf("any client-id: %q, want %q", got, want)
	}
	if got, want := describeQuotas(t, adm, true, anyClient), []string{all[0], all[1]}; !slices.Equal(got, want) {
		t.Fatalf("any client-id, strict: %q, want %q", got, want)
	}
	defClient := kadm.DescribeClientQuotaComponent{Type: "client-id", MatchType: kmsg.QuotasMatchTypeDefault}
	if got, want := describeQuotas(t, adm, false, defClient), []string{all[0]}; !slices.Equal(got, want) {
		t.Fatalf("default client-id: %q, want %q", got, want)
	}
	alice := kadm.DescribeClientQuotaComponent{Type: "user", MatchType: kmsg.QuotasMatchTypeExact, MatchName: strp("alice")}
	if got, want := describeQuotas(t, adm, false, alice), []string{all[4]}; !slices.Equal(got, want) {
		t.Fatalf("user alice: %q, want %q", got, want)
	}
	if got := describeQuotas(t, adm, true, alice); len(got) != 0 {
		t.Fatalf("user alice, strict: %q, want nothing (the entity also names a client id)", got)
	}
	exactA := kadm.DescribeClientQuotaComponent{Type: "client-id", MatchType: kmsg.QuotasMatchTypeExact, MatchName: strp("a")}
	if got, want := describeQuotas(t, adm, true, alice, exactA), []string{all[4]}; !slices.Equal(got, want) {
		t.Fatalf("alice + a, strict: %q, want %q", got, want)
	}

	// Filters Kafka refuses.
	for _, tc := range []struct {
		comps []kadm.DescribeClientQuotaComponent
		want  error
	}{
		{[]kadm.DescribeClientQuotaComponent{{Type: "ip", MatchType: kmsg.QuotasMatchTypeAny}, alice}, kerr.InvalidRequest},
		{[]kadm.DescribeClientQuotaComponent{{Type: "group", MatchType: kmsg.QuotasMatchTypeAny}}, kerr.UnsupportedVersion},
		{[]kadm.DescribeClientQuotaComponent{{Type: "user", MatchType: kmsg.QuotasMatchTypeExact}}, kerr.InvalidRequest},
		{[]kadm.DescribeClientQuotaComponent{{Type: "user", MatchType: kmsg.QuotasMatchTypeDefault, MatchName: strp("x")}}, kerr.InvalidRequest},
		{[]kadm.DescribeClientQuotaComponent{alice, alice}, kerr.InvalidRequest},
		{[]kadm.DescribeClientQuotaComponent{{Type: "user", MatchType: 7}}, kerr.InvalidRequest},
	} {
		if _, err := adm.DescribeClientQuotas(ctx, false, tc.comps); !errors.Is(err, tc.want) {
			t.Errorf("describe %+v: %v, want %v", tc.comps, err, tc.want)
		}
	}

	// Entries Kafka refuses, each on its own: the valid one beside them applies.
	bad := []kadm.AlterClientQuotaEntry{
		{Entity: kadm.ClientQuotaEntity{qClient(strp("c"))}, Ops: []kadm.AlterClientQuotaOp{setQuota("bogus_rate", 1)}},
		{Entity: kadm.ClientQuotaEntity{qClient(strp("c"))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1.5)}},
		{Entity: kadm.ClientQuotaEntity{qClient(strp("d"))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 0)}},
		{Entity: kadm.ClientQuotaEntity{{Type: "group", Name: strp("g")}}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1)}},
		{Entity: kadm.ClientQuotaEntity{{Type: "ip", Name: nil}, qUser(strp("x"))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyConnRate, 1)}},
		{Entity: kadm.ClientQuotaEntity{{Type: "ip", Name: strp("not an ip")}}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyConnRate, 1)}},
		{Entity: kadm.ClientQuotaEntity{qUser(strp("x"))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyConnRate, 1)}},
		{Entity: kadm.ClientQuotaEntity{qUser(strp(""))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1)}},
		{Entity: kadm.ClientQuotaEntity{qUser(strp("x")), qUser(strp("y"))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1)}},
		{Entity: kadm.ClientQuotaEntity{qUser(strp("x"))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1), setQuota(keyProducerRate, 2)}},
		{Entity: nil, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1)}},
		{Entity: kadm.ClientQuotaEntity{qClient(strp("e"))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 100)}},
	}
	res, err := adm.AlterClientQuotas(ctx, bad)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(bad) {
		t.Fatalf("%d results for %d entries", len(res), len(bad))
	}
	for i, r := range res[:len(res)-1] {
		if !errors.Is(r.Err, kerr.InvalidRequest) || r.ErrMessage == "" {
			t.Errorf("entry %d %v: %v %q, want INVALID_REQUEST with a message", i, bad[i].Entity, r.Err, r.ErrMessage)
		}
	}
	if r := res[len(res)-1]; r.Err != nil {
		t.Fatalf("the valid entry: %v", r.Err)
	}
	clientE := kadm.DescribeClientQuotaComponent{Type: "client-id", MatchType: kmsg.QuotasMatchTypeExact, MatchName: strp("e")}
	if got := describeQuotas(t, adm, false, clientE); len(got) != 1 {
		t.Fatalf("client e: %q", got)
	}
	if got := describeQuotas(t, adm, false, kadm.DescribeClientQuotaComponent{Type: "client-id", MatchType: kmsg.QuotasMatchTypeExact, MatchName: strp("c")}); len(got) != 0 {
		t.Fatalf("client c was changed by invalid entries: %q", got)
	}

	// validate_only answers as the change would and changes nothing.
	vres, err := adm.ValidateAlterClientQuotas(ctx, []kadm.AlterClientQuotaEntry{
		{Entity: kadm.ClientQuotaEntity{qClient(strp("v"))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 10)}},
		{Entity: kadm.ClientQuotaEntity{qClient(strp("v"))}, Ops: []kadm.AlterClientQuotaOp{setQuota("nope", 10)}},
	})
	if err != nil || len(vres) != 2 || vres[0].Err != nil || !errors.Is(vres[1].Err, kerr.InvalidRequest) {
		t.Fatalf("validate only: %+v %v", vres, err)
	}
	if got := describeQuotas(t, adm, false, kadm.DescribeClientQuotaComponent{Type: "client-id", MatchType: kmsg.QuotasMatchTypeExact, MatchName: strp("v")}); len(got) != 0 {
		t.Fatalf("validate_only stored %q", got)
	}

	// Removal: Remove: true drops a key; an entity left without keys is gone.
	alterQuotas(t, adm,
		kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qClient(strp("b"))}, Ops: []kadm.AlterClientQuotaOp{{Key: keyProducerRate, Remove: true}}},
		kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qUser(strp("alice")), qClient(strp("a"))}, Ops: []kadm.AlterClientQuotaOp{{Key: keyRequestPct, Remove: true}, {Key: "never_set", Remove: true}}},
		kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qClient(strp("e"))}, Ops: []kadm.AlterClientQuotaOp{{Key: keyProducerRate, Remove: true}}},
	)
	want := []string{all[0], all[2], all[3], "{user=alice, client-id=a}: consumer_byte_rate=2048.000000"}
	if got := describeQuotas(t, adm, false); !slices.Equal(got, want) {
		t.Fatalf("after removals:\n%q\nwant\n%q", got, want)
	}
}

// AlterClientQuotas needs ALTER_CONFIGS on the cluster, DescribeClientQuotas
// DESCRIBE_CONFIGS (Kafka's ACLs).
func TestClientQuotasACLs(t *testing.T) {
	w := newACLWorld(t)
	ctx := ctxT(t)
	ua := kadm.NewClient(w.user)
	entry := []kadm.AlterClientQuotaEntry{{Entity: kadm.ClientQuotaEntity{qClient(nil)}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1<<30)}}}
	res, err := ua.AlterClientQuotas(ctx, entry)
	if err != nil || len(res) != 1 || !errors.Is(res[0].Err, kerr.ClusterAuthorizationFailed) {
		t.Fatalf("alter without ALTER_CONFIGS: %+v %v", res, err)
	}
	if _, err := ua.DescribeClientQuotas(ctx, false, nil); !errors.Is(err, kerr.ClusterAuthorizationFailed) {
		t.Fatalf("describe without DESCRIBE_CONFIGS: %v", err)
	}
	w.grant(t, kadm.NewACLs().Allow("User:u").Clusters().Operations(kadm.OpAlterConfigs, kadm.OpDescribeConfigs))
	res, err = ua.AlterClientQuotas(ctx, entry)
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("alter with ALTER_CONFIGS: %+v %v", res, err)
	}
	if got := describeQuotas(t, ua, false); len(got) != 1 {
		t.Fatalf("describe with DESCRIBE_CONFIGS: %q", got)
	}
}

// Quotas are in quotas.json (only the broker's user reads it): a restart
// keeps them, and an empty data directory gets them back from the bucket.
func TestClientQuotasDurableAndRestored(t *testing.T) {
	store := tiering.NewMemStore()
	dir := t.TempDir()
	cfg := Config{DataDir: dir, Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 50 * time.Millisecond}
	ts := startServerConfig(t, cfg)
	_, adm := client(t, ts.addr)
	alterQuotas(t, adm,
		kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qUser(strp("alice"))}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1000)}},
		kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qUser(nil), qClient(nil)}, Ops: []kadm.AlterClientQuotaOp{setQuota(keyRequestPct, 25)}},
	)
	want := describeQuotas(t, adm, false)
	if len(want) != 2 {
		t.Fatalf("described %q", want)
	}
	fi, err := os.Stat(filepath.Join(dir, quotasFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v, mode %v, want 0600", quotasFile, err, fi.Mode())
	}
	waitUntil(t, 10*time.Second, func() bool {
		b, err := store.GetRange(context.Background(), quotasKey, 0, -1)
		return err == nil && len(b) > 0
	})
	ts.stop(t)

	ts = startServerConfig(t, Config{DataDir: dir, Tier: tiering.New(store, nil, 8<<20)})
	_, adm = client(t, ts.addr)
	if got := describeQuotas(t, adm, false); !slices.Equal(got, want) {
		t.Fatalf("after a restart: %q, want %q", got, want)
	}
	if !ts.sec.quotas.on.Load() {
		t.Fatal("restored quotas are not enforced")
	}
	ts.stop(t)

	ts = startServerConfig(t, Config{DataDir: t.TempDir(), Tier: tiering.New(store, nil, 8<<20)})
	_, adm = client(t, ts.addr)
	if got := describeQuotas(t, adm, false); !slices.Equal(got, want) {
		t.Fatalf("restored from the bucket: %q, want %q", got, want)
	}
}

// throttleHook counts the throttles a client is told of.
type throttleHook struct{ n, ms atomic.Int64 }

func (h *throttleHook) OnBrokerThrottle(_ kgo.BrokerMetadata, d time.Duration, _ bool) {
	h.n.Add(1)
	h.ms.Add(d.Milliseconds())
}

// setQuotaWindow shortens the quota window for a test (Kafka's 11 samples
// kept): with 1 s windows a client may spend 10 s of quota at once, more
// than a short test measures.
func setQuotaWindow(t *testing.T, d time.Duration) {
	old := quotaWindow
	quotaWindow = d
	t.Cleanup(func() { quotaWindow = old })
}

// meter counts bytes a client got acknowledged or consumed, and the part
// of them between two instants.
type meter struct {
	total, inWindow atomic.Int64
	from, to        time.Time
}

func (m *meter) add(n int) {
	m.total.Add(int64(n))
	if now := time.Now(); now.After(m.from) && now.Before(m.to) {
		m.inWindow.Add(int64(n))
	}
}

func (m *meter) rate() float64 { return float64(m.inWindow.Load()) / m.to.Sub(m.from).Seconds() }

// quotaMetric returns the value of a quota metric for (type, user, client id).
func quotaMetric(t *testing.T, s *Server, name, typ, user, clientID string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["type"] == typ && labels["user"] == user && labels["client_id"] == clientID {
				if m.Counter != nil {
					return m.Counter.GetValue()
				}
				return m.Gauge.GetValue()
			}
		}
	}
	t.Fatalf("no %s{type=%q,user=%q,client_id=%q}", name, typ, user, clientID)
	return 0
}

const testQuotaRate = 256 << 10

// A producer with a producer_byte_rate is held to it (its responses carry
// throttle time and its connection waits) while another client on the
// same broker is not slowed.
func TestClientQuotaHoldsProducerToItsRate(t *testing.T) {
	setQuotaWindow(t, 50*time.Millisecond)
	ts := startServer(t, "")
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "quota-p"); err != nil {
		t.Fatal(err)
	}
	alterQuotas(t, adm, kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qClient(strp("a"))},
		Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, testQuotaRate)}})

	ha, hb := &throttleHook{}, &throttleHook{}
	producer := func(id string, h *throttleHook) *kgo.Client {
		cl, _ := client(t, ts.addr, kgo.ClientID(id), kgo.DefaultProduceTopic("quota-p"), kgo.WithHooks(h),
			kgo.ProducerBatchMaxBytes(16<<10), kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.MaxBufferedRecords(256))
		return cl
	}
	cla, clb := producer("a", ha), producer("b", hb)
	start := time.Now()
	ma, mb := &meter{from: start.Add(500 * time.Millisecond), to: start.Add(3500 * time.Millisecond)}, &meter{}
	mb.from, mb.to = ma.from, ma.to
	pctx, cancel := context.WithDeadline(ctx, ma.to)
	defer cancel()
	done := make(chan struct{}, 2)
	produce := func(cl *kgo.Client, m *meter) {
		defer func() { done <- struct{}{} }()
		value := make([]byte, 1000)
		for pctx.Err() == nil {
			cl.Produce(pctx, &kgo.Record{Value: value}, func(r *kgo.Record, err error) {
				if err == nil {
					m.add(len(r.Value))
				}
			})
		}
	}
	go produce(cla, ma)
	go produce(clb, mb)
	<-done
	<-done

	ra, rb := ma.rate(), mb.rate()
	t.Logf("a: %.0f B/s (quota %d), %d throttles, %d ms; b: %.0f B/s, %d throttles", ra, testQuotaRate, ha.n.Load(), ha.ms.Load(), rb, hb.n.Load())
	if ra > 1.3*testQuotaRate || ra < 0.4*testQuotaRate {
		t.Errorf("a produced %.0f B/s against a quota of %d", ra, testQuotaRate)
	}
	if ha.n.Load() == 0 {
		t.Error("a was never told of a throttle")
	}
	if hb.n.Load() != 0 {
		t.Errorf("b (no quota) was throttled %d times", hb.n.Load())
	}
	if rb < 4*testQuotaRate {
		t.Errorf("b produced only %.0f B/s: slowed by a's quota?", rb)
	}
	if ms := quotaMetric(t, ts.Server, "synapse_quota_throttle_time_ms_total", "produce", "", "a"); ms <= 0 {
		t.Errorf("throttle time metric for a: %v", ms)
	}
	if l := quotaMetric(t, ts.Server, "synapse_quota_limit", "produce", "", "a"); l != testQuotaRate {
		t.Errorf("quota limit metric for a: %v", l)
	}
}

// A consumer with a consumer_byte_rate is held to it (throttled fetches
// answer no data) while another consumer reads at full speed.
func TestClientQuotaHoldsConsumerToItsRate(t *testing.T) {
	setQuotaWindow(t, 50*time.Millisecond)
	ts := startServer(t, "")
	_, adm := client(t, ts.addr)
	ctx := ctxT(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "quota-f"); err != nil {
		t.Fatal(err)
	}
	const total = 4000 * 1000 // 4000 records of 1000 bytes
	pr, _ := client(t, ts.addr, kgo.DefaultProduceTopic("quota-f"), kgo.ProducerBatchMaxBytes(16<<10),
		kgo.ProducerBatchCompression(kgo.NoCompression()))
	value := make([]byte, 1000)
	var rs []*kgo.Record
	for range total / 1000 {
		rs = append(rs, &kgo.Record{Value: value})
	}
	if err := pr.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	alterQuotas(t, adm, kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qClient(strp("c"))},
		Ops: []kadm.AlterClientQuotaOp{setQuota(keyConsumerRate, testQuotaRate)}})

	hc, hd := &throttleHook{}, &throttleHook{}
	consumer := func(id string, h *throttleHook) *kgo.Client {
		cl, _ := client(t, ts.addr, kgo.ClientID(id), kgo.ConsumeTopics("quota-f"), kgo.WithHooks(h),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(32<<10), kgo.FetchMaxPartitionBytes(32<<10))
		return cl
	}
	clc, cld := consumer("c", hc), consumer("d", hd)
	start := time.Now()
	mc, md := &meter{from: start.Add(500 * time.Millisecond), to: start.Add(3500 * time.Millisecond)}, &meter{}
	md.from, md.to = start, mc.to
	cctx, cancel := context.WithDeadline(ctx, mc.to)
	defer cancel()
	done := make(chan time.Duration, 2)
	consume := func(cl *kgo.Client, m *meter) {
		for cctx.Err() == nil && m.total.Load() < total {
			cl.PollFetches(cctx).EachRecord(func(r *kgo.Record) { m.add(len(r.Value)) })
		}
		done <- time.Since(start)
	}
	go consume(clc, mc)
	go consume(cld, md)
	<-done
	<-done
	rc := mc.rate()
	t.Logf("c: %.0f B/s (quota %d), %d throttles, %d ms; d: %d bytes in %v, %d throttles", rc, testQuotaRate, hc.n.Load(), hc.ms.Load(),
		md.total.Load(), mc.to.Sub(start), hd.n.Load())
	if rc > 1.3*testQuotaRate || rc < 0.4*testQuotaRate {
		t.Errorf("c consumed %.0f B/s against a quota of %d", rc, testQuotaRate)
	}
	if hc.n.Load() == 0 {
		t.Error("c was never told of a throttle")
	}
	if hd.n.Load() != 0 || md.total.Load() < total {
		t.Errorf("d (no quota): %d throttles, %d of %d bytes in 3.5 s", hd.n.Load(), md.total.Load(), total)
	}
	if ms := quotaMetric(t, ts.Server, "synapse_quota_throttle_time_ms_total", "fetch", "", "c"); ms <= 0 {
		t.Errorf("throttle time metric for c: %v", ms)
	}
}

// request_percentage throttles any request of the client (here Metadata),
// by at most one quota window as Kafka bounds it; SASL and ApiVersions
// are answered as ever.
func TestClientQuotaRequestPercentage(t *testing.T) {
	setQuotaWindow(t, 50*time.Millisecond)
	ts := startServer(t, "")
	_, adm := client(t, ts.addr)
	alterQuotas(t, adm, kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qClient(strp("r"))},
		Ops: []kadm.AlterClientQuotaOp{setQuota(keyRequestPct, 0.001)}})
	cl, _ := client(t, ts.addr, kgo.ClientID("r"))
	ctx := ctxT(t)
	throttled := 0
	for range 20 {
		resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ThrottleMillis > 50 {
			t.Fatalf("throttle %d ms: want at most one window (50 ms)", resp.ThrottleMillis)
		}
		if resp.ThrottleMillis > 0 {
			throttled++
		}
	}
	if throttled == 0 {
		t.Fatal("no Metadata response was throttled at 0.001% of a thread")
	}
	other, _ := client(t, ts.addr, kgo.ClientID("other"))
	for range 20 {
		resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ThrottleMillis != 0 {
			t.Fatalf("a client without a quota was throttled %d ms", resp.ThrottleMillis)
		}
	}
}

// The throttled connection is muted: a request pipelined behind a
// throttled Produce is read only once the throttle passed (KIP-219: the
// response itself goes out at once). To a Produce before v6 the response
// itself waits out the throttle.
func TestClientQuotaMutesConnection(t *testing.T) {
	setQuotaWindow(t, 50*time.Millisecond)
	ts, nc := rawConn(t, "quota-m")
	_, adm := client(t, ts.addr)
	alterQuotas(t, adm, kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qClient(strp("pipe"))}, // reqFrame's client id
		Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1000)}})
	produce := func(version int16) *kmsg.ProduceRequest {
		req := recordProduce("quota-m", 1, make([]byte, 10_000))
		req.Version = version
		return req
	}
	readThrottle := func(version int16) (int32, time.Time) {
		_, body, err := readAnswer(nc, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		resp := kmsg.NewPtrProduceResponse()
		resp.Version = version
		if err := resp.ReadFrom(body); err != nil {
			t.Fatal(err)
		}
		if code := resp.Topics[0].Partitions[0].ErrorCode; code != 0 {
			t.Fatalf("produce v%d: error %d", version, code)
		}
		return resp.ThrottleMillis, time.Now()
	}

	sent := time.Now()
	if _, err := nc.Write(append(reqFrame(produce(8), 1), reqFrame(kmsg.NewPtrApiVersionsRequest(), 2)...)); err != nil {
		t.Fatal(err)
	}
	ms, answered := readThrottle(8)
	// 10 kB against 1000 B/s over at least 10 windows of 50 ms: far over,
	// so the cap, 11 windows.
	if ms != 550 {
		t.Fatalf("throttle %d ms, want 550 (the cap)", ms)
	}
	if d := answered.Sub(sent); d > 300*time.Millisecond {
		t.Fatalf("a v8 Produce answered after %v: the response should not wait out the throttle", d)
	}
	if _, _, err := readAnswer(nc, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(answered); d < 500*time.Millisecond {
		t.Fatalf("the request behind the throttled one was answered %v later: the connection was not muted for 550 ms", d)
	}

	sent = time.Now()
	if _, err := nc.Write(reqFrame(produce(5), 3)); err != nil {
		t.Fatal(err)
	}
	ms, answered = readThrottle(5)
	if ms <= 0 {
		t.Fatal("the v5 Produce was not throttled")
	}
	if d := answered.Sub(sent); d < time.Duration(ms)*time.Millisecond*9/10 {
		t.Fatalf("a v5 Produce throttled %d ms was answered after %v: it should wait out the throttle", ms, d)
	}
}

// confluentQuotaScript produces with librdkafka (confluent-kafka-python)
// as client id "py" for 2.5 s and prints the bytes delivered in that time
// and the throttle events librdkafka reported.
const confluentQuotaScript = `
import json, sys, time
from confluent_kafka import Producer
throttles = []
p = Producer({'bootstrap.servers': sys.argv[1], 'client.id': 'py', 'linger.ms': 5, 'batch.size': 16384,
              'queue.buffering.max.kbytes': 256, 'throttle_cb': lambda e: throttles.append(e.throttle_time)})
end = time.time() + 2.5
delivered = [0]
def done(err, msg):
    if err is None and time.time() < end:
        delivered[0] += len(msg.value())
v = b'x' * 1000
while time.time() < end:
    try:
        p.produce('quota-py', v, on_delivery=done)
    except BufferError:
        p.poll(0.01)
    p.poll(0)
p.flush(5)
print(json.dumps({'delivered': delivered[0], 'throttles': len(throttles)}))
`

// librdkafka sees the throttle (its throttle_cb fires) and is held to the
// quota too.
func TestClientQuotaConfluentKafka(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import confluent_kafka").Run(); err != nil {
		t.Skip("confluent-kafka-python not installed")
	}
	setQuotaWindow(t, 50*time.Millisecond)
	ts := startServer(t, "")
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctxT(t), 1, 1, nil, "quota-py"); err != nil {
		t.Fatal(err)
	}
	const rate = 128 << 10
	alterQuotas(t, adm, kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qClient(strp("py"))},
		Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, rate)}})
	ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "/usr/bin/python3", "-c", confluentQuotaScript, ts.addr).Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	var res struct{ Delivered, Throttles int }
	if err := json.Unmarshal(out[bytes.LastIndexByte(out[:len(out)-1], '\n')+1:], &res); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	got := float64(res.Delivered) / 2.5
	t.Logf("librdkafka: %.0f B/s against %d, %d throttle events", got, rate, res.Throttles)
	if res.Throttles == 0 {
		t.Error("librdkafka reported no throttle")
	}
	// 2.5 s at the quota, and the half second the first ten windows allow at once.
	if got > 1.5*rate || got < 0.4*rate {
		t.Errorf("librdkafka produced %.0f B/s against a quota of %d", got, rate)
	}
}

// The cost quotas add to a request (an ApiVersions, handled in place):
// none set, some set that do not apply to this client, one applying.
func BenchmarkQuotaRequestOverhead(b *testing.B) {
	s, err := New(Config{DataDir: b.TempDir(), Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	lis := &listener{Listener: Listener{Name: Plaintext, Protocol: Plaintext}, host: "127.0.0.1", port: 1}
	c := &conn{s: s, lis: lis, principal: "User:ANONYMOUS", ip: "127.0.0.1", authed: true}
	frame := reqFrame(kmsg.NewPtrApiVersionsRequest(), 1)[4:]
	run := func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := c.handleFrame(frame); err != nil {
				b.Fatal(err)
			}
			c.quota.muteUntil = time.Time{}
		}
	}
	alter := func(client string) {
		res, _, err := s.sec.quotas.alter([]kmsg.AlterClientQuotasRequestEntry{{
			Entity: []kmsg.AlterClientQuotasRequestEntryEntity{{Type: quotaClientID, Name: &client}},
			Ops:    []kmsg.AlterClientQuotasRequestEntryOp{{Key: keyRequestPct, Value: 1e9}},
		}}, false)
		if err != nil || res[0].code != 0 {
			b.Fatal(err, res)
		}
	}
	b.Run("none", run)
	alter("someone-else")
	b.Run("others", run)
	alter("pipe")
	b.Run("applying", run)
}

// newTestQuotas is a quota store with entries, as openQuotas makes one.
func newTestQuotas(entries map[quotaEntity]map[string]float64) *quotaStore {
	q := &quotaStore{samples: 11, windowMs: 1000, idle: quotaSensorMinIdle, now: time.Now, entries: entries,
		clients: map[[2]string]*clientQuotas{}, sensors: map[sensorKey]*quotaSensor{}, logger: zap.NewNop()}
	q.setOn()
	return q
}

// gatherQuotas collects q's metrics through a registry, as a scrape does:
// the metrics by their label values, or the registry's error.
func gatherQuotas(t *testing.T, q *quotaStore) (map[string]float64, error) {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(quotaCollector{q}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			k := mf.GetName()
			for _, l := range m.GetLabel() {
				k += "," + l.GetName() + "=" + l.GetValue()
			}
			out[k] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out, err
}

type quotaCollector struct{ q *quotaStore }

func (c quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQuotaLimit, descQuotaRate, descQuotaThrottleMs, descQuotaThrottled} {
		ch <- d
	}
}

func (c quotaCollector) Collect(ch chan<- prometheus.Metric) { c.q.collect(ch) }

// A client id that is not valid UTF-8, or is huge, becomes a label value
// Prometheus takes (valid, at most maxQuotaLabel bytes, told apart by a
// hash): a scrape neither panics (MustNewConstMetric did, in the
// registry's goroutine: the process died) nor fails.
func TestQuotaMetricsTakeAnyClientID(t *testing.T) {
	def := quotaName{set: true, def: true}
	q := newTestQuotas(map[quotaEntity]map[string]float64{{client: def}: {keyRequestPct: 50}})
	long := strings.Repeat("é", 400) // 800 bytes
	ids := []string{"\xff\xfe", "\xfe\xff", "\uFFFD\uFFFD", long, long + "x", "ok"}
	for _, id := range ids {
		q.clientFor("ANONYMOUS", id).sensors[kindRequest].record(q, 1, time.Now().UnixMilli(), false)
	}
	got, err := gatherQuotas(t, q)
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	labels := map[string]bool{}
	for k := range got {
		if !strings.HasPrefix(k, "synapse_quota_rate,") {
			continue
		}
		_, id, _ := strings.Cut(k, "client_id=")
		id, _, _ = strings.Cut(id, ",")
		if !utf8.ValidString(id) || len(id) > maxQuotaLabel {
			t.Fatalf("label %q: invalid or longer than %d bytes", id, maxQuotaLabel)
		}
		labels[id] = true
	}
	if len(labels) != len(ids) || !labels["ok"] || !labels["\uFFFD\uFFFD"] {
		t.Fatalf("client_id labels %q, want one per client id (%d)", slices.Sorted(maps.Keys(labels)), len(ids))
	}
}

// Sensors are capped: past the cap, new client ids share their entity's
// overflow sensor (one series), and sensors idle for the whole window (at
// least a minute) go.
func TestQuotaSensorsAreCapped(t *testing.T) {
	old := maxQuotaSensors
	maxQuotaSensors = 5
	t.Cleanup(func() { maxQuotaSensors = old })
	def := quotaName{set: true, def: true}
	q := newTestQuotas(map[quotaEntity]map[string]float64{{client: def}: {keyRequestPct: 50}})
	now := time.Now()
	q.now = func() time.Time { return now }
	var over *quotaSensor
	for i := range 50 {
		s := q.clientFor("ANONYMOUS", fmt.Sprint("rotating-", i)).sensors[kindRequest]
		s.record(q, 1, now.UnixMilli(), false)
		if i >= maxQuotaSensors {
			if over == nil {
				over = s
			}
			if s != over || s.key.overflow == "" {
				t.Fatalf("client %d past the cap: sensor %+v, want the shared overflow one", i, s.key)
			}
		}
	}
	if n := len(q.sensors); n != maxQuotaSensors+1 {
		t.Fatalf("%d sensors, want %d and the overflow one", n, maxQuotaSensors)
	}
	got, err := gatherQuotas(t, q)
	if err != nil {
		t.Fatal(err)
	}
	if v := got["synapse_quota_rate,client_id=<overflow>,type=request,user=client-id=<default>"]; v <= 0 {
		t.Fatalf("no overflow series with a rate: %v", got)
	}
	if len(got) != 4*(maxQuotaSensors+1) {
		t.Fatalf("%d series, want %d", len(got), 4*(maxQuotaSensors+1))
	}
	// An existing client keeps its own sensor past the cap.
	if s := q.clientFor("ANONYMOUS", "rotating-0").sensors[kindRequest]; s.key.overflow != "" {
		t.Fatal("a client with its own sensor moved to the overflow one")
	}
	// Idle for the window: dropped.
	now = now.Add(q.idle + 2*time.Minute)
	q.clientFor("ANONYMOUS", "late")
	if n := len(q.sensors); n != 1 {
		t.Fatalf("%d sensors after they idled, want 1 (the new client's)", n)
	}
}

// A JoinGroup parked for the rebalance (the initial delay, a second here)
// is not charged as handler time: request_percentage counts the time a
// handler works, as Kafka's request threads do, not what it waits for.
func TestQuotaRequestTimeLeavesOutParkedJoins(t *testing.T) {
	ts := startServerConfig(t, Config{DataDir: t.TempDir(), GroupInitialRebalanceDelay: time.Second})
	_, adm := client(t, ts.addr)
	alterQuotas(t, adm, kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qClient(strp("jg"))},
		Ops: []kadm.AlterClientQuotaOp{setQuota(keyRequestPct, 1e6)}})
	cl, _ := client(t, ts.addr, kgo.ClientID("jg"))
	ctx := ctxT(t)
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group, req.SessionTimeoutMillis, req.RebalanceTimeoutMillis, req.ProtocolType = "g", 10000, 10000, "consumer"
	req.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte{}}}
	start := time.Now()
	for {
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ErrorCode == kerr.MemberIDRequired.Code {
			req.MemberID = resp.MemberID
			continue
		}
		if resp.ErrorCode != 0 {
			t.Fatalf("join: %v", kerr.ErrorForCode(resp.ErrorCode))
		}
		break
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Fatalf("the join took %v: not parked for the initial delay", took)
	}
	s := ts.sec.quotas.sensors[sensorKey{kind: kindRequest, client: "jg"}]
	if s == nil {
		t.Fatal("no request sensor for jg")
	}
	s.mu.Lock()
	var charged float64
	for _, v := range s.rate.val {
		charged += v
	}
	s.mu.Unlock()
	// 100 is a whole second of one thread.
	if charged > 20 {
		t.Fatalf("charged %.1f%% of a thread-second for a join that mostly waited", charged)
	}
}

// quotas.json is checked as AlterClientQuotas checks a change: a value
// that would make the throttle arithmetic meaningless (0: an infinite
// throttle) stops the start with the file's name and the entry.
func TestQuotasFileIsChecked(t *testing.T) {
	for _, body := range []string{
		`{"version":1,"quotas":[{"entity":[{"type":"client-id","name":null}],"values":{"request_percentage":0}}]}`,
		`{"version":1,"quotas":[{"entity":[{"type":"user","name":"a"}],"values":{"producer_byte_rate":-5}}]}`,
		`{"version":1,"quotas":[{"entity":[{"type":"user","name":"a"}],"values":{"producer_byte_rate":1.5}}]}`,
		`{"version":1,"quotas":[{"entity":[{"type":"user","name":"a"}],"values":{"no_such_key":1}}]}`,
		`{"version":1,"quotas":[{"entity":[{"type":"user","name":""}],"values":{"producer_byte_rate":1}}]}`,
		`{"version":1,"quotas":[{"entity":[{"type":"ip","name":"not-an-ip"}],"values":{"connection_creation_rate":1}}]}`,
		`{"version":1,"quotas":[{"entity":[{"type":"ip","name":null},{"type":"user","name":null}],"values":{"connection_creation_rate":1}}]}`,
		`{"version":1,"quotas":[{"entity":[{"type":"user","name":"a"}],"values":{"producer_byte_rate":1}},{"entity":[{"type":"user","name":"a"}],"values":{"consumer_byte_rate":1}}]}`,
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, quotasFile), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{DataDir: dir, Logger: zap.NewNop()})
		if err == nil {
			s.Close()
			t.Fatalf("%s: the server started", body)
		}
		if !strings.Contains(err.Error(), quotasFile) {
			t.Fatalf("%s: error %v does not name %s", body, err, quotasFile)
		}
	}
	good := `{"version":1,"quotas":[{"entity":[{"type":"ip","name":"::ffff:10.0.0.1"}],"values":{"connection_creation_rate":3}}]}`
	m, err := decodeQuotas([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m[quotaEntity{ip: quotaName{set: true, name: "10.0.0.1"}}]; !ok {
		t.Fatalf("ip entity not normalized as AlterClientQuotas does: %v", m)
	}
}

// A store that fails after quotas.json was replaced (syncing the directory)
// leaves memory as the file is (what a restart loads); one that fails
// before leaves both as they were.
func TestQuotasFollowTheFileAfterAFailedStore(t *testing.T) {
	ts := startServer(t, t.TempDir())
	_, adm := client(t, ts.addr)
	q := ts.sec.quotas
	orig := q.persist
	q.persist = func(b []byte) error {
		if err := orig(b); err != nil {
			return err
		}
		return errors.New("injected: sync the directory")
	}
	alterQuotas(t, adm, kadm.AlterClientQuotaEntry{Entity: kadm.ClientQuotaEntity{qUser(strp("after"))},
		Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1000)}})
	if got := describeQuotas(t, adm, false); !slices.Equal(got, []string{"{user=after}: producer_byte_rate=1000.000000"}) {
		t.Fatalf("after a failure past the rename: %q", got)
	}
	q.persist = func([]byte) error { return errors.New("injected: disk full") }
	res, err := adm.AlterClientQuotas(ctxT(t), []kadm.AlterClientQuotaEntry{{Entity: kadm.ClientQuotaEntity{qUser(strp("before"))},
		Ops: []kadm.AlterClientQuotaOp{setQuota(keyProducerRate, 1000)}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Err == nil {
		t.Fatalf("a failed store answered %+v", res)
	}
	if got := describeQuotas(t, adm, false); !slices.Equal(got, []string{"{user=after}: producer_byte_rate=1000.000000"}) {
		t.Fatalf("after a failure before the rename: %q", got)
	}
}
