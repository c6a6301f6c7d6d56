package log

import (
	"errors"

	"golang.org/x/sys/unix"
)

// allocate extends f to size with fallocate(2) (mode 0: blocks reserved,
// size raised, contents zero), so later appends below size overwrite
// allocated space and their fdatasync has no file size to journal. Files
// that are not the operating system's are left alone.
func allocate(f File, size int64) error {
	of, ok := f.(OSFile)
	if !ok || of.OSFile() == nil {
		return errNoPreallocate
	}
	rc, err := of.OSFile().SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = unix.Fallocate(int(fd), 0, 0, size)
			if !errors.Is(ferr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	return ferr
}

// startWriteback asks the kernel to start writing [off, off+n) of f to the
// disk now, without waiting (sync_file_range SYNC_FILE_RANGE_WRITE), so the
// group commit's fdatasync finds most of a large append already written.
// Best effort: errors are ignored (the fdatasync reports what matters).
func startWriteback(f File, off, n int64) {
	of, ok := f.(OSFile)
	if !ok || of.OSFile() == nil {
		return
	}
	rc, err := of.OSFile().SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WRITE)
	})
}
