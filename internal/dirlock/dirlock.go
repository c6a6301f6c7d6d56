// Package dirlock gives a data directory one owner: an exclusive flock(2)
// on a lock file inside it, held for the life of the process (Kafka holds a
// .lock per log directory the same way). The kernel drops the lock when the
// process dies, kill -9 included, so a stale lock file never blocks a
// restart.
package dirlock

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// FileName is the lock file's name inside the directory.
const FileName = ".lock"

// Lock is a held directory lock.
type Lock struct {
	f *os.File
}

// HeldError reports a directory locked by another process.
type HeldError struct {
	Dir string
	PID int // 0 if the holder's pid could not be read
}

func (e *HeldError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("data directory %s is in use by another process (pid %d): one broker per data directory", e.Dir, e.PID)
	}
	return fmt.Sprintf("data directory %s is in use by another process: one broker per data directory", e.Dir)
}

// Acquire takes dir's lock without waiting. It fails with *HeldError if
// another process (or another Acquire in this one) holds it. The lock file
// holds the owner's pid, for that error message.
func Acquire(dir string) (*Lock, error) {
	path := filepath.Join(dir, FileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if held {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:n])))
		f.Close()
		return nil, &HeldError{Dir: dir, PID: pid}
	}
	// Ours now: record our pid (best effort: the lock, not the text, is
	// what excludes).
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Release drops the lock. The file stays (removing it would race a new
// owner that opened it already).
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the last descriptor releases the flock
	l.f = nil
	return err
}
