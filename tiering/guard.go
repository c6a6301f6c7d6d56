package tiering

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// The tail guard: cold reads give way to tail traffic.
//
// A catch-up reader pulling old data from the bucket keeps the machine busy
// (the download, its checksum, the copy to the client; on a small machine
// also the client and an S3 server beside it), and the tail's requests then
// wait for a processor. While there is tail traffic, the guard watches two
// things once per window (tailWindow):
//
//   - The tail as the broker serves it (ObserveTail): acks=all produce
//     requests of up to 64 KiB from their last byte read to their response
//     written, and fetches waiting at the end of a partition from the high
//     watermark moving to running again. Each signal keeps its last
//     quietSamples samples taken while no cold download was moving: their
//     99th percentile is what the tail gets on this machine anyway (its
//     disk's fsync jitter included). While cold reads move, a sample above
//     1.5 times that (the goal for the tail's p99) is late. Until
//     there are quietEnough quiet samples, late means above twice the
//     smallest sample plus 250 µs.
//   - CPU pressure (pressure.go, Linux PSI): the share of the window during
//     which some task waited for a processor. It sees what the broker's own
//     samples cannot: the wait of the clients and of anything else on the
//     machine, and the wait before the broker reads a request at all. A
//     window with cold downloads moving is crowded if that share is more
//     than pressureMargin above its average over windows without them.
//
// A window with a late sample, or crowded, halves the cold-read rate (never
// below tailFloor; from the ceiling it goes to tailFloor at once); a window
// with tail samples on time while cold downloads moved raises it by a
// twentieth plus 512 KiB/s (so 4 → 100 MiB/s takes about 1.5 s); a second
// without tail samples lifts it entirely. This is LEDBAT's idea (a background transfer backs off when the
// foreground's delay grows past what it is without it): a broker with
// processors to spare sees neither late samples nor pressure and never
// slows its catch-up readers; a busy one serves the tail first and the
// backlog with what is left. Cold reads slowed down leave windows without
// downloads, which keep the quiet references current, so a reference taken
// under other load corrects itself.
//
// The configured --tier-fetch-max-bytes-per-second stays the ceiling; cold
// reads served from the cache are not paced (they cost no download).

const (
	tailWindow   = 25 * time.Millisecond // how often the rate is reconsidered
	tailIdle     = time.Second           // no tail samples for this long: the ceiling again
	tailFloor    = 4 << 20               // the guard never slows cold reads below 4 MiB/s (an 8 MiB chunk in 2 s)
	tailLift     = 4 << 30               // grown past 4 GiB/s, the guard's limit is lifted
	quietSamples = 1024                  // quiet samples kept per signal
	quietEnough  = 200                   // quiet samples before their p99 is trusted
	// pressureMargin is how much more of the time tasks may wait for a
	// processor while cold reads move than while they do not.
	pressureMargin = 0.05
)

// TailSignal names what a tail latency sample measures; each has its own
// reference.
type TailSignal int

const (
	// TailWake is a fetch waiting at the end of a partition running again
	// after the high watermark it waited for moved.
	TailWake TailSignal = iota
	// TailProduce is an acks=all produce request from its last byte read
	// to its response written (its fsync included).
	TailProduce
	tailSignals
)

// reference is what one signal looks like without cold reads: the last
// quiet samples in a ring, the smallest sample seen, and the lateness
// threshold derived from them.
type reference struct {
	ring   [quietSamples]time.Duration
	n      int // samples in ring (up to quietSamples)
	next   int // ring position of the next sample
	min    time.Duration
	thresh time.Duration // a sample above this is late
	stale  bool          // ring or min changed since thresh was computed
}

func (r *reference) add(d time.Duration, quiet bool) {
	if r.min == 0 || d < r.min {
		r.min, r.stale = max(d, 1), true
	}
	if quiet {
		r.ring[r.next] = d
		r.next = (r.next + 1) % quietSamples
		r.n = min(r.n+1, quietSamples)
		r.stale = true
	}
}

// update recomputes thresh if samples came in since the last time (once per
// window, off the tail's path: a sort of up to quietSamples durations).
func (r *reference) update() {
	if !r.stale {
		return
	}
	r.stale = false
	r.thresh = 2*r.min + 250*time.Microsecond
	if r.n >= quietEnough {
		q := slices.Clone(r.ring[:r.n])
		slices.Sort(q)
		r.thresh = q[len(q)*99/100] * 3 / 2
	}
}

type tailGuard struct {
	mu            sync.Mutex
	on            bool
	ceiling       rate.Limit // --tier-fetch-max-bytes-per-second, or rate.Inf
	limit         rate.Limit // the rate in force
	win           time.Time  // start of the current window
	samples       int        // tail samples in this window
	lateInWindow  int        // of which late
	lastHot       time.Time
	ref           [tailSignals]reference
	ticking       bool      // a goroutine is about to end the window
	psi           *pressure // nil: no pressure information
	quietPressure float64   // PSI share of windows without cold downloads (moving average)

	paced     atomic.Int64 // bytes cold downloads took from the rate
	lastPaced atomic.Int64 // when they last did: nanoseconds since clockStart
	paced0    int64        // paced at win

	waits, late, crowded, backoffs int64 // counters for Stats

	clock func() time.Time // tests; nil: time.Now
}

// clockStart anchors lastPaced to the monotonic clock.
var clockStart = time.Now()

// SetTailGuard turns the tail guard on or off (on by default). Call before
// serving.
func (t *Tier) SetTailGuard(on bool) {
	t.guard.mu.Lock()
	defer t.guard.mu.Unlock()
	t.guard.on = on
	if on && t.guard.psi == nil {
		t.guard.psi = openPressure()
	}
	t.applyRateLocked()
}

// applyRateLocked makes fetchRate match the ceiling and the guard: no
// limiter when neither bounds anything. t.guard.mu held.
func (t *Tier) applyRateLocked() {
	g := &t.guard
	if g.ceiling == 0 {
		g.ceiling = rate.Inf
	}
	if g.limit == 0 || g.limit > g.ceiling {
		g.limit = g.ceiling
	}
	if !g.on && g.ceiling == rate.Inf {
		t.fetchRate = nil
		return
	}
	if t.fetchRate == nil {
		// A burst of one download step (256 KiB), starting empty:
		// downloads are paced step by step, not let through a chunk at a
		// time.
		const burst = 256 << 10
		t.fetchRate = rate.NewLimiter(g.limit, burst)
		t.fetchRate.AllowN(time.Now(), burst)
		return
	}
	t.fetchRate.SetLimit(g.limit)
}

// ObserveTail records one tail latency sample of signal sig.
func (t *Tier) ObserveTail(sig TailSignal, d time.Duration) {
	g := &t.guard
	if sig < 0 || sig >= tailSignals {
		return
	}
	// Quiet: no cold download took from the rate while this sample's
	// request was served (nor just before it).
	now := g.now()
	lp := g.lastPaced.Load() // 0: never
	quiet := lp == 0 || now.Sub(clockStart)-time.Duration(lp) > d+tailWindow
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.on {
		return
	}
	r := &g.ref[sig]
	if r.thresh == 0 {
		r.update() // the first sample: no sort yet
	}
	late := !quiet && d > r.thresh
	r.add(d, quiet)
	g.samples++
	g.waits++
	if late {
		g.late++
		g.lateInWindow++
	}
	g.lastHot = now
	// The window's end is dealt with off the tail's path (this runs
	// before a woken fetch answers).
	if now.Sub(g.win) >= tailWindow && !g.ticking {
		if g.clock != nil { // tests: at once, deterministically
			t.guardTickLocked(now)
		} else {
			g.ticking = true
			go t.guardTick()
		}
	}
}

// tookRate notes n bytes of cold download paced now.
func (g *tailGuard) tookRate(n int) {
	g.paced.Add(int64(n))
	g.lastPaced.Store(max(int64(g.now().Sub(clockStart)), 1))
}

func (g *tailGuard) now() time.Time {
	if g.clock != nil {
		return g.clock()
	}
	return time.Now()
}

// guardTick reconsiders the rate if a window has passed (called by the
// downloads as they pace themselves, so a rate lowered for tail traffic
// rises again when that traffic is gone).
func (t *Tier) guardTick() {
	g := &t.guard
	g.mu.Lock()
	if g.on {
		t.guardTickLocked(g.now())
	}
	g.ticking = false
	g.mu.Unlock()
}

func (t *Tier) guardTickLocked(now time.Time) {
	g := &t.guard
	if now.Sub(g.win) < tailWindow {
		return
	}
	for i := range g.ref {
		g.ref[i].update()
	}
	paced := g.paced.Load()
	moving := paced > g.paced0 // cold downloads took from the rate in this window
	crowded := false
	if g.psi != nil && now.Sub(g.lastHot) <= tailIdle {
		if share, ok := g.psi.share(now); ok {
			if !moving {
				g.quietPressure += (share - g.quietPressure) / 4
			} else if share > g.quietPressure+pressureMargin {
				crowded = true
				g.crowded++
			}
		}
	}
	limit := g.limit
	switch {
	case now.Sub(g.lastHot) > tailIdle:
		limit = rate.Inf
	case g.lateInWindow > 0 || crowded:
		// At the ceiling (unlimited, or the configured rate) so far:
		// straight to the floor, as TCP's slow start begins small
		// (halving from a GB/s would take the tail's p99 with it while
		// it converged).
		if limit == g.ceiling { // unlimited is math.MaxFloat64, not +Inf: halving it is no test
			limit = tailFloor
		}
		limit = max(limit/2, tailFloor)
		g.backoffs++
	case g.samples > 0 && moving:
		// The tail was on time with cold reads taking this rate: try more.
		limit = limit*1.05 + 512<<10
	}
	if limit > g.ceiling || limit > tailLift {
		limit = g.ceiling
	}
	g.win, g.paced0, g.samples, g.lateInWindow = now, paced, 0, 0
	if limit != g.limit {
		g.limit = limit
		t.fetchRate.SetLimit(limit)
	}
}

// coldRateInForce is the cold-read rate in force in bytes/s, 0 if none.
func (t *Tier) coldRateInForce() int64 {
	g := &t.guard
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.fetchRate == nil || g.limit == rate.Inf {
		return 0
	}
	return int64(g.limit)
}
