// Package coord is the coordination layer of Synapse's cluster mode. It keeps
// cluster metadata in etcd v3: broker registrations bound to session leases,
// the controller election, topic and partition pointers with their epochs, and
// the producer-id allocator. Log data never goes through etcd.
//
// Every key lives under PrefixFor(cluster):
//
//	cluster_id                 random id, created once
//	brokers/<id>               BrokerInfo, bound to the broker's session lease
//	controller/                concurrency.Election prefix
//	topics/<name>              TopicInfo
//	parts/<name>/<partition>   PartState
//	pid/next                   next free producer id (decimal)
//
// Values are JSON. Writers that depend on what they read use the key's
// ModRevision as a compare-and-swap token; controller writes also carry the
// Leadership fence so a deposed controller cannot overwrite its successor.
package coord

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Errors returned by Client methods, always wrapped with context; test with errors.Is.
var (
	// ErrExists: the topic to create is already there.
	ErrExists = errors.New("coord: already exists")
	// ErrNotFound: the topic to delete is not there.
	ErrNotFound = errors.New("coord: not found")
	// ErrConflict: a compare failed, i.e. the CAS token is stale or the
	// fence is lost; re-read before retrying.
	ErrConflict = errors.New("coord: conflicting update (compare failed)")
	// ErrNotController is for callers that refuse controller work without a
	// Leadership; this package reports a lost fence as ErrConflict.
	ErrNotController = errors.New("coord: not the controller")
	// ErrNodeIDInUse: another live session has registered the broker id.
	ErrNodeIDInUse = errors.New("coord: node id in use by another live broker")
	// ErrSessionLost: the session lease is gone; the Client is useless and
	// the broker must redial.
	ErrSessionLost = errors.New("coord: etcd session lost")
)

const (
	defaultTTL         = 3 * time.Second
	minTTL             = 2 * time.Second // etcd's minimum lease TTL with default election settings
	defaultDialTimeout = 5 * time.Second

	// firstProducerID is where allocation starts when pid/next is absent; ids
	// below it are left free for special uses.
	firstProducerID = 1000

	// maxTxnOps stays below etcd's default --max-txn-ops of 128.
	maxTxnOps = 120
)

// Config configures a Client.
type Config struct {
	Endpoints   []string      // etcd client URLs
	Cluster     string        // cluster name, part of the key prefix
	TTL         time.Duration // session TTL, default 3s (rounded up to seconds; minimum 2s)
	DialTimeout time.Duration // default 5s; also bounds Dial's bootstrap requests
	Logger      *zap.Logger   // nil means no logging
}

// BrokerInfo is the value of brokers/<id>.
type BrokerInfo struct {
	ID          int32  `json:"id"`
	Host        string `json:"host"`
	Port        int32  `json:"port"`
	Rack        string `json:"rack,omitempty"`
	Incarnation int64  `json:"incarnation"` // the session lease id
	// PeerHost and PeerPort, if set, are where other brokers fetch from
	// (else Host and Port, the clients' address).
	PeerHost string `json:"peer_host,omitempty"`
	PeerPort int32  `json:"peer_port,omitempty"`
	// DirID names the broker's data directory: a broker back with another
	// (an empty disk) is not the replica the ISR counted.
	DirID string `json:"dir_id,omitempty"`
	// RegRev is the revision its registration was created at (from the
	// watch, not stored): a partition state older than it was granted to
	// an earlier run of the broker.
	RegRev int64 `json:"-"`
}

// TopicInfo is the value of topics/<name>.
type TopicInfo struct {
	Name       string            `json:"name"`
	ID         string            `json:"id"` // hex of the 16-byte topic id
	Partitions int32             `json:"partitions"`
	RF         int32             `json:"replication_factor"`
	Configs    map[string]string `json:"configs,omitempty"`
}

// PartState is the value of parts/<name>/<partition>.
type PartState struct {
	Leader   int32   `json:"leader"` // -1: none
	Epoch    int32   `json:"leader_epoch"`
	Replicas []int32 `json:"replicas"`
	ISR      []int32 `json:"isr"`
	// A reassignment under way (Kafka's adding and removing replicas):
	// Replicas is the target followed by Removing; once every Adding
	// member is in the ISR, the controller drops Removing.
	Adding   []int32 `json:"adding,omitempty"`
	Removing []int32 `json:"removing,omitempty"`
}

// PartKey names a partition.
type PartKey struct {
	Topic     string
	Partition int32
}

// Part is a partition's state with the ModRevision to use as CAS token.
type Part struct {
	State  PartState
	ModRev int64
}

// Topic is a topic's info with the ModRevision to use as CAS token.
type Topic struct {
	Info   TopicInfo
	ModRev int64
}

// TierPtr is the value of tier/<topic>/<partition>: the key of the
// partition's committed manifest in the bucket, and the leader epoch that
// committed it. ModRev (from the watch, not stored) is the CAS token of the
// next commit.
type TierPtr struct {
	Manifest string `json:"manifest"`
	Epoch    int32  `json:"leader_epoch"`
	// Next and LogStart are the manifest's end and log start, set by a
	// restore (RestoreTopic): a leader whose log ends before Next starts it
	// over there before it serves.
	Next     int64 `json:"next,omitempty"`
	LogStart int64 `json:"log_start,omitempty"`
	ModRev   int64 `json:"-"`
}

// PartUpdate is one conditional partition write for SetParts.
type PartUpdate struct {
	Key    PartKey
	State  PartState
	ModRev int64 // 0: the key must not exist
}

// PrefixFor returns the etcd key prefix of a cluster.
func PrefixFor(cluster string) string {
	return "/synapse/" + cluster + "/"
}

// Client is one broker's connection to the coordination store. Its session
// lease is the broker's liveness: when it expires, the broker's registration
// and any election candidacy vanish with it.
type Client struct {
	cli       *clientv3.Client
	sess      *concurrency.Session
	prefix    string
	clusterID string
	log       *zap.Logger

	closeOnce sync.Once
	closeErr  error
}

// Dial connects to etcd, creates the session lease and gets or creates the
// cluster id. The bootstrap requests are bounded by both ctx and DialTimeout,
// so an unreachable etcd fails Dial instead of hanging it.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("coord: dial: no etcd endpoints")
	}
	if err := validName("cluster", cfg.Cluster); err != nil {
		return nil, fmt.Errorf("coord: dial: %w", err)
	}
	if cfg.TTL <= 0 {
		cfg.TTL = defaultTTL
	}
	cfg.TTL = max(cfg.TTL, minTTL)
	ttlSec := int((cfg.TTL + time.Second - 1) / time.Second)
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = defaultDialTimeout
	}
	lg := cfg.Logger
	if lg == nil {
		lg = zap.NewNop()
	}
	lg = lg.Named("coord")

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		// The etcd client logs every retry at info; keep only what matters.
		Logger: lg.Named("etcd").WithOptions(zap.IncreaseLevel(zapcore.WarnLevel)),
	})
	if err != nil {
		return nil, fmt.Errorf("coord: dial %v: %w", cfg.Endpoints, err)
	}

	bctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()

	// Grant the lease ourselves so the caller's ctx bounds it; NewSession's own
	// context must outlive Dial because it drives the keep-alives.
	grant, err := cli.Grant(bctx, int64(ttlSec))
	if err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("coord: dial: grant session lease: %w", err)
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithLease(grant.ID), concurrency.WithTTL(ttlSec))
	if err != nil {
		_, _ = cli.Revoke(bctx, grant.ID)
		_ = cli.Close()
		return nil, fmt.Errorf("coord: dial: start session: %w", err)
	}
	c := &Client{
		cli:    cli,
		sess:   sess,
		prefix: PrefixFor(cfg.Cluster),
		log:    lg.With(zap.String("cluster", cfg.Cluster)),
	}
	c.clusterID, err = c.ensureClusterID(bctx)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("coord: dial: %w", err)
	}
	c.log.Info("connected to etcd",
		zap.Strings("endpoints", cfg.Endpoints),
		zap.String("cluster_id", c.clusterID),
		zap.Int64("lease", c.LeaseID()),
		zap.Int("ttl_s", ttlSec))
	return c, nil
}

// ensureClusterID returns the stored cluster id, creating it in the same
// round trip if it is absent so that racing first brokers agree on one id.
func (c *Client) ensureClusterID(ctx context.Context) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate cluster id: %w", err)
	}
	id := base64.RawURLEncoding.EncodeToString(b[:])
	k := c.prefix + "cluster_id"
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, id)).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return "", fmt.Errorf("get or create cluster id: %w", err)
	}
	if resp.Succeeded {
		return id, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return "", errors.New("get or create cluster id: key vanished")
	}
	return string(kvs[0].Value), nil
}

// ClusterID returns the cluster id stored in etcd.
func (c *Client) ClusterID() string { return c.clusterID }

// LeaseID returns the session lease id, which is also the broker's incarnation.
func (c *Client) LeaseID() int64 { return int64(c.sess.Lease()) }

// Done is closed when the session is lost (lease expired or revoked, or the
// client closed). A broker must stop acting as a cluster member then.
func (c *Client) Done() <-chan struct{} { return c.sess.Done() }

// Close revokes the session, so brokers/<id> and any candidacy vanish at once
// rather than after the TTL, and closes the etcd client. It is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		// Revoking an already expired lease is not a failure of Close.
		if err := c.sess.Close(); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			errs = append(errs, fmt.Errorf("revoke session: %w", err))
		}
		if err := c.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("close etcd client: %w", err))
		}
		if err := errors.Join(errs...); err != nil {
			c.closeErr = fmt.Errorf("coord: close: %w", err)
		}
	})
	return c.closeErr
}

// Register publishes b under brokers/<id> bound to the session lease. It
// succeeds if the id is free or already ours (re-registration after a config
// change), and fails with ErrNodeIDInUse if another session holds it; a
// crashed broker's id frees up when its lease expires, after at most the TTL.
// The stored Incarnation is always the lease id.
func (c *Client) Register(ctx context.Context, b BrokerInfo) error {
	if b.ID < 0 {
		return fmt.Errorf("coord: register broker %d: negative id", b.ID)
	}
	lease := c.sess.Lease()
	b.Incarnation = int64(lease)
	val, err := json.Marshal(b)
	if err != nil {
		return fmt.Errorf("coord: register broker %d: encode: %w", b.ID, err)
	}
	k := c.brokerKey(b.ID)
	put := clientv3.OpPut(k, string(val), clientv3.WithLease(lease))
	// A missing key compares as lease 0, so "free" and "ours" need separate
	// compares: a nested txn keeps it to one round trip.
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(put).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(k), "=", lease)},
			[]clientv3.Op{put}, nil)).
		Commit()
	if err != nil {
		return c.wrapErr(fmt.Sprintf("register broker %d", b.ID), err)
	}
	if resp.Succeeded || resp.Responses[0].GetResponseTxn().GetSucceeded() {
		c.log.Info("registered broker", zap.Int32("id", b.ID), zap.Int64("incarnation", b.Incarnation))
		return nil
	}
	return fmt.Errorf("coord: register broker %d: %w", b.ID, ErrNodeIDInUse)
}

// CreateTopic stores a new topic; ErrExists if the name is taken.
func (c *Client) CreateTopic(ctx context.Context, t TopicInfo) error {
	if err := validName("topic", t.Name); err != nil {
		return fmt.Errorf("coord: create topic: %w", err)
	}
	val, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("coord: create topic %q: encode: %w", t.Name, err)
	}
	k := c.topicKey(t.Name)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(val))).
		Commit()
	if err != nil {
		return c.wrapErr(fmt.Sprintf("create topic %q", t.Name), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("coord: create topic %q: %w", t.Name, ErrExists)
	}
	return nil
}

// UpdateTopic overwrites a topic if it is unchanged since modRev; else
// ErrConflict (which also covers a deleted topic).
func (c *Client) UpdateTopic(ctx context.Context, t TopicInfo, modRev int64) error {
	if err := validName("topic", t.Name); err != nil {
		return fmt.Errorf("coord: update topic: %w", err)
	}
	if modRev <= 0 {
		return fmt.Errorf("coord: update topic %q: invalid mod revision %d", t.Name, modRev)
	}
	val, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("coord: update topic %q: encode: %w", t.Name, err)
	}
	k := c.topicKey(t.Name)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", modRev)).
		Then(clientv3.OpPut(k, string(val))).
		Commit()
	if err != nil {
		return c.wrapErr(fmt.Sprintf("update topic %q", t.Name), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("coord: update topic %q: %w", t.Name, ErrConflict)
	}
	return nil
}

// DeleteTopic removes a topic and all its partition states atomically, so no
// watcher ever sees partitions of a deleted topic.
func (c *Client) DeleteTopic(ctx context.Context, name string) error {
	if err := validName("topic", name); err != nil {
		return fmt.Errorf("coord: delete topic: %w", err)
	}
	k := c.topicKey(name)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), ">", 0)).
		Then(
			clientv3.OpDelete(k),
			// The trailing slash keeps topic "a" from deleting parts of "ab".
			clientv3.OpDelete(c.partsPrefix(name), clientv3.WithPrefix()),
			clientv3.OpDelete(c.prefix+"tier/"+name+"/", clientv3.WithPrefix()),
		).
		Commit()
	if err != nil {
		return c.wrapErr(fmt.Sprintf("delete topic %q", name), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("coord: delete topic %q: %w", name, ErrNotFound)
	}
	return nil
}

// SetPart writes a partition state if the key is unchanged since modRev
// (0: it must not exist) and every fence compare holds, and returns the new
// ModRevision. A failed compare, including a lost fence, is ErrConflict.
func (c *Client) SetPart(ctx context.Context, k PartKey, st PartState, modRev int64, fence ...clientv3.Cmp) (newModRev int64, err error) {
	op := fmt.Sprintf("set partition %s-%d", k.Topic, k.Partition)
	cmp, put, err := c.partOps(k, st, modRev)
	if err != nil {
		return 0, fmt.Errorf("coord: %s: %w", op, err)
	}
	cmps := append([]clientv3.Cmp{cmp}, fence...)
	resp, err := c.cli.Txn(ctx).If(cmps...).Then(put).Commit()
	if err != nil {
		return 0, c.wrapErr(op, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("coord: %s: %w", op, ErrConflict)
	}
	return resp.Header.Revision, nil
}

// SetParts applies several conditional partition writes. They are split into
// transactions that fit etcd's --max-txn-ops, each carrying the fence
// compares. Each transaction is atomic but the batch is not: on ErrConflict
// the transactions before the failed one have been applied and the ones after
// it were not attempted, so callers must re-read (e.g. the next View) before
// retrying. A key may appear only once per call.
func (c *Client) SetParts(ctx context.Context, ups []PartUpdate, fence ...clientv3.Cmp) error {
	if len(ups) == 0 {
		return nil
	}
	// Each update costs a compare and a put.
	perTxn := (maxTxnOps - len(fence)) / 2
	if perTxn < 1 {
		return fmt.Errorf("coord: set partitions: %d fence compares leave no room in a transaction", len(fence))
	}
	// Validate everything before the first write so a bad entry cannot leave
	// the batch half applied.
	seen := make(map[PartKey]struct{}, len(ups))
	cmps := make([]clientv3.Cmp, len(ups))
	puts := make([]clientv3.Op, len(ups))
	for i, u := range ups {
		if _, dup := seen[u.Key]; dup {
			return fmt.Errorf("coord: set partitions: duplicate partition %s-%d", u.Key.Topic, u.Key.Partition)
		}
		seen[u.Key] = struct{}{}
		var err error
		cmps[i], puts[i], err = c.partOps(u.Key, u.State, u.ModRev)
		if err != nil {
			return fmt.Errorf("coord: set partitions: %s-%d: %w", u.Key.Topic, u.Key.Partition, err)
		}
	}
	txnCmps := make([]clientv3.Cmp, 0, min(len(ups), perTxn)+len(fence))
	for start := 0; start < len(ups); start += perTxn {
		end := min(start+perTxn, len(ups))
		txnCmps = append(append(txnCmps[:0], cmps[start:end]...), fence...)
		resp, err := c.cli.Txn(ctx).If(txnCmps...).Then(puts[start:end]...).Commit()
		if err != nil {
			return c.wrapErr(fmt.Sprintf("set partitions [%d:%d] of %d", start, end, len(ups)), err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("coord: set partitions [%d:%d] of %d (earlier ones applied): %w",
				start, end, len(ups), ErrConflict)
		}
	}
	return nil
}

// partOps builds the CAS compare and the put of one partition write.
func (c *Client) partOps(k PartKey, st PartState, modRev int64) (clientv3.Cmp, clientv3.Op, error) {
	if err := validName("topic", k.Topic); err != nil {
		return clientv3.Cmp{}, clientv3.Op{}, err
	}
	if k.Partition < 0 {
		return clientv3.Cmp{}, clientv3.Op{}, fmt.Errorf("negative partition %d", k.Partition)
	}
	if modRev < 0 {
		return clientv3.Cmp{}, clientv3.Op{}, fmt.Errorf("invalid mod revision %d", modRev)
	}
	val, err := json.Marshal(st)
	if err != nil {
		return clientv3.Cmp{}, clientv3.Op{}, fmt.Errorf("encode: %w", err)
	}
	key := c.partKey(k)
	cmp := clientv3.Compare(clientv3.ModRevision(key), "=", modRev)
	if modRev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", int64(0))
	}
	return cmp, clientv3.OpPut(key, string(val)), nil
}

// AllocProducerIDs reserves n consecutive producer ids and returns the first.
// The CAS on pid/next guarantees disjoint ranges across concurrent callers,
// even on different brokers.
func (c *Client) AllocProducerIDs(ctx context.Context, n int64) (first int64, err error) {
	if n <= 0 {
		return 0, fmt.Errorf("coord: allocate producer ids: invalid count %d", n)
	}
	k := c.prefix + "pid/next"
	resp, err := c.cli.Get(ctx, k)
	if err != nil {
		return 0, c.wrapErr("allocate producer ids", err)
	}
	kvs := resp.Kvs
	for {
		next := int64(firstProducerID)
		cmp := clientv3.Compare(clientv3.CreateRevision(k), "=", int64(0))
		if len(kvs) > 0 {
			next, err = strconv.ParseInt(string(kvs[0].Value), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("coord: allocate producer ids: corrupt %s: %w", k, err)
			}
			cmp = clientv3.Compare(clientv3.ModRevision(k), "=", kvs[0].ModRevision)
		}
		if next < 0 || next > math.MaxInt64-n {
			return 0, fmt.Errorf("coord: allocate producer ids: id space exhausted at %d", next)
		}
		// The Else branch re-reads the key so a lost race costs one round trip.
		tresp, err := c.cli.Txn(ctx).
			If(cmp).
			Then(clientv3.OpPut(k, strconv.FormatInt(next+n, 10))).
			Else(clientv3.OpGet(k)).
			Commit()
		if err != nil {
			return 0, c.wrapErr("allocate producer ids", err)
		}
		if tresp.Succeeded {
			return next, nil
		}
		kvs = tresp.Responses[0].GetResponseRange().GetKvs()
	}
}

// wrapErr adds context to an etcd error and reports writes refused because
// the session lease is gone as ErrSessionLost.
func (c *Client) wrapErr(op string, err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("coord: %s: %w (%w)", op, ErrSessionLost, err)
	}
	return fmt.Errorf("coord: %s: %w", op, err)
}

func (c *Client) brokerKey(id int32) string {
	return c.prefix + "brokers/" + strconv.FormatInt(int64(id), 10)
}

func (c *Client) topicKey(name string) string { return c.prefix + "topics/" + name }

func (c *Client) partsPrefix(topic string) string { return c.prefix + "parts/" + topic + "/" }

func (c *Client) partKey(k PartKey) string {
	return c.partsPrefix(k.Topic) + strconv.FormatInt(int64(k.Partition), 10)
}

// validName rejects names that would escape their place in the keyspace.
func validName(what, s string) error {
	if s == "" {
		return fmt.Errorf("empty %s name", what)
	}
	if strings.ContainsRune(s, '/') {
		return fmt.Errorf("%s name %q contains '/'", what, s)
	}
	return nil
}

// Ping reads the cluster id key: one round trip to etcd (a latency probe).
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.cli.Get(ctx, c.prefix+"cluster_id")
	return c.wrapErr("ping", err)
}

// SetDirs records, for each broker, the data directory the cluster knows
// it by (dirs/<id>, no lease), fenced like any controller write.
func (c *Client) SetDirs(ctx context.Context, dirs map[int32]string, fence ...clientv3.Cmp) error {
	if len(dirs) == 0 {
		return nil
	}
	ops := make([]clientv3.Op, 0, len(dirs))
	for id, d := range dirs {
		ops = append(ops, clientv3.OpPut(c.prefix+"dirs/"+strconv.Itoa(int(id)), d))
	}
	resp, err := c.cli.Txn(ctx).If(fence...).Then(ops...).Commit()
	if err != nil {
		return c.wrapErr("set dirs", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("coord: set dirs: %w", ErrConflict)
	}
	return nil
}

// CommitManifest makes manifest the committed one of partition k, written
// at leader epoch epoch, if the partition's state is still the one at
// partModRev (the writer read itself as its leader at epoch there) and the
// pointer still the one at tierModRev (0: none yet). A deposed leader, or
// one that has not seen the last commit, gets ErrConflict: nothing it
// uploads becomes part of the log. It returns the pointer's new
// ModRevision.
func (c *Client) CommitManifest(ctx context.Context, k PartKey, manifest string, epoch int32, partModRev, tierModRev int64) (int64, error) {
	op := fmt.Sprintf("commit the manifest of %s-%d", k.Topic, k.Partition)
	if err := validName("topic", k.Topic); err != nil || k.Partition < 0 || manifest == "" || partModRev <= 0 {
		return 0, fmt.Errorf("coord: %s: bad arguments (%q, %d, %v)", op, manifest, partModRev, err)
	}
	b, err := json.Marshal(TierPtr{Manifest: manifest, Epoch: epoch})
	if err != nil {
		return 0, err
	}
	tk := c.prefix + "tier/" + k.Topic + "/" + strconv.Itoa(int(k.Partition))
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(c.partKey(k)), "=", partModRev),
			clientv3.Compare(clientv3.ModRevision(tk), "=", tierModRev)).
		Then(clientv3.OpPut(tk, string(b))).
		Commit()
	if err != nil {
		return 0, c.wrapErr(op, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("coord: %s: %w", op, ErrConflict)
	}
	return resp.Header.Revision, nil
}

func (c *Client) tierKey(k PartKey) string {
	return c.prefix + "tier/" + k.Topic + "/" + strconv.Itoa(int(k.Partition))
}

// RestoreTopic writes a topic restored from the bucket: its partition
// states and manifest pointers first, then the topic itself if no topic of
// that name exists (ErrConflict otherwise), every transaction fenced. Until
// the topic is there no broker acts on its partitions, so a restore cut
// short is simply run again.
func (c *Client) RestoreTopic(ctx context.Context, t TopicInfo, parts map[int32]PartState, ptrs map[int32]TierPtr, fence ...clientv3.Cmp) error {
	op := fmt.Sprintf("restore topic %q", t.Name)
	if err := validName("topic", t.Name); err != nil {
		return fmt.Errorf("coord: %s: %w", op, err)
	}
	var ops []clientv3.Op
	for p, st := range parts {
		b, err := json.Marshal(st)
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(c.partKey(PartKey{t.Name, p}), string(b)))
	}
	for p, ptr := range ptrs {
		b, err := json.Marshal(ptr)
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(c.tierKey(PartKey{t.Name, p}), string(b)))
	}
	per := maxTxnOps - len(fence) - 1
	for start := 0; start < len(ops); start += per {
		end := min(start+per, len(ops))
		resp, err := c.cli.Txn(ctx).If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(c.topicKey(t.Name)), "=", 0)}, fence...)...).
			Then(ops[start:end]...).Commit()
		if err != nil {
			return c.wrapErr(op, err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("coord: %s: %w", op, ErrConflict)
		}
	}
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	resp, err := c.cli.Txn(ctx).If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(c.topicKey(t.Name)), "=", 0)}, fence...)...).
		Then(clientv3.OpPut(c.topicKey(t.Name), string(b))).Commit()
	if err != nil {
		return c.wrapErr(op, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("coord: %s: %w", op, ErrConflict)
	}
	return nil
}

// RestoreChecked reports whether this keyspace's first controller has
// looked for a bucket to restore from (MarkRestoreChecked).
func (c *Client) RestoreChecked(ctx context.Context) (bool, error) {
	resp, err := c.cli.Get(ctx, c.prefix+"restore_checked")
	if err != nil {
		return false, c.wrapErr("read restore_checked", err)
	}
	return len(resp.Kvs) > 0, nil
}

// MarkRestoreChecked records that no restore is to be done in this
// keyspace any more (fenced like any controller write).
func (c *Client) MarkRestoreChecked(ctx context.Context, fence ...clientv3.Cmp) error {
	resp, err := c.cli.Txn(ctx).If(fence...).Then(clientv3.OpPut(c.prefix+"restore_checked", "1")).Commit()
	if err != nil {
		return c.wrapErr("mark restore_checked", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("coord: mark restore_checked: %w", ErrConflict)
	}
	return nil
}

// ProducerIDNext returns the next producer id AllocProducerIDs would hand
// out.
func (c *Client) ProducerIDNext(ctx context.Context) (int64, error) {
	resp, err := c.cli.Get(ctx, c.prefix+"pid/next")
	if err != nil {
		return 0, c.wrapErr("read pid/next", err)
	}
	if len(resp.Kvs) == 0 {
		return firstProducerID, nil
	}
	return strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
}

// RaiseProducerIDs moves pid/next up to floor if it is below (a restore:
// no id handed out before the disaster is handed out again).
func (c *Client) RaiseProducerIDs(ctx context.Context, floor int64) error {
	for {
		next, err := c.ProducerIDNext(ctx)
		if err != nil {
			return err
		}
		if next >= floor {
			return nil
		}
		if _, err := c.AllocProducerIDs(ctx, floor-next); err != nil {
			return err
		}
	}
}

// ManifestPointer reads partition k's manifest pointer from etcd
// (linearizable; ok false: none).
func (c *Client) ManifestPointer(ctx context.Context, k PartKey) (ptr TierPtr, ok bool, err error) {
	resp, err := c.cli.Get(ctx, c.tierKey(k))
	if err != nil {
		return TierPtr{}, false, c.wrapErr("read a manifest pointer", err)
	}
	if len(resp.Kvs) == 0 {
		return TierPtr{}, false, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &ptr); err != nil {
		return TierPtr{}, false, fmt.Errorf("coord: manifest pointer of %s-%d: %w", k.Topic, k.Partition, err)
	}
	ptr.ModRev = resp.Kvs[0].ModRevision
	return ptr, true, nil
}
