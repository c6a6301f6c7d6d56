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
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/protocol"
)

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("broker: server closed")

// Server is a single-node Kafka broker.
type Server struct {
	cfg    Config
	logger *zap.Logger
	store  *log.Store
	reg    *registry
	meta   *metaStore
	groups *group.Coordinator

	groupLog       *log.Partition
	groupsMirrored atomic.Uint64 // group change count last mirrored to the bucket

	// topics.json waiting to be mirrored to the bucket: saved under the
	// registry's lock, copied by the maintenance loop (never under that
	// lock, so a slow bucket cannot stall the requests that look topics
	// up).
	topicsMirror metaMirror
	forgetMu     sync.Mutex  // tier-forget.json
	forgetDue    atomic.Bool // a topic was deleted: forgetPending after the next pass

	sec *security // users, ACLs, SASL mechanisms (security.go)

	offsetsShown atomic.Bool // the virtual __consumer_offsets is listed (internal_topics.go)

	ctx    context.Context // cancelled on shutdown: ends long polls
	cancel context.CancelFunc

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	connWG    sync.WaitGroup
	shutting  atomic.Bool
	serving   atomic.Bool
	overDisk  atomic.Bool // local segments above LocalDiskBudget (tiering)
	budgetMu  sync.Mutex  // one checkDiskBudget at a time
	// budgetWarned is when releaseOverBudget last logged an unreadable
	// manifest (budgetMu): at most once a minute.
	budgetWarned time.Time
	pipelined    atomic.Int64 // produce requests appended while an earlier one awaited fsync
	maintDone    chan struct{}
	tierKick     chan struct{} // a segment was sealed: tier now, not at the next tick
	closeOnce    sync.Once

	beforeHandle atomic.Pointer[func(*protocol.Request)] // tests: runs before every handler
}

// New opens the data directory (topic registry, broker identity, every
// partition with recovery) and returns a server ready to Serve.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:       cfg,
		logger:    cfg.Logger,
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
		Now:          cfg.Now,
		OnSeal:       s.kickTiering,
	})
	if cfg.Tier != nil {
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
			err := s.rebaseRestored(context.Background())
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
		cancel()
		if err == nil {
			byState, _ := s.groups.Stats()
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
			s.logger.Warn("accept error; retrying", zap.Error(err), zap.Duration("backoff", backoff))
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.mu.Lock()
		if len(s.conns) >= s.cfg.MaxConnections {
			s.mu.Unlock()
			s.logger.Warn("connection limit reached; closing new connection", zap.Int("max_connections", s.cfg.MaxConnections), zap.Stringer("remote", nc.RemoteAddr()))
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

// Shutdown stops accepting, ends long polls, lets in-flight requests finish
// (each connection closes after its current request), then flushes and
// closes every partition. If ctx ends first, connections are closed hard;
// partitions are closed either way.
func (s *Server) Shutdown(ctx context.Context) error {
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
	case <-ctx.Done():
		err = ctx.Err()
		s.mu.Lock()
		for c := range s.conns {
			c.raw.Close()
		}
		s.mu.Unlock()
		<-done
	}
	if s.cfg.Tier != nil {
		<-s.maintDone // no upload in flight: offloadAll owns the manifests now
		s.offloadAll(ctx)
		s.mirrorTopics(ctx)
		s.mirrorSecurity(ctx)
		if s.groups != nil {
			s.mirrorGroups(ctx)
		}
	}
	s.Close()
	return err
}

// Close closes partitions and the store without waiting for connections
// (use Shutdown for a graceful stop).
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.shutting.Store(true)
		s.cancel()
		<-s.maintDone
		s.closeGroups()
		if s.reg != nil {
			s.reg.close()
		}
		s.store.Close()
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
		if s.cfg.Tier != nil {
			s.mirrorTopics(s.ctx)
			s.mirrorSecurity(s.ctx)
		}
		s.maintainGroups(now)
		s.checkDiskBudget()
		// Tiering work runs on a few partitions at once: uploads are
		// network-bound, and one slow partition must not hold up the rest.
		sem := make(chan struct{}, tierParallelism)
		var wg sync.WaitGroup
		for _, tp := range s.reg.all() {
			for _, p := range s.reg.partitionsOf(tp) {
				p.expireProducers(now.UnixMilli(), s.cfg.ProducerIDExpiration)
				if _, err := p.log.Maintain(now); err != nil && !errors.Is(err, log.ErrClosed) {
					s.logger.Warn("maintenance", zap.String("topic", tp.name), zap.Int32("partition", p.index), zap.Error(err))
					continue
				}
				if s.cfg.Tier != nil && s.ctx.Err() == nil {
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
