package broker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/protocol"
)

// Client quotas (KIP-13, KIP-55, KIP-124, KIP-219, KIP-546), as one Kafka
// broker's ClientQuotaManager enforces them:
//
//   - Entities are user, client-id (each a name or the default) and their
//     pair, and ip (connection_creation_rate only: stored and described,
//     not enforced). Set with AlterClientQuotas, in quotas.json (written
//     atomically before the change applies, mirrored to the bucket and
//     restored from it as acls.json is).
//   - producer_byte_rate (Produce request bytes), consumer_byte_rate (Fetch
//     response bytes) and request_percentage (handler time, as a share of
//     one thread) apply to a client (principal, client id) from the most
//     specific entity that sets the key, in Kafka's order: user+client-id,
//     user+default client-id, user, default user+client-id, default
//     user+default client-id, default user, client-id, default client-id.
//     Clients that one entity covers share its rate; a default covers each
//     user (client id) on its own, as Kafka's metric tags do.
//     controller_mutation_rate is stored and described, not enforced.
//   - A rate is Kafka's: quotaSamples samples of quotaWindow each, the rate
//     the sum over the elapsed time (at least samples-1 windows). A request
//     taking the rate over its quota is answered (never refused) with
//     throttle_time_ms = (rate - quota) / quota * window, and the
//     connection reads no further request for that time (KIP-219; to a
//     client too old to throttle itself, Produce < v6 or Fetch < v8, the
//     response is held back for that time instead). A byte-rate throttle
//     is capped at samples*window, a request_percentage one at one window
//     (Kafka's bounds). A throttled Fetch answers no data (its bytes are
//     not counted), and a Fetch asks for at most quota*(samples-1)*window
//     bytes, as Kafka's do. Produce with acks=0 and the SASL requests are
//     exempt from request_percentage.

// Kafka's quota.window.num and quota.window.size.seconds (variables for
// tests, read when the server opens).
var (
	quotaSamples = 11
	quotaWindow  = time.Second
)

const (
	quotasFile = "quotas.json"
	quotasKey  = "_synapse/quotas.json"

	quotaUser     = "user"
	quotaClientID = "client-id"
	quotaIP       = "ip"

	keyProducerRate = "producer_byte_rate"
	keyConsumerRate = "consumer_byte_rate"
	keyRequestPct   = "request_percentage"
	keyMutationRate = "controller_mutation_rate"
	keyConnRate     = "connection_creation_rate"

	// Sensors unused for the whole quota window (samples*window), and at
	// least this long, are dropped (Kafka's inactive sensor expiration,
	// an hour there: sooner here, so client ids seen once do not stay).
	quotaSensorMinIdle = time.Minute
)

// maxQuotaSensors caps the measured rates (a variable for tests): past it,
// a client id or user without a sensor of its own shares its entity's
// overflow sensor (one rate for all of them, labelled client_id
// "<overflow>"), so a client rotating client ids cannot grow the memory
// and the metrics without bound.
var maxQuotaSensors = 10000

// maxQuotaLabel caps a user or client id label value, in bytes.
const maxQuotaLabel = 256

// quotaKind is one enforced quota.
type quotaKind int

const (
	kindProduce quotaKind = iota
	kindFetch
	kindRequest
	numKinds
)

var kindKeys = [numKinds]string{keyProducerRate, keyConsumerRate, keyRequestPct}
var kindNames = [numKinds]string{"produce", "fetch", "request"}

// quotaValueType is how Kafka types a quota key: integral keys refuse
// fractions.
type quotaValueType int

const (
	quotaDouble quotaValueType = iota
	quotaLong
	quotaInt
)

var clientQuotaKeys = map[string]quotaValueType{
	keyProducerRate: quotaLong, keyConsumerRate: quotaLong, keyRequestPct: quotaDouble, keyMutationRate: quotaDouble,
}

var ipQuotaKeys = map[string]quotaValueType{keyConnRate: quotaInt}

// quotaName is one entity component: absent, the default, or a name.
type quotaName struct {
	set  bool
	def  bool
	name string
}

func (n quotaName) ptr() *string {
	if n.def {
		return nil
	}
	return &n.name
}

// quotaEntity is a quota entity: the components it names.
type quotaEntity struct {
	user, client, ip quotaName
}

func (e quotaEntity) each(f func(typ string, n quotaName)) {
	if e.user.set {
		f(quotaUser, e.user)
	}
	if e.client.set {
		f(quotaClientID, e.client)
	}
	if e.ip.set {
		f(quotaIP, e.ip)
	}
}

func (e quotaEntity) size() int {
	n := 0
	e.each(func(string, quotaName) { n++ })
	return n
}

func (e quotaEntity) String() string {
	var b strings.Builder
	e.each(func(typ string, n quotaName) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(typ)
		b.WriteByte('=')
		if n.def {
			b.WriteString("<default>")
		} else {
			b.WriteString(n.name)
		}
	})
	return b.String()
}

func (e *quotaEntity) component(typ string) *quotaName {
	switch typ {
	case quotaUser:
		return &e.user
	case quotaClientID:
		return &e.client
	case quotaIP:
		return &e.ip
	}
	return nil
}

// quotaStore is the server's client quotas: the configured entities and
// the rates measured against them.
type quotaStore struct {
	alterMu sync.Mutex // one change at a time
	mu      sync.RWMutex
	entries map[quotaEntity]map[string]float64 // replaced, never changed in place
	gen     atomic.Uint64                      // bumped when entries change (and sensors are swept)
	on      atomic.Bool                        // some entity sets an enforced key
	persist func([]byte) error
	read    func() ([]byte, error) // quotas.json as it is on disk (nil: none)
	mirror  metaMirror
	logger  *zap.Logger

	samples  int
	windowMs int64
	idle     time.Duration // sensors unused this long are dropped
	now      func() time.Time

	smu       sync.Mutex
	clients   map[[2]string]*clientQuotas // by (user, client id)
	sensors   map[sensorKey]*quotaSensor
	lastSweep time.Time
	capWarned bool // the sensor cap was reached (logged once)
}

// sensorKey names one measured rate: a kind and Kafka's metric tags (the
// user and client id, "" where the entity applied does not name the type).
type sensorKey struct {
	kind         quotaKind
	user, client string
	// overflow: the entity whose clients share this sensor past the cap
	// (user and client are then "").
	overflow string
}

// clientQuotas is what applies to one (user, client id): a sensor per
// kind, nil where no quota applies.
type clientQuotas struct {
	gen     uint64
	user    string
	client  string
	sensors [numKinds]*quotaSensor
	any     bool // some sensor is set
}

// quotaSensor is one rate and its limit.
type quotaSensor struct {
	key sensorKey

	mu    sync.Mutex
	limit float64
	rate  quotaRate
	used  int64 // ms of the last record

	throttleMs atomic.Int64 // throttle time given, in total
	throttled  atomic.Int64 // responses throttled
}

// quotaRate is Kafka's Rate over a SampledStat: samples start lazily, a
// sample is complete after one window, samples older than samples*window
// count nothing.
type quotaRate struct {
	start []int64 // ms each sample began
	val   []float64
	n     int // samples begun so far
	cur   int
}

func (r *quotaRate) record(v float64, now int64, windowMs int64) {
	if r.n == 0 {
		r.n, r.cur, r.start[0], r.val[0] = 1, 0, now, 0
	} else if now-r.start[r.cur] >= windowMs {
		r.cur = (r.cur + 1) % len(r.start)
		if r.cur >= r.n {
			r.n = r.cur + 1
		}
		r.start[r.cur], r.val[r.cur] = now, 0
	}
	r.val[r.cur] += v
}

func (r *quotaRate) purge(now int64, windowMs int64) {
	expire := int64(len(r.start)) * windowMs
	for i := 0; i < r.n; i++ {
		if now-r.start[i] >= expire {
			r.start[i], r.val[i] = now, 0
		}
	}
}

// windowSize is the time the rate is taken over, in ms: from the oldest
// sample, at least samples-1 whole windows.
func (r *quotaRate) windowSize(now int64, windowMs int64) int64 {
	r.purge(now, windowMs)
	oldest := now
	for i := 0; i < r.n; i++ {
		oldest = min(oldest, r.start[i])
	}
	elapsed := now - oldest
	if full, minFull := elapsed/windowMs, int64(len(r.start)-1); full < minFull {
		elapsed += (minFull - full) * windowMs
	}
	return max(elapsed, 1)
}

// measure returns the rate per second and the window it is taken over.
func (r *quotaRate) measure(now int64, windowMs int64) (float64, int64) {
	w := r.windowSize(now, windowMs) // purges
	var sum float64
	for i := 0; i < r.n; i++ {
		sum += r.val[i]
	}
	return sum / (float64(w) / 1000), w
}

// record adds v at now and returns the throttle time (ms) if the rate is
// then over the limit (with check; without, just records).
func (s *quotaSensor) record(q *quotaStore, v float64, now int64, check bool) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rate.record(v, now, q.windowMs)
	s.used = now
	if !check {
		return 0
	}
	rate, w := s.rate.measure(now, q.windowMs)
	if rate <= s.limit {
		return 0
	}
	ms := int64(math.Round((rate - s.limit) / s.limit * float64(w)))
	limit := int64(q.samples) * q.windowMs // byte rates: the whole quota window
	if s.key.kind == kindRequest {
		limit = q.windowMs // Kafka bounds request throttles by one window
	}
	return min(ms, limit)
}

func (s *quotaSensor) snapshot(q *quotaStore, now int64) (limit, rate float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rate, _ = s.rate.measure(now, q.windowMs)
	return s.limit, rate
}

// openQuotas loads quotas.json (none: no quotas).
func (s *Server) openQuotas() (*quotaStore, error) {
	q := &quotaStore{
		samples: max(quotaSamples, 2), windowMs: max(quotaWindow.Milliseconds(), 1), now: time.Now,
		clients: map[[2]string]*clientQuotas{}, sensors: map[sensorKey]*quotaSensor{},
		logger: s.logger,
	}
	q.idle = max(time.Duration(q.samples)*time.Duration(q.windowMs)*time.Millisecond, quotaSensorMinIdle)
	q.mirror.key = quotasKey
	b, err := s.readSecurityFile(quotasFile)
	if err != nil {
		return nil, err
	}
	if q.entries, err = decodeQuotas(b); err != nil {
		return nil, fmt.Errorf("broker: %s: %w", quotasFile, err)
	}
	q.setOn()
	q.persist = s.persistSecurity(quotasFile, &q.mirror)
	q.read = func() ([]byte, error) { return s.readSecurityFile(quotasFile) }
	if b != nil {
		q.mirror.queue(b) // mirrored again at each start
	}
	return q, nil
}

type quotaFileComponent struct {
	Type string  `json:"type"`
	Name *string `json:"name"` // null: the default
}

type quotaFileEntry struct {
	Entity []quotaFileComponent `json:"entity"`
	Values map[string]float64   `json:"values"`
}

type quotaFileBody struct {
	Version int              `json:"version"`
	Quotas  []quotaFileEntry `json:"quotas"`
}

func decodeQuotas(b []byte) (map[quotaEntity]map[string]float64, error) {
	m := map[quotaEntity]map[string]float64{}
	if b == nil {
		return m, nil
	}
	var f quotaFileBody
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("version %d, want 1", f.Version)
	}
	// Every entry passes AlterClientQuotas' checks: a value it refuses (0,
	// negative, NaN, infinite, a fraction of an integral key, an unknown
	// key, a bad entity) would make the throttle arithmetic meaningless.
	for i, fe := range f.Quotas {
		cs := make([]kmsg.AlterClientQuotasRequestEntryEntity, len(fe.Entity))
		for j, c := range fe.Entity {
			cs[j] = kmsg.AlterClientQuotasRequestEntryEntity{Type: c.Type, Name: c.Name}
		}
		e, msg := quotaEntityOf(cs)
		if msg == "" && len(fe.Values) == 0 {
			msg = "no quota values"
		}
		if msg == "" && m[e] != nil {
			msg = fmt.Sprintf("duplicate entity %s", e)
		}
		var vs map[string]float64
		if msg == "" {
			ops := make([]kmsg.AlterClientQuotasRequestEntryOp, 0, len(fe.Values))
			for _, k := range slices.Sorted(maps.Keys(fe.Values)) {
				ops = append(ops, kmsg.AlterClientQuotasRequestEntryOp{Key: k, Value: fe.Values[k]})
			}
			vs, msg = applyQuotaOps(e, nil, ops)
		}
		if msg != "" {
			return nil, fmt.Errorf("entry %d (entity %s): %s", i, quotaFileEntity(fe.Entity), msg)
		}
		m[e] = vs
	}
	return m, nil
}

// quotaFileEntity shows a file entry's entity for an error message.
func quotaFileEntity(cs []quotaFileComponent) string {
	var b strings.Builder
	for _, c := range cs {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		name := "<default>"
		if c.Name != nil {
			name = strconv.Quote(*c.Name)
		}
		b.WriteString(c.Type + "=" + name)
	}
	return b.String()
}

func encodeQuotas(m map[quotaEntity]map[string]float64) []byte {
	f := quotaFileBody{Version: 1, Quotas: []quotaFileEntry{}}
	for _, e := range sortedEntities(m) {
		fe := quotaFileEntry{Values: m[e]}
		e.each(func(typ string, n quotaName) {
			fe.Entity = append(fe.Entity, quotaFileComponent{Type: typ, Name: n.ptr()})
		})
		f.Quotas = append(f.Quotas, fe)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		panic(err) // plain strings and finite floats
	}
	return append(b, '\n')
}

func sortedEntities(m map[quotaEntity]map[string]float64) []quotaEntity {
	es := make([]quotaEntity, 0, len(m))
	for e := range m {
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b quotaEntity) int { return strings.Compare(a.String(), b.String()) })
	return es
}

// setOn turns enforcement on when some entity sets an enforced key (mu
// held or not yet shared).
func (q *quotaStore) setOn() {
	on := false
	for _, vs := range q.entries {
		for _, k := range kindKeys {
			if _, ok := vs[k]; ok {
				on = true
			}
		}
	}
	q.on.Store(on)
}

// active reports whether any quota is enforced (the one check requests pay
// when none is).
func (s *Server) quotasActive() bool {
	return s.sec != nil && s.sec.quotas != nil && s.sec.quotas.on.Load()
}

// quotaUserOf is the user a principal's quotas are set for: its name
// ("User:alice" is user alice; unauthenticated clients are ANONYMOUS).
func quotaUserOf(principal string) string {
	if _, name, ok := strings.Cut(principal, ":"); ok {
		return name
	}
	return principal
}

// resolve finds, for each kind, the most specific entity setting its key
// (mu held for reading).
func (q *quotaStore) resolve(user, client string) (limits [numKinds]float64, keys [numKinds]sensorKey, ents [numKinds]quotaEntity, found [numKinds]bool) {
	u, cl := quotaName{set: true, name: user}, quotaName{set: true, name: client}
	def := quotaName{set: true, def: true}
	order := [...]quotaEntity{
		{user: u, client: cl}, {user: u, client: def}, {user: u},
		{user: def, client: cl}, {user: def, client: def}, {user: def},
		{client: cl}, {client: def},
	}
	for k := range numKinds {
		for _, e := range order {
			v, ok := q.entries[e][kindKeys[k]]
			if !ok {
				continue
			}
			limits[k], found[k], ents[k] = v, true, e
			keys[k] = sensorKey{kind: k}
			if e.user.set {
				keys[k].user = user
			}
			if e.client.set {
				keys[k].client = client
			}
			break
		}
	}
	return
}

// clientFor returns the quotas of (user, client id), resolved again after
// any change.
func (q *quotaStore) clientFor(user, client string) *clientQuotas {
	gen := q.gen.Load()
	k := [2]string{user, client}
	q.smu.Lock()
	defer q.smu.Unlock()
	if cq := q.clients[k]; cq != nil && cq.gen == gen {
		return cq
	}
	now := q.now()
	if now.Sub(q.lastSweep) > time.Minute || len(q.clients) >= maxQuotaSensors {
		q.sweepLocked(now)
		gen = q.gen.Load()
	}
	q.mu.RLock()
	limits, keys, ents, found := q.resolve(user, client)
	q.mu.RUnlock()
	cq := &clientQuotas{gen: gen, user: user, client: client}
	for kind := range numKinds {
		if !found[kind] {
			continue
		}
		key := keys[kind]
		s := q.sensors[key]
		if s == nil && len(q.sensors) >= maxQuotaSensors {
			// Past the cap: the entity's clients without a sensor share
			// one (its rate and limit are the entity's).
			if !q.capWarned && q.logger != nil {
				q.capWarned = true
				q.logger.Warn("client quota sensors capped: clients past the cap share their quota entity's overflow sensor",
					zap.Int("sensors", maxQuotaSensors), zap.String("entity", labelValue(ents[kind].String())))
			}
			key = sensorKey{kind: kind, overflow: ents[kind].String()}
			s = q.sensors[key]
		}
		if s == nil {
			s = &quotaSensor{key: key, rate: quotaRate{start: make([]int64, q.samples), val: make([]float64, q.samples)}}
			s.used = now.UnixMilli()
			q.sensors[key] = s
		}
		s.mu.Lock()
		s.limit = limits[kind] // a changed quota applies to the rate so far, as Kafka's
		s.mu.Unlock()
		cq.sensors[kind], cq.any = s, true
	}
	q.clients[k] = cq
	return cq
}

// sweepLocked drops sensors idle for q.idle and the resolutions of
// clients (smu held); with a sensor gone, connections resolve again.
func (q *quotaStore) sweepLocked(now time.Time) {
	q.lastSweep = now
	cut := now.Add(-q.idle).UnixMilli()
	dropped := false
	for k, s := range q.sensors {
		s.mu.Lock()
		idle := s.used < cut
		s.mu.Unlock()
		if idle {
			delete(q.sensors, k)
			dropped = true
		}
	}
	// Resolutions are cheap to redo: dropped, so client ids seen once do
	// not pile up (connections keep theirs while the generation holds).
	clear(q.clients)
	if dropped {
		q.gen.Add(1)
		if len(q.sensors) < maxQuotaSensors {
			q.capWarned = false // warned again if the cap is reached again
		}
	}
}

// connQuota is a connection's quota state; only its serving goroutine
// touches it.
type connQuota struct {
	cq        *clientQuotas // the resolution last used (checked against the store's generation)
	cur       *clientQuotas // the request being handled: quotas apply (nil: none)
	start     time.Time     // when its handler began
	parked    time.Duration // time the handler spent waiting (long poll, rebalance, fsync): not handler time
	done      bool          // the handler applied the quotas itself (Fetch)
	muteUntil time.Time     // read no request before this
}

// dispatchQuota is dispatch for a server with quotas: the request's bytes
// and handler time are recorded against the client's quotas, and a
// client over one is throttled.
func (c *conn) dispatchQuota(req *protocol.Request, frameLen int) (kmsg.Response, error) {
	if !c.authed {
		return c.s.dispatch(c, req) // SASL under way: Kafka's network layer, no quotas
	}
	q := c.s.sec.quotas
	cs := &c.quota
	user := quotaUserOf(c.principal)
	if cs.cq == nil || cs.cq.gen != q.gen.Load() || cs.cq.user != user || cs.cq.client != req.ClientID {
		cs.cq = q.clientFor(user, req.ClientID)
	}
	cq := cs.cq
	if !cq.any {
		return c.s.dispatch(c, req)
	}
	cs.cur, cs.start, cs.parked, cs.done = cq, time.Now(), 0, false
	defer func() { cs.cur = nil }()
	if f, ok := req.Body.(*kmsg.FetchRequest); ok && cq.sensors[kindFetch] != nil && f.ReplicaID < 0 && f.ReplicaState.ID < 0 {
		// No more than the quota window holds: a larger response is
		// throttled whatever else the client does.
		cq.sensors[kindFetch].mu.Lock()
		most := cq.sensors[kindFetch].limit * float64(q.samples-1) * float64(q.windowMs) / 1000
		cq.sensors[kindFetch].mu.Unlock()
		if most < float64(math.MaxInt32) {
			f.MaxBytes = min(f.MaxBytes, int32(max(most, 1)))
			f.MinBytes = min(f.MinBytes, f.MaxBytes)
		}
	}
	resp, err := c.s.dispatch(c, req)
	if err != nil || cs.done {
		return resp, err
	}
	now := time.Now()
	var bw, rq int64
	if s := cq.sensors[kindProduce]; s != nil && req.Key == 0 {
		bw = s.record(q, float64(frameLen+4), now.UnixMilli(), true)
	}
	exempt := req.Key == 17 || req.Key == 36 || req.Key == 0 && resp == nil // SASL; acks=0 produce
	if s := cq.sensors[kindRequest]; s != nil && !exempt {
		rq = s.record(q, handlerPercent(now.Sub(cs.start)-cs.parked), now.UnixMilli(), true)
	}
	c.throttle(resp, cq, bw, rq, now)
	return resp, err
}

// parkedSince counts the time since t as parked: the handler waited (a
// long poll, a rebalance, an fsync) rather than worked, and Kafka's
// request_percentage counts only request-thread time, its waits being
// delayed operations. Calls into a coordinator that mostly wait are timed
// whole: their own work (a lock, an encode) is microseconds beside the
// wait, and uncharged with it.
func (c *conn) parkedSince(t time.Time) {
	if c != nil {
		c.quota.parked += time.Since(t)
	}
}

// handlerPercent is Kafka's nanosToPercentage: handler time as the
// percentage of one thread's second.
func handlerPercent(d time.Duration) float64 { return float64(max(d, 0)) * 100 / float64(time.Second) }

// throttle applies the larger of a byte-rate (bw) and a request-time (rq)
// throttle: the response carries it and the connection is muted.
func (c *conn) throttle(resp kmsg.Response, cq *clientQuotas, bw, rq int64, now time.Time) int32 {
	ms := max(bw, rq)
	if ms <= 0 {
		return 0
	}
	s := cq.sensors[kindRequest]
	if bw > rq {
		s = cq.sensors[kindProduce]
		if c.quota.cur != nil && c.quota.done {
			s = cq.sensors[kindFetch]
		}
	}
	s.throttleMs.Add(ms)
	s.throttled.Add(1)
	if r, ok := resp.(kmsg.SetThrottleResponse); ok {
		r.SetThrottle(int32(ms))
	}
	c.quota.muteUntil = now.Add(time.Duration(ms) * time.Millisecond)
	return int32(ms)
}

// quotaFetch applies the quotas to a fetch once its records are read:
// over a quota, the answer is an empty, throttled response (the records
// are not sent, nor counted) with the session's id, as Kafka's. nil: no
// quota throttles it; answer resp as usual.
func (c *conn) quotaFetch(fc fetchCtx, req *kmsg.FetchRequest, resp *fetchResponse) kmsg.Response {
	cs := &c.quota
	cq := cs.cur
	if cq == nil {
		return nil
	}
	q := c.s.sec.quotas
	cs.done = true
	now := time.Now()
	nowMs := now.UnixMilli()
	var bw, rq int64
	var size float64
	fs := cq.sensors[kindFetch]
	if fs != nil && req.ReplicaID < 0 && req.ReplicaState.ID < 0 {
		size = fetchRecordBytes(resp)
		bw = fs.record(q, size, nowMs, true)
	}
	if s := cq.sensors[kindRequest]; s != nil {
		rq = s.record(q, handlerPercent(now.Sub(cs.start)-cs.parked), nowMs, true)
	}
	if bw <= 0 && rq <= 0 {
		return nil
	}
	if size > 0 {
		fs.record(q, -size, nowMs, false) // not sent: not counted
	}
	resp.release()
	out := req.ResponseKind().(*kmsg.FetchResponse)
	if fc.sess != nil {
		out.SessionID = fc.sess.id
	}
	c.throttle(out, cq, bw, rq, now)
	return out
}

// fetchRecordBytes is the size of a fetch response as the fetch byte rate
// counts it: the record bytes, and a partition header for each partition
// with records.
func fetchRecordBytes(f *fetchResponse) float64 {
	var n int64
	for ti := range f.reads {
		for pi := range f.reads[ti] {
			if l := f.recLen(ti, pi); l > 0 {
				n += l + 48
			}
		}
	}
	return float64(n)
}

// waitMute waits out a throttle: no request is read meanwhile (the mute
// ends early at shutdown).
func (c *conn) waitMute() {
	d := time.Until(c.quota.muteUntil)
	c.quota.muteUntil = time.Time{}
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.s.ctx.Done():
	}
}

// delayThrottled holds back a throttled response to a client that does not
// throttle itself (before KIP-219's versions): the throttle passes before
// it is answered.
func (c *conn) delayThrottled(resp kmsg.Response) {
	if r, ok := resp.(kmsg.ThrottleResponse); ok {
		if ms, after := r.Throttle(); ms > 0 && !after {
			c.waitMute()
		}
	}
}

// describe answers DescribeClientQuotas' filter (Kafka's matching: every
// component must match; strict also wants no other component).
func (q *quotaStore) describe(comps []kmsg.DescribeClientQuotasRequestComponent, strict bool) ([]kmsg.DescribeClientQuotasResponseEntry, int16, string) {
	type want struct {
		typ   string
		exact bool
		name  *string // exact: nil is the default
	}
	var ws []want
	seen := map[string]bool{}
	for _, cp := range comps {
		switch {
		case cp.EntityType == "":
			return nil, invalidRequest, "Invalid empty entity type."
		case seen[cp.EntityType]:
			return nil, invalidRequest, fmt.Sprintf("Entity type %s cannot appear more than once in the filter.", cp.EntityType)
		case cp.EntityType != quotaUser && cp.EntityType != quotaClientID && cp.EntityType != quotaIP:
			return nil, unsupportedVersion, fmt.Sprintf("Unsupported entity type %s", cp.EntityType)
		}
		seen[cp.EntityType] = true
		switch cp.MatchType {
		case kmsg.QuotasMatchTypeExact:
			if cp.Match == nil {
				return nil, invalidRequest, "Request specified MATCH_TYPE_EXACT, but set match string to null."
			}
			ws = append(ws, want{cp.EntityType, true, cp.Match})
		case kmsg.QuotasMatchTypeDefault:
			if cp.Match != nil {
				return nil, invalidRequest, "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."
			}
			ws = append(ws, want{cp.EntityType, true, nil})
		case kmsg.QuotasMatchTypeAny:
			if cp.Match != nil {
				return nil, invalidRequest, "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."
			}
			ws = append(ws, want{typ: cp.EntityType})
		default:
			return nil, invalidRequest, fmt.Sprintf("Unknown match type %d", cp.MatchType)
		}
	}
	if seen[quotaIP] && (seen[quotaUser] || seen[quotaClientID]) {
		return nil, invalidRequest, "Invalid entity filter component combination. IP filter component should not be used with user or clientId filter component."
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	var out []kmsg.DescribeClientQuotasResponseEntry
next:
	for _, e := range sortedEntities(q.entries) {
		if strict && e.size() != len(ws) {
			continue
		}
		for _, w := range ws {
			n := *e.component(w.typ)
			switch {
			case !n.set:
				continue next
			case w.exact && w.name == nil && !n.def:
				continue next
			case w.exact && w.name != nil && (n.def || n.name != *w.name):
				continue next
			}
		}
		re := kmsg.NewDescribeClientQuotasResponseEntry()
		e.each(func(typ string, n quotaName) {
			ee := kmsg.NewDescribeClientQuotasResponseEntryEntity()
			ee.Type, ee.Name = typ, n.ptr()
			re.Entity = append(re.Entity, ee)
		})
		vs := q.entries[e]
		for _, k := range slices.Sorted(maps.Keys(vs)) {
			v := kmsg.NewDescribeClientQuotasResponseEntryValue()
			v.Key, v.Value = k, vs[k]
			re.Values = append(re.Values, v)
		}
		out = append(out, re)
	}
	return out, 0, ""
}

var (
	invalidRequest     = kerr.InvalidRequest.Code
	unsupportedVersion = kerr.UnsupportedVersion.Code
)

// quotaResult is one AlterClientQuotas entry's outcome.
type quotaResult struct {
	code int16
	msg  string
}

// alter validates and (unless validateOnly) applies entries, each on its
// own as Kafka's controller does; the valid ones are in quotas.json before
// they apply. A failure to store answers every valid entry with err.
func (q *quotaStore) alter(entries []kmsg.AlterClientQuotasRequestEntry, validateOnly bool) ([]quotaResult, []quotaEntity, error) {
	q.alterMu.Lock()
	defer q.alterMu.Unlock()
	q.mu.RLock()
	cur := q.entries
	q.mu.RUnlock()
	next := make(map[quotaEntity]map[string]float64, len(cur))
	for e, vs := range cur {
		next[e] = vs
	}
	results := make([]quotaResult, len(entries))
	changed := make([]quotaEntity, len(entries))
	seen := map[quotaEntity]bool{}
	dirty := false
	for i, re := range entries {
		e, msg := quotaEntityOf(re.Entity)
		if msg == "" && seen[e] {
			msg = fmt.Sprintf("Ignoring duplicate entity %s", e)
		}
		var vs map[string]float64
		if msg == "" {
			seen[e] = true
			vs, msg = applyQuotaOps(e, next[e], re.Ops)
		}
		if msg != "" {
			results[i] = quotaResult{invalidRequest, msg}
			continue
		}
		changed[i] = e
		if validateOnly || quotaValuesEqual(vs, next[e]) {
			continue
		}
		dirty = true
		if len(vs) == 0 {
			delete(next, e)
		} else {
			next[e] = vs
		}
	}
	if !dirty {
		return results, nil, nil
	}
	b := encodeQuotas(next)
	if err := q.persist(b); err != nil {
		// The file may hold the change anyway (a failure after the
		// rename, syncing the directory): memory follows what the file
		// holds, which is what a restart loads.
		if q.read == nil {
			return results, nil, err
		}
		if cur, rerr := q.read(); rerr != nil || !bytes.Equal(cur, b) {
			return results, nil, err
		}
		if q.logger != nil {
			q.logger.Warn("client quotas stored, but not known durable", zap.String("file", quotasFile), zap.Error(err))
		}
		q.mirror.queue(b)
	}
	q.mu.Lock()
	q.entries = next
	q.setOn()
	q.mu.Unlock()
	q.gen.Add(1)
	var applied []quotaEntity
	for i, e := range changed {
		if results[i].code == 0 && e.size() > 0 {
			applied = append(applied, e)
		}
	}
	return results, applied, nil
}

func quotaValuesEqual(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// quotaEntityOf validates a request's entity (Kafka's validateEntity and
// the allowed combinations).
func quotaEntityOf(cs []kmsg.AlterClientQuotasRequestEntryEntity) (quotaEntity, string) {
	var e quotaEntity
	if len(cs) == 0 {
		return e, "Invalid empty client quota entity"
	}
	for _, c := range cs {
		n := e.component(c.Type)
		switch {
		case n == nil:
			return e, fmt.Sprintf("Unhandled client quota entity type: %s", c.Type)
		case n.set:
			return e, fmt.Sprintf("Invalid client quota entity, duplicate entity entry %s", c.Type)
		case c.Name != nil && *c.Name == "":
			return e, fmt.Sprintf("Empty %s not supported", c.Type)
		}
		n.set, n.def = true, c.Name == nil
		if c.Name != nil {
			n.name = *c.Name
		}
	}
	if e.ip.set {
		if e.user.set || e.client.set {
			return e, "Invalid quota entity combination, IP entity should not be combined with User or ClientId"
		}
		if !e.ip.def {
			a, err := netip.ParseAddr(e.ip.name)
			if err != nil {
				return e, fmt.Sprintf("%s is not a valid IP or resolvable host.", e.ip.name)
			}
			e.ip.name = a.Unmap().String()
		}
	}
	return e, ""
}

// applyQuotaOps returns old with ops applied (a new map), or the first
// invalid op's error.
func applyQuotaOps(e quotaEntity, old map[string]float64, ops []kmsg.AlterClientQuotasRequestEntryOp) (map[string]float64, string) {
	keys := clientQuotaKeys
	if e.ip.set {
		keys = ipQuotaKeys
	}
	vs := make(map[string]float64, len(old)+len(ops))
	for k, v := range old {
		vs[k] = v
	}
	seen := map[string]bool{}
	for _, op := range ops {
		if seen[op.Key] {
			return nil, fmt.Sprintf("Duplicate quota key %s not updating quota for this entity %s", op.Key, e)
		}
		seen[op.Key] = true
		if op.Remove {
			delete(vs, op.Key)
			continue
		}
		typ, ok := keys[op.Key]
		v := op.Value
		switch {
		case !ok:
			return nil, fmt.Sprintf("Invalid configuration key %s", op.Key)
		case math.IsNaN(v) || v <= 0:
			return nil, fmt.Sprintf("Quota %s must be greater than 0", op.Key)
		case math.IsInf(v, 0):
			return nil, fmt.Sprintf("Proposed value for %s is too large.", op.Key)
		case typ == quotaInt && v > math.MaxInt32:
			return nil, fmt.Sprintf("Proposed value for %s is too large for an INT.", op.Key)
		case typ == quotaLong && v > math.MaxInt64:
			return nil, fmt.Sprintf("Proposed value for %s is too large for a LONG.", op.Key)
		case typ != quotaDouble && math.Abs(math.Mod(v, 1)) > 1e-6:
			return nil, fmt.Sprintf("%s cannot be a fractional value.", op.Key)
		}
		vs[op.Key] = v
	}
	return vs, ""
}

// collectQuotas reports each measured rate: its limit, rate and throttles.
func (q *quotaStore) collect(ch chan<- prometheus.Metric) {
	now := q.now()
	q.smu.Lock()
	if now.Sub(q.lastSweep) > time.Minute {
		q.sweepLocked(now)
	}
	ss := make([]*quotaSensor, 0, len(q.sensors))
	for _, s := range q.sensors {
		ss = append(ss, s)
	}
	q.smu.Unlock()
	// Label values are client data (client ids, user names): made valid
	// UTF-8 and capped, each series once (a registry refuses a duplicate
	// and the whole scrape with it), and never a Must* that would panic in
	// the registry's collecting goroutine.
	seen := make(map[[3]string]bool, len(ss))
	for _, s := range ss {
		labels := [3]string{kindNames[s.key.kind], labelValue(s.key.user), labelValue(s.key.client)}
		if s.key.overflow != "" {
			labels[1], labels[2] = labelValue(s.key.overflow), "<overflow>"
		}
		if seen[labels] {
			continue
		}
		seen[labels] = true
		limit, rate := s.snapshot(q, now.UnixMilli())
		for _, m := range []struct {
			d *prometheus.Desc
			t prometheus.ValueType
			v float64
		}{
			{descQuotaLimit, prometheus.GaugeValue, limit},
			{descQuotaRate, prometheus.GaugeValue, rate},
			{descQuotaThrottleMs, prometheus.CounterValue, float64(s.throttleMs.Load())},
			{descQuotaThrottled, prometheus.CounterValue, float64(s.throttled.Load())},
		} {
			if pm, err := prometheus.NewConstMetric(m.d, m.t, m.v, labels[:]...); err == nil {
				ch <- pm
			}
		}
	}
}

// labelValue makes client data a metric label value: valid UTF-8, at most
// maxQuotaLabel bytes. A value changed on the way ends in "~" and a hash of
// the original, so two client ids that differ only in what was changed
// stay two series.
func labelValue(v string) string {
	if len(v) <= maxQuotaLabel && utf8.ValidString(v) {
		return v
	}
	h := fnv.New32a()
	h.Write([]byte(v))
	sum := fmt.Sprintf("~%08x", h.Sum32())
	out := strings.ToValidUTF8(v, "\uFFFD")
	if cut := maxQuotaLabel - len(sum); len(out) > cut {
		out = out[:cut]
		for len(out) > 0 && !utf8.ValidString(out) {
			out = out[:len(out)-1] // a rune cut in the middle
		}
	}
	return out + sum
}
