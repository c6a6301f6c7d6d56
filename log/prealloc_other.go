//go:build !linux

package log

// allocate is Linux-only (fallocate(2)); elsewhere segments grow by appends.
func allocate(File, int64) error { return errNoPreallocate }
