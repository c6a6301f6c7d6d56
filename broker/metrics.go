package broker

import (
	"context"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/synapsebroker/synapse/txn"
)

// Collector exposes the broker's figures to Prometheus; values are read at
// scrape time, so nothing is counted twice on the hot paths.
func (s *Server) Collector() prometheus.Collector { return (*collector)(s) }

type collector Server

var (
	descConns       = prometheus.NewDesc("synapse_connections", "Open client connections.", nil, nil)
	descPartitions  = prometheus.NewDesc("synapse_partitions", "Partitions hosted.", nil, nil)
	descLocalBytes  = prometheus.NewDesc("synapse_local_log_bytes", "Bytes of local segments across all partitions.", nil, nil)
	descUpBytes     = prometheus.NewDesc("synapse_tier_uploaded_bytes_total", "Bytes uploaded to the tiered store.", nil, nil)
	descUpSegs      = prometheus.NewDesc("synapse_tier_uploaded_segments_total", "Segments committed to the tiered store.", nil, nil)
	descDownBytes   = prometheus.NewDesc("synapse_tier_downloaded_bytes_total", "Bytes downloaded for cold reads.", nil, nil)
	descCacheHits   = prometheus.NewDesc("synapse_tier_cache_hits_total", "Cold-read chunk cache hits.", nil, nil)
	descCacheMisses = prometheus.NewDesc("synapse_tier_cache_misses_total", "Cold-read chunk cache misses.", nil, nil)
	descTierErrors  = prometheus.NewDesc("synapse_tier_errors_total", "Failed object-store operations.", nil, nil)
	descTierGets    = prometheus.NewDesc("synapse_tier_object_gets_total", "GET requests sent to the tiered store (segment chunks, indexes, manifests).", nil, nil)
	descLagBytes    = prometheus.NewDesc("synapse_tier_upload_lag_bytes", "Bytes of sealed segments not yet in the tiered store.", nil, nil)
	descLagSegs     = prometheus.NewDesc("synapse_tier_upload_lag_segments", "Sealed segments not yet in the tiered store.", nil, nil)
	descColdRate    = prometheus.NewDesc("synapse_tier_cold_read_rate_bytes", "Cold-read download rate in force (the tail guard's limit or the configured one); 0 = unlimited.", nil, nil)
	descTailLate    = prometheus.NewDesc("synapse_tier_tail_late_total", "Tail requests (small acks=all produce, fetches woken at the log end) slower than without cold reads, by the tail guard's reference.", nil, nil)
	descBackoffs    = prometheus.NewDesc("synapse_tier_cold_backoffs_total", "Times the tail guard lowered the cold-read rate.", nil, nil)
	descGroups      = prometheus.NewDesc("synapse_groups", "Consumer groups by state.", []string{"state"}, nil)
	descMembers     = prometheus.NewDesc("synapse_group_members", "Members of all consumer groups.", nil, nil)
	descTxns        = prometheus.NewDesc("synapse_transactional_ids", "Transactional ids by the state of their transaction.", []string{"state"}, nil)
	descAuthOK      = prometheus.NewDesc("synapse_sasl_authentications_total", "Successful SASL authentications, by mechanism.", []string{"mechanism"}, nil)
	descAuthFailed  = prometheus.NewDesc("synapse_sasl_authentication_failures_total", "Failed SASL authentications, by mechanism.", []string{"mechanism"}, nil)
	descDenied      = prometheus.NewDesc("synapse_acl_denied_total", "Resources of requests refused by ACLs.", nil, nil)
	descFDBudget    = prometheus.NewDesc("synapse_fd_budget", "File descriptors the log store may hold (from RLIMIT_NOFILE); 0 = unbounded.", nil, nil)
	descFDUsed      = prometheus.NewDesc("synapse_fd_budget_used", "File descriptors the log store holds now.", nil, nil)
	descFDRefused   = prometheus.NewDesc("synapse_fd_budget_refused_total", "Opens that found the descriptor budget spent (reads served later, writers that waited).", nil, nil)
	descFDKernel    = prometheus.NewDesc("synapse_fd_kernel_refused_total", "Segment-file opens the kernel refused (EMFILE, ENFILE, ENOMEM): answered as retriable, never offline.", nil, nil)
	descSessions    = prometheus.NewDesc("synapse_fetch_sessions", "Incremental fetch sessions (KIP-227) in the cache.", nil, nil)
	descSessParts   = prometheus.NewDesc("synapse_fetch_session_partitions", "Partitions held by the cached fetch sessions.", nil, nil)
	descSessEvicts  = prometheus.NewDesc("synapse_fetch_session_evictions_total", "Fetch sessions evicted from the cache to make room for new ones.", nil, nil)

	// Client quotas, per measured rate: type (produce, fetch, request) and
	// the user and client id it is measured for ("" where the quota
	// applied covers every one: a user's quota counts all its client ids).
	quotaLabels         = []string{"type", "user", "client_id"}
	descQuotaLimit      = prometheus.NewDesc("synapse_quota_limit", "Client quota in force: bytes/s (produce, fetch) or percent of one thread (request).", quotaLabels, nil)
	descQuotaRate       = prometheus.NewDesc("synapse_quota_rate", "Rate measured against the client quota over the quota window: bytes/s or percent of one thread.", quotaLabels, nil)
	descQuotaThrottleMs = prometheus.NewDesc("synapse_quota_throttle_time_ms_total", "Throttle time given to clients over the quota (responses' throttle_time_ms, the connection muted as long).", quotaLabels, nil)
	descCleanRead       = prometheus.NewDesc("synapse_cleaner_read_bytes_total", "Bytes the log cleaner read (compacted topics).", nil, nil)
	descCleanWritten    = prometheus.NewDesc("synapse_cleaner_written_bytes_total", "Bytes the log cleaner wrote (cleaned segments).", nil, nil)
	descCleans          = prometheus.NewDesc("synapse_cleaner_cleans_total", "Partition cleans completed.", nil, nil)
	descCleanFails      = prometheus.NewDesc("synapse_cleaner_failures_total", "Partition cleans that failed (retried at the next pass).", nil, nil)
	descCleanRatio      = prometheus.NewDesc("synapse_cleaner_max_dirty_ratio", "Largest cleanable dirty ratio among compacted partitions at the last pass.", nil, nil)
	descCleanBucket     = prometheus.NewDesc("synapse_cleaner_bucket_segments_total", "Cleaned segments the log cleaner swapped into the bucket from segments only the bucket held.", nil, nil)
	descCleanSince      = prometheus.NewDesc("synapse_cleaner_seconds_since_last_clean", "Seconds since the last completed clean; -1 if none since start.", nil, nil)
	descQuotaThrottled  = prometheus.NewDesc("synapse_quota_throttled_total", "Responses throttled for the client quota.", quotaLabels, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConns, descPartitions, descLocalBytes, descUpBytes, descUpSegs,
		descDownBytes, descCacheHits, descCacheMisses, descTierErrors, descTierGets, descLagBytes, descLagSegs, descColdRate, descTailLate, descBackoffs,
		descGroups, descMembers, descTxns, descAuthOK, descAuthFailed, descDenied, descFDBudget, descFDUsed, descFDRefused, descFDKernel,
		descSessions, descSessParts, descSessEvicts, descQuotaLimit, descQuotaRate, descQuotaThrottleMs, descQuotaThrottled,
		descCleanRead, descCleanWritten, descCleans, descCleanFails, descCleanRatio, descCleanSince, descCleanBucket} {
		ch <- d
	}
	if s := (*Server)(c); s.cl != nil {
		s.cl.describe(ch)
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := (*Server)(c)
	if s.cl != nil {
		s.cl.collect(ch)
	}
	s.mu.Lock()
	conns := len(s.conns)
	s.mu.Unlock()
	var parts int
	var local int64
	for _, t := range s.reg.all() {
		for _, p := range s.reg.partitionsOf(t) {
			parts++
			local += p.log.LocalBytes()
		}
	}
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(descConns, float64(conns))
	gauge(descPartitions, float64(parts))
	gauge(descLocalBytes, float64(local))
	byState, members := s.grp().Stats()
	for _, st := range []string{"Empty", "PreparingRebalance", "CompletingRebalance", "Stable"} {
		ch <- prometheus.MustNewConstMetric(descGroups, prometheus.GaugeValue, float64(byState[st]), st)
	}
	gauge(descMembers, float64(members))
	if s.txnCoord() != nil {
		byTxn := s.txnCoord().Stats()
		for st := txn.Empty; st < txn.Dead; st++ {
			ch <- prometheus.MustNewConstMetric(descTxns, prometheus.GaugeValue, float64(byTxn[st]), st.String())
		}
	}
	for _, m := range saslMechanisms {
		ch <- prometheus.MustNewConstMetric(descAuthOK, prometheus.CounterValue, float64(s.sec.authOK[m].Load()), m)
		ch <- prometheus.MustNewConstMetric(descAuthFailed, prometheus.CounterValue, float64(s.sec.authFailed[m].Load()), m)
	}
	counter(descDenied, s.sec.denied.Load())
	sessions, sessParts, evictions := s.fetchSessions.stats()
	gauge(descSessions, float64(sessions))
	gauge(descSessParts, float64(sessParts))
	counter(descSessEvicts, evictions)
	s.sec.quotas.collect(ch)
	fdUsed, _, fdRefused := s.cfg.FDs.Stats()
	gauge(descFDBudget, float64(s.cfg.FDs.Max()))
	gauge(descFDUsed, float64(fdUsed))
	counter(descFDRefused, fdRefused)
	counter(descFDKernel, s.store.KernelRefusals())
	counter(descCleanRead, s.cleaner.bytesRead.Load())
	counter(descCleanWritten, s.cleaner.bytesWritten.Load())
	counter(descCleans, s.cleaner.cleans.Load())
	counter(descCleanFails, s.cleaner.failures.Load())
	counter(descCleanBucket, s.cleaner.bucketSegments.Load())
	gauge(descCleanRatio, math.Float64frombits(s.cleaner.maxDirtyRatio.Load()))
	since := -1.0
	if ms := s.cleaner.lastClean.Load(); ms > 0 {
		since = time.Since(time.UnixMilli(ms)).Seconds()
	}
	gauge(descCleanSince, since)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if st, ok := s.TierStatus(ctx); ok {
		counter(descUpBytes, st.UploadedBytes)
		counter(descUpSegs, st.UploadedSegments)
		counter(descDownBytes, st.DownloadedBytes)
		counter(descCacheHits, st.CacheHits)
		counter(descCacheMisses, st.CacheMisses)
		counter(descTierErrors, st.Errors)
		counter(descTierGets, st.ObjectGets)
		gauge(descLagBytes, float64(st.LagBytes))
		gauge(descLagSegs, float64(st.LagSegments))
		gauge(descColdRate, float64(st.ColdRate))
		counter(descTailLate, st.TailLate)
		counter(descBackoffs, st.Backoffs)
	}
}
