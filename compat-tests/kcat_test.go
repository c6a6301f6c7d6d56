package compattests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// kcat (librdkafka's command-line client, Debian package kcat) driven as a
// subprocess: produce with -P (keys with -K, headers with -H, -Z for null
// keys and values, every codec), consume with -C -J, query offsets with -Q.
// The topic is auto-created by kcat's first produce (one partition).

func kcatPath(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"kcat", "kafkacat"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	skipUnlessRequired(t, "kcat is not installed: run compat-tests/install-deps.sh (Debian package kcat)")
	return ""
}

// kcatMsg is one record as kcat -P is told to send it and as it must come
// back.
type kcatMsg struct {
	key, value *string // nil = null
	headers    []string
	offset     int64
	window     [2]time.Time // the kcat -P run that sent it
}

func strp(s string) *string { return &s }

type kcat struct {
	bin   string
	addr  string
	topic string
	sent  []kcatMsg
}

func (k *kcat) run(t testing.TB, ctx context.Context, stdin []byte, args ...string) []byte {
	t.Helper()
	cmd := exec.CommandContext(ctx, k.bin, append([]string{"-b", k.addr, "-X", "log_level=3"}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kcat %s: %v\nstderr:\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// produce runs one kcat -P with the given codec and headers; lines are
// "key|value". With nulls (-Z) an empty key or value is sent as null.
func (k *kcat) produce(t testing.TB, ctx context.Context, codec string, nulls bool, headers []string, lines ...string) {
	t.Helper()
	args := []string{"-P", "-t", k.topic, "-p", "0", "-K", "|", "-X", "compression.codec=" + codec,
		"-X", "acks=all", "-X", "linger.ms=5"}
	if nulls {
		args = append(args, "-Z")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		args = append(args, "-H", headers[i]+"="+headers[i+1])
	}
	start := time.Now().Truncate(time.Millisecond)
	k.run(t, ctx, []byte(strings.Join(lines, "\n")+"\n"), args...)
	end := time.Now()
	for _, l := range lines {
		kv := strings.SplitN(l, "|", 2)
		m := kcatMsg{key: strp(kv[0]), value: strp(kv[1]), headers: headers, offset: int64(len(k.sent)), window: [2]time.Time{start, end}}
		if nulls && kv[0] == "" {
			m.key = nil
		}
		if nulls && kv[1] == "" {
			m.value = nil
		}
		k.sent = append(k.sent, m)
	}
	// Keep the runs' timestamps apart for the ListOffsets-by-time checks.
	time.Sleep(3 * time.Millisecond)
}

// produceAll sends one run per codec plus one run with -Z per codec, and the
// ~900 KB record once.
func (k *kcat) produceAll(t testing.TB, ctx context.Context, round int) {
	t.Helper()
	for _, codec := range codecs {
		tag := fmt.Sprintf("r%d-%s", round, codec)
		k.produce(t, ctx, codec, false,
			[]string{"codec", codec, "round", strconv.Itoa(round), "empty", "", "dup", "1", "dup", "2"},
			"key-"+tag+"-a|value "+tag+" a",
			"|value with empty key "+tag,
			"key-"+tag+"-c|",
			"key-"+tag+"-d|"+strings.Repeat("compressible "+tag+" ", 200))
		k.produce(t, ctx, codec, true, []string{"codec", codec, "nulls", "yes"},
			"|value with null key "+tag,
			"key-"+tag+"-null-value|",
			"|")
	}
	if round == 0 {
		big := make([]byte, bigValueSize)
		for i := range big {
			big[i] = 'a' + byte((i*7+i/13)%26)
		}
		k.produce(t, ctx, "lz4", false, []string{"big", "yes"}, "key-big|"+string(big))
	}
}

type kcatJSON struct {
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	TsType    string    `json:"tstype"`
	Ts        int64     `json:"ts"`
	Headers   []*string `json:"headers"`
	Key       *string   `json:"key"`
	Payload   *string   `json:"payload"`
}

// consumeCheck reads everything back with kcat -C -J and compares it with
// what was sent.
func (k *kcat) consumeCheck(t testing.TB, ctx context.Context) {
	t.Helper()
	out := k.run(t, ctx, nil, "-C", "-t", k.topic, "-p", "0", "-o", "beginning",
		"-c", strconv.Itoa(len(k.sent)), "-e", "-J", "-X", "fetch.wait.max.ms=250")
	var got []kcatJSON
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m kcatJSON
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("kcat -J line %q: %v", line, err)
		}
		got = append(got, m)
	}
	if len(got) != len(k.sent) {
		t.Errorf("consumed %d records, produced %d", len(got), len(k.sent))
	}
	for i := range min(len(got), len(k.sent)) {
		g, w := got[i], k.sent[i]
		if g.Offset != w.offset || g.Partition != 0 {
			t.Errorf("record #%d at p%d offset %d, want p0 offset %d", i, g.Partition, g.Offset, w.offset)
		}
		if !sameStrp(g.Key, w.key) {
			t.Errorf("offset %d: key %s, want %s", w.offset, showStrp(g.Key), showStrp(w.key))
		}
		if !sameStrp(g.Payload, w.value) {
			t.Errorf("offset %d: value %s, want %s", w.offset, showStrp(g.Payload), showStrp(w.value))
		}
		var hs []string
		for _, h := range g.Headers {
			if h == nil {
				hs = append(hs, "<null>")
			} else {
				hs = append(hs, *h)
			}
		}
		if strings.Join(hs, "\x00") != strings.Join(w.headers, "\x00") || len(hs) != len(w.headers) {
			t.Errorf("offset %d: headers %q, want %q", w.offset, hs, w.headers)
		}
		if g.TsType != "create" || g.Ts < w.window[0].UnixMilli() || g.Ts > w.window[1].UnixMilli() {
			t.Errorf("offset %d: timestamp %s %d outside the produce window [%d, %d]",
				w.offset, g.TsType, g.Ts, w.window[0].UnixMilli(), w.window[1].UnixMilli())
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// Remember what came back for the offset queries.
	for i := range k.sent {
		k.sent[i].window = [2]time.Time{time.UnixMilli(got[i].Ts), time.UnixMilli(got[i].Ts)}
	}
}

func sameStrp(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func showStrp(s *string) string {
	if s == nil {
		return "null"
	}
	if len(*s) > 40 {
		return fmt.Sprintf("%q...(%d bytes)", (*s)[:40], len(*s))
	}
	return strconv.Quote(*s)
}

func (k *kcat) query(t testing.TB, ctx context.Context, ts int64) int64 {
	t.Helper()
	out := strings.TrimSpace(string(k.run(t, ctx, nil, "-Q", "-t", fmt.Sprintf("%s:0:%d", k.topic, ts))))
	// "<topic> [0] offset N"
	i := strings.LastIndex(out, "offset ")
	if i < 0 {
		t.Fatalf("kcat -Q ts %d: unexpected output %q", ts, out)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(out[i+len("offset "):]), 10, 64)
	if err != nil {
		t.Fatalf("kcat -Q ts %d: output %q: %v", ts, out, err)
	}
	return n
}

func TestKcat(t *testing.T) {
	bin := kcatPath(t)
	b := newBroker(t)
	k := &kcat{bin: bin, addr: b.Addr(), topic: uniqueTopic(t)}

	ok := t.Run("roundtrip", func(t *testing.T) {
		ctx := testCtx(t, scenarioTimeout)
		k.produceAll(t, ctx, 0)
		k.consumeCheck(t, ctx)
	})
	if !ok {
		return
	}
	t.Run("list_offsets", func(t *testing.T) {
		ctx := testCtx(t, scenarioTimeout)
		n := int64(len(k.sent))
		if got := k.query(t, ctx, -2); got != 0 {
			t.Errorf("kcat -Q earliest: %d, want 0", got)
		}
		if got := k.query(t, ctx, -1); got != n {
			t.Errorf("kcat -Q latest: %d, want %d", got, n)
		}
		if got := k.query(t, ctx, k.sent[0].window[0].UnixMilli()-1000); got != 0 {
			t.Errorf("kcat -Q before the first record: %d, want 0", got)
		}
		if got := k.query(t, ctx, k.sent[n-1].window[0].UnixMilli()+1000); got != -1 {
			t.Errorf("kcat -Q after the last record: %d, want -1", got)
		}
		// The first record of each later run: its own timestamp, and 1 ms
		// after the previous run's last record, both find it.
		checked := 0
		for i := 1; i < len(k.sent) && checked < 4; i++ {
			prev, cur := k.sent[i-1].window[0].UnixMilli(), k.sent[i].window[0].UnixMilli()
			if cur <= prev {
				continue
			}
			checked++
			if got := k.query(t, ctx, cur); got != int64(i) {
				t.Errorf("kcat -Q ts %d (exact): %d, want %d", cur, got, i)
			}
			if got := k.query(t, ctx, prev+1); got != int64(i) {
				t.Errorf("kcat -Q ts %d (between): %d, want %d", prev+1, got, i)
			}
		}
		if checked == 0 {
			t.Errorf("no two records with increasing timestamps to query between")
		}
	})
	t.Run("restart", func(t *testing.T) {
		ctx := testCtx(t, 2*scenarioTimeout)
		b.Restart(t)
		k.produceAll(t, ctx, 1)
		k.consumeCheck(t, ctx)
	})
}
