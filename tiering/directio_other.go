//go:build !linux

package tiering

import "os"

// writeChunkFile and readChunkFile use the page cache where O_DIRECT is not
// available (see directio_linux.go).
func writeChunkFile(path string, data []byte) error { return os.WriteFile(path, data, 0o644) }

func readChunkFile(path string, dst []byte) error { return readFileInto(path, dst) }
