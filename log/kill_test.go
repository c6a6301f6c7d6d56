package log

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/synapsebroker/synapse/log/internal/testbatch"
	"go.uber.org/zap"
)

// killBatch is the batch the kill-test child appends at offset leo: its
// content is a function of the offset, so the parent can regenerate it.
func killBatch(leo int64) []byte {
	b := testbatch.Make(testbatch.Options{
		Records:   1 + int(leo%3),
		ValueSize: int(leo*37%900) + 1,
		Timestamp: 1_700_000_000_000 + leo,
		Fill:      byte(leo),
	})
	PatchBaseOffset(b, leo)
	return b
}

const killParts = 2

var killCfg = Config{SegmentBytes: 64 << 10, IndexIntervalBytes: 1024}

// TestKillChild is the child process of TestKillDashNine; it does nothing
// unless started by it.
func TestKillChild(t *testing.T) {
	dir := os.Getenv("SYNAPSE_KILL_CHILD_DIR")
	if dir == "" {
		t.Skip("child of TestKillDashNine only")
	}
	s := OpenStore(Options{Logger: zap.NewNop(), Preallocate: true, SyncFSMin: 1}) // every round a syncfs one
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	var wg sync.WaitGroup
	for i := 0; i < killParts; i++ {
		p, err := s.OpenPartition(filepath.Join(dir, fmt.Sprintf("t-%d", i)), killCfg)
		if err != nil {
			fmt.Printf("ERR open: %v\n", err)
			os.Exit(2)
		}
		wg.Add(1)
		go func(i int, p *Partition) {
			defer wg.Done()
			for n := 0; n < 100000; n++ {
				leo := p.LogEndOffset()
				res, err := p.Append(killBatch(leo))
				if err == nil {
					err = p.WaitDurable(res.LastOffset + 1)
				}
				mu.Lock()
				if err != nil {
					fmt.Fprintf(out, "ERR %d: %v\n", i, err)
				} else {
					fmt.Fprintf(out, "D %d %d\n", i, res.BaseOffset)
				}
				out.Flush() // reported = durable; the parent may kill us any time after
				mu.Unlock()
			}
		}(i, p)
	}
	wg.Wait()
}

// TestKillDashNine runs a child process that appends durably and reports
// each acknowledged batch, kills it with SIGKILL at random moments, many
// times, and checks after each kill that every reported batch is present and
// byte-identical (the next child run also recovers the directory).
func TestKillDashNine(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	dir := t.TempDir()
	reported := make([]map[int64]bool, killParts)
	for i := range reported {
		reported[i] = map[int64]bool{}
	}
	const rounds = 12
	for round := 0; round < rounds; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "SYNAPSE_KILL_CHILD_DIR="+dir)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		killAfter := time.Duration(20+rng.IntN(250)) * time.Millisecond
		var timer <-chan time.Time
		n := 0
	read:
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					break read
				}
				if timer == nil {
					timer = time.After(killAfter) // start the clock at the first ack
				}
				f := strings.Fields(l)
				if len(f) != 3 || f[0] != "D" {
					t.Fatalf("child: %s", l)
				}
				part, _ := strconv.Atoi(f[1])
				off, _ := strconv.ParseInt(f[2], 10, 64)
				reported[part][off] = true
				n++
			case <-timer:
				cmd.Process.Signal(syscall.SIGKILL)
				timer = nil
				for l := range lines { // acks written before the kill still count
					f := strings.Fields(l)
					if len(f) == 3 && f[0] == "D" {
						part, _ := strconv.Atoi(f[1])
						off, _ := strconv.ParseInt(f[2], 10, 64)
						reported[part][off] = true
						n++
					}
				}
				break read
			case <-time.After(30 * time.Second):
				cmd.Process.Signal(syscall.SIGKILL)
				t.Fatal("child silent for 30s")
			}
		}
		cmd.Wait()
		t.Logf("round %d: killed after %v, %d acks", round, killAfter, n)
		// Read-only check of the directory as the kill left it.
		for i := 0; i < killParts; i++ {
			checkReportedOnDisk(t, filepath.Join(dir, fmt.Sprintf("t-%d", i)), reported[i])
		}
	}
	// Finally recover in process and read everything through the engine.
	s := OpenStore(Options{Logger: zap.NewNop(), Preallocate: true})
	defer s.Close()
	for i := 0; i < killParts; i++ {
		p, err := s.OpenPartition(filepath.Join(dir, fmt.Sprintf("t-%d", i)), killCfg)
		if err != nil {
			t.Fatal(err)
		}
		for off := range reported[i] {
			res, err := p.Read(off, 1)
			if err != nil {
				t.Fatalf("partition %d offset %d: %v", i, off, err)
			}
			b, _ := res.AppendTo(nil)
			res.Release()
			if !bytes.Equal(b, killBatch(off)) {
				t.Fatalf("partition %d offset %d: bytes differ", i, off)
			}
		}
	}
}

// checkReportedOnDisk reads the segment files directly (no recovery) and
// checks every reported batch is there with the expected bytes.
func checkReportedOnDisk(t *testing.T, dir string, reported map[int64]bool) {
	t.Helper()
	rep, err := VerifyDir(OSFS, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("%s damaged after kill: %v", dir, rep.Damage)
	}
	found := map[int64][]byte{}
	names, _ := OSFS.ReadDir(dir)
	for _, n := range names {
		if !strings.HasSuffix(n, ".log") {
			continue
		}
		path := filepath.Join(dir, n)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		DumpSegment(OSFS, path, func(b SegmentBatch) {
			found[b.Header.BaseOffset] = data[b.Pos : b.Pos+int64(b.Header.Length)]
		})
	}
	for off := range reported {
		b, ok := found[off]
		if !ok {
			t.Fatalf("%s: acknowledged batch %d missing after kill -9", dir, off)
		}
		if !bytes.Equal(b, killBatch(off)) {
			t.Fatalf("%s: acknowledged batch %d differs after kill -9", dir, off)
		}
	}
}
