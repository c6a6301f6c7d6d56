// Package txn is the transaction coordinator: Kafka's transaction protocol
// (KIP-98, KIP-447, KIP-360, and KIP-890's epoch bump on EndTxn v5) for the
// transactional ids of this broker. State lives in an internal partition of
// the log engine (the transaction log, Kafka's __transaction_state), one
// record per change of an id, replayed at open.
//
// The coordinator decides; the broker writes. Ending a transaction runs:
//
//	Ongoing ─EndTxn/timeout─▶ Prepare{Commit,Abort}  record durable (the decision)
//	        ─▶ markers on every partition of the transaction, durable (Config.WriteMarkers)
//	        ─▶ commit: the pending offsets into the group log, durable (Config.CommitOffsets)
//	        ─▶ Complete{Commit,Abort}  record durable ─▶ the client is answered
//
// A crash after the decision leaves a Prepare record: Recover (at start) and
// Maintain (after a failed write) finish it, so every transaction ends
// committed or aborted as a whole. Markers are written only to partitions
// where the producer still has an open transaction, so finishing twice
// writes nothing twice.
package txn

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/internal/recordlog"
	"github.com/synapsebroker/synapse/log"
)

// Config configures a Coordinator. Zero durations take Kafka's defaults.
type Config struct {
	Logger *zap.Logger
	Now    func() time.Time
	// MaxTimeout is transaction.max.timeout.ms (15 min): InitProducerId
	// asking for more is INVALID_TRANSACTION_TIMEOUT.
	MaxTimeout time.Duration
	// IDExpiration is transactional.id.expiration.ms (7 days): an id with
	// no transaction open and no change for that long is forgotten.
	IDExpiration time.Duration
	// NextProducerID hands out a producer id never used before.
	NextProducerID func() (int64, error)
	// WriteMarkers appends a COMMIT (commit) or ABORT marker of producer
	// pid at epoch to each partition parts[i] where pid has an open
	// transaction and no marker at or after addedAt[i] (the partition's log
	// end when it was added: such a marker is this transaction's, written
	// before a crash), and returns once they are durable.
	WriteMarkers func(pid int64, epoch int16, commit bool, parts []TP, addedAt []int64) error
	// MarkerSince reports whether partition p holds a marker of producer
	// pid at or after offset at, and which: the evidence, after a crash,
	// that a transaction whose Prepare record was lost had been decided.
	MarkerSince func(pid int64, p TP, at int64) (commit, ok bool)
	// LogEnd is a partition's durable end offset (recorded when it is
	// added to a transaction: this transaction's markers are at or after
	// it, the last one's before it).
	LogEnd func(p TP) int64
	// CommitOffsets writes a group's offsets durably (a transaction's
	// offsets, at its commit). since > 0 (an end resumed after a crash or a
	// failure, decided at since, Unix ms): partitions whose offset was
	// committed after since are left as they are (a later commit did).
	CommitOffsets func(group string, offsets []Offset, since int64) error
	// Pending tells the group coordinator that a group has (pending true)
	// or no longer has offsets of producer pid waiting for the end of its
	// transaction, for OffsetFetch's require_stable.
	Pending func(group string, pid int64, parts []TP, pending bool)
	// PartitionExists reports whether a topic partition exists.
	PartitionExists func(topic string, partition int32) bool

	// Append writes one batch of the transaction log and returns the
	// offset after it; Wait returns once the log is durable (in a
	// cluster: held by the ISR) up to next. By default they are the
	// log's Append and WaitDurable. A cluster's hooks write only while
	// this broker leads the log at the epoch the coordinator opened at.
	Append func(b []byte) (next int64, err error)
	Wait   func(next int64) error
	// DecideFirst makes an end wait until its decision (the Prepare
	// record) is durable before any marker is written. One broker needs
	// no wait (a marker found after a crash is the evidence of the
	// decision, MarkerSince); in a cluster the markers land on other
	// brokers, where a new coordinator does not look for them.
	DecideFirst bool
	// WaitAdds makes AddPartitionsToTxn and AddOffsetsToTxn answer only
	// once their record is durable. One broker needs no wait (Produce's
	// acknowledgement waits for the transaction log, and an open
	// transaction no durable record holds is aborted at start); in a
	// cluster the partitions' leaders do not wait for the coordinator's
	// log, so a client must not produce before its add is replicated.
	WaitAdds bool
}

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxTimeout <= 0 {
		c.MaxTimeout = 15 * time.Minute
	}
	if c.IDExpiration <= 0 {
		c.IDExpiration = 7 * 24 * time.Hour
	}
	if c.WriteMarkers == nil {
		c.WriteMarkers = func(int64, int16, bool, []TP, []int64) error { return nil }
	}
	if c.MarkerSince == nil {
		c.MarkerSince = func(int64, TP, int64) (bool, bool) { return false, false }
	}
	if c.LogEnd == nil {
		c.LogEnd = func(TP) int64 { return 0 }
	}
	if c.CommitOffsets == nil {
		c.CommitOffsets = func(string, []Offset, int64) error { return nil }
	}
	if c.Pending == nil {
		c.Pending = func(string, int64, []TP, bool) {}
	}
	if c.PartitionExists == nil {
		c.PartitionExists = func(string, int32) bool { return true }
	}
}

// appendBatch and wait are Config.Append and Config.Wait, or the log's own.
func (c *Coordinator) appendBatch(b []byte) (int64, error) {
	if c.cfg.Append != nil {
		return c.cfg.Append(b)
	}
	res, err := c.log.Append(b)
	if err != nil {
		return 0, err
	}
	return res.LastOffset + 1, nil
}

func (c *Coordinator) wait(next int64) error {
	if c.cfg.Wait != nil {
		return c.cfg.Wait(next)
	}
	return c.log.WaitDurable(next)
}

// LogConfig is the transaction log's configuration: records are never
// deleted by retention (compaction moves the log start instead).
func LogConfig() log.Config {
	return log.Config{
		SegmentBytes:    16 << 20,
		MaxMessageBytes: 16 << 20,
		RetentionBytes:  -1,
		RetentionMs:     -1,
	}
}

// Coordinator owns every transactional id.
type Coordinator struct {
	cfg Config
	log *log.Partition

	mu     sync.Mutex // guards txns, byPID, closed
	txns   map[string]*txn
	byPID  map[int64]*txn
	closed bool

	changes      atomic.Uint64
	sinceCompact atomic.Int64
	liveBytes    atomic.Int64
	compactMu    sync.Mutex
}

// Bounds of one transaction (its state is one record of the transaction
// log, at most LogConfig's 16 MiB): partitions added, groups added, and
// offsets pending per group.
const (
	MaxPartitions = 100_000
	MaxGroups     = 1_000
)

// Errors of a transactional produce (Produce).
var (
	// ErrInvalidTxnState: the partition is not in an open transaction of
	// this producer (INVALID_TXN_STATE).
	ErrInvalidTxnState = errors.New("the partition is not part of an open transaction of this producer")
	// ErrFenced: the producer's epoch is not the transactional id's
	// current one (INVALID_PRODUCER_EPOCH).
	ErrFenced = errors.New("producer epoch is not the transactional id's current epoch: fenced")
)

// Open loads the transaction log p (opened with LogConfig). If p is empty
// and seed is non-nil (a document Snapshot wrote), the seed is written into
// the log first: a restore from the tiered store. Transactions the log
// shows mid-end are finished by Recover, once the partitions are open.
func Open(cfg Config, p *log.Partition, seed []byte) (*Coordinator, error) {
	cfg.setDefaults()
	c := &Coordinator{cfg: cfg, log: p, txns: map[string]*txn{}, byPID: map[int64]*txn{}}
	if seed != nil && p.LogEndOffset() == p.LogStartOffset() {
		recs, err := parseSnapshot(seed)
		if err != nil {
			return nil, err
		}
		for len(recs) > 0 {
			// Batches of at most 512 records and 4 MiB (one id's record
			// may be larger: it goes alone).
			n, size := 0, 0
			for n < len(recs) && n < 512 && (n == 0 || size+len(recs[n].Value) <= 4<<20) {
				size += len(recs[n].Value)
				n++
			}
			if err := c.append(recs[:n]); err != nil {
				return nil, err
			}
			recs = recs[n:]
		}
		cfg.Logger.Info("restored transactions from the tiered store")
	}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

var errLoad = fmt.Errorf("txn: %w", recordlog.ErrUnreadable)

func (c *Coordinator) load() error {
	vals := map[string]*value{}
	n := 0
	err := recordlog.Replay(c.log, func(kb, vb []byte) error {
		n++
		var k key
		if err := json.Unmarshal(kb, &k); err != nil {
			return fmt.Errorf("%w: key: %v", errLoad, err)
		}
		if vb == nil {
			delete(vals, k.ID)
			return nil
		}
		var v value
		if err := json.Unmarshal(vb, &v); err != nil {
			return fmt.Errorf("%w: value of %q: %v", errLoad, k.ID, err)
		}
		vals[k.ID] = &v
		return nil
	})
	if err != nil {
		return err
	}
	for id, v := range vals {
		t := &txn{id: id}
		t.fromValue(v)
		c.txns[id] = t
		c.byPID[t.producerID] = t
	}
	c.liveBytes.Store(c.log.LocalBytes() / 2)
	c.cfg.Logger.Info("transactions loaded", zap.Int("transactional_ids", len(c.txns)), zap.Int("records", n))
	return nil
}

// Recover finishes the transactions the log shows mid-end (a Prepare
// record without its Complete one) and tells the group coordinator about
// pending offsets of open transactions. The broker calls it once its
// partitions and the group log are open, before it serves.
func (c *Coordinator) Recover() {
	for _, t := range c.all() {
		t.mu.Lock()
		switch t.state {
		case PrepareCommit, PrepareAbort:
			if err := c.completeLocked(t, true); err != nil {
				c.cfg.Logger.Warn("finish a transaction after restart (retried by maintenance)", zap.String("transactional_id", t.id), zap.Error(err))
			}
		case Ongoing:
			if commit, ok := c.decidedLocked(t); ok {
				// The end's Prepare record was lost, one of its markers
				// was not: the transaction was decided. Finished so.
				c.cfg.Logger.Info("finish a transaction decided before the restart (its marker survived)", zap.String("transactional_id", t.id), zap.Bool("commit", commit))
				t.state = PrepareAbort
				if commit {
					t.state = PrepareCommit
				}
				err := c.persistLocked(t)
				if err == nil {
					err = c.completeLocked(t, true)
				}
				if err != nil {
					c.cfg.Logger.Warn("finish a transaction after restart (retried by maintenance)", zap.String("transactional_id", t.id), zap.Error(err))
				}
				break
			}
			for g, offs := range t.groups {
				c.cfg.Pending(g, t.producerID, offsetTPs(offs), true)
			}
		}
		t.mu.Unlock()
	}
}

// decidedLocked looks for a marker of t's producer on one of its
// partitions since the partition was added: the evidence of an end
// decided before a crash. t.mu held.
func (c *Coordinator) decidedLocked(t *txn) (commit, ok bool) {
	for _, p := range t.partitionList() {
		if at := t.partitions[p]; at < 0 {
			continue // added before the bound was recorded: no evidence
		}
		if commit, ok := c.cfg.MarkerSince(t.producerID, p, t.partitions[p]); ok {
			return commit, true
		}
	}
	return false, false
}

func offsetTPs(offs map[TP]Offset) []TP {
	l := make([]TP, 0, len(offs))
	for k := range offs {
		l = append(l, k)
	}
	return l
}

// append writes recs as one batch and waits until it is durable.
func (c *Coordinator) append(recs []recordlog.Record) error {
	b := recordlog.Encode(recs, c.cfg.Now())
	next, err := c.appendBatch(b)
	if err != nil {
		return err
	}
	if err := c.wait(next); err != nil {
		return err
	}
	c.sinceCompact.Add(int64(len(b)))
	c.changes.Add(1)
	return nil
}

// persistLocked writes t's state and waits until it is durable. t.mu held.
func (c *Coordinator) persistLocked(t *txn) error {
	if err := c.persistSoonLocked(t); err != nil {
		return err
	}
	return c.wait(t.logEnd)
}

// persistSoonLocked writes t's state without waiting for it to be durable
// (t.logEnd is the offset to wait for): the records whose loss a crash
// cannot turn into a wrong outcome. An add (AddPartitions, AddOffsets):
// the transaction's batches are acknowledged only once the log is durable
// past it (Produce's wait offset), and a partition's open transaction no
// durable record holds is aborted at start (the broker's sweep). A Prepare:
// the end waits for it together with its markers, and a marker found after
// a crash decides a transaction whose Prepare was lost (Recover). A
// Complete: Prepare and markers are durable before it, and a lost one is
// finished again from Prepare (markers written only where none is since
// the add, offsets guarded by time). t.mu held.
func (c *Coordinator) persistSoonLocked(t *txn) error {
	t.updateMs = c.cfg.Now().UnixMilli()
	b := recordlog.Encode([]recordlog.Record{encodeRecord(t.id, t.toValue())}, c.cfg.Now())
	next, err := c.appendBatch(b)
	if err != nil {
		return err
	}
	t.logEnd = next
	c.sinceCompact.Add(int64(len(b)))
	c.changes.Add(1)
	return nil
}

// persistAddLocked writes an add (AddPartitions, AddOffsets): waited for
// with WaitAdds only. t.mu held.
func (c *Coordinator) persistAddLocked(t *txn) error {
	if c.cfg.WaitAdds {
		return c.persistLocked(t)
	}
	return c.persistSoonLocked(t)
}

// lock returns id's state locked, creating it if create; nil if it does
// not exist (and create is not set) or the coordinator is closed.
func (c *Coordinator) lock(id string, create bool) *txn {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil
		}
		t := c.txns[id]
		if t == nil {
			if !create {
				c.mu.Unlock()
				return nil
			}
			t = &txn{id: id, meta: meta{producerID: -1, epoch: -1, lastProducerID: -1, lastEpoch: -1, state: Dead}}
			c.txns[id] = t
		}
		c.mu.Unlock()
		t.mu.Lock()
		c.mu.Lock()
		current := c.txns[id] == t
		c.mu.Unlock()
		if current || t.state != Dead {
			return t
		}
		t.mu.Unlock() // expired meanwhile: look again
	}
}

// setPIDLocked moves t to producer id pid in the id index. t.mu held.
func (c *Coordinator) setPIDLocked(t *txn, pid int64) {
	c.mu.Lock()
	if c.byPID[t.producerID] == t {
		delete(c.byPID, t.producerID)
	}
	t.producerID = pid
	c.byPID[pid] = t
	c.mu.Unlock()
}

func (c *Coordinator) all() []*txn {
	c.mu.Lock()
	l := make([]*txn, 0, len(c.txns))
	for _, t := range c.txns {
		l = append(l, t)
	}
	c.mu.Unlock()
	sort.Slice(l, func(i, j int) bool { return l[i].id < l[j].id })
	return l
}

// Close stops the coordinator; requests after it get NOT_COORDINATOR. The
// log is the caller's to close.
func (c *Coordinator) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// Changes counts durable changes (a mirror taken at a lower count is
// stale).
func (c *Coordinator) Changes() uint64 { return c.changes.Load() }

// InitProducerID: a producer with transactional id id starts (or starts
// again). It gets the id's producer id with the epoch bumped, which fences
// any older producer of the same id; an open transaction of the older one
// is aborted first. reqPID/reqEpoch (v3+, KIP-360) are the caller's current
// ones, or -1.
func (c *Coordinator) InitProducerID(id string, timeoutMs int32, reqPID int64, reqEpoch int16) (int64, int16, *kerr.Error) {
	if timeoutMs <= 0 || time.Duration(timeoutMs)*time.Millisecond > c.cfg.MaxTimeout {
		return -1, -1, kerr.InvalidTransactionTimeout
	}
	t := c.lock(id, true)
	if t == nil {
		return -1, -1, kerr.NotCoordinator
	}
	defer t.mu.Unlock()
	if t.state == Dead {
		// A new transactional id.
		pid, err := c.cfg.NextProducerID()
		if err != nil {
			c.forgetLocked(t)
			return -1, -1, kerr.CoordinatorNotAvailable
		}
		t.epoch, t.timeoutMs, t.state, t.partitions = 0, timeoutMs, Empty, map[TP]int64{}
		c.setPIDLocked(t, pid)
		if err := c.persistLocked(t); err != nil {
			c.forgetLocked(t)
			return -1, -1, kerr.CoordinatorNotAvailable
		}
		return t.producerID, t.epoch, nil
	}
	if t.state == PrepareCommit || t.state == PrepareAbort {
		if err := c.completeLocked(t, true); err != nil {
			return -1, -1, kerr.ConcurrentTransactions
		}
	}
	if reqPID >= 0 {
		switch {
		case reqPID == t.producerID && reqEpoch == t.epoch:
		case reqPID == t.lastProducerID && reqEpoch == t.lastEpoch && t.state == Empty:
			// A retry of the init that bumped (its answer was lost).
			return t.producerID, t.epoch, nil
		default:
			return -1, -1, kerr.ProducerFenced
		}
	}
	prev := t.meta
	prevParts, prevGroups := t.partitions, t.groups
	if t.state == Ongoing {
		// The older producer's transaction is aborted with the epoch
		// bumped: its markers fence it, and the new producer starts at
		// the bumped epoch.
		if err := c.endLocked(t, false, true, true); err != nil {
			return -1, -1, kerr.ConcurrentTransactions
		}
		// Gone back to if the next record cannot be written: the state
		// after the abort (durable), not before it.
		prev, prevParts, prevGroups = t.meta, t.partitions, t.groups
	} else {
		// The epoch bumped from is remembered only for a caller that
		// named it (KIP-360: its retry must not bump again); a new
		// producer's init leaves none, so a fenced producer's later
		// KIP-360 init is never taken for a retry (Kafka's
		// prepareIncrementProducerEpoch).
		t.lastProducerID, t.lastEpoch = t.producerID, -1
		if reqPID >= 0 {
			t.lastEpoch = t.epoch
		}
		if err := c.bumpLocked(t); err != nil {
			return -1, -1, kerr.CoordinatorNotAvailable
		}
	}
	t.state, t.timeoutMs, t.partitions, t.groups, t.startMs = Empty, timeoutMs, map[TP]int64{}, nil, 0
	if err := c.persistLocked(t); err != nil {
		c.restoreLocked(t, prev, prevParts, prevGroups)
		return -1, -1, kerr.CoordinatorNotAvailable
	}
	return t.producerID, t.epoch, nil
}

// restoreLocked puts t back as it was before a change that could not be
// made durable.
func (c *Coordinator) restoreLocked(t *txn, prev meta, parts map[TP]int64, groups map[string]map[TP]Offset) {
	pid := prev.producerID
	t.epoch, t.lastProducerID, t.lastEpoch = prev.epoch, prev.lastProducerID, prev.lastEpoch
	t.timeoutMs, t.state, t.startMs, t.updateMs = prev.timeoutMs, prev.state, prev.startMs, prev.updateMs
	t.partitions, t.groups = parts, groups
	if t.producerID != pid {
		c.setPIDLocked(t, pid)
	}
}

// bumpLocked moves t to its next epoch; at the last epoch, to a new
// producer id at epoch 0 (as Kafka does). t.mu held.
func (c *Coordinator) bumpLocked(t *txn) error {
	if t.epoch < math.MaxInt16-1 {
		t.epoch++
		return nil
	}
	pid, err := c.cfg.NextProducerID()
	if err != nil {
		return err
	}
	c.setPIDLocked(t, pid)
	t.epoch = 0
	return nil
}

// forgetLocked drops t (never made durable, or expired). t.mu held.
func (c *Coordinator) forgetLocked(t *txn) {
	c.mu.Lock()
	if c.txns[t.id] == t {
		delete(c.txns, t.id)
	}
	if c.byPID[t.producerID] == t {
		delete(c.byPID, t.producerID)
	}
	c.mu.Unlock()
	t.state = Dead
}

// check is the common check of a request naming a transactional id with
// its producer id and epoch. It returns t locked (nil with the error).
func (c *Coordinator) check(id string, pid int64, epoch int16) (*txn, *kerr.Error) {
	t := c.lock(id, false)
	if t == nil {
		if c.isClosed() {
			return nil, kerr.NotCoordinator
		}
		return nil, kerr.InvalidProducerIDMapping
	}
	switch {
	case t.state == Dead || t.producerID != pid:
		t.mu.Unlock()
		return nil, kerr.InvalidProducerIDMapping
	case t.epoch != epoch:
		t.mu.Unlock()
		return nil, kerr.ProducerFenced
	}
	return t, nil
}

func (c *Coordinator) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// beginLocked makes t's transaction Ongoing if it is not yet (the first
// partition or group added). t.mu held; the caller persists.
func (c *Coordinator) beginLocked(t *txn) *kerr.Error {
	switch t.state {
	case Ongoing:
	case Empty, CompleteCommit, CompleteAbort:
		t.state, t.startMs = Ongoing, c.cfg.Now().UnixMilli()
		t.partitions, t.groups = map[TP]int64{}, nil
	case PrepareCommit, PrepareAbort:
		return kerr.ConcurrentTransactions
	default:
		return kerr.InvalidTxnState
	}
	return nil
}

// AddPartitions adds partitions to id's transaction (AddPartitionsToTxn).
// With verifyOnly (v4+ verify, KIP-890) nothing is added: each partition
// answers whether it is in the open transaction. The error is for the
// whole request; else codes holds one code per partition of parts.
func (c *Coordinator) AddPartitions(id string, pid int64, epoch int16, parts []TP, verifyOnly bool) ([]int16, *kerr.Error) {
	t, e := c.check(id, pid, epoch)
	if e != nil {
		return nil, e
	}
	defer t.mu.Unlock()
	codes := make([]int16, len(parts))
	if verifyOnly {
		for i, p := range parts {
			if _, ok := t.partitions[p]; !ok || t.state != Ongoing {
				codes[i] = kerr.InvalidTxnState.Code
			}
		}
		return codes, nil
	}
	missing := false
	for i, p := range parts {
		if !c.cfg.PartitionExists(p.Topic, p.Partition) {
			codes[i] = kerr.UnknownTopicOrPartition.Code
			missing = true
		}
	}
	if missing {
		// As Kafka: the whole request fails, the good partitions with
		// OPERATION_NOT_ATTEMPTED.
		for i := range codes {
			if codes[i] == 0 {
				codes[i] = kerr.OperationNotAttempted.Code
			}
		}
		return codes, nil
	}
	if len(t.partitions)+len(parts) > MaxPartitions {
		// Bounded: the whole state is one record of the transaction log.
		for i := range codes {
			codes[i] = kerr.InvalidRequest.Code
		}
		return codes, nil
	}
	if t.state == Ongoing {
		all := true
		for _, p := range parts {
			if _, ok := t.partitions[p]; !ok {
				all = false
				break
			}
		}
		if all {
			return codes, nil // nothing new: no write
		}
	}
	prev := t.meta
	prevParts := make(map[TP]int64, len(t.partitions))
	for p, at := range t.partitions {
		prevParts[p] = at
	}
	prevGroups := t.groups
	if e := c.beginLocked(t); e != nil {
		return nil, e
	}
	for _, p := range parts {
		if _, ok := t.partitions[p]; !ok {
			t.partitions[p] = c.cfg.LogEnd(p)
		}
	}
	// Not waited for on one broker: a batch of the transaction is
	// acknowledged only once the transaction log is durable up to here
	// (Produce's wait offset), and whatever a crash leaves on a partition
	// that no durable record added is aborted at the next start
	// (AbortUnheld). Waited for in a cluster (WaitAdds).
	if err := c.persistAddLocked(t); err != nil {
		c.restoreLocked(t, prev, prevParts, prevGroups)
		return nil, kerr.CoordinatorNotAvailable
	}
	return codes, nil
}

// AddOffsets adds a group to id's transaction (AddOffsetsToTxn): offsets
// the producer commits for it with TxnOffsetCommit are committed with the
// transaction.
func (c *Coordinator) AddOffsets(id string, pid int64, epoch int16, group string) *kerr.Error {
	t, e := c.check(id, pid, epoch)
	if e != nil {
		return e
	}
	defer t.mu.Unlock()
	if t.state == Ongoing && t.groups[group] != nil {
		return nil
	}
	if len(t.groups) >= MaxGroups {
		return kerr.InvalidRequest // bounded, as the partitions
	}
	prev := t.meta
	prevParts, prevGroups := t.partitions, t.groups
	if e := c.beginLocked(t); e != nil {
		return e
	}
	groups := make(map[string]map[TP]Offset, len(t.groups)+1)
	for g, o := range t.groups {
		groups[g] = o
	}
	groups[group] = map[TP]Offset{}
	t.groups = groups
	if err := c.persistAddLocked(t); err != nil { // the TxnOffsetCommit that follows waits
		c.restoreLocked(t, prev, prevParts, prevGroups)
		return kerr.CoordinatorNotAvailable
	}
	return nil
}

// TxnOffsetCommit stores offsets of group in id's transaction, durably;
// they are committed to the group when the transaction commits. codes has
// one code per offset (UNKNOWN_TOPIC_OR_PARTITION for a partition that
// does not exist).
func (c *Coordinator) TxnOffsetCommit(id string, pid int64, epoch int16, group string, offs []Offset) ([]int16, *kerr.Error) {
	t, e := c.check(id, pid, epoch)
	if e != nil {
		return nil, e
	}
	defer t.mu.Unlock()
	if t.state != Ongoing || t.groups[group] == nil {
		// AddOffsetsToTxn comes first (Kafka's clients always send it).
		return nil, kerr.InvalidTxnState
	}
	codes := make([]int16, len(offs))
	next := make(map[TP]Offset, len(t.groups[group])+len(offs))
	for k, o := range t.groups[group] {
		next[k] = o
	}
	var added []TP
	for i, o := range offs {
		if !c.cfg.PartitionExists(o.Topic, o.Partition) {
			codes[i] = kerr.UnknownTopicOrPartition.Code
			continue
		}
		k := TP{o.Topic, o.Partition}
		next[k] = o
		added = append(added, k)
	}
	if len(added) == 0 {
		return codes, nil
	}
	if len(next) > MaxPartitions {
		return nil, kerr.InvalidRequest
	}
	old := t.groups
	groups := make(map[string]map[TP]Offset, len(t.groups))
	for g, o := range t.groups {
		groups[g] = o
	}
	groups[group] = next
	t.groups = groups
	if err := c.persistLocked(t); err != nil {
		t.groups = old
		return nil, kerr.CoordinatorNotAvailable
	}
	c.cfg.Pending(group, t.producerID, added, true)
	return codes, nil
}

// EndTxn commits or aborts id's transaction and returns once its markers,
// offsets and state are durable. With bump (EndTxn v5+, KIP-890) the epoch
// is bumped by the end, and the new producer id and epoch are returned.
func (c *Coordinator) EndTxn(id string, pid int64, epoch int16, commit, bump bool) (int64, int16, *kerr.Error) {
	t := c.lock(id, false)
	if t == nil {
		if c.isClosed() {
			return -1, -1, kerr.NotCoordinator // moved: the client looks again
		}
		return -1, -1, kerr.InvalidProducerIDMapping
	}
	defer t.mu.Unlock()
	done := CompleteAbort
	if commit {
		done = CompleteCommit
	}
	// A retry of an end that bumped the epoch (its answer was lost, or
	// its markers failed part way): the same end, at the new epoch.
	if bump && t.lastEpoch >= 0 && pid == t.lastProducerID && epoch == t.lastEpoch {
		switch {
		case t.state == done:
			return t.producerID, t.epoch, nil
		case t.state == PrepareCommit && commit, t.state == PrepareAbort && !commit:
			if err := c.completeLocked(t, true); err != nil {
				return -1, -1, kerr.ConcurrentTransactions
			}
			return t.producerID, t.epoch, nil
		}
	}
	switch {
	case t.state == Dead || t.producerID != pid:
		return -1, -1, kerr.InvalidProducerIDMapping
	case t.epoch != epoch:
		return -1, -1, kerr.ProducerFenced
	}
	switch t.state {
	case Ongoing:
		if err := c.endLocked(t, commit, bump, false); err != nil {
			c.cfg.Logger.Warn("end transaction (the decision is durable; retried by maintenance)", zap.String("transactional_id", id), zap.Error(err))
			return -1, -1, kerr.CoordinatorNotAvailable
		}
	case PrepareCommit, PrepareAbort:
		if (t.state == PrepareCommit) != commit {
			return -1, -1, kerr.InvalidTxnState
		}
		if err := c.completeLocked(t, true); err != nil {
			return -1, -1, kerr.ConcurrentTransactions
		}
	case CompleteCommit, CompleteAbort:
		if t.state != done {
			return -1, -1, kerr.InvalidTxnState
		}
		// A retry of an end that already happened.
	case Empty:
		if commit {
			return -1, -1, kerr.InvalidTxnState
		}
		// An abort of an empty transaction: nothing to do (Kafka answers
		// so for clients that abort after a failed add).
	}
	return t.producerID, t.epoch, nil
}

// endLocked ends t's open transaction: the decision (Prepare) durable, then
// completeLocked. With bump the epoch is bumped with the decision, so the
// markers carry the new epoch and fence the old one. A fence (a timeout, or
// a new producer's InitProducerId) keeps no last epoch, as Kafka's
// prepareFenceProducerEpoch: the fenced producer's retries are never taken
// for the new one's. t.mu held.
func (c *Coordinator) endLocked(t *txn, commit, bump, fence bool) error {
	// Every add of the transaction is durable before its decision can be
	// (the decision is found through the partitions the log lists). With
	// acks=all batches this waited already: no fsync.
	if err := c.wait(t.logEnd); err != nil {
		return err
	}
	prev := t.meta
	prevParts, prevGroups := t.partitions, t.groups
	if bump {
		t.lastProducerID, t.lastEpoch = t.producerID, t.epoch
		if fence {
			t.lastEpoch = -1
		}
		if t.epoch < math.MaxInt16-1 {
			t.epoch++
		} else {
			// The last epoch: the markers go at the highest one, and
			// the producer id changes once the end is complete.
			t.epoch = math.MaxInt16
		}
	}
	t.state = PrepareAbort
	if commit {
		t.state = PrepareCommit
	}
	// The decision and the markers become durable together (one
	// group-commit round): completeLocked waits for both before anything
	// else. A crash in between leaves the Prepare record, or a marker, or
	// neither (then nothing is decided and the client, unanswered, retries).
	persist := c.persistSoonLocked
	if c.cfg.DecideFirst {
		persist = c.persistLocked
	}
	if err := persist(t); err != nil {
		c.restoreLocked(t, prev, prevParts, prevGroups)
		return err
	}
	return c.completeLocked(t, false)
}

// completeLocked writes the markers (and, for a commit, the offsets) of t's
// decided transaction and then its Complete record. On an error t stays
// in its Prepare state, to be finished later. t.mu held.
func (c *Coordinator) completeLocked(t *txn, resumed bool) error {
	commit := t.state == PrepareCommit
	since := int64(0)
	if resumed {
		since = t.updateMs // when the decision was made
	}
	parts := t.partitionList()
	if len(parts) > 0 {
		at := make([]int64, len(parts))
		for i, p := range parts {
			at[i] = t.partitions[p]
		}
		if err := c.cfg.WriteMarkers(t.producerID, t.epoch, commit, parts, at); err != nil {
			return fmt.Errorf("write markers: %w", err)
		}
	}
	// The decision is durable before any offset is committed or the end
	// answered (usually synced in the markers' round already).
	if err := c.wait(t.logEnd); err != nil {
		return fmt.Errorf("transaction log: %w", err)
	}
	groups := make([]string, 0, len(t.groups))
	for g := range t.groups {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	if commit {
		for _, g := range groups {
			offs := t.groups[g]
			if len(offs) == 0 {
				continue
			}
			if err := c.cfg.CommitOffsets(g, offsetList(offs), since); err != nil {
				return fmt.Errorf("commit offsets of group %q: %w", g, err)
			}
		}
	}
	for _, g := range groups {
		if offs := t.groups[g]; len(offs) > 0 {
			c.cfg.Pending(g, t.producerID, offsetTPs(offs), false)
		}
	}
	state := CompleteAbort
	if commit {
		state = CompleteCommit
	}
	if t.epoch == math.MaxInt16 {
		pid, err := c.cfg.NextProducerID()
		if err != nil {
			return err
		}
		c.setPIDLocked(t, pid)
		t.epoch = 0
	}
	t.state, t.partitions, t.groups = state, map[TP]int64{}, nil
	return c.persistSoonLocked(t)
}

// Produce runs appendFn (the append of a transactional batch of producer
// pid at epoch to partition p, in a request naming transactional id id) if
// p is in pid's open transaction of that id, and returns the transaction
// log offset the batch's acknowledgement waits for (WaitDurable); else it
// returns ErrFenced or ErrInvalidTxnState. appendFn runs under the
// transaction's lock, so the transaction cannot end between the check and
// the append.
func (c *Coordinator) Produce(id string, pid int64, epoch int16, p TP, appendFn func() error) (logEnd int64, err error) {
	c.mu.Lock()
	t := c.byPID[pid]
	c.mu.Unlock()
	if t == nil {
		return 0, ErrInvalidTxnState
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.producerID != pid || t.state == Dead || t.id != id:
		// (A batch of another transactional id's producer: the request's
		// id is the one its ACLs were checked against.)
		return 0, ErrInvalidTxnState
	case epoch != t.epoch:
		return 0, ErrFenced
	case t.state != Ongoing:
		return 0, ErrInvalidTxnState
	}
	if _, ok := t.partitions[p]; !ok {
		return 0, ErrInvalidTxnState
	}
	return t.logEnd, appendFn()
}

// WaitDurable waits until the transaction log is durable up to logEnd (a
// transactional batch's acknowledgement waits for the record that added
// its partition).
func (c *Coordinator) WaitDurable(logEnd int64) error { return c.wait(logEnd) }

// Maintain aborts transactions open past their timeout (the producer is
// fenced: the abort bumps the epoch), finishes ends that failed part way,
// forgets ids idle past the expiration, and compacts the log.
func (c *Coordinator) Maintain(now time.Time) {
	nowMs := now.UnixMilli()
	for _, t := range c.all() {
		t.mu.Lock()
		switch t.state {
		case Ongoing:
			if nowMs-t.startMs > int64(t.timeoutMs) {
				c.cfg.Logger.Info("abort a transaction open past its timeout", zap.String("transactional_id", t.id), zap.Int32("timeout_ms", t.timeoutMs))
				if err := c.endLocked(t, false, true, true); err != nil {
					c.cfg.Logger.Warn("abort a timed-out transaction", zap.String("transactional_id", t.id), zap.Error(err))
				}
			}
		case PrepareCommit, PrepareAbort:
			if err := c.completeLocked(t, true); err != nil {
				c.cfg.Logger.Warn("finish a transaction", zap.String("transactional_id", t.id), zap.Error(err))
			}
		case Empty, CompleteCommit, CompleteAbort:
			if nowMs-t.updateMs > c.cfg.IDExpiration.Milliseconds() {
				if err := c.append([]recordlog.Record{encodeRecord(t.id, nil)}); err == nil {
					c.forgetLocked(t)
				}
			}
		}
		t.mu.Unlock()
	}
	if _, err := c.log.Maintain(now); err != nil {
		c.cfg.Logger.Warn("transaction log maintenance", zap.Error(err))
	}
	if grown := c.sinceCompact.Load(); grown > 8<<20 && grown > 2*c.liveBytes.Load() {
		if err := c.compact(); err != nil {
			c.cfg.Logger.Warn("compact the transaction log", zap.Error(err))
		}
	}
}

// compact rewrites the live state at the log's tail and moves the log
// start past what came before (as the group log does): each id's record is
// appended under its lock after the cut, so everything below the cut is
// superseded.
func (c *Coordinator) compact() error {
	c.compactMu.Lock()
	defer c.compactMu.Unlock()
	if err := c.log.Roll(); err != nil {
		return err
	}
	cut := c.log.LogEndOffset()
	start := c.sinceCompact.Load()
	var live int64
	for _, t := range c.all() {
		t.mu.Lock()
		var err error
		if t.state != Dead {
			r := encodeRecord(t.id, t.toValue())
			live += int64(len(r.Value)) + 64
			err = c.append([]recordlog.Record{r})
		}
		t.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if _, err := c.log.DeleteRecordsBefore(cut); err != nil {
		return err
	}
	c.liveBytes.Store(live)
	c.sinceCompact.Add(-start)
	return nil
}

// Info describes one transactional id (DescribeTransactions,
// ListTransactions).
type Info struct {
	ID         string
	ProducerID int64
	Epoch      int16
	State      State
	TimeoutMs  int32
	StartMs    int64 // -1 if no transaction is open
	Partitions []TP
}

// Describe returns id's state; ok is false for an unknown id.
func (c *Coordinator) Describe(id string) (Info, bool) {
	c.mu.Lock()
	t := c.txns[id]
	c.mu.Unlock()
	if t == nil {
		return Info{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state == Dead {
		return Info{}, false
	}
	return t.infoLocked(), true
}

func (t *txn) infoLocked() Info {
	in := Info{ID: t.id, ProducerID: t.producerID, Epoch: t.epoch, State: t.state, TimeoutMs: t.timeoutMs, StartMs: -1, Partitions: t.partitionList()}
	if t.state == Ongoing || t.state == PrepareCommit || t.state == PrepareAbort {
		in.StartMs = t.startMs
	}
	return in
}

// List returns every live transactional id's state, sorted by id.
func (c *Coordinator) List() []Info {
	var l []Info
	for _, t := range c.all() {
		t.mu.Lock()
		if t.state != Dead {
			l = append(l, t.infoLocked())
		}
		t.mu.Unlock()
	}
	return l
}

// ProducerTxn returns the transactional id of producer pid, for
// DescribeProducers; ok is false if pid is not a transactional producer of
// this coordinator.
func (c *Coordinator) ProducerTxn(pid int64) (id string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.byPID[pid]; t != nil {
		return t.id, true
	}
	return "", false
}

// snapshotFile is the mirror format: every live id's record.
type snapshotFile struct {
	Version int               `json:"version"`
	Txns    map[string]*value `json:"transactions"`
}

// Snapshot returns the live state as a document Open accepts as a seed,
// and the change count it reflects.
func (c *Coordinator) Snapshot() ([]byte, uint64) {
	n := c.changes.Load()
	f := snapshotFile{Version: 1, Txns: map[string]*value{}}
	for _, t := range c.all() {
		t.mu.Lock()
		if t.state != Dead {
			f.Txns[t.id] = t.toValue()
		}
		t.mu.Unlock()
	}
	b, _ := json.Marshal(f)
	return b, n
}

func parseSnapshot(b []byte) ([]recordlog.Record, error) {
	var f snapshotFile
	if err := json.Unmarshal(b, &f); err != nil || f.Version != 1 {
		return nil, fmt.Errorf("txn: unreadable transaction snapshot: %v", err)
	}
	ids := make([]string, 0, len(f.Txns))
	for id, v := range f.Txns {
		if v == nil || v.ProducerID < 0 || v.Epoch < 0 || v.State < Empty || v.State >= Dead {
			return nil, fmt.Errorf("txn: transaction snapshot: bad state of %q", id)
		}
		ids = append(ids, id)
	}
	sort.Strings(ids)
	recs := make([]recordlog.Record, 0, len(ids))
	for _, id := range ids {
		recs = append(recs, encodeRecord(id, f.Txns[id]))
	}
	return recs, nil
}

// Holds reports whether partition p is in an open (or ending) transaction
// of producer pid. The broker uses it to find transactions a partition
// holds open that no coordinator state explains any more (a restore from
// older copies in the bucket), which would hold its LSO for ever.
func (c *Coordinator) Holds(pid int64, p TP) bool {
	c.mu.Lock()
	t := c.byPID[pid]
	c.mu.Unlock()
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.producerID != pid || (t.state != Ongoing && t.state != PrepareCommit && t.state != PrepareAbort) {
		return false
	}
	_, ok := t.partitions[p]
	return ok
}

// Stats counts transactional ids by state (metrics).
func (c *Coordinator) Stats() map[State]int {
	out := map[State]int{}
	for _, t := range c.all() {
		t.mu.Lock()
		out[t.state]++
		t.mu.Unlock()
	}
	return out
}

// ProducerIDFloor is one more than the largest producer id any
// transactional id holds (0 if none): after a restore from the bucket the
// broker hands out ids from at least there, never one a restored id owns.
func (c *Coordinator) ProducerIDFloor() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	floor := int64(0)
	for pid := range c.byPID {
		floor = max(floor, pid+1)
	}
	return floor
}

// IfUnheld runs abortFn (the abort of producer pid's open transaction on
// partition p) only if no transaction of this coordinator holds p for pid,
// under that transactional id's lock if pid has one: the id cannot add p
// and append to it between the check and the abort. It reports whether
// abortFn ran.
func (c *Coordinator) IfUnheld(pid int64, p TP, abortFn func() error) (bool, error) {
	c.mu.Lock()
	t := c.byPID[pid]
	c.mu.Unlock()
	if t != nil {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.producerID == pid && (t.state == Ongoing || t.state == PrepareCommit || t.state == PrepareAbort) {
			if _, ok := t.partitions[p]; ok {
				return false, nil
			}
		}
	}
	return true, abortFn()
}
