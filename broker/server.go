package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/group"
	"github.com/synapsebroker/synapse/internal/logrepeat"
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/protocol"
	"github.com/synapsebroker/synapse/txn"
)

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("broker: server closed")

// Server is a single-node Kafka broker.
type Server struct {
	cfg    Config
	logger *zap.Logger
	// repeat logs the warnings a maintenance pass (or a stop) can give for
	// every partition: once at once, then a count per minute.
	repeat *logrepeat.Logger
	store  *log.Store
	reg    *registry
	meta   *metaStore
	// groupsPtr is the group coordinator (grp); in cluster mode replaced
	// when the group log's leadership moves (cluster_groups.go).
	groupsPtr atomic.Pointer[group.Coordinator]

	groupLog       *log.Partition
	groupsMirrored atomic.Uint64 // group change count last mirrored to the bucket

	txnsPtr      atomic.Pointer[txn.Coordinator] // in a cluster: swapped as the leadership of the transaction log moves
	txnLog       *log.Partition
	txnsMirrored atomic.Uint64 // transaction change count last mirrored to the bucket

	// topics.json waiting to be mirrored to the bucket: saved under the
	// registry's lock, copied by the maintenance loop (never under that
	// lock, so a slow bucket cannot stall the requests that look topics
	// up).
	topicsMirror metaMirror
	forgetMu     sync.Mutex  // tier-forget.json
	forgetDue    atomic.Bool // a topic was deleted: forgetPending after the next pass

	sec *security // users, ACLs, SASL mechanisms (security.go)

	cl *cluster // cluster mode (cluster.go); nil on a single node

	offsetsShown atomic.Bool // the virtual __consumer_offsets is listed (internal_topics.go)

	fetchSessions fetchSessionCache // incremental fetch sessions (fetch_session.go)

	ctx    context.Context // cancelled on shutdown: ends long polls
	cancel context.CancelFunc

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	connWG    sync.WaitGroup
	shutting  atomic.Bool
	serving   atomic.Bool
	overDisk  atomic.Bool  // local segments above LocalDiskBudget (tiering)
	budgetMu  sync.Mutex   // one checkDiskBudget at a time
	pipelined atomic.Int64 // produce requests appended while an earlier one awaited fsync
	maintDone chan struct{}
	cleaner   cleanerStats // the log cleaner's counters (cleaner.go)
	// cleanerUploads: read-held by a clean (which may upload to the
	// bucket), taken by the orphan sweep around AbortUploads.
	cleanerUploads sync.RWMutex
	tierKick       chan struct{} // a segment was sealed: tier now, not at the next tick
	closeOnce      sync.Once

	beforeHandle atomic.Pointer[func(*protocol.Request)] // tests: runs before every handler
}

// grp is the group coordinator.
func (s *Server) grp() *group.Coordinator { return s.groupsPtr.Load() }

// txnCoord is the transaction coordinator (nil before it opened).
func (s *Server) txnCoord() *txn.Coordinator { return s.txnsPtr.Load() }

// New opens the data directory (topic registry, broker identity, every
// partition with recovery) and returns a server ready to Serve.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:       cfg,
		logger:    cfg.Logger,
		repeat:    logrepeat.New(cfg.Logger, logrepeat.Options{}),
		listeners: map[net.Listener]struct{}{},
		conns:     map[*conn]struct{}{},
		maintDone: make(chan struct{}),
		tierKick:  make(chan struct{}, 1),
	}
	s.topicsMirror.key = metaKey
	s.ctx, s.cancel = context.WithCancel(context.Background())
	meta, err := openMeta(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	s.meta = meta
	s.store = log.OpenStore(log.Options{
		FS:           cfg.FS,
		Logger:       cfg.Logger.Named("log"),
		SyncInterval: cfg.FsyncInterval,
		MaxOpenFiles: cfg.MaxOpenFiles,
		FDs:          cfg.FDs,
		Preallocate:  cfg.Preallocate,
		Now:          cfg.Now,
		OnSeal:       s.kickTiering,
	})
	if cfg.Tier != nil && cfg.Cluster == nil {
		// (A cluster's metadata is in etcd: no topics.json in the bucket.)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err = restoreFromTier(ctx, cfg.DataDir, cfg.Tier, cfg.Logger)
		cancel()
		if err != nil {
			s.store.Close()
			return nil, err
		}
	}
	reg, err := openRegistry(cfg.DataDir, s.store, cfg.Logger.Named("topics"), cfg.Tier != nil)
	if err != nil {
		s.store.Close()
		return nil, err
	}
	s.reg = reg
	if cfg.Tier != nil {
		s.pruneForgets() // no request served yet
	}
	if cfg.Tier != nil && cfg.Cluster == nil {
		reg.mirror = s.queueTopicsMirror
		// Mirrored again at every start: a copy that failed before a
		// restart is not left stale.
		if b, err := os.ReadFile(filepath.Join(cfg.DataDir, topicsFile)); err == nil {
			s.topicsMirror.queue(b)
		}
		// Not only the start that fetched topics.json: a restore cut short
		// by a crash is finished by the next start (the marker stays until
		// then). Other starts do not need the bucket.
		marker := filepath.Join(cfg.DataDir, restorePending)
		if _, err := os.Stat(marker); err == nil {
			err := s.restoreMeta(context.Background())
			if err == nil {
				err = s.rebaseRestored(context.Background())
			}
			if err == nil {
				// Durably gone before anything is served: a marker back
				// after a power loss would restore producer state again
				// over newer local state.
				if err = os.Remove(marker); err == nil {
					err = log.OSFS.SyncDir(cfg.DataDir)
				}
			}
			if err != nil {
				close(s.maintDone) // maintain never ran: let Close proceed
				s.Close()
				return nil, err
			}
		}
	}
	{
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := s.openGroups(ctx)
		if err == nil {
			// Before the transactions open: recovery stamps the epoch
			// into the markers it writes.
			err = s.raiseLeaderEpoch()
		}
		if err == nil {
			err = s.openTxns(ctx)
		}
		cancel()
		if err == nil {
			byState, _ := s.grp().Stats()
			for _, n := range byState {
				if n > 0 {
					s.offsetsShown.Store(true) // groups in use: Kafka would have its offsets topic
				}
			}
		}
		if err != nil {
			close(s.maintDone) // maintain never ran: let Close proceed
			s.Close()
			return nil, err
		}
	}
	if cfg.AdvertisedAddr != "" {
		if _, _, err = hostPort(cfg.AdvertisedAddr); err != nil {
			close(s.maintDone) // maintain never ran: let Close proceed
			s.Close()
			return nil, err
		}
	}
	if s.sec, err = s.openSecurity(); err != nil {
		close(s.maintDone) // maintain never ran: let Close proceed
		s.Close()
		return nil, err
	}
	if cfg.Cluster != nil {
		if s.cl, err = startCluster(s, *cfg.Cluster); err != nil {
			close(s.maintDone) // maintain never ran: let Close proceed
			s.Close()
			return nil, err
		}
	}
	go s.maintain()
	return s, nil
}

// ClusterID returns the persistent cluster id.
func (s *Server) ClusterID() string { return s.meta.m.ClusterID }

// Ready reports whether the server is serving and not shutting down.
func (s *Server) Ready() bool { return s.serving.Load() && !s.shutting.Load() }

// Serve accepts plaintext connections on ln until Shutdown, advertising
// Config.AdvertisedAddr (default: the listener's address).
func (s *Server) Serve(ln net.Listener) error {
	return s.ServeListener(ln, Listener{Name: Plaintext, Protocol: Plaintext, Advertised: s.cfg.AdvertisedAddr})
}

// ServeListener accepts connections on ln until Shutdown with l's security
// protocol; Metadata answers its clients with l's advertised address.
func (s *Server) ServeListener(ln net.Listener, l Listener) error {
	if s.shutting.Load() {
		return ErrServerClosed
	}
	lis, err := newListener(l, ln)
	if err != nil {
		return err
	}
	if lis.usesSASL() && len(s.cfg.SASLMechanisms) == 0 {
		return fmt.Errorf("broker: listener %s is %s but no SASL mechanism is enabled", lis.Name, lis.Protocol)
	}
	s.mu.Lock()
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	s.serving.Store(true)
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.shutting.Load() {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Anything else (EMFILE, ECONNABORTED, ...) is worth a retry.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.repeat.Warn("accept error; retrying", zap.Error(err), zap.Duration("backoff", backoff))
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.mu.Lock()
		if len(s.conns) >= s.cfg.MaxConnections {
			s.mu.Unlock()
			s.repeat.Warn("connection limit reached; closing new connection", zap.Int("max_connections", s.cfg.MaxConnections), zap.Stringer("remote", nc.RemoteAddr()))
			nc.Close()
			continue
		}
		c := newConn(s, nc, lis)
		s.conns[c] = struct{}{}
		s.connWG.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connWG.Done()
}

// Shutdown stops the broker gracefully within ctx's deadline (serve's
// --shutdown-timeout): one deadline for the whole stop, split so that the
// last step always has its share (DESIGN.md, "Shutdown sequence"). Without
// a deadline each step runs to its end.
//
//  1. Stop accepting, end long polls, let in-flight requests finish (each
//     connection closes after its current request). With tiering this
//     gets a third of the time before the close reserve, without it all of
//     it; then the connections left are closed hard, and the error says so.
//  2. With tiering, the final offload (offloadAll): every partition sealed
//     and uploaded, many at once, until the deadline less the close
//     reserve. What does not fit stays local and is uploaded after the
//     next start; the log line counts it.
//  3. Close (groups, every partition in parallel, the store) in the close
//     reserve (closeReserve), which grows with the partition count.
func (s *Server) Shutdown(ctx context.Context) error {
	drainCtx, offloadCtx := ctx, ctx
	if dl, ok := ctx.Deadline(); ok {
		start := time.Now()
		total := dl.Sub(start)
		reserve := closeReserve(total, s.partitionCount())
		drainEnd := dl.Add(-reserve)
		if s.cfg.Tier != nil {
			drainEnd = start.Add((total - reserve) / 3)
		}
		var cancelDrain, cancelOffload context.CancelFunc
		drainCtx, cancelDrain = context.WithDeadline(ctx, drainEnd)
		defer cancelDrain()
		offloadCtx, cancelOffload = context.WithDeadline(ctx, dl.Add(-reserve))
		defer cancelOffload()
	}
	if s.cl != nil {
		// Controlled shutdown: leaderships move first, so clients wait
		// milliseconds, not the session TTL.
		hctx, cancel := context.WithTimeout(drainCtx, 5*time.Second)
		s.cl.handOver(hctx)
		cancel()
	}
	s.shutting.Store(true)
	s.cancel()
	s.mu.Lock()
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.closeIfIdle()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.connWG.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-drainCtx.Done():
		s.mu.Lock()
		busy := len(s.conns)
		for c := range s.conns {
			c.raw.Close()
		}
		s.mu.Unlock()
		err = fmt.Errorf("broker: %d connections still busy at the shutdown deadline's share for requests: closed hard: %w", busy, drainCtx.Err())
		<-done
	}
	if s.cfg.Tier != nil && s.cl == nil { // (a cluster's followers hold the tail)
		select {
		case <-s.maintDone: // no upload in flight: offloadAll owns the manifests now
			s.offloadAll(offloadCtx)
		case <-offloadCtx.Done():
			s.logger.Warn("final offload skipped: the maintenance pass under way did not end by the shutdown deadline; " +
				"local data stays local, safely, and is uploaded after the next start")
		}
	}
	s.Close()
	return err
}

// closeReserve is the part of a stop of total kept for Close with
// partitions open: a fifth of it between 1 s and 10 s (at most half), or
// closeCost per partition if that is more (at most three quarters). A
// clean close matters more than the last uploads: what is not uploaded is
// uploaded after the next start anyway, while a partition not closed
// cleanly has its last segment scanned and its producer state replayed.
func closeReserve(total time.Duration, partitions int) time.Duration {
	base := min(max(total/5, time.Second), 10*time.Second, total/2)
	return max(base, min(time.Duration(partitions)*closeCost, total*3/4))
}

// closeCost is what closing one partition takes, closeParallelism at once,
// on a slow disk: each is about six fsyncs (producer state, indexes, clean
// state, with their directory), and a virtual machine's disk that does
// 1 000-2 000 fsyncs a second one at a time does 4 000-10 000 at once:
// 10 000 partitions closed in 5.8-9.5 s there.
const closeCost = time.Millisecond

// partitionCount is the number of partitions open.
func (s *Server) partitionCount() int {
	n := 0
	for _, t := range s.reg.all() {
		n += len(s.reg.partitionsOf(t))
	}
	return n
}

// closeParallelism is how many partitions Close closes at once: each
// close is a few fsyncs, so a serial close of thousands of partitions
// takes tens of seconds while the disk can take many fsyncs at once.
const closeParallelism = 32

// Close closes partitions and the store without waiting for connections
// (use Shutdown for a graceful stop).
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.shutting.Store(true)
		s.cancel()
		<-s.maintDone
		if s.cl != nil {
			s.cl.close() // fetchers stop before the partitions close
		}
		start := time.Now()
		s.closeTxns()
		s.closeGroups()
		n := 0
		if s.reg != nil {
			n = s.reg.close(closeParallelism)
		}
		s.store.Close()
		s.logger.Info("closed every partition", zap.Int("partitions", n), zap.Duration("took", time.Since(start).Round(time.Millisecond)))
		s.repeat.Close() // the counts of the last minute
	})
}

// kickTiering asks the maintenance loop for a pass now (with tiering: a
// sealed segment is uploaded at once rather than at the next tick).
func (s *Server) kickTiering() {
	if s.cfg.Tier == nil {
		return
	}
	select {
	case s.tierKick <- struct{}{}:
	default:
	}
}

// tierParallelism is how many partitions' tiering steps run at once.
const tierParallelism = 4

func (s *Server) maintain() {
	defer close(s.maintDone)
	if s.cfg.CleanerBackoff > 0 {
		cleanerDone := make(chan struct{})
		defer func() { <-cleanerDone }()
		go s.cleanerLoop(cleanerDone)
	}
	if (s.cfg.LocalDiskBudget > 0 || s.cfg.LocalDiskReservePercent > 0) && s.cfg.Tier != nil {
		// The budget is also watched on its own: a maintenance pass stuck
		// on a bucket that is away can take minutes.
		budgetDone := make(chan struct{})
		defer func() { <-budgetDone }()
		go func() {
			defer close(budgetDone)
			t := time.NewTicker(min(s.cfg.MaintenanceInterval, time.Second))
			defer t.Stop()
			for {
				select {
				case <-s.ctx.Done():
					return
				case <-t.C:
					s.checkDiskBudget()
				}
			}
		}()
	}
	t := time.NewTicker(s.cfg.MaintenanceInterval)
	defer t.Stop()
	var swept time.Time
	if s.cfg.Tier != nil {
		s.cleanOrphans() // no upload runs yet: safe
		swept = time.Now()
	}
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		case <-s.tierKick:
		}
		now := s.cfg.Now()
		if s.cfg.Tier != nil && s.cl == nil {
			s.mirrorTopics(s.ctx)
			s.mirrorSecurity(s.ctx)
		}
		s.maintainGroups(now)
		s.maintainTxns(now)
		s.checkDiskBudget()
		// Tiering work runs on a few partitions at once: uploads are
		// network-bound, and one slow partition must not hold up the rest.
		sem := make(chan struct{}, tierParallelism)
		var wg sync.WaitGroup
	pass:
		for _, tp := range s.reg.all() {
			for _, p := range s.reg.partitionsOf(tp) {
				if s.ctx.Err() != nil {
					break pass // stopping: the final offload takes over
				}
				p.expireProducers(now.UnixMilli(), s.cfg.ProducerIDExpiration)
				// (Not in a cluster: the coordinator that holds a
				// transaction may be another broker.)
				if p.firstOpen.Load() != 0 && s.txnCoord() != nil && s.cl == nil {
					s.abortOrphans(p, now, s.cfg.TransactionMaxTimeout)
				}
				if _, err := p.log.Maintain(now); err != nil && !errors.Is(err, log.ErrClosed) {
					// An offline partition fails every pass: counted, not
					// logged each time.
					s.repeat.Warn("maintenance", zap.String("topic", tp.name), zap.Int32("partition", p.index), zap.Error(err))
					continue
				}
				if s.cfg.Tier != nil && s.ctx.Err() == nil && !s.tierIdle(p, now) {
					sem <- struct{}{}
					wg.Add(1)
					go func() {
						defer func() { <-sem; wg.Done() }()
						s.tierPartition(p, now)
					}()
				}
			}
		}
		wg.Wait()
		sweep := s.cfg.Tier != nil && time.Since(swept) >= s.cfg.OrphanSweepInterval
		if s.cfg.Tier != nil && s.forgetDue.Swap(false) && !sweep { // (the sweep forgets too)
			s.forgetPending() // between passes: no upload of a deleted partition under way
		}
		s.checkDiskBudget() // what this pass uploaded can make room
		if sweep {
			s.cleanOrphans() // between passes: no upload is under way
			swept = time.Now()
		}
	}
}
