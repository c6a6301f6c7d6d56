package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// REST consumers: each instance is a kgo consumer-group client of its own
// (a real member of the group, so Kafka clients in the same group share
// its partitions), created at subscription. Records a GET /records fetched
// but did not return (max_bytes) wait for the next one; only returned
// records count as consumed (auto-commit commits those, and a commit with
// no body commits those).

// consumers is the registry of instances by group and id.
type consumers struct {
	a      *API
	mu     sync.Mutex
	m      map[string]map[string]*instance
	n      int
	closed bool // by removeAll: no more instances

	// closing counts the instances removed whose close has not ended
	// (Add under mu, by remove and removeAll; Done by closeRemoved), so
	// that API.Close waits for every one, the janitor's too.
	closing sync.WaitGroup
}

func newConsumers(a *API) *consumers {
	return &consumers{a: a, m: map[string]map[string]*instance{}}
}

type instance struct {
	a                            *API
	group, id, principal, client string
	format                       string // binary or json
	reset                        kgo.Offset
	autoCommit                   bool
	lastUsed                     atomic.Int64 // unix nanos
	// ctx is cancelled when the instance is removed (or the API closes):
	// it ends a long poll of GET /records holding mu.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex // one operation at a time
	cl      *kgo.Client
	topics  []string
	pattern string
	closed  bool

	// pmu guards what the client's group callbacks change too.
	pmu      sync.Mutex
	pending  []*kgo.Record              // fetched, not returned yet
	returned map[string]map[int32]int64 // offset of the last record returned, by partition
	// assigned holds the partitions consumed now: assigned, their
	// starting offsets known (AdjustFetchOffsetsFn), not revoked since.
	assigned map[string]map[int32]bool
	// seeks holds positions (POST .../positions) of partitions not
	// assigned yet, applied when they are (the usual create, subscribe,
	// seek, poll: the group is joined at the first poll).
	seeks map[string]map[int32]kgo.EpochOffset
}

func (in *instance) touch() { in.lastUsed.Store(time.Now().UnixNano()) }

// close ends the instance's client (it leaves the group; with auto-commit
// it commits what was returned).
func (in *instance) close() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.closed = true
	in.stopClient()
}

func (in *instance) stopClient() {
	if in.cl == nil {
		return
	}
	cl := in.cl
	in.cl, in.topics, in.pattern = nil, nil, ""
	cl.Close()
	in.pmu.Lock()
	in.pending, in.returned, in.assigned, in.seeks = nil, nil, nil, nil
	in.pmu.Unlock()
}

func (c *consumers) add(in *instance) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errShuttingDown()
	}
	g := c.m[in.group]
	if _, ok := g[in.id]; ok {
		return newErr(http.StatusConflict, 40902, "Consumer with specified consumer ID already exists in the specified consumer group.")
	}
	if len(g) >= c.a.cfg.MaxInstancesPerGroup {
		return newErr(http.StatusTooManyRequests, 42901, "group %s already has %d consumer instances here, the most allowed: delete unused ones", in.group, len(g))
	}
	if c.n >= c.a.cfg.MaxInstances {
		return newErr(http.StatusTooManyRequests, 42902, "%d consumer instances here, the most allowed: delete unused ones", c.n)
	}
	if g == nil {
		g = map[string]*instance{}
		c.m[in.group] = g
	}
	g[in.id] = in
	c.n++
	return nil
}

func (c *consumers) get(group, id, principal string) *instance {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := c.m[group][id]
	if in == nil || in.principal != principal { // another caller's instance is not there for this one
		return nil
	}
	in.touch()
	return in
}

// remove takes in out of the registry; when it reports true, the caller
// must closeRemoved(in).
func (c *consumers) remove(in *instance) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.m[in.group]
	if g[in.id] != in {
		return false
	}
	delete(g, in.id)
	if len(g) == 0 {
		delete(c.m, in.group)
	}
	c.n--
	c.closing.Add(1)
	return true
}

// closeRemoved closes an instance remove or removeAll took out: its poll
// ends, its client leaves the group (committing what it auto-commits).
func (c *consumers) closeRemoved(in *instance) {
	defer c.closing.Done()
	in.cancel()
	in.close()
}

// expire removes the instances unused since before and returns them.
func (c *consumers) expire(before time.Time) []*instance {
	c.mu.Lock()
	var out []*instance
	for _, g := range c.m {
		for _, in := range g {
			if in.lastUsed.Load() < before.UnixNano() && in.mu.TryLock() {
				in.mu.Unlock() // not in use now (a long poll keeps it)
				out = append(out, in)
			}
		}
	}
	c.mu.Unlock()
	removed := out[:0]
	for _, in := range out {
		if c.remove(in) {
			removed = append(removed, in)
		}
	}
	return removed
}

// removeAll takes every instance out and refuses new ones; the caller
// must closeRemoved each.
func (c *consumers) removeAll() []*instance {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*instance
	for _, g := range c.m {
		for _, in := range g {
			out = append(out, in)
		}
	}
	c.m, c.n, c.closed = map[string]map[string]*instance{}, 0, true
	c.closing.Add(len(out))
	return out
}

// checkV2 accepts the media types of the consumer API's JSON bodies.
func checkV2(q *request, bodyOptional bool) error {
	switch ct := mediaType(q.r); ct {
	case mediaV2, mediaJSON, mediaBinary, mediaJSONV2:
		return nil
	case "":
		if bodyOptional || q.r.ContentLength == 0 {
			return nil
		}
		return errContentType(ct, mediaV2)
	default:
		return errContentType(ct, mediaV2)
	}
}

var validName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// stringOrBool is a config given as "true" or true.
type stringOrBool string

func (s *stringOrBool) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch v := v.(type) {
	case bool:
		*s = stringOrBool(strconv.FormatBool(v))
	case string:
		*s = stringOrBool(v)
	case nil:
	default:
		return errInvalid("want a string or a boolean, got %s", b)
	}
	return nil
}

// POST /consumers/{group}: a new instance.
func (a *API) createConsumer(q *request) {
	if err := checkV2(q, true); err != nil {
		q.fail(err)
		return
	}
	group := q.r.PathValue("group")
	var body struct {
		Name       string       `json:"name"`
		Format     string       `json:"format"`
		Reset      string       `json:"auto.offset.reset"`
		AutoCommit stringOrBool `json:"auto.commit.enable"`
	}
	if err := decodeOptionalJSON(q.r.Body, &body); err != nil {
		q.fail(err)
		return
	}
	in := &instance{a: a, group: group, id: body.Name, principal: q.principal, client: q.client, autoCommit: true}
	in.ctx, in.cancel = context.WithCancel(a.ctx)
	if in.id == "" {
		var b [8]byte
		rand.Read(b[:])
		in.id = "rest-consumer-" + hex.EncodeToString(b[:])
	} else if !validName.MatchString(in.id) {
		q.fail(errInvalid("consumer name %q: letters, digits, '.', '_' and '-' only", in.id))
		return
	}
	switch body.Format {
	case "", "binary":
		in.format = "binary"
	case "json":
		in.format = "json"
	default:
		q.fail(newErr(http.StatusUnprocessableEntity, 42204, "Invalid consumer configuration: format %q is not supported (binary or json)", body.Format))
		return
	}
	switch strings.ToLower(body.Reset) {
	case "", "latest":
		in.reset = kgo.NewOffset().AtEnd()
	case "earliest", "smallest":
		in.reset = kgo.NewOffset().AtStart()
	case "none":
		in.reset = kgo.NoResetOffset()
	default:
		q.fail(newErr(http.StatusUnprocessableEntity, 42204, "Invalid consumer configuration: auto.offset.reset %q (earliest, latest or none)", body.Reset))
		return
	}
	switch strings.ToLower(string(body.AutoCommit)) {
	case "", "true":
	case "false":
		in.autoCommit = false
	default:
		q.fail(newErr(http.StatusUnprocessableEntity, 42204, "Invalid consumer configuration: auto.commit.enable %q (true or false)", body.AutoCommit))
		return
	}
	if group == "" || len(group) > 249 {
		q.fail(errInvalid("bad group name"))
		return
	}
	in.touch()
	if err := a.consumers.add(in); err != nil {
		in.cancel()
		q.fail(err)
		return
	}
	scheme := "http"
	if q.r.TLS != nil {
		scheme = "https"
	}
	q.reply(http.StatusOK, mediaV2, map[string]string{
		"instance_id": in.id,
		"base_uri":    scheme + "://" + q.r.Host + "/consumers/" + url.PathEscape(group) + "/instances/" + url.PathEscape(in.id),
	})
}

// withInstance runs fn on the path's instance, holding it.
func (a *API) withInstance(q *request, fn func(in *instance) error) {
	in := a.consumers.get(q.r.PathValue("group"), q.r.PathValue("instance"), q.principal)
	if in == nil {
		q.fail(errInstanceNotFound())
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		q.fail(errInstanceNotFound())
		return
	}
	defer in.touch()
	if err := fn(in); err != nil {
		q.fail(err)
	}
}

// DELETE /consumers/{group}/instances/{instance}
func (a *API) deleteConsumer(q *request) {
	in := a.consumers.get(q.r.PathValue("group"), q.r.PathValue("instance"), q.principal)
	if in == nil || !a.consumers.remove(in) {
		q.fail(errInstanceNotFound())
		return
	}
	a.consumers.closeRemoved(in)
	q.w.WriteHeader(http.StatusNoContent)
}

// POST .../subscription {"topics":[...]} or {"topic_pattern":"..."}:
// replaces the subscription.
func (a *API) subscribe(q *request) {
	if err := checkV2(q, false); err != nil {
		q.fail(err)
		return
	}
	var body struct {
		Topics  []string `json:"topics"`
		Pattern string   `json:"topic_pattern"`
	}
	if err := decodeJSON(q.r.Body, &body); err != nil {
		q.fail(err)
		return
	}
	switch {
	case len(body.Topics) > 0 && body.Pattern != "":
		q.fail(newErr(http.StatusConflict, 40903, "Illegal state: topics and topic_pattern are mutually exclusive"))
		return
	case len(body.Topics) == 0 && body.Pattern == "":
		q.fail(errInvalid("no topics: want {\"topics\":[...]} or {\"topic_pattern\":\"...\"}"))
		return
	}
	for _, t := range body.Topics {
		if t == "" {
			q.fail(errInvalid("empty topic name in topics"))
			return
		}
	}
	if body.Pattern != "" {
		if _, err := regexp.Compile(body.Pattern); err != nil {
			q.fail(errInvalid("topic_pattern: %v", err))
			return
		}
	}
	a.withInstance(q, func(in *instance) error {
		in.stopClient()
		opts := append(kafkaOpts(a.cfg.Broker, in.principal, in.client),
			kgo.ConsumerGroup(in.group),
			kgo.ConsumeResetOffset(in.reset),
			kgo.FetchMaxWait(500*time.Millisecond),
			// What one instance buffers: about what a GET /records may
			// answer, not franz-go's 50 MiB per fetch.
			kgo.FetchMaxBytes(a.fetchMaxBytes()),
			kgo.FetchMaxPartitionBytes(min(a.fetchMaxBytes(), 1<<20)),
			kgo.AdjustFetchOffsetsFn(in.startOffsets),
			kgo.OnPartitionsRevoked(in.revoked),
			kgo.OnPartitionsLost(in.lost),
		)
		if body.Pattern != "" {
			opts = append(opts, kgo.ConsumeRegex(), kgo.ConsumeTopics(body.Pattern))
		} else {
			opts = append(opts, kgo.ConsumeTopics(body.Topics...))
		}
		if in.autoCommit {
			opts = append(opts, kgo.AutoCommitMarks())
		} else {
			opts = append(opts, kgo.DisableAutoCommit())
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return errInvalid("subscription: %v", err)
		}
		in.cl, in.topics, in.pattern = cl, body.Topics, body.Pattern
		q.w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

// fetchMaxBytes bounds the records a consumer instance's fetch brings:
// the body bound, at most 8 MiB.
func (a *API) fetchMaxBytes() int32 {
	return int32(min(a.cfg.MaxBodyBytes, 8<<20))
}

// revokeCommitTimeout bounds the commit of a revoke (rebalance, unsubscribe,
// delete, expiry, shutdown).
const revokeCommitTimeout = 10 * time.Second

// revoked commits, with auto-commit, the records returned of the revoked
// partitions (as franz-go's default revoke does; the records returned
// since the last auto-commit would be consumed again otherwise), then
// forgets what was fetched of them.
func (in *instance) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if in.autoCommit {
		ctx, cancel := context.WithTimeout(ctx, revokeCommitTimeout)
		err := cl.CommitMarkedOffsets(ctx)
		cancel()
		if err != nil {
			in.a.log.Warn("HTTP API: consumer instance could not commit at revoke", zap.String("group", in.group),
				zap.String("instance", in.id), zap.Error(err))
		}
	}
	in.lost(ctx, cl, revoked)
}

// lost forgets what was fetched of partitions no longer ours (no commit:
// the membership is gone).
func (in *instance) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	in.pmu.Lock()
	defer in.pmu.Unlock()
	for t, ps := range lost {
		for _, p := range ps {
			delete(in.assigned[t], p)
		}
	}
	in.dropLocked(lost)
}

// startOffsets is the AdjustFetchOffsetsFn: the partitions assigned start
// where a POST .../positions before the assignment put them; those
// partitions are consumed from now on. Positions of partitions this
// assignment did not give the instance are dropped (as a Kafka consumer's
// seek of an unassigned partition fails).
func (in *instance) startOffsets(_ context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	in.pmu.Lock()
	defer in.pmu.Unlock()
	if in.assigned == nil {
		in.assigned = map[string]map[int32]bool{}
	}
	for t, ps := range offsets {
		if in.assigned[t] == nil {
			in.assigned[t] = map[int32]bool{}
		}
		for p := range ps {
			in.assigned[t][p] = true
			if eo, ok := in.seeks[t][p]; ok {
				ps[p] = kgo.NewOffset().At(eo.Offset).WithEpoch(-1)
			}
		}
	}
	in.seeks = nil
	return offsets, nil
}

// dropLocked forgets what was fetched of partitions (pmu held).
func (in *instance) dropLocked(lost map[string][]int32) {
	gone := func(t string, p int32) bool {
		for _, lp := range lost[t] {
			if lp == p {
				return true
			}
		}
		return false
	}
	kept := in.pending[:0]
	for _, r := range in.pending {
		if !gone(r.Topic, r.Partition) {
			kept = append(kept, r)
		}
	}
	clear(in.pending[len(kept):])
	in.pending = kept
	for t, ps := range lost {
		for _, p := range ps {
			delete(in.returned[t], p)
		}
	}
}

// GET .../subscription
func (a *API) getSubscription(q *request) {
	a.withInstance(q, func(in *instance) error {
		out := map[string]any{"topics": append([]string{}, in.topics...)}
		if in.pattern != "" {
			out["topic_pattern"] = in.pattern
		}
		q.reply(http.StatusOK, mediaV2, out)
		return nil
	})
}

// DELETE .../subscription: leaves the group, the instance stays.
func (a *API) unsubscribe(q *request) {
	a.withInstance(q, func(in *instance) error {
		in.stopClient()
		q.w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func errNotSubscribed() *apiError {
	return newErr(http.StatusConflict, 40903, "Illegal state: the consumer instance is not subscribed to any topic (POST .../subscription first)")
}

// recordJSON is a consumed record; key and value base64 (binary) or JSON.
type recordJSON struct {
	Topic     string `json:"topic"`
	Key       any    `json:"key"`
	Value     any    `json:"value"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// Bounds of GET /records.
const (
	defaultRecordsTimeout = time.Second
	maxRecordsTimeout     = 30 * time.Second
	maxRecordsBytes       = 64 << 20
)

// GET .../records?timeout=ms&max_bytes=n
func (a *API) records(q *request) {
	query := q.r.URL.Query()
	timeout := defaultRecordsTimeout
	if s := query.Get("timeout"); s != "" {
		ms, err := strconv.ParseInt(s, 10, 64)
		if err != nil || ms < 0 {
			q.fail(errInvalid("timeout %q: want milliseconds, not negative", s))
			return
		}
		// Clamped before the multiplication, which overflows past 292
		// years of milliseconds.
		timeout = time.Duration(min(ms, maxRecordsTimeout.Milliseconds())) * time.Millisecond
	}
	maxBytes := int64(a.cfg.MaxBodyBytes)
	if s := query.Get("max_bytes"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			q.fail(errInvalid("max_bytes %q: want a positive number", s))
			return
		}
		maxBytes = min(n, maxRecordsBytes)
	}
	a.withInstance(q, func(in *instance) error {
		if err := acceptFormat(q.r, in.format); err != nil {
			return err
		}
		if in.cl == nil {
			return errNotSubscribed()
		}
		in.pmu.Lock()
		empty := len(in.pending) == 0
		in.pmu.Unlock()
		if empty {
			// The poll ends at the timeout, when the caller goes, and
			// when the instance is removed or the API closes (both wait
			// for mu to close the client).
			ctx, cancel := context.WithTimeout(q.ctx, timeout)
			stop := context.AfterFunc(in.ctx, cancel)
			fs := in.cl.PollFetches(ctx)
			stop()
			cancel()
			var ferr error
			fs.EachError(func(t string, p int32, err error) {
				if ferr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					ferr = clientErr(err, t, p)
				}
			})
			recs := fs.Records()
			in.pmu.Lock()
			in.pending = append(in.pending, recs...)
			in.pmu.Unlock()
			if ferr != nil && len(recs) == 0 {
				return ferr
			}
		}
		// Return what fits in max_bytes (always at least one record).
		in.pmu.Lock()
		var out []recordJSON
		var took []*kgo.Record
		size := int64(0)
		n := 0
		for _, r := range in.pending {
			sz := int64(len(r.Key) + len(r.Value))
			if n > 0 && size+sz > maxBytes {
				break
			}
			rj := recordJSON{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
			var err error
			if rj.Key, err = embed(r.Key, in.format); err == nil {
				rj.Value, err = embed(r.Value, in.format)
			}
			if err != nil {
				if n == 0 {
					in.pmu.Unlock()
					return newErr(http.StatusUnprocessableEntity, 42206, "record %s/%d@%d: %v: read it with a binary consumer, or seek past it (POST .../positions)", r.Topic, r.Partition, r.Offset, err)
				}
				break // answered next time, alone
			}
			out = append(out, rj)
			took = append(took, r)
			size += sz
			n++
		}
		clear(in.pending[:n])
		in.pending = in.pending[n:]
		if in.returned == nil {
			in.returned = map[string]map[int32]int64{}
		}
		for _, r := range took {
			if in.returned[r.Topic] == nil {
				in.returned[r.Topic] = map[int32]int64{}
			}
			in.returned[r.Topic][r.Partition] = r.Offset
		}
		in.pmu.Unlock()
		if in.autoCommit && len(took) > 0 {
			in.cl.MarkCommitRecords(took...)
		}
		if out == nil {
			out = []recordJSON{}
		}
		ct := mediaBinary
		if in.format == "json" {
			ct = mediaJSONV2
		}
		q.reply(http.StatusOK, ct, out)
		return nil
	})
}

// embed renders a key or value: base64 (binary; encoding/json does it for
// []byte) or the JSON it holds (json).
func embed(b []byte, format string) (any, error) {
	if b == nil {
		return nil, nil
	}
	if format == "binary" {
		return b, nil
	}
	if !json.Valid(b) {
		return nil, errors.New("not JSON, and the consumer's format is json")
	}
	return json.RawMessage(b), nil
}

// acceptFormat checks the Accept header against the instance's format.
func acceptFormat(r *http.Request, format string) error {
	acc := strings.ToLower(r.Header.Get("Accept"))
	if acc == "" || strings.Contains(acc, "*/*") || strings.Contains(acc, "application/json") || strings.Contains(acc, mediaV2) {
		return nil
	}
	want := mediaBinary
	if format == "json" {
		want = mediaJSONV2
	}
	if strings.Contains(acc, want) {
		return nil
	}
	return newErr(http.StatusNotAcceptable, 40601, "The requested embedded data format does not match the deserializer for this consumer instance (%s): Accept %s", format, want)
}

type partitionOffset struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Metadata  string `json:"metadata"` // always a string, as the REST Proxy answers it
}

type topicPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

// POST .../offsets: commits the offsets given (each the last record
// consumed, as the REST Proxy takes them: the group resumes after it), or
// with no body every record returned so far.
func (a *API) commitOffsets(q *request) {
	if err := checkV2(q, true); err != nil {
		q.fail(err)
		return
	}
	var body struct {
		Offsets []partitionOffset `json:"offsets"`
	}
	if err := decodeOptionalJSON(q.r.Body, &body); err != nil {
		q.fail(err)
		return
	}
	a.withInstance(q, func(in *instance) error {
		if in.cl == nil {
			return errNotSubscribed()
		}
		commit := map[string]map[int32]kgo.EpochOffset{}
		put := func(t string, p int32, next int64) {
			if commit[t] == nil {
				commit[t] = map[int32]kgo.EpochOffset{}
			}
			commit[t][p] = kgo.EpochOffset{Epoch: -1, Offset: next}
		}
		if len(body.Offsets) > 0 {
			for i, o := range body.Offsets {
				if o.Topic == "" || o.Partition < 0 || o.Offset < -1 {
					return errInvalid("offsets[%d]: want a topic, a partition >= 0 and an offset >= -1", i)
				}
				put(o.Topic, o.Partition, o.Offset+1)
			}
		} else {
			in.pmu.Lock()
			for t, ps := range in.returned {
				for p, o := range ps {
					put(t, p, o+1)
				}
			}
			in.pmu.Unlock()
		}
		if len(commit) == 0 {
			q.w.WriteHeader(http.StatusNoContent)
			return nil
		}
		ctx, cancel := context.WithTimeout(q.ctx, 15*time.Second)
		defer cancel()
		var cerr error
		in.cl.CommitOffsetsSync(ctx, commit, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				cerr = err
				return
			}
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if p.ErrorCode != 0 && cerr == nil {
						cerr = kafkaErr(p.ErrorCode, t.Topic, p.Partition)
					}
				}
			}
		})
		if cerr != nil {
			return clientErr(cerr, "", -1)
		}
		q.w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

// GET .../offsets {"partitions":[{"topic","partition"}]}: the group's
// committed offsets of those partitions.
func (a *API) committedOffsets(q *request) {
	var body struct {
		Partitions []topicPartition `json:"partitions"`
	}
	if err := checkV2(q, true); err != nil {
		q.fail(err)
		return
	}
	if err := decodeOptionalJSON(q.r.Body, &body); err != nil {
		q.fail(err)
		return
	}
	a.withInstance(q, func(in *instance) error {
		cl := in.cl
		if cl == nil {
			sc, err := a.clients.get(in.principal, in.client)
			if err != nil {
				return err
			}
			defer a.clients.release(sc)
			cl = sc.cl
		}
		ctx, cancel := context.WithTimeout(q.ctx, 15*time.Second)
		defer cancel()
		resp, err := kadm.NewClient(cl).FetchOffsets(ctx, in.group)
		if err != nil {
			return clientErr(err, "", -1)
		}
		if err := resp.Error(); err != nil {
			return clientErr(err, "", -1)
		}
		out := []partitionOffset{}
		if len(body.Partitions) == 0 {
			resp.Each(func(o kadm.OffsetResponse) {
				out = append(out, partitionOffset{Topic: o.Topic, Partition: o.Partition, Offset: o.At, Metadata: o.Metadata})
			})
		}
		for _, tp := range body.Partitions {
			if o, ok := resp.Lookup(tp.Topic, tp.Partition); ok {
				out = append(out, partitionOffset{Topic: tp.Topic, Partition: tp.Partition, Offset: o.At, Metadata: o.Metadata})
			}
		}
		q.reply(http.StatusOK, mediaV2, map[string]any{"offsets": out})
		return nil
	})
}

// POST .../positions {"offsets":[{"topic","partition","offset"}]}: the
// next records of those partitions (assigned to the instance) are from
// there.
func (a *API) seek(q *request) {
	if err := checkV2(q, false); err != nil {
		q.fail(err)
		return
	}
	var body struct {
		Offsets []partitionOffset `json:"offsets"`
	}
	if err := decodeJSON(q.r.Body, &body); err != nil {
		q.fail(err)
		return
	}
	set := map[string]map[int32]kgo.EpochOffset{}
	for i, o := range body.Offsets {
		if o.Topic == "" || o.Partition < 0 || o.Offset < 0 {
			q.fail(errInvalid("offsets[%d]: want a topic, a partition >= 0 and an offset >= 0", i))
			return
		}
		if set[o.Topic] == nil {
			set[o.Topic] = map[int32]kgo.EpochOffset{}
		}
		set[o.Topic][o.Partition] = kgo.EpochOffset{Epoch: -1, Offset: o.Offset}
	}
	a.withInstance(q, func(in *instance) error {
		return in.setOffsets(q, set)
	})
}

// setOffsets moves the positions of partitions: those consumed now at
// once, the others when the group assigns them (startOffsets). What was
// fetched of them and not returned is dropped.
func (in *instance) setOffsets(q *request, set map[string]map[int32]kgo.EpochOffset) error {
	if in.cl == nil {
		return errNotSubscribed()
	}
	now := map[string]map[int32]kgo.EpochOffset{}
	drop := map[string][]int32{}
	in.pmu.Lock()
	for t, ps := range set {
		for p, eo := range ps {
			drop[t] = append(drop[t], p)
			m := &in.seeks
			if in.assigned[t][p] {
				m = &now
			}
			if *m == nil {
				*m = map[string]map[int32]kgo.EpochOffset{}
			}
			if (*m)[t] == nil {
				(*m)[t] = map[int32]kgo.EpochOffset{}
			}
			(*m)[t][p] = eo
		}
	}
	in.dropLocked(drop)
	in.pmu.Unlock()
	// Not under pmu: the client may be calling a group callback, which
	// takes pmu, while holding what SetOffsets waits for. A partition
	// revoked in between is skipped, as it would be a moment later.
	in.cl.SetOffsets(now)
	q.w.WriteHeader(http.StatusNoContent)
	return nil
}

// POST .../positions/beginning and .../positions/end
// {"partitions":[{"topic","partition"}]}
func (a *API) seekBeginning(q *request) { a.seekEdge(q, true) }
func (a *API) seekEnd(q *request)       { a.seekEdge(q, false) }

func (a *API) seekEdge(q *request, start bool) {
	if err := checkV2(q, false); err != nil {
		q.fail(err)
		return
	}
	var body struct {
		Partitions []topicPartition `json:"partitions"`
	}
	if err := decodeJSON(q.r.Body, &body); err != nil {
		q.fail(err)
		return
	}
	a.withInstance(q, func(in *instance) error {
		if in.cl == nil {
			return errNotSubscribed()
		}
		set := map[string]map[int32]kgo.EpochOffset{}
		for i, tp := range body.Partitions {
			if tp.Topic == "" || tp.Partition < 0 {
				return errInvalid("partitions[%d]: want a topic and a partition >= 0", i)
			}
			sc, err := a.clients.get(in.principal, in.client)
			if err != nil {
				return err
			}
			ts := int64(-1)
			if start {
				ts = -2
			}
			off, err := a.listOffset(q, sc, tp.Topic, tp.Partition, ts)
			a.clients.release(sc)
			if err != nil {
				return err
			}
			if set[tp.Topic] == nil {
				set[tp.Topic] = map[int32]kgo.EpochOffset{}
			}
			set[tp.Topic][tp.Partition] = kgo.EpochOffset{Epoch: -1, Offset: off}
		}
		return in.setOffsets(q, set)
	})
}
