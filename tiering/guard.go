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
// things:
//
//   - The tail as the broker serves it (ObserveTail): acks=all produce
//     requests of up to 64 KiB answered on their own, from their last byte
//     read to their response written, and fetches waiting at the end of a
//     partition, from the high watermark moving to running again. Each
//     signal keeps its last quietSamples samples taken while no cold read
//     was moving (a download paced, or cold data served): 1.5 times their 99th percentile (the goal
//     for the tail's p99) is the lateness threshold, so a slow disk or a
//     busy machine is what the tail is measured against, not blamed on cold
//     reads. Until there are quietEnough quiet samples, the threshold is
//     twice the smallest sample plus 250 µs. Cold reads are too much when
//     more than lateShare of the recent tail samples are late (at least
//     two): a p99 goal tolerates the odd slow request, not a trend.
//   - CPU pressure (pressure.go, Linux PSI): the share of each window
//     (tailWindow) during which some task waited for a processor. It sees
//     what the broker's own samples cannot: the clients' waits and the wait
//     before a request is read at all. A window with cold reads moving is
//     crowded if that share is more than pressureMargin above its
//     average over windows without them.
//
// At the end of each window: too many late samples, or a crowded window,
// halve the cold-read rate (from the ceiling, straight to tailFloor, as
// TCP's slow start begins small: halving from a GB/s would take the tail's
// p99 with it while it converged); a window of tail samples while cold
// downloads moved and neither raises it by 3% plus 256 KiB/s (4 → 100
// MiB/s in about 1.8 s, → 1 GiB/s in 3.7 s); a second without tail samples
// lifts it. This is LEDBAT's idea (a background transfer backs off when the
// foreground's delay grows past what it is without it): where cold reads
// make no processor short, the tail stays on time, the rate only grows, and
// catch-up readers are not slowed; on a saturated machine they get what is
// left, never less than tailFloor. The lowered rate stays while tail
// traffic does, so the next catch-up reader starts from it.
//
// While the rate is lowered, what cold reads hand to clients is paced to it
// too (ServeCold, ChargeCold): at most serveBurst cold bytes per fetch
// response, and once the cold bytes served run ahead of the rate, cold
// partitions answer empty and their fetch long-polls until it has caught
// up. Otherwise a chunk downloaded slowly would still reach its reader in
// one burst, and the reader's processing of it is what the tail would wait
// behind.
//
// The configured --tier-fetch-max-bytes-per-second stays the ceiling of the
// download rate.

const (
	tailWindow   = 25 * time.Millisecond // how often the rate is reconsidered
	tailIdle     = time.Second           // no tail samples for this long: the ceiling again
	tailFloor    = 4 << 20               // the guard never slows cold reads below 4 MiB/s (an 8 MiB chunk in 2 s)
	tailLift     = 4 << 30               // grown past 4 GiB/s, the guard's limit is lifted
	quietSamples = 1024                  // quiet samples kept per signal
	quietEnough  = 200                   // quiet samples before their p99 is trusted
	// lateShare of the recent tail samples (the last lateHorizon to
	// 2*lateHorizon, at least two) late backs cold reads off.
	lateShare   = 0.01
	lateHorizon = 256
	// pressureMargin is how much more of the time tasks may wait for a
	// processor while cold reads move than while they do not.
	pressureMargin = 0.03
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
	thresh time.Duration // a sample above this is late; 0: no reference yet, nothing is late
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

// threshold computes a lateness threshold from the smallest sample and a
// copy of the quiet samples (sorted in place).
func threshold(min time.Duration, quiet []time.Duration) time.Duration {
	if len(quiet) >= quietEnough {
		slices.Sort(quiet)
		return quiet[len(quiet)*99/100] * 3 / 2
	}
	if min == 0 {
		return 0
	}
	return 2*min + 250*time.Microsecond
}

type tailGuard struct {
	mu            sync.Mutex
	on            bool
	ceiling       rate.Limit // --tier-fetch-max-bytes-per-second, or rate.Inf
	limit         rate.Limit // the rate in force
	win           time.Time  // start of the current window
	samples       int        // tail samples in this window
	recent, late  int        // tail samples of the last lateHorizon or so, and how many were late
	lastHot       time.Time
	ref           [tailSignals]reference
	ticking       bool      // a window's end is being dealt with (endWindow)
	psi           *pressure // nil: no pressure information; used by endWindow only
	quietPressure float64   // PSI share of windows without cold downloads (moving average)
	scratch       [tailSignals][]time.Duration

	serve     *rate.Limiter // cold bytes served to clients while the rate is lowered (ServeCold)
	serveWait chan struct{} // closed at serveAt, when the serve debt is paid off
	serveAt   time.Time
	paced     atomic.Int64 // bytes cold reads took: downloads paced, or served (ChargeCold)
	lastPaced atomic.Int64 // when they last did: nanoseconds since clockStart (0: never)
	paced0    int64        // paced at win

	samplesTotal, lateTotal, crowded, backoffs int64 // counters for Stats

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
	t.guard.limit = 0 // the ceiling: nothing left of a lowered rate
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
	if g.serve == nil {
		g.serve = rate.NewLimiter(g.limit, serveBurst)
	} else {
		g.serve.SetLimit(g.limit)
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
	// Quiet: no cold read moved (a download paced, or cold data served)
	// while this sample's request was served (nor just before it).
	now := g.now()
	lp := g.lastPaced.Load()
	quiet := lp == 0 || now.Sub(clockStart)-time.Duration(lp) > d+tailWindow
	g.mu.Lock()
	if !g.on {
		g.mu.Unlock()
		return
	}
	r := &g.ref[sig]
	late := !quiet && r.thresh > 0 && d > r.thresh
	r.add(d, quiet)
	g.samples++
	g.recent++
	g.samplesTotal++
	if late {
		g.late++
		g.lateTotal++
	}
	g.lastHot = now
	due := now.Sub(g.win) >= tailWindow && !g.ticking
	if due {
		g.ticking = true
	}
	g.mu.Unlock()
	if due {
		// The window's end (a sort, a file read) is dealt with off the
		// tail's path: this runs before a woken fetch answers.
		if g.clock != nil {
			t.endWindow(true) // tests: at once, deterministically
		} else {
			go t.endWindow(true)
		}
	}
}

// refReady returns sig's lateness threshold (0: no reference yet).
func (g *tailGuard) refReady(sig TailSignal) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ref[sig].thresh
}

// tookRate notes n bytes of cold reading now (a download paced, or cold
// data served).
func (g *tailGuard) tookRate(n int64) {
	g.paced.Add(n)
	g.lastPaced.Store(max(int64(g.now().Sub(clockStart)), 1))
}

func (g *tailGuard) now() time.Time {
	if g.clock != nil {
		return g.clock()
	}
	return time.Now()
}

// guardTick ends the window if it is over (downloads call it as they pace
// themselves, so a rate lowered for tail traffic rises again when that
// traffic is gone).
func (t *Tier) guardTick() { t.endWindow(false) }

// endWindow reconsiders the rate at the end of a window. claimed: the
// caller already set ticking. Thresholds and pressure are computed outside
// the lock, so tail requests recording samples never wait for them.
func (t *Tier) endWindow(claimed bool) {
	g := &t.guard
	g.mu.Lock()
	now := g.now()
	if !claimed {
		if g.ticking || !g.on || now.Sub(g.win) < tailWindow {
			g.mu.Unlock()
			return
		}
		g.ticking = true
	}
	var mins [tailSignals]time.Duration
	var stale [tailSignals]bool
	for i := range g.ref {
		r := &g.ref[i]
		if stale[i] = r.stale; stale[i] {
			r.stale = false
			g.scratch[i] = append(g.scratch[i][:0], r.ring[:r.n]...)
			mins[i] = r.min
		}
	}
	hot := now.Sub(g.lastHot) <= tailIdle
	g.mu.Unlock()

	var thresh [tailSignals]time.Duration
	for i := range thresh {
		if stale[i] {
			thresh[i] = threshold(mins[i], g.scratch[i])
		}
	}
	share, shareOK := 0.0, false
	if g.psi != nil && hot {
		share, shareOK = g.psi.share(now, 4*tailWindow)
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	g.ticking = false
	for i := range thresh {
		if stale[i] {
			g.ref[i].thresh = thresh[i]
		}
	}
	if !g.on {
		return
	}
	paced := g.paced.Load()
	moving := paced > g.paced0 // cold reads moved in this window (downloads paced, data served)
	crowded := false
	if shareOK {
		if !moving {
			g.quietPressure += (share - g.quietPressure) / 4
		} else if share > g.quietPressure+pressureMargin {
			crowded = true
			g.crowded++
		}
	}
	late := g.late >= 2 && float64(g.late) > lateShare*float64(g.recent)
	limit := g.limit
	switch {
	case !hot:
		limit = rate.Inf
	case late || crowded:
		if limit == g.ceiling { // unlimited is math.MaxFloat64, not +Inf: halving it is no test
			limit = tailFloor
		}
		limit = max(limit/2, tailFloor)
		if limit < g.limit {
			g.backoffs++
		}
		g.recent, g.late = 0, 0 // the next decision on fresh evidence
	case g.samples > 0 && moving:
		// The tail was on time with cold reads taking this rate: try more.
		limit = limit*1.03 + 256<<10
	}
	if g.recent > 2*lateHorizon {
		g.recent, g.late = g.recent/2, g.late/2
	}
	if limit > g.ceiling || limit > tailLift {
		limit = g.ceiling
	}
	g.win, g.paced0, g.samples = now, paced, 0
	if limit != g.limit {
		g.limit = limit
		t.fetchRate.SetLimit(limit)
		g.serve.SetLimit(limit)
	}
}

// serveBurst bounds the cold bytes of one fetch response while the rate is
// lowered (a larger first batch still goes whole): a quarter of a second at
// the floor rate.
const serveBurst = 1 << 20

// ServeCold paces what cold reads hand to clients while the guard has
// lowered the cold-read rate: a chunk downloaded at 4 MiB/s would otherwise
// reach its reader as one burst, and the reader's processing of it is what
// the tail then waits behind. Before a fetch reads cold data it asks: with
// the rate not lowered, maxBytes is 0 (no bound) and wait nil; lowered,
// either the response may carry up to maxBytes cold bytes, or (the cold
// bytes served lately are ahead of the rate) wait is closed when it may
// read again, for the fetch's long poll. After reading it charges the bytes
// with ChargeCold. A fetch's other partitions are not held back.
func (t *Tier) ServeCold() (maxBytes int64, wait <-chan struct{}) {
	// Served cold reads end windows too: cold data coming from the cache
	// downloads nothing, and a rate lowered for tail traffic that is gone
	// must rise again for them as well.
	t.guardTick()
	g := &t.guard
	lim, limit := g.servePacing()
	if lim == nil {
		return 0, nil
	}
	tokens := lim.Tokens()
	if tokens >= 0 {
		return serveBurst, nil
	}
	// One timer per debt, shared by every read waiting it out (a client
	// polling without MaxWait must not start a timer per request).
	at := time.Now().Add(time.Duration(-tokens/float64(limit)*float64(time.Second)) + time.Millisecond)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.serveWait == nil || at.Sub(g.serveAt) > time.Millisecond {
		ch := make(chan struct{})
		time.AfterFunc(time.Until(at), func() { close(ch) })
		g.serveWait, g.serveAt = ch, at
	}
	return 0, g.serveWait
}

// ChargeCold counts n cold bytes served against the rate while it is
// lowered (the next reads wait until the rate has caught up; see
// ServeCold).
func (t *Tier) ChargeCold(n int64) {
	// Cold bytes served count as cold activity whether downloaded or from
	// the cache: what the tail waits behind is serving them.
	t.guard.tookRate(n)
	lim, _ := t.guard.servePacing()
	if lim == nil {
		return
	}
	now := time.Now()
	for n > 0 {
		k := min(n, serveBurst)
		lim.ReserveN(now, int(k)) // the debt ServeCold waits out
		n -= k
	}
}

// servePacing returns the limiter pacing served cold data and its rate, or
// nil while the guard has not lowered the cold-read rate.
func (g *tailGuard) servePacing() (*rate.Limiter, rate.Limit) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.on || g.limit >= g.ceiling {
		return nil, 0
	}
	return g.serve, g.limit
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
