package tiering

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Chunk files round-trip at every size a chunk can have, through the
// O_DIRECT path (a file written that way is padded to whole blocks) and
// through the buffered fallback (an unaligned buffer, or a file someone else
// wrote).
func TestChunkFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	direct := true
	if f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_CREATE|os.O_WRONLY|syscall.O_DIRECT, 0o644); err != nil {
		t.Logf("no O_DIRECT in %s (%v): the buffered path only", dir, err)
		direct = false
	} else {
		f.Close()
	}
	for _, n := range []int{1, 4095, 4096, 4097, 1 << 20, chunkSize - 1, chunkSize} {
		src := getChunkBuf()
		rand.Read((*src)[:n])
		p := filepath.Join(dir, "c")
		if err := writeChunkFile(p, (*src)[:n]); err != nil {
			t.Fatal(n, err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(alignUp(n)); direct && fi.Size() != want {
			t.Fatalf("%d bytes: file of %d, want %d (written with O_DIRECT, padded)", n, fi.Size(), want)
		}
		dst := getChunkBuf()
		if err := readChunkFile(p, (*dst)[:n]); err != nil {
			t.Fatal(n, err)
		}
		if !bytes.Equal((*src)[:n], (*dst)[:n]) {
			t.Fatalf("%d bytes: read back differs", n)
		}
		// Unaligned buffers take the buffered path both ways.
		if err := writeChunkFile(p, (*src)[1:n]); err != nil {
			t.Fatal(err)
		}
		if fi, _ := os.Stat(p); fi.Size() != int64(n-1) {
			t.Fatalf("unaligned write of %d bytes left %d", n-1, fi.Size())
		}
		clear(*dst)
		if err := readChunkFile(p, (*dst)[1:n]); err != nil {
			t.Fatal(n, err)
		}
		if !bytes.Equal((*src)[1:n], (*dst)[1:n]) {
			t.Fatalf("%d bytes unaligned: read back differs", n)
		}
		// A file of exactly n bytes (written by anyone) reads back through
		// the aligned path too.
		if err := os.WriteFile(p, (*src)[:n], 0o644); err != nil {
			t.Fatal(err)
		}
		clear(*dst)
		if err := readChunkFile(p, (*dst)[:n]); err != nil {
			t.Fatal(n, err)
		}
		if !bytes.Equal((*src)[:n], (*dst)[:n]) {
			t.Fatalf("%d bytes from a plain file: read back differs", n)
		}
		// A file shorter than asked for is an error, not a short chunk.
		if err := os.WriteFile(p, (*src)[:n-1], 0o644); err != nil {
			t.Fatal(err)
		}
		if err := readChunkFile(p, (*dst)[:n]); err == nil {
			t.Fatalf("%d bytes from a file of %d: no error", n, n-1)
		}
		putChunkBuf(src)
		putChunkBuf(dst)
	}
}
