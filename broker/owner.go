package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

// Bucket ownership. Two brokers writing manifests, retention and orphan
// sweeps under one bucket prefix would destroy each other's data, so each
// broker claims the prefix with a conditional create (If-None-Match: *) of
// ownerKey naming its instance (a random id kept in its data directory):
//   - the claim exists and names this instance: a restart, go on;
//   - it names another one: refuse to start, unless this start restores
//     into an empty data directory, which takes the prefix over (the broker
//     that owned it is presumed gone: restoring is the operator's act);
//   - the bucket cannot be asked: start, and claim at a later pass.
//
// A running broker re-reads the claim every ownerCheckInterval; once it
// names another instance (a restore elsewhere took over), this broker
// stops every write to the bucket for good and says so.
const (
	ownerKey     = "_synapse/owner.json"
	instanceFile = "tier-instance"
)

// ownerCheckInterval is how often a running broker re-reads the claim (a
// variable for tests).
var ownerCheckInterval = 10 * time.Second

type ownerRecord struct {
	Instance string `json:"instance"`
	Host     string `json:"host"`
	Since    string `json:"since"`
}

// errPrefixOwned is a start refused because another broker owns the prefix.
var errPrefixOwned = errors.New("broker: the tiered store's prefix belongs to another broker")

// loadInstance returns this data directory's instance id, creating it on
// the first start.
func loadInstance(dataDir string) (string, error) {
	path := filepath.Join(dataDir, instanceFile)
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) == 32 {
		return strings.TrimSpace(string(b)), nil
	}
	var id [16]byte
	rand.Read(id[:])
	s := hex.EncodeToString(id[:])
	if err := log.WriteFileAtomic(log.OSFS, path, []byte(s+"\n")); err != nil {
		return "", err
	}
	return s, nil
}

// claimBucket claims the prefix for this instance (see above); takeOver is
// set on a start that restores into an empty data directory.
func (s *Server) claimBucket(ctx context.Context, takeOver bool) error {
	host, _ := os.Hostname()
	rec, _ := json.Marshal(ownerRecord{Instance: s.instance, Host: host, Since: time.Now().UTC().Format(time.RFC3339)})
	store := s.cfg.Tier.Store()
	err := store.PutIfAbsent(ctx, ownerKey, strings.NewReader(string(rec)), int64(len(rec)))
	if err == nil {
		s.claimed.Store(true)
		return nil
	}
	if !errors.Is(err, tiering.ErrExists) {
		s.logger.Warn("cannot claim the tiered store's prefix now; retried at the next pass", zap.Error(err))
		return nil
	}
	cur, err := s.readOwner(ctx)
	if err != nil {
		s.logger.Warn("cannot read the tiered store's owner now; retried at the next pass", zap.Error(err))
		return nil
	}
	switch {
	case cur.Instance == s.instance:
	case takeOver:
		if err := s.cfg.Tier.PutMeta(ctx, ownerKey, rec); err != nil {
			return fmt.Errorf("broker: take over the tiered store's prefix from %s (%s): %w", cur.Instance, cur.Host, err)
		}
		s.logger.Warn("restored from the tiered store: this broker owns its prefix now", zap.String("previous_owner", cur.Instance), zap.String("previous_host", cur.Host))
	default:
		return fmt.Errorf("%w: instance %s on %q since %s; two brokers must not share one (use another --tier prefix, or restore into an empty data directory to take it over)",
			errPrefixOwned, cur.Instance, cur.Host, cur.Since)
	}
	s.claimed.Store(true)
	return nil
}

func (s *Server) readOwner(ctx context.Context) (ownerRecord, error) {
	var cur ownerRecord
	b, err := s.cfg.Tier.Store().GetRange(ctx, ownerKey, 0, -1)
	if err != nil {
		return cur, err
	}
	if err := json.Unmarshal(b, &cur); err != nil {
		return cur, fmt.Errorf("broker: %s: %w", ownerKey, err)
	}
	return cur, nil
}

// checkOwner, each maintenance pass (at most every ownerCheckInterval),
// claims the prefix if the start could not, and notices a take-over.
func (s *Server) checkOwner(ctx context.Context) {
	if s.bucketLost.Load() || time.Since(s.ownerChecked) < ownerCheckInterval && s.claimed.Load() {
		return
	}
	s.ownerChecked = time.Now()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !s.claimed.Load() {
		if err := s.claimBucket(ctx, s.takeOver); err != nil {
			s.loseBucket(err.Error())
		}
		return
	}
	cur, err := s.readOwner(ctx)
	if err == nil && cur.Instance != s.instance {
		s.loseBucket(fmt.Sprintf("instance %s on %q took it over at %s", cur.Instance, cur.Host, cur.Since))
	}
}

// loseBucket stops every write to the bucket for good.
func (s *Server) loseBucket(why string) {
	if !s.bucketLost.Swap(true) {
		s.logger.Error("another broker owns the tiered store's prefix now: this broker stops uploading, releasing, mirroring and sweeping there (its local data stays); restart it on another prefix", zap.String("why", why))
	}
}

// tierWritable reports whether this broker may write to the bucket.
func (s *Server) tierWritable() bool {
	return s.cfg.Tier != nil && s.claimed.Load() && !s.bucketLost.Load()
}
