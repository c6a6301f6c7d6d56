package compattests

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Transactions with KafkaJS 2.2.4 (testdata/kafkajs_txn.js under node): the
// copy scenario (txn_franzgo_test.go, copyPlan) with producer.transaction(),
// send, sendOffsets, commit and abort, the group's offsets checked by the
// script with admin.fetchOffsets after every step; then KafkaJS consumers
// with readUncommitted false and true read out.

func TestTxnKafkaJS(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		skipUnlessRequired(t, "node not found: run compat-tests/install-kafkajs.sh")
	}
	modules := filepath.Join(kafkajsDir(), "node_modules")
	if _, err := os.Stat(filepath.Join(modules, "kafkajs", "package.json")); err != nil {
		skipUnlessRequired(t, "kafkajs not installed in "+modules+": run compat-tests/install-kafkajs.sh")
	}
	e := newTxnEnv(t)
	ctx := testCtx(t, txnTimeout)
	in, out, group := e.copyFixture(t, ctx)

	script := func(args ...string) []byte {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, node, append([]string{"testdata/kafkajs_txn.js", e.addr}, args...)...)
		cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "KAFKAJS_NO_PARTITIONER_WARNING=1")
		cmd.WaitDelay = 5 * time.Second
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if stderr.Len() > 0 {
			t.Logf("kafkajs_txn.js %s stderr:\n%s", args[0], stderr.Bytes())
		}
		if err != nil {
			t.Fatalf("kafkajs_txn.js %s: %v\nstdout:\n%s", strings.Join(args, " "), err, stdout.Bytes())
		}
		return stdout.Bytes()
	}

	var plan [][3]any
	for _, s := range copyPlan {
		plan = append(plan, [3]any{s.From, s.To, s.Commit})
	}
	planJSON, err := json.Marshal(plan)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kafkajs_txn.js produce:\n%s", bytes.TrimSpace(script("produce", in, out, group, string(planJSON))))
	e.checkGroupOffsets(t, ctx, "after the KafkaJS transactions", group, in, copyParts, copyCommittedAfter(len(copyPlan)-1))
	e.checkCopyOut(t, ctx, out)

	rc, _ := copyWant(true)
	ru, _ := copyWant(false)
	for _, c := range []struct {
		isolation string
		want      map[int32][]txnRec
	}{{"committed", rc}, {"uncommitted", ru}} {
		var got []txnRec
		outp := script("read", out, strconv.Itoa(copyParts), c.isolation)
		if err := json.Unmarshal(bytes.TrimSpace(outp), &got); err != nil {
			t.Fatalf("kafkajs_txn.js read %s: output %q: %v", c.isolation, outp, err)
		}
		checkTxnRead(t, "KafkaJS readUncommitted="+map[string]string{"committed": "false", "uncommitted": "true"}[c.isolation], byPartition(got), c.want)
	}
}
