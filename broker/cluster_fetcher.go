package broker

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
)

// The follower's side of replication: one replicaFetcher per leader broker, with
// one connection, fetching every partition this broker follows there.
// Before a partition is fetched at a new epoch, its log is truncated where
// it diverges from the leader's (KIP-101: OffsetForLeaderEpoch for the
// epoch of its last batch). Fetched batches are appended as they are
// (offsets and epochs the leader's), with their producers' sequences
// recorded so that this broker, once leader, deduplicates retries; the
// next fetch offset is the durable end, which is what the leader counts.

// replicaFetcher fetches from one leader.
type replicaFetcher struct {
	cl     *cluster
	leader int32
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	parts map[*partition]*followed
	kick  chan struct{}
}

// followed is one partition a replicaFetcher fetches.
type followed struct {
	epoch     int32
	truncated bool // the log was checked against the leader's at epoch
	paused    time.Time
}

// follow makes p fetched from r's leader (truncating first).
func (cl *cluster) follow(p *partition, r *replicaRole) {
	cl.unfollow(p)
	cl.fetchMu.Lock()
	defer cl.fetchMu.Unlock()
	if cl.ctx.Err() != nil {
		return
	}
	f := cl.fetchers[r.leader]
	if f == nil {
		ctx, cancel := context.WithCancel(cl.ctx)
		f = &replicaFetcher{cl: cl, leader: r.leader, ctx: ctx, cancel: cancel, done: make(chan struct{}),
			parts: map[*partition]*followed{}, kick: make(chan struct{}, 1)}
		cl.fetchers[r.leader] = f
		go f.run(ctx)
	}
	f.mu.Lock()
	f.parts[p] = &followed{epoch: r.epoch}
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// unfollow stops fetching p, wherever it was fetched.
func (cl *cluster) unfollow(p *partition) {
	cl.fetchMu.Lock()
	defer cl.fetchMu.Unlock()
	for id, f := range cl.fetchers {
		f.mu.Lock()
		_, ok := f.parts[p]
		delete(f.parts, p)
		empty := len(f.parts) == 0
		f.mu.Unlock()
		if ok && empty {
			f.stop()
			delete(cl.fetchers, id)
		}
	}
}

func (f *replicaFetcher) stop() {
	f.cancel()
}

// snapshot lists the partitions to fetch now.
func (f *replicaFetcher) snapshot() map[*partition]followed {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[*partition]followed, len(f.parts))
	now := time.Now()
	for p, st := range f.parts {
		if now.Before(st.paused) {
			continue
		}
		out[p] = *st
	}
	return out
}

// owns reports whether this fetcher still fetches p at epoch, and the view
// still makes p a follower of its leader at that epoch. p.mu held by the
// caller: a fetcher replaced meanwhile (a new leader, a new epoch) must
// not append or truncate any more, whatever it had in flight.
func (f *replicaFetcher) owns(p *partition, epoch int32) bool {
	f.mu.Lock()
	st := f.parts[p]
	f.mu.Unlock()
	r := roleOf(p)
	return st != nil && st.epoch == epoch && !r.isLeader && r.leader == f.leader && r.epoch == epoch && f.ctxErr() == nil
}

func (f *replicaFetcher) ctxErr() error { return f.ctx.Err() }

// update changes p's entry if it is still the one for epoch.
func (f *replicaFetcher) update(p *partition, epoch int32, fn func(*followed)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := f.parts[p]; st != nil && st.epoch == epoch {
		fn(st)
	}
}

func (f *replicaFetcher) run(ctx context.Context) {
	defer close(f.done)
	log := f.cl.logger.With(zap.Int32("leader", f.leader))
	var rc *peerConn
	defer func() {
		if rc != nil {
			rc.close()
		}
	}()
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		if rc == nil {
			addr, ok := f.cl.brokerAddr(f.leader)
			var err error
			if ok {
				rc, err = dialPeer(ctx, addr, "synapse-replica-"+strconv.Itoa(int(f.cl.id)))
			}
			if !ok || err != nil {
				if err != nil {
					log.Debug("dial leader", zap.Error(err))
				}
				if !sleepCtx(ctx, backoff) {
					return
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
		}
		parts := f.snapshot()
		if len(parts) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-f.kick:
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if err := f.truncateAll(ctx, rc, parts); err != nil {
			log.Info("truncation by epoch", zap.Error(err))
			rc.close()
			rc = nil
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		if err := f.fetchOnce(ctx, rc, parts); err != nil {
			if ctx.Err() == nil {
				log.Info("replica fetch", zap.Error(err))
			}
			rc.close()
			rc = nil
			// Refused as a whole (this broker is not registered in the
			// leader's view yet, or the leader is going): back off, not
			// a dial and a refusal per millisecond.
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
	}
}

// truncateAll checks the logs of partitions not yet checked at their
// epoch against the leader's.
func (f *replicaFetcher) truncateAll(ctx context.Context, rc *peerConn, parts map[*partition]followed) error {
	req := kmsg.NewPtrOffsetForLeaderEpochRequest()
	req.Version = 4
	req.ReplicaID = f.cl.id
	type ask struct {
		p     *partition
		epoch int32
		last  int32
	}
	var asks []ask
	byTopic := map[string]int{}
	for p, st := range parts {
		if st.truncated || p.log.Err() != nil {
			continue
		}
		// Under p.mu: an append checked against the leadership this
		// broker just lost has landed by now (and none comes after).
		p.mu.Lock()
		last := lastBatchEpoch(p.log)
		p.mu.Unlock()
		if last < 0 {
			f.update(p, st.epoch, func(s *followed) { s.truncated = true })
			continue
		}
		i, ok := byTopic[p.topic.name]
		if !ok {
			rt := kmsg.NewOffsetForLeaderEpochRequestTopic()
			rt.Topic = p.topic.name
			req.Topics = append(req.Topics, rt)
			i = len(req.Topics) - 1
			byTopic[p.topic.name] = i
		}
		rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
		rp.Partition, rp.CurrentLeaderEpoch, rp.LeaderEpoch = p.index, st.epoch, last
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
		asks = append(asks, ask{p, st.epoch, last})
	}
	if len(asks) == 0 {
		return nil
	}
	kresp, err := rc.request(ctx, req)
	if err != nil {
		return err
	}
	resp := kresp.(*kmsg.OffsetForLeaderEpochResponse)
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			var a *ask
			for i := range asks {
				if asks[i].p.topic.name == rt.Topic && asks[i].p.index == rp.Partition {
					a = &asks[i]
				}
			}
			if a == nil {
				continue
			}
			if rp.ErrorCode != 0 {
				f.cl.logger.Debug("truncation by epoch refused", zap.String("topic", a.p.topic.name), zap.Int32("partition", a.p.index), zap.Int16("code", rp.ErrorCode))
				f.update(a.p, a.epoch, func(s *followed) { s.paused = time.Now().Add(100 * time.Millisecond) })
				continue
			}
			target := rp.EndOffset
			if rp.LeaderEpoch < 0 || target < 0 {
				target = a.p.log.HighWatermark() // the leader knows no such epoch: keep only what is committed
			} else if rp.LeaderEpoch < a.last {
				// The leader's log has no epoch a.last: ours diverges at
				// the end of its newest epoch at or below the one it has.
				_, _, localEnd := epochEndOffset(a.p.log, kmsg.OffsetForLeaderEpochRequestTopicPartition{
					CurrentLeaderEpoch: -1, LeaderEpoch: rp.LeaderEpoch}, a.last+1)
				if localEnd >= 0 {
					target = min(target, localEnd)
				}
			}
			// Never below this replica's high watermark: what lies below
			// it is committed, and a leader elected from the ISR holds it.
			// The leader's answer comes from its batch headers and falls
			// below it when the batches of that epoch were cleaned away
			// (a compacted topic) or are only in the bucket.
			target = max(target, min(a.p.log.HighWatermark(), a.p.log.LogEndOffset()))
			if target < a.p.log.LogEndOffset() {
				if err := f.cl.truncate(f, a.p, a.epoch, target); err != nil {
					f.cl.logger.Error("truncate", zap.String("topic", a.p.topic.name), zap.Int32("partition", a.p.index), zap.Error(err))
					f.update(a.p, a.epoch, func(s *followed) { s.paused = time.Now().Add(time.Second) })
					continue
				}
			}
			f.update(a.p, a.epoch, func(s *followed) { s.truncated = true })
		}
	}
	return nil
}

// truncate cuts p's log back to off and forgets the producer state of
// what was cut.
func (cl *cluster) truncate(f *replicaFetcher, p *partition, epoch int32, off int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !f.owns(p, epoch) {
		return errStaleFetcher
	}
	end, err := p.truncateLocked(off)
	if err != nil {
		return err
	}
	cl.logger.Info("truncated to the leader's log", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Int64("log_end", end))
	return nil
}

// truncateLocked cuts p's log back to off and its producer and
// transaction state with it; it returns the new log end. p.mu held.
func (p *partition) truncateLocked(off int64) (int64, error) {
	end, err := p.log.TruncateTo(off)
	if err != nil {
		return end, err
	}
	if p.txnSeen.Load() || len(p.txnOpen) > 0 {
		// Transactions here: what is open depends on which markers
		// survived the cut. The state is read again: the durable
		// snapshot if it is below the cut (taken before segments were
		// released, it holds the transactions open in them), then the
		// log after it (the aborted index was cut with it). The result
		// is saved durably in its place.
		clear(p.producers)
		clear(p.txnOpen)
		p.setFirstOpenLocked()
		if err := p.loadProducers(); err != nil {
			return end, err
		}
		return end, p.saveProducersDurableLocked()
	}
	for id, st := range p.producers {
		keep := st.Batches[:0]
		for _, b := range st.Batches {
			if b.BaseOffset < end {
				keep = append(keep, b)
			}
		}
		st.Batches = keep
		if len(keep) == 0 {
			delete(p.producers, id)
		}
	}
	// The producer-state snapshot of a clean close may name batches cut
	// away: the next open replays the log instead.
	if err := os.Remove(filepath.Join(p.log.Dir(), producersFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return end, err
	}
	return end, nil
}

// errStaleFetcher: the fetcher no longer fetches the partition at that
// epoch (a new leader or epoch came meanwhile).
var errStaleFetcher = errors.New("the partition moved to another leader or epoch")

// resetTo starts p's log over at the leader's log start (its whole log
// lies below it).
func (cl *cluster) resetTo(f *replicaFetcher, p *partition, epoch int32, start int64) error {
	if err := cl.resetLog(f, p, epoch, start, start); err != nil {
		return err
	}
	cl.logger.Info("behind the leader's log start: log started over there", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Int64("log_start", start))
	return nil
}

// resetLog empties p's log and starts it again at next (the log start at
// logStart), without its producer state, if f still owns p at epoch.
func (cl *cluster) resetLog(f *replicaFetcher, p *partition, epoch int32, next, logStart int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !f.owns(p, epoch) {
		return errStaleFetcher
	}
	if err := p.log.ResetToAt(next, logStart); err != nil {
		return err
	}
	// (A transaction open across the reset is seen again from its next
	// batch.)
	return p.forgetProducersLocked()
}

// forgetProducersLocked drops p's producer and transaction state and its
// snapshot file, for a log emptied under it. p.mu held.
func (p *partition) forgetProducersLocked() error {
	clear(p.producers)
	clear(p.txnOpen)
	p.setFirstOpenLocked()
	if err := os.Remove(filepath.Join(p.log.Dir(), producersFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// dropReplica empties p's log if this broker is not one of its replicas
// (a reassignment moved it away, as Kafka's StopReplica with delete):
// the controller removes a replica only once the new ones are in the
// ISR, and a broker outside the replicas is never elected. If the
// partition comes back here, the log is copied again from the leader's
// log start (or the bucket's end). The role is checked under p.mu, which
// a fetcher's appends hold too.
func (cl *cluster) dropReplica(p *partition) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := roleOf(p)
	if len(r.replicas) == 0 || slices.Contains(r.replicas, cl.id) || r.isLeader {
		return
	}
	if p.log.LogEndOffset() == 0 && p.log.LogStartOffset() == 0 {
		return // nothing here (every broker opens every partition)
	}
	end := p.log.LogEndOffset()
	if err := p.log.Wipe(); err != nil {
		if !errors.Is(err, log.ErrClosed) {
			cl.logger.Warn("remove the log of a replica moved away", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
		}
		return
	}
	if err := p.forgetProducersLocked(); err != nil {
		cl.logger.Warn("remove the producer state of a replica moved away", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
	}
	cl.logger.Info("not a replica here any more: log removed", zap.String("topic", p.topic.name), zap.Int32("partition", p.index),
		zap.Int64("log_end", end), zap.Int32s("replicas", r.replicas))
}

// fetchOnce sends one replica fetch for the checked partitions and appends
// what it returns.
func (f *replicaFetcher) fetchOnce(ctx context.Context, rc *peerConn, parts map[*partition]followed) error {
	req := kmsg.NewPtrFetchRequest()
	req.Version = 12
	req.ReplicaID = f.cl.id
	req.MaxWaitMillis = 500
	req.MinBytes = 1
	req.MaxBytes = 8 << 20
	req.SessionEpoch = -1
	byTopic := map[string]int{}
	type asked struct {
		p     *partition
		epoch int32
	}
	var asks []asked
	for p, st := range parts {
		if !st.truncated || p.log.Err() != nil {
			// (A log that failed here fetches no more: this broker is
			// not counted in the ISR until it restarts.)
			continue
		}
		i, ok := byTopic[p.topic.name]
		if !ok {
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic = p.topic.name
			req.Topics = append(req.Topics, rt)
			i = len(req.Topics) - 1
			byTopic[p.topic.name] = i
		}
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = p.index
		rp.CurrentLeaderEpoch = st.epoch
		rp.FetchOffset = p.log.DurableEnd()
		rp.LogStartOffset = p.log.LogStartOffset()
		rp.LastFetchedEpoch = lastBatchEpoch(p.log)
		rp.PartitionMaxBytes = replicaFetchMaxBytes
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
		asks = append(asks, asked{p, st.epoch})
	}
	if len(asks) == 0 {
		return sleepErr(ctx, 20*time.Millisecond)
	}
	kresp, err := rc.request(ctx, req)
	if err != nil {
		return err
	}
	resp := kresp.(*kmsg.FetchResponse)
	if resp.ErrorCode != 0 {
		return fmt.Errorf("fetch: %w", kerr.ErrorForCode(resp.ErrorCode))
	}
	find := func(topic string, part int32) *asked {
		for i := range asks {
			if asks[i].p.topic.name == topic && asks[i].p.index == part {
				return &asks[i]
			}
		}
		return nil
	}
	var appended []*partition
	var hws, starts []int64
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			a := find(rt.Topic, rp.Partition)
			if a == nil {
				continue
			}
			switch rp.ErrorCode {
			case 0:
			case kerr.OffsetMovedToTieredStorage.Code:
				// Below the leader's local log: the bucket has it.
				if moved, err := f.cl.rebaseFromBucket(f, a.p, a.epoch); err != nil && !errors.Is(err, errStaleFetcher) {
					f.cl.logger.Warn("start over where the bucket's log ends", zap.String("topic", a.p.topic.name), zap.Int32("partition", a.p.index), zap.Error(err))
					f.update(a.p, a.epoch, func(s *followed) { s.paused = time.Now().Add(time.Second) })
				} else if !moved {
					f.update(a.p, a.epoch, func(s *followed) { s.paused = time.Now().Add(200 * time.Millisecond) })
				}
				continue
			case kerr.OffsetOutOfRange.Code:
				if rp.LogStartOffset > a.p.log.LogEndOffset() {
					// The leader's log starts past this whole log.
					if err := f.cl.resetTo(f, a.p, a.epoch, rp.LogStartOffset); err != nil {
						f.cl.logger.Warn("start over at the leader's log start", zap.String("topic", a.p.topic.name), zap.Int32("partition", a.p.index), zap.Error(err))
					}
					continue
				}
				f.update(a.p, a.epoch, func(s *followed) { s.truncated = false })
				continue
			default:
				// Not (or no longer) the leader at this epoch: wait for
				// the view to say who is.
				f.cl.logger.Debug("replica fetch refused", zap.String("topic", a.p.topic.name), zap.Int32("partition", a.p.index), zap.Int16("code", rp.ErrorCode))
				f.update(a.p, a.epoch, func(s *followed) { s.paused = time.Now().Add(200 * time.Millisecond) })
				continue
			}
			if rp.DivergingEpoch.EndOffset >= 0 && rp.DivergingEpoch.Epoch >= 0 {
				f.cl.logger.Debug("diverging epoch", zap.String("topic", a.p.topic.name), zap.Int32("partition", a.p.index),
					zap.Int32("epoch", rp.DivergingEpoch.Epoch), zap.Int64("end", rp.DivergingEpoch.EndOffset))
				// The log diverged from the leader's: truncate by epoch again.
				f.update(a.p, a.epoch, func(s *followed) { s.truncated = false })
				continue
			}
			if err := f.cl.appendReplicated(f, a.p, a.epoch, rp.RecordBatches); errors.Is(err, errStaleFetcher) {
				continue
			} else if err != nil {
				f.cl.logger.Warn("append replicated batches", zap.String("topic", a.p.topic.name), zap.Int32("partition", a.p.index), zap.Error(err))
				f.update(a.p, a.epoch, func(s *followed) { s.truncated, s.paused = false, time.Now().Add(200*time.Millisecond) })
				continue
			}
			appended = append(appended, a.p)
			hws = append(hws, rp.HighWatermark)
			starts = append(starts, rp.LogStartOffset)
		}
	}
	for i, p := range appended {
		if err := p.log.WaitDurable(p.log.LogEndOffset()); errors.Is(err, log.ErrOffsetOutOfRange) {
			continue // cut meanwhile (dropReplica): nothing of this answer to count
		} else if err != nil {
			return err
		}
		if err := p.log.Commit(readCommittedEnd(p.log, hws[i])); err != nil {
			return err
		}
		// The leader's DeleteRecords (and retention) move its log start:
		// followers follow, within what is committed here.
		if ls := min(starts[i], p.log.HighWatermark()); ls > p.log.LogStartOffset() {
			if _, err := p.log.DeleteRecordsBefore(ls); err != nil {
				f.cl.logger.Warn("follow the leader's log start", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
			}
		}
	}
	return nil
}

// appendReplicated appends a leader's batches as they are: at the
// offsets the leader gave them (batches this log already has are
// skipped), with their sequences recorded. A compacted leader's batches
// may start past this log's end (the cleaner removed what was between).
func (cl *cluster) appendReplicated(f *replicaFetcher, p *partition, epoch int32, b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !f.owns(p, epoch) {
		return errStaleFetcher
	}
	now := cl.s.cfg.Now().UnixMilli()
	for len(b) > 0 {
		if len(b) < log.BatchHeaderSize {
			return nil // a partial batch at the end: fetched again next time
		}
		h, err := log.ParseBatchHeader(b)
		if err != nil {
			return err
		}
		if int(h.Length) > len(b) {
			return nil
		}
		batch := b[:h.Length]
		b = b[h.Length:]
		leo := p.log.LogEndOffset()
		if h.NextOffset() <= leo {
			continue // already here
		}
		if h.BaseOffset < leo {
			return fmt.Errorf("batch at %d straddles the log end %d", h.BaseOffset, leo)
		}
		if err := p.appendFollowedLocked(batch, &h, now); err != nil {
			return err
		}
	}
	return nil
}

// appendFollowedLocked appends one of the leader's batches and keeps the
// producer and transaction state as the leader does: sequences, the
// transactions open here (the LSO), and for an ABORT marker the aborted
// index entry, written before the transaction stops holding the LSO back
// (as writeMarker does). A follower elected leader then serves
// read_committed as its leader did, and the coordinator's markers find
// the transactions they close. p.mu held.
func (p *partition) appendFollowedLocked(batch []byte, h *log.BatchHeader, now int64) error {
	if h.ProducerID >= 0 && h.Transactional() && !h.Control() {
		p.openTxnLocked(h.ProducerID, h.BaseOffset)
	}
	res, err := p.log.AppendReplica(batch)
	if err != nil {
		return err
	}
	if h.ProducerID < 0 {
		return nil
	}
	if !h.Control() {
		p.recordSequence(&res.Header, now)
		return nil
	}
	control := log.ControlType(batch[log.BatchHeaderSize:])
	if control != log.ControlAbort && control != log.ControlCommit {
		return nil
	}
	if first, open := p.txnOpen[h.ProducerID]; open && control == log.ControlAbort {
		if err := p.log.AddAborted(p.abortedEntryLocked(h.ProducerID, first, h.BaseOffset)); err != nil {
			return err
		}
	}
	p.closeTxnLocked(h.ProducerID, h.ProducerEpoch, h.BaseOffset, control, now)
	return nil
}

// brokerAddr is a live broker's host:port from the view.
func (cl *cluster) brokerAddr(id int32) (string, bool) {
	v := cl.currentView()
	if v == nil {
		return "", false
	}
	b, ok := v.Brokers[id]
	if !ok {
		return "", false
	}
	if b.PeerHost != "" {
		return net.JoinHostPort(b.PeerHost, strconv.Itoa(int(b.PeerPort))), true
	}
	return net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))), true
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func sleepErr(ctx context.Context, d time.Duration) error {
	if !sleepCtx(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// peerConn is a minimal Kafka client connection for broker-to-broker
// requests: one request at a time.
type peerConn struct {
	nc     net.Conn
	r      *bufio.Reader
	corr   int32
	client string
	buf    []byte
	in     []byte // the last response's bytes: its records point into it
}

func dialPeer(ctx context.Context, addr, client string) (*peerConn, error) {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	nc, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &peerConn{nc: nc, r: bufio.NewReaderSize(nc, 64<<10), client: client}, nil
}

func (rc *peerConn) close() { rc.nc.Close() }

// maxRawResponse bounds a response a peer may send.
const maxRawResponse = 64 << 20

// request sends req and reads its response (a deadline of 10 s past the
// request's own wait). The response's byte fields point into a buffer the
// next request reuses: done with them before asking again.
func (rc *peerConn) request(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	rc.corr++
	b := rc.buf[:0]
	b = append(b, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(rc.corr))
	b = binary.BigEndian.AppendUint16(b, uint16(len(rc.client)))
	b = append(b, rc.client...)
	if req.IsFlexible() {
		b = append(b, 0) // no tagged fields
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	rc.buf = b
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	stop := context.AfterFunc(ctx, func() { rc.nc.SetDeadline(time.Now()) })
	defer stop()
	rc.nc.SetDeadline(deadline)
	if _, err := rc.nc.Write(b); err != nil {
		return nil, err
	}
	var hdr [8]byte
	if _, err := io.ReadFull(rc.r, hdr[:]); err != nil {
		return nil, err
	}
	size := int32(binary.BigEndian.Uint32(hdr[:4]))
	if size < 4 || size > maxRawResponse {
		return nil, fmt.Errorf("response of %d bytes", size)
	}
	if corr := int32(binary.BigEndian.Uint32(hdr[4:])); corr != rc.corr {
		return nil, fmt.Errorf("response correlation id %d, want %d", corr, rc.corr)
	}
	if cap(rc.in) < int(size-4) {
		rc.in = make([]byte, size-4)
	}
	body := rc.in[:size-4]
	if _, err := io.ReadFull(rc.r, body); err != nil {
		return nil, err
	}
	resp := req.ResponseKind()
	if resp.IsFlexible() && req.Key() != 18 {
		n, rest, err := skipTags(body)
		if err != nil {
			return nil, err
		}
		_ = n
		body = rest
	}
	if err := resp.ReadFrom(body); err != nil {
		return nil, err
	}
	return resp, nil
}

// skipTags skips a tagged-field section.
func skipTags(b []byte) (int, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return 0, nil, errors.New("bad tagged fields")
	}
	b = b[k:]
	for i := uint64(0); i < n; i++ {
		_, k = binary.Uvarint(b)
		if k <= 0 {
			return 0, nil, errors.New("bad tagged field")
		}
		b = b[k:]
		size, k := binary.Uvarint(b)
		if k <= 0 || size > uint64(len(b)-k) {
			return 0, nil, errors.New("bad tagged field size")
		}
		b = b[k+int(size):]
	}
	return int(n), b, nil
}
