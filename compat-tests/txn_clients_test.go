package compattests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Transactions read by kcat and the Python clients: franz-go writes
// produceTxnMix (plain records, committed and aborted transactions over two
// partitions) and the end records; then the client reads every partition
// from the beginning at read_committed (exactly the plain and committed
// records, at their offsets) and read_uncommitted (every data record, no
// control record).

// txnMixTopic is a broker with produceTxnMix's topic, its end records
// appended once every transaction is stable.
func txnMixTopic(t *testing.T) (*txnEnv, string, *txnMix) {
	t.Helper()
	e := newTxnEnv(t)
	ctx := testCtx(t, txnTimeout)
	topic := e.topic(t, "", mixParts)
	m := e.produceTxnMix(t, ctx, topic)
	checkOffsetsKadm(t, ctx, e.adm, topic, m.hwm, m.hwm)
	e.appendEnd(t, ctx, topic, mixParts)
	return e, topic, m
}

// TestTxnKcat: kcat -C -e -J -X isolation.level=read_committed (and
// read_uncommitted), on the system librdkafka.
func TestTxnKcat(t *testing.T) {
	bin := kcatPath(t)
	e, topic, m := txnMixTopic(t)
	for _, c := range []struct {
		isolation string
		want      map[int32][]txnRec
	}{{"read_committed", m.committed}, {"read_uncommitted", m.all}} {
		t.Run(c.isolation, func(t *testing.T) {
			ctx := testCtx(t, scenarioTimeout)
			k := &kcat{bin: bin, addr: e.addr, topic: topic}
			out := k.run(t, ctx, nil, "-C", "-t", topic, "-o", "beginning", "-e", "-J",
				"-X", "isolation.level="+c.isolation, "-X", "fetch.wait.max.ms=250")
			got := make(map[int32][]txnRec)
			ends := make(map[int32]bool)
			for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
				if len(line) == 0 {
					continue
				}
				var j kcatJSON
				if err := json.Unmarshal(line, &j); err != nil {
					t.Fatalf("kcat -J line %q: %v", line, err)
				}
				v := "<null>"
				if j.Payload != nil {
					v = *j.Payload
				}
				switch {
				case ends[j.Partition]:
					t.Errorf("kcat %s: p%d offset %d %q after the end record", c.isolation, j.Partition, j.Offset, v)
				case v == txnEndValue(j.Partition):
					ends[j.Partition] = true
				default:
					got[j.Partition] = append(got[j.Partition], txnRec{P: j.Partition, Off: j.Offset, V: v})
				}
			}
			if len(ends) != mixParts {
				t.Errorf("kcat %s -e: read the end records of %d of %d partitions", c.isolation, len(ends), mixParts)
			}
			checkTxnRead(t, "kcat "+c.isolation, got, c.want)
		})
	}
}

// TestTxnKafkaPython: kafka-python's KafkaConsumer(isolation_level=...).
// Debian's kafka-python 2.0.2 has no isolation_level (it always fetches
// read_uncommitted and hands control records to the application as data):
// the script says so (exit 3) and the test skips.
func TestTxnKafkaPython(t *testing.T) {
	pythonModule(t, "kafka", "python3-kafka")
	runTxnPython(t, "kafka-python")
}

// TestTxnConfluentPython: confluent-kafka (Python, Debian's
// python3-confluent-kafka on the system librdkafka) Consumer with
// isolation.level read_committed and read_uncommitted.
func TestTxnConfluentPython(t *testing.T) {
	pythonModule(t, "confluent_kafka", "python3-confluent-kafka")
	runTxnPython(t, "confluent")
}

func runTxnPython(t *testing.T, client string) {
	path, err := filepath.Abs(filepath.Join("testdata", "txn_read.py"))
	if err != nil {
		t.Fatal(err)
	}
	read := func(t *testing.T, ctx context.Context, addr, topic, isolation string) map[int32][]txnRec {
		t.Helper()
		cmd := exec.CommandContext(ctx, systemPython, path, client, addr, topic, strconv.Itoa(mixParts), isolation)
		cmd.Env = pythonEnv()
		cmd.WaitDelay = 5 * time.Second
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if stderr.Len() > 0 {
			t.Logf("txn_read.py %s %s stderr:\n%s", client, isolation, stderr.Bytes())
		}
		if exit := (*exec.ExitError)(nil); errors.As(err, &exit) && exit.ExitCode() == 3 {
			t.Skipf("%s cannot read with isolation level %s (see stderr above)", client, isolation)
		}
		if err != nil {
			t.Fatalf("txn_read.py %s %s: %v", client, isolation, err)
		}
		got := make(map[int32][]txnRec)
		sc := bufio.NewScanner(&stdout)
		for sc.Scan() {
			var r txnRec
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("txn_read.py %s: output line %q: %v", client, sc.Bytes(), err)
			}
			got[r.P] = append(got[r.P], r)
		}
		return got
	}
	e, topic, m := txnMixTopic(t)
	for _, c := range []struct {
		isolation string
		want      map[int32][]txnRec
	}{{"read_committed", m.committed}, {"read_uncommitted", m.all}} {
		t.Run(c.isolation, func(t *testing.T) {
			ctx := testCtx(t, scenarioTimeout)
			checkTxnRead(t, client+" "+c.isolation, read(t, ctx, e.addr, topic, c.isolation), c.want)
		})
	}
}
