package logrepeat

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// fakeClock runs AfterFunc callbacks synchronously when Advance passes
// their time.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// armed is the number of timers not fired or stopped.
func (c *fakeClock) armed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped {
			n++
		}
	}
	return n
}

// Advance moves the clock by d, firing due timers in order (each at its
// time).
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		var due *fakeTimer
		for _, t := range c.timers {
			if !t.stopped && !t.at.After(end) {
				due = t
				break
			}
		}
		if due == nil {
			break
		}
		due.stopped = true
		if due.at.After(c.now) {
			c.now = due.at
		}
		c.mu.Unlock()
		due.f()
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}

func setup(t *testing.T, o Options) (*Logger, *fakeClock, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	c := newFakeClock()
	o.Clock = c
	return New(zap.New(core), o), c, logs
}

func messages(logs *observer.ObservedLogs) []string {
	var out []string
	for _, e := range logs.All() {
		out = append(out, e.Message)
	}
	return out
}

func TestFirstAtOnceThenOneSummaryPerInterval(t *testing.T) {
	l, c, logs := setup(t, Options{Interval: time.Minute})
	// A maintenance pass every 10 s over 1000 offline partitions.
	for pass := 0; pass < 6; pass++ {
		for p := 0; p < 1000; p++ {
			l.Warn("maintenance", zap.String("topic", "orders"), zap.Int32("partition", int32(p)), zap.Error(errors.New("storage error")))
		}
		c.Advance(10 * time.Second)
	}
	got := logs.All()
	if len(got) != 2 {
		t.Fatalf("want the first line and one summary, got %d: %q", len(got), messages(logs))
	}
	first := got[0].ContextMap()
	if got[0].Message != "maintenance" || first["topic"] != "orders" || first["partition"] != int32(0) || first["error"] != "storage error" {
		t.Fatalf("first line: %q %v", got[0].Message, first)
	}
	if got[0].Level != zapcore.WarnLevel || got[1].Level != zapcore.WarnLevel {
		t.Fatalf("levels %v %v", got[0].Level, got[1].Level)
	}
	want := "maintenance (repeated 5999 times in the last 1m0s, e.g. topic=orders partition=999)"
	if got[1].Message != want {
		t.Fatalf("summary %q, want %q", got[1].Message, want)
	}
	sum := got[1].ContextMap()
	if sum["repeated"] != int64(5999) || sum["partition"] != int32(999) || sum["error"] != "storage error" || sum["interval"] != time.Minute {
		t.Fatalf("summary fields %v", sum)
	}
	// It keeps repeating: one summary per further interval, no first line.
	for i := 0; i < 3; i++ {
		l.Warn("maintenance", zap.Int32("partition", 1))
	}
	c.Advance(time.Minute)
	if n := logs.Len(); n != 3 || logs.All()[2].Message != "maintenance (repeated 3 times in the last 1m0s, e.g. partition=1)" {
		t.Fatalf("second interval: %q", messages(logs))
	}
	// A quiet interval: forgotten, the timer stops, and the next one is
	// logged at once again.
	c.Advance(time.Minute)
	if l.Pending() != 0 || c.armed() != 0 {
		t.Fatalf("after a quiet interval: %d keys, %d timers", l.Pending(), c.armed())
	}
	if logs.Len() != 3 {
		t.Fatalf("a quiet interval logged %q", messages(logs))
	}
	l.Warn("maintenance", zap.Int32("partition", 2))
	if n := logs.Len(); n != 4 || logs.All()[3].Message != "maintenance" {
		t.Fatalf("after the quiet interval: %q", messages(logs))
	}
}

func TestSingleOccurrenceGivesNoSummary(t *testing.T) {
	l, c, logs := setup(t, Options{})
	l.Warn("upload to the tiered store", zap.String("topic", "a"))
	c.Advance(5 * time.Minute)
	if logs.Len() != 1 {
		t.Fatalf("got %q", messages(logs))
	}
	if l.Pending() != 0 {
		t.Fatalf("%d keys still tracked", l.Pending())
	}
}

func TestKeysAndLevelsAreSeparate(t *testing.T) {
	l, c, logs := setup(t, Options{Interval: time.Minute})
	l.Warn("a", zap.Int("i", 1))
	l.Warn("b", zap.Int("i", 1))
	l.Error("a", zap.Int("i", 1)) // same message, other level: its own key
	l.Log(zapcore.WarnLevel, "a/x", "a", zap.Int("i", 1))
	for i := 2; i <= 4; i++ {
		l.Warn("a", zap.Int("i", i))
		l.Warn("b", zap.Int("i", i))
	}
	if logs.Len() != 4 {
		t.Fatalf("first lines: %q", messages(logs))
	}
	c.Advance(time.Minute)
	got := messages(logs)[4:]
	want := []string{"a (repeated 3 times in the last 1m0s, e.g. i=4)", "b (repeated 3 times in the last 1m0s, e.g. i=4)"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("summaries %q, want %q", got, want)
	}
}

func TestIntervalsAreKeyedToTheirFirstOccurrence(t *testing.T) {
	l, c, logs := setup(t, Options{Interval: time.Minute})
	l.Warn("a")
	c.Advance(30 * time.Second)
	l.Warn("a") // counted, a's interval ends at 1m
	l.Warn("b")
	l.Warn("b") // b's ends at 1m30s
	c.Advance(31 * time.Second)
	if got := messages(logs); len(got) != 3 || got[2] != "a (repeated 1 times in the last 1m0s)" {
		t.Fatalf("at 1m01s: %q", got)
	}
	c.Advance(30 * time.Second)
	if got := messages(logs); len(got) != 4 || got[3] != "b (repeated 1 times in the last 1m0s)" {
		t.Fatalf("at 1m31s: %q", got)
	}
}

func TestOccurrenceAfterTheIntervalReportsFirst(t *testing.T) {
	// If the timer has not run yet when the interval is over (a busy
	// machine), the next occurrence reports the ended interval itself,
	// before counting in a new one.
	core, logs := observer.New(zapcore.DebugLevel)
	c := &lateClock{fakeClock: newFakeClock()}
	l := New(zap.New(core), Options{Interval: time.Minute, Clock: c})
	l.Warn("a")
	l.Warn("a")
	c.Advance(2 * time.Minute) // timers never fire on a lateClock
	l.Warn("a")
	got := messages(logs)
	if len(got) != 2 || got[1] != "a (repeated 1 times in the last 1m0s)" {
		t.Fatalf("got %q", got)
	}
	l.Flush()
	if got := messages(logs); len(got) != 3 || !strings.HasPrefix(got[2], "a (repeated 1 times in the last ") {
		t.Fatalf("after flush %q", got)
	}
}

// lateClock never fires its timers.
type lateClock struct{ *fakeClock }

func (c *lateClock) AfterFunc(time.Duration, func()) Timer {
	return &fakeTimer{c: c.fakeClock, stopped: true}
}

func TestBoundedKeys(t *testing.T) {
	l, c, logs := setup(t, Options{Interval: time.Minute, MaxKeys: 3})
	for round := 0; round < 5; round++ {
		for k := 0; k < 100; k++ {
			l.Warn(fmt.Sprintf("msg %d", k), zap.Int("round", round))
		}
	}
	if n := l.Pending(); n > 4 {
		t.Fatalf("%d keys tracked, bound 3 (+ the overflow key)", n)
	}
	// Three keys logged at once, then the first overflowing message with
	// a note; everything else counted.
	got := logs.All()
	if len(got) != 4 {
		t.Fatalf("got %q", messages(logs))
	}
	if got[3].Message != "msg 3" || !strings.Contains(got[3].ContextMap()["logrepeat_note"].(string), "over 3 distinct") {
		t.Fatalf("overflow line %q %v", got[3].Message, got[3].ContextMap())
	}
	c.Advance(time.Minute)
	sums := messages(logs)[4:]
	want := []string{
		"msg 0 (repeated 4 times in the last 1m0s, e.g. round=4)",
		"msg 1 (repeated 4 times in the last 1m0s, e.g. round=4)",
		"msg 2 (repeated 4 times in the last 1m0s, e.g. round=4)",
		`other repeating messages (repeated 484 times in the last 1m0s, e.g. round=4 message=msg 99)`,
	}
	if strings.Join(sums, "|") != strings.Join(want, "|") {
		t.Fatalf("summaries\n%q\nwant\n%q", sums, want)
	}
	total := 0
	for _, e := range logs.All()[4:] {
		total += int(e.ContextMap()["repeated"].(int64))
	}
	if total+4 != 500 {
		t.Fatalf("%d occurrences accounted for, want 500", total+4)
	}
}

func TestFlushAndClose(t *testing.T) {
	l, c, logs := setup(t, Options{Interval: time.Minute})
	l.Warn("final upload", zap.String("topic", "t"))
	l.Warn("final upload", zap.String("topic", "u"))
	c.Advance(20 * time.Second)
	l.Close()
	got := messages(logs)
	if len(got) != 2 || got[1] != "final upload (repeated 1 times in the last 20s, e.g. topic=u)" {
		t.Fatalf("got %q", got)
	}
	if c.armed() != 0 {
		t.Fatal("timer still armed after Close")
	}
	// After Close every occurrence is logged as it comes.
	l.Warn("final upload")
	l.Warn("final upload")
	if logs.Len() != 4 {
		t.Fatalf("after close: %q", messages(logs))
	}
}

func TestLevelDisabledAndNil(t *testing.T) {
	core, logs := observer.New(zapcore.ErrorLevel)
	l := New(zap.New(core), Options{Clock: newFakeClock()})
	l.Warn("not shown")
	if logs.Len() != 0 || l.Pending() != 0 {
		t.Fatal("a disabled level was logged or tracked")
	}
	var nl *Logger
	nl.Warn("nothing")
	nl.Flush()
	nl.Close()
	New(nil, Options{}).Warn("to nowhere")
}

func TestConcurrentUseRealClock(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := New(zap.New(core), Options{Interval: 20 * time.Millisecond, MaxKeys: 8})
	var wg sync.WaitGroup
	const workers, each = 8, 500
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				l.Warn(fmt.Sprintf("m%d", i%12), zap.Int("w", w))
				if i%100 == 0 {
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	l.Close()
	// Every occurrence is either a line of its own or in a count.
	total := 0
	for _, e := range logs.All() {
		if n, ok := e.ContextMap()["repeated"]; ok {
			total += int(n.(int64))
		} else {
			total++
		}
	}
	if total != workers*each {
		t.Fatalf("%d occurrences accounted for, want %d (%d lines)", total, workers*each, logs.Len())
	}
	if logs.Len() > workers*each/4 {
		t.Fatalf("%d lines for %d occurrences", logs.Len(), workers*each)
	}
}
