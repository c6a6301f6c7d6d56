package broker

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Cluster mode's metrics: what this broker leads and how replicated it is,
// the live brokers, whether it is the controller, and etcd's latency (a
// probe every 2 s and every write the broker makes).

var (
	descClLeaders  = prometheus.NewDesc("synapse_cluster_leader_partitions", "Partitions this broker leads.", nil, nil)
	descClUnder    = prometheus.NewDesc("synapse_cluster_under_replicated_partitions", "Partitions this broker leads whose ISR is smaller than their replica set.", nil, nil)
	descClUnderMin = prometheus.NewDesc("synapse_cluster_under_min_isr_partitions", "Partitions this broker leads whose ISR is below min.insync.replicas (acks=all refused).", nil, nil)
	descClISR      = prometheus.NewDesc("synapse_cluster_partition_isr_size", "ISR size of each partition this broker leads.", []string{"topic", "partition"}, nil)
	descClBrokers  = prometheus.NewDesc("synapse_cluster_live_brokers", "Brokers registered in etcd.", nil, nil)
	descClCtrl     = prometheus.NewDesc("synapse_cluster_controller", "1 if this broker is the controller.", nil, nil)
	descClFollow   = prometheus.NewDesc("synapse_cluster_follower_partitions", "Partitions this broker fetches as a follower.", nil, nil)
)

// newEtcdLatency is the etcd latency histogram (seconds).
func newEtcdLatency() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "synapse_etcd_request_seconds",
		Help:    "Latency of this broker's etcd requests: a probe every 2 s and every write it makes.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	})
}

// observeEtcd records the latency of one etcd request started at t.
func (cl *cluster) observeEtcd(t time.Time) { cl.etcdLatency.Observe(time.Since(t).Seconds()) }

// probeEtcd measures one round trip.
func (cl *cluster) probeEtcd() {
	ctx, cancel := context.WithTimeout(cl.ctx, time.Second)
	defer cancel()
	t := time.Now()
	if err := cl.client().Ping(ctx); err == nil {
		cl.observeEtcd(t)
	}
}

func (cl *cluster) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descClLeaders, descClUnder, descClUnderMin, descClISR, descClBrokers, descClCtrl, descClFollow} {
		ch <- d
	}
	cl.etcdLatency.Describe(ch)
}

func (cl *cluster) collect(ch chan<- prometheus.Metric) {
	var leaders, under, underMin, following int
	each := func(p *partition) {
		r := roleOf(p)
		switch {
		case r.isLeader:
			leaders++
			if len(r.isr) < len(r.replicas) {
				under++
			}
			if len(r.isr) < cl.minISR(p, r) {
				underMin++
			}
			ch <- prometheus.MustNewConstMetric(descClISR, prometheus.GaugeValue, float64(len(r.isr)), p.topic.name, strconv.Itoa(int(p.index)))
		case r.leader >= 0 && cl.followed(p):
			following++
		}
	}
	for _, t := range cl.s.reg.all() {
		for _, p := range cl.s.reg.partitionsOf(t) {
			each(p)
		}
	}
	for _, p := range []*partition{cl.groupsPart, cl.txnPart} {
		if p.repl.role.Load() != nil {
			each(p)
		}
	}
	ctrl := 0.0
	if cl.controller.Load() {
		ctrl = 1
	}
	for _, m := range []struct {
		d *prometheus.Desc
		v float64
	}{{descClLeaders, float64(leaders)}, {descClUnder, float64(under)}, {descClUnderMin, float64(underMin)},
		{descClBrokers, float64(len(cl.currentView().Brokers))}, {descClCtrl, ctrl}, {descClFollow, float64(following)}} {
		ch <- prometheus.MustNewConstMetric(m.d, prometheus.GaugeValue, m.v)
	}
	cl.etcdLatency.Collect(ch)
}

// followed reports whether a fetcher fetches p.
func (cl *cluster) followed(p *partition) bool {
	cl.fetchMu.Lock()
	defer cl.fetchMu.Unlock()
	for _, f := range cl.fetchers {
		f.mu.Lock()
		_, ok := f.parts[p]
		f.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}
