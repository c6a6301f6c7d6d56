package log

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"go.uber.org/zap/zaptest"
)

func fileLen(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// A busy active segment is preallocated ahead of its batches; sealing and a
// clean close trim every file back to its batches (so the next open trusts
// the clean-close record), and a copy taken mid-write (what kill -9 leaves)
// opens with every batch and without the zeros.
func TestPreallocateTrimAndRecover(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("fallocate is Linux-only")
	}
	dir := filepath.Join(t.TempDir(), "t-0")
	rng := rand.New(rand.NewPCG(11, 12))
	s := OpenStore(Options{Logger: zaptest.NewLogger(t), Preallocate: true})
	cfg := Config{SegmentBytes: 8 << 10}
	p := mustOpen(t, s, dir, cfg)
	want := map[int64][]byte{}
	if err := appendDurable(p, rng, 40, want); err != nil {
		t.Fatal(err)
	}
	segs := p.segments()
	if len(segs) < 2 {
		t.Fatalf("want a roll, got %d segments", len(segs))
	}
	for _, seg := range segs[:len(segs)-1] {
		if got := fileLen(t, seg.logPath); got != seg.size.Load() {
			t.Fatalf("sealed %s: file %d bytes, batches %d", filepath.Base(seg.logPath), got, seg.size.Load())
		}
	}
	act := p.active
	if err := appendDurable(p, rng, preallocAfter+1, want); err != nil {
		t.Fatal(err)
	}
	if act != p.active {
		act = p.active
		if err := appendDurable(p, rng, preallocAfter+1, want); err != nil {
			t.Fatal(err)
		}
	}
	if got := fileLen(t, act.logPath); got <= act.size.Load() {
		t.Fatalf("active segment not preallocated: file %d, batches %d", got, act.size.Load())
	}
	// What kill -9 leaves: the files as they are now, zeros and all.
	crashed := filepath.Join(t.TempDir(), "t-0")
	if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	readAll(t, p, rng, want)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := fileLen(t, act.logPath); got != act.size.Load() {
		t.Fatalf("after close: file %d, batches %d", got, act.size.Load())
	}
	st, err := readState(OSFS, dir)
	if err != nil || st.Clean == nil || st.Clean.Size != act.size.Load() {
		t.Fatalf("clean-close record %+v, %v", st.Clean, err)
	}
	for _, d := range []string{dir, crashed} {
		s2 := openStore(t, OSFS, 0)
		p2 := mustOpen(t, s2, d, cfg)
		readAll(t, p2, rng, want)
		if p2.LogEndOffset() != int64(len(want)) && p2.LogEndOffset() < 1 {
			t.Fatalf("%s: leo %d", d, p2.LogEndOffset())
		}
		last := p2.segments()[len(p2.segments())-1]
		if got := fileLen(t, last.logPath); got != last.size.Load() {
			t.Fatalf("%s reopened: file %d, batches %d", d, got, last.size.Load())
		}
		rep, err := VerifyDir(OSFS, d)
		if err != nil || !rep.OK() {
			t.Fatalf("verify %s: %+v %v", d, rep, err)
		}
		s2.Close()
	}
}
