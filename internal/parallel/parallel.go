// Package parallel runs index-numbered work on a bounded number of
// goroutines.
package parallel

import (
	"sync"
	"sync/atomic"
)

// Each calls fn(0) .. fn(n-1), at most workers at once, and returns when all
// have returned. With one worker (or n ≤ 1) it runs them in order on the
// calling goroutine.
func Each(workers, n int, fn func(i int)) {
	if n <= 1 || workers <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		}()
	}
	wg.Wait()
}
