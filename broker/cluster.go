package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/coord"
	"github.com/synapsebroker/synapse/log"
)

// Cluster mode: N brokers, coordinated by etcd (package coord). etcd holds
// the topics, each partition's {leader, leader epoch, replicas, ISR} and the
// broker registrations; every broker watches it and acts on its view:
//   - a leader takes produce and fetch, stamps its epoch in every batch,
//     and advances the high watermark to what every ISR member holds
//     durably (cluster_replica.go);
//   - a follower truncates its log by epoch and fetches from the leader
//     with Kafka's Fetch (replica id set) (cluster_fetcher.go);
//   - the controller, chosen by etcd election, moves leadership off dead
//     brokers and assigns new partitions, every write fenced by its
//     election revision (cluster_controller.go).

// ClusterConfig configures cluster mode (Config.Cluster).
type ClusterConfig struct {
	// Name is the cluster's name: its keys live under /synapse/<Name>/.
	Name string
	// Etcd are the etcd client URLs.
	Etcd []string
	// NodeID is this broker's id, unique in the cluster.
	NodeID int32
	// Rack is the broker's rack (broker.rack), shown in Metadata.
	Rack string
	// Advertise is the host:port registered for clients (and peers, unless
	// PeerAdvertise is set).
	Advertise string
	// PeerAdvertise, if set, is the host:port other brokers fetch from
	// (a replication network, or a proxy in tests).
	PeerAdvertise string
	// SessionTTL is the etcd session's TTL: a broker silent this long
	// loses its registration and its leaderships (default 3 s).
	SessionTTL time.Duration
	// ReplicaLagMax is replica.lag.time.max.ms: a follower not caught up
	// for this long leaves the ISR (default 10 s).
	ReplicaLagMax time.Duration
	// NoReplicaRebalance stops the controller from moving replicas to
	// spread them over the live brokers (cluster_reassign.go).
	NoReplicaRebalance bool
}

// clusterFile records the cluster a data directory belongs to.
const clusterFile = "cluster.json"

// cluster is a broker's cluster-mode state.
type cluster struct {
	s      *Server
	cfg    ClusterConfig
	id     int32
	logger *zap.Logger
	coMu   sync.Mutex
	co     *coord.Client // the current session's (client)

	view    atomic.Pointer[coord.View]
	viewMu  sync.Mutex
	viewCh  chan struct{} // closed and replaced at every new view
	applyMu sync.Mutex    // one reconcile at a time

	fetchMu  sync.Mutex
	fetchers map[int32]*replicaFetcher // by leader id

	controller atomic.Bool
	// rebalancedAt: the controller's last preferred-leader pass
	// (controller goroutine only).
	rebalancedAt time.Time
	// rebalancing: the controller is moving replicas to a broker added
	// (cluster_reassign.go).
	rebalancing bool
	// regRev: this broker's registration revision in the view being
	// applied (applyMu).
	regRev int64
	// dirID names this broker's data directory (cluster.json).
	dirID string
	// hwStart: the replication checkpoint read at start (cluster_replica.go).
	hwStart map[string]int64

	etcdLatency prometheus.Histogram // cluster_metrics.go

	// The group log as a replicated partition (cluster_groups.go).
	groupsPart      *partition
	groupsKick      chan struct{}
	groupsActive    atomic.Int32 // the epoch the open coordinator leads at; -1: none
	offsetsCreating atomic.Bool

	// The transaction log as a replicated partition (cluster_txn.go).
	txnPart     *partition
	txnActive   atomic.Int32 // the epoch the open coordinator leads at; -1: none
	txnCreating atomic.Bool
	// txnMaintaining: a pass of the coordinator's Maintain runs
	// (maintainTxns; one at a time).
	txnMaintaining atomic.Bool
	txnGen         atomic.Int64 // counts opens and closes of the coordinator
	peerPool

	pidMu   sync.Mutex
	pidNext int64
	pidEnd  int64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// replicaRole is a partition's replication state as this broker acts on it,
// from the view (immutable once published).
type replicaRole struct {
	leader   int32 // -1: none
	epoch    int32
	replicas []int32
	isr      []int32
	modRev   int64
	state    coord.PartState // the whole state the role came from (writes change it, keeping the rest)
	isLeader bool            // leader is this broker
	// startOffset is the log end when this broker became leader at epoch
	// (a follower joins the ISR only from there on).
	startOffset int64
}

// partRepl is a partition's replication bookkeeping.
type partRepl struct {
	role atomic.Pointer[replicaRole]
	mu   sync.Mutex
	// followers: as leader, what each follower reported in this epoch.
	followers map[int32]*followerState
}

type followerState struct {
	epoch    int32
	leo      int64 // its fetch offset: durable there
	caughtUp time.Time
	fetched  time.Time // its last fetch
	// sentEnd: the leader's durable end as of the last answer, at sentAt.
	sentEnd int64
	sentAt  time.Time
}

var (
	errNotLeader        = errors.New("this broker is not the partition's leader")
	errNotEnoughISR     = errors.New("the in-sync replicas are fewer than min.insync.replicas")
	errNotEnoughISRLate = errors.New("the in-sync replicas fell below min.insync.replicas before the records were replicated")
	errReplicaTimeout   = errors.New("the records were not replicated to every in-sync replica within the request timeout")
)

// startCluster joins the cluster: dials etcd, registers, and starts the
// watch, the controller campaign and the ISR loop.
func startCluster(s *Server, cfg ClusterConfig) (*cluster, error) {
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 3 * time.Second
	}
	if cfg.ReplicaLagMax <= 0 {
		cfg.ReplicaLagMax = 10 * time.Second
	}
	host, port, err := hostPort(cfg.Advertise)
	if err != nil {
		return nil, fmt.Errorf("cluster: advertised address: %w", err)
	}
	self := coord.BrokerInfo{ID: cfg.NodeID, Host: host, Port: port, Rack: cfg.Rack}
	if cfg.PeerAdvertise != "" {
		if self.PeerHost, self.PeerPort, err = hostPort(cfg.PeerAdvertise); err != nil {
			return nil, fmt.Errorf("cluster: peer address: %w", err)
		}
	}
	cl := &cluster{s: s, cfg: cfg, id: cfg.NodeID, logger: s.logger.Named("cluster"),
		viewCh: make(chan struct{}), fetchers: map[int32]*replicaFetcher{}, etcdLatency: newEtcdLatency()}
	cl.ctx, cl.cancel = context.WithCancel(context.Background())
	if s.cfg.Tier != nil {
		s.cfg.Tier.SetCommitter(tierCommitter{cl}) // before any view: the first one may start fetchers
	}
	ctx, cancel := context.WithTimeout(cl.ctx, 30*time.Second)
	defer cancel()
	co, err := coord.Dial(ctx, coord.Config{Endpoints: cfg.Etcd, Cluster: cfg.Name, TTL: cfg.SessionTTL, Logger: cl.logger.Named("etcd")})
	if err != nil {
		return nil, err
	}
	if err := cl.checkDataDir(co.ClusterID()); err != nil {
		co.Close()
		return nil, err
	}
	cl.hwStart = cl.loadHWCheckpoint()
	cl.initGroups()
	cl.initTxns()
	self.DirID = cl.dirID
	s.meta.mu.Lock()
	s.meta.m.NodeID, s.meta.m.ClusterID = cfg.NodeID, co.ClusterID()
	s.meta.mu.Unlock()
	// A broker killed a moment ago still holds its id until its lease
	// expires: wait for that, not longer.
	for {
		err := co.Register(ctx, self)
		if err == nil {
			break
		}
		if !errors.Is(err, coord.ErrNodeIDInUse) || ctx.Err() != nil {
			cl.cancel() // ends groupsLoop
			co.Close()
			return nil, err
		}
		cl.logger.Info("node id still registered (a previous run's session): waiting for it to expire", zap.Int32("node_id", cfg.NodeID))
		if !sleepCtx(ctx, 500*time.Millisecond) {
			cl.cancel()
			co.Close()
			return nil, fmt.Errorf("cluster: node id %d: %w", cfg.NodeID, err)
		}
	}
	first := make(chan struct{})
	var once sync.Once
	cl.setClient(co)
	cl.wg.Add(2)
	go func() { defer cl.wg.Done(); cl.isrLoop() }()
	go func() {
		defer cl.wg.Done()
		cl.sessions(co, self, func() { once.Do(func() { close(first) }) })
	}()
	select {
	case <-first:
	case <-ctx.Done():
		cl.close()
		return nil, fmt.Errorf("cluster: no view from etcd: %w", ctx.Err())
	}
	cl.logger.Info("joined the cluster", zap.String("cluster", cfg.Name), zap.String("cluster_id", co.ClusterID()),
		zap.Int32("node_id", cfg.NodeID), zap.String("advertise", cfg.Advertise))
	return cl, nil
}

func (cl *cluster) client() *coord.Client {
	cl.coMu.Lock()
	defer cl.coMu.Unlock()
	return cl.co
}

func (cl *cluster) setClient(co *coord.Client) {
	cl.coMu.Lock()
	cl.co = co
	cl.coMu.Unlock()
}

// sessions runs the broker's etcd sessions one after another: the watch
// and the controller campaign of each, until the session ends; then this
// broker stops leading at once (another broker may lead by now), and joins
// again with a new session (a new incarnation). ready is called at the
// first view.
func (cl *cluster) sessions(co *coord.Client, self coord.BrokerInfo, ready func()) {
	backoff := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithCancel(cl.ctx)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			err := co.Watch(ctx, func(v *coord.View) {
				cl.apply(v)
				ready()
			})
			if err != nil && ctx.Err() == nil {
				cl.logger.Error("etcd watch ended", zap.Error(err))
			}
		}()
		go func() { defer wg.Done(); cl.campaign(ctx, co) }()
		select {
		case <-co.Done():
		case <-cl.ctx.Done():
		}
		cancel()
		wg.Wait()
		if cl.ctx.Err() != nil {
			return
		}
		cl.logger.Error("etcd session lost: leading nothing until a new session is registered")
		cl.dropLeadership()
		co.Close()
		for {
			var err error
			dctx, dcancel := context.WithTimeout(cl.ctx, 10*time.Second)
			co, err = coord.Dial(dctx, coord.Config{Endpoints: cl.cfg.Etcd, Cluster: cl.cfg.Name, TTL: cl.cfg.SessionTTL, Logger: cl.logger.Named("etcd")})
			if err == nil {
				if err = co.Register(dctx, self); err != nil {
					co.Close()
				}
			}
			dcancel()
			if err == nil {
				break
			}
			if cl.ctx.Err() != nil {
				return
			}
			cl.logger.Warn("rejoin the cluster", zap.Error(err))
			if !sleepCtx(cl.ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 5*time.Second)
		}
		backoff = 100 * time.Millisecond
		cl.setClient(co)
		cl.logger.Info("rejoined the cluster with a new session", zap.Int64("incarnation", co.LeaseID()))
	}
}

// checkDataDir makes sure the data directory belongs to this cluster (or
// is new to clusters and empty), and records it.
func (cl *cluster) checkDataDir(clusterID string) error {
	path := filepath.Join(cl.s.cfg.DataDir, clusterFile)
	var rec struct {
		ClusterID string `json:"cluster_id"`
		NodeID    int32  `json:"node_id"`
		DirID     string `json:"dir_id"`
	}
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &rec); err != nil {
			return fmt.Errorf("cluster: %s: %w", path, err)
		}
		if rec.ClusterID != clusterID {
			return fmt.Errorf("cluster: the data directory belongs to cluster %s, etcd holds cluster %s", rec.ClusterID, clusterID)
		}
		if rec.NodeID != cl.cfg.NodeID {
			return fmt.Errorf("cluster: the data directory is node %d's, not node %d's", rec.NodeID, cl.cfg.NodeID)
		}
		if rec.DirID != "" {
			cl.dirID = rec.DirID
			return nil
		}
		// Written before directories had ids: one now.
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("cluster: %w", err)
	}
	if n := len(cl.s.reg.all()); n > 0 && rec.ClusterID == "" {
		return fmt.Errorf("cluster: the data directory holds %d topics of a single-node broker; start cluster mode on an empty one", n)
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return err
	}
	rec.ClusterID, rec.NodeID, rec.DirID = clusterID, cl.cfg.NodeID, hex.EncodeToString(id[:])
	cl.dirID = rec.DirID
	b, _ = json.Marshal(rec)
	if err := log.WriteFileAtomic(log.OSFS, path, b); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}

// close leaves the cluster: stops fetching and campaigning and revokes the
// session (the registration and the controller key go at once).
func (cl *cluster) close() {
	cl.cancel()
	cl.fetchMu.Lock()
	var stopped []*replicaFetcher
	for id, f := range cl.fetchers {
		f.stop()
		stopped = append(stopped, f)
		delete(cl.fetchers, id)
	}
	cl.fetchMu.Unlock()
	for _, f := range stopped {
		<-f.done // no append races the partitions' close
	}
	cl.client().Close()
	cl.wg.Wait()
	cl.closePeers()
}

// currentView is the last view applied (never nil once started).
func (cl *cluster) currentView() *coord.View { return cl.view.Load() }

// viewChanged returns a channel closed at the next view.
func (cl *cluster) viewChanged() <-chan struct{} {
	cl.viewMu.Lock()
	defer cl.viewMu.Unlock()
	return cl.viewCh
}

// apply takes a new view: local topics follow it, and each partition's
// role.
func (cl *cluster) apply(v *coord.View) {
	cl.applyMu.Lock()
	defer cl.applyMu.Unlock()
	cl.view.Store(v)
	if b, ok := v.Brokers[cl.id]; ok {
		cl.regRev = b.RegRev
	} else {
		cl.regRev = math.MaxInt64 // not registered in this view: lead nothing
	}
	cl.reconcileTopics(v)
	cl.viewMu.Lock()
	close(cl.viewCh)
	cl.viewCh = make(chan struct{})
	cl.viewMu.Unlock()
}

// reconcileTopics creates, grows, reconfigures and deletes local topics as
// the view says, and applies every partition's state.
func (cl *cluster) reconcileTopics(v *coord.View) {
	s := cl.s
	for name, t := range v.Topics {
		if internalTopic(name) {
			continue // the group and transaction logs: after every topic (below)
		}
		id, err := parseTopicID(t.Info.ID)
		if err != nil {
			cl.logger.Error("bad topic id in etcd", zap.String("topic", name), zap.Error(err))
			continue
		}
		lt := s.reg.get(name)
		if lt != nil && lt.id != id {
			cl.removeLocal(lt) // deleted and created again
			lt = nil
		}
		if lt == nil {
			if lt, err = s.reg.createWithID(name, id, t.Info.Partitions, maps.Clone(t.Info.Configs)); err != nil {
				cl.logger.Error("create local topic", zap.String("topic", name), zap.Error(err))
				continue
			}
		} else {
			if n := int32(len(s.reg.partitionsOf(lt))); n < t.Info.Partitions {
				if err := s.reg.addPartitions(lt, t.Info.Partitions, false); err != nil {
					cl.logger.Error("add local partitions", zap.String("topic", name), zap.Error(err))
				}
			}
			if !maps.Equal(s.reg.configsOf(lt), t.Info.Configs) {
				if err := s.reg.setConfigs(lt, maps.Clone(t.Info.Configs)); err != nil {
					cl.logger.Error("set local topic configs", zap.String("topic", name), zap.Error(err))
				}
			}
		}
		for _, p := range s.reg.partitionsOf(lt) {
			part, ok := v.Parts[coord.PartKey{Topic: name, Partition: p.index}]
			cl.setRole(p, part, ok)
		}
	}
	for _, lt := range s.reg.all() {
		if _, ok := v.Topics[lt.name]; !ok {
			cl.removeLocal(lt)
		}
	}
	// The group log last: a new coordinator drops offsets of partitions
	// the view does not have.
	if _, ok := v.Topics[offsetsTopic]; ok {
		part, ok := v.Parts[coord.PartKey{Topic: offsetsTopic, Partition: 0}]
		cl.setRole(cl.groupsPart, part, ok)
	}
	if _, ok := v.Topics[txnTopic]; ok {
		part, ok := v.Parts[coord.PartKey{Topic: txnTopic, Partition: 0}]
		cl.setRole(cl.txnPart, part, ok)
	}
}

// removeLocal deletes a topic the cluster no longer has.
func (cl *cluster) removeLocal(t *topic) {
	for _, p := range cl.s.reg.partitionsOf(t) {
		cl.setRole(p, coord.Part{}, false)
	}
	if err := cl.s.deleteTopic(t); err != nil {
		cl.logger.Error("delete local topic", zap.String("topic", t.name), zap.Error(err))
	}
}

func parseTopicID(s string) ([16]byte, error) {
	var id [16]byte
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 16 {
		return id, fmt.Errorf("topic id %q is not 32 hex digits", s)
	}
	copy(id[:], b)
	return id, nil
}

// setRole applies a partition's state from the view.
func (cl *cluster) setRole(p *partition, part coord.Part, present bool) {
	old := p.repl.role.Load()
	r := &replicaRole{leader: -1}
	if present {
		st := part.State
		r = &replicaRole{leader: st.Leader, epoch: st.Epoch, replicas: st.Replicas, isr: st.ISR, modRev: part.ModRev, state: st}
		// Only a leadership granted to this run of the broker: one older
		// than its registration was an earlier run's, whose unsynced
		// tail may be gone while followers hold it (the controller
		// elects again, at a new epoch).
		r.isLeader = st.Leader == cl.id && slices.Contains(st.ISR, cl.id) && part.ModRev > cl.regRev
	}
	if old != nil && old.modRev == r.modRev && old.leader == r.leader && old.epoch == r.epoch && slices.Equal(old.replicas, r.replicas) && old.isLeader == r.isLeader {
		return
	}
	if !p.log.Replicated() {
		if err := p.log.SetReplicated(cl.hwStart[hwKey(p)]); err != nil {
			cl.logger.Error("replicated mode", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
		}
	}
	mine := slices.Contains(r.replicas, cl.id)
	switch {
	case r.isLeader:
		cl.unfollow(p)
		if old == nil || !old.isLeader || old.epoch != r.epoch {
			if err := cl.restoredStart(p, cl.currentView()); err != nil {
				// Never lead a log that ends below the bucket's: the next
				// view (or a new leader) tries again.
				cl.logger.Error("restore: not leading", zap.String("topic", p.topic.name), zap.Int32("partition", p.index), zap.Error(err))
				r.isLeader = false
				p.repl.role.Store(r)
				return
			}
			r.startOffset = p.log.LogEndOffset()
			p.repl.mu.Lock()
			p.repl.followers = map[int32]*followerState{}
			p.repl.mu.Unlock()
			cl.logger.Info("leading", zap.String("topic", p.topic.name), zap.Int32("partition", p.index),
				zap.Int32("leader_epoch", r.epoch), zap.Int32s("isr", r.isr), zap.Int64("log_end", r.startOffset))
		} else {
			r.startOffset = old.startOffset
		}
		p.repl.role.Store(r)
		cl.advanceHW(p)
	case r.leader == cl.id:
		p.repl.role.Store(r) // an earlier run's leadership: wait for a new epoch
		cl.unfollow(p)
	case mine && r.leader >= 0:
		p.repl.role.Store(r)
		if old == nil || old.leader != r.leader || old.epoch != r.epoch || old.isLeader || !slices.Contains(old.replicas, cl.id) {
			cl.follow(p, r) // (a replica added by a reassignment starts here too)
		}
	default:
		p.repl.role.Store(r)
		cl.unfollow(p)
		if present && len(r.replicas) > 0 && !mine && p != cl.groupsPart && p != cl.txnPart {
			go cl.dropReplica(p) // (files, fsyncs: not under applyMu)
		}
	}
	if p == cl.groupsPart || p == cl.txnPart {
		cl.kickGroups()
	}
}

// dropLeadership stops acting as leader anywhere (the etcd session is
// gone: another broker may lead by now).
func (cl *cluster) dropLeadership() {
	cl.applyMu.Lock()
	defer cl.applyMu.Unlock()
	for _, t := range cl.s.reg.all() {
		for _, p := range cl.s.reg.partitionsOf(t) {
			if r := p.repl.role.Load(); r != nil && r.isLeader {
				nr := *r
				nr.isLeader, nr.leader = false, -1
				p.repl.role.Store(&nr)
			}
		}
	}
	for _, p := range []*partition{cl.groupsPart, cl.txnPart} {
		if r := p.repl.role.Load(); r != nil && r.isLeader {
			nr := *r
			nr.isLeader, nr.leader = false, -1
			p.repl.role.Store(&nr)
			cl.kickGroups()
		}
	}
	cl.viewMu.Lock()
	close(cl.viewCh)
	cl.viewCh = make(chan struct{})
	cl.viewMu.Unlock()
}

// roleOf is p's role (never nil: none yet is no leader).
func roleOf(p *partition) *replicaRole {
	if r := p.repl.role.Load(); r != nil {
		return r
	}
	return &replicaRole{leader: -1}
}

// leaderCheck answers whether this broker may serve p as its leader at
// the epoch a client names (-1: any): 0, or NOT_LEADER_OR_FOLLOWER,
// LEADER_NOT_AVAILABLE, FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH.
func (cl *cluster) leaderCheck(p *partition, epoch int32) (int16, *replicaRole) {
	r := roleOf(p)
	switch {
	case !r.isLeader && r.leader < 0:
		return 5, r // LEADER_NOT_AVAILABLE
	case epoch >= 0 && epoch < r.epoch:
		return 74, r // FENCED_LEADER_EPOCH
	case epoch > r.epoch:
		return 75, r // UNKNOWN_LEADER_EPOCH
	case !r.isLeader:
		return 6, r // NOT_LEADER_OR_FOLLOWER
	}
	return 0, r
}

// minISR is a topic's min.insync.replicas: set, or 2 where the
// replication factor is at least 3, else 1.
func (cl *cluster) minISR(p *partition, r *replicaRole) int {
	if v, ok := cl.s.reg.configsOf(p.topic)["min.insync.replicas"]; ok {
		var n int
		if _, err := fmt.Sscan(v, &n); err == nil && n > 0 {
			return n
		}
	}
	if len(r.replicas) >= 3 {
		return 2
	}
	return 1
}

// nextProducerID hands out a producer id from a block reserved in etcd:
// ids are unique across the cluster and across failovers.
func (cl *cluster) nextProducerID(ctx context.Context) (int64, error) {
	cl.pidMu.Lock()
	defer cl.pidMu.Unlock()
	if cl.pidNext >= cl.pidEnd {
		if !cl.restoreSettled() {
			return -1, errRestoring // ids above the restored ones only
		}
		first, err := cl.client().AllocProducerIDs(ctx, producerIDBlock)
		if err != nil {
			return -1, err
		}
		cl.pidNext, cl.pidEnd = first, first+producerIDBlock
	}
	id := cl.pidNext
	cl.pidNext++
	return id, nil
}

// liveBrokers lists the registered brokers by id.
func liveBrokers(v *coord.View) []coord.BrokerInfo {
	out := make([]coord.BrokerInfo, 0, len(v.Brokers))
	for _, b := range v.Brokers {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b coord.BrokerInfo) int { return int(a.ID) - int(b.ID) })
	return out
}

// waitFor polls the view until ok holds or timeout passes.
func (cl *cluster) waitFor(ctx context.Context, timeout time.Duration, ok func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		ch := cl.viewChanged()
		if ok() {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return ok()
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}
