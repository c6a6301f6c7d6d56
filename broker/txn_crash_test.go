package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/group"
	"github.com/synapsebroker/synapse/internal/memfs"
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/txn"
)

// The transaction crash test (issue 17), in the style of the log engine's
// TestCrashAtEveryOp: a deterministic workload of six transactions (three
// commits, an abort, one fenced by a new producer of its id, one left
// open) over three data partitions, the transaction log and the group log
// of one store on the crashable file system, with a clean restart in the
// middle, is killed at every file-system mutation (state records, data
// batches, each marker, its aborted-index entry, the offsets, segment
// rolls, the close and its producer snapshots); what a power loss keeps is
// reopened as the broker does (partitions with their producer snapshot and
// replay, the group log, the transaction log, Recover, then Maintain past
// the transaction timeout), and every transaction must be committed or
// aborted as a whole for a read_committed reader, agreeing with the
// coordinator's state and the group's offsets, with nothing acknowledged
// lost. The recovery itself is crashed too, and recovered again.

// txnMemFS adapts *memfs.FS to log.FS (log/helpers_test.go's memFS).
type txnMemFS struct{ *memfs.FS }

func (m txnMemFS) OpenFile(name string, flag int, perm os.FileMode) (log.File, error) {
	f, err := m.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}

const (
	txnCrashRoot  = "/txncrash"
	txnCrashTopic = "t"
	txnCrashParts = 3
	// txnCrashTimeoutMs is every transaction's timeout; recovery's clock
	// is well past it, so what is left open is aborted.
	txnCrashTimeoutMs = 60_000
)

var (
	txnCrashT0 = time.UnixMilli(1_700_000_000_000)
	// Small segments: the workload rolls, so markers and aborted-index
	// entries land in sealed and active segments.
	txnCrashDataCfg = log.Config{SegmentBytes: 700, IndexIntervalBytes: 100}
)

// txnEnv is the broker's transactional machinery built by hand on one
// store: data partitions, the group coordinator, the transaction
// coordinator wired as Server.txnConfig wires it.
type txnEnv struct {
	store  *log.Store
	parts  []*partition
	logs   []*log.Partition // every open log, closed by close
	groups *group.Coordinator
	txns   *txn.Coordinator
	nowMs  atomic.Int64
	nextID atomic.Int64
	// found: the transactions' states at open, before Recover (for the
	// test's coverage report).
	found []txn.State
}

func (e *txnEnv) now() time.Time { return time.UnixMilli(e.nowMs.Load()) }

func (e *txnEnv) lookup(tp txn.TP) *partition {
	if tp.Topic != txnCrashTopic || tp.Partition < 0 || int(tp.Partition) >= len(e.parts) {
		return nil
	}
	return e.parts[tp.Partition]
}

// openTxnEnv opens everything as a start of the broker does, up to (not
// including) txn.Coordinator.Recover. firstID is where new producer ids
// start. On an error what was opened is closed.
func openTxnEnv(fsys log.FS, now time.Time, firstID int64) (*txnEnv, error) {
	e := &txnEnv{store: log.OpenStore(log.Options{FS: fsys, Logger: zap.NewNop()})}
	e.nowMs.Store(now.UnixMilli())
	e.nextID.Store(firstID)
	open := func(dir string, cfg log.Config) (*log.Partition, error) {
		lp, err := e.store.OpenPartition(txnCrashRoot+"/"+dir, cfg)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", dir, err)
		}
		e.logs = append(e.logs, lp)
		return lp, nil
	}
	tp := &topic{name: txnCrashTopic}
	for i := range txnCrashParts {
		lp, err := open(fmt.Sprintf("%s-%d", txnCrashTopic, i), txnCrashDataCfg)
		if err != nil {
			e.close()
			return nil, err
		}
		p := &partition{topic: tp, index: int32(i), log: lp, producers: map[int64]*producerState{}}
		// loadProducers, with the snapshot read from fsys.
		snap, err := readTxnFile(fsys, lp.Dir()+"/"+producersFile)
		if err := p.loadProducersFrom(snap, err); err != nil {
			e.close()
			return nil, fmt.Errorf("load producers of partition %d: %w", i, err)
		}
		e.parts = append(e.parts, p)
	}
	tp.partitions = e.parts
	gl, err := open(groupsDirForTest, group.LogConfig())
	if err != nil {
		e.close()
		return nil, err
	}
	if e.groups, err = group.Open(group.Config{Logger: zap.NewNop(), Now: e.now}, gl, nil); err != nil {
		e.close()
		return nil, fmt.Errorf("load groups: %w", err)
	}
	tl, err := open(txnDir, txn.LogConfig())
	if err != nil {
		e.close()
		return nil, err
	}
	cfg := txnHooks(e.lookup, e.groups, e.nowMs.Load, 1)
	cfg.Logger, cfg.Now = zap.NewNop(), e.now
	cfg.NextProducerID = func() (int64, error) { return e.nextID.Add(1) - 1, nil }
	if e.txns, err = txn.Open(cfg, tl, nil); err != nil {
		e.close()
		return nil, fmt.Errorf("load transactions: %w", err)
	}
	return e, nil
}

// groupsDirForTest is the group log's directory (the broker's name).
const groupsDirForTest = "__groups"

// readTxnFile reads a whole file of fsys.
func readTxnFile(fsys log.FS, name string) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n, err := f.Size()
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil && !(errors.Is(err, io.EOF) && n == 0) {
		return nil, err
	}
	return b, nil
}

// shutdown closes as the broker's shutdown does: the coordinators, then the
// data partitions with their producer snapshots in one CloseBatch
// (registry.close), then the group and transaction logs.
func (e *txnEnv) shutdown() error {
	e.txns.Close()
	e.groups.Close()
	files := map[string][]byte{}
	lps := make([]*log.Partition, len(e.parts))
	for i, p := range e.parts {
		lps[i] = p.log
		if path, b, ok := p.producersFile(); ok {
			files[path] = b
		}
	}
	err := e.store.CloseBatch(lps, files)
	for _, lp := range e.logs[len(e.parts):] {
		if cerr := lp.Close(); err == nil {
			err = cerr
		}
	}
	if cerr := e.store.Close(); err == nil {
		err = cerr
	}
	return err
}

func (e *txnEnv) close() {
	if e.txns != nil {
		e.txns.Close()
	}
	if e.groups != nil {
		e.groups.Close()
	}
	for _, lp := range e.logs {
		lp.Close() // errors: a crashed file system
	}
	e.store.Close()
}

// txnBatch builds an uncompressed transactional v2 batch of pid at epoch
// with base sequence seq, one record per value.
func txnBatch(pid int64, epoch int16, seq int32, nowMs int64, values []string) []byte {
	var body []byte
	for i, v := range values {
		rec := kmsg.Record{OffsetDelta: int32(i), Value: []byte(v)}
		enc := rec.AppendTo(nil)
		body = binary.AppendVarint(body, int64(len(enc)-1))
		body = append(body, enc[1:]...)
	}
	b := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1,
		Magic:                2,
		Attributes:           0x10, // transactional
		LastOffsetDelta:      int32(len(values) - 1),
		FirstTimestamp:       nowMs,
		MaxTimestamp:         nowMs,
		ProducerID:           pid,
		ProducerEpoch:        epoch,
		FirstSequence:        seq,
		NumRecords:           int32(len(values)),
		Records:              body,
	}
	out := b.AppendTo(nil)
	binary.BigEndian.PutUint32(out[8:], uint32(len(out)-12))
	binary.BigEndian.PutUint32(out[17:], crc32.Checksum(out[21:], crc32.MakeTable(crc32.Castagnoli)))
	return out
}

// crashTxn is one transaction of the workload: its name (the records'
// prefix), its transactional id, the partitions it writes, the group it
// commits offsets for and how it ends.
type crashTxn struct {
	name    string
	id      string
	group   string
	parts   []int32
	offsets []txn.Offset
	end     string // "commit", "abort" or "open" (left open)
	bump    bool   // EndTxn v5 (KIP-890)

	// follows: the transaction of the same producer this one comes
	// after (it continues its epoch and sequences); followed: a later
	// one of its id exists.
	follows  *crashTxn
	followed bool

	pid   int64
	epoch int16
	seq   map[int32]int32
	// records planned per partition (every record its produces carry).
	records map[int32][]string
	// acked: EndTxn returned success.
	acked bool
}

func newCrashTxns() []*crashTxn {
	l := []*crashTxn{
		{name: "t1", id: "t1", group: "g1", parts: []int32{0, 1, 2}, end: "commit", bump: true,
			offsets: []txn.Offset{{Topic: txnCrashTopic, Partition: 0, Offset: 5, LeaderEpoch: -1}, {Topic: txnCrashTopic, Partition: 1, Offset: 6, LeaderEpoch: -1}}},
		{name: "t2", id: "t2", group: "g2", parts: []int32{0, 2}, end: "abort",
			offsets: []txn.Offset{{Topic: txnCrashTopic, Partition: 0, Offset: 7, LeaderEpoch: -1}}},
		{name: "t3", id: "t3", group: "g3", parts: []int32{1, 2}, end: "open",
			offsets: []txn.Offset{{Topic: txnCrashTopic, Partition: 2, Offset: 8, LeaderEpoch: -1}}},
		{name: "t4", id: "t4", group: "g4", parts: []int32{0, 1}, end: "commit",
			offsets: []txn.Offset{{Topic: txnCrashTopic, Partition: 2, Offset: 9, LeaderEpoch: -1}}},
		// t2's producer again, after its abort, at the same epoch: its
		// sequences go on past the ABORT markers.
		{name: "t5", id: "t2", group: "g5", parts: []int32{1, 2}, end: "commit",
			offsets: []txn.Offset{{Topic: txnCrashTopic, Partition: 1, Offset: 11, LeaderEpoch: -1}}},
		// Left open at the end: aborted by recovery's maintenance.
		{name: "t6", id: "t6", group: "g6", parts: []int32{0}, end: "open",
			offsets: []txn.Offset{{Topic: txnCrashTopic, Partition: 0, Offset: 12, LeaderEpoch: -1}}},
	}
	for _, x := range l {
		x.seq, x.records = map[int32]int32{}, map[int32][]string{}
	}
	l[4].follows, l[1].followed = l[1], true
	return l
}

// txnWorkload runs the transactions, interleaved, through the paths the
// handlers use; it stops at the first error (a crash).
type txnWorkload struct {
	txns []*crashTxn
	// steps counts the workload steps that returned success.
	steps int
}

func (w *txnWorkload) tick(e *txnEnv) { e.nowMs.Add(1) }

func kerrOf(e *kerr.Error) error {
	if e == nil {
		return nil
	}
	return e
}

func (w *txnWorkload) init(e *txnEnv, x *crashTxn) error {
	w.tick(e)
	pid, epoch, ke := e.txns.InitProducerID(x.id, txnCrashTimeoutMs, -1, -1)
	if ke != nil {
		return fmt.Errorf("init %s: %w", x.id, ke)
	}
	x.pid, x.epoch = pid, epoch
	return nil
}

func (w *txnWorkload) add(e *txnEnv, x *crashTxn) error {
	w.tick(e)
	if f := x.follows; f != nil {
		x.pid, x.epoch, x.seq = f.pid, f.epoch, f.seq
	}
	tps := make([]txn.TP, len(x.parts))
	for i, p := range x.parts {
		tps[i] = txn.TP{Topic: txnCrashTopic, Partition: p}
	}
	codes, ke := e.txns.AddPartitions(x.id, x.pid, x.epoch, tps, false)
	if ke != nil {
		return fmt.Errorf("add partitions %s: %w", x.id, ke)
	}
	for _, c := range codes {
		if c != 0 {
			return fmt.Errorf("add partitions %s: %w", x.id, kerr.ErrorForCode(c))
		}
	}
	return nil
}

// produce appends one batch of x (n records) to partition p as produceTo
// does for a transactional batch, then waits as acks=all does.
func (w *txnWorkload) produce(e *txnEnv, x *crashTxn, p int32, n int) error {
	w.tick(e)
	var values []string
	for i := range n {
		values = append(values, fmt.Sprintf("%s/%d/%d", x.name, p, len(x.records[p])+i))
	}
	b := txnBatch(x.pid, x.epoch, x.seq[p], e.nowMs.Load(), values)
	h, err := log.ParseBatchHeader(b)
	if err != nil {
		return err
	}
	part := e.parts[p]
	var next int64
	var sp kmsg.ProduceResponseTopicPartition
	txnEnd, err := e.txns.Produce(x.id, h.ProducerID, h.ProducerEpoch, txn.TP{Topic: txnCrashTopic, Partition: p}, func() error {
		var err error
		next, err = part.appendIdempotent(b, &h, &sp, e.nowMs.Load(), nil)
		return err
	})
	if err != nil {
		return fmt.Errorf("produce %s to %d: %w", x.id, p, err)
	}
	// acks=all, as deferredProduce.finish: the batch and the record that
	// added its partition.
	if err := part.log.WaitDurable(next); err != nil {
		return fmt.Errorf("produce %s to %d: %w", x.id, p, err)
	}
	if err := e.txns.WaitDurable(txnEnd); err != nil {
		return fmt.Errorf("produce %s to %d: transaction log: %w", x.id, p, err)
	}
	x.seq[p] += int32(n)
	x.records[p] = append(x.records[p], values...)
	return nil
}

func (w *txnWorkload) offsets(e *txnEnv, x *crashTxn) error {
	w.tick(e)
	if ke := e.txns.AddOffsets(x.id, x.pid, x.epoch, x.group); ke != nil {
		return fmt.Errorf("add offsets %s: %w", x.id, ke)
	}
	w.tick(e)
	codes, ke := e.txns.TxnOffsetCommit(x.id, x.pid, x.epoch, x.group, x.offsets)
	if ke != nil {
		return fmt.Errorf("txn offset commit %s: %w", x.id, ke)
	}
	for _, c := range codes {
		if c != 0 {
			return fmt.Errorf("txn offset commit %s: %w", x.id, kerr.ErrorForCode(c))
		}
	}
	return nil
}

func (w *txnWorkload) end(e *txnEnv, x *crashTxn) error {
	w.tick(e)
	_, _, ke := e.txns.EndTxn(x.id, x.pid, x.epoch, x.end == "commit", x.bump)
	if ke != nil {
		return fmt.Errorf("end %s: %w", x.id, ke)
	}
	x.acked = true
	return nil
}

func (w *txnWorkload) run(fsys log.FS) error {
	w.txns = newCrashTxns()
	e, err := openTxnEnv(fsys, txnCrashT0, 1000)
	if err != nil {
		return err
	}
	defer func() {
		if e != nil {
			e.close()
		}
	}()
	e.txns.Recover()
	t1, t2, t3, t4, t5, t6 := w.txns[0], w.txns[1], w.txns[2], w.txns[3], w.txns[4], w.txns[5]
	steps := []func() error{
		func() error { return w.init(e, t1) },
		func() error { return w.init(e, t2) },
		func() error { return w.init(e, t3) },
		func() error { return w.init(e, t4) },
		// t3 opens first on partition 1: its LSO stays behind t3
		// until t3 is fenced (or recovery's maintenance aborts it).
		func() error { return w.add(e, t3) },
		func() error { return w.produce(e, t3, 1, 2) },
		func() error { return w.add(e, t1) },
		func() error { return w.add(e, t2) },
		// t1 and t2 interleave on partitions 0 and 2.
		func() error { return w.produce(e, t1, 0, 3) },
		func() error { return w.produce(e, t2, 0, 2) },
		func() error { return w.produce(e, t1, 1, 2) },
		func() error { return w.produce(e, t1, 2, 3) },
		func() error { return w.produce(e, t2, 2, 1) },
		func() error { return w.produce(e, t1, 0, 2) },
		func() error { return w.produce(e, t2, 0, 3) },
		func() error { return w.produce(e, t1, 1, 1) },
		func() error { return w.offsets(e, t1) },
		func() error { return w.offsets(e, t2) },
		func() error { return w.end(e, t1) }, // commit with the epoch bump
		func() error { return w.end(e, t2) }, // abort
		// A clean restart with t3 open: producer snapshots, then the
		// replay from them.
		func() error {
			err := e.shutdown()
			if err != nil {
				e = nil
				return err
			}
			if e, err = openTxnEnv(fsys, e.now(), e.nextID.Load()); err != nil {
				return err
			}
			e.txns.Recover()
			return nil
		},
		func() error { return w.add(e, t4) },
		func() error { return w.add(e, t5) },
		func() error { return w.produce(e, t4, 0, 2) },
		func() error { return w.produce(e, t5, 2, 2) },
		func() error { return w.produce(e, t3, 2, 2) },
		func() error { return w.produce(e, t4, 1, 3) },
		func() error { return w.produce(e, t5, 1, 1) },
		func() error { return w.offsets(e, t4) },
		func() error { return w.offsets(e, t3) },
		func() error { return w.offsets(e, t5) },
		func() error { return w.produce(e, t4, 0, 1) },
		func() error { return w.end(e, t5) }, // commit
		func() error { return w.end(e, t4) }, // commit
		func() error { return w.init(e, t6) },
		func() error { return w.add(e, t6) },
		func() error { return w.produce(e, t6, 0, 2) },
		func() error { return w.offsets(e, t6) },
		// A new producer of t3's id fences the open t3: its
		// transaction is aborted (with the epoch bumped) by the init.
		func() error {
			w.tick(e)
			_, _, ke := e.txns.InitProducerID(t3.id, txnCrashTimeoutMs, -1, -1)
			return kerrOf(ke)
		},
		// t6 is left open.
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
		w.steps++
	}
	return nil
}

// recoverTxnEnv is a start after a crash: open, Recover, and Maintain with
// a clock past every transaction's timeout (what the maintenance loop does
// once that long has passed), so nothing stays open. The environment is
// returned open (nil on an error, everything closed).
func recoverTxnEnv(fsys log.FS) (*txnEnv, error) {
	now := txnCrashT0.Add(10 * time.Minute)
	e, err := openTxnEnv(fsys, now, 1_000_000)
	if err != nil {
		return nil, err
	}
	for _, in := range e.txns.List() {
		e.found = append(e.found, in.State)
	}
	e.txns.Recover()
	// As openTxns: the sweep at start of what no coordinator state holds.
	for _, p := range e.parts {
		for _, res := range abortUnheldOn(p, e.txns, now, 0, 1) {
			if res.err != nil {
				e.close()
				return nil, fmt.Errorf("abort an unheld transaction on %d: %w", p.index, res.err)
			}
		}
	}
	e.txns.Maintain(now)
	return e, nil
}

// readCommitted returns the records a read_committed consumer gets from
// partition p, fetch by fetch (maxBytes each) up to the LSO, with each
// fetch's aborted transactions applied as a client applies them (Kafka's
// consumer, franz-go): at each transactional batch (markers too) the
// aborted transactions starting at or before its last offset mark their
// producers aborted; a producer's batches are dropped while it is marked,
// until its ABORT marker; control batches are never returned.
func readCommitted(t *testing.T, p *partition, maxBytes int64) []string {
	t.Helper()
	var out []string
	off := p.log.LogStartOffset()
	for {
		lso := p.lastStable(p.log.HighWatermark())
		if off >= lso {
			return out
		}
		res, err := p.log.ReadStable(off, maxBytes, lso)
		if err != nil {
			t.Fatalf("read partition %d at %d: %v", p.index, off, err)
		}
		b, err := res.AppendTo(nil)
		next := res.NextOffset
		res.Release()
		if err != nil {
			t.Fatalf("read partition %d at %d: %v", p.index, off, err)
		}
		if next <= off {
			t.Fatalf("read partition %d at %d below the LSO %d returned nothing", p.index, off, lso)
		}
		aborted, err := p.log.AbortedTxns(nil, off, next)
		if err != nil {
			t.Fatalf("aborted transactions of partition %d in [%d, %d): %v", p.index, off, next, err)
		}
		sort.Slice(aborted, func(i, j int) bool { return aborted[i].FirstOffset < aborted[j].FirstOffset })
		abortedPIDs := map[int64]bool{}
		for len(b) > 0 {
			h, err := log.ParseBatchHeader(b)
			if err != nil {
				t.Fatalf("partition %d: batch header: %v", p.index, err)
			}
			batch := b[:int(h.Length)]
			b = b[len(batch):]
			if h.Transactional() {
				// Also for a marker: an ABORT marker at the start of
				// the fetch consumes its own entry (Kafka's
				// consumeAbortedTransactionsUpTo).
				for len(aborted) > 0 && aborted[0].FirstOffset <= h.LastOffset() {
					abortedPIDs[aborted[0].ProducerID] = true
					aborted = aborted[1:]
				}
			}
			if h.Control() {
				if h.Transactional() && log.ControlType(batch[log.BatchHeaderSize:]) == log.ControlAbort {
					delete(abortedPIDs, h.ProducerID)
				}
				continue
			}
			if h.Transactional() && abortedPIDs[h.ProducerID] {
				continue
			}
			var rb kmsg.RecordBatch
			if err := rb.ReadFrom(batch); err != nil {
				t.Fatalf("partition %d: batch at %d: %v", p.index, h.BaseOffset, err)
			}
			recs := rb.Records
			for range rb.NumRecords {
				l, n := binary.Varint(recs)
				if n <= 0 || int(l) > len(recs)-n {
					t.Fatalf("partition %d: batch at %d: bad record framing", p.index, h.BaseOffset)
				}
				var r kmsg.Record
				if err := r.ReadFrom(recs[:n+int(l)]); err != nil {
					t.Fatalf("partition %d: batch at %d: record: %v", p.index, h.BaseOffset, err)
				}
				out = append(out, string(r.Value))
				recs = recs[n+int(l):]
			}
		}
		off = next
	}
}

// checkTxnRecovered checks a recovered environment against what the
// workload w did (and acknowledged) before its crash.
func checkTxnRecovered(t *testing.T, e *txnEnv, w *txnWorkload, rng *rand.Rand, stats map[string]int) {
	t.Helper()
	for _, st := range e.found {
		stats["found "+st.String()]++
	}
	visible := map[string]map[int32][]string{} // transaction → partition → records
	for _, p := range e.parts {
		hw, leo := p.log.HighWatermark(), p.log.LogEndOffset()
		if lso := p.lastStable(hw); lso != hw || hw != leo {
			p.mu.Lock()
			open := fmt.Sprint(p.txnOpen)
			p.mu.Unlock()
			t.Fatalf("partition %d after recovery: LSO %d, high watermark %d, log end %d (open: %s)", p.index, lso, hw, leo, open)
		}
		seen := map[string]bool{}
		for _, r := range readCommitted(t, p, 1+rng.Int64N(600)) {
			if seen[r] {
				t.Fatalf("partition %d: record %q read twice", p.index, r)
			}
			seen[r] = true
			var id string
			var pi, n int
			if _, err := fmt.Sscanf(r, "t%d/%d/%d", &n, &pi, new(int)); err != nil || pi != int(p.index) {
				t.Fatalf("partition %d: record %q was never produced here", p.index, r)
			}
			id = "t" + strconv.Itoa(n)
			if visible[id] == nil {
				visible[id] = map[int32][]string{}
			}
			visible[id][p.index] = append(visible[id][p.index], r)
		}
	}
	for _, x := range w.txns {
		vis := visible[x.name]
		committed := len(vis) > 0
		if committed {
			// All of it, on every partition, in order.
			for _, p := range x.parts {
				if fmt.Sprint(vis[p]) != fmt.Sprint(x.records[p]) {
					for _, p := range e.parts {
						dumpTxnPartition(t, p)
					}
					t.Fatalf("%s half visible: partition %d shows %v of %v (all: %v)", x.name, p, vis[p], x.records[p], vis)
				}
			}
			if x.end != "commit" {
				t.Fatalf("%s (%s) visible to read_committed: %v", x.name, x.end, vis)
			}
		}
		if x.acked && x.end == "commit" && !committed {
			t.Fatalf("%s: commit acknowledged before the crash, aborted after it (records %v)", x.name, x.records)
		}
		if committed {
			stats[x.name+" committed"]++
		} else {
			stats[x.name+" aborted"]++
		}
		info, ok := e.txns.Describe(x.id)
		switch {
		case x.followed:
			// The state is its id's later transaction's.
		case committed && (!ok || info.State != txn.CompleteCommit):
			t.Fatalf("%s committed in the partitions, coordinator state %v (known %v)", x.name, info.State, ok)
		case !committed && ok && info.State != txn.CompleteAbort && info.State != txn.Empty:
			t.Fatalf("%s aborted in the partitions, coordinator state %v", x.name, info.State)
		}
		// The group's offsets: committed with the transaction, never
		// else, and nothing left pending.
		req := kmsg.NewPtrOffsetFetchRequest()
		req.Version = 8
		req.RequireStable = true
		rg := kmsg.NewOffsetFetchRequestGroup()
		rg.Group = x.group
		req.Groups = append(req.Groups, rg)
		resp := e.groups.OffsetFetch(req)
		got := map[txn.TP]int64{}
		for _, g := range resp.Groups {
			for _, rt := range g.Topics {
				for _, rp := range rt.Partitions {
					if rp.ErrorCode != 0 {
						t.Fatalf("%s: offset fetch of %s %s-%d: %v (pending after recovery)", x.name, x.group, rt.Topic, rp.Partition, kerr.ErrorForCode(rp.ErrorCode))
					}
					got[txn.TP{Topic: rt.Topic, Partition: rp.Partition}] = rp.Offset
				}
			}
		}
		want := map[txn.TP]int64{}
		if committed {
			for _, o := range x.offsets {
				want[txn.TP{Topic: o.Topic, Partition: o.Partition}] = o.Offset
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s (committed %v): group %s has offsets %v, want %v", x.name, committed, x.group, got, want)
		}
	}
	// The partitions take transactions again: the fenced t3 starts over
	// and commits on every partition.
	x := &crashTxn{name: "t9", id: "t3", parts: []int32{0, 1, 2}, end: "commit", seq: map[int32]int32{}, records: map[int32][]string{}}
	nw := &txnWorkload{}
	if err := nw.init(e, x); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	if err := nw.add(e, x); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	for _, p := range x.parts {
		if err := nw.produce(e, x, p, 1); err != nil {
			t.Fatalf("after recovery: %v", err)
		}
	}
	if err := nw.end(e, x); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	for _, p := range e.parts {
		if hw := p.log.HighWatermark(); p.lastStable(hw) != hw {
			t.Fatalf("partition %d: LSO %d below the high watermark %d after a commit", p.index, p.lastStable(hw), hw)
		}
		recs := readCommitted(t, p, 1<<20)
		if len(recs) == 0 || recs[len(recs)-1] != x.records[p.index][0] {
			t.Fatalf("partition %d after recovery: a committed record is not the last read_committed one: %v", p.index, recs)
		}
	}
}

// TestTxnCrashAtEveryOp crashes the transactional workload at each of its
// file-system mutations, and for every crash point the recovery at some of
// its own (three at random; every one with TXN_CRASH_FULL=1).
func TestTxnCrashAtEveryOp(t *testing.T) {
	seed := rand.Uint64()
	if s := os.Getenv("CRASH_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (rerun with CRASH_SEED=%d)", seed, seed)

	newFS := func(t *testing.T) *memfs.FS {
		m := memfs.New()
		if err := m.MkdirAll(txnCrashRoot, 0o755); err != nil {
			t.Fatal(err)
		}
		m.MarkAllSynced()
		return m
	}
	count := memfs.CrashAfter(-1)
	mfs := newFS(t)
	mfs.SetInjector(count.Inject)
	full := &txnWorkload{}
	if err := full.run(txnMemFS{mfs}); err != nil {
		t.Fatalf("workload without a crash: %v", err)
	}
	total := count.Count()
	t.Logf("workload: %d file-system mutations", total)
	if total < 50 {
		t.Fatalf("workload too small for a crash test: %d mutations", total)
	}
	// Without a crash: everything as acknowledged.
	e, err := recoverTxnEnv(txnMemFS{mfs})
	if err != nil {
		t.Fatal(err)
	}
	checkTxnRecovered(t, e, full, rand.New(rand.NewPCG(seed, 1)), map[string]int{})
	e.close()

	fullRecovery := os.Getenv("TXN_CRASH_FULL") != ""
	modes := []memfs.UnsyncedMode{memfs.DropUnsynced, memfs.KeepRandomPrefix, memfs.KeepRandomPrefixZeroed}
	var recoveryPoints int
	stats := map[string]int{}
	for k := 0; k <= total; k++ {
		rng := rand.New(rand.NewPCG(seed, uint64(k)))
		mfs := newFS(t)
		c := memfs.CrashAfter(k)
		mfs.SetInjector(c.Inject)
		w := &txnWorkload{}
		err := w.run(txnMemFS{mfs})
		if err != nil && !c.Crashed() {
			t.Fatalf("k=%d: workload failed without a crash: %v", k, err)
		}
		crashed := mfs.CrashClone(memfs.CrashConfig{Rand: rng, UnsyncedMode: modes[k%len(modes)]})

		// The recovery, crashed at its mutations (counted on a copy):
		// three of them picked at random for each crash point, all of
		// them with TXN_CRASH_FULL=1; then recovered again.
		{
			rc := memfs.CrashAfter(-1)
			cp := crashed.CrashClone(memfs.CrashConfig{})
			cp.SetInjector(rc.Inject)
			e, err := recoverTxnEnv(txnMemFS{cp})
			if err != nil {
				t.Fatalf("k=%d: recovery: %v", k, err)
			}
			e.close()
			n := rc.Count()
			js := rng.Perm(n)
			if !fullRecovery {
				js = js[:min(n, 3)]
			}
			for _, j := range js {
				recoveryPoints++
				cp := crashed.CrashClone(memfs.CrashConfig{})
				c2 := memfs.CrashAfter(j)
				cp.SetInjector(c2.Inject)
				if e, err := recoverTxnEnv(txnMemFS{cp}); err == nil {
					e.close()
				} else if !c2.Crashed() {
					t.Fatalf("k=%d j=%d: recovery failed without a crash: %v", k, j, err)
				}
				again := cp.CrashClone(memfs.CrashConfig{Rand: rng, UnsyncedMode: modes[(k+j)%len(modes)]})
				e, err := recoverTxnEnv(txnMemFS{again})
				if err != nil {
					t.Fatalf("k=%d j=%d: recovery after a crashed recovery: %v", k, j, err)
				}
				if !t.Run(fmt.Sprintf("k=%d/j=%d", k, j), func(t *testing.T) { checkTxnRecovered(t, e, w, rng, stats) }) {
					e.close()
					t.FailNow()
				}
				e.close()
			}
		}
		e, err := recoverTxnEnv(txnMemFS{crashed})
		if err != nil {
			t.Fatalf("k=%d: recovery after the crash (workload: %d steps, %v): %v", k, w.steps, err, err)
		}
		if !t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) { checkTxnRecovered(t, e, w, rng, stats) }) {
			e.close()
			t.FailNow()
		}
		e.close()
	}
	t.Logf("%d workload crash points, %d recovery crash points", total+1, recoveryPoints)
	keys := make([]string, 0, len(stats))
	for k := range stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%s: %d", k, stats[k])
	}
}

func dumpTxnPartition(t *testing.T, p *partition) {
	p.log.ScanBatches(0, func(h *log.BatchHeader, control int16) bool {
		t.Logf("p%d batch [%d, %d] pid %d epoch %d seq %d txn %v control %d", p.index, h.BaseOffset, h.LastOffset(), h.ProducerID, h.ProducerEpoch, h.BaseSequence, h.Transactional(), control)
		return true
	})
	l, err := p.log.AbortedTxns(nil, 0, 1<<62)
	t.Logf("p%d aborted %+v %v", p.index, l, err)
}
