package tiering

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// guardRig is a Tier whose tail guard runs on a fake clock, with a fake
// PSI file when psi is set.
type guardRig struct {
	t    *Tier
	now  time.Time
	psi  string        // PSI file path ("" = none)
	stat time.Duration // its "some" total
}

func newGuardRig(tb testing.TB, withPSI bool) *guardRig {
	r := &guardRig{t: New(NewMemStore(), nil, 0), now: time.Now()}
	g := &r.t.guard
	g.mu.Lock()
	g.clock = func() time.Time { return r.now }
	g.win = r.now // windows end where the rig's do
	g.psi = nil
	if withPSI {
		r.psi = filepath.Join(tb.TempDir(), "cpu.pressure")
		r.writePSI(tb)
		g.psi = &pressure{path: r.psi, at: r.now}
	}
	g.mu.Unlock()
	return r
}

func (r *guardRig) writePSI(tb testing.TB) {
	body := fmt.Sprintf("some avg10=0.00 avg60=0.00 avg300=0.00 total=%d\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", r.stat.Microseconds())
	if err := os.WriteFile(r.psi, []byte(body), 0o644); err != nil {
		tb.Fatal(err)
	}
}

func (r *guardRig) limit() rate.Limit {
	r.t.guard.mu.Lock()
	defer r.t.guard.mu.Unlock()
	return r.t.guard.limit
}

// window lets one guard window pass: cold downloads move (moving) at
// about 100 MB/s, the machine's PSI share is share (if the rig has PSI),
// and tail samples of lat arrive (n of each signal).
func (r *guardRig) window(tb testing.TB, moving bool, share float64, n int, lat time.Duration) {
	end := r.now.Add(tailWindow)
	step := tailWindow / time.Duration(n+1)
	for i := 0; i < n; i++ {
		r.now = r.now.Add(step)
		if moving {
			r.t.guard.tookRate(int64(100e6 * step.Seconds()))
		}
		r.stat += time.Duration(share * float64(step))
		if r.psi != "" {
			r.writePSI(tb)
		}
		r.t.ObserveTail(TailProduce, lat)
		r.t.ObserveTail(TailWake, lat/10)
	}
	r.stat += time.Duration(share * float64(end.Sub(r.now)))
	r.now = end
	if r.psi != "" {
		r.writePSI(tb)
	}
	r.t.guardTick() // the window ends here
}

// TestTailGuardBacksOffAndRecovers: late tail samples while cold reads move
// take the cold-read rate from unlimited to the floor; samples on time
// while cold reads move raise it; late ones halve it again, down to the
// floor; a second without tail traffic lifts it.
func TestTailGuardBacksOffAndRecovers(t *testing.T) {
	r := newGuardRig(t, false)
	if r.t.fetchRate == nil || r.limit() != rate.Inf {
		t.Fatalf("guard on by default: want a limiter at Inf, got %v", r.limit())
	}
	// The quiet reference: tail samples of 400 µs without cold reads.
	for range 2 * quietEnough / 10 {
		r.window(t, false, 0, 10, 400*time.Microsecond)
	}
	if r.limit() != rate.Inf {
		t.Fatalf("quiet tail lowered the rate to %v", r.limit())
	}
	// Cold reads at full speed, tail on time: nothing changes.
	for range 10 {
		r.window(t, true, 0, 10, 450*time.Microsecond)
	}
	if r.limit() != rate.Inf {
		t.Fatalf("tail on time, yet the rate is %v", r.limit())
	}
	// The tail is late (3 ms against a quiet p99 of 400 µs): from
	// unlimited straight to the floor.
	r.window(t, true, 0, 10, 3*time.Millisecond)
	if got := r.limit(); got != tailFloor {
		t.Fatalf("after one late window: rate %v, want the floor %v", got, rate.Limit(tailFloor))
	}
	// On time again: the rate grows back, window by window.
	for range 20 {
		r.window(t, true, 0, 10, 450*time.Microsecond)
	}
	grown := r.limit()
	if grown <= 2*tailFloor {
		t.Fatalf("rate %v after 20 windows on time, want it well above the floor", grown)
	}
	// Late again: halved per window, down to the floor.
	r.window(t, true, 0, 10, 3*time.Millisecond)
	if got := r.limit(); got != grown/2 {
		t.Fatalf("late window: rate %v, want half of %v", got, grown)
	}
	for range 20 {
		r.window(t, true, 0, 10, 3*time.Millisecond)
	}
	if got := r.limit(); got != tailFloor {
		t.Fatalf("rate %v after many late windows, want the floor %v", got, rate.Limit(tailFloor))
	}
	// Tail on time but no cold download moving: nothing tested, nothing
	// raised.
	for range 20 {
		r.window(t, false, 0, 10, 450*time.Microsecond)
	}
	if got := r.limit(); got != tailFloor {
		t.Fatalf("rate %v rose without cold reads to show it is harmless", got)
	}
	// No tail traffic for longer than tailIdle: no limit.
	r.now = r.now.Add(tailIdle + tailWindow)
	r.t.guardTick()
	if got := r.limit(); got != rate.Inf {
		t.Fatalf("rate %v after the tail went away, want Inf", got)
	}
	st := r.t.Stats()
	if st.Backoffs < 3 || st.TailLate < 20 || st.ColdRate != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTailGuardLateOnlyWhileColdReadsMove: a slow tail with no cold
// download moving is the machine's normal (it joins the reference), not a
// reason to slow cold reads.
func TestTailGuardLateOnlyWhileColdReadsMove(t *testing.T) {
	r := newGuardRig(t, false)
	for range 40 {
		r.window(t, false, 0, 10, 3*time.Millisecond)
	}
	if got := r.limit(); got != rate.Inf {
		t.Fatalf("rate %v without cold reads", got)
	}
	// The quiet reference is 3 ms now: cold reads with the tail at 3 ms
	// are not slowed.
	for range 10 {
		r.window(t, true, 0, 10, 3*time.Millisecond)
	}
	if got := r.limit(); got != rate.Inf {
		t.Fatalf("rate %v with the tail as slow as without cold reads", got)
	}
}

// TestTailGuardPressure: with the tail on time as the broker sees it, CPU
// pressure above its level without cold reads still backs them off; the
// same pressure without cold reads moving does not.
func TestTailGuardPressure(t *testing.T) {
	r := newGuardRig(t, true)
	for range 40 {
		r.window(t, false, 0.15, 10, 400*time.Microsecond)
	}
	for range 5 {
		r.window(t, true, 0.165, 10, 400*time.Microsecond) // within the margin
	}
	if got := r.limit(); got != rate.Inf {
		t.Fatalf("rate %v with pressure within the margin", got)
	}
	r.window(t, true, 0.8, 10, 400*time.Microsecond)
	if got := r.limit(); got == rate.Inf {
		t.Fatal("pressure 0.8 against 0.15 without cold reads did not back off")
	}
	if st := r.t.Stats(); st.Crowded != 1 || st.Backoffs != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTailGuardCeilingAndOff: the configured rate bounds what the guard
// grows back to; with the guard off, samples change nothing and an
// unconfigured rate means no limiter at all.
func TestTailGuardCeilingAndOff(t *testing.T) {
	r := newGuardRig(t, false)
	r.t.SetFetchRate(32 << 20)
	for range 2 * quietEnough / 10 {
		r.window(t, false, 0, 10, 400*time.Microsecond)
	}
	r.window(t, true, 0, 10, 3*time.Millisecond)
	if got := r.limit(); got != tailFloor {
		t.Fatalf("rate %v, want the floor: from the ceiling straight down", got)
	}
	for range 100 {
		r.window(t, true, 0, 10, 400*time.Microsecond)
	}
	if got := r.limit(); got != 32<<20 {
		t.Fatalf("rate %v grew past the ceiling", got)
	}
	// Off: the ceiling again at once, and samples change nothing.
	r.window(t, true, 0, 10, 3*time.Millisecond)
	if got := r.limit(); got != tailFloor {
		t.Fatalf("rate %v, want the floor", got)
	}
	backoffs := r.t.Stats().Backoffs
	r.t.SetTailGuard(false)
	if got := r.limit(); got != 32<<20 {
		t.Fatalf("guard off: rate %v, want the 32 MiB/s ceiling", got)
	}
	for range 5 {
		r.window(t, true, 0, 10, 3*time.Millisecond)
	}
	if got, st := r.limit(), r.t.Stats(); got != 32<<20 || st.Backoffs != backoffs {
		t.Fatalf("guard off: rate %v, backoffs %d (were %d)", got, st.Backoffs, backoffs)
	}
	r.t.SetFetchRate(0)
	if r.t.fetchRate != nil {
		t.Fatal("guard off and no rate: want no limiter at all")
	}
}

// TestTailGuardToleratesOutliers: a p99 goal tolerates the odd slow
// request. One late sample in 300 while cold reads move does not slow them;
// a late sample in every window does.
func TestTailGuardToleratesOutliers(t *testing.T) {
	r := newGuardRig(t, false)
	for range 2 * quietEnough / 10 {
		r.window(t, false, 0, 10, 400*time.Microsecond)
	}
	for i := range 60 {
		lat := 450 * time.Microsecond
		if i%15 == 7 {
			r.window(t, true, 0, 1, 3*time.Millisecond) // one late produce sample (wake: 300 µs, on time)
			continue
		}
		r.window(t, true, 0, 10, lat)
	}
	if got := r.limit(); got != rate.Inf {
		t.Fatalf("rate %v after a late sample in 300", got)
	}
	for range 10 {
		r.window(t, true, 0, 1, 3*time.Millisecond)
		r.window(t, true, 0, 10, 450*time.Microsecond)
	}
	if got := r.limit(); got == rate.Inf {
		t.Fatal("a late sample in every other window did not slow cold reads")
	}
}

// TestTailGuardNeedsAReference: before any window has ended there is no
// reference, and no sample is late, however slow.
func TestTailGuardNeedsAReference(t *testing.T) {
	r := newGuardRig(t, false)
	r.t.guard.tookRate(1 << 20)
	for range 10 {
		r.t.ObserveTail(TailProduce, time.Second)
	}
	if st := r.t.Stats(); st.TailLate != 0 || st.TailSamples != 10 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTailGuardRealClock drives the guard on the real clock, so a window's
// end runs on its own goroutine as in the broker: a quiet tail, then cold
// reads with a tail five times slower, lower the rate.
func TestTailGuardRealClock(t *testing.T) {
	tr := New(NewMemStore(), nil, 0)
	tr.guard.mu.Lock()
	tr.guard.psi = nil // this machine's pressure is not the test's business
	tr.guard.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for tr.guard.refReady(TailProduce) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no reference after 10 s of quiet samples")
		}
		tr.ObserveTail(TailProduce, 400*time.Microsecond)
		time.Sleep(200 * time.Microsecond)
	}
	for tr.coldRateInForce() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("cold reads never slowed for a tail 5 times slower")
		}
		tr.guard.tookRate(64 << 10)
		tr.ObserveTail(TailProduce, 5*time.Millisecond)
		time.Sleep(200 * time.Microsecond)
	}
	if got := tr.coldRateInForce(); got != tailFloor {
		t.Fatalf("rate %d, want the floor", got)
	}
}

func TestParsePressure(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"some avg10=1.00 avg60=6.80 avg300=11.78 total=3996974950\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 3996974950 * time.Microsecond, true},
		{"some avg10=0.00 avg60=0.00 avg300=0.00 total=12\n", 12 * time.Microsecond, true},
		{"full avg10=0.00 total=5\n", 0, false},
		{"some avg10=0.00 total=-3\n", 0, false},
		{"some avg10=0.00 total=x\n", 0, false},
		{"", 0, false},
	} {
		got, ok := parsePressure([]byte(c.in))
		if got != c.want || ok != c.ok {
			t.Errorf("parsePressure(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	if p := openPressure(); p != nil {
		if _, ok := p.share(p.at.Add(time.Second), time.Minute); !ok {
			t.Errorf("%s: readable at open, not after", p.path)
		}
	}
}

// TestServeColdPacesWhileLowered: while the guard has lowered the rate, a
// fetch response carries at most serveBurst cold bytes, and once the bytes
// charged run ahead of the rate, reads wait (for about as long as the rate
// needs to catch up); otherwise nothing is bounded or charged.
func TestServeColdPacesWhileLowered(t *testing.T) {
	r := newGuardRig(t, false)
	if capBytes, wait := r.t.ServeCold(); capBytes != 0 || wait != nil {
		t.Fatalf("rate not lowered: cap %d, wait %v", capBytes, wait)
	}
	r.t.ChargeCold(64 << 20) // not lowered: not counted
	for range 2 * quietEnough / 10 {
		r.window(t, false, 0, 10, 400*time.Microsecond)
	}
	r.window(t, true, 0, 10, 3*time.Millisecond)
	if got := r.limit(); got != tailFloor {
		t.Fatalf("rate %v, want the floor", got)
	}
	if capBytes, wait := r.t.ServeCold(); capBytes != serveBurst || wait != nil {
		t.Fatalf("lowered, nothing served yet: cap %d, wait %v", capBytes, wait)
	}
	r.t.ChargeCold(serveBurst) // the burst
	r.t.ChargeCold(serveBurst) // a quarter of a second ahead of 4 MiB/s
	start := time.Now()
	capBytes, wait := r.t.ServeCold()
	if capBytes != 0 || wait == nil {
		t.Fatalf("ahead of the rate: cap %d, wait %v", capBytes, wait)
	}
	<-wait
	if el, want := time.Since(start), time.Second*serveBurst/tailFloor; el < want*8/10 || el > want*3 {
		t.Fatalf("waited %v, want about %v", el, want)
	}
	if capBytes, wait := r.t.ServeCold(); capBytes != serveBurst || wait != nil {
		t.Fatalf("caught up: cap %d, wait %v", capBytes, wait)
	}
	// The tail goes away: the rate is lifted and nothing is bounded.
	r.now = r.now.Add(tailIdle + tailWindow)
	r.t.guardTick()
	if capBytes, wait := r.t.ServeCold(); capBytes != 0 || wait != nil {
		t.Fatalf("lifted: cap %d, wait %v", capBytes, wait)
	}
}

// TestServeColdSharesOneTimer: reads waiting out the same debt share one
// channel (a client polling without MaxWait does not start a timer per
// request); more debt gets a later one.
func TestServeColdSharesOneTimer(t *testing.T) {
	r := newGuardRig(t, false)
	for range 2 * quietEnough / 10 {
		r.window(t, false, 0, 10, 400*time.Microsecond)
	}
	r.window(t, true, 0, 10, 3*time.Millisecond)
	r.t.ChargeCold(2 * serveBurst)
	_, w1 := r.t.ServeCold()
	_, w2 := r.t.ServeCold()
	if w1 == nil || w1 != w2 {
		t.Fatalf("same debt, channels %v and %v", w1, w2)
	}
	r.t.ChargeCold(serveBurst)
	if _, w3 := r.t.ServeCold(); w3 == nil || w3 == w1 {
		t.Fatal("more debt, want a later channel")
	}
}

// TestServedColdReadsLiftTheRate: once tail traffic is gone, a rate lowered
// for it rises again for a catch-up reader whose cold data all comes from
// the cache (no download, so no download ends the guard's windows): served
// cold reads end them too.
func TestServedColdReadsLiftTheRate(t *testing.T) {
	r := newGuardRig(t, false)
	for range 2 * quietEnough / 10 {
		r.window(t, false, 0, 10, 400*time.Microsecond)
	}
	r.window(t, true, 0, 10, 3*time.Millisecond)
	if got := r.limit(); got != tailFloor {
		t.Fatalf("rate %v, want the floor", got)
	}
	// The tail is gone; the reader is served from the cache only.
	for i := 0; i < 5; i++ {
		r.now = r.now.Add(tailIdle / 2)
		r.t.ChargeCold(serveBurst)
		r.t.ServeCold()
	}
	if capBytes, wait := r.t.ServeCold(); capBytes != 0 || wait != nil {
		t.Fatalf("tail gone, cold data served from the cache: still paced (cap %d, rate %v)", capBytes, r.limit())
	}
}
