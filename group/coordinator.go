// Package group is the group coordinator: Kafka's classic consumer-group
// protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) and committed
// offsets (OffsetCommit, OffsetFetch, OffsetDelete), with group listing,
// description and deletion. State is durable in an internal partition of
// the log engine (see store.go) and is loaded before the broker serves.
//
// The broker is a single node, so it coordinates every group; there is no
// partitioning of groups and COORDINATOR_LOAD_IN_PROGRESS never applies
// (loading finishes before the listener accepts).
//
// Lock order: group.mu before Coordinator.mu. A group's mu is held across
// the append and fsync of that group's records, so the log order of a
// group's records is the order its state changed in; different groups
// append concurrently and share fsyncs through the log's group commit.
package group

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
)

// Config configures a Coordinator. Zero durations take Kafka's defaults.
type Config struct {
	Logger *zap.Logger
	Now    func() time.Time
	// InitialRebalanceDelay is group.initial.rebalance.delay.ms: how long
	// the first rebalance of an empty group waits for more members (3 s).
	// Negative means no delay.
	InitialRebalanceDelay time.Duration
	// MinSessionTimeout and MaxSessionTimeout bound the session timeout a
	// member may ask for (group.min/max.session.timeout.ms: 6 s, 30 min).
	MinSessionTimeout, MaxSessionTimeout time.Duration
	// OffsetsRetention is offsets.retention.minutes (7 days).
	OffsetsRetention time.Duration
	// MaxMetadataBytes is offset.metadata.max.bytes (4096).
	MaxMetadataBytes int
	// PartitionExists reports whether a topic partition exists; commits to
	// others get UNKNOWN_TOPIC_OR_PARTITION.
	PartitionExists func(topic string, partition int32) bool
	// Write, if set, appends one batch of the group log and returns once
	// it is safe (replicated, in cluster mode); nil: Append, then
	// WaitDurable.
	Write func(b []byte) error
}

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.InitialRebalanceDelay == 0 {
		c.InitialRebalanceDelay = 3 * time.Second
	}
	if c.InitialRebalanceDelay < 0 {
		c.InitialRebalanceDelay = 0
	}
	if c.MinSessionTimeout <= 0 {
		c.MinSessionTimeout = 6 * time.Second
	}
	if c.MaxSessionTimeout <= 0 {
		c.MaxSessionTimeout = 30 * time.Minute
	}
	if c.OffsetsRetention <= 0 {
		c.OffsetsRetention = 7 * 24 * time.Hour
	}
	if c.MaxMetadataBytes <= 0 {
		c.MaxMetadataBytes = 4096
	}
	if c.PartitionExists == nil {
		c.PartitionExists = func(string, int32) bool { return true }
	}
}

// LogConfig is the log configuration of the group log: records are never
// deleted by retention (compaction moves the log start instead).
func LogConfig() log.Config {
	return log.Config{
		SegmentBytes:    16 << 20,
		MaxMessageBytes: 64 << 20, // one request's commits, or one big group's snapshot
		RetentionBytes:  -1,
		RetentionMs:     -1,
	}
}

// Coordinator owns every group.
type Coordinator struct {
	cfg Config
	log *log.Partition

	ctx    context.Context // cancelled by Close: ends parked joins and syncs
	cancel context.CancelFunc

	mu     sync.Mutex // guards groups, closed and pending
	groups map[string]*group
	closed bool
	// pending: per group and partition, the transactional producers with
	// offsets waiting for their transaction's end (txn.go).
	pending map[string]map[tp]map[int64]struct{}

	changes      atomic.Uint64 // bumped on every durable change (mirroring)
	sinceCompact atomic.Int64  // bytes appended since the last compaction
	liveBytes    atomic.Int64  // size of the last snapshot
	compactMu    sync.Mutex    // one compaction at a time
}

// Open loads the group log p (opened with LogConfig). If p is empty and
// seed is non-nil (a mirror written by Snapshot), the seed is written into
// the log first: a restore from the tiered store.
func Open(cfg Config, p *log.Partition, seed []byte) (*Coordinator, error) {
	cfg.setDefaults()
	c := &Coordinator{cfg: cfg, log: p, groups: map[string]*group{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if seed != nil && p.LogEndOffset() == p.LogStartOffset() {
		recs, err := parseSnapshot(seed)
		if err != nil {
			return nil, err
		}
		if err := c.appendAll(recs); err != nil {
			return nil, err
		}
		cfg.Logger.Info("restored groups from the tiered store", zap.Int("records", len(recs)))
	}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Coordinator) load() error {
	now := c.cfg.Now()
	type state struct {
		g       *groupValue
		offsets map[tp]offsetValue
	}
	states := map[string]*state{}
	get := func(g string) *state {
		s := states[g]
		if s == nil {
			s = &state{offsets: map[tp]offsetValue{}}
			states[g] = s
		}
		return s
	}
	var n int
	err := replay(c.log, func(k recKey, v []byte) error {
		n++
		switch k.Kind {
		case "o":
			s := get(k.Group)
			if v == nil {
				delete(s.offsets, tp{k.Topic, k.Partition})
				return nil
			}
			var ov offsetValue
			if err := json.Unmarshal(v, &ov); err != nil {
				return fmt.Errorf("%w: offset value: %v", errLoad, err)
			}
			s.offsets[tp{k.Topic, k.Partition}] = ov
		case "g":
			s := get(k.Group)
			if v == nil {
				// A deleted group: its offsets were deleted with it.
				delete(states, k.Group)
				return nil
			}
			var gv groupValue
			if err := json.Unmarshal(v, &gv); err != nil {
				return fmt.Errorf("%w: group value: %v", errLoad, err)
			}
			s.g = &gv
		default:
			return fmt.Errorf("%w: unknown record kind %q", errLoad, k.Kind)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Offsets of partitions that no longer exist (a topic deleted just
	// before a crash, or after the bucket's copy of the groups was taken)
	// go, for good: a topic created again with the same name must not
	// start its consumers at the old topic's offsets.
	var gone []record
	for id, s := range states {
		for k := range s.offsets {
			if !c.cfg.PartitionExists(k.topic, k.partition) {
				gone = append(gone, offsetRecord(id, k.topic, k.partition, nil))
				delete(s.offsets, k)
			}
		}
	}
	if err := c.appendAll(gone); err != nil {
		return fmt.Errorf("group: drop offsets of partitions that are gone: %w", err)
	}
	for id, s := range states {
		g := newGroup(c, id, now)
		g.offsets = s.offsets
		if gv := s.g; gv != nil {
			g.protocolType, g.protocol, g.generation, g.leader = gv.ProtocolType, gv.Protocol, gv.Generation, gv.Leader
			g.stateSince = time.UnixMilli(gv.StateMs)
			g.persisted = gv
			for _, mv := range gv.Members {
				// The group record may come from a bucket seed, not only
				// from this coordinator: a member id (or static instance
				// id) twice would leave a stale entry in the join order,
				// found missing when the session timer fires.
				if mv.ID == "" || g.members[mv.ID] != nil || mv.InstanceID != nil && g.static[*mv.InstanceID] != "" {
					c.cfg.Logger.Warn("group record names a member twice (or none): the repeat is left out", zap.String("group", id), zap.String("member", mv.ID))
					continue
				}
				m := &member{
					id: mv.ID, instanceID: mv.InstanceID, clientID: mv.ClientID, clientHost: mv.ClientHost,
					sessionTimeout:   time.Duration(mv.SessionTimeout) * time.Millisecond,
					rebalanceTimeout: time.Duration(mv.RebalanceTimeout) * time.Millisecond,
					protocolType:     gv.ProtocolType,
					protocols:        []protocol{{name: gv.Protocol, metadata: mv.Metadata}},
					assignment:       mv.Assignment,
				}
				g.addMember(m, now)
			}
			if len(g.members) > 0 {
				// Members keep their ids and generation across a restart;
				// their sessions start over from now.
				g.state = stateStable
				g.stateSince = now
			}
		}
		if len(g.members) == 0 && len(g.offsets) == 0 && g.protocolType == "" {
			continue
		}
		c.groups[id] = g
	}
	// A rough live size, so the first compaction waits for real growth.
	c.liveBytes.Store(c.log.LocalBytes() / 2)
	c.cfg.Logger.Info("groups loaded", zap.Int("groups", len(c.groups)), zap.Int("records", n))
	return nil
}

// appendAll writes recs in batches of at most 512 records and 8 MiB of
// values (well inside the group log's largest batch), each made durable.
func (c *Coordinator) appendAll(recs []record) error {
	for len(recs) > 0 {
		n, size := 0, 0
		for n < len(recs) && n < 512 && (n == 0 || size+len(recs[n].value) <= 8<<20) {
			size += len(recs[n].value)
			n++
		}
		if err := c.append(recs[:n]); err != nil {
			return err
		}
		recs = recs[n:]
	}
	return nil
}

// append writes recs as one batch and waits until it is durable.
func (c *Coordinator) append(recs []record) error {
	if len(recs) == 0 {
		return nil
	}
	b := encodeBatch(recs, c.cfg.Now())
	if c.cfg.Write != nil {
		if err := c.cfg.Write(b); err != nil {
			return err
		}
	} else {
		res, err := c.log.Append(b)
		if err != nil {
			return err
		}
		if err := c.log.WaitDurable(res.LastOffset + 1); err != nil {
			return err
		}
	}
	c.sinceCompact.Add(int64(len(b)))
	c.changes.Add(1)
	return nil
}

// lockGroup returns group id locked, creating it (Empty) if create is set.
// It returns nil if the group does not exist (and create is not set) or
// the coordinator is closed.
func (c *Coordinator) lockGroup(id string, create bool) *group {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil
		}
		g := c.groups[id]
		if g == nil {
			if !create {
				c.mu.Unlock()
				return nil
			}
			g = newGroup(c, id, c.cfg.Now())
			c.groups[id] = g
		}
		c.mu.Unlock()
		g.mu.Lock()
		if g.state != stateDead {
			return g
		}
		g.mu.Unlock() // removed meanwhile: look again
	}
}

// removeLocked drops a dead group from the map. g.mu held.
func (c *Coordinator) removeLocked(g *group) {
	c.mu.Lock()
	if c.groups[g.id] == g {
		delete(c.groups, g.id)
	}
	c.mu.Unlock()
}

// all returns the live groups sorted by id.
func (c *Coordinator) all() []*group {
	c.mu.Lock()
	gs := make([]*group, 0, len(c.groups))
	for _, g := range c.groups {
		gs = append(gs, g)
	}
	c.mu.Unlock()
	sort.Slice(gs, func(i, j int) bool { return gs[i].id < gs[j].id })
	return gs
}

// Close answers parked joins and syncs (NOT_COORDINATOR, so clients look
// for the coordinator again) and stops every timer. The log is the
// caller's to close.
func (c *Coordinator) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	for _, g := range c.all() {
		g.mu.Lock()
		g.shutdownLocked()
		g.mu.Unlock()
	}
}

// MaxLeaderEpoch is the largest leader epoch of a committed offset at or
// below limit (-1 if none is): a broker restored from a mirror starts above
// it, so the epochs its consumers committed with are never in its future.
// Epochs above limit are left out (a client may commit any epoch).
func (c *Coordinator) MaxLeaderEpoch(limit int32) int32 {
	most := int32(-1)
	for _, g := range c.all() {
		g.mu.Lock()
		for _, v := range g.offsets {
			if v.LeaderEpoch > most && v.LeaderEpoch <= limit {
				most = v.LeaderEpoch
			}
		}
		g.mu.Unlock()
	}
	return most
}

// Changes counts durable changes; a mirror is stale if it was taken at a
// lower count.
func (c *Coordinator) Changes() uint64 { return c.changes.Load() }

// snapshotFile is the mirror format: every live record.
type snapshotFile struct {
	Version int            `json:"version"`
	Records []snapshotItem `json:"records"`
}

type snapshotItem struct {
	Key   recKey          `json:"key"`
	Value json.RawMessage `json:"value"`
}

// Snapshot returns the live state (every group's metadata and committed
// offsets) as a document Open accepts as a seed, and the change count it
// reflects.
func (c *Coordinator) Snapshot() ([]byte, uint64) {
	n := c.changes.Load()
	f := snapshotFile{Version: 1}
	for _, g := range c.all() {
		g.mu.Lock()
		for _, r := range g.recordsLocked() {
			f.Records = append(f.Records, snapshotItem{Key: r.key, Value: r.value})
		}
		g.mu.Unlock()
	}
	b, _ := json.Marshal(f)
	return b, n
}

func parseSnapshot(b []byte) ([]record, error) {
	var f snapshotFile
	if err := json.Unmarshal(b, &f); err != nil || f.Version != 1 {
		return nil, fmt.Errorf("group: unreadable group snapshot: %v", err)
	}
	recs := make([]record, 0, len(f.Records))
	for i, it := range f.Records {
		// Checked before anything is written: a seed is the bucket's
		// word, and a bad record found only when the log is replayed
		// would come after every batch was written and synced.
		// (An empty group id is one Kafka accepts commits for: the log
		// holds it, so its mirror must restore.)
		if (it.Key.Kind != "o" && it.Key.Kind != "g") || it.Key.Kind == "o" && (it.Key.Topic == "" || it.Key.Partition < 0) {
			return nil, fmt.Errorf("group: group snapshot record %d: bad key %+v", i, it.Key)
		}
		v := []byte(it.Value)
		if len(v) == 0 || string(v) == "null" {
			v = nil // a tombstone, not a value that decodes to zeros
		}
		recs = append(recs, record{key: it.Key, value: v})
	}
	return recs, nil
}

// Maintain expires offsets (offsets.retention.minutes), removes groups left
// with nothing, and compacts the group log when it has grown well past its
// live size. The broker calls it from its maintenance loop.
func (c *Coordinator) Maintain(now time.Time) {
	for _, g := range c.all() {
		g.mu.Lock()
		if g.state != stateDead {
			g.expireOffsetsLocked(now)
		}
		g.mu.Unlock()
	}
	if _, err := c.log.Maintain(now); err != nil {
		c.cfg.Logger.Warn("group log maintenance", zap.Error(err))
	}
	live := c.liveBytes.Load()
	if grown := c.sinceCompact.Load(); grown > 8<<20 && grown > 2*live {
		if err := c.compact(); err != nil {
			c.cfg.Logger.Warn("compact the group log", zap.Error(err))
		}
	}
}

// compact rewrites the live state at the log's tail and moves the log start
// past all that came before. Safe against concurrent changes: the cut is
// taken before any group is snapshotted, and each group's snapshot is
// appended under its lock, so every record below the cut is superseded by
// a snapshot record or by a later change. A crash part way leaves old
// records in place, which replay the same state.
func (c *Coordinator) compact() error {
	c.compactMu.Lock()
	defer c.compactMu.Unlock()
	if err := c.log.Roll(); err != nil { // so whole old segments can go
		return err
	}
	cut := c.log.LogEndOffset()
	start := c.sinceCompact.Load()
	var live int64
	for _, g := range c.all() {
		g.mu.Lock()
		recs := g.recordsLocked()
		var err error
		if g.state != stateDead {
			err = c.append(recs)
		}
		g.mu.Unlock()
		if err != nil {
			return err
		}
		for _, r := range recs {
			live += int64(len(r.value)) + 64
		}
	}
	if _, err := c.log.DeleteRecordsBefore(cut); err != nil {
		return err
	}
	c.liveBytes.Store(live)
	c.sinceCompact.Add(-start)
	c.cfg.Logger.Info("compacted the group log", zap.Int64("log_start", cut), zap.Int64("live_bytes", live))
	return nil
}

// newMemberID is Kafka's shape: the client id, a dash and a UUID.
func newMemberID(clientID string) string {
	var u [16]byte
	rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%s-%x-%x-%x-%x-%x", clientID, u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Stats counts live groups by state name, and their members.
func (c *Coordinator) Stats() (byState map[string]int, members int) {
	byState = map[string]int{}
	for _, g := range c.all() {
		g.mu.Lock()
		if g.state != stateDead {
			byState[g.state.String()]++
			members += len(g.members)
		}
		g.mu.Unlock()
	}
	return byState, members
}
