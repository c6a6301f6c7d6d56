//go:build !linux

package logbench

import "os"

// datasync is fsync where there is no fdatasync, as the engine does there.
func datasync(f *os.File) error { return f.Sync() }
