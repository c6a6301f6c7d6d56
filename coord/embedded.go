package coord

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"go.etcd.io/etcd/pkg/v3/featuregate"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Embedded is a single-member etcd running in-process, for development and
// tests. Production clusters should run etcd separately.
type Embedded struct {
	etcd      *embed.Etcd
	endpoint  string
	closeOnce sync.Once
}

const embeddedReadyTimeout = 60 * time.Second

// StartEmbedded starts a single-member etcd with its data in dir and waits
// until it serves clients. Both URLs need explicit ports: port 0 would make
// the advertised URLs wrong.
func StartEmbedded(dir, clientURL, peerURL string, logger *zap.Logger) (*Embedded, error) {
	cu, err := parseListenURL(clientURL)
	if err != nil {
		return nil, fmt.Errorf("coord: embedded etcd: client url: %w", err)
	}
	pu, err := parseListenURL(peerURL)
	if err != nil {
		return nil, fmt.Errorf("coord: embedded etcd: peer url: %w", err)
	}

	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Name = "synapse"
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	// Only pointers and epochs live here: a short history suffices.
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = "5m"
	cfg.QuotaBackendBytes = 2 << 30
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	if logger != nil {
		lg := logger.Named("etcd").WithOptions(zap.IncreaseLevel(zap.ErrorLevel))
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	}
	// In v3.7 lease checkpointing is a feature gate, not an Experimental*
	// field. It keeps lease deadlines across leader changes and restarts,
	// which matters because broker liveness is a lease.
	if fg, ok := cfg.ServerFeatureGate.(featuregate.MutableFeatureGate); ok {
		if err := fg.Set("LeaseCheckpoint=true,LeaseCheckpointPersist=true"); err != nil {
			if err := fg.Set("LeaseCheckpoint=true"); err != nil && logger != nil {
				logger.Warn("embedded etcd: cannot enable lease checkpointing", zap.Error(err))
			}
		}
	}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("coord: start embedded etcd in %s: %w", dir, err)
	}
	t := time.NewTimer(embeddedReadyTimeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("coord: embedded etcd failed to start: %w", err)
	case <-e.Server.StopNotify():
		e.Close()
		return nil, errors.New("coord: embedded etcd stopped while starting")
	case <-t.C:
		e.Close()
		return nil, fmt.Errorf("coord: embedded etcd not ready after %v", embeddedReadyTimeout)
	}
	return &Embedded{etcd: e, endpoint: cu.String()}, nil
}

// parseListenURL accepts http(s)://host:port with a non-zero port.
func parseListenURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%q: scheme must be http or https", s)
	}
	_, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", s, err)
	}
	if port == "" || port == "0" {
		return nil, fmt.Errorf("%q: an explicit non-zero port is required", s)
	}
	return u, nil
}

// Endpoint returns the client URL to put in Config.Endpoints.
func (e *Embedded) Endpoint() string { return e.endpoint }

// Close stops the server and waits for it to shut down. It is idempotent.
func (e *Embedded) Close() { e.closeOnce.Do(e.etcd.Close) }
