package compattests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// KafkaJS 2.2.4 (npm, installed by install-kafkajs.sh into
// ~/.cache/synapse-tools/node, or $KAFKAJS_DIR) running
// testdata/kafkajs_roundtrip.js under node: produce (plain and gzip, keys,
// headers, idempotent), the commit-and-resume group scenario, admin
// fetchOffsets, describeGroups and listGroups.

func kafkajsDir() string {
	if d := os.Getenv("KAFKAJS_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "synapse-tools", "node")
}

func TestKafkaJS(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		skipUnlessRequired(t, "node not found: run compat-tests/install-kafkajs.sh")
	}
	modules := filepath.Join(kafkajsDir(), "node_modules")
	if _, err := os.Stat(filepath.Join(modules, "kafkajs", "package.json")); err != nil {
		skipUnlessRequired(t, "kafkajs not installed in "+modules+": run compat-tests/install-kafkajs.sh")
	}
	b := newBroker(t)
	topic := uniqueTopic(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/kafkajs_roundtrip.js", b.Addr(), topic, "group-"+topic)
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "KAFKAJS_NO_PARTITIONER_WARNING=1", "KAFKAJS_TARGET="+b.Target())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kafkajs_roundtrip.js: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"second":54`) {
		t.Fatalf("kafkajs_roundtrip.js printed %s", out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}
