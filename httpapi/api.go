// Package httpapi is Synapse's HTTP API on the HTTP side port: the
// original one-record produce and fetch (/produce, /fetch), a batch
// produce (/produce/batch), and the Confluent REST Proxy v2 subset that
// Redpanda's HTTP Proxy serves (/topics, /consumers). See docs/http-api.md.
//
// It is a Kafka client of the broker it runs in: every request becomes
// Kafka requests on in-process connections (broker.Server.DialInternal)
// authenticated as the HTTP caller's principal, so the broker's produce
// path (idempotence checks, size limits, retention, durability), its
// consumer groups and its ACLs apply to HTTP callers exactly as to Kafka
// clients.
package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/auth"
)

// Broker is what the API needs of the broker (*broker.Server).
type Broker interface {
	// DialInternal connects to the broker as principal, from client.
	DialInternal(principal, client string) (net.Conn, error)
	// Secured reports whether callers must log in.
	Secured() bool
	// Login checks a user's password and returns its principal; a
	// failure is answered after the broker's delay for failed logins.
	Login(user, password, client string) (string, bool)
}

// Config configures the API. Zero fields take the defaults shown.
type Config struct {
	Broker Broker
	Logger *zap.Logger
	// MaxBodyBytes bounds a request body (default 8 MiB).
	MaxBodyBytes int64
	// MaxRecords bounds the records of one produce request (default 10000).
	MaxRecords int
	// MaxInstancesPerGroup bounds REST consumer instances per group
	// (default 100); MaxInstances bounds them in all (default 1000).
	MaxInstancesPerGroup, MaxInstances int
	// InstanceTimeout removes a consumer instance unused this long
	// (Confluent's consumer.instance.timeout.ms; default 5 min).
	InstanceTimeout time.Duration
	// MaxClients bounds the cached per-principal Kafka clients (default 64).
	MaxClients int
}

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 8 << 20
	}
	if c.MaxRecords <= 0 {
		c.MaxRecords = 10000
	}
	if c.MaxInstancesPerGroup <= 0 {
		c.MaxInstancesPerGroup = 100
	}
	if c.MaxInstances <= 0 {
		c.MaxInstances = 1000
	}
	if c.InstanceTimeout <= 0 {
		c.InstanceTimeout = 5 * time.Minute
	}
	if c.MaxClients <= 0 {
		c.MaxClients = 64
	}
}

// API is the HTTP API's handler.
type API struct {
	cfg       Config
	log       *zap.Logger
	mux       *http.ServeMux
	clients   *clientCache
	consumers *consumers
	closed    atomic.Bool
	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup // the janitor
}

// New returns the API; Close releases its clients.
func New(cfg Config) *API {
	cfg.setDefaults()
	a := &API{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.clients = newClientCache(cfg.Broker, cfg.MaxClients)
	a.consumers = newConsumers(a)
	a.routes()
	a.wg.Add(1)
	go a.janitor()
	return a
}

func (a *API) routes() {
	h := func(pattern string, fn func(*request)) { a.mux.HandleFunc(pattern, a.wrap(fn)) }
	h("POST /produce", a.produceOne)
	h("POST /produce/batch", a.produceBatch)
	h("GET /fetch", a.fetchOne)

	h("GET /topics", a.listTopics)
	h("GET /topics/{topic}", a.getTopic)
	h("POST /topics/{topic}", a.restProduce)
	h("GET /topics/{topic}/partitions", a.listPartitions)
	h("GET /topics/{topic}/partitions/{partition}", a.getPartition)
	h("POST /topics/{topic}/partitions/{partition}", a.restProduce)
	h("GET /topics/{topic}/partitions/{partition}/offsets", a.partitionOffsets)

	const inst = "/consumers/{group}/instances/{instance}"
	h("POST /consumers/{group}", a.createConsumer)
	h("DELETE "+inst, a.deleteConsumer)
	h("POST "+inst+"/subscription", a.subscribe)
	h("GET "+inst+"/subscription", a.getSubscription)
	h("DELETE "+inst+"/subscription", a.unsubscribe)
	h("GET "+inst+"/records", a.records)
	h("POST "+inst+"/offsets", a.commitOffsets)
	h("GET "+inst+"/offsets", a.committedOffsets)
	h("POST "+inst+"/positions", a.seek)
	h("POST "+inst+"/positions/beginning", a.seekBeginning)
	h("POST "+inst+"/positions/end", a.seekEnd)
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errNotFound(40400, "no such endpoint: %s %s (see docs/http-api.md)", r.Method, r.URL.Path))
	})
}

// Owns reports whether path is one of the API's (the side port serves the
// rest: /healthz, /metrics, ...).
func Owns(path string) bool {
	switch {
	case path == "/produce", path == "/produce/batch", path == "/fetch", path == "/topics":
		return true
	}
	return strings.HasPrefix(path, "/topics/") || strings.HasPrefix(path, "/consumers/")
}

// Mount returns a handler serving the API's paths and next's others.
func (a *API) Mount(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if Owns(r.URL.Path) {
			a.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// Close removes every consumer instance (each leaves its group, committing
// what it auto-commits) and closes the Kafka clients, within ctx. Requests
// after it are answered 503; long polls of GET /records end at once.
func (a *API) Close(ctx context.Context) {
	if a.closed.Swap(true) {
		return
	}
	a.cancel()
	a.wg.Wait()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, in := range a.consumers.removeAll() {
			go a.consumers.closeRemoved(in)
		}
		// Also the instances the janitor expired and DELETEs removed,
		// still closing.
		a.consumers.closing.Wait()
		a.clients.closeAll()
	}()
	select {
	case <-done:
	case <-ctx.Done():
		a.log.Warn("HTTP API: clients still closing at the deadline")
	}
}

// janitor removes idle consumer instances and idle clients.
func (a *API) janitor() {
	defer a.wg.Done()
	every := min(a.cfg.InstanceTimeout/4, 10*time.Second)
	t := time.NewTicker(max(every, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case now := <-t.C:
			for _, in := range a.consumers.expire(now.Add(-a.cfg.InstanceTimeout)) {
				a.log.Info("HTTP API: consumer instance expired", zap.String("group", in.group), zap.String("instance", in.id))
				go a.consumers.closeRemoved(in)
			}
			a.clients.expire(now.Add(-clientIdle))
		}
	}
}

// request is one HTTP request being served: who asks, from where.
type request struct {
	w         http.ResponseWriter
	r         *http.Request
	ctx       context.Context
	principal string
	client    string // "ip:port" of the caller
}

// wrap authenticates (HTTP Basic when the broker is secured), bounds the
// body and turns a handler's error into the API's JSON error.
func (a *API) wrap(fn func(*request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.closed.Load() {
			writeError(w, errShuttingDown())
			return
		}
		req := &request{w: w, r: r, ctx: r.Context(), principal: auth.Anonymous, client: r.RemoteAddr}
		if a.cfg.Broker.Secured() {
			host, _, err := net.SplitHostPort(r.RemoteAddr)
			if err != nil {
				host = r.RemoteAddr
			}
			u, p, ok := r.BasicAuth()
			if !ok {
				w.Header().Set("WWW-Authenticate", `Basic realm="synapse"`)
				writeError(w, &apiError{status: http.StatusUnauthorized, code: 40101, msg: "authentication required: HTTP Basic with a SASL user of the broker"})
				return
			}
			// A failed login is answered after the broker's
			// FailedAuthDelay, as a failed SASL exchange is.
			principal, ok := a.cfg.Broker.Login(u, p, host)
			if !ok {
				w.Header().Set("WWW-Authenticate", `Basic realm="synapse"`)
				writeError(w, &apiError{status: http.StatusUnauthorized, code: 40101, msg: "authentication failed"})
				return
			}
			req.principal = principal
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes)
		}
		fn(req)
	}
}

// apiError is an error answered in the REST Proxy's shape: an HTTP status
// and {"error_code": ..., "message": ...}.
type apiError struct {
	status int
	code   int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func newErr(status, code int, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func errBadRequest(format string, args ...any) *apiError {
	return newErr(http.StatusBadRequest, 40001, format, args...)
}

func errInvalid(format string, args ...any) *apiError {
	return newErr(http.StatusUnprocessableEntity, 42201, format, args...)
}

func errNotFound(code int, format string, args ...any) *apiError {
	return newErr(http.StatusNotFound, code, format, args...)
}

func errTopicNotFound(topic string) *apiError {
	return errNotFound(40401, "Topic %s not found.", topic)
}

func errPartitionNotFound(topic string, p int32) *apiError {
	return errNotFound(40402, "Partition %d of topic %s not found.", p, topic)
}

func errShuttingDown() *apiError {
	return newErr(http.StatusServiceUnavailable, 50301, "the broker is shutting down")
}

func errInstanceNotFound() *apiError {
	return errNotFound(40403, "Consumer instance not found.")
}

func errContentType(got string, want ...string) *apiError {
	if got == "" {
		got = "none"
	}
	return newErr(http.StatusUnsupportedMediaType, 41501, "Content-Type %s is not supported here: send %s", got, strings.Join(want, " or "))
}

// kafkaErr maps a Kafka error code (non-zero) of topic's partition p (p <
// 0: none) to the API's error.
func kafkaErr(code int16, topic string, p int32) *apiError {
	err := kerr.ErrorForCode(code)
	var ke *kerr.Error
	errors.As(err, &ke)
	switch code {
	case kerr.UnknownTopicOrPartition.Code, kerr.UnknownTopicID.Code:
		if p >= 0 {
			return errPartitionNotFound(topic, p)
		}
		return errTopicNotFound(topic)
	case kerr.TopicAuthorizationFailed.Code:
		return newErr(http.StatusForbidden, 40301, "Not authorized to access topic %s (%s)", topic, ke.Message)
	case kerr.GroupAuthorizationFailed.Code:
		return newErr(http.StatusForbidden, 40302, "Not authorized to access the group (%s)", ke.Message)
	case kerr.ClusterAuthorizationFailed.Code, kerr.TransactionalIDAuthorizationFailed.Code:
		return newErr(http.StatusForbidden, 40303, "Not authorized (%s)", ke.Message)
	case kerr.MessageTooLarge.Code, kerr.RecordListTooLarge.Code:
		return newErr(http.StatusRequestEntityTooLarge, 41301, "%s: %s", ke.Message, ke.Description)
	case kerr.InvalidTopicException.Code:
		return errInvalid("invalid topic name %q: %s", topic, ke.Description)
	case kerr.InvalidRecord.Code, kerr.CorruptMessage.Code, kerr.InvalidTimestamp.Code, kerr.InvalidRequest.Code,
		kerr.PolicyViolation.Code, kerr.InvalidPartitions.Code, kerr.InvalidReplicationFactor.Code, kerr.InvalidConfig.Code,
		kerr.InvalidRequiredAcks.Code, kerr.UnsupportedForMessageFormat.Code:
		return errInvalid("%s: %s", ke.Message, ke.Description)
	case kerr.UnknownMemberID.Code, kerr.IllegalGeneration.Code, kerr.RebalanceInProgress.Code, kerr.FencedInstanceID.Code:
		return newErr(http.StatusConflict, 40901, "%s: the instance's group membership changed (%s); poll again", ke.Message, ke.Description)
	}
	if ke != nil && ke.Retriable {
		return newErr(http.StatusServiceUnavailable, 50301, "%s (retriable): %s", ke.Message, ke.Description)
	}
	if ke != nil {
		return newErr(http.StatusInternalServerError, 50001, "%s: %s", ke.Message, ke.Description)
	}
	return newErr(http.StatusInternalServerError, 50001, "Kafka error code %d", code)
}

// clientErr maps an error of a Kafka client call.
func clientErr(err error, topic string, p int32) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return kafkaErr(ke.Code, topic, p)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return newErr(http.StatusGatewayTimeout, 50401, "the broker did not answer in time: %v", err)
	case errors.Is(err, context.Canceled):
		return newErr(499, 49901, "request cancelled")
	case errors.Is(err, kgo.ErrClientClosed):
		return errShuttingDown()
	}
	return newErr(http.StatusServiceUnavailable, 50301, "broker unavailable: %v", err)
}

// fail answers err (an *apiError, or a client error mapped by clientErr).
func (q *request) fail(err error) {
	writeError(q.w, clientErr(err, "", -1))
}

func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(e.status)
	json.NewEncoder(w).Encode(map[string]any{"error_code": e.code, "message": e.msg})
}

// reply answers status with v as JSON of contentType.
func (q *request) reply(status int, contentType string, v any) {
	q.w.Header().Set("Content-Type", contentType)
	q.w.WriteHeader(status)
	if v != nil {
		json.NewEncoder(q.w).Encode(v)
	}
}

// bodyErr maps an error reading or decoding the body.
func bodyErr(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return newErr(http.StatusRequestEntityTooLarge, 41302, "request body larger than %d bytes", mbe.Limit)
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	var b64 base64.CorruptInputError
	switch {
	case errors.As(err, &se):
		return errBadRequest("malformed JSON at byte %d: %v", se.Offset, err)
	case errors.As(err, &te):
		return errInvalid("JSON field %q: want %s, got %s", te.Field, te.Type, te.Value)
	case errors.As(err, &b64):
		return errInvalid("bad base64 at byte %d of a key or value (JSON []byte fields are standard base64)", int64(b64))
	}
	return errBadRequest("bad request body: %v", err)
}

// mediaType is the request's Content-Type without parameters, lower case.
func mediaType(r *http.Request) string {
	ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	return strings.ToLower(strings.TrimSpace(ct))
}
