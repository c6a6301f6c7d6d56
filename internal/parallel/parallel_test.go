package parallel

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestEachCallsEveryIndexOnceWithinTheBound(t *testing.T) {
	for _, tc := range []struct{ workers, n int }{{1, 5}, {4, 0}, {4, 1}, {4, 100}, {100, 3}} {
		seen := make([]atomic.Int32, tc.n)
		var running, peak atomic.Int32
		Each(tc.workers, tc.n, func(i int) {
			r := running.Add(1)
			for p := peak.Load(); r > p && !peak.CompareAndSwap(p, r); p = peak.Load() {
			}
			time.Sleep(time.Millisecond)
			seen[i].Add(1)
			running.Add(-1)
		})
		for i := range seen {
			if seen[i].Load() != 1 {
				t.Fatalf("workers %d n %d: index %d called %d times", tc.workers, tc.n, i, seen[i].Load())
			}
		}
		if int(peak.Load()) > max(tc.workers, 1) {
			t.Fatalf("workers %d n %d: %d at once", tc.workers, tc.n, peak.Load())
		}
	}
}
