package main

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The demo runs every step on a real broker, the figures it prints come from
// the broker (a cold read costs GETs, the hot read and the cached one none),
// and it leaves nothing behind.
func TestDemo(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, stderr, err := run(t, ctx, "demo", "--log-level", "warn", "--records", "1000")
	if err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	steps := []string{
		"1. Create a topic with tiny segments",
		"2. Append 1000 records",
		"3. Segments rolled",
		"4. Segments uploaded to the tier",
		"5. Local files released",
		"6. Hot read: offset 999, from local disk",
		"7. Cold read: offset 0, from the tier",
		"8. The same read again: from the cache",
		"Done",
	}
	at := 0
	for _, s := range steps {
		i := strings.Index(out[at:], s)
		if i < 0 {
			t.Fatalf("step %q missing or out of order:\n%s", s, out)
		}
		at += i
	}
	rolled := regexp.MustCompile(`(\d+) segments sealed`).FindStringSubmatch(out)
	if n, _ := strconv.Atoi(rolled[1]); n < 5 {
		t.Fatalf("only %d segments rolled:\n%s", n, out)
	}
	gets := regexp.MustCompile(`object GETs: (\d+)`).FindAllStringSubmatch(out, -1)
	if len(gets) != 3 {
		t.Fatalf("%d reads reported GETs, want 3:\n%s", len(gets), out)
	}
	if gets[0][1] != "0" || gets[1][1] == "0" || gets[2][1] != "0" {
		t.Fatalf("GETs hot %s, cold %s, cached %s; want 0, >0, 0:\n%s", gets[0][1], gets[1][1], gets[2][1], out)
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		if strings.HasPrefix(e.Name(), "synapse-demo-") {
			t.Fatalf("the demo left %s behind", e.Name())
		}
	}
}

func TestDemoRefusesTooFewRecords(t *testing.T) {
	if _, _, err := run(t, context.Background(), "demo", "--records", "10"); err == nil {
		t.Fatal("demo with 10 records: no error")
	}
}
