// Package fdbudget counts the file descriptors a broker holds against a
// limit derived from RLIMIT_NOFILE, so running short of descriptors slows or
// narrows work instead of failing it: a holder that can wait waits for a
// slot, one that cannot (a fetch reading one more partition) is told no and
// does less.
package fdbudget

import (
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Budget is a counting semaphore of descriptor slots. The zero value is not
// usable; a nil *Budget is unbounded (every method succeeds).
type Budget struct {
	// max and used change only under mu; they are atomic so that Max and
	// Pressed (read on every fetch read) take no lock.
	max  atomic.Int64
	used atomic.Int64

	mu      sync.Mutex
	peak    int
	refused int64
	freed   chan struct{} // closed (and replaced) when a slot is released and someone waits
	waiting bool
}

// New returns a budget of n slots (at least 1).
func New(n int) *Budget {
	b := &Budget{freed: make(chan struct{})}
	b.max.Store(int64(max(n, 1)))
	return b
}

// Max is the number of slots; 0 for a nil budget.
func (b *Budget) Max() int {
	if b == nil {
		return 0
	}
	return int(b.max.Load())
}

// Pressed reports whether less than half the slots are free (false for a
// nil budget).
func (b *Budget) Pressed() bool {
	return b != nil && b.used.Load() > b.max.Load()/2
}

// SetMax changes the number of slots (at least 1), for a limit changed at
// run time (prlimit). Slots held above a lowered max stay held; new ones
// are refused until enough are released.
func (b *Budget) SetMax(n int) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.max.Store(int64(max(n, 1)))
	b.wakeLocked()
	b.mu.Unlock()
}

// wakeLocked wakes the Acquire calls waiting for a slot. b.mu held.
func (b *Budget) wakeLocked() {
	if b.waiting {
		b.waiting = false
		close(b.freed)
		b.freed = make(chan struct{})
	}
}

// Stats returns the slots in use, the most ever in use and how many
// acquisitions were refused.
func (b *Budget) Stats() (used, peak int, refused int64) {
	if b == nil {
		return 0, 0, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return int(b.used.Load()), b.peak, b.refused
}

// TryAcquire takes one slot if, after it, at least keep slots stay free. It
// never waits. Holders that can be refused (reads) pass a keep > 0 so that
// writers and short-lived opens always find room.
func (b *Budget) TryAcquire(keep int) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used.Load()+1+int64(keep) > b.max.Load() {
		b.refused++
		return false
	}
	b.takeLocked()
	return true
}

func (b *Budget) takeLocked() {
	b.peak = max(b.peak, int(b.used.Add(1)))
}

// Acquire takes one slot, waiting up to d for one to be released. It
// reports false if none was.
func (b *Budget) Acquire(d time.Duration) bool {
	if b == nil {
		return true
	}
	var timer *time.Timer
	for {
		b.mu.Lock()
		if b.used.Load() < b.max.Load() {
			b.takeLocked()
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return true
		}
		if timer == nil {
			if d <= 0 {
				b.refused++
				b.mu.Unlock()
				return false
			}
			timer = time.NewTimer(d)
		}
		b.waiting = true
		ch := b.freed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			b.mu.Lock()
			ok := b.used.Load() < b.max.Load()
			if ok {
				b.takeLocked()
			} else {
				b.refused++
			}
			b.mu.Unlock()
			return ok
		}
	}
}

// Release returns one slot.
func (b *Budget) Release() {
	if b == nil {
		return
	}
	b.mu.Lock()
	if b.used.Add(-1) < 0 {
		b.mu.Unlock()
		panic("fdbudget: Release without Acquire")
	}
	b.wakeLocked()
	b.mu.Unlock()
}

// IsResource reports whether err is the kernel running out of a resource
// (descriptors, memory, disk space) rather than a failure of the file
// itself: worth a retry once the pressure passes, never a reason to take
// data offline.
func IsResource(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS, syscall.ENOSPC, syscall.EDQUOT:
		return true
	}
	return false
}

// Split is how a descriptor limit is shared out.
type Split struct {
	Limit       int // RLIMIT_NOFILE's soft limit, after raising
	Connections int // client connections allowed
	Files       int // files the log engine may hold (the Budget's size)
	Other       int // left for listeners, the bucket's HTTP connections, etc.
}

// Reserve is what Plan leaves for descriptors the budget does not count
// (listeners, the HTTP side port, the object store's connections, stdio,
// the runtime's own).
const Reserve = 128

// Plan shares limit out: Reserve for what the budget does not count,
// then up to half of the rest (at most wantConns) for connections, the
// remainder for files.
func Plan(limit, wantConns int) Split {
	rest := max(limit-Reserve, 16)
	conns := min(wantConns, max(rest/2, 8))
	return Split{Limit: limit, Connections: conns, Files: rest - conns, Other: limit - rest}
}
