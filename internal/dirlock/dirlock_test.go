package dirlock

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestSecondAcquireFailsWithPID(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir)
	var he *HeldError
	if !errors.As(err, &he) {
		t.Fatalf("second Acquire: %v, want *HeldError", err)
	}
	if he.PID != os.Getpid() || he.Dir != dir {
		t.Fatalf("HeldError %+v, want pid %d dir %s", he, os.Getpid(), dir)
	}
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), strconv.Itoa(os.Getpid())) {
		t.Fatalf("message %q names neither the directory nor the pid", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	l2.Release()
}

// A lock file left by a process that died (here: one that held no lock)
// does not block: only a live flock excludes.
func TestStaleLockFileDoesNotBlock(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte("999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	b, _ := os.ReadFile(filepath.Join(dir, FileName))
	if strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q, want our pid", b)
	}
}

// Another process holding the lock excludes this one.
func TestLockHeldByOtherProcess(t *testing.T) {
	if os.Getenv("DIRLOCK_CHILD") != "" {
		l, err := Acquire(os.Getenv("DIRLOCK_CHILD"))
		if err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString("locked\n")
		buf := make([]byte, 1)
		os.Stdin.Read(buf) // hold until the parent closes stdin
		l.Release()
		os.Exit(0)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHeldByOtherProcess$")
	cmd.Env = append(os.Environ(), "DIRLOCK_CHILD="+dir)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	buf := make([]byte, 7)
	if _, err := stdout.Read(buf); err != nil || string(buf) != "locked\n" {
		t.Fatalf("child: %q %v", buf, err)
	}
	_, err := Acquire(dir)
	var he *HeldError
	if !errors.As(err, &he) || he.PID != cmd.Process.Pid {
		t.Fatalf("Acquire beside child %d: %v", cmd.Process.Pid, err)
	}
	stdin.Close()
	cmd.Wait()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after the child exited: %v", err)
	}
	l.Release()
}
