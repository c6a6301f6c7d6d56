package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/synapsebroker/synapse/log"
)

// Idempotent producers: per (producer id, partition) the epoch and the last
// five batches' sequence ranges with their offsets, as Kafka keeps them.
//
// State survives restarts: Close writes a snapshot (producers.json in the
// partition directory, with the log end it covers); open loads it and replays
// the batch headers appended after it, so a restarted broker neither
// duplicates nor rejects a retrying producer. Without a snapshot the whole
// log is replayed (headers only).

const producerWindow = 5

type seqBatch struct {
	FirstSeq   int32 `json:"first_seq"`
	LastSeq    int32 `json:"last_seq"`
	BaseOffset int64 `json:"base_offset"`
}

type producerState struct {
	Epoch   int16      `json:"epoch"`
	Batches []seqBatch `json:"batches"` // oldest first, at most producerWindow
	// LastMs is when the producer last appended here (the broker's clock,
	// Unix ms): state idle past producer.id.expiration.ms is dropped, as
	// Kafka does, so every producer id ever seen is not kept for ever. 0
	// (state rebuilt at open, restored, or from an older snapshot): idle
	// from the next maintenance pass on.
	LastMs int64 `json:"last_ms,omitempty"`
	// Marker is the producer's last transaction marker here (txn_partition.go).
	Marker *lastMarker `json:"marker,omitempty"`
}

// lastMarker is where a producer's last COMMIT or ABORT marker is on a
// partition: after a crash, the evidence that a transaction added here
// before it was decided.
type lastMarker struct {
	Offset int64 `json:"offset"`
	Commit bool  `json:"commit,omitempty"`
}

var (
	errOutOfOrderSequence = errors.New("out of order sequence number")
	errInvalidEpoch       = errors.New("invalid producer epoch")
)

// lastSeq returns the sequence of a batch's last record, wrapping at int32
// max as Kafka does. From the offset delta, not the record count (Kafka's
// lastSequence): a cleaned batch keeps its last offset with fewer records;
// a produced one has both equal (log.CheckBatch).
func lastSeq(h *log.BatchHeader) int32 {
	return int32((int64(h.BaseSequence) + int64(h.LastOffsetDelta)) % (math.MaxInt32 + 1))
}

func nextSeq(last int32) int32 {
	if last == math.MaxInt32 {
		return 0
	}
	return last + 1
}

// check decides what to do with an idempotent batch: dup >= 0 is the base
// offset of an identical batch already written (answer it, write nothing).
// p.mu held.
func (p *partition) checkSequence(h *log.BatchHeader) (dup int64, err error) {
	st := p.producers[h.ProducerID]
	first, last := h.BaseSequence, lastSeq(h)
	if st == nil {
		return -1, nil // unknown producer (new, or its state expired): accept
	}
	switch {
	case h.ProducerEpoch < st.Epoch:
		return -1, errInvalidEpoch
	case h.ProducerEpoch > st.Epoch:
		if first != 0 {
			return -1, errOutOfOrderSequence
		}
		return -1, nil
	}
	for _, b := range st.Batches {
		if b.FirstSeq == first && b.LastSeq == last {
			return b.BaseOffset, nil
		}
	}
	if n := len(st.Batches); n > 0 && first != nextSeq(st.Batches[n-1].LastSeq) {
		return -1, errOutOfOrderSequence
	}
	return -1, nil
}

// record notes an idempotent batch appended at nowMs. p.mu held (or p not
// yet shared).
func (p *partition) recordSequence(h *log.BatchHeader, nowMs int64) {
	st := p.producers[h.ProducerID]
	if st == nil || h.ProducerEpoch > st.Epoch {
		var m *lastMarker
		if st != nil {
			m = st.Marker // a new epoch starts the sequences over, not the marker's evidence
		}
		st = &producerState{Epoch: h.ProducerEpoch, Marker: m}
		p.producers[h.ProducerID] = st
	}
	st.LastMs = nowMs
	st.Batches = append(st.Batches, seqBatch{FirstSeq: h.BaseSequence, LastSeq: lastSeq(h), BaseOffset: h.BaseOffset})
	if len(st.Batches) > producerWindow {
		st.Batches = append(st.Batches[:0], st.Batches[len(st.Batches)-producerWindow:]...)
	}
}

const producersFile = "producers.json"

type producerSnapshot struct {
	Version   int                      `json:"version"`
	LogEnd    int64                    `json:"log_end"`
	Producers map[int64]*producerState `json:"producers"`
	// Open is the first offset of each producer's open transaction here
	// (txn_partition.go).
	Open map[int64]int64 `json:"open,omitempty"`
	// ProducerIDEnd, in copies mirrored to the bucket, is the broker's
	// producer-id bound when it was taken: a broker restored from the
	// bucket hands out ids from above it, never one a producer whose state
	// came back still uses.
	ProducerIDEnd int64 `json:"producer_id_end,omitempty"`
}

// expireProducers drops the state of producers idle for longer than
// expiration (producer.id.expiration.ms): a retry from one of them after
// that is a new producer's batch, as in Kafka.
func (p *partition) expireProducers(nowMs int64, expiration time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, st := range p.producers {
		if _, open := p.txnOpen[id]; open {
			continue // a transaction open here: kept (DescribeProducers shows it)
		}
		switch {
		case st.LastMs == 0:
			st.LastMs = nowMs
		case nowMs-st.LastMs > expiration.Milliseconds():
			delete(p.producers, id)
		}
	}
}

// loadProducers rebuilds producer state: snapshot, then the log after it.
func (p *partition) loadProducers() error {
	b, err := os.ReadFile(filepath.Join(p.log.Dir(), producersFile))
	return p.loadProducersFrom(b, err)
}

// loadProducersFrom is loadProducers given the snapshot file's bytes (err
// set: none was read).
func (p *partition) loadProducersFrom(b []byte, err error) error {
	from := p.log.LogStartOffset()
	if err == nil {
		var snap producerSnapshot
		if json.Unmarshal(b, &snap) == nil && snap.Version == 1 && snap.LogEnd <= p.log.LogEndOffset() && snap.Producers != nil {
			p.producers = snap.Producers
			from = max(snap.LogEnd, from)
			for pid, first := range snap.Open {
				if first >= 0 && first < snap.LogEnd { // even below the log start: the transaction is still open
					p.openTxnLocked(pid, first)
				}
			}
		}
	}
	return p.replayTxns(from)
}

// saveProducers writes the snapshot; called on clean close.
func (p *partition) saveProducers() {
	if path, b, ok := p.producersFile(); ok {
		log.WriteFileAtomic(log.OSFS, path, b)
	}
}

// saveProducersDurableLocked writes a snapshot that covers the whole log as it is
// now: the log end durable, the aborted indexes synced, then the snapshot
// (atomic), all under p.mu (held) so no append or marker slips in between. The
// tiering step calls it before releasing local segments of a partition that
// has had transactions: a replay after a crash then starts at or above the
// new local start, never below it, where the open transactions of released
// segments could not be seen.
func (p *partition) saveProducersDurableLocked() error {
	leo := p.log.LogEndOffset()
	if err := p.log.WaitDurable(leo); err != nil {
		return err
	}
	if err := p.log.SyncAborted(); err != nil {
		return err
	}
	b, err := json.Marshal(producerSnapshot{Version: 1, LogEnd: leo, Producers: p.producers, Open: p.txnOpen})
	if err != nil {
		return err
	}
	return log.WriteFileAtomic(log.OSFS, filepath.Join(p.log.Dir(), producersFile), b)
}

// beforeRelease runs before local segments of p are released to the
// bucket: with transactions since the last such snapshot, a durable
// snapshot first (saveProducersDurableLocked).
func (p *partition) beforeRelease() error {
	if !p.txnSeen.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.saveProducersDurableLocked(); err != nil {
		return err
	}
	if len(p.txnOpen) == 0 {
		// Cleared only with no transaction open: a follower's truncation
		// reads the transaction state again while it is set
		// (cluster.truncate), and an open one's marker may yet be cut.
		p.txnSeen.Store(false)
	}
	return nil
}

// producersFile returns the producer-state snapshot to write at close and
// its path; ok is false if there is none to write.
func (p *partition) producersFile() (path string, b []byte, ok bool) {
	if p.log.Err() != nil {
		// A latched storage error: batches above the durable end may be
		// gone after the restart (or come back from the page cache
		// unsynced); the snapshot must not vouch for them. Open replays
		// the headers of what actually survived instead.
		return "", nil, false
	}
	p.mu.Lock()
	snap := producerSnapshot{Version: 1, LogEnd: p.log.LogEndOffset(), Producers: p.producers, Open: p.txnOpen}
	b, err := json.Marshal(snap)
	p.mu.Unlock()
	return filepath.Join(p.log.Dir(), producersFile), b, err == nil
}

// producerSnapshotBelow encodes the producer state as of offset end: only
// batches below end are kept (what the bucket holds when end is the
// manifest's next offset), with the broker's producer-id bound idEnd. It
// returns nil if there is nothing to keep.
func (p *partition) producerSnapshotBelow(end, idEnd int64) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	snap := producerSnapshot{Version: 1, LogEnd: end, Producers: map[int64]*producerState{}, ProducerIDEnd: idEnd}
	for pid, first := range p.txnOpen {
		if first < end {
			if snap.Open == nil {
				snap.Open = map[int64]int64{}
			}
			snap.Open[pid] = first
		}
	}
	for id, st := range p.producers {
		var keep []seqBatch
		for _, b := range st.Batches {
			if b.BaseOffset < end {
				keep = append(keep, b)
			}
		}
		var m *lastMarker
		if st.Marker != nil && st.Marker.Offset < end {
			m = st.Marker
		}
		if len(keep) > 0 || m != nil {
			snap.Producers[id] = &producerState{Epoch: st.Epoch, Batches: keep, LastMs: st.LastMs, Marker: m}
		}
	}
	if len(snap.Producers) == 0 && len(snap.Open) == 0 {
		return nil
	}
	b, err := json.Marshal(snap)
	if err != nil {
		return nil
	}
	return b
}

// restoredProducers decodes a producer snapshot from the bucket for a
// partition rebased at next (the bucket's end). Only batches below both
// the snapshot's end and next are kept (the snapshot is the bucket's word,
// not proof). floor is the least producer id the broker may hand out from
// now on: above every restored one and the bound the snapshot was taken
// with.
func restoredProducers(b []byte, next int64) (keep map[int64]*producerState, open map[int64]int64, floor int64, err error) {
	var snap producerSnapshot
	if err := json.Unmarshal(b, &snap); err != nil || snap.Version != 1 || snap.Producers == nil {
		return nil, nil, 0, fmt.Errorf("broker: producer snapshot in the bucket is unreadable: %v", err)
	}
	end := min(snap.LogEnd, next)
	floor = max(snap.ProducerIDEnd, 0)
	keep = map[int64]*producerState{}
	for pid, first := range snap.Open {
		// Transactions open at the bucket's end: their markers come
		// when the (restored) coordinator ends them.
		if pid >= 0 && first >= 0 && first < end {
			if open == nil {
				open = map[int64]int64{}
			}
			open[pid] = first
			floor = max(floor, pid+1)
		}
	}
	for id, st := range snap.Producers {
		if id < 0 || st == nil || st.Epoch < 0 {
			continue
		}
		floor = max(floor, id+1)
		var bs []seqBatch
		for _, b := range st.Batches {
			if b.BaseOffset >= 0 && b.BaseOffset < end && b.FirstSeq >= 0 && b.LastSeq >= 0 {
				bs = append(bs, b)
			}
		}
		var m *lastMarker
		if st.Marker != nil && st.Marker.Offset >= 0 && st.Marker.Offset < end {
			m = st.Marker
		}
		if n := len(bs); n > 0 || m != nil {
			keep[id] = &producerState{Epoch: st.Epoch, Batches: bs[max(0, n-producerWindow):], Marker: m}
		}
	}
	return keep, open, floor, nil
}

// restoreProducers installs restored producer state and persists it
// locally.
func (p *partition) restoreProducers(keep map[int64]*producerState, open map[int64]int64) {
	p.mu.Lock()
	p.producers = keep
	p.txnOpen = open
	p.setFirstOpenLocked()
	p.mu.Unlock()
	p.saveProducers()
}
