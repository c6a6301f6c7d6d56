package compattests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestClusterStorageFailure: the leader's partition directory stops
// taking new files (chattr +i: its next segment roll fails, a storage
// error that takes the partition offline on that broker). The leader
// hands the partition to another ISR member, producers go on there, and
// every acknowledged record is read back.
func TestClusterStorageFailure(t *testing.T) {
	if compatTarget() != targetSynapse {
		t.Skip("cluster mode is Synapse's")
	}
	c := startSynCluster(t, 3)
	adm := c.admin(t)
	topic := "storage"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seg := "65536" // a roll every 64 KiB
	if _, err := adm.CreateTopic(ctx, 1, 3, map[string]*string{"segment.bytes": &seg}, topic); err != nil {
		t.Fatal(err)
	}
	c.waitISR(t, topic, 3, 20*time.Second)
	st, err := c.states(t, adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	old := st[0].leader
	dir := filepath.Join(c.brokers[old].dataDir, topic+"-0")
	if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
		t.Skipf("chattr +i %s: %v %s (needs root and a file system with the immutable flag)", dir, err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", dir).Run() })

	acks, times := newAckLog(), &ackTimes{times: map[int32][]time.Time{}}
	ch := make(chan struct{})
	wg := runProducers(t, c.seeds(), topic, 1, 2, acks, times, ch)
	var once sync.Once
	stop := func() { once.Do(func() { close(ch); wg.Wait() }) }
	t.Cleanup(stop)

	start := time.Now()
	var moved time.Duration
	for deadline := start.Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if st, err := c.statesOnce(t, adm, topic); err == nil && st[0].leader >= 0 && st[0].leader != old {
			moved = time.Since(start)
			break
		}
	}
	if moved == 0 {
		t.Fatalf("partition 0 still led by broker %d 30 s after its directory stopped taking files", old)
	}
	n := acks.count()
	time.Sleep(3 * time.Second)
	if acks.count() <= n {
		t.Fatalf("no acks in the 3 s after leadership moved off broker %d (%d before)", old, n)
	}
	stop()
	st, _ = c.states(t, adm, topic)
	t.Logf("leadership moved off broker %d %v after producing began; now %+v; %d acks, %d failed", old, moved.Round(time.Millisecond), st[0], acks.count(), acks.fails.Load())
	if b, err := os.ReadFile(c.brokers[old].logPath); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "storage failure") || strings.Contains(l, "offline") {
				t.Log(l)
			}
		}
	}
	exec.Command("chattr", "-i", dir).Run()
	verifyAcked(t, c.seeds(), topic, 1, acks)
}
