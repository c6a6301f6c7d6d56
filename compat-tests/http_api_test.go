package compattests

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The HTTP API (docs/http-api.md) of a real `synapse serve` on its HTTP
// side port (on by default there: the harness listens on loopback), with
// Go's net/http on one side and franz-go on the other.

// httpBroker starts a synapse broker for an HTTP API test (the kfake
// target has no HTTP API: skipped).
func httpBroker(t *testing.T, setup func(b *synapseBroker)) *synapseBroker {
	t.Helper()
	if compatTarget() != targetSynapse {
		t.Skip("the HTTP API is synapse's")
	}
	bin := os.Getenv("SYNAPSE_BIN")
	if bin == "" {
		skipUnlessRequired(t, "SYNAPSE_BIN is not set")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	return startSynapseWith(t, abs, setup)
}

func (b *synapseBroker) httpURL() string { return "http://127.0.0.1:" + strconv.Itoa(b.httpPort) }

type httpResp struct {
	status int
	header http.Header
	body   []byte
}

func (r httpResp) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("HTTP %d %q: %v", r.status, r.body, err)
	}
}

// httpDo sends one request; hdr are header name/value pairs ("Authorization"
// as "user:password" is sent as HTTP Basic).
func httpDo(t *testing.T, method, url, contentType string, body []byte, hdr ...string) httpResp {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Authorization" {
			u, p, _ := strings.Cut(hdr[i+1], ":")
			req.SetBasicAuth(u, p)
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	cl := &http.Client{Timeout: 30 * time.Second}
	res, err := cl.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return httpResp{res.StatusCode, res.Header, b}
}

// wantHTTPError checks an error answer: status, error_code, a message.
func wantHTTPError(t *testing.T, r httpResp, status, code int) {
	t.Helper()
	var e struct {
		Code    int    `json:"error_code"`
		Message string `json:"message"`
	}
	r.decode(t, &e)
	if r.status != status || e.Code != code || e.Message == "" {
		t.Fatalf("HTTP %d %s, want %d with error_code %d", r.status, r.body, status, code)
	}
}

// frame appends one record in application/x-synapse-records framing.
func frame(dst, key, value []byte, headers ...[2]string) []byte {
	put := func(dst, b []byte) []byte {
		if b == nil {
			return binary.AppendVarint(dst, -1)
		}
		return append(binary.AppendVarint(dst, int64(len(b))), b...)
	}
	dst = put(put(dst, key), value)
	dst = binary.AppendVarint(dst, int64(len(headers)))
	for _, h := range headers {
		dst = put(put(dst, []byte(h[0])), []byte(h[1]))
	}
	return dst
}

func readAll(t *testing.T, addr, topic string, n int, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := testCtx(t, 30*time.Second)
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(out), n, topic)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		out = append(out, fs.Records()...)
	}
	return out
}

func TestHTTPProduceFetch(t *testing.T) {
	b := httpBroker(t, nil)
	url := b.httpURL()
	topic := uniqueTopic(t)
	ctx := testCtx(t, time.Minute)

	if r := httpDo(t, "GET", url+"/healthz", "", nil); r.status != 200 {
		t.Fatalf("/healthz: %d", r.status)
	}
	// HTTP produce creates no topic (the broker's auto-creation is for
	// Kafka clients' Metadata): 404 40401, and the topic stays unknown.
	wantHTTPError(t, httpDo(t, "POST", fmt.Sprintf("%s/produce?topic=%s&partition=0", url, topic), "application/octet-stream", []byte("v")), 404, 40401)
	wantHTTPError(t, httpDo(t, "POST", fmt.Sprintf("%s/produce/batch?topic=%s", url, topic), "application/x-synapse-records", frame(nil, nil, []byte("v"))), 404, 40401)
	wantHTTPError(t, httpDo(t, "POST", url+"/topics/"+topic, "application/vnd.kafka.binary.v2+json", []byte(`{"records":[{"value":"AA=="}]}`)), 404, 40401)
	{
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		adm := kadm.NewClient(cl)
		td, err := adm.ListTopics(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		if td.Has(topic) && td[topic].Err == nil {
			t.Fatalf("HTTP produce created %s", topic)
		}
		if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
			t.Fatal(err)
		}
		cl.Close()
	}
	// The original API: one record a request.
	for i := range 3 {
		r := httpDo(t, "POST", fmt.Sprintf("%s/produce?topic=%s&partition=0", url, topic), "application/octet-stream", fmt.Appendf(nil, "http-%d", i))
		var got struct {
			Topic     string `json:"topic"`
			Partition int32  `json:"partition"`
			Offset    int64  `json:"offset"`
		}
		r.decode(t, &got)
		if r.status != 200 || got.Topic != topic || got.Partition != 0 || got.Offset != int64(i) {
			t.Fatalf("produce %d: %d %s", i, r.status, r.body)
		}
	}
	recs := readAll(t, b.Addr(), topic, 3)
	for i, r := range recs {
		if string(r.Value) != fmt.Sprintf("http-%d", i) {
			t.Fatalf("Kafka read record %d as %q", i, r.Value)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("from-kafka")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	r := httpDo(t, "GET", fmt.Sprintf("%s/fetch?topic=%s&partition=0&offset=3", url, topic), "", nil)
	if r.status != 200 || string(r.body) != "from-kafka" {
		t.Fatalf("fetch of a Kafka client's record: %d %q", r.status, r.body)
	}

	// The batch form: JSON with base64, then the binary framing; each is
	// one batch.
	b64 := base64.StdEncoding.EncodeToString
	var recsJSON []string
	for i := range 50 {
		recsJSON = append(recsJSON, fmt.Sprintf(`{"key":%q,"value":%q,"headers":[{"key":"n","value":%q}]}`, b64(fmt.Appendf(nil, "k%d", i)), b64(fmt.Appendf(nil, "j%d", i)), b64([]byte(strconv.Itoa(i)))))
	}
	batch := httpDo(t, "POST", fmt.Sprintf("%s/produce/batch?topic=%s&partition=0", url, topic), "application/json",
		[]byte(`{"records":[`+strings.Join(recsJSON, ",")+`]}`))
	var br struct {
		Base  int64 `json:"base_offset"`
		Count int   `json:"count"`
	}
	batch.decode(t, &br)
	if batch.status != 200 || br.Base != 4 || br.Count != 50 {
		t.Fatalf("JSON batch: %d %s", batch.status, batch.body)
	}
	var bin []byte
	for i := range 50 {
		bin = frame(bin, fmt.Appendf(nil, "k%d", i), fmt.Appendf(nil, "b%d", i), [2]string{"n", strconv.Itoa(i)})
	}
	batch = httpDo(t, "POST", fmt.Sprintf("%s/produce/batch?topic=%s&partition=0", url, topic), "application/x-synapse-records", bin)
	batch.decode(t, &br)
	if batch.status != 200 || br.Base != 54 || br.Count != 50 {
		t.Fatalf("binary batch: %d %s", batch.status, batch.body)
	}
	recs = readAll(t, b.Addr(), topic, 104)
	for i, r := range recs[4:] {
		want, kind := i, "j"
		if i >= 50 {
			want, kind = i-50, "b"
		}
		if string(r.Key) != fmt.Sprintf("k%d", want) || string(r.Value) != fmt.Sprintf("%s%d", kind, want) ||
			len(r.Headers) != 1 || r.Headers[0].Key != "n" || string(r.Headers[0].Value) != strconv.Itoa(want) {
			t.Fatalf("batch record %d: key %q value %q headers %v", i, r.Key, r.Value, r.Headers)
		}
	}

	// Bad input: 4xx with a message, never a 500.
	prod := fmt.Sprintf("%s/produce?topic=%s", url, topic)
	wantHTTPError(t, httpDo(t, "POST", prod, "text/plain", []byte("x")), 415, 41501)
	wantHTTPError(t, httpDo(t, "POST", url+"/produce/batch?topic="+topic, "application/json", []byte(`{"records":[{"value":"@@@"}]}`)), 422, 42201)
	wantHTTPError(t, httpDo(t, "POST", url+"/produce/batch?topic="+topic, "application/json", []byte(`{"records":`)), 400, 40001)
	wantHTTPError(t, httpDo(t, "POST", url+"/produce/batch?topic="+topic, "application/x-synapse-records", []byte{0x20, 'a'}), 422, 42201)
	wantHTTPError(t, httpDo(t, "GET", url+"/fetch?topic=no-such-topic-here&partition=0&offset=0", "", nil), 404, 40401)
	wantHTTPError(t, httpDo(t, "GET", url+"/topics/no-such-topic-here", "", nil), 404, 40401)
	wantHTTPError(t, httpDo(t, "GET", fmt.Sprintf("%s/fetch?topic=%s&partition=0&offset=-5", url, topic), "", nil), 422, 42201)
	wantHTTPError(t, httpDo(t, "GET", fmt.Sprintf("%s/fetch?topic=%s&partition=0&offset=104", url, topic), "", nil), 404, 40404)
	wantHTTPError(t, httpDo(t, "POST", prod, "application/octet-stream", make([]byte, 9<<20)), 413, 41302)

	// Below the log start (DeleteRecords): 410.
	res, err := kadm.NewClient(cl).DeleteRecords(ctx, kadm.Offsets{topic: {0: {At: 2}}})
	if err != nil || res.Error() != nil {
		t.Fatalf("DeleteRecords: %v %v", err, res.Error())
	}
	wantHTTPError(t, httpDo(t, "GET", fmt.Sprintf("%s/fetch?topic=%s&partition=0&offset=1", url, topic), "", nil), 410, 41001)
	if r := httpDo(t, "GET", fmt.Sprintf("%s/fetch?topic=%s&partition=0&offset=2", url, topic), "", nil); string(r.body) != "http-2" {
		t.Fatalf("fetch at the new log start: %d %q", r.status, r.body)
	}

	t.Run("curl", func(t *testing.T) {
		curl, err := exec.LookPath("curl")
		if err != nil {
			t.Skip("curl not installed")
		}
		// As the README has it: no Content-Type (curl sends its form default).
		out, err := exec.Command(curl, "-sS", "-X", "POST",
			"--data-binary", "from curl", fmt.Sprintf("%s/produce?topic=%s&partition=0", url, topic)).Output()
		if err != nil {
			t.Fatalf("curl produce: %v", err)
		}
		var got struct {
			Offset int64 `json:"offset"`
		}
		if err := json.Unmarshal(out, &got); err != nil || got.Offset != 104 {
			t.Fatalf("curl produce answered %q (%v)", out, err)
		}
		out, err = exec.Command(curl, "-sS", "-f", fmt.Sprintf("%s/fetch?topic=%s&partition=0&offset=104", url, topic)).Output()
		if err != nil || string(out) != "from curl" {
			t.Fatalf("curl fetch: %q %v", out, err)
		}
	})
}

func TestHTTPRESTConsumerGroupWithKafka(t *testing.T) {
	b := httpBroker(t, nil)
	url := b.httpURL()
	topic := uniqueTopic(t)
	group := topic + "-g"
	ctx := testCtx(t, 2*time.Minute)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	const (
		v2     = "application/vnd.kafka.v2+json"
		binary = "application/vnd.kafka.binary.v2+json"
	)
	// REST produce, 10 records to each partition.
	b64 := base64.StdEncoding.EncodeToString
	for p := range 2 {
		var rs []string
		for i := range 10 {
			rs = append(rs, fmt.Sprintf(`{"value":%q}`, b64(fmt.Appendf(nil, "p%d-%d", p, i))))
		}
		r := httpDo(t, "POST", fmt.Sprintf("%s/topics/%s/partitions/%d", url, topic, p), binary, []byte(`{"records":[`+strings.Join(rs, ",")+`]}`))
		var out struct {
			Offsets []struct {
				Partition int32 `json:"partition"`
				Offset    int64 `json:"offset"`
			} `json:"offsets"`
		}
		r.decode(t, &out)
		if r.status != 200 || len(out.Offsets) != 10 || out.Offsets[9].Offset != 9 || out.Offsets[0].Partition != int32(p) {
			t.Fatalf("REST produce: %d %s", r.status, r.body)
		}
	}
	var topics []string
	httpDo(t, "GET", url+"/topics", "", nil).decode(t, &topics)
	found := false
	for _, tp := range topics {
		found = found || tp == topic
	}
	if !found {
		t.Fatalf("GET /topics: %v lacks %s", topics, topic)
	}
	var parts []struct {
		Partition int32 `json:"partition"`
	}
	httpDo(t, "GET", url+"/topics/"+topic+"/partitions", "", nil).decode(t, &parts)
	if len(parts) != 2 {
		t.Fatalf("partitions: %v", parts)
	}

	// An HTTP consumer instance in the group.
	r := httpDo(t, "POST", url+"/consumers/"+group, v2, []byte(`{"name":"h1","format":"binary","auto.offset.reset":"earliest","auto.commit.enable":"false"}`))
	var created struct {
		ID   string `json:"instance_id"`
		Base string `json:"base_uri"`
	}
	r.decode(t, &created)
	if r.status != 200 || created.ID != "h1" {
		t.Fatalf("create consumer: %d %s", r.status, r.body)
	}
	inst := created.Base
	if r := httpDo(t, "POST", inst+"/subscription", v2, []byte(fmt.Sprintf(`{"topics":[%q]}`, topic))); r.status != 204 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}
	type rec struct {
		Value     []byte `json:"value"`
		Partition int32  `json:"partition"`
		Offset    int64  `json:"offset"`
	}
	poll := func() []rec {
		var out []rec
		r := httpDo(t, "GET", inst+"/records?timeout=300", "", nil, "Accept", binary)
		r.decode(t, &out)
		if r.status != 200 {
			t.Fatalf("records: %d %s", r.status, r.body)
		}
		return out
	}
	var got []rec
	for deadline := time.Now().Add(30 * time.Second); len(got) < 20 && time.Now().Before(deadline); {
		got = append(got, poll()...)
	}
	if len(got) != 20 {
		t.Fatalf("the HTTP consumer read %d of 20 records", len(got))
	}
	// Offsets committed over HTTP are the group's, as kadm sees them.
	if r := httpDo(t, "POST", inst+"/offsets", v2, []byte(fmt.Sprintf(`{"offsets":[{"topic":%q,"partition":0,"offset":4},{"topic":%q,"partition":1,"offset":6}]}`, topic, topic))); r.status != 204 {
		t.Fatalf("commit: %d %s", r.status, r.body)
	}
	fo, err := adm.FetchOffsets(ctx, group)
	if err != nil || fo.Error() != nil {
		t.Fatal(err, fo.Error())
	}
	if o0, _ := fo.Lookup(topic, 0); o0.At != 5 {
		t.Fatalf("committed offset of partition 0: %d, want 5 (after the last consumed, 4)", o0.At)
	}
	if o1, _ := fo.Lookup(topic, 1); o1.At != 7 {
		t.Fatalf("committed offset of partition 1: %d, want 7", o1.At)
	}

	// A Kafka consumer joins the group: one partition each, and it
	// resumes its partition from the offset committed over HTTP.
	kc, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	var kafkaGot []*kgo.Record
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		kafkaGot = append(kafkaGot, kc.PollFetches(pctx).Records()...)
		cancel()
		poll() // the HTTP member polls too (it rejoins as the group rebalances)
		dg, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		g := dg[group]
		each := 0
		for _, m := range g.Members {
			if ca, ok := m.Assigned.AsConsumer(); ok {
				for _, tp := range ca.Topics {
					if len(tp.Partitions) == 1 {
						each++
					}
				}
			}
		}
		if g.State == "Stable" && len(g.Members) == 2 && each == 2 && len(kafkaGot) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s: %s with %d members (%d with one partition), the Kafka consumer read %d records", group, g.State, len(g.Members), each, len(kafkaGot))
		}
	}
	for _, r := range kafkaGot {
		if want := map[int32]int64{0: 5, 1: 7}[r.Partition]; r.Offset < want {
			t.Fatalf("the Kafka consumer read %d/%d, before the offset committed over HTTP (%d)", r.Partition, r.Offset, want)
		}
	}
	if r := httpDo(t, "DELETE", inst, "", nil); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	wantHTTPError(t, httpDo(t, "GET", inst+"/records", "", nil, "Accept", binary), 404, 40403)
}

func TestHTTPColdFetch(t *testing.T) {
	t.Setenv("SYNAPSE_MAINTENANCE_INTERVAL", "50ms") // upload at once
	b := httpBroker(t, nil)
	url := b.httpURL()
	topic := uniqueTopic(t)
	ctx := testCtx(t, 2*time.Minute)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cfg := map[string]*string{"segment.bytes": strPtr("16384"), "local.retention.bytes": strPtr("0"), "retention.ms": strPtr("-1")}
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, cfg, topic); err != nil {
		t.Fatal(err)
	}
	value := func(i int) []byte { return bytes.Repeat(fmt.Appendf(nil, "%04d", i), 250) } // 1000 bytes
	for i := range 100 {
		if r := httpDo(t, "POST", fmt.Sprintf("%s/produce?topic=%s&partition=0", url, topic), "application/octet-stream", value(i)); r.status != 200 {
			t.Fatalf("produce %d: %d %s", i, r.status, r.body)
		}
	}
	// Wait until the first segments left the local disk for the tier.
	local := filepath.Join(b.dataDir, topic+"-0")
	for deadline := time.Now().Add(60 * time.Second); ; {
		if countFiles(filepath.Join(b.dataDir, "tier"), ".log") > 0 && !hasFile(local, "00000000000000000000.log") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("offset 0's segment never left %s (%d segments in the tier)", local, countFiles(filepath.Join(b.dataDir, "tier"), ".log"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, i := range []int{0, 1, 37} {
		r := httpDo(t, "GET", fmt.Sprintf("%s/fetch?topic=%s&partition=0&offset=%d", url, topic, i), "", nil)
		if r.status != 200 || !bytes.Equal(r.body, value(i)) {
			t.Fatalf("cold fetch of %d: %d %q", i, r.status, r.body[:min(len(r.body), 300)])
		}
	}
}

func hasFile(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

func TestHTTPBasicAuthAndACLs(t *testing.T) {
	sb := startSecureSynapse(t)
	sb.createUser(t, "carol", "carol-secret")
	url := sb.httpURL()
	topic := uniqueTopic(t)
	prod := fmt.Sprintf("%s/produce?topic=%s&partition=0", url, topic)
	const oct = "application/octet-stream"

	r := httpDo(t, "POST", prod, oct, []byte("v"))
	wantHTTPError(t, r, 401, 40101)
	if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Basic") {
		t.Fatalf("401 without WWW-Authenticate: %v", r.header)
	}
	// A wrong password is answered after the broker's failed-login delay
	// (as a failed SASL exchange is).
	t0 := time.Now()
	wantHTTPError(t, httpDo(t, "POST", prod, oct, []byte("v"), "Authorization", "carol:wrong"), 401, 40101)
	if d := time.Since(t0); d < 10*time.Millisecond {
		t.Fatalf("a failed HTTP Basic login answered after %s, before the harness's 10ms --sasl-failed-auth-delay", d)
	}
	// Logged in, but no ACL: the broker's answer, 403.
	wantHTTPError(t, httpDo(t, "POST", prod, oct, []byte("v"), "Authorization", "carol:carol-secret"), 403, 40301)
	// /healthz stays open.
	if r := httpDo(t, "GET", url+"/healthz", "", nil); r.status != 200 {
		t.Fatalf("/healthz: %d", r.status)
	}
	// The super user may (HTTP produce creates no topic: a Kafka client
	// does); then carol with her ACLs.
	wantHTTPError(t, httpDo(t, "POST", prod, oct, []byte("by admin"), "Authorization", "admin:"+secureAdminPassword), 404, 40401)
	if _, err := sb.adm(t).CreateTopic(testCtx(t, 30*time.Second), 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	if r := httpDo(t, "POST", prod, oct, []byte("by admin"), "Authorization", "admin:"+secureAdminPassword); r.status != 200 {
		t.Fatalf("admin produce: %d %s", r.status, r.body)
	}
	wantHTTPError(t, httpDo(t, "GET", fmt.Sprintf("%s/fetch?topic=%s&partition=0&offset=0", url, topic), "", nil, "Authorization", "carol:carol-secret"), 403, 40301)
	var topics []string
	httpDo(t, "GET", url+"/topics", "", nil, "Authorization", "carol:carol-secret").decode(t, &topics)
	for _, tp := range topics {
		if tp == topic {
			t.Fatalf("GET /topics shows carol %s, which she may not describe", topic)
		}
	}
	sb.grantClient(t, "User:carol", topic, "")
	if r := httpDo(t, "POST", prod, oct, []byte("by carol"), "Authorization", "carol:carol-secret"); r.status != 200 {
		t.Fatalf("carol's produce with WRITE: %d %s", r.status, r.body)
	}
	r = httpDo(t, "GET", fmt.Sprintf("%s/fetch?topic=%s&partition=0&offset=1", url, topic), "", nil, "Authorization", "carol:carol-secret")
	if r.status != 200 || string(r.body) != "by carol" {
		t.Fatalf("carol's fetch with READ: %d %q", r.status, r.body)
	}
	// A group she has no ACL for: her consumer instance is refused by
	// the broker when it joins.
	v2 := "application/vnd.kafka.v2+json"
	group := topic + "-denied"
	if r := httpDo(t, "POST", url+"/consumers/"+group, v2, []byte(`{"name":"c","auto.offset.reset":"earliest"}`), "Authorization", "carol:carol-secret"); r.status != 200 {
		t.Fatalf("create consumer: %d %s", r.status, r.body)
	}
	inst := url + "/consumers/" + group + "/instances/c"
	// Another user does not see carol's instance.
	wantHTTPError(t, httpDo(t, "GET", inst+"/subscription", "", nil, "Authorization", "admin:"+secureAdminPassword), 404, 40403)
	if r := httpDo(t, "POST", inst+"/subscription", v2, []byte(fmt.Sprintf(`{"topics":[%q]}`, topic)), "Authorization", "carol:carol-secret"); r.status != 204 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}
	var last httpResp
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		last = httpDo(t, "GET", inst+"/records?timeout=500", "", nil, "Authorization", "carol:carol-secret")
		if last.status == 403 {
			break
		}
	}
	wantHTTPError(t, last, 403, 40302)
}

// The consumer flows the review found broken, on a real binary: seek
// before the first assignment (create, subscribe, seek, poll), the
// auto-commit of what was returned when the instance is deleted, a REST
// produce where one partition fails, and a null value of GET /fetch.
func TestHTTPRESTSeekCommitPartial(t *testing.T) {
	b := httpBroker(t, nil)
	url := b.httpURL()
	topic := uniqueTopic(t)
	ctx := testCtx(t, time.Minute)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	mb := "2000"
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 2, 1, map[string]*string{"max.message.bytes": &mb}, topic); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: fmt.Appendf(nil, "v%d", i)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	const v2 = "application/vnd.kafka.v2+json"
	group := topic + "-g"
	if r := httpDo(t, "POST", url+"/consumers/"+group, v2, []byte(`{"name":"c","auto.offset.reset":"latest"}`)); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	inst := url + "/consumers/" + group + "/instances/c"
	if r := httpDo(t, "POST", inst+"/subscription", v2, fmt.Appendf(nil, `{"topics":[%q]}`, topic)); r.status != 204 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}
	if r := httpDo(t, "POST", inst+"/positions", v2, fmt.Appendf(nil, `{"offsets":[{"topic":%q,"partition":0,"offset":2}]}`, topic)); r.status != 204 {
		t.Fatalf("seek: %d %s", r.status, r.body)
	}
	type rec struct {
		Partition int32 `json:"partition"`
		Offset    int64 `json:"offset"`
	}
	var got []rec
	for deadline := time.Now().Add(20 * time.Second); len(got) < 4 && time.Now().Before(deadline); {
		var batch []rec
		r := httpDo(t, "GET", inst+"/records?timeout=500", "", nil, "Accept", "application/vnd.kafka.binary.v2+json")
		r.decode(t, &batch)
		got = append(got, batch...)
	}
	if len(got) != 4 || got[0].Offset != 2 {
		t.Fatalf("after a seek to 2 before the assignment (auto.offset.reset latest): %+v", got)
	}
	// Deleted right after: auto-commit commits the records returned.
	if r := httpDo(t, "DELETE", inst, "", nil); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	fo, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil || fo.Error() != nil {
		t.Fatal(err, fo.Error())
	}
	if o, _ := fo.Lookup(topic, 0); o.At != 6 {
		t.Fatalf("committed after DELETE: %d, want 6", o.At)
	}

	// One partition refuses its batch (too large), the other writes: 200,
	// the refused records with error_code and a null offset.
	small := base64.StdEncoding.EncodeToString([]byte("s"))
	big := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), 4000))
	r := httpDo(t, "POST", url+"/topics/"+topic, "application/vnd.kafka.binary.v2+json",
		fmt.Appendf(nil, `{"records":[{"value":%q,"partition":0},{"value":%q,"partition":1}]}`, small, big))
	var out struct {
		Offsets []struct {
			Partition int32   `json:"partition"`
			Offset    *int64  `json:"offset"`
			ErrorCode *int    `json:"error_code"`
			Error     *string `json:"error"`
		} `json:"offsets"`
	}
	r.decode(t, &out)
	if r.status != 200 || len(out.Offsets) != 2 || out.Offsets[0].Offset == nil || *out.Offsets[0].Offset != 6 ||
		out.Offsets[1].Offset != nil || out.Offsets[1].ErrorCode == nil || out.Offsets[1].Error == nil {
		t.Fatalf("partial produce: %d %s", r.status, r.body)
	}
	wantHTTPError(t, httpDo(t, "POST", url+"/topics/"+topic, "application/vnd.kafka.binary.v2+json",
		fmt.Appendf(nil, `{"records":[{"value":%q,"partition":0},{"value":%q,"partition":9}]}`, small, small)), 404, 40402)

	// A null value: an empty body and X-Kafka-Value-Null.
	if r := httpDo(t, "POST", fmt.Sprintf("%s/produce/batch?topic=%s&partition=0", url, topic), "application/x-synapse-records", frame(nil, nil, nil)); r.status != 200 {
		t.Fatalf("produce a null value: %d %s", r.status, r.body)
	}
	r = httpDo(t, "GET", fmt.Sprintf("%s/fetch?topic=%s&partition=0&offset=7", url, topic), "", nil)
	if r.status != 200 || len(r.body) != 0 || r.header.Get("X-Kafka-Value-Null") != "true" {
		t.Fatalf("fetch of a null value: %d %q %v", r.status, r.body, r.header)
	}
}
