// Package tiering offloads sealed segments to object storage (S3 via
// aws-sdk-go-v2, a local directory, in-memory for tests), keeps the
// per-partition manifest, serves cold reads and restores a broker from its
// bucket. It imports log, never broker.
package tiering

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// ErrNotFound means the object does not exist.
var ErrNotFound = errors.New("tiering: object not found")

// ErrExists means a conditional create found the object already there.
var ErrExists = errors.New("tiering: object already exists")

// ErrTooLarge means a read to the end of an object (a manifest, an index,
// mirrored metadata: objects read whole) would take more than
// maxWholeObject bytes: not an object of ours, and never an allocation of
// whatever size the store reports.
var ErrTooLarge = errors.New("tiering: object too large to read whole")

// maxWholeObject bounds a read to the end of an object, and what PutMeta
// and manifest commits write (so nothing the broker writes is too large to
// read back). The largest objects read whole are mirrored group state and
// manifests (about 1.4 KB per segment: 1 GiB is some 700,000 segments in
// one partition). Memory is taken as the bytes arrive, so a length the
// store claims allocates nothing by itself. (A variable for tests.)
var maxWholeObject int64 = 1 << 30

// ObjectStore is the slice of an object store tiering needs. It is an
// interface because it has several real implementations: S3 (and any
// S3-compatible server), a local directory, and memory.
//
// Keys are slash-separated and never start with a slash. Every method is
// safe for concurrent use. Implementations retry nothing: the caller owns
// retry policy (see retry.go).
type ObjectStore interface {
	// Put stores size bytes from r under key, replacing any object there.
	// The object is visible whole or not at all.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// PutIfAbsent is Put that fails with ErrExists if key exists
	// (S3: If-None-Match: *).
	PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error
	// GetRange returns n bytes of key starting at off (n < 0: to the end,
	// at most maxWholeObject bytes, else ErrTooLarge). A range past the end is an error; ErrNotFound if
	// the key is missing.
	GetRange(ctx context.Context, key string, off, n int64) ([]byte, error)
	// Delete removes key; deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// List returns the keys under prefix, sorted.
	List(ctx context.Context, prefix string) ([]string, error)
}

// FileLinker is implemented by stores that can take an immutable local file
// without copying it (LocalDir: a hard link on the same file system).
// LinkFile stores the whole file at path (size bytes) under key, as Put
// would; any error means "not possible here" and the caller falls back to
// Put.
type FileLinker interface {
	LinkFile(ctx context.Context, key, path string, size int64) error
}

// UploadAborter is implemented by stores whose large Puts can leave
// incomplete uploads behind when interrupted (S3 multipart uploads: their
// parts are stored and billed, and no listing of objects shows them).
// AbortUploads aborts every incomplete upload under the store's prefix and
// returns how many; call it only while none of this broker's Puts runs.
type UploadAborter interface {
	AbortUploads(ctx context.Context) (int, error)
}

// RangeReader is implemented by stores that can read a range into the
// caller's buffer (cold reads download into recycled chunk buffers instead
// of a fresh allocation per GET). GetRangeInto fills dst with the len(dst)
// bytes of key at off, calling onRead (if not nil) with each piece as it
// arrives, in order, and its position in dst (a retry starts again at 0);
// a range past the end is an error, as for GetRange.
type RangeReader interface {
	GetRangeInto(ctx context.Context, key string, off int64, dst []byte, onRead func(at int, p []byte)) error
}

// getRangeInto is RangeReader.GetRangeInto for any store.
func getRangeInto(ctx context.Context, s ObjectStore, key string, off int64, dst []byte, onRead func(int, []byte)) error {
	if rr, ok := s.(RangeReader); ok {
		return rr.GetRangeInto(ctx, key, off, dst, onRead)
	}
	b, err := s.GetRange(ctx, key, off, int64(len(dst)))
	if err != nil {
		return err
	}
	if len(b) != len(dst) {
		return fmt.Errorf("tiering: %s [%d,+%d): got %d bytes: %w", key, off, len(dst), len(b), ErrBadRange)
	}
	copy(dst, b)
	if onRead != nil {
		onRead(0, dst)
	}
	return nil
}
