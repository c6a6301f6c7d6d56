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

// cancelled is a context that is already done: serve opens everything, finds
// its stop signal at once and shuts down.
func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// logEntries parses JSON log lines.
func logEntries(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		m := map[string]any{}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %q", err, line)
		}
		out = append(out, m)
	}
	return out
}

func findEntry(t *testing.T, entries []map[string]any, msgPrefix string) map[string]any {
	t.Helper()
	for _, e := range entries {
		if msg, _ := e["msg"].(string); strings.HasPrefix(msg, msgPrefix) {
			return e
		}
	}
	t.Fatalf("no log entry %q in %v", msgPrefix, entries)
	return nil
}

func TestServeRecoversPartitionsAndStops(t *testing.T) {
	data := t.TempDir()
	a, b := filepath.Join(data, "orders-0"), filepath.Join(data, "orders-1")
	writePartition(t, a, log.Config{SegmentBytes: 200}, 5)
	writePartition(t, b, log.Config{}, 2)
	// A torn tail in b, as a crash mid-write leaves it, and things that are
	// not partitions.
	f, err := os.OpenFile(segmentPath(b, 0), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(makeBatch(3, testTimestamp, 7)[:50])
	f.Close()
	if err := os.Mkdir(filepath.Join(data, "not-a-partition"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "stray.log"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if rep, err := log.VerifyDir(log.OSFS, b); err != nil || len(rep.Notes) == 0 {
		t.Fatalf("torn tail not seen before serve: %+v, %v", rep, err)
	}

	_, stderr, err := run(t, cancelled(), "--log-format", "json", "serve", "--data-dir", data)
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr)
	}
	entries := logEntries(t, stderr)
	e := findEntry(t, entries, "partitions opened")
	if e["partitions"] != 2.0 || e["failed"] != 0.0 || e["listen"] != "127.0.0.1:9092" {
		t.Errorf("partitions entry = %v", e)
	}
	if !strings.Contains(e["msg"].(string), "not implemented") {
		t.Errorf("start-up line does not say the listener is missing: %v", e)
	}
	if e := findEntry(t, entries, "truncat"); e["logger"] != "log" {
		t.Errorf("recovery was not logged by the named log component: %v", e)
	}
	findEntry(t, entries, "stopped")

	// Recovery truncated the torn tail, and both partitions were closed
	// cleanly: nothing is left for the next open to repair.
	for _, dir := range []string{a, b} {
		rep, err := log.VerifyDir(log.OSFS, dir)
		if err != nil || !rep.OK() || len(rep.Notes) != 0 {
			t.Errorf("%s after serve: %+v, %v", dir, rep, err)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "not-a-partition", "00000000000000000000.log")); err == nil {
		t.Error("serve turned a directory without segments into a partition")
	}
}

func TestServeCreatesDataDir(t *testing.T) {
	data := filepath.Join(t.TempDir(), "a", "b")
	_, stderr, err := run(t, cancelled(), "serve", "--data-dir", data)
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr)
	}
	if fi, err := os.Stat(data); err != nil || !fi.IsDir() {
		t.Fatalf("data dir not created: %v", err)
	}
	if !strings.Contains(stderr, "INFO\tpartitions opened") {
		t.Errorf("console log lacks the start-up line:\n%s", stderr)
	}
}

func TestServeEnvironment(t *testing.T) {
	fromEnv := filepath.Join(t.TempDir(), "env")
	fromFlag := filepath.Join(t.TempDir(), "flag")
	t.Setenv("SYNAPSE_DATA_DIR", fromEnv)
	t.Setenv("SYNAPSE_FSYNC_INTERVAL", "250ms")
	t.Setenv("SYNAPSE_LOG_FORMAT", "json")

	_, stderr, err := run(t, cancelled(), "serve")
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr)
	}
	e := findEntry(t, logEntries(t, stderr), "starting")
	if e["data_dir"] != fromEnv || e["fsync"] != "interval 250ms" {
		t.Errorf("environment not applied: %v", e)
	}

	// The command line wins over the environment.
	_, stderr, err = run(t, cancelled(), "serve", "--data-dir", fromFlag, "--fsync-interval=0")
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr)
	}
	e = findEntry(t, logEntries(t, stderr), "starting")
	if e["data_dir"] != fromFlag || e["fsync"] != "durable" {
		t.Errorf("flags did not override the environment: %v", e)
	}
	if _, err := os.Stat(fromFlag); err != nil {
		t.Error(err)
	}

	t.Setenv("SYNAPSE_MAX_OPEN_FILES", "many")
	_, _, err = run(t, cancelled(), "serve")
	if err == nil || !strings.Contains(err.Error(), "SYNAPSE_MAX_OPEN_FILES") {
		t.Errorf("bad environment value: err = %v", err)
	}
}

func TestServeRejectsBadFlags(t *testing.T) {
	data := t.TempDir()
	for _, args := range [][]string{
		{"serve", "--data-dir", data, "--listen", "9092"},
		{"serve", "--data-dir", data, "--max-open-files", "0"},
		{"serve", "--data-dir", data, "--fsync-interval", "-1s"},
		{"serve", "--data-dir", data, "extra"},
		{"--log-level", "trace", "serve", "--data-dir", data},
		{"--log-format", "xml", "serve", "--data-dir", data},
	} {
		if _, _, err := run(t, cancelled(), args...); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
