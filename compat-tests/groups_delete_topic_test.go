package compattests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestGroupDeleteTopicCloseConfluentPython: librdkafka's own test 0113,
// subtest h_delete_topic (a cooperative-sticky consumer of two topics, one
// deleted under it), with confluent-kafka (Python) on Debian's librdkafka
// (testdata/groups_delete_topic.py).
//
// The consumer revokes the deleted topic's partition and keeps the other;
// on close() its group shutdown (revoke, LeaveGroup) is answered at once:
// the group is Empty within 3 s. With librdkafka 2.0.3 or later close()
// itself must return within 3 s too. librdkafka 2.0.2's close() never
// returns here, against any broker (franz-go's kfake too): the deleted
// partition's toppar leaks (a version barrier op left in its unforwarded
// fetch queue holds it; librdkafka #4187, fixed in 2.0.3) and with it its
// reference to the leader broker, so rd_kafka_destroy waits for that
// broker thread forever; no request is outstanding. With 2.0.2 the test
// checks the group side only, then kills the script.
//
// COMPAT_0113_DEBUG=cgrp,protocol,... passes librdkafka debug contexts to
// the script (its log goes to the test log).
func TestGroupDeleteTopicCloseConfluentPython(t *testing.T) {
	pythonModule(t, "confluent_kafka", "python3-confluent-kafka")
	f := newGroupFixture(t, 1)
	ctx := testCtx(t, 2*time.Minute)
	kept, deleted := f.topic, f.topic+"-deleted"
	createTopicKadm(t, f.b.Addr(), deleted, 1)
	path, err := filepath.Abs(filepath.Join("testdata", "groups_delete_topic.py"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, systemPython, path, f.b.Addr(), kept, deleted, f.group, os.Getenv("COMPAT_0113_DEBUG"))
	cmd.Env = pythonEnv()
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if stderr.Len() > 0 {
				t.Logf("groups_delete_topic.py stderr:\n%s", stderr.Bytes())
			}
		})
	}
	defer stop()

	type line struct {
		Librdkafka string     `json:"librdkafka"`
		Closing    bool       `json:"closing"`
		Assigns    [][]string `json:"assigns"`
		Revokes    [][]string `json:"revokes"`
		CloseS     *float64   `json:"close_s"`
	}
	lines := make(chan line)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var l line
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Errorf("groups_delete_topic.py output %q: %v", sc.Bytes(), err)
				return
			}
			lines <- l
		}
	}()
	next := func(what string, within time.Duration) line {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				stop()
				t.Fatalf("groups_delete_topic.py ended before %s", what)
			}
			return l
		case <-time.After(within):
			stop()
			t.Fatalf("groups_delete_topic.py: no %s within %s", what, within)
		}
		return line{}
	}
	version := next("librdkafka version", 20*time.Second).Librdkafka
	fixed := versionAtLeast(version, 2, 0, 3)
	l := next("revoke of the deleted topic", 90*time.Second)
	if !l.Closing {
		t.Fatalf("groups_delete_topic.py: %+v, want the closing line", l)
	}
	start := time.Now()
	t.Logf("librdkafka %s: assigns %v, revokes %v", version, l.Assigns, l.Revokes)
	if len(l.Revokes) == 0 || len(l.Revokes[0]) != 1 || l.Revokes[0][0] != deleted {
		t.Errorf("revokes %v: want the deleted topic %s's partition revoked first", l.Revokes, deleted)
	}
	// The group side of close: the member's LeaveGroup is answered and the
	// group is empty at once.
	f.waitGroupState(t, ctx, 3*time.Second, "Empty")
	t.Logf("group Empty %.2f s after close() began", time.Since(start).Seconds())
	if !fixed {
		t.Logf("librdkafka %s: close() itself is not waited for (librdkafka #4187, fixed in 2.0.3: it never returns after a deleted topic's partition was revoked, against any broker)", version)
		return
	}
	l = next("end of close()", 10*time.Second)
	if l.CloseS == nil {
		t.Fatalf("groups_delete_topic.py: %+v, want close_s", l)
	}
	if *l.CloseS > 3 {
		t.Errorf("close took %.1f s after the topic was deleted, want under 3 s (Apache Kafka: at once)", *l.CloseS)
	}
}

// versionAtLeast reports whether the dotted version v is at least
// major.minor.patch (a suffix such as -RC1 is ignored).
func versionAtLeast(v string, major, minor, patch int) bool {
	want := []int{major, minor, patch}
	parts := strings.SplitN(strings.SplitN(v, "-", 2)[0], ".", 3)
	for i, w := range want {
		n := 0
		if i < len(parts) {
			n, _ = strconv.Atoi(parts[i])
		}
		if n != w {
			return n > w
		}
	}
	return true
}
