package log

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// FS is the slice of a file system the log engine uses. It exists because it
// has several real implementations: the operating system (OSFS), a crashable
// in-memory file system that keeps only what was synced (internal/memfs)
// and fault injectors wrapping either.
//
// Directory entries are durable only after SyncDir on their parent: a file
// created, renamed or removed is not guaranteed to survive a crash until then.
type FS interface {
	// OpenFile opens name with os.O_* flags (O_RDONLY, O_RDWR, O_CREATE,
	// O_EXCL, O_TRUNC are the ones the engine uses).
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	Remove(name string) error
	Rename(oldname, newname string) error
	MkdirAll(dir string, perm os.FileMode) error
	// ReadDir returns the names of the entries of dir, sorted.
	ReadDir(dir string) ([]string, error)
	// SyncDir makes the entries of dir (creations, renames, removals) durable.
	SyncDir(dir string) error
}

// File is an open file. Reads and writes take explicit positions so one
// handle can be shared by concurrent readers without a file cursor.
type File interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	Truncate(size int64) error
	Size() (int64, error)
	Close() error
}

// OSFile is implemented by files backed by a real operating-system file, so
// callers can send ranges with sendfile(2).
type OSFile interface {
	OSFile() *os.File
}

// FSSyncer is implemented by file systems that can make every file of one
// file system durable in one call (Linux's syncfs(2)). A group-commit round
// with many dirty partitions uses it instead of one fdatasync each.
type FSSyncer interface {
	// Device identifies the file system holding dir; ok is false if
	// syncfs cannot be relied on there.
	Device(dir string) (dev uint64, ok bool)
	// OpenSyncFS returns a handle on the file system holding dir. Its
	// SyncFS makes the data and metadata of every file there durable and
	// fails if any writeback there failed since the handle was opened
	// (each failure reported once per handle, whoever else saw it).
	OpenSyncFS(dir string) (SyncFSHandle, error)
}

// SyncFSHandle is an open FSSyncer handle.
type SyncFSHandle interface {
	SyncFS() error
	Close() error
}

// OSFS is the operating system's file system.
var OSFS FS = osFS{}

type osFS struct{}

type osFile struct{ *os.File }

func (f osFile) OSFile() *os.File { return f.File }

func (f osFile) Size() (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Remove(name string) error                    { return os.Remove(name) }
func (osFS) Rename(oldname, newname string) error        { return os.Rename(oldname, newname) }
func (osFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }

func (osFS) ReadDir(dir string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(des))
	for i, de := range des {
		names[i] = de.Name()
	}
	sort.Strings(names)
	return names, nil
}

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(filepath.Clean(dir))
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// WriteFileAtomic writes data to name via a temporary file: write, fsync,
// rename, fsync(dir). After it returns nil the new contents survive a crash;
// before that either the old or the new contents are visible, never a mix.
func WriteFileAtomic(fs FS, name string, data []byte) error {
	return WriteFileAtomicPerm(fs, name, data, 0o644)
}

// WriteFileAtomicPerm is WriteFileAtomic creating the file with perm (0o600
// for credentials): a temporary file left by a crash is removed first, so
// it never keeps wider permissions.
func WriteFileAtomicPerm(fs FS, name string, data []byte, perm os.FileMode) error {
	tmp := name + ".tmp"
	if err := fs.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := fs.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fs.Rename(tmp, name); err != nil {
		return err
	}
	return fs.SyncDir(filepath.Dir(name))
}
