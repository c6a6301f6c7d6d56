// Package logrepeat keeps a log readable when the same warning comes back
// over and over (one line per offline partition per maintenance pass, per
// failed upload, per refused connection): the first occurrence of a key is
// logged at once with its fields; the further ones within the interval are
// only counted, and when the interval ends one line says how many there
// were, with the fields of the last one as an example:
//
//	maintenance (repeated 11999 times in the last 1m0s, e.g. topic=orders partition=7)
//
// A key that keeps repeating gives one such line per interval; a key quiet
// for a whole interval is forgotten, so its next occurrence is logged at
// once again. Memory is bounded: at most MaxKeys keys are tracked; past
// that, occurrences of new keys share one overflow key (the first is
// logged, the rest counted). Unlike zap's sampler nothing is dropped
// silently. No goroutine runs while nothing is pending: a timer is armed
// only for the next end of an interval with counts to report.
package logrepeat

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DefaultInterval is the interval New uses for 0.
const DefaultInterval = time.Minute

// DefaultMaxKeys is the bound on tracked keys New uses for 0.
const DefaultMaxKeys = 1024

// overflowKey collects the occurrences of keys that found no room.
const overflowKey = "\x00overflow"

// Clock is what the Logger needs of time; tests pass a fake one.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f on its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface{ Stop() bool }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(d, f)
}

// Options configure a Logger; zero fields take the defaults.
type Options struct {
	Interval time.Duration // DefaultInterval
	MaxKeys  int           // DefaultMaxKeys
	Clock    Clock         // the real clock
}

// Logger wraps a zap.Logger for messages that may repeat. It is safe for
// concurrent use. The zero value is not usable; a nil *Logger logs nothing.
type Logger struct {
	logger   *zap.Logger
	interval time.Duration
	maxKeys  int
	clock    Clock

	mu      sync.Mutex
	keys    map[string]*entry
	timer   Timer
	timerAt time.Time // when timer fires; zero: none armed
	closed  bool
}

// entry is one key's current interval.
type entry struct {
	level   zapcore.Level
	msg     string
	start   time.Time // of the interval
	end     time.Time
	count   int         // occurrences since start not logged
	example []zap.Field // the last counted occurrence's fields
}

// New returns a Logger writing to logger (nil: nowhere).
func New(logger *zap.Logger, o Options) *Logger {
	if logger == nil {
		logger = zap.NewNop()
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	return &Logger{logger: logger, interval: o.Interval, maxKeys: o.MaxKeys, clock: o.Clock, keys: map[string]*entry{}}
}

// Warn logs msg at warn level, keyed by msg: the same message for other
// partitions (other fields) counts as a repeat.
func (l *Logger) Warn(msg string, fields ...zap.Field) { l.Log(zapcore.WarnLevel, msg, msg, fields...) }

// Error is Warn at error level.
func (l *Logger) Error(msg string, fields ...zap.Field) {
	l.Log(zapcore.ErrorLevel, msg, msg, fields...)
}

// Info is Warn at info level.
func (l *Logger) Info(msg string, fields ...zap.Field) { l.Log(zapcore.InfoLevel, msg, msg, fields...) }

// Log logs msg with fields now if key has not occurred in the current
// interval, else counts it for the interval's summary line. Keys are per
// level: the same key at two levels is two keys.
func (l *Logger) Log(level zapcore.Level, key, msg string, fields ...zap.Field) {
	if l == nil || !l.logger.Core().Enabled(level) {
		return
	}
	key = level.String() + "\x00" + key
	now := l.clock.Now()
	var out []line
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.write([]line{{level, msg, fields}})
		return
	}
	e := l.keys[key]
	if e != nil && !now.Before(e.end) {
		// The interval ended and the timer has not run yet: report it
		// first, as the timer would have.
		out = append(out, l.dueLocked(now)...)
		e = l.keys[key]
	}
	if e == nil && len(l.keys) >= l.maxKeys {
		// No room: the occurrence counts under the level's overflow key,
		// whose first line says so (once per interval).
		key = level.String() + overflowKey
		fields = append(fields[:len(fields):len(fields)], zap.String("logrepeat_note", fmt.Sprintf(
			"over %d distinct repeating messages: further ones are counted together", l.maxKeys)))
		if e = l.keys[key]; e != nil {
			fields = append(fields, zap.String("message", msg)) // the summary's example names it
		}
	}
	if e != nil {
		e.count++
		e.example = fields
	} else {
		e = &entry{level: level, msg: msg, start: now, end: now.Add(l.interval)}
		if strings.HasSuffix(key, overflowKey) {
			e.msg = "other repeating messages"
		}
		l.keys[key] = e
		out = append(out, line{level, msg, fields})
	}
	l.armLocked(now)
	l.mu.Unlock()
	l.write(out)
}

// Flush logs the counts of every key now, intervals unfinished or not (a
// stop reports what it saw), and forgets them.
func (l *Logger) Flush() {
	if l == nil {
		return
	}
	l.mu.Lock()
	now := l.clock.Now()
	var out []line
	for k, e := range l.keys {
		if e.count > 0 {
			out = append(out, summary(e, now.Sub(e.start)))
		}
		delete(l.keys, k)
	}
	l.mu.Unlock()
	sortLines(out)
	l.write(out)
}

// Close flushes and stops the timer; later occurrences are logged as they
// come (nothing could report counts any more).
func (l *Logger) Close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
		l.timer, l.timerAt = nil, time.Time{}
	}
	l.mu.Unlock()
	l.Flush()
}

// Pending returns the number of keys tracked now (tests).
func (l *Logger) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

// line is one log line to write once the lock is released.
type line struct {
	level  zapcore.Level
	msg    string
	fields []zap.Field
}

func (l *Logger) write(lines []line) {
	for _, ln := range lines {
		if ce := l.logger.Check(ln.level, ln.msg); ce != nil {
			ce.Write(ln.fields...)
		}
	}
}

// dueLocked ends every interval over at now: a key with counts gets its
// summary line and a new interval (it is still repeating); a key without
// is forgotten. l.mu held.
func (l *Logger) dueLocked(now time.Time) []line {
	var out []line
	for k, e := range l.keys {
		if now.Before(e.end) {
			continue
		}
		if e.count == 0 {
			delete(l.keys, k)
			continue
		}
		out = append(out, summary(e, l.interval))
		e.start, e.end, e.count, e.example = e.end, e.end.Add(l.interval), 0, nil
		if !now.Before(e.end) { // more than an interval late (the clock jumped): start over
			e.start, e.end = now, now.Add(l.interval)
		}
	}
	sortLines(out)
	return out
}

// armLocked makes sure the timer fires at the earliest end of an interval.
// l.mu held.
func (l *Logger) armLocked(now time.Time) {
	var next time.Time
	for _, e := range l.keys {
		if next.IsZero() || e.end.Before(next) {
			next = e.end
		}
	}
	if next.IsZero() || (!l.timerAt.IsZero() && !next.Before(l.timerAt)) {
		return // nothing to wait for, or the armed timer fires first
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timerAt = next
	l.timer = l.clock.AfterFunc(max(next.Sub(now), 0), l.fire)
}

// fire is the timer: it reports the intervals that ended and arms the
// timer for the next one.
func (l *Logger) fire() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	now := l.clock.Now()
	l.timer, l.timerAt = nil, time.Time{}
	out := l.dueLocked(now)
	l.armLocked(now)
	l.mu.Unlock()
	l.write(out)
}

// summary is the line reporting e's count over the last d.
func summary(e *entry, d time.Duration) line {
	msg := fmt.Sprintf("%s (repeated %d times in the last %s", e.msg, e.count, d.Round(time.Millisecond))
	if eg := describe(e.example); eg != "" {
		msg += ", e.g. " + eg
	}
	msg += ")"
	fields := append(e.example[:len(e.example):len(e.example)], zap.Int("repeated", e.count), zap.Duration("interval", d))
	return line{e.level, msg, fields}
}

// describe renders fields as "k=v k=v" for the summary's message, leaving
// out errors (they stay in the structured fields) and logrepeat's own
// notes.
func describe(fields []zap.Field) string {
	enc := zapcore.NewMapObjectEncoder()
	var names []string
	for _, f := range fields {
		if f.Type == zapcore.ErrorType || strings.HasPrefix(f.Key, "logrepeat_") {
			continue
		}
		if _, seen := enc.Fields[f.Key]; !seen {
			names = append(names, f.Key)
		}
		f.AddTo(enc)
	}
	parts := make([]string, 0, len(names))
	for _, k := range names {
		v, ok := enc.Fields[k]
		if !ok {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=%v", k, v))
	}
	return strings.Join(parts, " ")
}

func sortLines(out []line) {
	sort.Slice(out, func(i, j int) bool { return out[i].msg < out[j].msg })
}
