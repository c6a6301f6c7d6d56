package fdbudget

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestTryAcquireKeepsRoom(t *testing.T) {
	b := New(4)
	for i := 0; i < 2; i++ {
		if !b.TryAcquire(2) {
			t.Fatalf("slot %d refused", i)
		}
	}
	if b.TryAcquire(2) {
		t.Fatal("third slot granted though it leaves fewer than 2 free")
	}
	for i := 0; i < 2; i++ {
		if !b.TryAcquire(0) {
			t.Fatal("keep=0 refused with room left")
		}
	}
	if b.TryAcquire(0) {
		t.Fatal("slot beyond max granted")
	}
	used, peak, refused := b.Stats()
	if used != 4 || peak != 4 || refused != 2 {
		t.Fatalf("stats %d %d %d", used, peak, refused)
	}
}

func TestAcquireWaitsForRelease(t *testing.T) {
	b := New(1)
	if !b.Acquire(0) {
		t.Fatal("free slot refused")
	}
	if b.Acquire(10 * time.Millisecond) {
		t.Fatal("full budget granted a slot")
	}
	got := make(chan bool)
	go func() { got <- b.Acquire(5 * time.Second) }()
	time.Sleep(20 * time.Millisecond)
	b.Release()
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("waiter refused after a release")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter never woke")
	}
}

func TestNilBudgetIsUnbounded(t *testing.T) {
	var b *Budget
	if !b.TryAcquire(100) || !b.Acquire(0) {
		t.Fatal("nil budget refused")
	}
	b.Release()
}

func TestIsResource(t *testing.T) {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOSPC} {
		if !IsResource(&os.PathError{Op: "open", Path: "x", Err: e}) {
			t.Errorf("%v not a resource error", e)
		}
	}
	for _, err := range []error{syscall.EIO, os.ErrNotExist, fmt.Errorf("x")} {
		if IsResource(err) {
			t.Errorf("%v is a resource error", err)
		}
	}
}

func TestPlan(t *testing.T) {
	s := Plan(20000, 10000)
	if s.Connections+s.Files+s.Other != 20000 || s.Connections > 10000 || s.Files < 9000 {
		t.Fatalf("Plan(20000): %+v", s)
	}
	s = Plan(1024, 10000)
	if s.Connections != (1024-Reserve)/2 || s.Files != 1024-Reserve-s.Connections {
		t.Fatalf("Plan(1024): %+v", s)
	}
	if s := Plan(1<<20, 100); s.Connections != 100 {
		t.Fatalf("Plan(1M, 100): %+v", s)
	}
}

func TestRaiseLimit(t *testing.T) {
	before, after, hard, err := RaiseLimit()
	if err != nil {
		t.Skip(err)
	}
	if after < before || after != hard {
		t.Fatalf("before %d after %d hard %d", before, after, hard)
	}
}

func TestSetMax(t *testing.T) {
	b := New(2)
	b.TryAcquire(0)
	b.TryAcquire(0)
	b.SetMax(1)
	if b.TryAcquire(0) {
		t.Fatal("slot granted above a lowered max")
	}
	b.Release()
	if b.TryAcquire(0) {
		t.Fatal("slot granted at a lowered max still full")
	}
	b.SetMax(4)
	if !b.TryAcquire(0) {
		t.Fatal("slot refused after the max was raised")
	}
}
