package log

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Sync uses fdatasync(2): it flushes the data and the metadata needed to read
// it back (the size of an appended file), skipping timestamps, which saves a
// journal write per group commit.
func (f osFile) Sync() error {
	rc, err := f.File.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.Fdatasync(int(fd))
			if !errors.Is(serr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}
