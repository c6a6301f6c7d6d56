package httpapi_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/broker"
	"github.com/synapsebroker/synapse/httpapi"
)

// env is a broker on a loopback port and the API in front of it.
type env struct {
	srv  *broker.Server
	addr string // Kafka
	api  *httpapi.API
	http *httptest.Server
}

func start(t *testing.T, cfg httpapi.Config) *env {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := broker.New(broker.Config{DataDir: t.TempDir(), AutoCreateTopics: true, Logger: zaptest.NewLogger(t),
		GroupInitialRebalanceDelay: -1, GroupMinSessionTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	cfg.Broker = srv
	cfg.Logger = zaptest.NewLogger(t)
	api := httpapi.New(cfg)
	hs := httptest.NewServer(api.Mount(http.NotFoundHandler()))
	e := &env{srv: srv, addr: ln.Addr().String(), api: api, http: hs}
	t.Cleanup(func() {
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		api.Close(ctx)
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		<-done
	})
	return e
}

func (e *env) kafka(t *testing.T, opts ...kgo.Opt) (*kgo.Client, *kadm.Client) {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl, kadm.NewClient(cl)
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("status %d, body %q: %v", r.status, r.body, err)
	}
}

func (e *env) do(t *testing.T, method, path, ct string, body []byte, hdr ...string) resp {
	t.Helper()
	req, err := http.NewRequest(method, e.http.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp{res.StatusCode, res.Header, b}
}

// wantError checks an error answer's status and error_code.
func wantError(t *testing.T, r resp, status, code int) {
	t.Helper()
	var e struct {
		Code    int    `json:"error_code"`
		Message string `json:"message"`
	}
	r.json(t, &e)
	if r.status != status || e.Code != code || e.Message == "" {
		t.Fatalf("got %d %+v, want %d with error_code %d", r.status, e, status, code)
	}
}

// createTopic creates topic with parts partitions and configs ("k", "v",
// ...).
func (e *env) createTopic(t *testing.T, topic string, parts int32, configs ...string) {
	t.Helper()
	_, adm := e.kafka(t)
	cfg := map[string]*string{}
	for i := 0; i+1 < len(configs); i += 2 {
		cfg[configs[i]] = &configs[i+1]
	}
	if _, err := adm.CreateTopic(context.Background(), parts, 1, cfg, topic); err != nil {
		t.Fatal(err)
	}
}

func consume(t *testing.T, cl *kgo.Client, n int) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d", len(out), n)
		}
		fs.EachError(func(t2 string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", t2, p, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

func TestProduceFetchRoundTrip(t *testing.T) {
	e := start(t, httpapi.Config{})
	e.createTopic(t, "rt", 1)
	var got struct {
		Topic     string `json:"topic"`
		Partition int32  `json:"partition"`
		Offset    int64  `json:"offset"`
	}
	for i := range 3 {
		r := e.do(t, "POST", "/produce?topic=rt&partition=0", "application/octet-stream", fmt.Appendf(nil, "value-%d", i))
		r.json(t, &got)
		if r.status != 200 || got.Topic != "rt" || got.Partition != 0 || got.Offset != int64(i) {
			t.Fatalf("produce %d: %d %s", i, r.status, r.body)
		}
	}
	r := e.do(t, "GET", "/fetch?topic=rt&partition=0&offset=1", "", nil)
	if r.status != 200 || string(r.body) != "value-1" || r.header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("fetch: %d %q %v", r.status, r.body, r.header)
	}
	wantError(t, e.do(t, "GET", "/fetch?topic=rt&partition=0&offset=3", "", nil), 404, 40404)
	wantError(t, e.do(t, "GET", "/fetch?topic=rt&partition=0&offset=-1", "", nil), 422, 42201)
	wantError(t, e.do(t, "GET", "/fetch?topic=nope&partition=0&offset=0", "", nil), 404, 40401)
	wantError(t, e.do(t, "GET", "/fetch?topic=rt&partition=7&offset=0", "", nil), 404, 40402)
	wantError(t, e.do(t, "POST", "/produce?topic=rt", "text/plain", []byte("x")), 415, 41501)
	wantError(t, e.do(t, "POST", "/produce", "application/octet-stream", []byte("x")), 400, 40001)

	// Kafka clients read what HTTP wrote, and HTTP reads what they write.
	cl, adm := e.kafka(t, kgo.ConsumeTopics("rt"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	recs := consume(t, cl, 3)
	for i, rec := range recs {
		if string(rec.Value) != fmt.Sprintf("value-%d", i) || rec.Offset != int64(i) {
			t.Fatalf("record %d: %q at %d", i, rec.Value, rec.Offset)
		}
	}
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "rt", Value: []byte("from kafka")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if r := e.do(t, "GET", "/fetch?topic=rt&partition=0&offset=3", "", nil); r.status != 200 || string(r.body) != "from kafka" {
		t.Fatalf("fetch of a Kafka record: %d %q", r.status, r.body)
	}
	// curl --data-binary's default label: the raw value all the same.
	if res := e.do(t, "POST", "/produce?topic=rt", "application/x-www-form-urlencoded", []byte("a=b&c")); res.status != 200 {
		t.Fatalf("form-urlencoded raw value: %d", res.status)
	}
	if r := e.do(t, "GET", "/fetch?topic=rt&partition=0&offset=4", "", nil); r.status != 200 || string(r.body) != "a=b&c" {
		t.Fatalf("fetch of the form-urlencoded value: %d %q", r.status, r.body)
	}

	// Below the log start: 410.
	res, err := adm.DeleteRecords(context.Background(), kadm.Offsets{"rt": {0: {At: 2}}})
	if err != nil || res.Error() != nil {
		t.Fatal(err, res.Error())
	}
	wantError(t, e.do(t, "GET", "/fetch?topic=rt&partition=0&offset=1", "", nil), 410, 41001)
	if r := e.do(t, "GET", "/fetch?topic=rt&partition=0&offset=2", "", nil); r.status != 200 || string(r.body) != "value-2" {
		t.Fatalf("fetch at the log start: %d %q", r.status, r.body)
	}
}

// batchCount fetches topic/0 from offset 0 raw and returns the record
// count of each batch.
func batchCount(t *testing.T, e *env, topic string) []int32 {
	t.Helper()
	v := kversion.Stable()
	v.SetMaxKeyVersion(1, 12) // Fetch by topic name
	cl, _ := e.kafka(t, kgo.MaxVersions(v))
	req := kmsg.NewPtrFetchRequest()
	req.MaxBytes = 10 << 20
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.PartitionMaxBytes = 10 << 20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	raw := resp.Topics[0].Partitions[0].RecordBatches
	var counts []int32
	for len(raw) > 0 {
		var b kmsg.RecordBatch
		if err := b.ReadFrom(raw); err != nil {
			t.Fatal(err)
		}
		counts = append(counts, b.NumRecords)
		raw = raw[12+b.Length:]
	}
	return counts
}

func TestProduceBatch(t *testing.T) {
	e := start(t, httpapi.Config{MaxRecords: 100, MaxBodyBytes: 64 << 10})
	e.createTopic(t, "b", 1)
	b64 := base64.StdEncoding.EncodeToString
	body := fmt.Sprintf(`{"records":[{"key":%q,"value":%q,"headers":[{"key":"h","value":%q}]},{"value":%q},{"key":null,"value":null}]}`,
		b64([]byte("k0")), b64([]byte("v0")), b64([]byte("hv")), b64([]byte("v1")))
	r := e.do(t, "POST", "/produce/batch?topic=b&partition=0", "application/json", []byte(body))
	var got struct {
		Base  int64 `json:"base_offset"`
		Count int   `json:"count"`
	}
	r.json(t, &got)
	if r.status != 200 || got.Base != 0 || got.Count != 3 {
		t.Fatalf("json batch: %d %s", r.status, r.body)
	}
	var bin []byte
	for i := range 5 {
		bin = httpapi.AppendFraming(bin, fmt.Appendf(nil, "bk%d", i), fmt.Appendf(nil, "bv%d", i), [2][]byte{[]byte("x"), []byte("y")})
	}
	bin = httpapi.AppendFraming(bin, nil, []byte{})
	r = e.do(t, "POST", "/produce/batch?topic=b&partition=0", "application/x-synapse-records", bin)
	r.json(t, &got)
	if r.status != 200 || got.Base != 3 || got.Count != 6 {
		t.Fatalf("binary batch: %d %s", r.status, r.body)
	}
	cl, _ := e.kafka(t, kgo.ConsumeTopics("b"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if c := batchCount(t, e, "b"); len(c) != 2 || c[0] != 3 || c[1] != 6 {
		t.Fatalf("batches: %v, want [3 6]: one batch per request", c)
	}
	recs := consume(t, cl, 9)
	if string(recs[0].Key) != "k0" || string(recs[0].Value) != "v0" || len(recs[0].Headers) != 1 || string(recs[0].Headers[0].Value) != "hv" {
		t.Fatalf("record 0: %+v", recs[0])
	}
	if recs[2].Key != nil || recs[2].Value != nil {
		t.Fatalf("record 2: want null key and value: %+v", recs[2])
	}
	if string(recs[7].Key) != "bk4" || string(recs[7].Value) != "bv4" || string(recs[7].Headers[0].Key) != "x" {
		t.Fatalf("record 7: %+v", recs[7])
	}
	if recs[8].Key != nil || recs[8].Value == nil || len(recs[8].Value) != 0 {
		t.Fatalf("record 8: want null key, empty value: %+v", recs[8])
	}

	wantError(t, e.do(t, "POST", "/produce/batch?topic=b", "application/json", []byte(`{"records":[{"value":"%%%"}]}`)), 422, 42201)
	wantError(t, e.do(t, "POST", "/produce/batch?topic=b", "application/json", []byte(`{"records":[`)), 400, 40001)
	wantError(t, e.do(t, "POST", "/produce/batch?topic=b", "application/json", []byte(`{"records":[]}`)), 422, 42201)
	wantError(t, e.do(t, "POST", "/produce/batch?topic=b", "text/csv", []byte(`a,b`)), 415, 41501)
	wantError(t, e.do(t, "POST", "/produce/batch?topic=b", "application/x-synapse-records", []byte{0x7f}), 422, 42201)
	wantError(t, e.do(t, "POST", "/produce/batch?topic=b&partition=-1", "application/json", []byte(body)), 422, 42201)
	var many []byte
	for range 101 {
		many = httpapi.AppendFraming(many, nil, []byte("v"))
	}
	wantError(t, e.do(t, "POST", "/produce/batch?topic=b", "application/x-synapse-records", many), 413, 41303)
	wantError(t, e.do(t, "POST", "/produce?topic=b", "application/octet-stream", make([]byte, 65<<10)), 413, 41302)
}

func TestRESTTopicsAndProduce(t *testing.T) {
	e := start(t, httpapi.Config{})
	_, adm := e.kafka(t)
	if _, err := adm.CreateTopic(context.Background(), 3, 1, nil, "rest"); err != nil {
		t.Fatal(err)
	}
	var topics []string
	r := e.do(t, "GET", "/topics", "", nil)
	r.json(t, &topics)
	if r.status != 200 || len(topics) != 1 || topics[0] != "rest" {
		t.Fatalf("topics: %d %s", r.status, r.body)
	}
	var topic struct {
		Name       string            `json:"name"`
		Configs    map[string]string `json:"configs"`
		Partitions []struct {
			Partition int32 `json:"partition"`
			Leader    int32 `json:"leader"`
			Replicas  []struct {
				Leader bool `json:"leader"`
				InSync bool `json:"in_sync"`
			} `json:"replicas"`
		} `json:"partitions"`
	}
	r = e.do(t, "GET", "/topics/rest", "", nil)
	r.json(t, &topic)
	if r.status != 200 || topic.Name != "rest" || len(topic.Partitions) != 3 || topic.Partitions[2].Partition != 2 ||
		!topic.Partitions[0].Replicas[0].Leader || topic.Configs["cleanup.policy"] != "delete" {
		t.Fatalf("topic: %d %s", r.status, r.body)
	}
	wantError(t, e.do(t, "GET", "/topics/missing", "", nil), 404, 40401)
	wantError(t, e.do(t, "GET", "/topics/rest/partitions/9", "", nil), 404, 40402)

	b64 := base64.StdEncoding.EncodeToString
	body := fmt.Sprintf(`{"records":[{"key":%q,"value":%q},{"value":%q,"partition":2},{"key":%q,"value":%q}]}`,
		b64([]byte("a")), b64([]byte("1")), b64([]byte("2")), b64([]byte("a")), b64([]byte("3")))
	var out struct {
		Offsets []struct {
			Partition int32 `json:"partition"`
			Offset    int64 `json:"offset"`
		} `json:"offsets"`
	}
	r = e.do(t, "POST", "/topics/rest", "application/vnd.kafka.binary.v2+json", []byte(body))
	r.json(t, &out)
	if r.status != 200 || len(out.Offsets) != 3 || out.Offsets[1].Partition != 2 ||
		out.Offsets[0].Partition != out.Offsets[2].Partition || out.Offsets[2].Offset != out.Offsets[0].Offset+1 {
		t.Fatalf("rest produce: %d %s", r.status, r.body)
	}
	// Keyed records land where Kafka's default partitioner puts them.
	cl, _ := e.kafka(t, kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	res := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "rest", Key: []byte("a"), Value: []byte("k")})
	if rec, err := res.First(); err != nil || rec.Partition != out.Offsets[0].Partition {
		t.Fatalf("kgo put key a on %d, the REST produce on %d (%v)", rec.Partition, out.Offsets[0].Partition, err)
	}
	r = e.do(t, "POST", "/topics/rest/partitions/1", "application/vnd.kafka.json.v2+json", []byte(`{"records":[{"value":{"a":[1,2]}}]}`))
	r.json(t, &out)
	if r.status != 200 || out.Offsets[0].Partition != 1 {
		t.Fatalf("json produce: %d %s", r.status, r.body)
	}
	if r := e.do(t, "GET", fmt.Sprintf("/fetch?topic=rest&partition=1&offset=%d", out.Offsets[0].Offset), "", nil); string(r.body) != `{"a":[1,2]}` {
		t.Fatalf("json value stored as %q", r.body)
	}
	wantError(t, e.do(t, "POST", "/topics/rest", "application/json", []byte(body)), 415, 41501)
	wantError(t, e.do(t, "POST", "/topics/rest", "application/vnd.kafka.binary.v2+json", []byte(`{"records":[{"value":"not base64!"}]}`)), 422, 42201)
	wantError(t, e.do(t, "POST", "/topics/rest/partitions/7", "application/vnd.kafka.binary.v2+json", []byte(`{"records":[{"value":"AA=="}]}`)), 404, 40402)

	var offs struct {
		Begin int64 `json:"beginning_offset"`
		End   int64 `json:"end_offset"`
	}
	r = e.do(t, "GET", "/topics/rest/partitions/1/offsets", "", nil)
	r.json(t, &offs)
	if offs.Begin != 0 || offs.End != out.Offsets[0].Offset+1 {
		t.Fatalf("offsets: %s", r.body)
	}
}

func TestRESTConsumerSharesGroupWithKafka(t *testing.T) {
	e := start(t, httpapi.Config{})
	_, adm := e.kafka(t)
	if _, err := adm.CreateTopic(context.Background(), 2, 1, nil, "c"); err != nil {
		t.Fatal(err)
	}
	p, _ := e.kafka(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for i := range 10 {
		if err := p.ProduceSync(context.Background(), &kgo.Record{Topic: "c", Partition: int32(i % 2), Value: fmt.Appendf(nil, "%d", i)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	const v2 = "application/vnd.kafka.v2+json"
	var created struct {
		ID   string `json:"instance_id"`
		Base string `json:"base_uri"`
	}
	r := e.do(t, "POST", "/consumers/g", v2, []byte(`{"name":"i1","format":"binary","auto.offset.reset":"earliest","auto.commit.enable":"false"}`))
	r.json(t, &created)
	if r.status != 200 || created.ID != "i1" || !strings.HasSuffix(created.Base, "/consumers/g/instances/i1") {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	wantError(t, e.do(t, "POST", "/consumers/g", v2, []byte(`{"name":"i1"}`)), 409, 40902)
	wantError(t, e.do(t, "POST", "/consumers/g", v2, []byte(`{"format":"avro"}`)), 422, 42204)
	inst := "/consumers/g/instances/i1"
	wantError(t, e.do(t, "GET", inst+"/records", "", nil), 409, 40903)
	if r := e.do(t, "POST", inst+"/subscription", v2, []byte(`{"topics":["c"]}`)); r.status != 204 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}
	var sub struct {
		Topics []string `json:"topics"`
	}
	e.do(t, "GET", inst+"/subscription", "", nil).json(t, &sub)
	if len(sub.Topics) != 1 || sub.Topics[0] != "c" {
		t.Fatalf("subscription: %v", sub)
	}
	wantError(t, e.do(t, "GET", inst+"/records", "", nil, "Accept", "application/vnd.kafka.json.v2+json"), 406, 40601)

	type rec struct {
		Topic     string `json:"topic"`
		Value     []byte `json:"value"`
		Partition int32  `json:"partition"`
		Offset    int64  `json:"offset"`
	}
	var got []rec
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < 10 && time.Now().Before(deadline) {
		var batch []rec
		r := e.do(t, "GET", inst+"/records?timeout=500&max_bytes=1", "", nil, "Accept", "application/vnd.kafka.binary.v2+json")
		r.json(t, &batch)
		if r.status != 200 {
			t.Fatalf("records: %d %s", r.status, r.body)
		}
		if len(batch) > 1 {
			t.Fatalf("max_bytes=1 returned %d records of 1 byte", len(batch))
		}
		got = append(got, batch...)
	}
	if len(got) != 10 {
		t.Fatalf("got %d of 10 records", len(got))
	}
	// Commit what was returned (no body): the group resumes after it,
	// as kadm sees.
	if r := e.do(t, "POST", inst+"/offsets", v2, nil); r.status != 204 {
		t.Fatalf("commit: %d %s", r.status, r.body)
	}
	fo, err := adm.FetchOffsets(context.Background(), "g")
	if err != nil || fo.Error() != nil {
		t.Fatal(err, fo.Error())
	}
	for p := range int32(2) {
		if o, _ := fo.Lookup("c", p); o.At != 5 {
			t.Fatalf("committed offset of c/%d: %d, want 5", p, o.At)
		}
	}
	// An explicit commit is of the last record consumed.
	if r := e.do(t, "POST", inst+"/offsets", v2, []byte(`{"offsets":[{"topic":"c","partition":0,"offset":1}]}`)); r.status != 204 {
		t.Fatalf("commit: %d %s", r.status, r.body)
	}
	var committed struct {
		Offsets []struct {
			Topic     string `json:"topic"`
			Partition int32  `json:"partition"`
			Offset    int64  `json:"offset"`
		} `json:"offsets"`
	}
	r = e.do(t, "GET", inst+"/offsets", v2, []byte(`{"partitions":[{"topic":"c","partition":0}]}`))
	r.json(t, &committed)
	if len(committed.Offsets) != 1 || committed.Offsets[0].Offset != 2 {
		t.Fatalf("committed: %s", r.body)
	}

	// A Kafka consumer joins the same group: the two split the partitions.
	kc, _ := e.kafka(t, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("c"), kgo.DisableAutoCommit())
	deadline = time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		kc.PollFetches(ctx)
		cancel()
		e.do(t, "GET", inst+"/records?timeout=200", "", nil) // keeps the HTTP member polling
		dg, err := adm.DescribeGroups(context.Background(), "g")
		if err != nil {
			t.Fatal(err)
		}
		g := dg["g"]
		if g.State == "Stable" && len(g.Members) == 2 {
			n := 0
			for _, m := range g.Members {
				ca, _ := m.Assigned.AsConsumer()
				for _, tp := range ca.Topics {
					if len(tp.Partitions) == 1 {
						n++
					}
				}
			}
			if n == 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("group g never had the two members one partition each: %+v", g)
		}
	}
	if r := e.do(t, "DELETE", inst, "", nil); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	wantError(t, e.do(t, "GET", inst+"/records", "", nil), 404, 40403)
}

func TestConsumerLimits(t *testing.T) {
	e := start(t, httpapi.Config{MaxInstancesPerGroup: 2, InstanceTimeout: 300 * time.Millisecond})
	const v2 = "application/vnd.kafka.v2+json"
	for i := range 2 {
		if r := e.do(t, "POST", "/consumers/lim", v2, fmt.Appendf(nil, `{"name":"c%d"}`, i)); r.status != 200 {
			t.Fatalf("create %d: %d %s", i, r.status, r.body)
		}
	}
	wantError(t, e.do(t, "POST", "/consumers/lim", v2, []byte(`{"name":"c2"}`)), 429, 42901)
	wantError(t, e.do(t, "POST", "/consumers/lim", "text/plain", []byte(`{}`)), 415, 41501)
	// Idle instances expire (without a request touching them).
	time.Sleep(1500 * time.Millisecond)
	wantError(t, e.do(t, "GET", "/consumers/lim/instances/c0/subscription", "", nil), 404, 40403)
	if r := e.do(t, "POST", "/consumers/lim", v2, []byte(`{"name":"c2"}`)); r.status != 200 {
		t.Fatalf("create after expiry: %d %s", r.status, r.body)
	}
}

// The broker stops with the API's internal connections open (a consumer
// instance long-polling, the shared client idle): they are closed like
// any other, the stop is not held up, and the API then answers 503.
func TestBrokerShutdownWithInternalConns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := broker.New(broker.Config{DataDir: t.TempDir(), AutoCreateTopics: true, Logger: zaptest.NewLogger(t), GroupInitialRebalanceDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	api := httpapi.New(httpapi.Config{Broker: srv})
	hs := httptest.NewServer(api)
	defer hs.Close()
	e := &env{srv: srv, addr: ln.Addr().String(), api: api, http: hs}
	e.createTopic(t, "s", 1)
	if r := e.do(t, "POST", "/produce?topic=s", "", []byte("v")); r.status != 200 {
		t.Fatalf("produce: %d %s", r.status, r.body)
	}
	const v2 = "application/vnd.kafka.v2+json"
	e.do(t, "POST", "/consumers/sg", v2, []byte(`{"name":"c"}`))
	e.do(t, "POST", "/consumers/sg/instances/c/subscription", v2, []byte(`{"topics":["s"]}`))
	polled := make(chan resp, 1)
	go func() { polled <- e.do(t, "GET", "/consumers/sg/instances/c/records?timeout=20000", "", nil) }()
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("shutdown took %s with internal connections open", d)
	}
	if _, err := srv.DialInternal("User:ANONYMOUS", "127.0.0.1:1"); err == nil {
		t.Fatal("DialInternal after shutdown succeeded")
	}
	api.Close(ctx)
	if r := <-polled; r.status >= 500 && r.status != 503 {
		t.Fatalf("long poll across the stop: %d %s", r.status, r.body)
	}
	wantError(t, e.do(t, "POST", "/produce?topic=s", "", []byte("v")), 503, 50301)
}

const v2 = "application/vnd.kafka.v2+json"

// pollUntil GETs records of inst until n came back.
func (e *env) pollUntil(t *testing.T, inst string, n int) []restRec {
	t.Helper()
	var got []restRec
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		var batch []restRec
		r := e.do(t, "GET", inst+"/records?timeout=500", "", nil, "Accept", "application/vnd.kafka.binary.v2+json")
		r.json(t, &batch)
		if r.status != 200 {
			t.Fatalf("records: %d %s", r.status, r.body)
		}
		got = append(got, batch...)
	}
	if len(got) < n {
		t.Fatalf("got %d of %d records", len(got), n)
	}
	return got
}

type restRec struct {
	Topic     string `json:"topic"`
	Value     []byte `json:"value"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

func (e *env) produceN(t *testing.T, topic string, n int) {
	t.Helper()
	cl, _ := e.kafka(t, kgo.DefaultProduceTopic(topic))
	for i := range n {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Value: fmt.Appendf(nil, "%d", i)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// With auto-commit, the records returned are committed when the instance
// goes, not only at the next auto-commit tick (franz-go's default revoke,
// which the instance's revoke callback replaces, did it).
func TestRESTAutoCommitAtDelete(t *testing.T) {
	e := start(t, httpapi.Config{})
	e.createTopic(t, "ac", 1)
	e.produceN(t, "ac", 5)
	if r := e.do(t, "POST", "/consumers/acg", v2, []byte(`{"name":"i","auto.offset.reset":"earliest"}`)); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	inst := "/consumers/acg/instances/i"
	if r := e.do(t, "POST", inst+"/subscription", v2, []byte(`{"topics":["ac"]}`)); r.status != 204 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}
	e.pollUntil(t, inst, 5)
	if r := e.do(t, "DELETE", inst, "", nil); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	_, adm := e.kafka(t)
	fo, err := adm.FetchOffsets(context.Background(), "acg")
	if err != nil || fo.Error() != nil {
		t.Fatal(err, fo.Error())
	}
	if o, ok := fo.Lookup("ac", 0); !ok || o.At != 5 {
		t.Fatalf("committed offset after delete: %+v (%v), want 5", o, ok)
	}
}

// The usual flow: create, subscribe, seek, poll. The seek comes before
// the group assigned anything, and still holds.
func TestRESTSeekBeforeAssignment(t *testing.T) {
	e := start(t, httpapi.Config{})
	e.createTopic(t, "sk", 1)
	e.produceN(t, "sk", 6)
	for _, c := range []struct {
		name, path, body string
		first            int64
	}{
		{"positions", "/positions", `{"offsets":[{"topic":"sk","partition":0,"offset":3}]}`, 3},
		{"beginning", "/positions/beginning", `{"partitions":[{"topic":"sk","partition":0}]}`, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			// latest: without the seek nothing would come back.
			if r := e.do(t, "POST", "/consumers/sk-"+c.name, v2, []byte(`{"name":"i","auto.offset.reset":"latest","auto.commit.enable":"false"}`)); r.status != 200 {
				t.Fatalf("create: %d %s", r.status, r.body)
			}
			inst := "/consumers/sk-" + c.name + "/instances/i"
			if r := e.do(t, "POST", inst+"/subscription", v2, []byte(`{"topics":["sk"]}`)); r.status != 204 {
				t.Fatalf("subscribe: %d %s", r.status, r.body)
			}
			if r := e.do(t, "POST", inst+c.path, v2, []byte(c.body)); r.status != 204 {
				t.Fatalf("seek: %d %s", r.status, r.body)
			}
			got := e.pollUntil(t, inst, int(6-c.first))
			if got[0].Offset != c.first {
				t.Fatalf("first record at %d, want %d", got[0].Offset, c.first)
			}
			// Assigned now: a seek applies at once.
			if r := e.do(t, "POST", inst+"/positions", v2, []byte(`{"offsets":[{"topic":"sk","partition":0,"offset":1}]}`)); r.status != 204 {
				t.Fatalf("seek: %d %s", r.status, r.body)
			}
			if got := e.pollUntil(t, inst, 1); got[0].Offset != 1 {
				t.Fatalf("after the second seek, first record at %d, want 1", got[0].Offset)
			}
			// GET offsets answers metadata as a string, as the REST Proxy.
			if r := e.do(t, "POST", inst+"/offsets", v2, []byte(`{"offsets":[{"topic":"sk","partition":0,"offset":2}]}`)); r.status != 204 {
				t.Fatalf("commit: %d %s", r.status, r.body)
			}
			r := e.do(t, "GET", inst+"/offsets", v2, []byte(`{"partitions":[{"topic":"sk","partition":0}]}`))
			if r.status != 200 || !bytes.Contains(r.body, []byte(`"metadata":"`)) {
				t.Fatalf("committed offsets: %d %s", r.status, r.body)
			}
		})
	}
}

// HTTP produce creates no topic: an unknown one is 404 40401, and stays
// unknown.
func TestProduceUnknownTopic(t *testing.T) {
	e := start(t, httpapi.Config{})
	b64 := base64.StdEncoding.EncodeToString
	wantError(t, e.do(t, "POST", "/produce?topic=nope1", "application/octet-stream", []byte("v")), 404, 40401)
	wantError(t, e.do(t, "POST", "/produce/batch?topic=nope2", "application/json", fmt.Appendf(nil, `{"records":[{"value":%q}]}`, b64([]byte("v")))), 404, 40401)
	wantError(t, e.do(t, "POST", "/topics/nope3", "application/vnd.kafka.binary.v2+json", []byte(`{"records":[{"value":"AA=="}]}`)), 404, 40401)
	wantError(t, e.do(t, "POST", "/topics/nope4/partitions/0", "application/vnd.kafka.binary.v2+json", []byte(`{"records":[{"value":"AA=="}]}`)), 404, 40401)
	_, adm := e.kafka(t)
	td, err := adm.ListTopics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if names := td.Names(); len(names) != 0 {
		t.Fatalf("HTTP produce created topics %v", names)
	}
}

// A REST produce over several partitions: an unknown partition fails the
// request before anything is written; a partition the broker refuses
// fails its records only, the others are written (200, per-record
// error_code and error, offset null), so a client retries only those.
func TestRESTProducePartialFailure(t *testing.T) {
	e := start(t, httpapi.Config{})
	e.createTopic(t, "pf", 2, "max.message.bytes", "2000")
	small := base64.StdEncoding.EncodeToString([]byte("small"))
	big := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), 4000))
	wantError(t, e.do(t, "POST", "/topics/pf", "application/vnd.kafka.binary.v2+json",
		fmt.Appendf(nil, `{"records":[{"value":%q,"partition":0},{"value":%q,"partition":5}]}`, small, small)), 404, 40402)
	r := e.do(t, "GET", "/topics/pf/partitions/0/offsets", "", nil)
	if !bytes.Contains(r.body, []byte(`"end_offset":0`)) {
		t.Fatalf("a request refused for an unknown partition wrote records: %s", r.body)
	}

	r = e.do(t, "POST", "/topics/pf", "application/vnd.kafka.binary.v2+json",
		fmt.Appendf(nil, `{"records":[{"value":%q,"partition":0},{"value":%q,"partition":1},{"value":%q,"partition":0}]}`, small, big, small))
	var out struct {
		Offsets []struct {
			Partition int32   `json:"partition"`
			Offset    *int64  `json:"offset"`
			ErrorCode *int    `json:"error_code"`
			Error     *string `json:"error"`
		} `json:"offsets"`
	}
	r.json(t, &out)
	if r.status != 200 || len(out.Offsets) != 3 {
		t.Fatalf("partial produce: %d %s", r.status, r.body)
	}
	for _, i := range []int{0, 2} {
		if o := out.Offsets[i]; o.Offset == nil || *o.Offset != int64(i/2) || o.ErrorCode != nil || o.Error != nil {
			t.Fatalf("record %d: %s", i, r.body)
		}
	}
	if o := out.Offsets[1]; o.Offset != nil || o.ErrorCode == nil || *o.ErrorCode != 1 || o.Error == nil || *o.Error == "" || o.Partition != 1 {
		t.Fatalf("record 1 (too large): %s", r.body)
	}
	// Every batch refused: one error, as before.
	wantError(t, e.do(t, "POST", "/topics/pf/partitions/1", "application/vnd.kafka.binary.v2+json",
		fmt.Appendf(nil, `{"records":[{"value":%q}]}`, big)), 413, 41301)
}

// GET /fetch tells a null value (X-Kafka-Value-Null) from an empty one.
func TestFetchNullValue(t *testing.T) {
	e := start(t, httpapi.Config{})
	e.createTopic(t, "nv", 1)
	if r := e.do(t, "POST", "/produce/batch?topic=nv", "application/json", []byte(`{"records":[{"value":null},{"value":""}]}`)); r.status != 200 {
		t.Fatalf("produce: %d %s", r.status, r.body)
	}
	r := e.do(t, "GET", "/fetch?topic=nv&offset=0", "", nil)
	if r.status != 200 || len(r.body) != 0 || r.header.Get("X-Kafka-Value-Null") != "true" {
		t.Fatalf("null value: %d %q %v", r.status, r.body, r.header)
	}
	r = e.do(t, "GET", "/fetch?topic=nv&offset=1", "", nil)
	if r.status != 200 || len(r.body) != 0 || r.header.Get("X-Kafka-Value-Null") != "" {
		t.Fatalf("empty value: %d %q %v", r.status, r.body, r.header)
	}
}

// Close ends a long poll at once, so the instance leaves its group (and
// commits) within Close's budget; then no instance or client is created.
func TestCloseDuringLongPoll(t *testing.T) {
	e := start(t, httpapi.Config{})
	e.createTopic(t, "lp", 1)
	e.produceN(t, "lp", 2)
	e.do(t, "POST", "/consumers/lpg", v2, []byte(`{"name":"i","auto.offset.reset":"earliest"}`))
	inst := "/consumers/lpg/instances/i"
	e.do(t, "POST", inst+"/subscription", v2, []byte(`{"topics":["lp"]}`))
	e.pollUntil(t, inst, 2)
	polled := make(chan resp, 1)
	go func() { polled <- e.do(t, "GET", inst+"/records?timeout=30000", "", nil) }()
	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	e.api.Close(ctx)
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("Close took %s with a long poll", d)
	}
	select {
	case <-polled:
	case <-time.After(5 * time.Second):
		t.Fatal("the long poll outlived Close")
	}
	_, adm := e.kafka(t)
	fo, err := adm.FetchOffsets(context.Background(), "lpg")
	if err != nil || fo.Error() != nil {
		t.Fatal(err, fo.Error())
	}
	if o, _ := fo.Lookup("lp", 0); o.At != 2 {
		t.Fatalf("committed at Close: %d, want 2", o.At)
	}
	wantError(t, e.do(t, "POST", "/consumers/lpg", v2, []byte(`{"name":"j"}`)), 503, 50301)
}

// base_uri escapes the group.
func TestBaseURIEscaped(t *testing.T) {
	e := start(t, httpapi.Config{})
	var created struct {
		Base string `json:"base_uri"`
	}
	r := e.do(t, "POST", "/consumers/a%20b%3Fc", v2, []byte(`{"name":"i"}`))
	r.json(t, &created)
	if r.status != 200 || !strings.HasSuffix(created.Base, "/consumers/a%20b%3Fc/instances/i") {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if r := e.do(t, "GET", strings.TrimPrefix(created.Base, e.http.URL)+"/subscription", "", nil); r.status != 200 {
		t.Fatalf("base_uri does not lead to the instance: %d %s", r.status, r.body)
	}
}

// A failed HTTP Basic login is answered after the broker's
// FailedAuthDelay, as a failed SASL exchange is.
func TestFailedLoginDelayed(t *testing.T) {
	srv, err := broker.New(broker.Config{DataDir: t.TempDir(), Logger: zaptest.NewLogger(t), SASLMechanisms: []string{"PLAIN"},
		AdminPassword: "admin-secret", FailedAuthDelay: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	api := httpapi.New(httpapi.Config{Broker: srv})
	hs := httptest.NewServer(api)
	defer func() {
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		api.Close(ctx)
		srv.Shutdown(ctx)
	}()
	do := func(user, pw string) (int, time.Duration) {
		req, _ := http.NewRequest("GET", hs.URL+"/topics", nil)
		req.SetBasicAuth(user, pw)
		t0 := time.Now()
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode, time.Since(t0)
	}
	if st, d := do("admin", "wrong"); st != 401 || d < 400*time.Millisecond {
		t.Fatalf("failed login: %d after %s, want 401 after the 400ms delay", st, d)
	}
	if st, d := do("admin", "admin-secret"); st != 200 || d > 300*time.Millisecond {
		t.Fatalf("login: %d after %s", st, d)
	}
}
