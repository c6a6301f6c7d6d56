package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/synapsebroker/synapse/broker"
	"github.com/synapsebroker/synapse/httpapi"
	"github.com/synapsebroker/synapse/internal/dirlock"
	"github.com/synapsebroker/synapse/internal/fdbudget"
	"github.com/synapsebroker/synapse/tiering"
)

// serveOptions are the flags of `synapse serve`. Each has a SYNAPSE_*
// environment twin (see bindEnv).
type serveOptions struct {
	dataDir              string
	listen               string
	advertisedAddr       string
	httpListen           string
	pprof                bool
	httpAPI              httpAPIOptions
	autoCreateTopics     bool
	defaultPartitions    int32
	fsyncInterval        time.Duration
	maxOpenFiles         int
	preallocate          bool
	maxRequestBytes      int
	maxConnections       int
	fetchSessionSlots    int
	idleTimeout          time.Duration
	shutdownTimeout      time.Duration
	tier                 string
	tierCacheBytes       int64
	tierDiskCache        int64
	tierFetchRate        int64
	tierTailGuard        bool
	maintenance          time.Duration
	diskBudget           int64
	localRetBytes        int64
	diskReserve          float64
	localRetMs           int64
	groupDelay           time.Duration
	groupMinSession      time.Duration
	groupMaxSession      time.Duration
	offsetsRetention     time.Duration
	producerIDExpiration time.Duration
	txnMaxTimeout        time.Duration
	txnIDExpiration      time.Duration
	cleanerRate          int64
	cleanerBuffer        int
	cleanerBackoff       time.Duration
	sec                  securityOptions
	cluster              clusterOptions
}

func (o *serveOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.dataDir, "data-dir", "./data", "directory holding topics and partition logs (created if missing)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:9092", "address of the one PLAINTEXT Kafka listener (host:port); see --listeners for several")
	fs.StringVar(&o.advertisedAddr, "advertised-addr", "", "host:port clients of --listen are told to connect to (default: the listener's address)")
	o.sec.AddFlags(fs)
	o.cluster.AddFlags(fs)
	fs.StringVar(&o.httpListen, "http-listen", "127.0.0.1:8080", "address of the HTTP side port (/healthz, /readyz, /metrics, /status); empty (on the command line) disables it")
	o.httpAPI.AddFlags(fs)
	fs.BoolVar(&o.pprof, "pprof", false, "also serve Go's profiler under /debug/pprof/ on the HTTP side port (anyone who reaches the port can profile the process)")
	fs.BoolVar(&o.autoCreateTopics, "auto-create-topics", true, "create unknown topics on Metadata and Produce")
	fs.Int64Var(&o.cleanerRate, "cleaner-io-max-bytes-per-second", 64<<20, "bytes the log cleaner (cleanup.policy=compact) reads and writes per second, so cleaning never starves produce and fetch (Kafka's log.cleaner.io.max.bytes.per.second); 0: no bound")
	fs.IntVar(&o.cleanerBuffer, "cleaner-dedupe-buffer-size", 32<<20, "bytes of the log cleaner's key map (Kafka's log.cleaner.dedupe.buffer.size), allocated at the first clean; a dirty range with more keys is cleaned in several passes")
	fs.DurationVar(&o.cleanerBackoff, "cleaner-backoff", 15*time.Second, "how often the log cleaner looks for compacted partitions to clean (Kafka's log.cleaner.backoff.ms); 0 disables the cleaner")
	fs.Int32Var(&o.defaultPartitions, "default-partitions", 1, "partition count of auto-created topics")
	fs.DurationVar(&o.fsyncInterval, "fsync-interval", 0,
		"0 = durable: acknowledge acks=all only once fsync'd, concurrent appends share fsyncs (group commit); "+
			"> 0 = relaxed: fsync dirty partitions on this interval")
	fs.IntVar(&o.maxOpenFiles, "max-open-files", 1024, "bound on idle open segment files across all partitions")
	fs.BoolVar(&o.preallocate, "preallocate", true, "reserve busy active segments' space ahead of appends with fallocate (Kafka's file.preallocate; Linux)")
	fs.IntVar(&o.maxRequestBytes, "max-request-bytes", 100<<20, "largest request accepted (Kafka's socket.request.max.bytes)")
	fs.IntVar(&o.maxConnections, "max-connections", 10000, "concurrent client connections; more are closed at accept")
	fs.IntVar(&o.fetchSessionSlots, "max-incremental-fetch-session-cache-slots", 1000,
		"incremental fetch sessions (KIP-227) the broker keeps, so consumers send and get only what changed (Kafka's max.incremental.fetch.session.cache.slots); 0 = none, every fetch is a full fetch")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", 10*time.Minute, "close client connections idle this long (Kafka's connections.max.idle.ms)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second,
		"deadline of the whole graceful stop (in-flight requests, the final upload to the tiered store, closing every partition): what does not fit stays local and is uploaded after the next start; the process exits by it")
	fs.StringVar(&o.tier, "tier", "", "tiered store for sealed segments: none, file://path or s3://bucket/prefix?endpoint=..&region=..&path_style=true "+
		"(default file://<data-dir>/tier)")
	fs.Int64Var(&o.tierCacheBytes, "tier-cache-bytes", 256<<20, "memory budget of the cold-read chunk cache")
	fs.Int64Var(&o.tierFetchRate, "tier-fetch-max-bytes-per-second", 0, "bound on the bytes cold reads download from the tiered store per second, to keep catch-up readers from starving tail traffic (Kafka's remote.log.manager.fetch.max.bytes.per.second); 0 = unlimited, else at least 1 MiB")
	fs.BoolVar(&o.tierTailGuard, "tier-tail-guard", true, "pace cold reads down (to >= 4 MiB/s) while tail traffic (small acks=all produce, fetches waiting at a partition's end) runs late against itself without cold reads, or CPU pressure (Linux PSI) rises with them; back up while the tail is on time; false = cold reads bounded only by --tier-fetch-max-bytes-per-second")
	fs.Int64Var(&o.tierDiskCache, "tier-disk-cache-bytes", 1<<30, "local-disk budget of the cold-read chunk cache (<data-dir>/tier-cache, emptied at start); 0 disables it")
	fs.Int64Var(&o.diskBudget, "local-disk-budget", 0,
		"with tiering: cap on the bytes of local segments; past it local copies of uploaded segments go first (oldest first, whatever local.retention.* keeps), and produce is refused (retriable) only while uploads are behind; 0 = no cap")
	fs.Float64Var(&o.diskReserve, "local-disk-reserve-percent", 2,
		"with tiering: share of the data directory's file system kept free; below it local copies of uploaded segments go first, and produce is refused (retriable) while that is not enough, so a long bucket outage never fills the disk; 0 disables it")
	fs.Int64Var(&o.localRetBytes, "local-retention-bytes", -2,
		"with tiering: default of the topic config local.retention.bytes, the newest bytes of each partition kept on local disk once uploaded (Kafka's log.local.retention.bytes); -2 = as retention.bytes, -1 = no bound")
	fs.Int64Var(&o.localRetMs, "local-retention-ms", -2,
		"with tiering: default of the topic config local.retention.ms, how long uploaded data stays on local disk too (Kafka's log.local.retention.ms); -2 = as retention.ms, -1 = no bound")
	fs.DurationVar(&o.maintenance, "maintenance-interval", 10*time.Second,
		"how often retention, segment.ms rolls and tiering uploads run (Kafka's log.retention.check.interval.ms)")
	fs.DurationVar(&o.groupDelay, "group-initial-rebalance-delay", 3*time.Second,
		"how long the first rebalance of an empty consumer group waits for more members (Kafka's group.initial.rebalance.delay.ms); 0 = none")
	fs.DurationVar(&o.groupMinSession, "group-min-session-timeout", 6*time.Second, "smallest session timeout a group member may ask for (group.min.session.timeout.ms)")
	fs.DurationVar(&o.groupMaxSession, "group-max-session-timeout", 30*time.Minute, "largest session timeout a group member may ask for (group.max.session.timeout.ms)")
	fs.DurationVar(&o.offsetsRetention, "offsets-retention", 7*24*time.Hour,
		"how long committed offsets of a group without members are kept (offsets.retention.minutes)")
	fs.DurationVar(&o.producerIDExpiration, "producer-id-expiration", 24*time.Hour,
		"how long a partition keeps the state of an idempotent producer that stopped writing to it (producer.id.expiration.ms)")
	fs.DurationVar(&o.txnMaxTimeout, "transaction-max-timeout", 15*time.Minute,
		"longest transaction.timeout.ms a transactional producer may ask for (Kafka's transaction.max.timeout.ms)")
	fs.DurationVar(&o.txnIDExpiration, "transactional-id-expiration", 7*24*time.Hour,
		"forget a transactional id with no transaction for this long (Kafka's transactional.id.expiration.ms)")
}

func (o *serveOptions) validate() error {
	var errs []error
	if o.dataDir == "" {
		errs = append(errs, errors.New("--data-dir must not be empty"))
	}
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: %w", o.listen, err))
	}
	if o.advertisedAddr != "" {
		if _, _, err := net.SplitHostPort(o.advertisedAddr); err != nil {
			errs = append(errs, fmt.Errorf("--advertised-addr %q: %w", o.advertisedAddr, err))
		}
	}
	if o.tierFetchRate != 0 && o.tierFetchRate < 1<<20 {
		errs = append(errs, fmt.Errorf("--tier-fetch-max-bytes-per-second %d: 0 (unlimited) or at least 1 MiB", o.tierFetchRate))
	}
	if o.tierCacheBytes < 16<<20 {
		errs = append(errs, fmt.Errorf("--tier-cache-bytes %d: at least 16 MiB (two 8 MiB chunks)", o.tierCacheBytes))
	}
	if o.groupDelay < 0 {
		errs = append(errs, fmt.Errorf("--group-initial-rebalance-delay %s: must not be negative", o.groupDelay))
	}
	if o.groupMinSession <= 0 || o.groupMaxSession < o.groupMinSession {
		errs = append(errs, fmt.Errorf("--group-min-session-timeout %s and --group-max-session-timeout %s: need 0 < min <= max", o.groupMinSession, o.groupMaxSession))
	}
	if o.offsetsRetention <= 0 {
		errs = append(errs, fmt.Errorf("--offsets-retention %s: must be positive", o.offsetsRetention))
	}
	if o.txnMaxTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--transaction-max-timeout %s: must be positive", o.txnMaxTimeout))
	}
	if o.txnIDExpiration <= 0 {
		errs = append(errs, fmt.Errorf("--transactional-id-expiration %s: must be positive", o.txnIDExpiration))
	}
	if o.producerIDExpiration <= 0 {
		errs = append(errs, fmt.Errorf("--producer-id-expiration %s: must be positive", o.producerIDExpiration))
	}
	if o.cleanerRate < 0 || o.cleanerBuffer < 1<<20 || o.cleanerBackoff < 0 {
		errs = append(errs, fmt.Errorf("--cleaner-io-max-bytes-per-second %d (>= 0), --cleaner-dedupe-buffer-size %d (>= 1 MiB), --cleaner-backoff %s (>= 0)", o.cleanerRate, o.cleanerBuffer, o.cleanerBackoff))
	}
	errs = append(errs, o.sec.validate()...)
	errs = append(errs, o.httpAPI.validate()...)
	if o.fetchSessionSlots < 0 {
		errs = append(errs, fmt.Errorf("--max-incremental-fetch-session-cache-slots %d: must not be negative", o.fetchSessionSlots))
	}
	if o.fsyncInterval < 0 {
		errs = append(errs, fmt.Errorf("--fsync-interval %s: must not be negative", o.fsyncInterval))
	}
	for _, c := range []struct {
		name string
		v    int64
	}{{"--max-open-files", int64(o.maxOpenFiles)}, {"--default-partitions", int64(o.defaultPartitions)},
		{"--max-request-bytes", int64(o.maxRequestBytes)}, {"--max-connections", int64(o.maxConnections)}} {
		if c.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %d: must be positive", c.name, c.v))
		}
	}
	if err := o.cluster.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func newServeCommand(root *rootOptions) *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the broker",
		Long: `Run the Kafka-compatible broker on the data directory until SIGINT or SIGTERM,
which stop it gracefully: stop accepting, finish in-flight requests, flush
and close every partition.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serveFunc(cmd, root.logger, o)
		},
	}
	o.AddFlags(cmd.Flags())
	bindEnv(cmd.Flags())
	return cmd
}

func serveFunc(cmd *cobra.Command, logger *zap.Logger, o *serveOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	// Stop on SIGINT/SIGTERM, or when the command's context is cancelled
	// (tests). After the first signal the default handling is restored, so a
	// second ^C kills a shutdown that hangs.
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dataDir, err := filepath.Abs(o.dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	// One owner per data directory, before anything in it is read or
	// written; held until the process exits.
	lock, err := dirlock.Acquire(dataDir)
	if err != nil {
		return err
	}
	defer lock.Release()
	specs, err := o.listenerSpecs(cmd.Flags().Changed("listen"), cmd.Flags().Changed("advertised-addr"), logger)
	if err != nil {
		return err
	}
	var lns []net.Listener
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	defer closeAll() // Shutdown closes them too, unless it stops before Serve starts
	for i := range specs {
		ln, err := net.Listen("tcp", specs[i].addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", specs[i].l.Name, err)
		}
		lns = append(lns, ln)
		if specs[i].l.Advertised == "" {
			// A wildcard is no address to connect to: Kafka advertises
			// the host's name then.
			specs[i].l.Advertised = advertisedFor(ln, logger)
		}
	}
	ln, advertised := lns[0], specs[0].l.Advertised
	policy := "durable"
	if o.fsyncInterval > 0 {
		policy = "interval " + o.fsyncInterval.String()
	}
	tierURL := o.tier
	if tierURL == "" {
		tierURL = "file://" + filepath.Join(dataDir, "tier")
	}
	if o.cluster.name != "" && o.tier == "" {
		// A cluster's brokers share one bucket: no default under one
		// broker's data directory. Without --tier each partition's
		// replicas keep its whole log.
		tierURL = "none"
	}
	clusterCfg, stopEtcd, err := o.cluster.start(dataDir, advertised, logger)
	if err != nil {
		return err
	}
	defer stopEtcd()
	store, err := tiering.OpenURL(ctx, tierURL)
	if err != nil {
		return err
	}
	var tier *tiering.Tier
	if store != nil {
		// Transient store errors (503 SlowDown, timeouts) are retried with
		// backoff; whatever still fails is retried on the next pass.
		tier = tiering.New(tiering.Retrying(store, 5), logger.Named("tiering"), o.tierCacheBytes)
		tier.SetFetchRate(o.tierFetchRate)
		tier.SetTailGuard(o.tierTailGuard)
		if o.tierDiskCache > 0 {
			if err := tier.SetDiskCache(filepath.Join(dataDir, "tier-cache"), o.tierDiskCache); err != nil {
				return fmt.Errorf("tier disk cache: %w", err)
			}
		}
	}
	fds, maxConns := fileBudget(ctx, logger, o.maxConnections)
	start := time.Now()
	bcfg := broker.Config{
		Tier:                    tier,
		MaintenanceInterval:     o.maintenance,
		LocalDiskBudget:         o.diskBudget,
		LocalRetention:          &broker.LocalRetention{Bytes: o.localRetBytes, Ms: o.localRetMs},
		LocalDiskReservePercent: o.diskReserve,
		DataDir:                 dataDir,
		AdvertisedAddr:          advertised,
		AutoCreateTopics:        o.autoCreateTopics,
		DefaultPartitions:       o.defaultPartitions,
		MaxFrameSize:            o.maxRequestBytes,
		MaxConnections:          maxConns,
		FetchSessionCacheSlots:  cmp.Or(o.fetchSessionSlots, -1), // 0 on the command line means none
		IdleTimeout:             o.idleTimeout,
		FsyncInterval:           o.fsyncInterval,
		MaxOpenFiles:            o.maxOpenFiles,
		FDs:                     fds,
		Preallocate:             o.preallocate,
		Logger:                  logger.Named("broker"),
		Cluster:                 clusterCfg,

		GroupInitialRebalanceDelay: cmp.Or(o.groupDelay, -1), // 0 on the command line means none
		GroupMinSessionTimeout:     o.groupMinSession,
		GroupMaxSessionTimeout:     o.groupMaxSession,
		OffsetsRetention:           o.offsetsRetention,
		ProducerIDExpiration:       o.producerIDExpiration,
		TransactionMaxTimeout:      o.txnMaxTimeout,
		TransactionalIDExpiration:  o.txnIDExpiration,
		CleanerIOMaxBytesPerSecond: o.cleanerRate,
		CleanerDedupeBufferSize:    o.cleanerBuffer,
		CleanerBackoff:             cmp.Or(o.cleanerBackoff, -1), // 0 on the command line disables it
	}
	closeAudit, err := o.securityConfig(&bcfg, specs, logger)
	if err != nil {
		return err
	}
	defer closeAudit()
	srv, err := broker.New(bcfg)
	if err != nil {
		return err
	}
	var hs *http.Server
	var api *httpapi.API
	if o.httpListen != "" {
		hln, err := net.Listen("tcp", o.httpListen)
		if err != nil {
			srv.Close()
			return fmt.Errorf("http listen: %w", err)
		}
		handler := healthHandler(srv, o.pprof)
		if o.httpAPI.enabled(o.httpListen) {
			api = o.httpAPI.newAPI(srv, logger)
			handler = api.Mount(handler)
		}
		hs = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(hln)
	}
	logger.Info("serving",
		zap.String("version", currentBuildInfo().Version),
		zap.String("listen", ln.Addr().String()),
		zap.String("advertised", advertised),
		zap.Strings("listeners", listenerNames(specs, lns)),
		zap.Strings("sasl_mechanisms", bcfg.SASLMechanisms),
		zap.String("authorizer", o.sec.authorizer),
		zap.String("http", o.httpListen),
		zap.Bool("http_api", api != nil),
		zap.String("cluster_id", srv.ClusterID()),
		zap.String("data_dir", dataDir),
		zap.String("fsync", policy),
		zap.String("tier", tierURL),
		zap.Duration("startup", time.Since(start)))

	served := make(chan error, len(lns))
	for i, ln := range lns {
		go func() { served <- srv.ServeListener(ln, specs[i].l) }()
	}
	select {
	case <-ctx.Done():
		logger.Info("shutting down", zap.String("cause", context.Cause(ctx).Error()))
	case err := <-served:
		logger.Error("listener failed", zap.Error(err))
	}
	stop()
	// One deadline for the whole stop; the broker splits it between
	// in-flight requests, the final upload and closing (DESIGN.md,
	// "Shutdown sequence").
	began := time.Now()
	// The broker's share ends a little before the deadline: the process
	// cannot exit while one of its threads is inside an fsync or syncfs
	// (the kernel finishes the call first), and those run to the end.
	deadline := began.Add(o.shutdownTimeout - min(time.Second, o.shutdownTimeout/10))
	sctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if hs != nil {
		// Beside the broker's stop: an HTTP request in flight (a CPU
		// profile) must not take the broker's share of the deadline.
		go hs.Shutdown(sctx)
		defer hs.Close()
	}
	stopped := make(chan error, 1)
	go func() {
		if api != nil {
			// Its consumer instances leave their groups and its clients
			// close before the broker stops: they hold internal
			// connections.
			actx, acancel := context.WithTimeout(sctx, apiCloseTimeout)
			api.Close(actx)
			acancel()
		}
		stopped <- srv.Shutdown(sctx)
	}()
	overrun := time.NewTimer(time.Until(deadline))
	defer overrun.Stop()
	select {
	case err := <-stopped:
		if err != nil {
			logger.Warn("shutdown: in-flight requests ran past their share of the deadline", zap.Error(err))
		}
	case <-overrun.C:
		// Closing still runs (a disk that stalls fsyncs): exit anyway,
		// as promised. Nothing acknowledged is lost; partitions not
		// closed cleanly are recovered (their last segment checked) at
		// the next start.
		logger.Error("shutdown deadline passed while closing: exiting anyway; partitions not closed cleanly are recovered at the next start",
			zap.Duration("shutdown_timeout", o.shutdownTimeout))
		return nil
	}
	logger.Info("stopped", zap.Duration("took", time.Since(began).Round(time.Millisecond)))
	return nil
}

// healthHandler serves /healthz (the process is up), /readyz (the broker
// accepts requests; 503 while starting or stopping), /metrics (Prometheus)
// and /status (JSON: tiering upload lag, bytes up and down, cache hit ratio,
// store errors), and with withPprof Go's profiler under /debug/pprof/.
func healthHandler(srv *broker.Server, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(srv.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// With SASL or ACLs on, what goes beyond health and metrics asks for a
	// login of the broker's users (HTTP Basic, checked as PLAIN is).
	login := func(h http.HandlerFunc) http.HandlerFunc {
		if !srv.Secured() {
			return h
		}
		return func(w http.ResponseWriter, r *http.Request) {
			client, _, err := net.SplitHostPort(r.RemoteAddr)
			if err != nil {
				client = r.RemoteAddr
			}
			if u, p, ok := r.BasicAuth(); ok && srv.CheckLogin(u, p, client) {
				h(w, r)
				return
			}
			w.Header().Set("WWW-Authenticate", `Basic realm="synapse"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
		}
	}
	mux.HandleFunc("/status", login(func(w http.ResponseWriter, r *http.Request) {
		out := map[string]any{"ready": srv.Ready(), "cluster_id": srv.ClusterID()}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second) // as /metrics: a bucket away does not hang it
		st, ok := srv.TierStatus(ctx)
		cancel()
		if ok {
			out["tier"] = st
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	}))
	if withPprof {
		// Go's profiler, for operators chasing CPU or latency: off unless
		// asked for (--pprof), as the side port may be widened for
		// /metrics.
		mux.HandleFunc("/debug/pprof/", login(pprof.Index))
		mux.HandleFunc("/debug/pprof/profile", login(pprof.Profile))
		mux.HandleFunc("/debug/pprof/trace", login(pprof.Trace))
		mux.HandleFunc("/debug/pprof/symbol", login(pprof.Symbol))
		mux.HandleFunc("/debug/pprof/cmdline", login(pprof.Cmdline))
	}
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !srv.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// listenerNames is what the "serving" log line shows of each listener.
func listenerNames(specs []listenerSpec, lns []net.Listener) []string {
	var out []string
	for i, sp := range specs {
		out = append(out, fmt.Sprintf("%s://%s (advertised %s)", sp.l.Name, lns[i].Addr(), sp.l.Advertised))
	}
	return out
}

// fileBudget raises RLIMIT_NOFILE's soft limit to the hard one, logs both,
// and shares the limit between connections and the log store's files
// (fdbudget.Plan). It returns the store's budget and the connection cap,
// lowered below --max-connections (with a warning) when the limit is too
// small for both.
func fileBudget(ctx context.Context, logger *zap.Logger, wantConns int) (*fdbudget.Budget, int) {
	before, after, hard, err := fdbudget.RaiseLimit()
	if err != nil || after == 0 {
		logger.Warn("file descriptor limit unknown: no descriptor budget", zap.Error(err))
		return nil, wantConns
	}
	plan := fdbudget.Plan(int(min(after, 1<<30)), wantConns)
	logger.Info("file descriptors",
		zap.Uint64("soft_limit_at_start", before), zap.Uint64("soft_limit", after), zap.Uint64("hard_limit", hard),
		zap.Int("connections", plan.Connections), zap.Int("files", plan.Files), zap.Int("other", plan.Other))
	if plan.Connections < wantConns/2 {
		logger.Warn("--max-connections lowered to fit the file descriptor limit (raise it with ulimit -n)",
			zap.Int("max_connections", wantConns), zap.Int("now", plan.Connections), zap.Uint64("limit", after))
	}
	b := fdbudget.New(plan.Files)
	go watchFileLimit(ctx, logger, b, int(after), wantConns)
	return b, plan.Connections
}

// watchFileLimit follows RLIMIT_NOFILE changed at run time (prlimit --pid)
// and resizes the budget to it until ctx ends. (Connections keep their cap:
// a lowered limit shows at accept as EMFILE, retried.)
func watchFileLimit(ctx context.Context, logger *zap.Logger, b *fdbudget.Budget, limit, wantConns int) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now, err := fdbudget.CurrentLimit()
		if err != nil || int(now) == limit {
			continue
		}
		plan := fdbudget.Plan(int(min(now, 1<<30)), wantConns)
		b.SetMax(plan.Files)
		logger.Warn("file descriptor limit changed: descriptor budget resized",
			zap.Int("limit_was", limit), zap.Uint64("limit", now), zap.Int("files", plan.Files))
		limit = int(now)
	}
}

// httpAPIOptions are the flags of the HTTP API on the side port
// (package httpapi, docs/http-api.md).
type httpAPIOptions struct {
	mode            string // auto, on, off
	maxBody         int64
	maxRecords      int
	maxPerGroup     int
	consumerTimeout time.Duration
}

// apiCloseTimeout bounds the HTTP API's close at shutdown (its consumer
// instances leave their groups).
const apiCloseTimeout = 5 * time.Second

func (o *httpAPIOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.mode, "http-api", "auto",
		"HTTP API on the HTTP side port (/produce, /fetch, /produce/batch, REST Proxy v2 /topics and /consumers): "+
			"auto = on when --http-listen is a loopback address, on, off; with SASL users or ACLs it asks for HTTP Basic logins")
	fs.Int64Var(&o.maxBody, "http-api-max-body-bytes", 8<<20, "largest HTTP API request body")
	fs.IntVar(&o.maxRecords, "http-api-max-records", 10000, "most records in one HTTP API produce request")
	fs.IntVar(&o.maxPerGroup, "http-api-max-consumers-per-group", 100, "most REST consumer instances per consumer group")
	fs.DurationVar(&o.consumerTimeout, "http-api-consumer-timeout", 5*time.Minute,
		"remove a REST consumer instance unused this long (the REST Proxy's consumer.instance.timeout.ms)")
}

func (o *httpAPIOptions) validate() []error {
	var errs []error
	switch o.mode {
	case "auto", "on", "off", "true", "false":
	default:
		errs = append(errs, fmt.Errorf("--http-api %q: want auto, on or off", o.mode))
	}
	if o.maxBody <= 0 || o.maxRecords <= 0 || o.maxPerGroup <= 0 || o.consumerTimeout <= 0 {
		errs = append(errs, errors.New("--http-api-max-body-bytes, --http-api-max-records, --http-api-max-consumers-per-group and --http-api-consumer-timeout must be positive"))
	}
	return errs
}

// enabled reports whether the HTTP API is served on listen: auto means on
// a loopback address only (anyone who reaches the port may produce and
// consume when no SASL user exists).
func (o *httpAPIOptions) enabled(listen string) bool {
	switch o.mode {
	case "on", "true":
		return true
	case "off", "false":
		return false
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (o *httpAPIOptions) newAPI(srv *broker.Server, logger *zap.Logger) *httpapi.API {
	return httpapi.New(httpapi.Config{
		Broker:               srv,
		Logger:               logger.Named("httpapi"),
		MaxBodyBytes:         o.maxBody,
		MaxRecords:           o.maxRecords,
		MaxInstancesPerGroup: o.maxPerGroup,
		InstanceTimeout:      o.consumerTimeout,
	})
}
