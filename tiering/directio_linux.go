package tiering

import (
	"errors"
	"io"
	"os"
	"syscall"
	"unsafe"
)

// Chunk files of the disk level are written and read with O_DIRECT where
// the filesystem allows it: the bytes go by DMA between the chunk buffer and
// the device, with no copy through the page cache and no page-cache memory
// to allocate. The memory level already caches the hot chunks; caching the
// disk level in the page cache as well would hold them twice, and on a VM
// whose free pages go back to the host, filling fresh page-cache pages cost
// 2-3 ms of CPU per MB (O_DIRECT: under 0.1).
//
// O_DIRECT wants the buffer address and the length aligned to the logical
// block size: chunk buffers are whole pages from the Go heap, and a short
// last chunk is written padded to a whole block (its size is kept in the
// diskEntry). Anything else, or a filesystem without O_DIRECT (tmpfs),
// takes the buffered path.

// writeChunkFile writes data (a prefix of a buffer of capacity cap(data))
// to a new file at path.
func writeChunkFile(path string, data []byte) error {
	if n := alignUp(len(data)); aligned(data, n) {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|syscall.O_DIRECT, 0o644)
		if err == nil {
			padded := data[:n]
			clear(padded[len(data):]) // not whatever the buffer held before
			_, err = f.Write(padded)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if !errors.Is(err, syscall.EINVAL) {
				return err
			}
		}
	}
	return os.WriteFile(path, data, 0o644)
}

// readChunkFile fills dst (whose capacity may exceed its length) from the
// file at path, which holds at least len(dst) bytes.
func readChunkFile(path string, dst []byte) error {
	if n := alignUp(len(dst)); aligned(dst, n) {
		f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
		if err == nil {
			got, err := io.ReadFull(f, dst[:n])
			f.Close()
			if err == nil || (errors.Is(err, io.ErrUnexpectedEOF) && got >= len(dst)) {
				return nil
			}
			if !errors.Is(err, syscall.EINVAL) {
				return err
			}
		}
	}
	return readFileInto(path, dst)
}

// aligned reports whether b's address is block-aligned and b has room for
// n bytes.
func aligned(b []byte, n int) bool {
	return n > 0 && cap(b) >= n && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%directAlign == 0
}
