package compattests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Python clients from Debian packages, run under /usr/bin/python3 (the
// packages do not import under another interpreter such as a pyenv python
// on PATH). The scripts in testdata/ produce every codec with keys, headers,
// empty and null keys and values and a ~900 KB value, read everything back,
// compare byte for byte and check ListOffsets; see roundtrip_common.py.

const systemPython = "/usr/bin/python3"

// pythonModule skips t unless /usr/bin/python3 can import module.
func pythonModule(t testing.TB, module, debPackage string) {
	t.Helper()
	if _, err := os.Stat(systemPython); err != nil {
		skipUnlessRequired(t, fmt.Sprintf("%s not found: install Debian's python3 and %s (compat-tests/install-deps.sh)", systemPython, debPackage))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, systemPython, "-c", "import "+module)
	cmd.Env = pythonEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		skipUnlessRequired(t, fmt.Sprintf("%s cannot import %s (%v: %s): install Debian's %s (compat-tests/install-deps.sh)",
			systemPython, module, err, bytes.TrimSpace(out), debPackage))
	}
}

// pythonEnv is the test's environment without variables that would point
// the system python at another installation's modules.
func pythonEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PYTHONPATH=") || strings.HasPrefix(kv, "PYTHONHOME=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
}

// runPythonRoundTrip runs script against a new broker. oldMetadata: the
// client relies on auto-creation through Metadata v0-v3.
func runPythonRoundTrip(t *testing.T, script string, oldMetadata bool) {
	b := newBroker(t)
	topic := uniqueTopic(t)
	if oldMetadata && b.Target() == targetKfake {
		// kfake only auto-creates topics for Metadata v4+ requests that ask
		// for it; Kafka (and synapse) also auto-create for Metadata v0-v3,
		// which is what kafka-python 2.0.2 sends. Create it beforehand.
		t.Log("kfake: creating the topic first (kfake does not auto-create topics for Metadata v0-v3)")
		createTopicKadm(t, b.Addr(), topic, 1)
	}
	ctx := testCtx(t, 2*scenarioTimeout)
	path, err := filepath.Abs(filepath.Join("testdata", script))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, systemPython, path, b.Addr(), topic)
	cmd.Env = pythonEnv()
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("%s %s %s:\n%s", systemPython, script, topic, out)
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
}

func createTopicKadm(t testing.TB, addr, topic string, partitions int32) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// TestKafkaPython runs testdata/kafka_python_roundtrip.py with Debian's
// python3-kafka (kafka-python 2.0.2: Metadata v1, topic auto-creation).
func TestKafkaPython(t *testing.T) {
	pythonModule(t, "kafka", "python3-kafka")
	runPythonRoundTrip(t, "kafka_python_roundtrip.py", true)
}

// TestConfluentPython runs testdata/confluent_python_roundtrip.py with
// Debian's python3-confluent-kafka (on the system librdkafka).
func TestConfluentPython(t *testing.T) {
	pythonModule(t, "confluent_kafka", "python3-confluent-kafka")
	runPythonRoundTrip(t, "confluent_python_roundtrip.py", false)
}
