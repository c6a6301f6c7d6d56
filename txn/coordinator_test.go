package txn

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/log"
)

// fakeBroker records what the coordinator asks of the broker.
type fakeBroker struct {
	mu       sync.Mutex
	nextPID  int64
	markers  []string // "pid/epoch/commit/topic-partition"
	offsets  map[string][]Offset
	pending  map[string]int
	failMark bool
}

func (f *fakeBroker) config(t *testing.T, now func() time.Time) Config {
	return Config{
		Logger: zaptest.NewLogger(t),
		Now:    now,
		NextProducerID: func() (int64, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.nextPID++
			return f.nextPID - 1, nil
		},
		WriteMarkers: func(pid int64, epoch int16, commit bool, parts []TP, _ []int64) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.failMark {
				return errors.New("disk on fire")
			}
			for _, p := range parts {
				f.markers = append(f.markers, markerString(pid, epoch, commit, p))
			}
			return nil
		},
		CommitOffsets: func(g string, offs []Offset, _ int64) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.offsets == nil {
				f.offsets = map[string][]Offset{}
			}
			f.offsets[g] = append(f.offsets[g], offs...)
			return nil
		},
		Pending: func(g string, _ int64, parts []TP, pending bool) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.pending == nil {
				f.pending = map[string]int{}
			}
			if pending {
				f.pending[g] += len(parts)
			} else {
				f.pending[g] -= len(parts)
			}
		},
	}
}

func markerString(pid int64, epoch int16, commit bool, p TP) string {
	kind := "abort"
	if commit {
		kind = "commit"
	}
	return kind + "/" + p.Topic + "/" + string(rune('0'+p.Partition)) + "/" + string(rune('0'+epoch)) + "/" + string(rune('0'+pid))
}

type testEnv struct {
	t     *testing.T
	dir   string
	store *log.Store
	lp    *log.Partition
	c     *Coordinator
	f     *fakeBroker
	now   time.Time
}

func open(t *testing.T, dir string, f *fakeBroker, seed []byte) *testEnv {
	t.Helper()
	e := &testEnv{t: t, dir: dir, f: f, now: time.UnixMilli(1_700_000_000_000)}
	e.store = log.OpenStore(log.Options{Logger: zaptest.NewLogger(t)})
	lp, err := e.store.OpenPartition(filepath.Join(dir, "__transactions"), LogConfig())
	if err != nil {
		t.Fatal(err)
	}
	e.lp = lp
	e.c, err = Open(f.config(t, func() time.Time { return e.now }), lp, seed)
	if err != nil {
		t.Fatal(err)
	}
	e.c.Recover()
	return e
}

func (e *testEnv) close() {
	e.c.Close()
	e.lp.Close()
	e.store.Close()
}

func mustInit(t *testing.T, c *Coordinator, id string) (int64, int16) {
	t.Helper()
	pid, epoch, err := c.InitProducerID(id, 60000, -1, -1)
	if err != nil {
		t.Fatalf("init %s: %v", id, err)
	}
	return pid, epoch
}

func TestInitProducerIDBumpsAndFences(t *testing.T) {
	f := &fakeBroker{}
	e := open(t, t.TempDir(), f, nil)
	defer e.close()
	pid, epoch := mustInit(t, e.c, "a")
	if epoch != 0 {
		t.Fatalf("new id: epoch %d", epoch)
	}
	pid2, epoch2 := mustInit(t, e.c, "a")
	if pid2 != pid || epoch2 != 1 {
		t.Fatalf("second init: %d/%d, want %d/1", pid2, epoch2, pid)
	}
	// A fresh init (no ids) leaves no epoch a retry could name: the
	// producer it fenced cannot pass for one.
	if _, _, err := e.c.InitProducerID("a", 60000, pid, 0); err != kerr.ProducerFenced {
		t.Fatalf("fenced producer's KIP-360 init: %v, want PRODUCER_FENCED", err)
	}
	// KIP-360: the current id and epoch bump, and a retry of that (its
	// answer lost) gets the same answer, not another bump.
	if p, ep, err := e.c.InitProducerID("a", 60000, pid, epoch2); err != nil || p != pid || ep != epoch2+1 {
		t.Fatalf("KIP-360 init: %d/%d %v", p, ep, err)
	}
	if p, ep, err := e.c.InitProducerID("a", 60000, pid, epoch2); err != nil || p != pid || ep != epoch2+1 {
		t.Fatalf("retry of the KIP-360 init: %d/%d %v", p, ep, err)
	}
	epoch2++
	if _, _, err := e.c.InitProducerID("a", 60000, pid+7, 0); err != kerr.ProducerFenced {
		t.Fatalf("unknown producer id: %v, want PRODUCER_FENCED", err)
	}
	if _, _, err := e.c.InitProducerID("a", int32((16 * time.Minute).Milliseconds()), -1, -1); err != kerr.InvalidTransactionTimeout {
		t.Fatalf("timeout over the max: %v", err)
	}
	// An open transaction is aborted by the next init, at the bumped epoch.
	if _, err := e.c.AddPartitions("a", pid, epoch2, []TP{{"t", 0}}, false); err != nil {
		t.Fatal(err)
	}
	pid3, epoch3 := mustInit(t, e.c, "a")
	if epoch3 != epoch2+1 || len(f.markers) != 1 || f.markers[0] != markerString(pid, epoch3, false, TP{"t", 0}) {
		t.Fatalf("fencing init: %d/%d, markers %v", pid3, epoch3, f.markers)
	}
	if _, _, err := e.c.InitProducerID("a", 60000, pid, epoch2); err != kerr.ProducerFenced {
		t.Fatalf("the fenced producer's init: %v, want PRODUCER_FENCED (not taken for a retry)", err)
	}
	if _, err := e.c.Produce("a", pid, epoch2, TP{"t", 0}, func() error { return nil }); !errors.Is(err, ErrFenced) {
		t.Fatalf("produce at the fenced epoch: %v", err)
	}
}

func TestEndTxnCommitsOffsetsAndRetries(t *testing.T) {
	f := &fakeBroker{}
	e := open(t, t.TempDir(), f, nil)
	defer e.close()
	pid, epoch := mustInit(t, e.c, "a")
	if _, err := e.c.Produce("a", pid, epoch, TP{"t", 0}, func() error { return nil }); !errors.Is(err, ErrInvalidTxnState) {
		t.Fatalf("produce before AddPartitions: %v", err)
	}
	if _, err := e.c.TxnOffsetCommit("a", pid, epoch, "g", []Offset{{Topic: "t", Partition: 0, Offset: 5}}); err != kerr.InvalidTxnState {
		t.Fatalf("TxnOffsetCommit before AddOffsets: %v", err)
	}
	if _, err := e.c.AddPartitions("a", pid, epoch, []TP{{"t", 0}, {"t", 1}}, false); err != nil {
		t.Fatal(err)
	}
	if codes, _ := e.c.AddPartitions("a", pid, epoch, []TP{{"t", 1}, {"t", 2}}, true); codes[0] != 0 || codes[1] != kerr.InvalidTxnState.Code {
		t.Fatalf("verify only: %v", codes)
	}
	if err := e.c.AddOffsets("a", pid, epoch, "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.TxnOffsetCommit("a", pid, epoch, "g", []Offset{{Topic: "t", Partition: 0, Offset: 5}}); err != nil {
		t.Fatal(err)
	}
	if f.pending["g"] != 1 {
		t.Fatalf("pending: %v", f.pending)
	}
	if _, err := e.c.Produce("a", pid, epoch, TP{"t", 1}, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Produce("other", pid, epoch, TP{"t", 1}, func() error { return nil }); !errors.Is(err, ErrInvalidTxnState) {
		t.Fatalf("a batch of a's producer in a request naming another id: %v", err)
	}
	if _, _, err := e.c.EndTxn("a", pid, epoch, true, false); err != nil {
		t.Fatal(err)
	}
	if len(f.markers) != 2 || len(f.offsets["g"]) != 1 || f.offsets["g"][0].Offset != 5 || f.pending["g"] != 0 {
		t.Fatalf("after commit: markers %v offsets %v pending %v", f.markers, f.offsets, f.pending)
	}
	// A retry answers success and writes nothing; the other outcome is refused.
	if _, _, err := e.c.EndTxn("a", pid, epoch, true, false); err != nil {
		t.Fatalf("retried commit: %v", err)
	}
	if _, _, err := e.c.EndTxn("a", pid, epoch, false, false); err != kerr.InvalidTxnState {
		t.Fatalf("abort after commit: %v", err)
	}
	if len(f.markers) != 2 {
		t.Fatalf("retry wrote markers: %v", f.markers)
	}
	// v5 (KIP-890): the end bumps the epoch; a retry at the old epoch gets the new one.
	if _, err := e.c.AddPartitions("a", pid, epoch, []TP{{"t", 0}}, false); err != nil {
		t.Fatal(err)
	}
	p5, e5, err := e.c.EndTxn("a", pid, epoch, false, true)
	if err != nil || p5 != pid || e5 != epoch+1 {
		t.Fatalf("v5 end: %d/%d %v", p5, e5, err)
	}
	if p, ep, err := e.c.EndTxn("a", pid, epoch, false, true); err != nil || p != p5 || ep != e5 {
		t.Fatalf("v5 retry: %d/%d %v", p, ep, err)
	}
	if f.markers[2] != markerString(pid, e5, false, TP{"t", 0}) {
		t.Fatalf("v5 marker at the new epoch: %v", f.markers)
	}
}

// TestFailedEndIsFinishedLater: a marker write that fails after the
// decision leaves the transaction prepared; the retry and a restart (with
// Recover) both finish it the same way.
func TestFailedEndIsFinishedLater(t *testing.T) {
	dir := t.TempDir()
	f := &fakeBroker{}
	e := open(t, dir, f, nil)
	pid, epoch := mustInit(t, e.c, "a")
	if _, err := e.c.AddPartitions("a", pid, epoch, []TP{{"t", 0}}, false); err != nil {
		t.Fatal(err)
	}
	f.failMark = true
	if _, _, err := e.c.EndTxn("a", pid, epoch, true, false); err != kerr.CoordinatorNotAvailable {
		t.Fatalf("end with failing markers: %v", err)
	}
	if in, _ := e.c.Describe("a"); in.State != PrepareCommit {
		t.Fatalf("state %v, want PrepareCommit", in.State)
	}
	if _, _, err := e.c.EndTxn("a", pid, epoch, false, false); err != kerr.InvalidTxnState {
		t.Fatalf("abort of a transaction decided to commit: %v", err)
	}
	// v5: the end bumped the epoch with the decision; the client's retry
	// at its old epoch is the same end (not a fenced producer).
	pid2, epoch2 := mustInit(t, e.c, "b")
	if _, err := e.c.AddPartitions("b", pid2, epoch2, []TP{{"t", 1}}, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.c.EndTxn("b", pid2, epoch2, false, true); err != kerr.CoordinatorNotAvailable {
		t.Fatalf("v5 end with failing markers: %v", err)
	}
	f.failMark = false
	if p, ep, err := e.c.EndTxn("b", pid2, epoch2, false, true); err != nil || p != pid2 || ep != epoch2+1 {
		t.Fatalf("v5 retry after a failed end: %d/%d %v", p, ep, err)
	}
	f.failMark = true
	e.close()
	f.failMark = false
	e = open(t, dir, f, nil) // Recover finishes it
	defer e.close()
	if in, _ := e.c.Describe("a"); in.State != CompleteCommit || len(f.markers) != 2 {
		t.Fatalf("after restart: %v, markers %v", in.State, f.markers)
	}
}

func TestTimeoutExpiryAndSnapshot(t *testing.T) {
	f := &fakeBroker{}
	e := open(t, t.TempDir(), f, nil)
	pid, epoch := mustInit(t, e.c, "slow")
	mustInit(t, e.c, "idle")
	if _, err := e.c.AddPartitions("slow", pid, epoch, []TP{{"t", 3}}, false); err != nil {
		t.Fatal(err)
	}
	e.now = e.now.Add(61 * time.Second)
	e.c.Maintain(e.now)
	in, _ := e.c.Describe("slow")
	if in.State != CompleteAbort || in.Epoch != epoch+1 || len(f.markers) != 1 {
		t.Fatalf("timed out: %+v markers %v", in, f.markers)
	}
	if _, _, err := e.c.EndTxn("slow", pid, epoch, true, false); err != kerr.ProducerFenced {
		t.Fatalf("commit after the timeout: %v", err)
	}
	snap, _ := e.c.Snapshot()
	e.now = e.now.Add(8 * 24 * time.Hour)
	e.c.Maintain(e.now)
	if _, ok := e.c.Describe("idle"); ok {
		t.Fatal("idle id not expired")
	}
	e.close()
	// The snapshot restores into an empty log.
	r := open(t, t.TempDir(), &fakeBroker{nextPID: 100}, snap)
	defer r.close()
	got, ok := r.c.Describe("slow")
	if !ok || got.ProducerID != pid || got.Epoch != epoch+1 || got.State != CompleteAbort {
		t.Fatalf("restored: %+v %v", got, ok)
	}
	if l := r.c.List(); len(l) != 2 {
		t.Fatalf("restored ids: %+v", l)
	}
}

// TestWaitAdds: with WaitAdds (a cluster) an add is answered only once the
// log holds it; a failed wait answers COORDINATOR_NOT_AVAILABLE and leaves
// the transaction as it was. A closed coordinator answers NOT_COORDINATOR,
// EndTxn included (the client looks for the new one).
func TestWaitAdds(t *testing.T) {
	f := &fakeBroker{}
	now := time.UnixMilli(1_700_000_000_000)
	store := log.OpenStore(log.Options{Logger: zaptest.NewLogger(t)})
	defer store.Close()
	lp, err := store.OpenPartition(filepath.Join(t.TempDir(), "__transactions"), LogConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer lp.Close()
	var mu sync.Mutex
	waits, failWait := 0, false
	cfg := f.config(t, func() time.Time { return now })
	cfg.WaitAdds = true
	cfg.Wait = func(next int64) error {
		mu.Lock()
		defer mu.Unlock()
		waits++
		if failWait {
			return errors.New("not the leader any more")
		}
		return lp.WaitDurable(next)
	}
	c, err := Open(cfg, lp, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Recover()
	pid, epoch := mustInit(t, c, "a")
	count := func() int { mu.Lock(); defer mu.Unlock(); return waits }
	before := count()
	if _, err := c.AddPartitions("a", pid, epoch, []TP{{"t", 0}}, false); err != nil {
		t.Fatal(err)
	}
	if err := c.AddOffsets("a", pid, epoch, "g"); err != nil {
		t.Fatal(err)
	}
	if got := count() - before; got != 2 {
		t.Fatalf("%d waits for two adds, want 2", got)
	}
	mu.Lock()
	failWait = true
	mu.Unlock()
	if _, err := c.AddPartitions("a", pid, epoch, []TP{{"t", 1}}, false); err != kerr.CoordinatorNotAvailable {
		t.Fatalf("add with the wait failing: %v, want COORDINATOR_NOT_AVAILABLE", err)
	}
	if _, err := c.Produce("a", pid, epoch, TP{"t", 1}, func() error { return nil }); err == nil {
		t.Fatal("produce to a partition whose add failed was let through")
	}
	if _, err := c.Produce("a", pid, epoch, TP{"t", 0}, func() error { return nil }); err != nil {
		t.Fatalf("produce to the partition added before: %v", err)
	}
	c.Close()
	if _, _, err := c.EndTxn("a", pid, epoch, true, false); err != kerr.NotCoordinator {
		t.Fatalf("EndTxn on a closed coordinator: %v, want NOT_COORDINATOR", err)
	}
	if _, err := c.AddPartitions("a", pid, epoch, []TP{{"t", 0}}, false); err != kerr.NotCoordinator {
		t.Fatalf("AddPartitions on a closed coordinator: %v, want NOT_COORDINATOR", err)
	}
}
