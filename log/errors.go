package log

import (
	"errors"
	"fmt"
	"os"

	"github.com/synapsebroker/synapse/internal/fdbudget"
)

// Sentinel errors of the log engine. Callers test them with errors.Is; the
// broker alone turns them into Kafka error codes.
var (
	// ErrCorrupt marks data that failed a check on disk: a CRC mismatch, a
	// batch header that does not parse, an index that points nowhere. Every
	// *CorruptionError is ErrCorrupt.
	ErrCorrupt = errors.New("log: corrupt data")

	// ErrBatchCorrupt means an appended batch failed its framing or CRC-32C
	// check (Kafka: CORRUPT_MESSAGE).
	ErrBatchCorrupt = errors.New("log: corrupt record batch")

	// ErrInvalidBatch means an appended batch is well framed but not acceptable:
	// magic other than 2, inconsistent record count, unknown codec (Kafka:
	// INVALID_RECORD).
	ErrInvalidBatch = errors.New("log: invalid record batch")

	// ErrBatchTooLarge means the batch exceeds max.message.bytes (Kafka:
	// MESSAGE_TOO_LARGE).
	ErrBatchTooLarge = errors.New("log: record batch too large")

	// ErrOffsetOutOfRange means a read asked for an offset below the log start
	// offset or above the log end offset.
	ErrOffsetOutOfRange = errors.New("log: offset out of range")

	// ErrNotLocal means the offset is at or above the log start but below the
	// first local segment: its data lives in the tiered store.
	ErrNotLocal = errors.New("log: offset not in local segments")

	// ErrClosed means the partition or store was closed.
	ErrClosed = errors.New("log: closed")

	// ErrStorage means the partition is offline after a write or fsync failure.
	// The failure is latched: every later append fails the same way and nothing
	// is retried, because after a failed fsync the kernel may have dropped the
	// dirty pages and a retry that succeeds would prove nothing.
	ErrStorage = errors.New("log: storage error, partition offline")

	// ErrResource means the broker ran short of a resource (file
	// descriptors, memory, disk space) for this operation. Nothing was
	// written and nothing is latched: the partition stays online and the
	// operation may be retried once the pressure passes. Every
	// *ResourceError is ErrResource.
	ErrResource = errors.New("log: out of a resource, retry later")

	// errNoDescriptor is the descriptor budget (Options.FDs) refusing a
	// slot.
	errNoDescriptor = errors.New("file descriptor budget spent")

	// errNoPreallocate: the file cannot be preallocated (not an OS file,
	// not Linux).
	errNoPreallocate = errors.New("preallocation unsupported")
)

// ResourceError is a refused operation for want of a resource. It matches
// ErrResource and unwraps to the cause (EMFILE, ENOSPC, the budget, ...).
type ResourceError struct {
	Op  string
	Err error
}

func (e *ResourceError) Error() string {
	return fmt.Sprintf("log: out of a resource, retry later: %s: %v", e.Op, e.Err)
}

// Is makes errors.Is(err, ErrResource) true.
func (e *ResourceError) Is(target error) bool { return target == ErrResource }

// Unwrap returns the cause.
func (e *ResourceError) Unwrap() error { return e.Err }

// openRefused is asResource for the steps whose only resource failure can
// be the open: a directory fsync's own ENOSPC/ENOMEM is a failed fsync.
func openRefused(op string, err error) *ResourceError {
	var pe *os.PathError
	if errors.Is(err, errNoDescriptor) || (errors.As(err, &pe) && pe.Op == "open") {
		return asResource(op, err)
	}
	return nil
}

// asResource returns err as a *ResourceError if it is one already, or the
// budget's refusal or the kernel running short (EMFILE, ENFILE, ENOMEM,
// ENOSPC, ...); else nil.
func asResource(op string, err error) *ResourceError {
	var re *ResourceError
	if errors.As(err, &re) {
		return re
	}
	var se *StorageError
	if errors.As(err, &se) {
		return nil // latched already (an fsync that reported ENOSPC is a storage error)
	}
	if errors.Is(err, errNoDescriptor) || fdbudget.IsResource(err) {
		return &ResourceError{Op: op, Err: err}
	}
	return nil
}

// CorruptionError reports where corrupt data was found. It matches ErrCorrupt.
type CorruptionError struct {
	Path   string // file holding the damage
	Pos    int64  // byte position in that file
	Reason string
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("log: corrupt data in %s at byte %d: %s", e.Path, e.Pos, e.Reason)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptionError) Is(target error) bool { return target == ErrCorrupt }

// StorageError is the latched failure of a partition. It matches ErrStorage
// and unwraps to the underlying I/O error.
type StorageError struct {
	Op  string // "write", "fsync", "truncate", "create segment", ...
	Err error
}

func (e *StorageError) Error() string {
	return fmt.Sprintf("log: storage error, partition offline: %s: %v", e.Op, e.Err)
}

// Is makes errors.Is(err, ErrStorage) true.
func (e *StorageError) Is(target error) bool { return target == ErrStorage }

// Unwrap returns the I/O error.
func (e *StorageError) Unwrap() error { return e.Err }
