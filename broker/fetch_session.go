package broker

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Incremental fetch sessions (KIP-227), kept as Kafka's FetchSession /
// FetchManager keep them:
//
//   - A full fetch (session epoch 0) may open a session: the broker caches
//     the request's partitions (fetch offset, partition max bytes, log start
//     offset) with what it answered for each (high watermark, last stable
//     offset, log start offset), and answers a random non-zero session id.
//     Epoch -1 is a full fetch without a session. A full fetch naming a
//     session id closes that session first.
//   - An incremental fetch (id and the session's next epoch) names only the
//     partitions to add or update, and ForgottenTopics those to drop (by name
//     below v13, by topic id from v13). The broker reads every partition of
//     the session, and answers only those with news (maybeUpdateResponseData
//     in Kafka): records, a changed high watermark, last stable offset or log
//     start offset, or an error (after an error the next answer is always
//     sent). Partitions that returned records move to the back of the
//     session's read order, so a response cut short by MaxBytes serves the
//     others next time. The epoch advances per incremental request (after
//     MaxInt32, 1). A session emptied by ForgottenTopics is closed and the
//     request answered as a sessionless fetch (session id 0).
//   - Sessions are not tied to a connection (Kafka's semantics): any
//     connection may use an id. Authorization is not cached: every request
//     checks READ on every topic of the session (fetchOnce), so a session
//     opened by one principal gives another nothing. A v13+ session keeps the
//     name each topic id had when it was added: if the topic is deleted, the
//     partition answers UNKNOWN_TOPIC_OR_PARTITION; if a topic of that name
//     exists again under another id, INCONSISTENT_TOPIC_ID; an id never known
//     answers UNKNOWN_TOPIC_ID.
//   - Errors (top level, no partitions, session id 0): an unknown id
//     FETCH_SESSION_ID_NOT_FOUND; another epoch than the session's next one,
//     or a session used by a second request before the first was answered,
//     INVALID_FETCH_SESSION_EPOCH (the session stays); a session opened below
//     v13 used at v13+ or the reverse, FETCH_SESSION_TOPIC_ID_ERROR.
//   - Bounds: the cache holds Config.FetchSessionCacheSlots sessions (Kafka's
//     max.incremental.fetch.session.cache.slots, 1000). With no free slot a
//     new session evicts, as Kafka's FetchSessionCache.tryEvict does, the
//     least recently used session if it has been idle longer than
//     fetchSessionEvictAge (Kafka's min.incremental.fetch.session.eviction.ms,
//     2 min), else the smallest session older than that if the new one has
//     more partitions; else the full fetch is answered without a session. A
//     session holds at most maxSessionPartitions partitions and all sessions
//     together maxCachedPartitions (Kafka has neither bound; about 200 bytes
//     each): a full fetch past them gets no session, and an incremental fetch
//     that would grow its session past them closes it and is answered
//     FETCH_SESSION_ID_NOT_FOUND, so the client starts over with a full fetch.

var (
	// maxSessionPartitions bounds the partitions of one session.
	maxSessionPartitions = 100_000
	// maxCachedPartitions bounds the partitions of all sessions together.
	maxCachedPartitions = 1_000_000
	// fetchSessionEvictAge is Kafka's min.incremental.fetch.session.eviction.ms:
	// a session idle longer may be evicted for any new one, and a session
	// older than that for a larger one.
	fetchSessionEvictAge = 2 * time.Minute
)

// fetchSessionCache holds the broker's fetch sessions. Lock order: the
// cache's mu before a session's mu, never the other way.
type fetchSessionCache struct {
	mu         sync.Mutex
	sessions   map[int32]*fetchSession
	lru, mru   *fetchSession // the least and most recently used sessions
	evictable  sessionHeap   // sessions older than fetchSessionEvictAge at their last use, smallest first
	partitions int           // the cachedSize of every session
	evictions  int64
}

// fetchSession is one session: the partitions a client fetches, in read
// order.
type fetchSession struct {
	id      int32
	byID    bool // opened by a v13+ request: partitions are keyed by topic id
	created time.Time

	// The cache's fields (fetchSessionCache.mu).
	inCache      bool
	lastUsed     time.Time
	older, newer *fetchSession // neighbours in the cache's use order
	heapIdx      int           // in the cache's evictable heap, -1 if not there
	cachedSize   int           // partitions at the last use

	mu         sync.Mutex
	epoch      int32 // the epoch the next incremental request must carry
	parts      map[sessionKey]*sessionPart
	head, tail *sessionPart // read order
}

// sessionKey names a session's partition: by topic id in v13+ sessions, by
// topic name below.
type sessionKey struct {
	id    [16]byte
	topic string
	part  int32
}

// sessionPart is one partition of a session: the request's fields and what
// the last answer said.
type sessionPart struct {
	key                         sessionKey
	name                        string // v13+: the topic's name when added ("" if the id was unknown)
	offset, logStart            int64
	maxBytes                    int32
	leaderEpoch, lastFetchEpoch int32
	hw, lso, lst                int64 // as last answered; hw -1 forces the next answer
	prev, next                  *sessionPart
}

// fetchCtx is what openFetchSession decided for one request.
type fetchCtx struct {
	create bool          // a full fetch that may open a session
	sess   *fetchSession // an incremental fetch's session
	epoch  int32         // the session's epoch once this request is answered
	parts  [][]*sessionPart
}

// sessionSlots is how many sessions the cache may hold (0: none).
func (s *Server) sessionSlots() int { return max(s.cfg.FetchSessionCacheSlots, 0) }

// openFetchSession applies req's session fields. It returns what to read (req
// itself, or for an incremental fetch every partition of the session) or a
// top-level error code.
func (s *Server) openFetchSession(req *kmsg.FetchRequest) (fc fetchCtx, read *kmsg.FetchRequest, code int16) {
	if req.Version < 7 {
		return fc, req, 0
	}
	cache := &s.fetchSessions
	if req.SessionEpoch == 0 || req.SessionEpoch == -1 { // a full fetch
		if req.SessionID != 0 {
			cache.mu.Lock()
			if sess := cache.sessions[req.SessionID]; sess != nil {
				cache.removeLocked(sess)
			}
			cache.mu.Unlock()
		}
		fc.create = req.SessionEpoch == 0 && s.sessionSlots() > 0
		return fc, req, 0
	}
	now := s.cfg.Now()
	cache.mu.Lock()
	sess := cache.sessions[req.SessionID]
	if sess == nil {
		cache.mu.Unlock()
		return fc, nil, kerr.FetchSessionIDNotFound.Code
	}
	sess.mu.Lock()
	switch {
	case sess.epoch != req.SessionEpoch:
		code = kerr.InvalidFetchSessionEpoch.Code
	case sess.byID != (req.Version >= 13):
		code = kerr.FetchSessionTopicIDError.Code
	}
	if code != 0 {
		sess.mu.Unlock()
		cache.mu.Unlock()
		return fc, nil, code
	}
	limit := min(maxSessionPartitions, maxCachedPartitions-(cache.partitions-sess.cachedSize))
	if !sess.update(s, req, limit) {
		cache.removeLocked(sess)
		sess.mu.Unlock()
		cache.mu.Unlock()
		return fc, nil, kerr.FetchSessionIDNotFound.Code
	}
	if len(sess.parts) == 0 {
		cache.removeLocked(sess)
		sess.mu.Unlock()
		cache.mu.Unlock()
		return fc, req, 0
	}
	cache.touchLocked(sess, now)
	sess.epoch = nextSessionEpoch(sess.epoch)
	cache.mu.Unlock()
	fc.sess, fc.epoch = sess, sess.epoch
	read, fc.parts = sess.request(s, req)
	sess.mu.Unlock()
	return fc, read, 0
}

// finishFetchSession completes resp, the answer to what openFetchSession
// said to read: the session id, and for an incremental fetch only the
// partitions with news.
func (s *Server) finishFetchSession(fc fetchCtx, req *kmsg.FetchRequest, resp *fetchResponse) kmsg.Response {
	switch {
	case fc.sess != nil:
		return fc.sess.answer(fc, resp)
	case fc.create:
		resp.SessionID = s.createFetchSession(req, resp)
	}
	return resp
}

func nextSessionEpoch(e int32) int32 {
	if e == math.MaxInt32 {
		return 1
	}
	return e + 1
}

// update applies an incremental request's partitions and forgotten topics
// (s.mu held). It returns false if the session would hold more than limit
// partitions.
func (sess *fetchSession) update(s *Server, req *kmsg.FetchRequest, limit int) bool {
	for i := range req.Topics {
		rt := &req.Topics[i]
		name, resolved := "", false
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			k := sess.key(rt.Topic, rt.TopicID, rp.Partition)
			p := sess.parts[k]
			if p == nil {
				if len(sess.parts) >= limit {
					return false
				}
				if sess.byID && !resolved {
					if t := s.reg.getByID(rt.TopicID); t != nil {
						name = t.name
					}
					resolved = true
				}
				p = &sessionPart{key: k, name: name, hw: -1, lso: -1, lst: -1}
				sess.parts[k] = p
				sess.pushBack(p)
			}
			p.set(rp)
		}
	}
	for _, ft := range req.ForgottenTopics {
		for _, part := range ft.Partitions {
			k := sess.key(ft.Topic, ft.TopicID, part)
			if p := sess.parts[k]; p != nil {
				delete(sess.parts, k)
				sess.unlink(p)
			}
		}
	}
	return true
}

func (sess *fetchSession) key(topic string, id [16]byte, part int32) sessionKey {
	if sess.byID {
		return sessionKey{id: id, part: part}
	}
	return sessionKey{topic: topic, part: part}
}

func (p *sessionPart) set(rp *kmsg.FetchRequestTopicPartition) {
	p.offset, p.logStart, p.maxBytes = rp.FetchOffset, rp.LogStartOffset, rp.PartitionMaxBytes
	p.leaderEpoch, p.lastFetchEpoch = rp.CurrentLeaderEpoch, rp.LastFetchedEpoch
}

func (sess *fetchSession) pushBack(p *sessionPart) {
	p.prev, p.next = sess.tail, nil
	if sess.tail != nil {
		sess.tail.next = p
	} else {
		sess.head = p
	}
	sess.tail = p
}

func (sess *fetchSession) unlink(p *sessionPart) {
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		sess.head = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	} else {
		sess.tail = p.prev
	}
	p.prev, p.next = nil, nil
}

// sameTopic reports whether a and b belong to one topic entry of a request.
func (sess *fetchSession) sameTopic(a, b *sessionPart) bool {
	if sess.byID {
		return a.key.id == b.key.id
	}
	return a.key.topic == b.key.topic
}

// request is req with the session's partitions, in read order, as its topics
// (a topic appears once per run of its partitions), and the partitions behind
// each topic entry (s.mu held). In a v13+ session each entry also carries the
// name its id had when added (fetchOnce answers by it when the id no longer
// resolves); an entry added with an id unknown then is resolved again.
func (sess *fetchSession) request(s *Server, req *kmsg.FetchRequest) (*kmsg.FetchRequest, [][]*sessionPart) {
	runs := 0
	for p := sess.head; p != nil; p = p.next {
		if p.prev == nil || !sess.sameTopic(p.prev, p) {
			runs++
		}
	}
	read := *req
	read.ForgottenTopics = nil
	read.Topics = make([]kmsg.FetchRequestTopic, 0, runs)
	rps := make([]kmsg.FetchRequestTopicPartition, len(sess.parts))
	ptrs := make([]*sessionPart, len(sess.parts))
	parts := make([][]*sessionPart, 0, runs)
	i, start := 0, 0
	for p := sess.head; p != nil; p = p.next {
		if p.prev == nil || !sess.sameTopic(p.prev, p) {
			if len(read.Topics) > 0 {
				read.Topics[len(read.Topics)-1].Partitions = rps[start:i:i]
				parts = append(parts, ptrs[start:i:i])
			}
			start = i
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic, rt.TopicID = p.key.topic, p.key.id
			if sess.byID {
				if p.name == "" {
					if t := s.reg.getByID(p.key.id); t != nil {
						p.name = t.name
					}
				}
				rt.Topic = p.name
			}
			read.Topics = append(read.Topics, rt)
		}
		rp := &rps[i]
		rp.Default()
		rp.Partition, rp.FetchOffset, rp.LogStartOffset, rp.PartitionMaxBytes = p.key.part, p.offset, p.logStart, p.maxBytes
		rp.CurrentLeaderEpoch, rp.LastFetchedEpoch = p.leaderEpoch, p.lastFetchEpoch
		ptrs[i] = p
		i++
	}
	if len(read.Topics) > 0 {
		read.Topics[len(read.Topics)-1].Partitions = rps[start:i:i]
		parts = append(parts, ptrs[start:i:i])
	}
	return &read, parts
}

// news records what resp says of p and reports whether the answer must carry
// the partition (Kafka's CachedPartition.maybeUpdateResponseData).
func (p *sessionPart) news(sp *kmsg.FetchResponseTopicPartition, records bool) bool {
	must := records
	if p.hw != sp.HighWatermark {
		p.hw, must = sp.HighWatermark, true
	}
	if p.lso != sp.LastStableOffset {
		p.lso, must = sp.LastStableOffset, true
	}
	if p.lst != sp.LogStartOffset {
		p.lst, must = sp.LogStartOffset, true
	}
	if sp.ErrorCode != 0 {
		p.hw, must = -1, true // answered again once the error is gone
	}
	return must
}

// answer keeps the partitions of resp (read from fc.parts) that have news,
// records what they said, and moves those that returned records to the back
// of the read order.
func (sess *fetchSession) answer(fc fetchCtx, resp *fetchResponse) kmsg.Response {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.epoch != fc.epoch {
		// Another request used the session meanwhile (Kafka checks this
		// too): its partitions' state is that request's now.
		resp.release()
		out := kmsg.NewPtrFetchResponse()
		out.Version = resp.Version
		out.ErrorCode = kerr.InvalidFetchSessionEpoch.Code
		return out
	}
	var moved []*sessionPart
	topics, reads, cold := resp.Topics[:0], resp.reads[:0], resp.cold[:0]
	for ti := range resp.Topics {
		st := resp.Topics[ti]
		tr, tc := resp.reads[ti], resp.cold[ti]
		var parts []*sessionPart
		if ti < len(fc.parts) {
			parts = fc.parts[ti]
		}
		n, j := 0, 0
		for pi := range st.Partitions {
			sp := &st.Partitions[pi]
			for j < len(parts) && parts[j].key.part != sp.Partition {
				j++
			}
			records := resp.recLen(ti, pi) > 0
			if j < len(parts) {
				p := parts[j]
				j++
				if !p.news(sp, records) {
					if tr[pi] != nil {
						tr[pi].Release()
					}
					tc[pi].Release()
					continue
				}
				if records {
					moved = append(moved, p)
				}
			}
			st.Partitions[n], tr[n], tc[n] = st.Partitions[pi], tr[pi], tc[pi]
			n++
		}
		if n == 0 {
			continue
		}
		st.Partitions, tr, tc = st.Partitions[:n], tr[:n], tc[:n]
		if k := len(topics) - 1; k >= 0 && topics[k].Topic == st.Topic && topics[k].TopicID == st.TopicID {
			// Two runs of one topic met once the partitions between them
			// were left out: one entry.
			topics[k].Partitions = append(topics[k].Partitions, st.Partitions...)
			reads[k], cold[k] = append(reads[k], tr...), append(cold[k], tc...)
			continue
		}
		topics, reads, cold = append(topics, st), append(reads, tr), append(cold, tc)
	}
	resp.Topics, resp.reads, resp.cold = topics, reads, cold
	for _, p := range moved {
		if sess.parts[p.key] == p && p != sess.tail {
			sess.unlink(p)
			sess.pushBack(p)
		}
	}
	resp.SessionID = sess.id
	return resp
}

// createFetchSession opens a session for the full fetch req answered by
// resp, if the cache has room (or makes some), and returns its id (0 for
// none).
func (s *Server) createFetchSession(req *kmsg.FetchRequest, resp *fetchResponse) int32 {
	size := 0
	for i := range resp.Topics {
		size += len(resp.Topics[i].Partitions)
	}
	if size > maxSessionPartitions {
		return 0
	}
	cache := &s.fetchSessions
	now := s.cfg.Now()
	slots := s.sessionSlots()
	cache.mu.Lock()
	room := cache.roomLocked(size, slots, now)
	cache.mu.Unlock()
	if !room {
		return 0
	}
	sess := &fetchSession{byID: req.Version >= 13, epoch: 1, heapIdx: -1, parts: make(map[sessionKey]*sessionPart, size)}
	for ti := range req.Topics {
		rt := &req.Topics[ti]
		var st *kmsg.FetchResponseTopic
		if ti < len(resp.Topics) {
			st = &resp.Topics[ti]
		}
		name := ""
		if sess.byID {
			if t := s.reg.getByID(rt.TopicID); t != nil {
				name = t.name
			}
		}
		k := 0
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			key := sess.key(rt.Topic, rt.TopicID, rp.Partition)
			if sess.parts[key] != nil {
				continue // named twice: read and answered once
			}
			if len(sess.parts) >= maxSessionPartitions {
				return 0
			}
			p := &sessionPart{key: key, name: name, hw: -1, lso: -1, lst: -1}
			p.set(rp)
			if st != nil {
				for k < len(st.Partitions) && st.Partitions[k].Partition != rp.Partition {
					k++
				}
				if k < len(st.Partitions) {
					p.news(&st.Partitions[k], false)
					k++
				}
			}
			sess.parts[key] = p
			sess.pushBack(p)
		}
	}
	return cache.add(sess, slots, now)
}

// roomLocked reports whether a session of size partitions fits, evicting one
// session if that is what makes room.
func (c *fetchSessionCache) roomLocked(size, slots int, now time.Time) bool {
	for len(c.sessions) >= slots || c.partitions+size > maxCachedPartitions {
		if !c.evictLocked(size, now) {
			return false
		}
	}
	return true
}

// evictLocked evicts a session to make room for one of size partitions, as
// Kafka's FetchSessionCache.tryEvict: the least recently used one if idle
// longer than fetchSessionEvictAge, else the smallest of those older than
// that if it is smaller than size.
func (c *fetchSessionCache) evictLocked(size int, now time.Time) bool {
	if c.lru == nil {
		return false
	}
	victim := c.lru
	if now.Sub(victim.lastUsed) <= fetchSessionEvictAge {
		if len(c.evictable) == 0 || c.evictable[0].cachedSize >= size {
			return false
		}
		victim = c.evictable[0]
	}
	c.removeLocked(victim)
	c.evictions++
	return true
}

// add puts sess in the cache under a new id and returns it (0 if there is no
// room any more).
func (c *fetchSessionCache) add(sess *fetchSession, slots int, now time.Time) int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.roomLocked(len(sess.parts), slots, now) {
		return 0
	}
	if c.sessions == nil {
		c.sessions = make(map[int32]*fetchSession)
	}
	for {
		sess.id = rand.Int32N(math.MaxInt32-1) + 1 // [1, MaxInt32-1], as Kafka
		if c.sessions[sess.id] == nil {
			break
		}
	}
	sess.created, sess.inCache = now, true
	c.sessions[sess.id] = sess
	c.touchLocked(sess, now) // sess is not shared yet: no need for its lock
	return sess.id
}

// touchLocked marks sess used now (c.mu and sess.mu held, or sess not shared
// yet).
func (c *fetchSessionCache) touchLocked(sess *fetchSession, now time.Time) {
	if c.mru != sess {
		c.unlinkLocked(sess)
		sess.older = c.mru
		if c.mru != nil {
			c.mru.newer = sess
		} else {
			c.lru = sess
		}
		c.mru = sess
	}
	sess.lastUsed = now
	c.partitions += len(sess.parts) - sess.cachedSize
	sess.cachedSize = len(sess.parts)
	switch evictable := now.Sub(sess.created) > fetchSessionEvictAge; {
	case evictable && sess.heapIdx < 0:
		heap.Push(&c.evictable, sess)
	case evictable:
		heap.Fix(&c.evictable, sess.heapIdx)
	case sess.heapIdx >= 0: // the clock went back
		heap.Remove(&c.evictable, sess.heapIdx)
	}
}

func (c *fetchSessionCache) unlinkLocked(sess *fetchSession) {
	if sess.older == nil && sess.newer == nil && c.lru != sess {
		return // not linked
	}
	if sess.older != nil {
		sess.older.newer = sess.newer
	} else {
		c.lru = sess.newer
	}
	if sess.newer != nil {
		sess.newer.older = sess.older
	} else {
		c.mru = sess.older
	}
	sess.older, sess.newer = nil, nil
}

// removeLocked takes sess out of the cache (its id answers
// FETCH_SESSION_ID_NOT_FOUND from now on).
func (c *fetchSessionCache) removeLocked(sess *fetchSession) {
	if !sess.inCache {
		return
	}
	sess.inCache = false
	delete(c.sessions, sess.id)
	c.unlinkLocked(sess)
	if sess.heapIdx >= 0 {
		heap.Remove(&c.evictable, sess.heapIdx)
	}
	c.partitions -= sess.cachedSize
	sess.cachedSize = 0
}

// stats returns the sessions cached, their partitions and the evictions so
// far (for /metrics).
func (c *fetchSessionCache) stats() (sessions, partitions int, evictions int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sessions), c.partitions, c.evictions
}

// sessionHeap orders sessions by size, then id (Kafka's EvictableKey).
type sessionHeap []*fetchSession

func (h sessionHeap) Len() int { return len(h) }
func (h sessionHeap) Less(i, j int) bool {
	if h[i].cachedSize != h[j].cachedSize {
		return h[i].cachedSize < h[j].cachedSize
	}
	return h[i].id < h[j].id
}
func (h sessionHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *sessionHeap) Push(x any) {
	sess := x.(*fetchSession)
	sess.heapIdx = len(*h)
	*h = append(*h, sess)
}
func (h *sessionHeap) Pop() any {
	old := *h
	sess := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	sess.heapIdx = -1
	return sess
}
