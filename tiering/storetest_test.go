package tiering

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// testObjectStore is the conformance test every ObjectStore passes. s must
// be empty. For S3, create it with PartSize MinS3PartSize so the large
// objects go up in several parts.
func testObjectStore(t *testing.T, s ObjectStore) {
	ctx := context.Background()

	put := func(t *testing.T, key string, data []byte) {
		t.Helper()
		if err := s.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatalf("Put(%q, %d bytes): %v", key, len(data), err)
		}
	}
	get := func(t *testing.T, key string, off, n int64) []byte {
		t.Helper()
		b, err := s.GetRange(ctx, key, off, n)
		if err != nil {
			t.Fatalf("GetRange(%q, %d, %d): %v", key, off, n, err)
		}
		return b
	}
	wantGet := func(t *testing.T, key string, off, n int64, want []byte) {
		t.Helper()
		got := get(t, key, off, n)
		if !bytes.Equal(got, want) {
			t.Fatalf("GetRange(%q, %d, %d) = %d bytes %.16x..., want %d bytes %.16x...",
				key, off, n, len(got), got, len(want), want)
		}
	}
	wantErr := func(t *testing.T, key string, off, n int64, target error) {
		t.Helper()
		b, err := s.GetRange(ctx, key, off, n)
		if err == nil {
			t.Fatalf("GetRange(%q, %d, %d) = %d bytes, want error %v", key, off, n, len(b), target)
		}
		if target != nil && !errors.Is(err, target) {
			t.Fatalf("GetRange(%q, %d, %d) error %v, want %v", key, off, n, err, target)
		}
	}
	wantList := func(t *testing.T, prefix string, want ...string) {
		t.Helper()
		got, err := s.List(ctx, prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		if len(got) == 0 && len(want) == 0 {
			return
		}
		if !slices.Equal(got, want) {
			t.Fatalf("List(%q) = %q, want %q", prefix, got, want)
		}
	}

	t.Run("PutGetRanges", func(t *testing.T) {
		data := randBytes(1, 1000)
		put(t, "rng/obj", data)
		wantGet(t, "rng/obj", 0, -1, data)
		wantGet(t, "rng/obj", 0, 1000, data)
		wantGet(t, "rng/obj", 0, 10, data[:10])
		wantGet(t, "rng/obj", 500, 100, data[500:600])
		wantGet(t, "rng/obj", 999, 1, data[999:])
		wantGet(t, "rng/obj", 900, -1, data[900:])
		wantGet(t, "rng/obj", 990, 10, data[990:])
		wantGet(t, "rng/obj", 1000, -1, []byte{})
		wantGet(t, "rng/obj", 0, 0, []byte{})
		wantGet(t, "rng/obj", 1000, 0, []byte{})
		wantErr(t, "rng/obj", 990, 11, ErrBadRange)
		wantErr(t, "rng/obj", 1000, 1, ErrBadRange)
		wantErr(t, "rng/obj", 1001, -1, ErrBadRange)
		wantErr(t, "rng/obj", 5000, 10, ErrBadRange)
		wantErr(t, "rng/obj", 1001, 0, ErrBadRange)
		wantErr(t, "rng/obj", -1, 5, nil)
	})

	t.Run("Overwrite", func(t *testing.T) {
		put(t, "ow/obj", randBytes(2, 3000))
		v2 := randBytes(3, 100)
		put(t, "ow/obj", v2)
		wantGet(t, "ow/obj", 0, -1, v2)
		wantErr(t, "ow/obj", 0, 101, ErrBadRange)
		v3 := randBytes(4, 5000)
		put(t, "ow/obj", v3)
		wantGet(t, "ow/obj", 0, -1, v3)
	})

	t.Run("PutIfAbsent", func(t *testing.T) {
		v1 := randBytes(5, 200)
		if err := s.PutIfAbsent(ctx, "pia/obj", bytes.NewReader(v1), 200); err != nil {
			t.Fatalf("PutIfAbsent new key: %v", err)
		}
		wantGet(t, "pia/obj", 0, -1, v1)
		err := s.PutIfAbsent(ctx, "pia/obj", bytes.NewReader(randBytes(6, 300)), 300)
		if !errors.Is(err, ErrExists) {
			t.Fatalf("PutIfAbsent existing key: %v, want ErrExists", err)
		}
		wantGet(t, "pia/obj", 0, -1, v1)
		// A plain Put still replaces it.
		v2 := randBytes(7, 50)
		put(t, "pia/obj", v2)
		wantGet(t, "pia/obj", 0, -1, v2)
		// After a delete the key is absent again.
		if err := s.Delete(ctx, "pia/obj"); err != nil {
			t.Fatal(err)
		}
		if err := s.PutIfAbsent(ctx, "pia/obj", bytes.NewReader(v1), 200); err != nil {
			t.Fatalf("PutIfAbsent after delete: %v", err)
		}
		wantGet(t, "pia/obj", 0, -1, v1)
	})

	t.Run("PutIfAbsentRace", func(t *testing.T) {
		const n = 6
		var wins, exists atomic.Int32
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				data := bytes.Repeat([]byte{byte('a' + i)}, 1000+i)
				err := s.PutIfAbsent(ctx, "race/obj", bytes.NewReader(data), int64(len(data)))
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, ErrExists):
					exists.Add(1)
				default:
					t.Errorf("PutIfAbsent %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		if wins.Load() != 1 || exists.Load() != n-1 {
			t.Fatalf("%d winners, %d ErrExists; want 1 and %d", wins.Load(), exists.Load(), n-1)
		}
		got := get(t, "race/obj", 0, -1)
		if len(got) < 1000 || !bytes.Equal(got, bytes.Repeat(got[:1], len(got))) || len(got) != 1000+int(got[0]-'a') {
			t.Fatalf("race winner's object is mixed: %d bytes starting %q", len(got), got[:min(len(got), 8)])
		}
	})

	t.Run("Missing", func(t *testing.T) {
		wantErr(t, "missing/obj", 0, -1, ErrNotFound)
		wantErr(t, "missing/obj", 0, 10, ErrNotFound)
		wantErr(t, "missing/obj", 5, -1, ErrNotFound)
		wantErr(t, "missing/obj", 0, 0, ErrNotFound)
		wantErr(t, "nodir/at/all/obj", 100, 10, ErrNotFound)
	})

	t.Run("Delete", func(t *testing.T) {
		put(t, "del/a", []byte("a"))
		put(t, "del/b", []byte("b"))
		if err := s.Delete(ctx, "del/a"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		wantErr(t, "del/a", 0, -1, ErrNotFound)
		wantGet(t, "del/b", 0, -1, []byte("b"))
		wantList(t, "del/", "del/b")
		if err := s.Delete(ctx, "del/a"); err != nil {
			t.Fatalf("Delete again: %v", err)
		}
		if err := s.Delete(ctx, "del/never/was"); err != nil {
			t.Fatalf("Delete missing key: %v", err)
		}
		if err := s.Delete(ctx, "del/b"); err != nil {
			t.Fatal(err)
		}
		wantList(t, "del/")
		// The key can be written again after its directory went away.
		put(t, "del/b", []byte("b2"))
		wantGet(t, "del/b", 0, -1, []byte("b2"))
	})

	t.Run("List", func(t *testing.T) {
		keys := []string{
			"ls/t-1/0/00000000000000000000.index",
			"ls/t-1/0/00000000000000000000.log",
			"ls/t-1/0/00000000000000001000.log",
			"ls/t-1/0/manifest",
			"ls/t-1/1/00000000000000000000.log",
			"ls/t-10/0/00000000000000000000.log",
			"ls/t.x",
			"ls/u",
		}
		for i, k := range slices.Backward(keys) {
			put(t, k, []byte(fmt.Sprint(i)))
		}
		wantList(t, "ls/", keys...)
		wantList(t, "ls", keys...)
		wantList(t, "ls/t-1/", keys[:5]...)
		wantList(t, "ls/t-1", keys[:6]...) // ends mid-name: t-1 and t-10
		wantList(t, "ls/t", keys[:7]...)
		wantList(t, "ls/t-1/0/", keys[:4]...)
		wantList(t, "ls/t-1/0/0000000000000000", keys[:3]...)
		wantList(t, "ls/t-1/0/00000000000000000000.", keys[:2]...)
		wantList(t, "ls/t-1/0/00000000000000001000.log", keys[2])
		wantList(t, "ls/t-1/0/00000000000000001000.log.x")
		wantList(t, "ls/t-1/0/manifest/")
		wantList(t, "ls/t-2")
		wantList(t, "ls/nothing/")
		wantList(t, "ls/nothing/deeper/")
		wantList(t, "nothing")
		all, err := s.List(ctx, "")
		if err != nil {
			t.Fatalf("List(\"\"): %v", err)
		}
		if !slices.IsSorted(all) {
			t.Fatalf("List(\"\") not sorted: %q", all)
		}
		for _, k := range keys {
			if !slices.Contains(all, k) {
				t.Fatalf("List(\"\") lacks %q: %q", k, all)
			}
		}
	})

	t.Run("DeepKeys", func(t *testing.T) {
		key := "deep/a/b/c/d/e/f/g/obj.log"
		data := randBytes(8, 777)
		put(t, key, data)
		wantGet(t, key, 100, 77, data[100:177])
		wantList(t, "deep/a/b/c/", key)
		wantList(t, "deep/a/b/c/d/e/f/g/ob", key)
		if err := s.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		wantList(t, "deep/")
		wantErr(t, key, 0, -1, ErrNotFound)
	})

	t.Run("Empty", func(t *testing.T) {
		put(t, "empty/obj", nil)
		wantGet(t, "empty/obj", 0, -1, []byte{})
		wantGet(t, "empty/obj", 0, 0, []byte{})
		wantErr(t, "empty/obj", 0, 1, ErrBadRange)
		wantErr(t, "empty/obj", 1, -1, ErrBadRange)
		wantList(t, "empty/", "empty/obj")
		err := s.PutIfAbsent(ctx, "empty/obj", bytes.NewReader(nil), 0)
		if !errors.Is(err, ErrExists) {
			t.Fatalf("PutIfAbsent on empty object: %v, want ErrExists", err)
		}
		if err := s.PutIfAbsent(ctx, "empty/obj2", bytes.NewReader(nil), 0); err != nil {
			t.Fatalf("PutIfAbsent empty: %v", err)
		}
		wantGet(t, "empty/obj2", 0, -1, []byte{})
	})

	t.Run("WholeTooLarge", func(t *testing.T) {
		// Reads to the end are bounded (maxWholeObject, lowered here);
		// ranges of any object are not.
		defer func(m int64) { maxWholeObject = m }(maxWholeObject)
		maxWholeObject = 64 << 10
		data := randBytes(5, 64<<10+1)
		put(t, "whole/big", data)
		wantErr(t, "whole/big", 0, -1, ErrTooLarge)
		wantGet(t, "whole/big", 1, -1, data[1:])
		wantGet(t, "whole/big", 0, int64(len(data)), data)
	})

	t.Run("ShortBody", func(t *testing.T) {
		// A body shorter than size fails and leaves nothing behind.
		err := s.Put(ctx, "short/small", bytes.NewReader(make([]byte, 10)), 20)
		if err == nil {
			t.Fatal("Put with a short body succeeded")
		}
		wantErr(t, "short/small", 0, -1, ErrNotFound)
		const big = 2*MinS3PartSize + 1000
		err = s.Put(ctx, "short/big", onlyReader{bytes.NewReader(randBytes(9, MinS3PartSize+500))}, big)
		if err == nil {
			t.Fatal("Put with a short large body succeeded")
		}
		wantErr(t, "short/big", 0, -1, ErrNotFound)
		wantList(t, "short/")
	})

	t.Run("Large", func(t *testing.T) {
		const size = 40 << 20
		data := randBytes(10, size)
		// A plain io.Reader, not a ReadSeeker: the store must stream it.
		if err := s.Put(ctx, "large/obj", onlyReader{bytes.NewReader(data)}, size); err != nil {
			t.Fatalf("Put 40 MiB: %v", err)
		}
		wantGet(t, "large/obj", 0, -1, data)
		wantGet(t, "large/obj", MinS3PartSize-10, 20, data[MinS3PartSize-10:MinS3PartSize+10])
		wantGet(t, "large/obj", 8<<20, 8<<20, data[8<<20:16<<20])
		wantGet(t, "large/obj", size-100, -1, data[size-100:])
		wantErr(t, "large/obj", size-100, 101, ErrBadRange)
		wantList(t, "large/", "large/obj")

		// Multipart conditional create.
		mid := randBytes(11, 2*MinS3PartSize+123)
		err := s.PutIfAbsent(ctx, "large/obj", bytes.NewReader(mid), int64(len(mid)))
		if !errors.Is(err, ErrExists) {
			t.Fatalf("large PutIfAbsent on existing key: %v, want ErrExists", err)
		}
		wantGet(t, "large/obj", size-100, -1, data[size-100:])
		if err := s.PutIfAbsent(ctx, "large/obj2", bytes.NewReader(mid), int64(len(mid))); err != nil {
			t.Fatalf("large PutIfAbsent on new key: %v", err)
		}
		wantGet(t, "large/obj2", 0, -1, mid)
		for _, k := range []string{"large/obj", "large/obj2"} {
			if err := s.Delete(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		wantList(t, "large/")
	})

	t.Run("Concurrent", func(t *testing.T) {
		const workers, perWorker = 6, 15
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range perWorker {
					key := fmt.Sprintf("conc/w%d/%03d", w, i)
					data := randBytes(uint64(100+w*perWorker+i), 1+(w*7919+i*104729)%50000)
					if err := s.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
						t.Errorf("Put %s: %v", key, err)
						return
					}
					got, err := s.GetRange(ctx, key, 0, -1)
					if err != nil || !bytes.Equal(got, data) {
						t.Errorf("GetRange %s: %d bytes, %v; want %d bytes", key, len(got), err, len(data))
						return
					}
				}
			})
		}
		// Overwriters and readers of one key: a reader sees one whole
		// version, never a mix or a partial object.
		put(t, "conc/shared", bytes.Repeat([]byte{'A'}, 1000))
		var stop atomic.Bool
		for v := range 3 {
			wg.Go(func() {
				for i := 0; i < 10; i++ {
					b := byte('B' + v)
					data := bytes.Repeat([]byte{b}, 1000+100*v)
					if err := s.Put(ctx, "conc/shared", bytes.NewReader(data), int64(len(data))); err != nil {
						t.Errorf("Put shared: %v", err)
						return
					}
				}
			})
		}
		var readers sync.WaitGroup
		for range 2 {
			readers.Go(func() {
				for !stop.Load() {
					got, err := s.GetRange(ctx, "conc/shared", 0, -1)
					if err != nil {
						t.Errorf("GetRange shared: %v", err)
						return
					}
					if len(got) == 0 || !bytes.Equal(got, bytes.Repeat(got[:1], len(got))) ||
						len(got) != 1000+100*max(int(got[0])-'B', 0) {
						t.Errorf("GetRange shared: torn read: %d bytes starting %q", len(got), got[:min(8, len(got))])
						return
					}
				}
			})
		}
		wg.Wait()
		stop.Store(true)
		readers.Wait()
		for w := range workers {
			keys, err := s.List(ctx, fmt.Sprintf("conc/w%d/", w))
			if err != nil || len(keys) != perWorker {
				t.Fatalf("List worker %d: %d keys, %v", w, len(keys), err)
			}
		}
	})

	t.Run("Canceled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := s.Put(cctx, "cancel/obj", bytes.NewReader([]byte("x")), 1); err == nil {
			t.Fatal("Put with a canceled context succeeded")
		}
		if _, err := s.GetRange(cctx, "rng/obj", 0, -1); err == nil {
			t.Fatal("GetRange with a canceled context succeeded")
		}
		wantErr(t, "cancel/obj", 0, -1, ErrNotFound)
	})
}

// onlyReader hides every method but Read (no Seek, no WriterTo).
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// randBytes returns n deterministic pseudo-random bytes.
func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func TestMemStore(t *testing.T) {
	testObjectStore(t, NewMemStore())
}

func TestMemStoreFault(t *testing.T) {
	ctx := context.Background()
	m := NewMemStore()
	if err := m.Put(ctx, "a/b", bytes.NewReader([]byte("hello")), 5); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	var seen []string
	var mu sync.Mutex
	m.SetFault(func(op, key string) error {
		mu.Lock()
		seen = append(seen, op+" "+key)
		mu.Unlock()
		if key == "a/b" || op == "list" {
			return boom
		}
		return nil
	})
	if err := m.Put(ctx, "a/b", bytes.NewReader([]byte("bye")), 3); err != boom {
		t.Fatalf("Put: %v, want boom as-is", err)
	}
	if err := m.PutIfAbsent(ctx, "a/b", bytes.NewReader([]byte("bye")), 3); err != boom {
		t.Fatalf("PutIfAbsent: %v, want boom as-is", err)
	}
	if _, err := m.GetRange(ctx, "a/b", 0, -1); err != boom {
		t.Fatalf("GetRange: %v, want boom as-is", err)
	}
	if err := m.Delete(ctx, "a/b"); err != boom {
		t.Fatalf("Delete: %v, want boom as-is", err)
	}
	if _, err := m.List(ctx, "a/"); err != boom {
		t.Fatalf("List: %v, want boom as-is", err)
	}
	if err := m.Put(ctx, "a/c", bytes.NewReader([]byte("c")), 1); err != nil {
		t.Fatalf("Put on another key: %v", err)
	}
	want := []string{"put a/b", "put a/b", "get a/b", "delete a/b", "list a/", "put a/c"}
	if !slices.Equal(seen, want) {
		t.Fatalf("fault hook saw %q, want %q", seen, want)
	}
	m.SetFault(nil)
	got, err := m.GetRange(ctx, "a/b", 0, -1)
	if err != nil || string(got) != "hello" {
		t.Fatalf("after clearing the fault: %q, %v (the failed ops must not have run)", got, err)
	}
}
