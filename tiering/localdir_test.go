package tiering

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLocalDirStore(t *testing.T) {
	d, err := NewLocalDir(filepath.Join(t.TempDir(), "tier"))
	if err != nil {
		t.Fatal(err)
	}
	testObjectStore(t, d)
	// Nothing but objects (and their directories) is left behind.
	err = filepath.WalkDir(d.Root(), func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			t.Errorf("temp file left behind: %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLocalDirLayout(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	d, err := NewLocalDir(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, "topic-x/0/00000000000000000000.log", strings.NewReader("data"), 4); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "topic-x", "0", "00000000000000000000.log"))
	if err != nil || string(b) != "data" {
		t.Fatalf("object file: %q, %v", b, err)
	}
	// A second store on the same root sees the objects.
	d2, err := NewLocalDir(root)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := d2.List(ctx, "")
	if err != nil || !slices.Equal(keys, []string{"topic-x/0/00000000000000000000.log"}) {
		t.Fatalf("List on reopened store: %q, %v", keys, err)
	}
	// Deleting the last object prunes the empty directories, not root.
	if err := d.Delete(ctx, "topic-x/0/00000000000000000000.log"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "topic-x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty directory not pruned: %v", err)
	}
	if _, err := os.Stat(root); err != nil {
		t.Fatalf("root removed: %v", err)
	}
}

func TestLocalDirTempFilesHidden(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	d, err := NewLocalDir(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, "p/0/a.log", strings.NewReader("a"), 1); err != nil {
		t.Fatal(err)
	}
	// Leftovers of a crash in the middle of a Put.
	for _, name := range []string{filepath.Join("p", "0", tmpPrefix+"123"), tmpPrefix + "9"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte("junk"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, prefix := range []string{"", "p/", "p/0/", "p/0/" + tmpPrefix[:3], tmpPrefix[:2]} {
		keys, err := d.List(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if strings.Contains(k, tmpPrefix) {
				t.Fatalf("List(%q) lists temp file %q", prefix, k)
			}
		}
	}
	keys, _ := d.List(ctx, "")
	if !slices.Equal(keys, []string{"p/0/a.log"}) {
		t.Fatalf("List = %q", keys)
	}
}

func TestLocalDirBadKeys(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "tier")
	d, err := NewLocalDir(root)
	if err != nil {
		t.Fatal(err)
	}
	bad := []string{
		"", "/abs", "a//b", "a/", "../x", "a/../../x", "a/..", "./a", "a/./b",
		"a\\b", "a\x00b", tmpPrefix + "x", "a/" + tmpPrefix + "1",
	}
	for _, k := range bad {
		if err := d.Put(ctx, k, strings.NewReader("x"), 1); err == nil {
			t.Errorf("Put(%q) accepted", k)
		}
		if err := d.PutIfAbsent(ctx, k, strings.NewReader("x"), 1); err == nil {
			t.Errorf("PutIfAbsent(%q) accepted", k)
		}
		if _, err := d.GetRange(ctx, k, 0, -1); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("GetRange(%q): %v, want a key error", k, err)
		}
		if err := d.Delete(ctx, k); err == nil {
			t.Errorf("Delete(%q) accepted", k)
		}
	}
	for _, p := range []string{"/abs", "../", "a/../..", ".."} {
		if _, err := d.List(ctx, p); err == nil {
			t.Errorf("List(%q) accepted", p)
		}
	}
	// Nothing escaped root.
	entries, _ := os.ReadDir(filepath.Dir(root))
	if len(entries) != 1 {
		t.Fatalf("files outside root: %v", entries)
	}
	if keys, _ := d.List(ctx, ""); len(keys) != 0 {
		t.Fatalf("bad keys stored: %q", keys)
	}
}

func TestLocalDirKeyFileCollision(t *testing.T) {
	ctx := context.Background()
	d, err := NewLocalDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, "a/b", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	// a/b is a file, so a/b/c cannot be stored; reading it is "not found".
	if err := d.Put(ctx, "a/b/c", strings.NewReader("y"), 1); err == nil {
		t.Fatal("Put under a file key succeeded")
	}
	if _, err := d.GetRange(ctx, "a/b/c", 0, -1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetRange under a file key: %v, want ErrNotFound", err)
	}
	if err := d.Delete(ctx, "a/b/c"); err != nil {
		t.Fatalf("Delete under a file key: %v", err)
	}
	// a is a directory, not an object.
	if _, err := d.GetRange(ctx, "a", 0, -1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetRange on a directory: %v, want ErrNotFound", err)
	}
	if err := d.Delete(ctx, "a"); err != nil {
		t.Fatalf("Delete on a directory: %v", err)
	}
	if b, err := d.GetRange(ctx, "a/b", 0, -1); err != nil || !bytes.Equal(b, []byte("x")) {
		t.Fatalf("a/b after: %q, %v", b, err)
	}
}

func TestLocalDirNewErrors(t *testing.T) {
	if _, err := NewLocalDir(""); err == nil {
		t.Fatal("NewLocalDir(\"\") succeeded")
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := NewLocalDir(f); err == nil {
		t.Fatal("NewLocalDir on a file succeeded")
	}
}

// TestLocalDirCopyMustMatchItsChecksum: a copied upload body whose bytes
// are not those its known checksum was computed from is refused, and
// nothing is stored.
func TestLocalDirCopyMustMatchItsChecksum(t *testing.T) {
	d, err := NewLocalDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := randBytes(3, 10000)
	wrong := &crc32cBody{io.NewSectionReader(bytes.NewReader(data), 0, int64(len(data))), crc32.Checksum(data, castagnoli) ^ 1}
	if err := Retrying(d, 3).Put(ctx, "t/seg.log", wrong, int64(len(data))); err == nil {
		t.Fatal("a body that is not the checksummed one was stored")
	}
	if _, err := d.GetRange(ctx, "t/seg.log", 0, -1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("object after a refused Put: %v", err)
	}
	right := &crc32cBody{io.NewSectionReader(bytes.NewReader(data), 0, int64(len(data))), crc32.Checksum(data, castagnoli)}
	if err := Retrying(d, 3).Put(ctx, "t/seg.log", right, int64(len(data))); err != nil {
		t.Fatal(err)
	}
}
