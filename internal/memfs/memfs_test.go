package memfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// writeFile creates name with data, syncing the data if sync is set.
func writeFile(t *testing.T, fs *FS, name, data string, sync bool) File {
	t.Helper()
	f, err := fs.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	must(t, err)
	_, err = f.WriteAt([]byte(data), 0)
	must(t, err)
	if sync {
		must(t, f.Sync())
	}
	return f
}

func content(t *testing.T, fs *FS, name string) (string, bool) {
	t.Helper()
	b, err := fs.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return "", false
	}
	must(t, err)
	return string(b), true
}

func crash(fs *FS) *FS { return fs.CrashClone(CrashConfig{}) }

func setup(t *testing.T) *FS {
	fs := New()
	must(t, fs.MkdirAll("/d", 0o755))
	fs.MarkAllSynced()
	return fs
}

func TestFileBasics(t *testing.T) {
	fs := setup(t)
	if _, err := fs.OpenFile("/d/x", os.O_RDONLY, 0); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("open missing: %v", err)
	}
	if _, err := fs.OpenFile("/nodir/x", os.O_RDWR|os.O_CREATE, 0); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("create in missing dir: %v", err)
	}
	f := writeFile(t, fs, "d/./x", "hello", false)
	if _, err := fs.OpenFile("/d/x", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0); !errors.Is(err, os.ErrExist) {
		t.Fatalf("O_EXCL: %v", err)
	}
	_, err := f.WriteAt([]byte("!"), 7)
	must(t, err)
	if n, _ := f.Size(); n != 8 {
		t.Fatalf("size %d", n)
	}
	buf := make([]byte, 4)
	if n, err := f.ReadAt(buf, 5); n != 3 || err != io.EOF || string(buf[:3]) != "\x00\x00!" {
		t.Fatalf("ReadAt = %d, %v, %q", n, err, buf)
	}
	buf[0] = 'Z' // ReadAt must have copied
	if s, _ := content(t, fs, "/d/x"); s != "hello\x00\x00!" {
		t.Fatalf("content %q", s)
	}
	must(t, f.Truncate(2))
	if s, _ := content(t, fs, "/d/x"); s != "he" {
		t.Fatalf("after truncate %q", s)
	}
	r, err := fs.OpenFile("/d/x", os.O_RDONLY, 0)
	must(t, err)
	if _, err := r.WriteAt([]byte("x"), 0); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("write on O_RDONLY: %v", err)
	}
	must(t, f.Close())
	if _, err := f.ReadAt(buf, 0); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if err := f.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("double close: %v", err)
	}
	writeFile(t, fs, "/d/y", "yy", false)
	must(t, fs.MkdirAll("/d/sub/deeper", 0o755))
	names, err := fs.ReadDir("/d")
	must(t, err)
	if !slices.Equal(names, []string{"sub", "x", "y"}) {
		t.Fatalf("ReadDir %v", names)
	}
	must(t, fs.Rename("/d/y", "/d/x"))
	if s, _ := content(t, fs, "/d/x"); s != "yy" {
		t.Fatalf("after rename %q", s)
	}
	if err := fs.Remove("/d/sub"); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("remove non-empty dir: %v", err)
	}
	must(t, fs.Remove("/d/x"))
	if _, ok := content(t, fs, "/d/x"); ok {
		t.Fatal("removed file still there")
	}
}

func TestCrashDropsUnsyncedData(t *testing.T) {
	fs := setup(t)
	f := writeFile(t, fs, "/d/f", "durable", true)
	must(t, fs.SyncDir("/d"))
	_, err := f.WriteAt([]byte(" and lost"), 7)
	must(t, err)
	writeFile(t, fs, "/d/g", "never synced", false)
	must(t, fs.SyncDir("/d"))
	c := crash(fs)
	if s, _ := content(t, c, "/d/f"); s != "durable" {
		t.Fatalf("f = %q", s)
	}
	if s, ok := content(t, c, "/d/g"); !ok || s != "" {
		t.Fatalf("g = %q, %v; want empty file", s, ok)
	}
	// The clone is independent and fully synced.
	writeFile(t, c, "/d/f", "X", false)
	if s, _ := content(t, fs, "/d/f"); s != "durable and lost" {
		t.Fatalf("original changed: %q", s)
	}
	if s, _ := content(t, crash(crash(fs)), "/d/f"); s != "durable" {
		t.Fatalf("crash of clone: %q", s)
	}
}

func TestCrashNeedsSyncDir(t *testing.T) {
	fs := setup(t)
	writeFile(t, fs, "/d/f", "synced data", true)
	must(t, fs.MkdirAll("/d/new/sub", 0o755))
	must(t, fs.SyncDir("/d/new"))
	c := crash(fs)
	if _, ok := content(t, c, "/d/f"); ok {
		t.Fatal("file without SyncDir survived")
	}
	if names, _ := c.ReadDir("/d"); len(names) != 0 {
		t.Fatalf("entries survived: %v", names)
	}
}

func TestRenameDurableOnlyAfterSyncDir(t *testing.T) {
	fs := setup(t)
	writeFile(t, fs, "/d/a.tmp", "new", true)
	writeFile(t, fs, "/d/a", "old", true)
	must(t, fs.SyncDir("/d"))
	must(t, fs.Rename("/d/a.tmp", "/d/a"))
	c := crash(fs)
	if s, _ := content(t, c, "/d/a"); s != "old" {
		t.Fatalf("before SyncDir: a = %q", s)
	}
	if _, ok := content(t, c, "/d/a.tmp"); !ok {
		t.Fatal("before SyncDir: a.tmp gone")
	}
	must(t, fs.SyncDir("/d"))
	c = crash(fs)
	if s, _ := content(t, c, "/d/a"); s != "new" {
		t.Fatalf("after SyncDir: a = %q", s)
	}
	if _, ok := content(t, c, "/d/a.tmp"); ok {
		t.Fatal("after SyncDir: a.tmp still there")
	}
}

func TestRemoveDurableOnlyAfterSyncDir(t *testing.T) {
	fs := setup(t)
	writeFile(t, fs, "/d/f", "data", true)
	must(t, fs.SyncDir("/d"))
	must(t, fs.Remove("/d/f"))
	if s, _ := content(t, crash(fs), "/d/f"); s != "data" {
		t.Fatalf("removed file after crash = %q", s)
	}
	must(t, fs.SyncDir("/d"))
	if _, ok := content(t, crash(fs), "/d/f"); ok {
		t.Fatal("removal not durable after SyncDir")
	}
}

func TestUnsyncedTruncateLost(t *testing.T) {
	fs := setup(t)
	f := writeFile(t, fs, "/d/f", "0123456789", true)
	must(t, fs.SyncDir("/d"))
	must(t, f.Truncate(3))
	c := fs.CrashClone(CrashConfig{UnsyncedMode: KeepRandomPrefix})
	if s, _ := content(t, c, "/d/f"); s != "0123456789" {
		t.Fatalf("f = %q", s)
	}
}

func TestKeepRandomPrefix(t *testing.T) {
	fs := setup(t)
	f := writeFile(t, fs, "/d/f", "synced-", true)
	must(t, fs.SyncDir("/d"))
	_, err := f.WriteAt([]byte("unsynced tail"), 7)
	must(t, err)
	full, _ := content(t, fs, "/d/f")
	rng := rand.New(rand.NewPCG(1, 2))
	lens := map[int]bool{}
	zeroed := 0
	for range 200 {
		c := fs.CrashClone(CrashConfig{Rand: rng, UnsyncedMode: KeepRandomPrefix})
		s, _ := content(t, c, "/d/f")
		if len(s) < 7 || !bytes.HasPrefix([]byte(full), []byte(s)) {
			t.Fatalf("clone = %q, want prefix of %q at least 7 long", s, full)
		}
		lens[len(s)] = true
		c = fs.CrashClone(CrashConfig{Rand: rng, UnsyncedMode: KeepRandomPrefixZeroed})
		s, _ = content(t, c, "/d/f")
		if len(s) < 7 || s[:7] != "synced-" {
			t.Fatalf("zeroed clone = %q", s)
		}
		if tail := s[7:]; tail != full[7:len(s)] {
			if tail != string(make([]byte, len(tail))) {
				t.Fatalf("zeroed clone tail %q neither data nor zeros", tail)
			}
			zeroed++
		}
	}
	if !lens[7] || !lens[len(full)] || len(lens) < 5 {
		t.Fatalf("prefix lengths poorly spread: %v", lens)
	}
	if zeroed == 0 {
		t.Fatal("KeepRandomPrefixZeroed never zeroed")
	}
}

func TestCorrupt(t *testing.T) {
	fs := setup(t)
	writeFile(t, fs, "/d/f", "abc", true)
	must(t, fs.SyncDir("/d"))
	must(t, fs.Corrupt("/d/f", 1, 0x01))
	if s, _ := content(t, fs, "/d/f"); s != "acc" {
		t.Fatalf("current = %q", s)
	}
	if s, _ := content(t, crash(fs), "/d/f"); s != "acc" {
		t.Fatalf("synced = %q", s)
	}
	if err := fs.Corrupt("/d/f", 3, 1); err == nil {
		t.Fatal("corrupt past end succeeded")
	}
}

// workload performs 6 mutating operations: create, write, sync, syncdir,
// rename, syncdir.
func workload(fs *FS) error {
	f, err := fs.OpenFile("/d/f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("data"), 0); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := fs.SyncDir("/d"); err != nil {
		return err
	}
	if err := fs.Rename("/d/f", "/d/g"); err != nil {
		return err
	}
	return fs.SyncDir("/d")
}

func TestCrashAfter(t *testing.T) {
	fs := setup(t)
	counter := CrashAfter(-1)
	fs.SetInjector(counter.Inject)
	must(t, workload(fs))
	total := counter.Count()
	if total != 6 || counter.Crashed() {
		t.Fatalf("count %d crashed %v", total, counter.Crashed())
	}
	for k := 0; k <= total; k++ {
		fs := setup(t)
		c := CrashAfter(k)
		fs.SetInjector(c.Inject)
		err := workload(fs)
		if k == total {
			if err != nil || c.Crashed() {
				t.Fatalf("k=%d: %v, crashed %v", k, err, c.Crashed())
			}
			continue
		}
		if !errors.Is(err, ErrCrashed) || !c.Crashed() || c.Count() != k+1 {
			t.Fatalf("k=%d: err %v crashed %v count %d", k, err, c.Crashed(), c.Count())
		}
		if err := fs.MkdirAll("/e", 0o755); !errors.Is(err, ErrCrashed) {
			t.Fatalf("k=%d: op after crash: %v", k, err)
		}
		after := crash(fs)
		f, _ := content(t, after, "/d/f")
		g, _ := content(t, after, "/d/g")
		want := map[int]string{0: "", 1: "", 2: "", 3: "", 4: "data", 5: "data"}[k]
		if f != want || g != "" {
			t.Fatalf("k=%d: after crash f=%q g=%q, want f=%q", k, f, g, want)
		}
	}
}

func TestFailNth(t *testing.T) {
	fs := setup(t)
	fs.SetInjector(FailNth(OpSync, 2, syscall.EIO))
	f := writeFile(t, fs, "/d/f", "a", true)
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("2nd sync: %v", err)
	}
	must(t, f.Sync())
	fs.SetInjector(FailNth(OpWrite, 2, syscall.ENOSPC))
	_, err := f.WriteAt([]byte("b"), 1)
	must(t, err)
	if n, err := f.WriteAt([]byte("c"), 2); n != 0 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("2nd write: %d, %v", n, err)
	}
	if s, _ := content(t, fs, "/d/f"); s != "ab" {
		t.Fatalf("content %q", s)
	}
	fs.SetInjector(FailNth(OpCreate, 1, syscall.EACCES))
	if _, err := fs.OpenFile("/d/f", os.O_RDWR|os.O_CREATE, 0); err != nil {
		t.Fatalf("open existing with O_CREATE was injected: %v", err)
	}
	if _, err := fs.OpenFile("/d/new", os.O_RDWR|os.O_CREATE, 0); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("create: %v", err)
	}
	if _, ok := content(t, fs, "/d/new"); ok {
		t.Fatal("failed create left a file")
	}
}

func TestShortWriteNth(t *testing.T) {
	fs := setup(t)
	f := writeFile(t, fs, "/d/f", "", false)
	fs.SetInjector(ShortWriteNth(2, 3, syscall.ENOSPC))
	_, err := f.WriteAt([]byte("first"), 0)
	must(t, err)
	n, err := f.WriteAt([]byte("second"), 5)
	if n != 3 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("short write = %d, %v", n, err)
	}
	if s, _ := content(t, fs, "/d/f"); s != "firstsec" {
		t.Fatalf("content %q", s)
	}
}

func TestConcurrent(t *testing.T) {
	fs := setup(t)
	c := CrashAfter(-1)
	fs.SetInjector(c.Inject)
	shared := writeFile(t, fs, "/d/shared", "", false)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			name := fmt.Sprintf("/d/f%d", i)
			f, err := fs.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Error(err)
				return
			}
			buf := make([]byte, 8)
			for j := range 100 {
				off := int64(i*800 + j*8)
				if _, err := shared.WriteAt(buf, off); err != nil {
					t.Error(err)
				}
				shared.ReadAt(buf, off)
				f.WriteAt(buf, int64(j))
				f.Sync()
				fs.SyncDir("/d")
				fs.ReadDir("/d")
				fs.CrashClone(CrashConfig{UnsyncedMode: KeepRandomPrefixZeroed})
			}
			f.Close()
			fs.Rename(name, name+".old")
		})
	}
	wg.Wait()
	if n, _ := shared.Size(); n != 6400 {
		t.Fatalf("shared size %d", n)
	}
}
