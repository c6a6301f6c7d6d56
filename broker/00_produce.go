package broker

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/txn"
)

// Produce: v3-13
//
// Behavior:
//   - Exactly one v2 record batch per partition (as Kafka requires from v3):
//     framing and CRC errors are CORRUPT_MESSAGE, anything else wrong with
//     the batch (magic, record count, several batches) INVALID_RECORD, a batch
//     above max.message.bytes MESSAGE_TOO_LARGE.
//   - Bytes are stored as sent: offsets patched, partition leader epoch set;
//     LogAppendTime topics get the append time stamped (and the CRC redone).
//     A header whose MaxTimestamp is below its BaseTimestamp (older sarama
//     sends -1) is repaired from the records, as Kafka's log validator sets
//     it (the client's CRC checked first, then redone); only such batches
//     are decompressed (bounded), no other.
//   - acks=0: no response at all. acks=-1: answered after fsync under the
//     durable policy (every partition of the request joins the same group
//     commit). acks=1: answered after the write under the interval policy;
//     under the durable policy also after the fsync, like acks=-1, because
//     the high watermark is the durable end there and "answered" must mean
//     "visible": Kafka's single-replica high watermark includes a record
//     before its acks=1 answer, and tools that produce then read (or ask
//     for the latest offset) at once rely on it.
//   - Idempotent batches (producer id >= 0) are checked against the last five
//     batches of that producer on that partition: a duplicate is answered with
//     the original offset and not written again; a gap is
//     OUT_OF_ORDER_SEQUENCE_NUMBER; an old epoch INVALID_PRODUCER_EPOCH.
//   - Transactional batches are checked against the transaction
//     coordinator before the sequence check: the partition must be in the
//     producer's open transaction (else INVALID_TXN_STATE, KIP-890's
//     verification done in place), at the transactional id's current
//     epoch (else INVALID_PRODUCER_EPOCH). The check and the append hold
//     the transaction's lock, so no batch lands after its end's markers.
//     The request must name its transactional id (else INVALID_RECORD).
//   - Control batches are refused (INVALID_RECORD): markers are written
//     only by the coordinator.
//   - On a compacted topic (cleanup.policy includes compact) a batch with
//     a record without a key is refused whole (INVALID_RECORD, the records
//     in RecordErrors), before any sequence or transaction check: every
//     record is read, a compressed batch decompressed (bounded;
//     compacted.go). Other topics' batches are never read.
//   - Unknown topics are auto-created when enabled (and, with ACLs, the
//     principal may CREATE them: else TOPIC_AUTHORIZATION_FAILED).
//   - With ACLs: WRITE on each topic (else TOPIC_AUTHORIZATION_FAILED) and,
//     for a transactional id, WRITE on it (else
//     TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
//
// Version notes:
//   - v13: topics by id (UNKNOWN_TOPIC_ID).
func (s *Server) handleProduce(c *conn, req *kmsg.ProduceRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	var waits []durableWait
	acksOK := req.Acks == 0 || req.Acks == 1 || req.Acks == -1
	creates := maxAutoCreates
	txnDenied := req.TransactionID != nil && !c.allowed(opWrite, resTxnID, *req.TransactionID)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		var t *topic
		code := int16(0)
		switch {
		case txnDenied:
			code = kerr.TransactionalIDAuthorizationFailed.Code
		case req.Version >= 13:
			if t = s.reg.getByID(rt.TopicID); t == nil {
				code = kerr.UnknownTopicID.Code
				if s.virtualOffsetsID(rt.TopicID) {
					code = kerr.InvalidTopicException.Code // clients never append to internal topics
				}
			} else if !c.allowed(opWrite, resTopic, t.name) {
				t, code = nil, kerr.TopicAuthorizationFailed.Code
			}
		case !c.allowed(opWrite, resTopic, rt.Topic):
			code = kerr.TopicAuthorizationFailed.Code
		case internalTopic(rt.Topic) && s.reg.get(rt.Topic) == nil:
			code = kerr.InvalidTopicException.Code // clients never append to internal topics
		default:
			t, code = s.topicOrCreate(c, rt.Topic, s.cfg.AutoCreateTopics, &creates)
		}
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.BaseOffset, sp.LogAppendTime, sp.LogStartOffset = -1, -1, -1
			switch {
			case !acksOK:
				sp.ErrorCode = kerr.InvalidRequiredAcks.Code
			case t == nil:
				sp.ErrorCode = code
			case s.overDisk.Load():
				// Retriable: the client backs off while uploads catch up.
				sp.ErrorCode = kerr.KafkaStorageError.Code
				sp.ErrorMessage = kmsg.StringPtr("local disk budget reached while the tiered store is behind; retry")
			default:
				p := s.reg.partition(t, rp.Partition)
				if p == nil {
					sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
					break
				}
				epoch := s.meta.m.LeaderEpoch
				var role *replicaRole
				if s.cl != nil {
					code, r := s.cl.leaderCheck(p, -1)
					if code != 0 {
						sp.ErrorCode = code
						s.cl.produceLeaderHint(resp, &sp, r)
						break
					}
					if req.Acks == -1 && len(r.isr) < s.cl.minISR(p, r) {
						sp.ErrorCode = kerr.NotEnoughReplicas.Code
						break
					}
					epoch, role = r.epoch, r
				}
				var truncs uint64
				next, txnEnd, err := s.produceTo(p, rp.Records, &sp, req.TransactionID, epoch, &truncs)
				if err != nil {
					sp.ErrorCode = s.produceErrorCode(err)
					sp.ErrorMessage = kmsg.StringPtr(err.Error())
					sp.BaseOffset = -1
					if re := (*recordErrors)(nil); errors.As(err, &re) {
						sp.ErrorRecords = re.records
					}
					break
				}
				if (req.Acks == -1 || req.Acks == 1 && s.store.Durable()) && next > 0 {
					w := durableWait{len(resp.Topics), len(st.Partitions), p, next, txnEnd, role, truncs, req.Acks == -1}
					waits = append(waits, w)
				}
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	if req.Acks == 0 {
		return nil, nil
	}
	if len(waits) > 0 {
		// Durability is waited for by the connection (finish), after it
		// has also appended any produce requests already queued behind
		// this one: they all share one group-commit round.
		return &deferredProduce{ProduceResponse: resp, s: s, waits: waits, timeout: time.Duration(max(req.TimeoutMillis, 1)) * time.Millisecond}, nil
	}
	return resp, nil
}

// durableWait is one partition of a produce response waiting for fsync.
type durableWait struct {
	ti, pi int // where the partition's response is
	p      *partition
	next   int64
	// txnEnd > 0: a transactional batch, acknowledged only once the
	// transaction log is durable up to here too (the record that added
	// the partition to the transaction).
	txnEnd int64
	// role, in cluster mode: the leadership the records were appended
	// under, and truncs the log's truncation count then; with all (acks=-1)
	// answered once the ISR has them.
	role   *replicaRole
	truncs uint64
	all    bool
}

// deferredProduce is an acks=all produce response whose records are
// written but not yet known durable.
type deferredProduce struct {
	*kmsg.ProduceResponse
	s       *Server
	waits   []durableWait
	timeout time.Duration // the request's (cluster mode: replication)
}

// finish waits for every partition's records to be durable and returns the
// response (a partition whose fsync failed answers the storage error).
func (d *deferredProduce) finish() *kmsg.ProduceResponse {
	for _, w := range d.waits {
		var err error
		switch {
		case w.role != nil && w.all:
			err = d.s.cl.waitCommitted(w.p, w.next, w.role, w.truncs, d.timeout)
		case w.role != nil:
			err = d.s.cl.waitLocal(w.p, w.next, w.role, w.truncs)
		default:
			err = w.p.log.WaitDurable(w.next)
		}
		if err == nil && w.txnEnd > 0 {
			err = d.s.txnCoord().WaitDurable(w.txnEnd)
		}
		if err != nil {
			sp := &d.Topics[w.ti].Partitions[w.pi]
			sp.ErrorCode = d.s.errorCode(err)
			sp.BaseOffset = -1
		}
	}
	return d.ProduceResponse
}

var (
	errMultipleBatches = errors.New("produce request carries more than one record batch for a partition")
	errNoRecords       = errors.New("produce request carries no records for a partition")
	errControl         = errors.New("clients may not write control batches")
	errNoTxnID         = errors.New("a transactional batch in a produce request without a transactional id")
)

func (s *Server) produceErrorCode(err error) int16 {
	switch {
	case errors.Is(err, errMultipleBatches), errors.Is(err, errNoRecords), errors.Is(err, errControl), errors.Is(err, errNoTxnID):
		return kerr.InvalidRecord.Code
	case errors.Is(err, txn.ErrInvalidTxnState):
		return kerr.InvalidTxnState.Code
	case errors.Is(err, txn.ErrFenced):
		return kerr.InvalidProducerEpoch.Code
	case errors.Is(err, errInvalidTimestamp):
		return kerr.InvalidTimestamp.Code
	}
	return s.errorCode(err)
}

// produceTo appends one partition's batch and fills the response; it
// returns the offset to wait for (acks=-1), or 0 if there is nothing to wait
// for (a duplicate that is already durable is still waited on: cheap), and
// for a transactional batch the transaction log offset to wait for too.
func (s *Server) produceTo(p *partition, records []byte, sp *kmsg.ProduceResponseTopicPartition, txnID *string, epoch int32, truncs *uint64) (next, txnEnd int64, err error) {
	if len(records) == 0 {
		return 0, 0, errNoRecords
	}
	h, err := log.ParseBatchHeader(records)
	if err != nil {
		return 0, 0, err
	}
	if int(h.Length) < len(records) {
		return 0, 0, errMultipleBatches
	}
	switch {
	case h.Control():
		return 0, 0, errControl
	case h.Transactional() && (txnID == nil || h.ProducerID < 0):
		return 0, 0, errNoTxnID
	}
	st := s.reg.stampsOf(p.topic)
	if st.compact {
		// Before anything is stamped or any producer state looked at: a
		// refused batch leaves the sequences where they were.
		if err := checkKeys(records, &h, st.maxBytes, p.topic.name, p.index); err != nil {
			return 0, 0, err
		}
	}
	if !st.logAppend && h.NumRecords > 0 && h.MaxTimestamp < h.BaseTimestamp {
		// An inconsistent header (sarama sends MaxTimestamp -1): repaired
		// from the records, as Kafka's log validator sets it, so the time
		// index and ListOffsets by time see the batch's real times. Only
		// such batches are read (and decompressed, bounded).
		if err := repairMaxTimestamp(records, &h); err != nil {
			return 0, 0, err
		}
	}
	if !st.logAppend && (st.before < math.MaxInt64 || st.after < math.MaxInt64) {
		if err := checkTimestamps(&h, s.cfg.Now().UnixMilli(), st.before, st.after); err != nil {
			return 0, 0, err
		}
	}
	if st.logAppend {
		// The client's CRC is checked before the stamp recomputes it.
		if _, err := log.CheckBatch(records, 0); err != nil {
			return 0, 0, err
		}
		now := s.cfg.Now().UnixMilli()
		log.SetLogAppendTime(records, now)
		sp.LogAppendTime = now
	}
	log.PatchLeaderEpoch(records, epoch)
	var leads func() error // cluster mode: checked under p.mu with the append
	if s.cl != nil {
		leads = func() error {
			if r := roleOf(p); !r.isLeader || r.epoch != epoch {
				return errNotLeader
			}
			*truncs = p.log.Truncations() // under p.mu, before the append
			return nil
		}
	}
	if h.Transactional() && s.cl == nil {
		var next int64
		txnEnd, err := s.txnCoord().Produce(*txnID, h.ProducerID, h.ProducerEpoch, txn.TP{Topic: p.topic.name, Partition: p.index}, func() error {
			var err error
			next, err = p.appendIdempotent(records, &h, sp, s.cfg.Now().UnixMilli(), leads)
			return err
		})
		return next, txnEnd, err
	}
	if h.ProducerID >= 0 {
		// (In a cluster a transactional batch too: the coordinator is
		// on another broker, cluster_txn.go.)
		next, err := p.appendIdempotent(records, &h, sp, s.cfg.Now().UnixMilli(), leads)
		return next, 0, err
	}
	if leads != nil {
		// A follower's fetcher appends under p.mu too: no append lands
		// once the leadership it was checked under is gone.
		p.mu.Lock()
		defer p.mu.Unlock()
		if err := leads(); err != nil {
			return 0, 0, err
		}
	}
	res, err := p.log.Append(records)
	if err != nil {
		return 0, 0, err
	}
	sp.BaseOffset = res.BaseOffset
	sp.LogStartOffset = res.LogStartOffset
	return res.LastOffset + 1, 0, nil
}

// appendIdempotent checks the batch's sequence and appends it under p.mu
// (released by defer, so a panic cannot leave the partition locked).
func (p *partition) appendIdempotent(records []byte, h *log.BatchHeader, sp *kmsg.ProduceResponseTopicPartition, nowMs int64, leads func() error) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if leads != nil {
		if err := leads(); err != nil {
			return 0, err
		}
	}
	dup, err := p.checkSequence(h)
	if err != nil {
		return 0, err
	}
	if dup >= 0 {
		// Answered as the earlier batch only if this one is whole: a
		// corrupt retry gets its error, as Kafka validates before it
		// looks at sequences (the append would have checked it).
		if _, err := log.CheckBatch(records, 0); err != nil {
			return 0, err
		}
		sp.BaseOffset = dup
		sp.LogStartOffset = p.log.LogStartOffset()
		return dup + int64(h.LastOffsetDelta) + 1, nil
	}
	_, open := p.txnOpen[h.ProducerID]
	begins := h.Transactional() && !open
	if begins {
		// The transaction holds the LSO back from before its first batch
		// is visible: provisionally at the log end (at or below where
		// the batch lands), then at its base offset.
		p.openTxnLocked(h.ProducerID, p.log.LogEndOffset())
	}
	res, err := p.log.Append(records)
	if err != nil {
		if begins {
			delete(p.txnOpen, h.ProducerID)
			p.setFirstOpenLocked()
		}
		return 0, err
	}
	p.recordSequence(&res.Header, nowMs)
	if begins {
		p.txnOpen[h.ProducerID] = res.BaseOffset
		p.setFirstOpenLocked()
	}
	sp.BaseOffset = res.BaseOffset
	sp.LogStartOffset = res.LogStartOffset
	return res.LastOffset + 1, nil
}

// repairMaxTimestamp sets the batch's MaxTimestamp to its greatest record
// timestamp (and its CRC, after checking the client's), in records and h.
func repairMaxTimestamp(records []byte, h *log.BatchHeader) error {
	if _, err := log.CheckBatch(records, 0); err != nil {
		return err
	}
	maxTs := int64(-1)
	if _, _, err := findRecord(records[:h.Length], 0, func(ts int64) bool {
		maxTs = max(maxTs, ts)
		return false
	}); err != nil {
		return fmt.Errorf("%w: %v", log.ErrInvalidBatch, err)
	}
	if maxTs < 0 {
		return nil // no record has a timestamp: nothing to repair
	}
	log.SetMaxTimestamp(records, maxTs)
	h.MaxTimestamp = maxTs
	return nil
}

// stampPolicy is a topic's message.timestamp.type (LogAppendTime or not)
// and how far before and after the broker's clock a CreateTime timestamp
// may be (message.timestamp.before.max.ms, .after.max.ms, each falling back
// to the older message.timestamp.difference.max.ms when not set); and
// whether the topic is compacted (its records must have keys) with its
// max.message.bytes (a larger batch is not read for keys).
type stampPolicy struct {
	logAppend     bool
	before, after int64
	compact       bool
	maxBytes      int
}

// stampPolicyOf derives a topic's stampPolicy from its configs (once per
// change of them, not per produce).
func stampPolicyOf(configs map[string]string) stampPolicy {
	v, _ := configValue(configs, "message.timestamp.type")
	diff := configInt(configs, "message.timestamp.difference.max.ms")
	p := stampPolicy{logAppend: v == "LogAppendTime",
		before: configInt(configs, "message.timestamp.before.max.ms"),
		after:  configInt(configs, "message.timestamp.after.max.ms")}
	p.compact = compacted(configs)
	p.maxBytes = logConfig(configs).MaxMessageBytes
	// As Kafka's LogConfig: before/after when set, else the older bound.
	if p.before == math.MaxInt64 {
		p.before = diff
	}
	if p.after == math.MaxInt64 {
		p.after = diff
	}
	return p
}

// stampsOf reads a topic's stampPolicy.
func (r *registry) stampsOf(t *topic) stampPolicy {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return t.stamps
}

// errInvalidTimestamp: a CreateTime timestamp outside the topic's bounds
// around the broker's clock (INVALID_TIMESTAMP, as Kafka answers).
var errInvalidTimestamp = errors.New("record timestamp outside the topic's message.timestamp bounds")

// checkTimestamps checks a batch's first and greatest timestamps (the
// batch is not decompressed to look at every record) against now: at most
// before ms earlier and after ms later. NO_TIMESTAMP (-1) passes, as in
// Kafka.
func checkTimestamps(h *log.BatchHeader, now, before, after int64) error {
	for _, ts := range []int64{h.BaseTimestamp, h.MaxTimestamp} {
		if ts == -1 {
			continue
		}
		if ts < now-before || after <= math.MaxInt64-now && ts > now+after {
			return fmt.Errorf("%w: %d, broker time %d (at most %d ms before, %d ms after)", errInvalidTimestamp, ts, now, before, after)
		}
	}
	return nil
}
