package memfs

import (
	"errors"
	"fmt"
	"sync"
)

// Op is a kind of mutating operation, as seen by an Injector.
type Op int

// The mutating operations. Reads, ReadDir, Size and Close are never injected.
const (
	OpWrite    Op = iota // File.WriteAt with a non-empty buffer
	OpSync               // File.Sync
	OpSyncDir            // FS.SyncDir
	OpCreate             // FS.OpenFile with O_CREATE when it creates the file
	OpRemove             // FS.Remove
	OpRename             // FS.Rename (path is the old name)
	OpTruncate           // File.Truncate, or OpenFile O_TRUNC of a non-empty file
	OpMkdir              // FS.MkdirAll when it creates at least one directory
)

var opNames = [...]string{"write", "sync", "syncdir", "create", "remove", "rename", "truncate", "mkdir"}

func (op Op) String() string {
	if op >= 0 && int(op) < len(opNames) {
		return opNames[op]
	}
	return fmt.Sprintf("Op(%d)", int(op))
}

// Injector is called before every mutating operation, after the operation's
// arguments have been validated (so an operation that fails on its own, such
// as removing a missing file, is not seen), with the cleaned absolute path
// the operation concerns (for file handles, the path they were opened with).
// If it returns nil the operation proceeds. Otherwise the operation is not
// performed and the error is returned as is, except that for OpWrite a
// *ShortWriteError makes the write store only its first N bytes and return
// (N, Err). The injector is called with the FS locked: it must not call the FS.
type Injector func(op Op, path string) error

// ShortWriteError, returned by an Injector for OpWrite, makes WriteAt write
// only the first N bytes of its buffer (clamped to [0, len]) and return that
// count with Err (io.ErrShortWrite if Err is nil). For other operations it is
// an ordinary error.
type ShortWriteError struct {
	N   int
	Err error
}

func (e *ShortWriteError) Error() string {
	return fmt.Sprintf("memfs: short write of %d bytes: %v", e.N, e.Err)
}

func (e *ShortWriteError) Unwrap() error { return e.Err }

// ErrCrashed is returned by every mutating operation from the crash point of
// a Crasher on.
var ErrCrashed = errors.New("memfs: crashed")

// Crasher is an injector that simulates a crash after a given number of
// mutating operations. Use it as fs.SetInjector(c.Inject). It is safe for
// concurrent use.
type Crasher struct {
	mu      sync.Mutex
	k       int
	count   int
	crashed bool
}

// CrashAfter returns a Crasher letting mutating operations 1..k proceed;
// operation k+1 and all later ones fail with ErrCrashed. A negative k never
// crashes, which lets a test count the operations of a workload first.
func CrashAfter(k int) *Crasher { return &Crasher{k: k} }

// Inject is the Injector of c.
func (c *Crasher) Inject(op Op, path string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count++
	if c.k >= 0 && c.count > c.k {
		c.crashed = true
	}
	if c.crashed {
		return ErrCrashed
	}
	return nil
}

// Crashed reports whether the crash point has been reached.
func (c *Crasher) Crashed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.crashed
}

// Count returns the number of mutating operations seen, including the
// crashing one and those after it.
func (c *Crasher) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count
}

// FailNth returns an Injector failing the n-th (1-based) operation of kind op
// with err; every other operation proceeds. For op == OpWrite, err may be a
// *ShortWriteError.
func FailNth(op Op, n int, err error) Injector {
	var mu sync.Mutex
	seen := 0
	return func(o Op, _ string) error {
		if o != op {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		seen++
		if seen == n {
			return err
		}
		return nil
	}
}

// ShortWriteNth returns an Injector making the n-th (1-based) write store
// only its first min(keep, len) bytes and return that count with err.
func ShortWriteNth(n, keep int, err error) Injector {
	return FailNth(OpWrite, n, &ShortWriteError{N: keep, Err: err})
}
