//go:build !linux

package log

// allocate is Linux-only (fallocate(2)); elsewhere segments grow by appends.
func allocate(File, int64) error { return errNoPreallocate }

// startWriteback is Linux-only (sync_file_range).
func startWriteback(File, int64, int64) {}
