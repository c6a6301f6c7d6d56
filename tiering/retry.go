package tiering

import (
	"context"
	"errors"
	"io"
	"time"
)

// Retrying wraps a store so transient failures (503 SlowDown, timeouts,
// connection refused: anything but not-found, already-exists and bad-range
// answers) are retried with exponential backoff, 50 ms doubling to 2 s, up
// to attempts tries or the context's end. Puts are retried only when the
// body can be re-read (an io.Seeker, as the uploader's section readers are).
func Retrying(s ObjectStore, attempts int) ObjectStore {
	if attempts < 1 {
		attempts = 1
	}
	return &retryStore{s: s, attempts: attempts}
}

type retryStore struct {
	s        ObjectStore
	attempts int
}

// permanent reports whether err is an answer (or the caller's context
// ending) rather than a failure worth another try. A timeout of one attempt
// (a dial or response-header timeout also matches
// context.DeadlineExceeded) is transient while ctx itself is alive.
func permanent(ctx context.Context, err error) bool {
	return err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrExists) || errors.Is(err, ErrBadRange) || errors.Is(err, ErrTooLarge) ||
		ctx.Err() != nil
}

func (r *retryStore) do(ctx context.Context, op func() error) error {
	backoff := 50 * time.Millisecond
	var err error
	for i := 0; i < r.attempts; i++ {
		if err = op(); permanent(ctx, err) {
			return err
		}
		if i == r.attempts-1 {
			break
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	return err
}

// LinkFile implements FileLinker when the wrapped store does.
func (r *retryStore) LinkFile(ctx context.Context, key, path string, size int64) error {
	l, ok := r.s.(FileLinker)
	if !ok {
		return errors.New("tiering: store cannot link files")
	}
	return l.LinkFile(ctx, key, path, size)
}

func (r *retryStore) put(ctx context.Context, body io.Reader, op func(io.Reader) error) error {
	seeker, ok := body.(io.Seeker)
	if !ok {
		return op(body) // cannot rewind: one try
	}
	return r.do(ctx, func() error {
		if _, err := seeker.Seek(0, io.SeekStart); err != nil {
			return err
		}
		return op(body)
	})
}

func (r *retryStore) Put(ctx context.Context, key string, body io.Reader, size int64) error {
	return r.put(ctx, body, func(b io.Reader) error { return r.s.Put(ctx, key, b, size) })
}

func (r *retryStore) PutIfAbsent(ctx context.Context, key string, body io.Reader, size int64) error {
	return r.put(ctx, body, func(b io.Reader) error { return r.s.PutIfAbsent(ctx, key, b, size) })
}

func (r *retryStore) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	var out []byte
	err := r.do(ctx, func() error {
		var err error
		out, err = r.s.GetRange(ctx, key, off, n)
		return err
	})
	return out, err
}

// AbortUploads implements UploadAborter when the wrapped store does.
func (r *retryStore) AbortUploads(ctx context.Context) (int, error) {
	a, ok := r.s.(UploadAborter)
	if !ok {
		return 0, nil
	}
	var n int
	err := r.do(ctx, func() error {
		var err error
		n, err = a.AbortUploads(ctx)
		return err
	})
	return n, err
}

// GetRangeInto implements RangeReader; a retry calls onRead from position 0
// again.
func (r *retryStore) GetRangeInto(ctx context.Context, key string, off int64, dst []byte, onRead func(int, []byte)) error {
	return r.do(ctx, func() error { return getRangeInto(ctx, r.s, key, off, dst, onRead) })
}

func (r *retryStore) Delete(ctx context.Context, key string) error {
	return r.do(ctx, func() error { return r.s.Delete(ctx, key) })
}

func (r *retryStore) List(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	err := r.do(ctx, func() error {
		var err error
		out, err = r.s.List(ctx, prefix)
		return err
	})
	return out, err
}
