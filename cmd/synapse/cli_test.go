package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// startCLIBroker runs a real `synapse serve` on a loopback port (stopped at
// the end of the test) and returns its address.
func startCLIBroker(t *testing.T, extra ...string) string {
	t.Helper()
	addr := freeAddr(t)
	args := append([]string{"--log-level", "warn", "serve", "--data-dir", t.TempDir(), "--listen", addr,
		"--http-listen", "", "--group-initial-rebalance-delay", "0"}, extra...)
	cancel, done := serveInBackground(t, args...)
	t.Cleanup(func() {
		cancel()
		if r := <-done; r.err != nil {
			t.Errorf("serve: %v\n%s", r.err, r.stderr)
		}
	})
	for range 400 {
		if nc, err := net.Dial("tcp", addr); err == nil {
			nc.Close()
			return addr
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("broker never listened on %s", addr)
	return ""
}

// cli runs the root command as main does: stdin, captured output and the
// exit status main would exit with.
func cli(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand()
	cmd.SetArgs(args)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := cmd.ExecuteContextC(ctx)
	return out.String(), errOut.String(), exitStatus(c, err)
}

// mustCLI is cli that wants exit status want.
func mustCLI(t *testing.T, want int, stdin string, args ...string) string {
	t.Helper()
	out, stderr, code := cli(t, stdin, args...)
	if code != want {
		t.Fatalf("synapse %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, stderr)
	}
	return out
}

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return v
}

// jsonLines decodes one JSON object a line.
func jsonLines[T any](t *testing.T, s string) []T {
	t.Helper()
	var out []T
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line != "" {
			out = append(out, decodeJSON[T](t, line))
		}
	}
	return out
}

func TestCLITopicCommands(t *testing.T) {
	addr := startCLIBroker(t)
	b := []string{"--brokers", addr}
	out := mustCLI(t, 0, "", append([]string{"topic", "create", "orders", "-p", "2", "-c", "retention.ms=3600000"}, b...)...)
	if !strings.Contains(out, "orders  created") {
		t.Errorf("create table:\n%s", out)
	}
	// Again: TOPIC_ALREADY_EXISTS is a failure, unless --if-not-exists.
	out = mustCLI(t, 1, "", append([]string{"topic", "create", "orders", "--format", "json"}, b...)...)
	if rs := decodeJSON[[]topicResult](t, out); len(rs) != 1 || !strings.Contains(rs[0].Error, "TOPIC_ALREADY_EXISTS") {
		t.Errorf("create twice: %+v", rs)
	}
	mustCLI(t, 0, "", append([]string{"topic", "create", "orders", "--if-not-exists"}, b...)...)
	mustCLI(t, 0, "", append([]string{"topic", "create", "events"}, b...)...)

	out = mustCLI(t, 0, "", append([]string{"topic", "list"}, b...)...)
	if !strings.Contains(out, "NAME    PARTITIONS  REPLICAS  INTERNAL\n") || !strings.Contains(out, "orders  2           1         false\n") {
		t.Errorf("list table:\n%s", out)
	}
	ls := decodeJSON[[]topicListEntry](t, mustCLI(t, 0, "", append([]string{"topic", "list", "--format", "json"}, b...)...))
	if len(ls) != 2 || ls[0].Name != "events" || ls[0].Partitions != 1 || ls[1].Name != "orders" || ls[1].Partitions != 2 || ls[1].Internal {
		t.Errorf("list json: %+v", ls)
	}

	mustCLI(t, 0, "a\nb\nc\n", append([]string{"produce", "orders", "-p", "1", "-q"}, b...)...)
	ds := decodeJSON[[]topicDescription](t, mustCLI(t, 0, "", append([]string{"topic", "describe", "orders", "--format", "json"}, b...)...))
	if len(ds) != 1 || len(ds[0].Partitions) != 2 {
		t.Fatalf("describe json: %+v", ds)
	}
	if p := ds[0].Partitions[1]; p.Partition != 1 || p.Leader != 0 || p.LogStart != 0 || p.HighWatermark != 3 {
		t.Errorf("partition 1: %+v, want leader 0, log start 0, high watermark 3", p)
	}
	if p := ds[0].Partitions[0]; p.HighWatermark != 0 {
		t.Errorf("partition 0: %+v, want high watermark 0", p)
	}
	if cs := ds[0].Configs; len(cs) != 1 || cs[0].Name != "retention.ms" || *cs[0].Value != "3600000" || cs[0].Source != "topic" {
		t.Errorf("non-default configs: %+v", cs)
	}
	out = mustCLI(t, 0, "", append([]string{"topic", "describe", "orders"}, b...)...)
	for _, want := range []string{"PARTITION  LEADER  EPOCH  REPLICAS  LOG-START  HIGH-WATERMARK", "1          0       0      [0]       0          3", "retention.ms  3600000  topic"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe table lacks %q:\n%s", want, out)
		}
	}
	mustCLI(t, 1, "", append([]string{"topic", "describe", "nope"}, b...)...)

	mustCLI(t, 0, "", append([]string{"topic", "alter-config", "orders", "--set", "cleanup.policy=compact", "--delete", "retention.ms"}, b...)...)
	ds = decodeJSON[[]topicDescription](t, mustCLI(t, 0, "", append([]string{"topic", "describe", "orders", "--format", "json"}, b...)...))
	if cs := ds[0].Configs; len(cs) != 1 || cs[0].Name != "cleanup.policy" || *cs[0].Value != "compact" {
		t.Errorf("configs after alter-config: %+v", cs)
	}
	mustCLI(t, 1, "", append([]string{"topic", "alter-config", "orders", "--set", "no.such.config=1"}, b...)...)
	mustCLI(t, 2, "", append([]string{"topic", "alter-config", "orders"}, b...)...)

	// --num adds (rpk), --total sets the count; fewer is a Kafka error.
	out = mustCLI(t, 0, "", append([]string{"topic", "add-partitions", "orders", "--num", "1"}, b...)...)
	if !strings.Contains(out, "orders  3           ok") {
		t.Errorf("add-partitions --num 1:\n%s", out)
	}
	mustCLI(t, 0, "", append([]string{"topic", "add-partitions", "orders", "--total", "5"}, b...)...)
	out = mustCLI(t, 1, "", append([]string{"topic", "add-partitions", "orders", "--total", "2"}, b...)...)
	if !strings.Contains(out, "INVALID_PARTITIONS") || !strings.Contains(out, "orders  5") {
		t.Errorf("add-partitions --total 2:\n%s", out)
	}
	mustCLI(t, 2, "", append([]string{"topic", "add-partitions", "orders", "--num", "1", "--total", "9"}, b...)...)

	out = mustCLI(t, 0, "", append([]string{"topic", "delete", "orders", "events"}, b...)...)
	if !strings.Contains(out, "orders  deleted") || !strings.Contains(out, "events  deleted") {
		t.Errorf("delete:\n%s", out)
	}
	mustCLI(t, 1, "", append([]string{"topic", "delete", "orders"}, b...)...)
	mustCLI(t, 0, "", append([]string{"topic", "delete", "orders", "--if-exists"}, b...)...)
	if ls := decodeJSON[[]topicListEntry](t, mustCLI(t, 0, "", append([]string{"topic", "list", "--format", "json"}, b...)...)); len(ls) != 0 {
		t.Errorf("list after delete: %+v", ls)
	}
}

func TestCLIExitCodes(t *testing.T) {
	if got := exitStatus(nil, nil); got != 0 {
		t.Errorf("exitStatus(nil) = %d", got)
	}
	dead := freeAddr(t) // nobody listens there
	for _, c := range []struct {
		want int
		args []string
	}{
		{2, []string{"topic", "bogus"}},
		{2, []string{"bogus"}},
		{2, []string{"topic", "list", "--bogus"}},
		{2, []string{"topic", "create"}},
		{2, []string{"topic", "list", "extra"}},
		{2, []string{"topic", "list", "--format", "yaml"}},
		{2, []string{"consume", "t", "-o", "sometime"}},
		{2, []string{"consume", "t", "-f", "%v", "--format", "json"}},
		{2, []string{"consume", "t", "-f", "%q"}},
		{2, []string{"consume", "t", "-e", "--to", "5"}},
		{2, []string{"consume", "t", "-g", "g", "-p", "0"}},
		{2, []string{"produce", "t", "-K", ":", "-k", "key"}},
		{2, []string{"produce", "t", "--acks", "2"}},
		{2, []string{"produce", "t", "-f", "%k%v"}},
		{2, []string{"group", "seek", "g"}},
		{2, []string{"cluster", "info", "--sasl-mechanism", "PLAIN"}},
		{2, []string{"cluster", "info", "--sasl-mechanism", "GSSAPI", "--sasl-user", "u", "--sasl-password", "p"}},
		{2, []string{"cluster", "info", "--tls-cert", "c.pem"}},
		{2, []string{"topic", "list", "--log-level", "loud"}},
		{1, []string{"cluster", "info", "--brokers", dead, "--timeout", "2s"}},
		{1, []string{"topic", "list", "--brokers", dead, "--timeout", "2s"}},
	} {
		if c.want == 2 {
			c.args = append(c.args, "--brokers", dead)
		}
		out, stderr, code := cli(t, "", c.args...)
		if code != c.want {
			t.Errorf("synapse %s: exit %d, want %d\n%s%s", strings.Join(c.args, " "), code, c.want, out, stderr)
		}
		if code != 0 && !strings.Contains(stderr, "Error:") {
			t.Errorf("synapse %s: no error on stderr: %q", strings.Join(c.args, " "), stderr)
		}
	}
	// Help is no failure.
	mustCLI(t, 0, "", "topic")
	mustCLI(t, 0, "", "topic", "create", "--help")
	// A bad environment twin is a usage error too.
	t.Setenv("SYNAPSE_LOG_LEVEL", "loud")
	if _, stderr, code := cli(t, "", "topic", "list", "--brokers", dead); code != 2 {
		t.Errorf("a bad SYNAPSE_LOG_LEVEL: exit %d, want 2\n%s", code, stderr)
	}
}

func TestCLIProduceConsumeRoundTrip(t *testing.T) {
	addr := startCLIBroker(t)
	t.Setenv("SYNAPSE_BROKERS", addr) // the env twin of --brokers
	mustCLI(t, 0, "", "topic", "create", "rt", "-p", "2")

	// kcat's -K: key and value split at the first ':', headers from -H.
	out := mustCLI(t, 0, "k1:v1\nk2:v:2\n\n", "produce", "rt", "-K:", "-H", "src=cli", "-H", "n=1", "-p", "1")
	if want := "Produced to rt partition 1 at offset 0 with timestamp "; !strings.HasPrefix(out, want) || strings.Count(out, "\n") != 3 {
		t.Errorf("produce output:\n%s", out)
	}
	// rpk's -f: a format with the partition, JSON output.
	out = mustCLI(t, 0, "0 a b\n0 c\n", "produce", "rt", "-f", `%p %v\n`, "-k", "fixed", "--format", "json")
	prs := jsonLines[producedRecord](t, out)
	if len(prs) != 2 || prs[0].Partition != 0 || prs[0].Offset != 0 || prs[1].Offset != 1 || prs[0].Error != "" {
		t.Errorf("produce json: %+v", prs)
	}
	// A custom record delimiter and a last record without it.
	mustCLI(t, 0, "x|y", "produce", "rt", "-D", "|", "-p", "0", "-q")

	out = mustCLI(t, 0, "", "consume", "rt", "-e", "-f", `%t|%p|%o|%k|%v|%h|%K|%S\n`)
	want := "rt|0|0|fixed|a b||5|3\nrt|0|1|fixed|c||5|1\nrt|0|2||x||0|1\nrt|0|3||y||0|1\n" +
		"rt|1|0|k1|v1|src=cli,n=1|2|2\nrt|1|1|k2|v:2|src=cli,n=1|2|3\nrt|1|2|||src=cli,n=1|0|0\n"
	if out != want {
		t.Errorf("consume -f:\n%s\nwant:\n%s", out, want)
	}
	// kcat's default: values and newlines.
	if out := mustCLI(t, 0, "", "consume", "rt", "-e", "-p", "1"); out != "v1\nv:2\n\n" {
		t.Errorf("consume -p 1: %q", out)
	}
	recs := jsonLines[jsonRecord](t, mustCLI(t, 0, "", "consume", "rt", "-e", "--format", "json", "-p", "1"))
	if len(recs) != 3 || *recs[0].Key != "k1" || *recs[0].Value != "v1" || len(recs[0].Headers) != 2 ||
		recs[0].Headers[0].Key != "src" || *recs[0].Headers[0].Value != "cli" || recs[0].Timestamp < time.Now().Add(-time.Hour).UnixMilli() {
		t.Errorf("consume json: %+v", recs)
	}
	if recs[2].Key != nil || *recs[2].Value != "" {
		t.Errorf("an empty line is a record with an empty value and no key: %+v", recs[2])
	}
	// -o N, -o -N (before the end), --to N (exclusive), -n.
	if out := mustCLI(t, 0, "", "consume", "rt", "-p", "0", "-o", "1", "-e"); out != "c\nx\ny\n" {
		t.Errorf("-o 1: %q", out)
	}
	if out := mustCLI(t, 0, "", "consume", "rt", "-p", "0", "-o", "-2", "-e"); out != "x\ny\n" {
		t.Errorf("-o -2: %q", out)
	}
	if out := mustCLI(t, 0, "", "consume", "rt", "-p", "0", "--to", "2"); out != "a b\nc\n" {
		t.Errorf("--to 2: %q", out)
	}
	if out := mustCLI(t, 0, "", "consume", "rt", "-p", "0", "-n", "3"); out != "a b\nc\nx\n" {
		t.Errorf("-n 3: %q", out)
	}
	// From the end with -e: nothing, at once.
	if out := mustCLI(t, 0, "", "consume", "rt", "-o", "end", "-e"); out != "" {
		t.Errorf("-o end -e: %q", out)
	}
	// A record that cannot be produced fails the command.
	_, stderr, code := cli(t, "v\n", "produce", "rt", "-p", "7", "--timeout", "5s")
	if code != 1 || !strings.Contains(stderr, "1 of 1 records not produced") {
		t.Errorf("produce to a missing partition: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := cli(t, "", "consume", "nope", "-e"); code != 1 || !strings.Contains(stderr, "UNKNOWN_TOPIC_OR_PARTITION") {
		t.Errorf("consume of a missing topic: exit %d\n%s", code, stderr)
	}
}

func TestCLIConsumeByTimestamp(t *testing.T) {
	addr := startCLIBroker(t)
	b := []string{"--brokers", addr}
	mustCLI(t, 0, "", append([]string{"topic", "create", "ts", "-p", "1"}, b...)...)
	var in strings.Builder
	for i := range 5 {
		in.WriteString(strings.Join([]string{itoa(testTimestamp + 1000*int64(i)), "v" + itoa(int64(i))}, " ") + "\n")
	}
	mustCLI(t, 0, in.String(), append([]string{"produce", "ts", "-f", `%T %v\n`, "-q"}, b...)...)
	out := mustCLI(t, 0, "", append([]string{"consume", "ts", "-e", "-f", `%o %T %v\n`}, b...)...)
	if !strings.HasPrefix(out, "0 1700000000000 v0\n") || !strings.HasSuffix(out, "4 1700000004000 v4\n") {
		t.Fatalf("timestamps not kept:\n%s", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "s@1700000001500", "-e"}, "v2\nv3\nv4\n"},
		{[]string{"-o", "@1700000002000", "-e"}, "v2\nv3\nv4\n"},
		{[]string{"-o", "s@1700000001000", "-o", "e@1700000003000"}, "v1\nv2\n"},
		{[]string{"--to", "@1700000001000"}, "v0\n"},
		{[]string{"-o", "@1800000000000", "-e"}, ""}, // after every record: the end
	} {
		if out := mustCLI(t, 0, "", append(append([]string{"consume", "ts"}, c.args...), b...)...); out != c.want {
			t.Errorf("consume %v: %q, want %q", c.args, out, c.want)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestCLIGroupLagSeekDelete(t *testing.T) {
	addr := startCLIBroker(t)
	b := []string{"--brokers", addr}
	mustCLI(t, 0, "", append([]string{"topic", "create", "work", "-p", "1"}, b...)...)
	var in strings.Builder
	for i := range 10 {
		in.WriteString(itoa(testTimestamp+1000*int64(i)) + " r" + itoa(int64(i)) + "\n")
	}
	mustCLI(t, 0, in.String(), append([]string{"produce", "work", "-f", `%T %v\n`, "-q"}, b...)...)

	// A kgo group consumer reads and commits 4 records and stays a member.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("work"),
		kgo.ClientID("kgo-test"), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for len(recs) < 4 {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, fs.Records()...)
	}
	if err := cl.CommitRecords(ctx, recs[3]); err != nil {
		t.Fatal(err)
	}
	ds := decodeJSON[[]groupDescription](t, mustCLI(t, 0, "", append([]string{"group", "describe", "billing", "--format", "json"}, b...)...))
	if len(ds) != 1 {
		t.Fatalf("describe: %+v", ds)
	}
	d := ds[0]
	if d.State != "Stable" || len(d.Members) != 1 || d.Members[0].ClientID != "kgo-test" || len(d.Members[0].Assignments["work"]) != 1 {
		t.Errorf("group: %+v", d)
	}
	if len(d.Partitions) != 1 || *d.Partitions[0].Committed != 4 || d.Partitions[0].LogEnd != 10 || d.Partitions[0].Lag != 6 ||
		d.Partitions[0].MemberID != d.Members[0].MemberID || d.TotalLag != 6 {
		t.Errorf("lag: %+v", d.Partitions)
	}
	out := mustCLI(t, 0, "", append([]string{"group", "describe", "billing"}, b...)...)
	for _, want := range []string{"STATE        Stable", "TOTAL-LAG    6", "kgo-test", "work[0]", "work   0          4               0          10       6"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe table lacks %q:\n%s", want, out)
		}
	}
	out = mustCLI(t, 0, "", append([]string{"group", "list"}, b...)...)
	if !strings.Contains(out, "billing  Stable  consumer") {
		t.Errorf("group list:\n%s", out)
	}
	// Kafka's rule: no seek while the group has members.
	_, stderr, code := cli(t, "", append([]string{"group", "seek", "billing", "--to", "start"}, b...)...)
	if code != 1 || !strings.Contains(stderr, "empty group") || !strings.Contains(stderr, "NON_EMPTY_GROUP") {
		t.Errorf("seek of a live group: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := cli(t, "", append([]string{"group", "delete", "billing"}, b...)...); code != 1 {
		t.Errorf("delete of a live group: exit %d\n%s", code, stderr)
	}
	cl.Close() // leaves the group

	seek := func(to string, want int64) {
		t.Helper()
		rs := decodeJSON[[]seekResult](t, mustCLI(t, 0, "", append([]string{"group", "seek", "billing", "--to", to, "--format", "json"}, b...)...))
		if len(rs) != 1 || rs[0].New != want || rs[0].Error != "" {
			t.Fatalf("seek --to %s: %+v, want %d", to, rs, want)
		}
		ds := decodeJSON[[]groupDescription](t, mustCLI(t, 0, "", append([]string{"group", "describe", "billing", "--format", "json"}, b...)...))
		if p := ds[0].Partitions[0]; *p.Committed != want || p.Lag != 10-want || ds[0].State != "Empty" {
			t.Fatalf("after seek --to %s: %+v", to, ds[0])
		}
	}
	seek("start", 0)
	seek("7", 7)
	seek("-3", 7)
	seek("@1700000002500", 3)
	seek("end", 10)
	out = mustCLI(t, 0, "", append([]string{"group", "seek", "billing", "--to", "1", "--dry-run"}, b...)...)
	if !strings.Contains(out, "work   0          10          1") || !strings.Contains(out, "dry run") {
		t.Errorf("dry run:\n%s", out)
	}
	seek("end", 10) // the dry run committed nothing

	// consume -g reads from the commit (the group's, not -o) and commits.
	seek("6", 6)
	if out := mustCLI(t, 0, "", append([]string{"consume", "work", "-g", "billing", "-n", "2", "-o", "start"}, b...)...); out != "r6\nr7\n" {
		t.Errorf("consume -g: %q", out)
	}
	ds = decodeJSON[[]groupDescription](t, mustCLI(t, 0, "", append([]string{"group", "describe", "billing", "--format", "json"}, b...)...))
	if p := ds[0].Partitions[0]; *p.Committed != 8 || p.Lag != 2 {
		t.Errorf("after consume -g -n 2: %+v", p)
	}
	// A new group starts where -o says; -e stops at the end.
	if out := mustCLI(t, 0, "", append([]string{"consume", "work", "-g", "fresh", "-o", "-2", "-e"}, b...)...); out != "r8\nr9\n" {
		t.Errorf("consume -g fresh -o -2 -e: %q", out)
	}
	// A group without offsets: seek needs --topics.
	mustCLI(t, 2, "", append([]string{"group", "seek", "nobody", "--to", "start"}, b...)...)
	mustCLI(t, 0, "", append([]string{"group", "seek", "nobody", "--to", "start", "--topics", "work"}, b...)...)

	out = mustCLI(t, 0, "", append([]string{"group", "delete", "billing", "fresh"}, b...)...)
	if !strings.Contains(out, "billing  deleted") {
		t.Errorf("group delete:\n%s", out)
	}
	if _, stderr, code := cli(t, "", append([]string{"group", "describe", "billing"}, b...)...); code != 1 || !strings.Contains(stderr, "does not exist") {
		t.Errorf("describe of a deleted group: exit %d\n%s", code, stderr)
	}
	mustCLI(t, 1, "", append([]string{"group", "delete", "billing"}, b...)...)
	ls := decodeJSON[[]groupListEntry](t, mustCLI(t, 0, "", append([]string{"group", "list", "--format", "json"}, b...)...))
	if len(ls) != 1 || ls[0].Group != "nobody" || ls[0].State != "Empty" {
		t.Errorf("group list json: %+v", ls)
	}
}

func TestCLIClusterInfo(t *testing.T) {
	addr := startCLIBroker(t)
	mustCLI(t, 0, "", "topic", "create", "a", "-p", "3", "--brokers", addr)
	info := decodeJSON[clusterInfo](t, mustCLI(t, 0, "", "cluster", "info", "--format", "json", "--brokers", addr))
	host, port, _ := net.SplitHostPort(addr)
	if info.ClusterID == "" || info.Controller != 0 || len(info.Brokers) != 1 || info.Topics != 1 || info.Partitions < 3 {
		t.Fatalf("cluster info: %+v", info)
	}
	if br := info.Brokers[0]; br.Host != host || itoa(int64(br.Port)) != port || !br.Controller || br.APIKeys < 20 {
		t.Errorf("broker: %+v", br)
	}
	out := mustCLI(t, 0, "", "cluster", "info", "--brokers", addr)
	if br := info.Brokers[0]; br.Leaders != 3 || br.Replicas != 3 || len(info.UnderReplicated) != 0 || len(info.Offline) != 0 {
		t.Errorf("leaders and replicas: %+v", info)
	}
	for _, want := range []string{"CLUSTER-ID        " + info.ClusterID, "CONTROLLER        0", "TOPICS            1 (and", "UNDER-REPLICATED  none", "BROKER  HOST", "LEADERS  REPLICAS"} {
		if !strings.Contains(out, want) {
			t.Errorf("cluster info lacks %q:\n%s", want, out)
		}
	}
}

// SASL: SCRAM with the password from SYNAPSE_SASL_PASSWORD; a wrong one
// fails with exit 1.
func TestCLISASL(t *testing.T) {
	t.Setenv("SYNAPSE_ADMIN_PASSWORD", "pw-admin")
	addr := freeAddr(t)
	cancel, done := serveInBackground(t, "--log-level", "warn", "serve", "--data-dir", t.TempDir(), "--http-listen", "",
		"--listeners", "SASL_PLAINTEXT://"+addr, "--sasl-mechanisms", "SCRAM-SHA-256,PLAIN")
	t.Cleanup(func() {
		cancel()
		if r := <-done; r.err != nil {
			t.Errorf("serve: %v\n%s", r.err, r.stderr)
		}
	})
	for range 400 {
		if nc, err := net.Dial("tcp", addr); err == nil {
			nc.Close()
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Setenv("SYNAPSE_SASL_PASSWORD", "pw-admin")
	for _, mech := range []string{"SCRAM-SHA-256", "PLAIN"} {
		mustCLI(t, 0, "", "topic", "create", "s-"+strings.ToLower(mech), "--brokers", addr, "--sasl-mechanism", mech, "--sasl-user", "admin")
	}
	mustCLI(t, 0, "hello\n", "produce", "s-plain", "--brokers", addr, "--sasl-mechanism", "PLAIN", "--sasl-user", "admin")
	if out := mustCLI(t, 0, "", "consume", "s-plain", "-e", "--brokers", addr, "--sasl-mechanism", "PLAIN", "--sasl-user", "admin"); out != "hello\n" {
		t.Errorf("consume over SASL: %q", out)
	}
	_, stderr, code := cli(t, "", "topic", "list", "--brokers", addr, "--sasl-mechanism", "SCRAM-SHA-256", "--sasl-user", "admin", "--sasl-password", "wrong", "--timeout", "5s")
	if code != 1 || !strings.Contains(stderr, "SASL_AUTHENTICATION_FAILED") {
		t.Errorf("wrong password: exit %d\n%s", code, stderr)
	}
}

// A topic written by a transactional producer ends with a COMMIT marker:
// consume -e reads up to it (no hang), prints only the records, and a group
// consume commits past the marker.
func TestCLIConsumeTransactionalTopic(t *testing.T) {
	addr := startCLIBroker(t)
	b := []string{"--brokers", addr}
	mustCLI(t, 0, "", append([]string{"topic", "create", "tx", "-p", "1"}, b...)...)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.TransactionalID("cli-tx"), kgo.DefaultProduceTopic("tx"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, commit := range []bool{true, false, true} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v" + itoa(int64(i)))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	// read_uncommitted (the default): the aborted record too, no markers.
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	go func() {
		out, _, code := cli(t, "", append([]string{"consume", "tx", "-e"}, b...)...)
		done <- result{out, code}
	}()
	select {
	case r := <-done:
		if r.code != 0 || r.out != "v0\nv1\nv2\n" {
			t.Fatalf("consume -e: exit %d, %q", r.code, r.out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("consume -e never reached the end of a transactional topic")
	}
	mustCLI(t, 0, "", append([]string{"consume", "tx", "-e", "-g", "g"}, b...)...)
	out := mustCLI(t, 0, "", append([]string{"group", "describe", "g", "--format", "json"}, b...)...)
	if !strings.Contains(out, `"lag": 0`) && !strings.Contains(out, `"lag":0`) {
		t.Fatalf("group lag after consuming to the end, past the marker:\n%s", out)
	}
}
