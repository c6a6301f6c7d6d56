package compattests

import (
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Long fault runs (make chaos; skipped otherwise): CLUSTER_CHAOS_KILLS
// cycles of kill -9 of a leader, then CLUSTER_CHAOS_PAUSES cycles of
// SIGSTOP of a leader past twice the session TTL, under two idempotent
// acks=all producers, on one 3-broker cluster. Each cycle waits for the
// ISR to be whole again. At the end every acknowledged record is read
// back at its offset exactly once. Failover times (fault to the first
// acknowledgement on every partition the broker led) are printed as
// p50 / p99 / max.
func TestClusterChaos(t *testing.T) {
	kills, _ := strconv.Atoi(os.Getenv("CLUSTER_CHAOS_KILLS"))
	pauses, _ := strconv.Atoi(os.Getenv("CLUSTER_CHAOS_PAUSES"))
	if kills+pauses == 0 {
		t.Skip("set CLUSTER_CHAOS_KILLS and/or CLUSTER_CHAOS_PAUSES (make chaos)")
	}
	c, topic, partitions, acks, times, stop := clusterLoad(t)
	adm := c.admin(t)
	var killTimes, pauseTimes []time.Duration
	cycle := func(pause bool) {
		st, err := c.states(t, adm, topic)
		if err != nil {
			t.Fatal(err)
		}
		victim := st[int32(len(killTimes)+len(pauseTimes))%partitions].leader
		led := ledBy(st, victim)
		at := time.Now()
		if pause {
			c.brokers[victim].signal(t, syscall.SIGSTOP)
			time.Sleep(7 * time.Second)
			c.brokers[victim].signal(t, syscall.SIGCONT)
		} else {
			c.brokers[victim].Kill9(t)
		}
		deadline := time.Now().Add(20 * time.Second)
		var worst time.Duration
		for _, p := range led {
			for {
				if first, ok := times.firstAfter(p, at); ok {
					worst = max(worst, first.Sub(at))
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("partition %d: no acknowledgement 20 s after the fault on broker %d", p, victim)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		if pause {
			pauseTimes = append(pauseTimes, worst)
		} else {
			killTimes = append(killTimes, worst)
			c.brokers[victim].Start(t)
		}
		c.waitISR(t, topic, 3, 60*time.Second)
	}
	for range kills {
		cycle(false)
	}
	for range pauses {
		cycle(true)
	}
	stop()
	t.Logf("%d acks, %d failed", acks.count(), acks.fails.Load())
	verifyAcked(t, c.seeds(), topic, partitions, acks)
	report := func(name string, d []time.Duration) {
		if len(d) == 0 {
			return
		}
		slices.Sort(d)
		q := func(f float64) time.Duration { return d[min(len(d)-1, int(f*float64(len(d))))] }
		t.Logf("%s: %d cycles, failover p50 %s, p99 %s, max %s", name, len(d), q(0.5).Round(time.Millisecond),
			q(0.99).Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond))
	}
	report("kill -9", killTimes)
	report("SIGSTOP 7 s", pauseTimes)
}
