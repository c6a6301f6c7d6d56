package logbench

import (
	"os"

	"golang.org/x/sys/unix"
)

// datasync is fdatasync(2), as the engine's group commit uses on Linux.
func datasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
