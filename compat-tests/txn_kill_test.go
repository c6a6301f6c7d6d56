package compattests

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestTxnKillLoop: exactly-once read-process-write while the broker is
// SIGKILLed and restarted over and over (issue 17's real-process loop).
//
// Topic in (4 partitions, 16 KiB segments) holds unique values in-<i>: a
// prefill of 1500, and 800 more after every restart. Two franz-go
// GroupTransactSession workers (distinct transactional ids, one consumer
// group, read_committed) copy every input record to out (3 partitions,
// 16 KiB segments, keyed by the input value, value out-<input>): poll up
// to 20 records, Begin, produce, "process" 0–60 ms, End with the consumed
// offsets; every 7th transaction with records is aborted on purpose. A
// new session starts with InitProducerId (Java's initTransactions); on an
// error from End or Begin the worker closes its session and opens a new
// one with the same transactional id, as a real service would. About one
// transaction in 250 the worker "crashes" instead of ending it: its client
// goes away without EndTxn or LeaveGroup, and the next session's
// InitProducerId must fence it and abort what it left open.
//
// Meanwhile the test kills the broker (SIGKILL to the PID it started) and
// starts it again on the same data directory and port, TXN_KILL_CYCLES
// times (default 10). The broker runs 1–3 s each cycle: odd cycles are
// killed at a random moment, even ones 0–20 ms after a worker calls End
// (AddOffsetsToTxn, TxnOffsetCommit, EndTxn and the markers in flight);
// every third cycle it stays down 0–1.5 s more.
//
// Afterwards the workers drain in (the group's committed offsets reach in's
// end offsets, 90 s at most), stop, and:
//   - the group's committed offsets for in are in's end offsets;
//   - in (read_uncommitted) holds exactly the values produced to it;
//   - out read_committed holds one record per input value, no duplicate,
//     none missing, nothing else (and every value End reported committed
//     is among them, and in no two committed transactions);
//   - out read_uncommitted holds at least the records of the transactions
//     known aborted beyond that, and only copies of input values;
//   - no transaction of the workers' ids is left open (DescribeTransactions);
//   - the broker logged no panic.
//
// The figures (cycles, records, duplicates, losses, aborts, kills inside a
// transaction) are logged. TXN_KILL_KGO_LOG=dir writes each worker's kgo
// log (info level) there; TXN_KILL_KEEP=dir keeps a copy of the data
// directory of a failed run.
func TestTxnKillLoop(t *testing.T) { runTxnKillLoop(t, false) }

// TestTxnKillLoopTiered: the same with in and out tiered as fast as the
// broker can (local.retention.bytes 0, maintenance every 50 ms, to the
// default tier, a local directory): the workers' fetches and the final
// reads are mostly cold, read_committed with the bucket's copy of each
// segment's aborted-transaction index.
func TestTxnKillLoopTiered(t *testing.T) { runTxnKillLoop(t, true) }

func runTxnKillLoop(t *testing.T, tiered bool) {
	if tiered {
		t.Setenv("SYNAPSE_MAINTENANCE_INTERVAL", "50ms")
	}
	b := newBroker(t)
	if b.Target() == targetKfake {
		t.Skip("kfake runs inside the test process and cannot be killed with SIGKILL")
	}
	if keep := os.Getenv("TXN_KILL_KEEP"); keep != "" {
		// Defers run before the harness's cleanup stops the broker and
		// removes its directory: a copy of the data for a post-mortem.
		defer func() {
			if t.Failed() {
				out, err := exec.Command("cp", "-a", b.(*synapseBroker).dataDir, keep).CombinedOutput()
				t.Logf("TXN_KILL_KEEP: data directory copied to %s: %v %s", keep, err, out)
			}
		}()
	}
	cycles := 10
	if v := os.Getenv("TXN_KILL_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("TXN_KILL_CYCLES=%q: want a positive integer", v)
		}
		cycles = n
	}
	const (
		inParts, outParts = 4, 3
		prefill           = 1500
		chunk             = 800 // after every restart
		maxPerTxn         = 20
		maxWork           = 60 * time.Millisecond // processing time per transaction, at most
		workers           = 2
		abortEvery        = 7
		crashEvery        = 250 // transactions of a worker, on average, between two crashes of it
	)
	ctx := testCtx(t, 3*time.Minute+time.Duration(cycles)*10*time.Second)
	started := time.Now()

	admCl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.DialTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	base := uniqueTopic(t)
	in, out, group := base+"-in", base+"-out", base+"-group"
	for _, tp := range []struct {
		name  string
		parts int32
	}{{in, inParts}, {out, outParts}} {
		// Small segments: most of the log is sealed segments, their
		// aborted-transaction indexes written before a kill or rebuilt
		// by the recovery after one.
		cfg := map[string]*string{"segment.bytes": strPtr("16384")}
		if tiered {
			cfg["local.retention.bytes"] = strPtr("0")
			cfg["retention.ms"] = strPtr("-1")
		}
		if _, err := adm.CreateTopic(ctx, tp.parts, 1, cfg, tp.name); err != nil {
			t.Fatalf("create %s: %v", tp.name, err)
		}
	}

	// The input, produced while the broker is up (before each kill is
	// scheduled), so that every value is acknowledged.
	var produced []string
	feed := func(n int) {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.DialTimeout(time.Second), kgo.ProducerLinger(0))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		var rs []*kgo.Record
		for range n {
			v := fmt.Sprintf("in-%d", len(produced))
			produced = append(produced, v)
			rs = append(rs, &kgo.Record{Topic: in, Key: []byte(v), Value: []byte(v)})
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := cl.ProduceSync(pctx, rs...).FirstErr(); err != nil {
			t.Fatalf("produce %d input records: %v", n, err)
		}
	}
	feed(prefill)

	var logDir string
	if d := os.Getenv("TXN_KILL_KGO_LOG"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		logDir = d
	}
	ledger := &tkLedger{committed: map[string]int{}}
	stop := make(chan struct{})
	endSignal := make(chan int) // a worker about to call End, when the kill loop listens
	var wg sync.WaitGroup
	ws := make([]*tkWorker, workers)
	for i := range ws {
		w := &tkWorker{
			t: t, id: i, addr: b.Addr(), in: in, out: out, group: group,
			txnID: fmt.Sprintf("%s-w%d", base, i), abortEvery: abortEvery, ledger: ledger,
			maxPerTxn: maxPerTxn, maxWork: maxWork, crashEvery: crashEvery, endSignal: endSignal, rng: mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), uint64(i))),
		}
		if logDir != "" {
			f, err := os.Create(filepath.Join(logDir, fmt.Sprintf("worker%d.log", i)))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			w.log = f
		}
		w.crashing.Store(true)
		ws[i] = w
		wg.Add(1)
		go func() { defer wg.Done(); w.run(stop) }()
	}
	stopped := false
	stopWorkers := func() {
		if stopped {
			return
		}
		stopped = true
		close(stop)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			t.Errorf("workers still running 90 s after they were told to stop")
		}
	}
	defer stopWorkers() // also when a check below fails the test

	// The kill loop. Every cycle the broker runs 1–3 s. Odd cycles kill at
	// a random moment; even ones, after the first second, the moment a
	// worker calls End plus 0–20 ms (AddOffsetsToTxn, TxnOffsetCommit,
	// EndTxn and the markers are in flight: End takes some 15–20 ms
	// here), or at 3 s if none does. Every third cycle
	// the broker stays down 0–1.5 s more (clients see refused
	// connections and back off).
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 17))
	killsMidTxn, workersMidTxn, killsAtEnd := 0, 0, 0
	var downtime, ups []time.Duration
	for c := range cycles {
		up := time.Now()
		wait := time.Duration(1000+rng.IntN(2000)) * time.Millisecond
		atEnd := c%2 == 1
		if atEnd {
			wait = time.Second
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			t.Fatalf("cycle %d: %v", c, ctx.Err())
		}
		if atEnd {
			select {
			case <-endSignal:
				time.Sleep(time.Duration(rng.IntN(20000)) * time.Microsecond)
				killsAtEnd++
			case <-time.After(2 * time.Second):
			}
		}
		mid := 0
		for _, w := range ws {
			if w.inTxn.Load() {
				mid++
			}
		}
		t0 := time.Now()
		b.Kill9(t)
		ups = append(ups, t0.Sub(up))
		if mid > 0 {
			killsMidTxn++
			workersMidTxn += mid
		}
		if c%3 == 2 {
			time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
		}
		b.Start(t)
		downtime = append(downtime, time.Since(t0))
		feed(chunk)
	}
	killPhase := time.Since(started)
	for _, w := range ws {
		w.crashing.Store(false)
	}

	// Drain: the group's committed offsets reach the end of in.
	ends := tkOffsets(t, ctx, adm, in, false)
	var inTotal int64
	for _, o := range ends {
		inTotal += o
	}
	if inTotal != int64(len(produced)) {
		t.Errorf("in's end offsets %v add up to %d, want %d (the values produced)", ends, inTotal, len(produced))
	}
	drainStart := time.Now()
	var lastCommitted map[int32]int64
	for {
		lastCommitted = tkGroupOffsets(ctx, adm, group, in)
		if tkSame(lastCommitted, ends) {
			break
		}
		if time.Since(drainStart) > 90*time.Second {
			t.Errorf("the workers did not drain in within 90 s: committed %v, end offsets %v", lastCommitted, ends)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	drain := time.Since(drainStart)
	stopWorkers()
	for _, w := range ws {
		w.report()
	}
	if t.Failed() {
		t.FailNow()
	}

	// The group's committed offsets once the workers are gone.
	if got := tkGroupOffsets(ctx, adm, group, in); !tkSame(got, ends) {
		t.Errorf("committed offsets of %s for %s after the workers stopped: %v, want the end offsets %v", group, in, got, ends)
	}
	// No transaction left open.
	var ids []string
	for _, w := range ws {
		ids = append(ids, w.txnID)
	}
	if dts, err := adm.DescribeTransactions(ctx, ids...); err != nil {
		t.Errorf("DescribeTransactions: %v", err)
	} else {
		for _, dt := range dts.Sorted() {
			t.Logf("transaction %s: state %s, producer %d epoch %d, %d partitions", dt.TxnID, dt.State, dt.ProducerID, dt.ProducerEpoch, len(dt.Topics))
			if dt.Err != nil || strings.EqualFold(dt.State, "Ongoing") || strings.HasPrefix(dt.State, "Prepare") {
				t.Errorf("transaction %s after the workers stopped: state %q err %v", dt.TxnID, dt.State, dt.Err)
			}
		}
	}

	// in holds exactly what was produced.
	inRecs := tkReadAll(t, ctx, b.Addr(), in, ends, kgo.ReadUncommitted())
	inVals := map[string]int{}
	for _, r := range inRecs {
		inVals[string(r.Value)]++
	}
	for _, v := range produced {
		if inVals[v] != 1 {
			t.Errorf("in holds %d copies of %q, want 1", inVals[v], v)
		}
	}
	if len(inRecs) != len(produced) {
		t.Errorf("in holds %d records, want %d", len(inRecs), len(produced))
	}

	// out: a plain record at the end of every partition marks how far to
	// read; read_committed reaches it only once no transaction is open.
	outEnds := tkAppendEnd(t, ctx, b.Addr(), out, outParts)
	rc := tkReadAll(t, ctx, b.Addr(), out, outEnds, kgo.ReadCommitted())
	ru := tkReadAll(t, ctx, b.Addr(), out, outEnds, kgo.ReadUncommitted())
	want := map[string]bool{}
	for _, v := range produced {
		want[v] = true
	}
	rcCount := map[string]int{}
	var dups, bogus int
	for _, r := range rc {
		k := string(r.Key)
		if k == tkEndKey {
			continue
		}
		if !want[k] || string(r.Value) != "out-"+k {
			bogus++
			if bogus <= 10 {
				t.Errorf("out read_committed p%d@%d: key %q value %q is no copy of an input record", r.Partition, r.Offset, k, r.Value)
			}
			continue
		}
		rcCount[k]++
		if rcCount[k] == 2 {
			dups++
			if dups <= 10 {
				t.Errorf("out read_committed: a second copy of %q at p%d@%d", k, r.Partition, r.Offset)
			}
		}
	}
	losses := 0
	for _, v := range produced {
		if rcCount[v] == 0 {
			losses++
			if losses <= 10 {
				t.Errorf("out read_committed: no copy of %q", v)
			}
		}
	}
	lostAcked := 0
	ledger.mu.Lock()
	for v, n := range ledger.committed {
		if n > 1 {
			t.Errorf("%q was in %d transactions that End reported committed", v, n)
		}
		if rcCount[v] == 0 {
			lostAcked++
		}
	}
	ledgerCommitted := len(ledger.committed)
	ledger.mu.Unlock()
	if lostAcked > 0 {
		t.Errorf("%d input values a worker was told were committed have no copy in out", lostAcked)
	}
	ruExtra, ruBogus := 0, 0
	ruCount := map[string]int{}
	for _, r := range ru {
		k := string(r.Key)
		if k == tkEndKey {
			continue
		}
		if !want[k] || string(r.Value) != "out-"+k {
			ruBogus++
			continue
		}
		ruCount[k]++
	}
	for k, n := range ruCount {
		if n < rcCount[k] {
			t.Errorf("out: read_uncommitted has %d copies of %q, read_committed %d", n, k, rcCount[k])
		}
		ruExtra += n - rcCount[k]
	}
	if ruBogus > 0 {
		t.Errorf("out read_uncommitted: %d records that are no copy of an input record", ruBogus)
	}

	var st tkStats
	for _, w := range ws {
		st.add(w.stats())
	}
	if ruExtra < st.abortedRecs {
		t.Errorf("read_uncommitted of out shows %d records beyond read_committed, fewer than the %d records of transactions known aborted", ruExtra, st.abortedRecs)
	}
	if st.abortedRecs > 0 && ruExtra == 0 {
		t.Errorf("transactions with %d records were aborted, yet read_uncommitted of out shows no record beyond read_committed", st.abortedRecs)
	}
	if st.deliberate == 0 {
		t.Errorf("no transaction was aborted on purpose: the test did not test aborts")
	}
	tkScanLog(t, b.(*synapseBroker).logPath)
	segs, idxs := 0, 0
	for p := range int32(outParts) {
		dir := filepath.Join(b.(*synapseBroker).dataDir, fmt.Sprintf("%s-%d", out, p))
		segs += countFiles(dir, ".log")
		idxs += countFiles(dir, ".txnindex")
	}
	t.Logf("out on disk: %d segments, %d .txnindex files", segs, idxs)
	if tiered {
		tsegs, tidxs := 0, 0
		filepath.Walk(filepath.Join(b.(*synapseBroker).dataDir, "tier"), func(p string, fi os.FileInfo, err error) error {
			if err == nil && strings.Contains(p, out) {
				switch {
				case strings.HasSuffix(p, ".log"):
					tsegs++
				case strings.HasSuffix(p, ".txnindex"):
					tidxs++
				}
			}
			return nil
		})
		t.Logf("out in the tier: %d segments, %d .txnindex files", tsegs, tidxs)
		if tsegs == 0 {
			t.Errorf("no segment of %s was ever uploaded to the tier", out)
		}
	}
	t.Logf("%d kill -9 cycles in %s (up %v before each kill; down+restart %v), drain %s, %s in all",
		cycles, killPhase.Round(time.Millisecond), tkRound(ups), tkRound(downtime), drain.Round(time.Millisecond), time.Since(started).Round(time.Millisecond))
	t.Logf("kills that landed with a worker inside a transaction (between Begin and End returning): %d of %d (%d worker-transactions interrupted); %d kills 0–20 ms after a worker called End",
		killsMidTxn, cycles, workersMidTxn, killsAtEnd)
	t.Logf("input records %d; out read_committed %d copies of %d distinct inputs, duplicates %d, losses %d, foreign %d; read_uncommitted %d records beyond read_committed (aborted copies)",
		len(produced), len(rc)-outParts, len(rcCount), dups, losses, bogus, ruExtra)
	avgEnd := time.Duration(0)
	if n := st.txns - st.crashes; n > 0 {
		avgEnd = st.endTime / time.Duration(n)
	}
	t.Logf("workers: %d sessions, %d transactions with records: %d committed (%d inputs End reported committed), %d aborted on purpose, %d aborted by the session (rebalance, failed offset commit), %d abandoned by a simulated worker crash, %d ended with an error (outcome unknown, session reopened); %d records in aborted transactions, %d more in transactions of unknown outcome or not all written; End took %s on average, %s at most; %d InitProducerId errors, %d Begin errors, %d produce errors, %d fetch errors",
		st.sessions, st.txns, st.commits, ledgerCommitted, st.deliberate, st.forced, st.crashes, st.endErrs, st.abortedRecs, st.unknownRecs,
		avgEnd.Round(10*time.Microsecond), st.maxEnd.Round(time.Millisecond), st.initErrs, st.beginErrs, st.produceErrs, st.fetchErrs)
}

const tkEndKey = "end-of-test"

// tkLedger: the input values that End reported committed, over all workers.
type tkLedger struct {
	mu        sync.Mutex
	committed map[string]int
}

type tkStats struct {
	sessions, txns, commits, deliberate, forced, endErrs, crashes int
	abortedRecs, unknownRecs, beginErrs, produceErrs, fetchErrs   int
	initErrs                                                      int
	endTime, maxEnd                                               time.Duration
}

// abortedOrUnknown counts the n records of an aborted transaction: known
// in the log if they were all acknowledged, else maybe.
func (s *tkStats) abortedOrUnknown(written bool, n int) {
	if written {
		s.abortedRecs += n
	} else {
		s.unknownRecs += n
	}
}

func (s *tkStats) add(o tkStats) {
	s.sessions += o.sessions
	s.txns += o.txns
	s.commits += o.commits
	s.deliberate += o.deliberate
	s.forced += o.forced
	s.endErrs += o.endErrs
	s.crashes += o.crashes
	s.unknownRecs += o.unknownRecs
	s.initErrs += o.initErrs
	s.endTime += o.endTime
	s.maxEnd = max(s.maxEnd, o.maxEnd)
	s.abortedRecs += o.abortedRecs
	s.beginErrs += o.beginErrs
	s.produceErrs += o.produceErrs
	s.fetchErrs += o.fetchErrs
}

type tkWorker struct {
	t                testing.TB
	id               int
	addr             string
	in, out, group   string
	txnID            string
	abortEvery       int
	crashEvery       int
	endSignal        chan<- int
	maxPerTxn        int
	maxWork          time.Duration
	rng              *mrand.Rand // run's own
	ledger           *tkLedger
	log              *os.File
	inTxn            atomic.Bool
	crashing         atomic.Bool // simulated crashes on (during the kill loop)
	mu               sync.Mutex
	st               tkStats
	notes            []string
	lastNoteByPrefix map[string]int
}

func (w *tkWorker) stats() tkStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st
}

// note keeps the first few messages of each kind for the report.
func (w *tkWorker) note(kind, format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lastNoteByPrefix == nil {
		w.lastNoteByPrefix = map[string]int{}
	}
	w.lastNoteByPrefix[kind]++
	if w.lastNoteByPrefix[kind] <= 3 {
		w.notes = append(w.notes, fmt.Sprintf("%s %s: %s", time.Now().Format("15:04:05.000"), kind, fmt.Sprintf(format, args...)))
	}
}

func (w *tkWorker) report() {
	w.mu.Lock()
	defer w.mu.Unlock()
	kinds := make([]string, 0, len(w.lastNoteByPrefix))
	for k := range w.lastNoteByPrefix {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var counts []string
	for _, k := range kinds {
		counts = append(counts, fmt.Sprintf("%s×%d", k, w.lastNoteByPrefix[k]))
	}
	w.t.Logf("worker %d (%s): %+v; events %s", w.id, w.txnID, w.st, strings.Join(counts, ", "))
	for _, n := range w.notes {
		w.t.Logf("  worker %d %s", w.id, n)
	}
}

func (w *tkWorker) newSession(ctx context.Context) (*kgo.GroupTransactSession, error) {
	opts := []kgo.Opt{
		kgo.WithContext(ctx),
		kgo.SeedBrokers(w.addr),
		kgo.DialTimeout(time.Second),
		kgo.TransactionalID(w.txnID),
		kgo.TransactionTimeout(10 * time.Second),
		kgo.ConsumerGroup(w.group),
		kgo.ConsumeTopics(w.in),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(250 * time.Millisecond),
		kgo.SessionTimeout(3 * time.Second),
		kgo.HeartbeatInterval(300 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second),
		kgo.ProducerLinger(0),
	}
	if w.log != nil {
		id := w.id
		opts = append(opts, kgo.WithLogger(kgo.BasicLogger(w.log, kgo.LogLevelInfo, func() string {
			return fmt.Sprintf("%s w%d ", time.Now().Format("15:04:05.000"), id)
		})))
	}
	return kgo.NewGroupTransactSession(opts...)
}

// run copies in to out, one transaction per poll, until stop is closed
// (between transactions).
func (w *tkWorker) run(stop <-chan struct{}) {
	var (
		sess   *kgo.GroupTransactSession
		cancel context.CancelFunc
	)
	closeSession := func() {
		done := make(chan struct{})
		go func() { sess.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			w.note("close", "Close still blocked after 15 s; cancelling the client's context")
			cancel()
			<-done
		}
		cancel()
		sess, cancel = nil, nil
	}
	defer func() {
		if sess != nil {
			closeSession()
		}
	}()
	for {
		select {
		case <-stop:
			return
		default:
		}
		if sess == nil {
			sctx, c := context.WithCancel(context.Background())
			s, err := w.newSession(sctx)
			if err != nil {
				c()
				w.note("new-session", "%v", err)
				time.Sleep(200 * time.Millisecond)
				continue
			}
			sess, cancel = s, c
			w.mu.Lock()
			w.st.sessions++
			w.mu.Unlock()
			// Like Java's initTransactions: InitProducerId before
			// anything else, which fences a previous session of this
			// transactional id and aborts what it left open (its
			// pending offsets would hold our OffsetFetch meanwhile).
			ictx, icancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, _, err = sess.Client().ProducerID(ictx)
			icancel()
			if err != nil {
				w.mu.Lock()
				w.st.initErrs++
				w.mu.Unlock()
				w.note("init", "InitProducerId: %v", err)
				closeSession()
				time.Sleep(250 * time.Millisecond)
				continue
			}
		}

		pctx, pcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := sess.PollRecords(pctx, w.maxPerTxn)
		pcancel()
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return
			}
			w.mu.Lock()
			w.st.fetchErrs++
			w.mu.Unlock()
			w.note("fetch", "%s p%d: %v", topic, p, err)
		})
		var vals []string
		var recs []*kgo.Record
		fs.EachRecord(func(r *kgo.Record) {
			v := string(r.Value)
			vals = append(vals, v)
			recs = append(recs, &kgo.Record{Topic: w.out, Key: []byte(v), Value: []byte("out-" + v)})
		})
		if len(recs) == 0 {
			continue
		}

		if err := sess.Begin(); err != nil {
			w.mu.Lock()
			w.st.beginErrs++
			w.mu.Unlock()
			w.note("begin", "%v", err)
			closeSession()
			continue
		}
		w.inTxn.Store(true)
		w.mu.Lock()
		w.st.txns++
		deliberate := w.st.txns%w.abortEvery == 0
		w.mu.Unlock()
		ectx, ecancel := context.WithTimeout(context.Background(), 30*time.Second)
		try := kgo.TryCommit
		if deliberate {
			try = kgo.TryAbort
		}
		written := true // every record acknowledged: in out's log
		if err := sess.ProduceSync(ectx, recs...).FirstErr(); err != nil {
			written = false
			w.mu.Lock()
			w.st.produceErrs++
			w.mu.Unlock()
			w.note("produce", "%d records: %v", len(recs), err)
			try = kgo.TryAbort
		}
		// The processing: the transaction stays open a while, so that
		// kills land inside transactions too.
		time.Sleep(time.Duration(w.rng.Int64N(int64(w.maxWork))))
		if w.crashing.Load() && w.rng.IntN(w.crashEvery) == 0 {
			// The worker crashes mid-transaction: its client goes away
			// without ending it (nor leaving the group). The next
			// session's InitProducerId must abort it.
			ecancel()
			cancel()
			closeSession()
			w.inTxn.Store(false)
			w.mu.Lock()
			w.st.crashes++
			w.st.abortedOrUnknown(written, len(recs))
			w.mu.Unlock()
			continue
		}
		select {
		case w.endSignal <- w.id:
		default:
		}
		t0 := time.Now()
		committed, err := sess.End(ectx, try)
		ecancel()
		w.inTxn.Store(false)
		took := time.Since(t0)
		if took > 10*time.Second {
			w.note("slow-end", "End(commit=%v) took %s (committed=%v err=%v)", bool(try), took.Round(time.Millisecond), committed, err)
		}
		w.mu.Lock()
		w.st.endTime += took
		w.st.maxEnd = max(w.st.maxEnd, took)
		switch {
		case err != nil:
			w.st.endErrs++
			w.st.unknownRecs += len(recs)
		case committed:
			w.st.commits++
		case deliberate:
			w.st.deliberate++
			w.st.abortedOrUnknown(written, len(recs))
		default:
			w.st.forced++
			w.st.abortedOrUnknown(written, len(recs))
		}
		w.mu.Unlock()
		if committed && err == nil {
			w.ledger.mu.Lock()
			for _, v := range vals {
				w.ledger.committed[v]++
			}
			w.ledger.mu.Unlock()
		}
		if err != nil {
			w.note("end", "End(commit=%v) of %d records: %v", bool(try), len(recs), err)
			closeSession()
		}
	}
}

// tkOffsets: the end offsets (high watermarks) of topic, or with
// committed its last stable offsets (ListOffsets read_committed).
func tkOffsets(t testing.TB, ctx context.Context, adm *kadm.Client, topic string, committed bool) map[int32]int64 {
	t.Helper()
	var (
		lo  kadm.ListedOffsets
		err error
	)
	for try := 0; ; try++ {
		if committed {
			lo, err = adm.ListCommittedOffsets(ctx, topic)
		} else {
			lo, err = adm.ListEndOffsets(ctx, topic)
		}
		if err == nil {
			err = lo.Error()
		}
		if err == nil || try == 20 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("list offsets of %s: %v", topic, err)
	}
	m := map[int32]int64{}
	lo.Each(func(o kadm.ListedOffset) { m[o.Partition] = o.Offset })
	return m
}

// tkGroupOffsets: the group's committed offsets for topic (nil on error).
func tkGroupOffsets(ctx context.Context, adm *kadm.Client, group, topic string) map[int32]int64 {
	fo, err := adm.FetchOffsets(ctx, group)
	if err != nil || fo.Error() != nil {
		return nil
	}
	m := map[int32]int64{}
	for p, o := range fo[topic] {
		m[p] = o.At
	}
	return m
}

func tkSame(a, b map[int32]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for p, o := range a {
		if bo, ok := b[p]; !ok || bo != o {
			return false
		}
	}
	return true
}

// tkAppendEnd writes one plain record with key tkEndKey to every partition
// and returns the offsets to read up to (one past it).
func tkAppendEnd(t testing.TB, ctx context.Context, addr, topic string, parts int32) map[int32]int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends := map[int32]int64{}
	for p := range parts {
		r := &kgo.Record{Topic: topic, Partition: p, Key: []byte(tkEndKey), Value: []byte(tkEndKey)}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce the end record to %s p%d: %v", topic, p, err)
		}
		ends[p] = r.Offset + 1
	}
	return ends
}

// tkReadAll reads topic from the start of each partition until a record at
// or past ends[p]-1 is seen on every partition (60 s at most).
func tkReadAll(t testing.TB, ctx context.Context, addr, topic string, ends map[int32]int64, iso kgo.IsolationLevel) []*kgo.Record {
	t.Helper()
	parts := map[int32]kgo.Offset{}
	left := map[int32]bool{}
	for p, e := range ends {
		parts[p] = kgo.NewOffset().AtStart()
		if e > 0 {
			left[p] = true
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.FetchIsolationLevel(iso),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}), kgo.FetchMaxWait(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(left) > 0 {
		fs := cl.PollFetches(rctx)
		if rctx.Err() != nil {
			var lso map[int32]int64
			if lo, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, topic); err == nil {
				lso = map[int32]int64{}
				lo.Each(func(o kadm.ListedOffset) { lso[o.Partition] = o.Offset })
			}
			for _, p := range tkKeys(left) {
				tkRawDump(t, ctx, cl, topic, p, iso)
			}
			t.Fatalf("%s (%s): partitions %v not read up to %v within 60 s (%d records read; last stable offsets now %v)",
				topic, tkIsoName(iso), tkKeys(left), ends, len(recs), lso)
		}
		fs.EachError(func(_ string, p int32, err error) { t.Logf("fetch %s p%d (%s): %v", topic, p, tkIsoName(iso), err) })
		fs.EachRecord(func(r *kgo.Record) {
			recs = append(recs, r)
			if r.Offset >= ends[r.Partition]-1 {
				delete(left, r.Partition)
			}
		})
	}
	return recs
}

func tkIsoName(iso kgo.IsolationLevel) string {
	if iso == kgo.ReadCommitted() {
		return "read_committed"
	}
	return "read_uncommitted"
}

func tkKeys(m map[int32]bool) []int32 {
	var ps []int32
	for p := range m {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
}

func tkRound(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(10 * time.Millisecond)
	}
	return out
}

// tkRawDump logs what one raw Fetch from offset 0 answers for topic p at
// isolation iso: the partition's offsets, its aborted transactions and the
// batches (a diagnosis for a read that never reaches the end).
func tkRawDump(t testing.TB, ctx context.Context, cl *kgo.Client, topic string, p int32, iso kgo.IsolationLevel) {
	t.Helper()
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil {
		t.Logf("raw fetch %s p%d: metadata: %v", topic, p, err)
		return
	}
	var offset int64
	for range 4 {
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID = -1
		req.MaxBytes = 1 << 20
		req.SessionEpoch = -1
		if iso == kgo.ReadCommitted() {
			req.IsolationLevel = 1
		}
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = topic
		rt.TopicID = md.Topics[topic].ID
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = p
		rp.FetchOffset = offset
		rp.PartitionMaxBytes = 64 << 10
		rp.CurrentLeaderEpoch = -1
		rp.LogStartOffset = -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Logf("raw fetch %s p%d@%d: %v", topic, p, offset, err)
			return
		}
		for _, rt := range resp.Topics {
			for _, fp := range rt.Partitions {
				var bs []string
				raw := fp.RecordBatches
				next := offset
				for len(raw) >= 12 {
					var b kmsg.RecordBatch
					if err := b.ReadFrom(raw); err != nil {
						bs = append(bs, fmt.Sprintf("unreadable batch (%d bytes left): %v", len(raw), err))
						break
					}
					kind := "data"
					if b.Attributes&0x20 != 0 {
						kind = "control"
					}
					if b.Attributes&0x10 != 0 {
						kind += "/txn"
					}
					if len(bs) < 12 {
						bs = append(bs, fmt.Sprintf("[%d..%d %s pid %d epoch %d]", b.FirstOffset, b.FirstOffset+int64(b.LastOffsetDelta), kind, b.ProducerID, b.ProducerEpoch))
					}
					next = b.FirstOffset + int64(b.LastOffsetDelta) + 1
					raw = raw[12+int(b.Length):]
				}
				var ab []string
				for i, a := range fp.AbortedTransactions {
					if i == 12 {
						ab = append(ab, "...")
						break
					}
					ab = append(ab, fmt.Sprintf("pid %d first %d", a.ProducerID, a.FirstOffset))
				}
				t.Logf("raw fetch %s p%d@%d %s: err %v hwm %d lso %d logstart %d, %d bytes, %d aborted txns %v, batches %v",
					topic, p, offset, tkIsoName(iso), kerr.ErrorForCode(fp.ErrorCode), fp.HighWatermark, fp.LastStableOffset, fp.LogStartOffset,
					len(fp.RecordBatches), len(fp.AbortedTransactions), ab, bs)
				if next == offset {
					return
				}
				offset = next
			}
		}
	}
}

// tkScanLog logs how many warnings and errors the broker logged (the
// harness runs it at --log-level warn), the first few of each message, and
// fails on a panic.
func tkScanLog(t testing.TB, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Logf("broker log %s: %v", path, err)
		return
	}
	counts := map[string]int{}
	var order []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "=== compat-tests") || strings.TrimSpace(line) == "" {
			continue
		}
		if strings.Contains(line, "panic") || strings.Contains(line, "fatal error") {
			t.Errorf("broker log: %s", line)
		}
		// Timestamp, level, logger, message: the message is the key.
		f := strings.SplitN(line, "\t", 5)
		key := line
		if len(f) >= 4 {
			key = strings.Join(f[1:4], " ")
		}
		if counts[key] == 0 {
			order = append(order, key)
		}
		counts[key]++
	}
	if len(order) == 0 {
		t.Logf("broker log: no warning or error")
	}
	for i, k := range order {
		if i == 15 {
			t.Logf("broker log: %d more kinds of line", len(order)-i)
			break
		}
		t.Logf("broker log: %d× %s", counts[k], k)
	}
}
