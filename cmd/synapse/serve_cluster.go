package main

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/broker"
	"github.com/synapsebroker/synapse/coord"
)

// clusterOptions are serve's cluster-mode flags.
type clusterOptions struct {
	name          string
	etcd          string
	etcdListen    string
	etcdPeer      string
	nodeID        int32
	rack          string
	peerAddr      string
	sessionTTL    time.Duration
	replicaLagMax time.Duration
	rebalance     bool
}

func (o *clusterOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.name, "cluster", "", "run in cluster mode as a broker of the cluster of this name, coordinated by etcd (see --etcd, --node-id); empty: a single node")
	fs.StringVar(&o.etcd, "etcd", "", "cluster mode: etcd client URLs (http://host:2379,...), or \"embedded\" to run a single etcd member inside this broker (development: one point of failure)")
	fs.StringVar(&o.etcdListen, "etcd-listen", "127.0.0.1:2379", "with --etcd embedded: the embedded etcd's client address (other brokers use --etcd http://<this>)")
	fs.StringVar(&o.etcdPeer, "etcd-peer-listen", "127.0.0.1:2380", "with --etcd embedded: the embedded etcd's peer address")
	fs.Int32Var(&o.nodeID, "node-id", -1, "cluster mode: this broker's id (0 or more), unique in the cluster and fixed for its data directory")
	fs.StringVar(&o.rack, "rack", "", "cluster mode: this broker's rack (Kafka's broker.rack)")
	fs.StringVar(&o.peerAddr, "peer-advertised-addr", "", "cluster mode: host:port other brokers fetch from (default: the advertised address of the first listener)")
	fs.DurationVar(&o.sessionTTL, "session-ttl", 3*time.Second, "cluster mode: a broker silent to etcd this long loses its leaderships (at least 2s)")
	fs.DurationVar(&o.replicaLagMax, "replica-lag-time-max", 10*time.Second, "cluster mode: a follower behind the leader this long leaves the ISR (Kafka's replica.lag.time.max.ms)")
	fs.BoolVar(&o.rebalance, "replica-rebalance", true, "cluster mode: the controller moves replicas, a few at a time, while the live brokers' replica counts differ by more than one (a broker added gets its share); false: only AlterPartitionReassignments moves them")
}

func (o *clusterOptions) validate() error {
	if o.name == "" {
		if o.etcd != "" || o.nodeID != -1 {
			return errors.New("--etcd and --node-id need --cluster")
		}
		return nil
	}
	var errs []error
	if o.etcd == "" {
		errs = append(errs, errors.New("--cluster needs --etcd (URLs, or embedded)"))
	}
	if o.nodeID < 0 {
		errs = append(errs, errors.New("--cluster needs --node-id (0 or more)"))
	}
	if o.sessionTTL < 2*time.Second {
		errs = append(errs, fmt.Errorf("--session-ttl %s: at least 2s (etcd's minimum lease)", o.sessionTTL))
	}
	return errors.Join(errs...)
}

// start returns the broker's cluster config, starting the embedded etcd
// first if asked (stop stops it).
func (o *clusterOptions) start(dataDir, advertised string, logger *zap.Logger) (cfg *broker.ClusterConfig, stop func(), err error) {
	stop = func() {}
	if o.name == "" {
		return nil, stop, nil
	}
	endpoints := strings.Split(o.etcd, ",")
	if o.etcd == "embedded" {
		for _, a := range []string{o.etcdListen, o.etcdPeer} {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, stop, fmt.Errorf("embedded etcd address %q: %w", a, err)
			}
		}
		e, err := coord.StartEmbedded(filepath.Join(dataDir, "etcd"), "http://"+o.etcdListen, "http://"+o.etcdPeer, logger.Named("etcd"))
		if err != nil {
			return nil, stop, err
		}
		stop = e.Close
		endpoints = []string{e.Endpoint()}
		logger.Info("embedded etcd", zap.String("client_url", e.Endpoint()))
	}
	return &broker.ClusterConfig{Name: o.name, Etcd: endpoints, NodeID: o.nodeID, Rack: o.rack, Advertise: advertised, PeerAdvertise: o.peerAddr,
		SessionTTL: o.sessionTTL, ReplicaLagMax: o.replicaLagMax, NoReplicaRebalance: !o.rebalance}, stop, nil
}
