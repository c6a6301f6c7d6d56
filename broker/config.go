// Package broker holds Kafka semantics and wiring: listener and connection
// lifecycle, one handler file per API key (NN_name.go), the topic registry,
// producer (idempotence) state, and errcode.go, the only place Go errors
// become Kafka error codes. It is the only importer of protocol and log.
package broker

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/auth"
	"github.com/synapsebroker/synapse/internal/fdbudget"
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/protocol"
	"github.com/synapsebroker/synapse/tiering"
)

// Config configures a Server. Zero fields take the defaults shown.
type Config struct {
	// DataDir holds the topic registry, broker metadata and partition logs.
	DataDir string
	// AdvertisedAddr is the host:port clients are told to connect to
	// (default: the listener's address).
	AdvertisedAddr string
	// AutoCreateTopics creates unknown topics on Metadata (v4+: when the
	// request allows it; v0-3: always) and Produce. Default true via the CLI.
	AutoCreateTopics bool
	// DefaultPartitions is the partition count of auto-created topics and of
	// CreateTopics with -1 (default 1).
	DefaultPartitions int32
	// MaxFrameSize caps a request (socket.request.max.bytes, default 100 MiB).
	MaxFrameSize int
	// MaxConnections caps concurrent client connections (default 10000).
	MaxConnections int
	// FetchSessionCacheSlots is how many incremental fetch sessions (KIP-227)
	// the broker keeps (Kafka's max.incremental.fetch.session.cache.slots,
	// default 1000); negative: none, every fetch is a full fetch.
	FetchSessionCacheSlots int
	// IdleTimeout closes connections idle this long (connections.max.idle.ms,
	// default 10 min).
	IdleTimeout time.Duration
	// FsyncInterval selects the durability policy: 0 (default) acknowledges
	// acks=all only after fsync; > 0 fsyncs on that interval.
	FsyncInterval time.Duration
	// MaxOpenFiles bounds idle open segment files (default 1024).
	MaxOpenFiles int
	// Preallocate reserves active segments' space ahead of appends
	// (log.Options.Preallocate; --preallocate, default on).
	Preallocate bool
	// FDs is the file-descriptor budget of the log store (see
	// fdbudget.Plan); nil means unbounded.
	FDs *fdbudget.Budget
	// Tier is the tiered object store; nil means no tiering (all data local,
	// retention deletes it).
	Tier *tiering.Tier
	// Cluster, if set, runs the broker in cluster mode (cluster.go).
	Cluster *ClusterConfig
	// LocalDiskBudget, with tiering, caps the bytes of local segments: past
	// it, local copies of uploaded segments are deleted (oldest first,
	// whatever local.retention.* says); if that is not enough (the bucket
	// is away or behind) produce is refused with a retriable
	// KAFKA_STORAGE_ERROR until uploads catch up. 0 means no cap.
	LocalDiskBudget int64
	// MaintenanceInterval is how often retention, segment.ms rolls and
	// tiering run over every partition (default 10 s).
	MaintenanceInterval time.Duration
	// CleanerBackoff is how often the log cleaner looks for compacted
	// partitions due for cleaning (Kafka's log.cleaner.backoff.ms; default
	// 15 s; negative: no cleaner).
	CleanerBackoff time.Duration
	// CleanerIOMaxBytesPerSecond bounds the bytes the cleaner reads and
	// writes per second (log.cleaner.io.max.bytes.per.second); 0: no bound.
	CleanerIOMaxBytesPerSecond int64
	// CleanerDedupeBufferSize is the cleaner's key map, in bytes
	// (log.cleaner.dedupe.buffer.size; default 32 MiB), allocated at the
	// first clean.
	CleanerDedupeBufferSize int
	// LocalDiskReservePercent, with tiering, is the share of the data
	// directory's file system kept free: below it, local copies of uploaded
	// segments are deleted as past LocalDiskBudget, and produce is refused
	// (retriable) while that is not enough. 0 disables it.
	LocalDiskReservePercent float64
	// DiskFree reports the free and total bytes of the file system holding
	// dir (default: statfs); ok false if unknown.
	DiskFree func(dir string) (free, size int64, ok bool)
	// LocalRetention holds the broker defaults of the topic configs
	// local.retention.bytes and local.retention.ms (Kafka's
	// log.local.retention.*); nil means -2 for both, "as retention.*". A
	// topic's own setting wins.
	LocalRetention *LocalRetention
	// OrphanSweepInterval, with tiering, is how often objects no manifest
	// names (an upload or retention pass cut short, a failed delete) are
	// removed from the bucket, between two maintenance passes (default 1 h;
	// also at every start).
	OrphanSweepInterval time.Duration
	// GroupInitialRebalanceDelay is group.initial.rebalance.delay.ms
	// (default 3 s; negative: none).
	GroupInitialRebalanceDelay time.Duration
	// GroupMinSessionTimeout and GroupMaxSessionTimeout bound consumers'
	// session timeouts (group.min/max.session.timeout.ms: 6 s, 30 min).
	GroupMinSessionTimeout, GroupMaxSessionTimeout time.Duration
	// OffsetsRetention is offsets.retention.minutes (default 7 days).
	OffsetsRetention time.Duration
	// ProducerIDExpiration is producer.id.expiration.ms (default 1 day):
	// a partition forgets an idempotent producer idle that long.
	ProducerIDExpiration time.Duration
	// TransactionMaxTimeout is transaction.max.timeout.ms (default 15
	// min): the longest transaction.timeout.ms a producer may ask for.
	TransactionMaxTimeout time.Duration
	// TransactionalIDExpiration is transactional.id.expiration.ms
	// (default 7 days): a transactional id idle that long is forgotten.
	TransactionalIDExpiration time.Duration
	// SASLMechanisms are what SASL listeners offer: PLAIN, SCRAM-SHA-256,
	// SCRAM-SHA-512, OAUTHBEARER (Kafka's sasl.enabled.mechanisms).
	SASLMechanisms []string
	// OAuth validates OAUTHBEARER tokens (required with OAUTHBEARER).
	OAuth *auth.OAuthValidator
	// SASLSessionLifetime is Kafka's connections.max.reauth.ms: a SASL
	// connection that outlives it without re-authenticating (KIP-368) is
	// closed; 0 means no limit.
	SASLSessionLifetime time.Duration
	// FailedAuthDelay delays the answer to a failed authentication
	// (connection.failed.authentication.delay.ms, default 100 ms; negative:
	// none).
	FailedAuthDelay time.Duration
	// Authorize turns ACL authorization on (Kafka's authorizer.class.name).
	Authorize bool
	// SuperUsers bypass ACLs ("User:alice"; Kafka's super.users).
	SuperUsers []string
	// AllowEveryoneIfNoACL allows access to a resource no ACL matches
	// (allow.everyone.if.no.acl.found; default false).
	AllowEveryoneIfNoACL bool
	// AdminPassword, if set, creates the super user "admin" (SCRAM-SHA-256
	// and -512, which PLAIN checks too) when it has no credentials yet.
	AdminPassword string
	// AuditLogger receives authentications, ACL denials and changes to
	// users and ACLs; nil means Logger's "audit" child.
	AuditLogger *zap.Logger
	// Logger receives the broker's logs; nil means none.
	Logger *zap.Logger
	// FS replaces the file system of the log store (tests).
	FS log.FS
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	if c.DataDir == "" {
		return errors.New("broker: DataDir is required")
	}
	if c.DefaultPartitions <= 0 {
		c.DefaultPartitions = 1
	}
	if c.MaxFrameSize <= 0 {
		c.MaxFrameSize = protocol.DefaultMaxFrameSize
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = 10000
	}
	if c.FetchSessionCacheSlots == 0 {
		c.FetchSessionCacheSlots = 1000
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaintenanceInterval <= 0 {
		c.MaintenanceInterval = 10 * time.Second
	}
	if c.DiskFree == nil {
		c.DiskFree = diskFree
	}
	if c.LocalDiskReservePercent < 0 || c.LocalDiskReservePercent >= 100 {
		return fmt.Errorf("broker: local disk reserve %v%%: want [0, 100)", c.LocalDiskReservePercent)
	}
	if c.CleanerBackoff == 0 {
		c.CleanerBackoff = 15 * time.Second
	}
	if c.CleanerDedupeBufferSize <= 0 {
		c.CleanerDedupeBufferSize = 32 << 20
	}
	if c.LocalRetention == nil {
		c.LocalRetention = &LocalRetention{Bytes: -2, Ms: -2}
	}
	if c.LocalRetention.Bytes < -2 || c.LocalRetention.Ms < -2 {
		return fmt.Errorf("broker: local retention defaults %d bytes / %d ms: -2 (as retention.*), -1 (no bound) or >= 0", c.LocalRetention.Bytes, c.LocalRetention.Ms)
	}
	if c.OrphanSweepInterval <= 0 {
		c.OrphanSweepInterval = time.Hour
	}
	if c.FailedAuthDelay == 0 {
		c.FailedAuthDelay = 100 * time.Millisecond
	}
	if c.ProducerIDExpiration <= 0 {
		c.ProducerIDExpiration = 24 * time.Hour
	}
	if c.TransactionMaxTimeout <= 0 {
		c.TransactionMaxTimeout = 15 * time.Minute
	}
	if c.TransactionalIDExpiration <= 0 {
		c.TransactionalIDExpiration = 7 * 24 * time.Hour
	}
	return nil
}

// hostPort splits an advertised address into what Metadata needs.
func hostPort(addr string) (string, int32, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", addr)
	}
	return h, int32(port), nil
}

// LocalRetention is the broker default of local.retention.bytes and
// local.retention.ms: -2 "as retention.*", -1 no bound, else the bound.
type LocalRetention struct{ Bytes, Ms int64 }
