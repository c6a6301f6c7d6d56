package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/group"
	"github.com/synapsebroker/synapse/internal/parallel"
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/txn"
)

// The transaction coordinator (package txn) and what it asks of the
// broker: markers written to partitions, offsets committed to the group
// log, producer ids. This file opens the transaction log, mirrors it to the
// bucket and restores it from there, as groups.go does for the group log.

// txnDir is the transaction log's directory under the data directory (no
// "-N" suffix: never taken for a topic partition).
const txnDir = "__transactions"

// txnKey is where the transaction state is mirrored in the bucket.
const txnKey = "_synapse/transactions.json"

func (s *Server) openTxns(ctx context.Context) error {
	dir := filepath.Join(s.cfg.DataDir, txnDir)
	if s.cfg.Tier != nil && s.cfg.Cluster == nil { // (a cluster seeds it at its leader: stateSeed)
		if err := s.restoreTxns(ctx, dir); err != nil {
			return err
		}
	}
	lp, err := s.store.OpenPartition(dir, txn.LogConfig())
	if err != nil {
		return fmt.Errorf("broker: open the transaction log: %w", err)
	}
	s.txnLog = lp
	cfg := s.txnConfig()
	if s.cfg.Cluster != nil {
		cfg = txnOpenConfig(cfg)
	}
	c, err := txn.Open(cfg, lp, nil)
	if err != nil {
		return fmt.Errorf("broker: load transactions: %w", err)
	}
	s.txnsPtr.Store(c)
	if s.cfg.Cluster != nil {
		// Opened again by the coordinator of transactions (cluster_txn.go).
		c.Close()
		return nil
	}
	s.txnsMirrored.Store(math.MaxUint64)
	if err := s.meta.reserveProducerIDsBelow(c.ProducerIDFloor()); err != nil {
		return err
	}
	c.Recover()
	s.abortUnheld()
	return nil
}

// abortUnheld aborts, at start, every transaction open on a partition that
// no coordinator state holds: batches of a transaction whose add to the
// partition never became durable (none of them was acknowledged: an
// acknowledgement waits for the add), or state restored from copies of
// different ages. Nothing else would ever end them.
func (s *Server) abortUnheld() {
	now := s.cfg.Now()
	for _, t := range s.reg.all() {
		for _, p := range s.reg.partitionsOf(t) {
			if p.firstOpen.Load() != 0 {
				s.abortOrphans(p, now, 0)
			}
		}
	}
}

// restoreTxns fills a missing transaction log from the bucket's mirror.
func (s *Server) restoreTxns(ctx context.Context, dir string) error {
	return s.restoreStateLog(ctx, dir, txnKey, "transactions", txn.LogConfig(), func(lp *log.Partition, seed []byte) error {
		c, err := txn.Open(txn.Config{Logger: s.logger.Named("txn")}, lp, seed)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func (s *Server) txnConfig() txn.Config {
	cfg := txnHooks(s.txnPartition, s.grp(), func() int64 { return s.cfg.Now().UnixMilli() }, s.meta.m.LeaderEpoch)
	cfg.Logger = s.logger.Named("txn")
	cfg.Now = s.cfg.Now
	cfg.MaxTimeout = s.cfg.TransactionMaxTimeout
	cfg.IDExpiration = s.cfg.TransactionalIDExpiration
	cfg.NextProducerID = s.meta.nextProducerID
	return cfg
}

// txnHooks is the part of the coordinator's configuration that reaches
// into partitions (markers, their evidence, log ends) and the group
// coordinator (offsets), on a partition lookup: the broker's, or a test's.
func txnHooks(lookup func(txn.TP) *partition, groups *group.Coordinator, nowMs func() int64, leaderEpoch int32) txn.Config {
	return txn.Config{
		WriteMarkers: func(pid int64, epoch int16, commit bool, parts []txn.TP, addedAt []int64) error {
			return writeMarkers(lookup, nowMs(), leaderEpoch, pid, epoch, commit, parts, addedAt)
		},
		MarkerSince: func(pid int64, tp txn.TP, at int64) (bool, bool) {
			p := lookup(tp)
			if p == nil {
				return false, false
			}
			return p.markerSince(pid, at)
		},
		LogEnd: func(tp txn.TP) int64 {
			// The durable end, not the log end: what a power loss may
			// take back (other producers' unsynced batches) must not
			// raise the bound a marker of this transaction is looked for
			// above. The last transaction's markers are below it (durable
			// before its end was answered), this one's batches above.
			if p := lookup(tp); p != nil {
				return p.log.HighWatermark()
			}
			return 0
		},
		CommitOffsets: func(g string, offs []txn.Offset, since int64) error {
			return commitTxnOffsets(groups, g, offs, since)
		},
		Pending: func(g string, pid int64, parts []txn.TP, pending bool) {
			setTxnPending(groups, g, pid, parts, pending)
		},
		PartitionExists: func(topic string, p int32) bool {
			return lookup(txn.TP{Topic: topic, Partition: p}) != nil
		},
	}
}

// commitTxnOffsets is Config.CommitOffsets: a committed transaction's
// offsets into the group log.
func commitTxnOffsets(groups *group.Coordinator, g string, offs []txn.Offset, since int64) error {
	l := make([]group.TxnOffset, len(offs))
	for i, o := range offs {
		l[i] = group.TxnOffset{Topic: o.Topic, Partition: o.Partition, Offset: o.Offset, LeaderEpoch: o.LeaderEpoch, Metadata: o.Metadata}
	}
	return groups.CommitTxnOffsets(g, l, since)
}

// setTxnPending is Config.Pending: the group coordinator told about
// offsets waiting for a transaction's end.
func setTxnPending(groups *group.Coordinator, g string, pid int64, parts []txn.TP, pending bool) {
	l := make([]group.TxnPartition, len(parts))
	for i, p := range parts {
		l[i] = group.TxnPartition{Topic: p.Topic, Partition: p.Partition}
	}
	groups.SetPending(g, pid, l, pending)
}

// txnPartition returns the partition tp names; nil if it does not exist.
func (s *Server) txnPartition(tp txn.TP) *partition {
	t := s.reg.get(tp.Topic)
	if t == nil {
		return nil
	}
	return s.reg.partition(t, tp.Partition)
}

// writeMarkers appends producer pid's markers to parts (those lookup
// finds, where pid has a transaction open) and waits until they are
// durable: every partition's marker is appended first, so they share
// group-commit rounds.
func writeMarkers(lookup func(txn.TP) *partition, nowMs int64, leaderEpoch int32, pid int64, epoch int16, commit bool, parts []txn.TP, addedAt []int64) error {
	type wait struct {
		p    *partition
		next int64
	}
	waits := make([]wait, len(parts))
	errs := make([]error, len(parts))
	parallel.Each(min(len(parts), 8), len(parts), func(i int) {
		p := lookup(parts[i])
		if p == nil {
			return // deleted: nothing of it is read any more
		}
		next, err := p.writeMarker(pid, epoch, commit, nowMs, leaderEpoch, addedAt[i])
		waits[i], errs[i] = wait{p, next}, err
	})
	for i, w := range waits {
		if errs[i] != nil {
			return fmt.Errorf("%s-%d: %w", parts[i].Topic, parts[i].Partition, errs[i])
		}
		if w.next > 0 {
			if err := w.p.log.WaitDurable(w.next); err != nil {
				return fmt.Errorf("%s-%d: %w", parts[i].Topic, parts[i].Partition, err)
			}
		}
	}
	return nil
}

// maintainTxns aborts timed-out transactions, finishes ends that failed,
// compacts the transaction log and mirrors it when it changed.
func (s *Server) maintainTxns(now time.Time) {
	c := s.txnCoord()
	if c == nil || s.txnElsewhere() {
		return // a closed coordinator maintains (and writes) nothing
	}
	if cl := s.cl; cl != nil {
		// Markers go to other brokers and may wait for a slow one
		// (sendMarkers): off the maintenance loop, one pass at a time.
		if !cl.txnMaintaining.CompareAndSwap(false, true) {
			return
		}
		cl.wg.Add(1)
		go func() {
			defer cl.wg.Done()
			defer cl.txnMaintaining.Store(false)
			c.Maintain(now)
			if s.cfg.Tier != nil && s.cl.activeTxns() {
				s.mirrorTxns(s.ctx)
			}
		}()
		return
	}
	c.Maintain(now)
	if s.cfg.Tier != nil {
		s.mirrorTxns(s.ctx)
	}
}

// mirrorTxns copies the transaction state to the bucket if it changed:
// what a single broker restores at start, and a cluster's first
// transaction coordinator after a disaster (stateSeed).
func (s *Server) mirrorTxns(ctx context.Context) {
	if s.txnCoord() != nil && (s.cl == nil || s.cl.activeTxns()) {
		s.mirrorStateLog(ctx, txnKey, "transactions", s.txnCoord().Changes(), s.txnCoord().Snapshot, &s.txnsMirrored)
	}
}

func (s *Server) closeTxns() {
	if s.txnCoord() != nil {
		s.txnCoord().Close()
	}
	if s.txnLog != nil {
		if err := s.txnLog.Close(); err != nil && !errors.Is(err, log.ErrClosed) {
			s.logger.Warn("close the transaction log", zap.Error(err))
		}
	}
}
