package broker

import (
	"errors"
	"math"
	"reflect"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

// Fetch: v4-17
//
// Behavior:
//   - Each partition returns whole batches from the one containing the fetch
//     offset, up to the partition's max bytes and the response's MaxBytes (at
//     most 55 MiB, Kafka's fetch.max.bytes); the first batch of the response
//     is returned whatever its size (KIP-74).
//   - Long poll: with fewer than MinBytes available the request waits up to
//     MaxWaitMs (at most 30 s), woken by appends (the high watermark moving)
//     on any of its partitions, by a cold chunk landing, or by shutdown.
//   - A partition named more than once in a request is read and answered
//     once (Kafka keeps fetch data in a map).
//   - Offsets below the local start are read from the tiered store; a chunk
//     not cached yet is downloaded in the background and the partition
//     answers empty meanwhile, so the bucket never stalls the others. While
//     the tail guard has lowered the cold-read rate, a response carries at
//     most 1 MiB of cold data (or one larger batch), and cold partitions
//     answer empty and long-poll while the cold bytes served are ahead of
//     the rate (tiering.Tier.ServeCold).
//   - Bytes are bounded by the high watermark (the durable end under the
//     durable policy). Every partition answers its last stable offset
//     (LSO: the first offset of its oldest open transaction, else the high
//     watermark).
//   - read_committed (isolation level 1) stops at the LSO and answers the
//     aborted transactions overlapping the batches returned (producer id
//     and first offset, from the log's aborted-transaction index, local
//     and, for cold reads, the bucket's copy; a cold range whose index is
//     not in memory yet answers empty until it is). Clients drop those
//     records and every control batch.
//   - OFFSET_OUT_OF_RANGE below the log start or past the log end.
//   - Incremental fetch sessions (KIP-227, v7+; fetch_session.go has the
//     rules): a full fetch at epoch 0 opens a session if the cache has room
//     (--max-incremental-fetch-session-cache-slots, Kafka's eviction), epoch
//     -1 fetches without one, and a full fetch naming a session closes it.
//     An incremental fetch adds or updates the partitions it names, drops
//     its ForgottenTopics, reads (and long-polls on) every partition of the
//     session and answers only those with news: records, a changed high
//     watermark, last stable or log start offset, or an error. READ is
//     checked on every partition of every request, whoever opened the
//     session. Unknown id: FETCH_SESSION_ID_NOT_FOUND; wrong epoch:
//     INVALID_FETCH_SESSION_EPOCH; a session's partitions are bounded
//     (growing past the bound closes it: FETCH_SESSION_ID_NOT_FOUND). With
//     the cache at 0 slots every response has session id 0.
//   - Rack is accepted; there is no preferred read replica.
//   - Record bytes are not copied into the response: it carries the segment
//     file ranges, and the connection sends them with sendfile(2)
//     (sendfile.go); a partition without data gets empty (not null) records.
//
// Version notes:
//   - v7+: fetch sessions.
//   - v13+: topics by id (UNKNOWN_TOPIC_ID); in a session, a partition whose
//     topic was deleted answers UNKNOWN_TOPIC_OR_PARTITION, and once a topic
//     of that name exists again INCONSISTENT_TOPIC_ID (Kafka's codes).
func (s *Server) handleFetch(c *conn, req *kmsg.FetchRequest) (kmsg.Response, error) {
	if (req.ReplicaID >= 0 || req.ReplicaState.ID >= 0) && !c.allowedCluster(opClusterAction) {
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		return resp, nil
	}
	if (req.ReplicaID >= 0 || req.ReplicaState.ID >= 0) && s.cl != nil {
		return s.cl.handleReplicaFetch(req), nil // a follower (cluster_replica.go)
	}
	fc, read, code := s.openFetchSession(req)
	if code != 0 {
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		resp.ErrorCode = code
		return resp, nil
	}
	resp := s.fetchWait(c, read)
	if r := c.quotaFetch(fc, req, resp); r != nil {
		return r, nil // over a client quota: throttled, no data (quotas.go)
	}
	return s.finishFetchSession(fc, req, resp), nil
}

// fetchWait reads req's partitions, waiting as MinBytes and MaxWaitMillis
// ask (the long poll).
func (s *Server) fetchWait(c *conn, req *kmsg.FetchRequest) *fetchResponse {
	var deadline time.Time
	if req.MaxWaitMillis > 0 {
		deadline = time.Now().Add(min(time.Duration(req.MaxWaitMillis)*time.Millisecond, maxFetchWait))
	}
	for {
		resp, bytes, waitOn, tails := s.fetchOnce(c, req)
		if bytes >= int64(req.MinBytes) || deadline.IsZero() || len(waitOn) == 0 || s.ctx.Err() != nil {
			return resp
		}
		left := time.Until(deadline)
		if left <= 0 {
			return resp
		}
		resp.release() // read again after the wait
		waited := time.Now()
		i := s.waitAny(waitOn, left)
		c.parkedSince(waited) // not handler time (request_percentage)
		if i < 0 {
			// Timed out: answer with what there is now (new data may have
			// arrived between the last read and the wait).
			resp, _, _, _ = s.fetchOnce(c, req)
			return resp
		}
		if p := tails[i]; p != nil && s.cfg.Tier != nil {
			// A tail consumer woken by an append: how long it took to run
			// again tells the tail guard whether cold reads crowd it out.
			// (A wake before the wait began measures the read, not the
			// wait: not a sample.)
			if at := p.WokeAt(); !at.Before(waited) {
				s.cfg.Tier.ObserveTail(tiering.TailWake, time.Since(at))
			}
		}
	}
}

// fetchMaxBytes is Kafka's fetch.max.bytes default: a response carries at
// most this many record bytes (or one larger first batch) whatever
// MaxBytes asks; a response near 2 GiB would not fit its int32 size with
// its per-partition headers, and the client would ask again for ever.
var fetchMaxBytes int64 = 55 << 20 // a variable for tests

// maxFetchWait bounds a long poll whatever MaxWaitMillis asks (up to 24
// days): nothing notices a client that went away while its fetch waits, so
// this is how long the request can outlive it. An empty answer before
// MaxWait is always allowed; clients just fetch again. (Clients wait 0.5 s
// to 5 s by default.)
var maxFetchWait = 30 * time.Second // a variable for tests

// fetchOnce reads every requested partition once. It returns the response,
// the record bytes in it and the notify channels (taken before reading, so no
// append between the read and the wait is missed) of partitions that could
// still grow, with, for each channel, the partition log it belongs to if the
// read there was a local one (a tail read), else nil.
func (s *Server) fetchOnce(c *conn, req *kmsg.FetchRequest) (*fetchResponse, int64, []<-chan struct{}, []*log.Partition) {
	resp := &fetchResponse{FetchResponse: req.ResponseKind().(*kmsg.FetchResponse)}
	var total, coldBytes int64
	var waitOn []<-chan struct{}
	var tails []*log.Partition
	maxBytes := int64(req.MaxBytes)
	if maxBytes <= 0 || maxBytes > fetchMaxBytes {
		maxBytes = fetchMaxBytes
	}
	committed := req.IsolationLevel == 1 // read_committed
	var seen map[*partition]bool         // partitions read so far, once there are two
	var first *partition
	for _, rt := range req.Topics {
		st := kmsg.NewFetchResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		reads := make([]*log.ReadResult, 0, len(rt.Partitions))
		cold := make([]*tiering.ColdRead, len(rt.Partitions))
		var t *topic
		code := int16(0)
		virtual := false // the virtual __consumer_offsets (internal_topics.go)
		if req.Version >= 13 {
			if t = s.reg.getByID(rt.TopicID); t == nil && rt.Topic != "" {
				// A fetch session's partition (a v13 request carries no
				// names): the topic its id named is gone (Kafka's codes).
				switch {
				case !c.allowed(opRead, resTopic, rt.Topic):
					code = kerr.TopicAuthorizationFailed.Code
				case s.reg.get(rt.Topic) == nil:
					code = kerr.UnknownTopicOrPartition.Code
				default: // deleted and created again
					code = kerr.InconsistentTopicID.Code
				}
			} else if t == nil {
				code = kerr.UnknownTopicID.Code
				virtual = s.virtualOffsetsID(rt.TopicID) && c.allowed(opRead, resTopic, offsetsTopic)
			} else if !c.allowed(opRead, resTopic, t.name) {
				t, code = nil, kerr.TopicAuthorizationFailed.Code
			}
		} else if !c.allowed(opRead, resTopic, rt.Topic) {
			code = kerr.TopicAuthorizationFailed.Code
		} else if t = s.reg.get(rt.Topic); t == nil {
			code = kerr.UnknownTopicOrPartition.Code
			virtual = s.virtualOffsets(rt.Topic)
		}
		if virtual {
			fetchOffsetsTopic(&rt, &st)
			resp.reads = append(resp.reads, make([]*log.ReadResult, len(rt.Partitions)))
			resp.cold = append(resp.cold, cold)
			resp.Topics = append(resp.Topics, st)
			continue
		}
		for _, rp := range rt.Partitions {
			sp := kmsg.NewFetchResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = -1, -1, -1
			sp.PreferredReadReplica = -1
			var p *partition
			if t != nil {
				if p = s.reg.partition(t, rp.Partition); p == nil {
					code = kerr.UnknownTopicOrPartition.Code
				}
			}
			if p == nil {
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
				reads = append(reads, nil)
				continue
			}
			if s.cl != nil {
				if lc, r := s.cl.leaderCheck(p, rp.CurrentLeaderEpoch); lc != 0 {
					sp.ErrorCode = lc
					s.cl.fetchLeaderHint(resp.FetchResponse, &sp, r)
					st.Partitions = append(st.Partitions, sp)
					reads = append(reads, nil)
					continue
				}
			}
			// A partition named again in the same request is read once, as
			// Kafka does (its fetch data is a map): a request naming one
			// partition half a million times is one read, one wait.
			switch {
			case first == nil:
				first = p
			case seen == nil:
				if p == first {
					continue
				}
				seen = map[*partition]bool{first: true, p: true}
			case seen[p]:
				continue
			default:
				seen[p] = true
			}
			waitOn = append(waitOn, p.log.Notify())
			tails = append(tails, p.log)
			budget := min(int64(rp.PartitionMaxBytes), maxBytes-total)
			var res *log.ReadResult
			var err error
			stop := int64(math.MaxInt64) // read_uncommitted: up to the high watermark
			if committed {
				stop = p.lastStable(p.log.HighWatermark())
			}
			if total == 0 {
				// Nothing returned yet: the first batch goes whatever its size.
				res, err = p.log.ReadStable(rp.FetchOffset, max(budget, 1), stop)
			} else if budget > 0 {
				res, err = p.log.ReadAtMostStable(rp.FetchOffset, budget, stop)
			}
			if errors.Is(err, log.ErrNotLocal) && s.cfg.Tier != nil && (budget > 0 || total == 0) {
				// Below the local start: served from the bucket (paced
				// while the tail guard has lowered the cold-read rate).
				var b *tiering.ColdRead
				var wait <-chan struct{}
				capBytes, later := s.cfg.Tier.ServeCold()
				if capBytes > 0 {
					budget = min(budget, capBytes-coldBytes)
				}
				if committed && rp.FetchOffset >= stop { // stop: the LSO read above
					// read_committed at the LSO: nothing to serve yet.
					wait, err = nil, nil
				} else if later != nil || (capBytes > 0 && budget <= 0 && total > 0) {
					// Cold reads are ahead of the rate, or this response
					// has its share of cold bytes: empty for now.
					wait, err = later, nil
				} else {
					b, wait, err = s.coldRead(p, rp.FetchOffset, max(budget, 1), stop)
				}
				if err == nil && b != nil && b.Len == 0 {
					// Compaction left nothing in the bucket from here on:
					// the records go on in the local log.
					next := b.Next
					b.Release()
					b = nil
					if total == 0 {
						res, err = p.log.ReadStable(next, max(budget, 1), stop)
					} else {
						res, err = p.log.ReadAtMostStable(next, budget, stop)
					}
					if errors.Is(err, log.ErrNotLocal) {
						res, err = nil, nil // released meanwhile: empty now, the next fetch reads it cold
					}
				} else if err == nil {
					tails[len(tails)-1] = nil
					if wait != nil {
						waitOn = append(waitOn, wait)
						tails = append(tails, nil)
					}
					sp.HighWatermark = p.log.HighWatermark()
					sp.LastStableOffset, sp.LogStartOffset = p.lastStable(sp.HighWatermark), p.log.LogStartOffset()
					cold[len(reads)] = b
					if b != nil && committed {
						if sp.AbortedTransactions, wait, err = s.coldAborted(p, rp.FetchOffset, b.Next); err != nil || wait != nil {
							// The bucket's aborted index for this range
							// is not in memory yet: empty until it is.
							b.Release()
							b, cold[len(reads)], sp.AbortedTransactions = nil, nil, nil
							if wait != nil {
								waitOn = append(waitOn, wait)
								tails = append(tails, nil)
							}
						}
					}
					if b != nil {
						total += b.Len
						coldBytes += b.Len
						s.cfg.Tier.ChargeCold(b.Len)
					}
					st.Partitions = append(st.Partitions, sp)
					reads = append(reads, nil)
					continue
				}
			}
			if isResource(err) {
				// No descriptor for this partition now: it answers empty
				// (this response serves fewer partitions) and the next
				// fetch reads it.
				err = nil
			}
			switch {
			case err != nil:
				sp.ErrorCode = s.errorCode(err)
				sp.HighWatermark = p.log.HighWatermark()
				sp.LastStableOffset = p.lastStable(sp.HighWatermark)
				sp.LogStartOffset = p.log.LogStartOffset()
				res = nil
			case res == nil: // response budget spent
				sp.HighWatermark = p.log.HighWatermark()
				sp.LastStableOffset = p.lastStable(sp.HighWatermark)
				sp.LogStartOffset = p.log.LogStartOffset()
			default:
				sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = res.HighWatermark, p.lastStable(res.HighWatermark), res.LogStartOffset
				if committed && res.Bytes > 0 {
					if sp.AbortedTransactions, err = p.abortedIn(rp.FetchOffset, res.NextOffset); err != nil {
						// No aborted index to answer with: nothing from
						// this partition now (never records without it).
						sp.AbortedTransactions = nil
						res.Bytes = 0
					}
				}
				total += res.Bytes
				if res.Bytes == 0 {
					res.Release()
					res = nil
				}
			}
			st.Partitions = append(st.Partitions, sp)
			reads = append(reads, res)
		}
		resp.reads = append(resp.reads, reads)
		resp.cold = append(resp.cold, cold)
		resp.Topics = append(resp.Topics, st)
	}
	return resp, total, waitOn, tails
}

// waitAny waits until one of chans closes and returns its index, or returns
// -1 when d passes or the server shuts down.
func (s *Server) waitAny(chans []<-chan struct{}, d time.Duration) int {
	timer := time.NewTimer(d)
	defer timer.Stop()
	if len(chans) == 1 {
		select {
		case <-chans[0]:
			return 0
		case <-timer.C:
		case <-s.ctx.Done():
		}
		return -1
	}
	cases := make([]reflect.SelectCase, 0, len(chans)+2)
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.ctx.Done())})
	for _, ch := range chans {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
	}
	i, _, _ := reflect.Select(cases)
	return i - 2
}
