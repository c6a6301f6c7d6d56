package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/synapsebroker/synapse/log"
)

func TestInspectDump(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "orders-0")
	writePartition(t, dir, log.Config{}, 4)
	seg := segmentPath(dir, 0)

	out, _, err := run(t, context.Background(), "inspect", "dump", seg)
	if err != nil {
		t.Fatalf("dump: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 {
		t.Fatalf("got %d lines, want header + 4 batches + footer:\n%s", len(lines), out)
	}
	if lines[0] != "# "+seg {
		t.Errorf("header = %q", lines[0])
	}
	for i, want := range []string{
		"position=0 baseOffset=0 lastOffset=2 records=3 size=91 ",
		"baseTimestamp=1700000000000 baseTime=2023-11-14T22:13:20.000Z maxTimestamp=1700000000002 maxTime=2023-11-14T22:13:20.002Z",
		"codec=none timestampType=CreateTime transactional=false control=false producerId=-1 producerEpoch=-1 baseSequence=-1",
		"crc=0x",
	} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("batch line %d lacks %q:\n%s", i, want, lines[1])
		}
	}
	if !strings.HasPrefix(lines[4], "position=273 baseOffset=9 lastOffset=11 ") {
		t.Errorf("last batch line = %q", lines[4])
	}
	if lines[5] != "# 4 batches, 364 bytes" {
		t.Errorf("footer = %q", lines[5])
	}

	out, _, err = run(t, context.Background(), "inspect", "dump", "--json", seg)
	if err != nil {
		t.Fatalf("dump --json: %v", err)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("got %d JSON lines, want 4:\n%s", len(lines), out)
	}
	for i, line := range lines {
		var d dumpBatch
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			t.Fatalf("line %d: %v: %s", i, err, line)
		}
		if d.File != seg || d.BaseOffset != int64(3*i) || d.LastOffset != int64(3*i+2) || d.Records != 3 ||
			d.Size != 91 || d.Position != int64(91*i) || d.Codec != "none" || d.ProducerID != -1 {
			t.Errorf("line %d: %+v", i, d)
		}
		if want := formatMillis(testTimestamp + 1000*int64(i)); d.BaseTime != want {
			t.Errorf("line %d: baseTime %q, want %q", i, d.BaseTime, want)
		}
	}
}

func TestInspectDumpStopsAtTornTail(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "orders-0")
	writePartition(t, dir, log.Config{}, 3)
	seg := segmentPath(dir, 0)
	// A torn write: half a batch after the last good one.
	f, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(makeBatch(3, testTimestamp, 9)[:40]); err != nil {
		t.Fatal(err)
	}
	f.Close()

	out, _, err := run(t, context.Background(), "inspect", "dump", seg)
	if err == nil {
		t.Fatalf("dump of a torn segment succeeded:\n%s", out)
	}
	if !strings.Contains(err.Error(), seg) {
		t.Errorf("error %q does not name %s", err, seg)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	if len(lines) != 5 || !strings.Contains(last, "STOPPED at byte 273 of 313: ") {
		t.Errorf("want 3 batches then a stop line, got:\n%s", out)
	}

	out, _, err = run(t, context.Background(), "inspect", "dump", "--json", seg)
	if err == nil {
		t.Fatal("dump --json of a torn segment succeeded")
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	var stop dumpStop
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &stop); err != nil {
		t.Fatal(err)
	}
	if stop.File != seg || stop.StoppedAt != 273 || stop.Size != 313 || stop.Reason == "" {
		t.Errorf("stop line = %+v", stop)
	}
}

func TestInspectVerify(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "orders-0"), filepath.Join(root, "orders-1")
	writePartition(t, a, log.Config{SegmentBytes: 200}, 7) // 2 batches per segment
	writePartition(t, b, log.Config{}, 2)

	out, _, err := run(t, context.Background(), "inspect", "verify", a, b)
	if err != nil {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	for _, want := range []string{
		a + "\n  segments=4 batches=7 bytes=637 offsets=0..20 firstOffset=0 nextOffset=21\n  status: ok\n",
		b + "\n  segments=1 batches=2 bytes=182 offsets=0..5 firstOffset=0 nextOffset=6\n  status: ok\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	out, _, err = run(t, context.Background(), "inspect", "verify", "--json", a)
	if err != nil {
		t.Fatalf("verify --json: %v", err)
	}
	var res verifyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !res.OK || res.Segments != 4 || res.Batches != 7 || res.NextOffset != 21 || len(res.Damage) != 0 {
		t.Errorf("result = %+v", res)
	}
}

func TestInspectVerifyDamagedSealedSegment(t *testing.T) {
	root := t.TempDir()
	good, bad := filepath.Join(root, "orders-0"), filepath.Join(root, "orders-1")
	writePartition(t, good, log.Config{}, 2)
	writePartition(t, bad, log.Config{SegmentBytes: 200}, 7)

	// Flip a byte in the middle of the second batch of the first (sealed)
	// segment: inside the CRC-covered records.
	seg := segmentPath(bad, 0)
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	data[91+70] ^= 0xff
	if err := os.WriteFile(seg, data, 0o644); err != nil {
		t.Fatal(err)
	}

	out, _, err := run(t, context.Background(), "inspect", "verify", good, bad)
	if err == nil {
		t.Fatalf("verify of a damaged directory succeeded:\n%s", out)
	}
	if !strings.Contains(err.Error(), bad) || strings.Contains(err.Error(), good+",") {
		t.Errorf("error %q should name %s only", err, bad)
	}
	name := filepath.Base(seg)
	if !strings.Contains(out, "  damage: "+name+": bad data at byte 91 of 182") {
		t.Errorf("output does not name the damaged file %s:\n%s", name, out)
	}
	if !strings.Contains(out, "status: DAMAGED") || !strings.Contains(out, good+"\n  segments=1") {
		t.Errorf("unexpected output:\n%s", out)
	}

	out, _, err = run(t, context.Background(), "inspect", "verify", "--json", bad)
	if err == nil {
		t.Fatal("verify --json of a damaged directory succeeded")
	}
	var res verifyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.OK || len(res.Damage) == 0 || !strings.HasPrefix(res.Damage[0], name+":") {
		t.Errorf("result = %+v", res)
	}
}

func TestInspectVerifyMissingDir(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	out, _, err := run(t, context.Background(), "inspect", "verify", missing)
	if err == nil || !strings.Contains(out, "status: UNREADABLE") {
		t.Fatalf("err = %v, output:\n%s", err, out)
	}
}

func TestInspectNeedsArgs(t *testing.T) {
	for _, sub := range []string{"dump", "verify"} {
		if _, _, err := run(t, context.Background(), "inspect", sub); err == nil {
			t.Errorf("inspect %s without arguments succeeded", sub)
		}
	}
}

// TestInspectDumpAbortedIndex: a segment's aborted-transaction index is
// printed after its batches (text and JSON).
func TestInspectDumpAbortedIndex(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "orders-0")
	writePartition(t, dir, log.Config{}, 4)
	store := log.OpenStore(log.Options{})
	p, err := store.OpenPartition(dir, log.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AddAborted(log.AbortedTxn{ProducerID: 7, FirstOffset: 3, LastOffset: 9, LastStableOffset: 10}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	store.Close()
	seg := segmentPath(dir, 0)
	out, _, err := run(t, context.Background(), "inspect", "dump", seg)
	if err != nil {
		t.Fatalf("dump: %v\n%s", err, out)
	}
	if !strings.Contains(out, "aborted producer 7: offsets 3..9 (ABORT marker at 9), LSO after 10") {
		t.Fatalf("no aborted entry in:\n%s", out)
	}
	out, _, err = run(t, context.Background(), "inspect", "dump", "--json", seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var a dumpAbortedTxn
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &a); err != nil || a.ProducerID != 7 || a.FirstOffset != 3 || a.LastOffset != 9 {
		t.Fatalf("JSON aborted entry: %+v %v (%s)", a, err, lines[len(lines)-1])
	}
}
