package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/group"
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

// Consumer groups: the group keys (OffsetCommit 8, OffsetFetch 9, JoinGroup
// 11, Heartbeat 12, LeaveGroup 13, SyncGroup 14, DescribeGroups 15,
// ListGroups 16, DeleteGroups 42, OffsetDelete 47) are served by package
// group; their behaviour is documented there. This file opens the group log,
// mirrors it to the tiered store and restores it from there.

// groupsDir is the group log's directory under the data directory. It has
// no "-N" suffix, so it can never be taken for a topic partition.
const groupsDir = "__groups"

// groupsKey is where the group state is mirrored in the bucket.
const groupsKey = "_synapse/groups.json"

func (s *Server) openGroups(ctx context.Context) error {
	dir := filepath.Join(s.cfg.DataDir, groupsDir)
	if s.cfg.Tier != nil && s.cfg.Cluster == nil {
		// (A cluster seeds the group log at its leader instead, which
		// replicates it: seedGroups in cluster_groups.go.)
		if err := s.restoreGroups(ctx, dir); err != nil {
			return err
		}
	}
	lp, err := s.store.OpenPartition(dir, group.LogConfig())
	if err != nil {
		return fmt.Errorf("broker: open the group log: %w", err)
	}
	s.groupLog = lp
	cfg := s.groupConfig()
	if s.cfg.Cluster != nil {
		cfg = groupsOpenConfig(cfg)
	}
	c, err := group.Open(cfg, lp, nil)
	if err != nil {
		return fmt.Errorf("broker: load groups: %w", err)
	}
	if s.cfg.Cluster != nil {
		c.Close() // opened again by the leader of the group log (cluster_groups.go)
	}
	s.groupsPtr.Store(c)
	// Mirrored again at every start: a copy that failed (or a crash) before
	// a restart is not left stale while the groups stay idle.
	s.groupsMirrored.Store(math.MaxUint64)
	return nil
}

// restoreGroups fills a missing group log from the bucket's mirror.
func (s *Server) restoreGroups(ctx context.Context, dir string) error {
	return s.restoreStateLog(ctx, dir, groupsKey, "groups", group.LogConfig(), func(lp *log.Partition, seed []byte) error {
		c, err := group.Open(s.groupConfig(), lp, seed)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// restoreStateLog fills a missing state log (the group or transaction
// log, in dir) from the bucket's mirror at key: seed opens the log and
// writes the mirror into it. The log is written under another name and
// renamed into place once durable, so a crash part way leaves no log and
// the next start restores again (a partial log would load as complete, and
// its first mirror would overwrite the bucket's good copy).
func (s *Server) restoreStateLog(ctx context.Context, dir, key, what string, cfg log.Config, seed func(lp *log.Partition, b []byte) error) error {
	tmp := dir + ".restore"
	if err := os.RemoveAll(tmp); err != nil { // an interrupted restore
		return err
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		return err // a log exists (or cannot be looked at)
	}
	b, err := s.cfg.Tier.Store().GetRange(ctx, key, 0, -1)
	if errors.Is(err, tiering.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("broker: restore %s: read %s from the tiered store: %w", what, key, err)
	}
	lp, err := s.store.OpenPartition(tmp, cfg)
	if err != nil {
		return fmt.Errorf("broker: restore %s: %w", what, err)
	}
	err = seed(lp, b)
	if cerr := lp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("broker: restore %s: %w", what, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	return log.OSFS.SyncDir(s.cfg.DataDir)
}

func (s *Server) groupConfig() group.Config {
	return group.Config{
		Logger:                s.logger.Named("groups"),
		Now:                   s.cfg.Now,
		InitialRebalanceDelay: s.cfg.GroupInitialRebalanceDelay,
		MinSessionTimeout:     s.cfg.GroupMinSessionTimeout,
		MaxSessionTimeout:     s.cfg.GroupMaxSessionTimeout,
		OffsetsRetention:      s.cfg.OffsetsRetention,
		PartitionExists: func(topic string, p int32) bool {
			t := s.reg.get(topic)
			return t != nil && s.reg.partition(t, p) != nil
		},
	}
}

// maintainGroups expires offsets, compacts the group log and, with
// tiering, mirrors the group state to the bucket when it changed.
func (s *Server) maintainGroups(now time.Time) {
	if s.cl != nil && !s.cl.activeGroups() {
		return // a closed coordinator maintains (and writes) nothing
	}
	s.grp().Maintain(now)
	if s.cfg.Tier != nil {
		s.mirrorGroups(s.ctx)
	}
}

// mirrorGroups copies the group state to the bucket if it changed since the
// last copy (best effort: retried next pass).
func (s *Server) mirrorGroups(ctx context.Context) {
	s.mirrorStateLog(ctx, groupsKey, "groups", s.grp().Changes(), s.grp().Snapshot, &s.groupsMirrored)
}

// mirrorStateLog copies a state log's snapshot to the bucket at key if its
// change count moved since the copy mirrored records (best effort: retried
// next pass).
func (s *Server) mirrorStateLog(ctx context.Context, key, what string, changes uint64, snapshot func() ([]byte, uint64), mirrored *atomic.Uint64) {
	if changes == mirrored.Load() {
		return
	}
	b, n := snapshot()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.cfg.Tier.PutMeta(ctx, key, b); err != nil {
		s.repeat.Warn("mirror "+what+" to the tiered store", zap.Error(err)) // each pass while the bucket is away
		return
	}
	mirrored.Store(n)
}

func (s *Server) clientOf(c *conn, req string) group.Client {
	return group.Client{ID: req, Host: c.host}
}

// FindCoordinator: v0-6
//
// Behavior:
//   - This broker coordinates every group and transactional id: key types
//     0 (group) and 1 (transaction) answer this node. Other key types are
//     INVALID_REQUEST.
//
// Version notes:
//   - v4+: batched keys, one answer each.
//   - With ACLs: DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED) or the
//     transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
func (s *Server) handleFindCoordinator(c *conn, req *kmsg.FindCoordinatorRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.FindCoordinatorResponse)
	answer := func(key string) (code int16, msg *string, nodeID int32, host string, port int32) {
		switch {
		case req.CoordinatorType != 0 && req.CoordinatorType != 1:
			code = kerr.InvalidRequest.Code
			msg = kmsg.StringPtr(fmt.Sprintf("unsupported coordinator key type %d", req.CoordinatorType))
		case req.CoordinatorType == 0 && !c.allowed(opDescribe, resGroup, groupName(key)):
			code = kerr.GroupAuthorizationFailed.Code
		case req.CoordinatorType == 1 && !c.allowed(opDescribe, resTxnID, key):
			code = kerr.TransactionalIDAuthorizationFailed.Code
		case s.cl != nil:
			coordinator := s.cl.groupCoordinator
			if req.CoordinatorType == 1 {
				coordinator = s.cl.txnCoordinator
			}
			b, ok := coordinator()
			if !ok {
				return kerr.CoordinatorNotAvailable.Code, nil, -1, "", -1
			}
			return 0, nil, b.ID, b.Host, b.Port
		default:
			return 0, nil, s.meta.m.NodeID, c.lis.host, c.lis.port
		}
		return code, msg, -1, "", -1
	}
	if req.CoordinatorType == 0 {
		s.offsetsShown.Store(true) // as Kafka creates its offsets topic here
	}
	if req.Version < 4 {
		resp.ErrorCode, resp.ErrorMessage, resp.NodeID, resp.Host, resp.Port = answer(req.CoordinatorKey)
		return resp, nil
	}
	for _, k := range req.CoordinatorKeys {
		rc := kmsg.NewFindCoordinatorResponseCoordinator()
		rc.Key = k
		rc.ErrorCode, rc.ErrorMessage, rc.NodeID, rc.Host, rc.Port = answer(k)
		resp.Coordinators = append(resp.Coordinators, rc)
	}
	return resp, nil
}

// closeGroups answers parked group requests and closes the group log.
func (s *Server) closeGroups() {
	if s.grp() != nil {
		s.grp().Close()
	}
	if s.groupLog != nil {
		if err := s.groupLog.Close(); err != nil && !errors.Is(err, log.ErrClosed) {
			s.logger.Warn("close the group log", zap.Error(err))
		}
	}
}
