package tiering

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
)

// ErrBadRange means a GetRange asked for bytes past the end of the object
// (or a negative offset). Every ObjectStore in this package wraps it.
var ErrBadRange = errors.New("tiering: range past end of object")

// checkRange validates a GetRange request against an object of the given
// size and returns the length to read.
func checkRange(key string, size, off, n int64) (int64, error) {
	if off < 0 || off > size || (n >= 0 && off+n > size) {
		return 0, fmt.Errorf("get %q [%d,+%d) of %d bytes: %w", key, off, n, size, ErrBadRange)
	}
	if n < 0 {
		n = size - off
		if n > maxWholeObject {
			return 0, fmt.Errorf("get %q from %d: %d bytes: %w", key, off, n, ErrTooLarge)
		}
	}
	return n, nil
}

// readBody reads exactly size bytes from r.
func readBody(r io.Reader, size int64) ([]byte, error) {
	if size < 0 {
		return nil, fmt.Errorf("negative size %d", size)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("read body (%d bytes): %w", size, err)
	}
	return buf, nil
}

// MemStore is an in-memory ObjectStore for unit tests, with a fault
// injection hook. The zero value is not usable; call NewMemStore.
type MemStore struct {
	mu    sync.RWMutex
	objs  map[string][]byte
	fault func(op, key string) error
}

var _ ObjectStore = (*MemStore)(nil)

// NewMemStore returns an empty in-memory store.
func NewMemStore() *MemStore {
	return &MemStore{objs: make(map[string][]byte)}
}

// SetFault installs f, called before every operation with op one of "put"
// (Put and PutIfAbsent), "get", "delete", "list" and the key (the prefix for
// "list"). A non-nil error from f is returned as-is and the operation is not
// performed. SetFault(nil) removes the hook.
func (m *MemStore) SetFault(f func(op, key string) error) {
	m.mu.Lock()
	m.fault = f
	m.mu.Unlock()
}

func (m *MemStore) check(op, key string) error {
	m.mu.RLock()
	f := m.fault
	m.mu.RUnlock()
	if f == nil {
		return nil
	}
	return f(op, key)
}

// Put implements ObjectStore.
func (m *MemStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	return m.put(ctx, key, r, size, false)
}

// PutIfAbsent implements ObjectStore.
func (m *MemStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	return m.put(ctx, key, r, size, true)
}

func (m *MemStore) put(ctx context.Context, key string, r io.Reader, size int64, ifAbsent bool) error {
	if err := m.check("put", key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mem put %q: %w", key, err)
	}
	if key == "" {
		return fmt.Errorf("mem put: empty key")
	}
	buf, err := readBody(r, size)
	if err != nil {
		return fmt.Errorf("mem put %q: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objs[key]; ok && ifAbsent {
		return fmt.Errorf("mem put %q: %w", key, ErrExists)
	}
	m.objs[key] = buf
	return nil
}

// GetRange implements ObjectStore.
func (m *MemStore) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if err := m.check("get", key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mem get %q: %w", key, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	obj, ok := m.objs[key]
	if !ok {
		return nil, fmt.Errorf("mem get %q: %w", key, ErrNotFound)
	}
	n, err := checkRange(key, int64(len(obj)), off, n)
	if err != nil {
		return nil, fmt.Errorf("mem %w", err)
	}
	out := make([]byte, n)
	copy(out, obj[off:off+n])
	return out, nil
}

// Delete implements ObjectStore.
func (m *MemStore) Delete(ctx context.Context, key string) error {
	if err := m.check("delete", key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mem delete %q: %w", key, err)
	}
	m.mu.Lock()
	delete(m.objs, key)
	m.mu.Unlock()
	return nil
}

// List implements ObjectStore.
func (m *MemStore) List(ctx context.Context, prefix string) ([]string, error) {
	if err := m.check("list", prefix); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mem list %q: %w", prefix, err)
	}
	m.mu.RLock()
	keys := make([]string, 0, len(m.objs))
	for k := range m.objs {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	m.mu.RUnlock()
	sort.Strings(keys)
	return keys, nil
}
