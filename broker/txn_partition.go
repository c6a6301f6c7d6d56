package broker

import (
	"encoding/binary"
	"hash/crc32"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/txn"
)

// Transactions on a partition: which producers have a transaction open
// here (from the first offset of its first batch), the last stable offset
// (LSO) that follows from them, and the COMMIT/ABORT markers that close
// them. An ABORT marker also records the aborted range in the log's
// aborted-transaction index (log.AddAborted, Kafka's .txnindex), which
// read_committed fetches return as AbortedTransactions.
//
// Invariants:
//   - A producer's open transaction on a partition begins at the base
//     offset of its first transactional batch after its last marker there,
//     and ends at its next marker. LSO = min(first offsets of open
//     transactions, high watermark).
//   - The open set survives restarts: the producer snapshot (producers.json)
//     carries it, and open replays the batches after the snapshot
//     (ScanBatches: transactional batches open, markers close, ABORT
//     markers rebuild the aborted index above the snapshot point).
//   - A marker is written only where the producer has a transaction open,
//     so the coordinator finishing an end twice (after a crash) writes it
//     once.

// controlBatch builds a control batch (one record) ending producer pid's
// transaction at epoch: Kafka's EndTxnMarker (key: version 0, type; value:
// version 0, coordinator epoch).
func controlBatch(pid int64, epoch int16, commit bool, nowMs int64, leaderEpoch int32) []byte {
	typ := log.ControlAbort
	if commit {
		typ = log.ControlCommit
	}
	key := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, 0), uint16(typ))
	val := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint16(nil, 0), 0)
	rec := kmsg.Record{Key: key, Value: val}
	enc := rec.AppendTo(nil)
	body := binary.AppendVarint(nil, int64(len(enc)-1))
	body = append(body, enc[1:]...)
	b := kmsg.RecordBatch{
		PartitionLeaderEpoch: leaderEpoch,
		Magic:                2,
		Attributes:           0x30, // transactional | control
		FirstTimestamp:       nowMs,
		MaxTimestamp:         nowMs,
		ProducerID:           pid,
		ProducerEpoch:        epoch,
		FirstSequence:        -1,
		NumRecords:           1,
		Records:              body,
	}
	out := b.AppendTo(nil)
	binary.BigEndian.PutUint32(out[8:], uint32(len(out)-12))
	binary.BigEndian.PutUint32(out[17:], crc32.Checksum(out[21:], crc32.MakeTable(crc32.Castagnoli)))
	return out
}

// lastStable returns the partition's LSO given its high watermark; never
// below the log start (retention or DeleteRecords may pass an open
// transaction's first offset), as Kafka clamps it.
func (p *partition) lastStable(hw int64) int64 {
	if f := p.firstOpen.Load(); f > 0 && f-1 < hw {
		return max(f-1, min(p.log.LogStartOffset(), hw))
	}
	return hw
}

// openTxnLocked notes a transactional batch of pid at base. p.mu held.
func (p *partition) openTxnLocked(pid, base int64) {
	if _, ok := p.txnOpen[pid]; ok {
		return
	}
	if p.txnOpen == nil {
		p.txnOpen = map[int64]int64{}
	}
	p.txnSeen.Store(true)
	p.txnOpen[pid] = base
	p.setFirstOpenLocked()
}

// setFirstOpenLocked recomputes the first offset of the oldest open
// transaction. p.mu held.
func (p *partition) setFirstOpenLocked() {
	first := int64(math.MaxInt64)
	for _, f := range p.txnOpen {
		first = min(first, f)
	}
	if first == math.MaxInt64 {
		p.firstOpen.Store(0)
		return
	}
	p.firstOpen.Store(first + 1)
}

// abortedEntryLocked is the aborted index entry of pid's transaction from
// first, ended by its ABORT marker at markerOffset. Its LSO is Kafka's
// lastStableOffset of a completed transaction: the first offset of the
// oldest other open transaction, else the offset after the marker. p.mu
// held.
func (p *partition) abortedEntryLocked(pid, first, markerOffset int64) log.AbortedTxn {
	lso := markerOffset + 1
	for id, f := range p.txnOpen {
		if id != pid {
			lso = min(lso, f)
		}
	}
	return log.AbortedTxn{ProducerID: pid, FirstOffset: first, LastOffset: markerOffset, LastStableOffset: lso}
}

// closeTxnLocked ends pid's transaction with the marker batch at offset
// (control: log.ControlCommit or log.ControlAbort) and returns the aborted
// index entry to record for an abort (ok false otherwise). p.mu held.
func (p *partition) closeTxnLocked(pid int64, epoch int16, offset int64, control int16, nowMs int64) (log.AbortedTxn, bool) {
	st := p.producers[pid]
	if st == nil || epoch > st.Epoch {
		// A marker at a bumped epoch (a fence, or KIP-890's end): the
		// producer's next batch starts its sequence over.
		st = &producerState{Epoch: epoch, LastMs: nowMs}
		p.producers[pid] = st
	} else {
		st.LastMs = nowMs
	}
	st.Marker = &lastMarker{Offset: offset, Commit: control == log.ControlCommit}
	first, ok := p.txnOpen[pid]
	if !ok {
		return log.AbortedTxn{}, false
	}
	a := p.abortedEntryLocked(pid, first, offset)
	delete(p.txnOpen, pid)
	p.setFirstOpenLocked()
	return a, control == log.ControlAbort
}

// writeMarker appends the marker ending pid's transaction here, if it has
// one open and no marker of pid is at or after since (the offset where the
// transaction was added here), and returns the offset to wait on for
// durability (0: nothing written).
func (p *partition) writeMarker(pid int64, epoch int16, commit bool, nowMs int64, leaderEpoch int32, since int64) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.writeMarkerLocked(pid, epoch, commit, nowMs, leaderEpoch, since)
}

// writeMarkerLocked is writeMarker with p.mu held (a cluster's leader
// checks its leadership under the same lock).
func (p *partition) writeMarkerLocked(pid int64, epoch int16, commit bool, nowMs int64, leaderEpoch int32, since int64) (int64, error) {
	if st := p.producers[pid]; since >= 0 && st != nil && st.Marker != nil && st.Marker.Offset >= since {
		// This transaction's marker is here already (written before a
		// crash): what is open now is a later transaction's.
		return 0, nil
	}
	if _, ok := p.txnOpen[pid]; !ok {
		// Nothing open (the marker was written before a crash, or the
		// producer never wrote here): only the epoch moves.
		if st := p.producers[pid]; st != nil && epoch > st.Epoch {
			p.producers[pid] = &producerState{Epoch: epoch, LastMs: nowMs, Marker: st.Marker}
		}
		return 0, nil
	}
	res, err := p.log.Append(controlBatch(pid, epoch, commit, nowMs, leaderEpoch))
	if err != nil {
		return 0, err
	}
	control := log.ControlAbort
	if commit {
		control = log.ControlCommit
	} else {
		// The index entry goes in before the transaction stops holding
		// the LSO back: a read_committed fetch that sees the LSO move
		// past the aborted records always finds them in the index. If
		// the entry cannot be written the transaction stays open
		// (nothing of it becomes visible), and the coordinator's retry
		// writes another marker and entry.
		a := p.abortedEntryLocked(pid, p.txnOpen[pid], res.BaseOffset)
		if err := p.log.AddAborted(a); err != nil {
			return 0, err
		}
	}
	p.closeTxnLocked(pid, epoch, res.BaseOffset, control, nowMs)
	return res.LastOffset + 1, nil
}

// replayTxns is loadProducers' pass over the batches after the snapshot:
// sequences, open transactions, and the aborted index above from rebuilt.
//
// The scan covers the local segments only: in a tiered log, from (the log
// start, without a snapshot) may lie below the first local segment. An
// ABORT marker there whose transaction began in a released segment closes
// nothing in the replay, and the scan cannot recompute its entry; the
// index's own entry for that marker (written by writeMarker before the
// segment could be released) is kept, else read_committed would show that
// transaction's records.
func (p *partition) replayTxns(from int64) error {
	had, err := p.log.AbortedTxns(nil, from, math.MaxInt64)
	if err != nil {
		return err
	}
	var aborted []log.AbortedTxn
	err = p.log.ScanBatches(from, func(h *log.BatchHeader, control int16) bool {
		if h.BaseOffset < from || h.ProducerID < 0 {
			return true
		}
		if h.Control() {
			if control != log.ControlAbort && control != log.ControlCommit {
				return true // another control type: not a transaction's end
			}
			_, open := p.txnOpen[h.ProducerID]
			var known *log.AbortedTxn // the index's entry for this marker, if any
			for i := range had {
				if had[i].LastOffset == h.BaseOffset && had[i].ProducerID == h.ProducerID {
					known = &had[i]
					break
				}
			}
			if a, abort := p.closeTxnLocked(h.ProducerID, h.ProducerEpoch, h.BaseOffset, control, 0); abort {
				if known != nil && known.FirstOffset < a.FirstOffset {
					// The transaction began in a segment no longer local
					// (released to the bucket): the replay saw only its
					// later batches, the index knows where it began.
					a = *known
				}
				aborted = append(aborted, a)
			} else if !open && control == log.ControlAbort && known != nil {
				// Its batches are all in released segments: keep the
				// entry the index has.
				aborted = append(aborted, *known)
			}
			return true
		}
		p.recordSequence(h, 0) // appended when: unknown
		if h.Transactional() {
			p.openTxnLocked(h.ProducerID, h.BaseOffset)
		}
		return true
	})
	if err != nil {
		return err
	}
	return p.log.RebuildAborted(from, aborted)
}

// abortedIn returns the aborted transactions overlapping [from, upper) as
// a fetch answers them, from the local log's index.
func (p *partition) abortedIn(from, upper int64) ([]kmsg.FetchResponseTopicPartitionAbortedTransaction, error) {
	l, err := p.log.AbortedTxns(nil, from, upper)
	if err != nil || len(l) == 0 {
		return nil, err
	}
	return abortedList(nil, l), nil
}

// abortedList appends entries to dst as a fetch answers them, without
// repeats (an entry may come from both a local and an uploaded copy of a
// segment).
func abortedList(dst []kmsg.FetchResponseTopicPartitionAbortedTransaction, l []log.AbortedTxn) []kmsg.FetchResponseTopicPartitionAbortedTransaction {
next:
	for _, a := range l {
		for _, d := range dst {
			if d.ProducerID == a.ProducerID && d.FirstOffset == a.FirstOffset {
				continue next
			}
		}
		at := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
		at.ProducerID, at.FirstOffset = a.ProducerID, a.FirstOffset
		dst = append(dst, at)
	}
	return dst
}

// coldAborted returns the aborted transactions overlapping [from, upper)
// for a read from the bucket: the bucket's index for the uploaded segments
// and the local one for the rest (a transaction's ABORT marker, where its
// entry is, may be in a later, local segment). wait is non-nil when the
// bucket's index of a segment is not in memory yet (loading in the
// background; the fetch answers the partition empty until it is).
func (s *Server) coldAborted(p *partition, from, upper int64) ([]kmsg.FetchResponseTopicPartitionAbortedTransaction, <-chan struct{}, error) {
	remote, wait, err := s.cfg.Tier.AbortedTxnsNoWait(s.ctx, p.tierKey(), nil, from, upper)
	if err != nil || wait != nil {
		return nil, wait, err
	}
	local, err := p.log.AbortedTxns(nil, from, upper)
	if err != nil {
		return nil, nil, err
	}
	if len(remote)+len(local) == 0 {
		return nil, nil, nil
	}
	return abortedList(abortedList(nil, remote), local), nil, nil
}

// abortOrphans aborts transactions open on p that the coordinator does
// not hold (Holds), once they have stayed so for grace (0: at once, the
// sweep at start): nothing else would ever end them, and the partition's
// LSO would stay behind them for ever. Kafka calls these hanging
// transactions. It is called by the maintenance loop only for partitions
// with a transaction open.
func (s *Server) abortOrphans(p *partition, now time.Time, grace time.Duration) {
	for _, res := range abortUnheldOn(p, s.txnCoord(), now, grace, s.meta.m.LeaderEpoch) {
		if res.err != nil {
			s.repeat.Warn("abort a hanging transaction", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Int64("producer_id", res.pid), zap.Error(res.err))
			continue
		}
		s.logger.Warn("aborted a transaction no coordinator state holds (hanging)", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Int64("producer_id", res.pid))
	}
}

type orphanAbort struct {
	pid int64
	err error
}

// abortUnheldOn is abortOrphans on a coordinator (tests drive it without a
// Server). It returns the aborts it tried.
func abortUnheldOn(p *partition, txns *txn.Coordinator, now time.Time, grace time.Duration, leaderEpoch int32) []orphanAbort {
	p.mu.Lock()
	suspects := make(map[int64]int64, len(p.txnOpen)) // pid → first offset of its open range
	for pid, first := range p.txnOpen {
		suspects[pid] = first
	}
	p.mu.Unlock()
	tp := txn.TP{Topic: p.topic.name, Partition: p.index}
	var out []orphanAbort
	for pid, first := range suspects {
		if txns.Holds(pid, tp) {
			p.mu.Lock()
			delete(p.orphanSince, pid)
			p.mu.Unlock()
			continue
		}
		p.mu.Lock()
		since, seen := p.orphanSince[pid]
		if !seen {
			if p.orphanSince == nil {
				p.orphanSince = map[int64]time.Time{}
			}
			p.orphanSince[pid] = now
		}
		p.mu.Unlock()
		if grace > 0 && (!seen || now.Sub(since) < grace) {
			continue
		}
		var next int64
		// Checked again under the transactional id's lock, and only the
		// same open range (a transaction that began since is not it).
		ran, err := txns.IfUnheld(pid, tp, func() error {
			p.mu.Lock()
			cur, open := p.txnOpen[pid]
			epoch := int16(0)
			if st := p.producers[pid]; st != nil {
				epoch = st.Epoch
			}
			p.mu.Unlock()
			if !open || cur != first {
				return nil
			}
			var err error
			next, err = p.writeMarker(pid, epoch, false, now.UnixMilli(), leaderEpoch, -1)
			if err == nil {
				// The aborted batches' sequences are forgotten: a retry of
				// one must not be answered as the aborted batch.
				p.mu.Lock()
				if st := p.producers[pid]; st != nil {
					st.Batches = nil
				}
				p.mu.Unlock()
			}
			return err
		})
		if !ran {
			continue
		}
		if err == nil && next > 0 {
			err = p.log.WaitDurable(next)
		}
		if next > 0 || err != nil {
			out = append(out, orphanAbort{pid, err})
		}
		if err == nil {
			p.mu.Lock()
			delete(p.orphanSince, pid)
			p.mu.Unlock()
		}
	}
	return out
}

// markerSince reports whether pid's last marker here is at or after at,
// and whether it commits.
func (p *partition) markerSince(pid, at int64) (commit, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.producers[pid]; at >= 0 && st != nil && st.Marker != nil && st.Marker.Offset >= at {
		return st.Marker.Commit, true
	}
	return false, false
}
