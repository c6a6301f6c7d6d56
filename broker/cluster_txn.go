package broker

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/coord"
	"github.com/synapsebroker/synapse/internal/parallel"
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/txn"
)

// Transactions in cluster mode. The transaction log is partition 0 of
// __transaction_state, replicated like any partition. The coordinator of
// every transactional id is the broker that leads both the transaction log
// and the group log: a commit writes its offsets into the group log, and
// the offsets pending until then (OffsetFetch's require_stable) live in the
// group coordinator, so the two run on one broker. The transaction log is
// created with the group log's replicas, and the controller gives it the
// group log's leader (alignTxnLeader). While the two leaderships are apart,
// transaction requests are answered NOT_COORDINATOR and clients retry.
//
// A coordinator writes to its log only as its leader at the epoch it
// opened at, and waits for the ISR (Config.Append, Config.Wait). An end
// waits for its decision to be replicated before any marker is written
// (Config.DecideFirst): a new coordinator finishes what the log it
// replicated says. Markers go to each partition's leader: written here if
// this broker leads it, else sent as WriteTxnMarkers, stamped with the
// coordinator's epoch. A leader refuses markers of a coordinator older than
// the transaction log's epoch in its view (TRANSACTION_COORDINATOR_FENCED)
// and answers once the ISR holds the marker.
//
// Partition leaders do not ask the coordinator whether a transactional
// batch's partition was added (as Kafka before KIP-890's verification):
// AddPartitionsToTxn and AddOffsetsToTxn are answered only once the add is
// replicated (Config.WaitAdds), so a client that waited for it is covered.
// That also replicates the previous transaction's Complete record (it is
// before the add in the log), which an end answers without waiting for: a
// new coordinator that lost it finishes that end again, and finds its
// markers already written.

// initTxns makes the transaction log the replicated partition it is in
// cluster mode.
func (cl *cluster) initTxns() {
	cl.txnPart = &partition{topic: &topic{name: txnTopic}, index: 0, log: cl.s.txnLog,
		producers: map[int64]*producerState{}}
	cl.txnActive.Store(-1)
	cl.peers = map[int32]*peerConn{}
}

// txnOpenConfig is the config of the coordinator a broker opens at start
// in cluster mode: it writes nothing (it is closed at once, until this
// broker coordinates transactions).
func txnOpenConfig(cfg txn.Config) txn.Config {
	cfg.Append = func([]byte) (int64, error) { return 0, errNotLeader }
	cfg.Wait = func(int64) error { return errNotLeader }
	return cfg
}

// syncTxns opens or closes the transaction coordinator as this broker
// comes to coordinate groups and lead the transaction log, or stops
// (groupsLoop's goroutine). leading is the transaction log's epoch the open
// coordinator runs at (-1: none), with is the group coordinator's epoch it
// was opened with. It reports whether to look again soon.
func (cl *cluster) syncTxns(leading, with *int32) (retry bool) {
	tr := roleOf(cl.txnPart)
	groups := cl.groupsActive.Load()
	want := tr.isLeader && groups >= 0
	if *leading >= 0 && (!want || *leading != tr.epoch || *with != groups) {
		cl.txnActive.Store(-1)
		cl.txnGen.Add(1) // the closed coordinator's writes fail from here
		cl.s.txnCoord().Close()
		*leading = -1
		cl.logger.Info("no longer the transaction coordinator")
	}
	if !want || *leading >= 0 {
		return false
	}
	// The coordinator replays the whole log: it opens once the ISR holds
	// all of it (the followers' first fetches of this epoch, and the
	// records of a coordinator closed here at this same epoch, which a
	// failover could still lose).
	if hw := cl.txnPart.log.HighWatermark(); hw < max(tr.startOffset, cl.txnPart.log.LogEndOffset()) {
		cl.advanceHW(cl.txnPart)
		return true
	}
	seed, err := cl.stateSeed(cl.s.txnLog, txnKey)
	if err != nil {
		cl.s.repeat.Warn("read the transactions' mirror from the tiered store (retried)", zap.Error(err))
		return true
	}
	c, err := txn.Open(cl.txnConfig(tr), cl.s.txnLog, seed)
	if err != nil {
		cl.logger.Error("open the transaction coordinator (retried)", zap.Error(err))
		return true
	}
	cl.s.txnsPtr.Store(c)
	cl.s.txnsMirrored.Store(math.MaxUint64) // a new coordinator's change count: mirror at its first pass
	*leading, *with = tr.epoch, groups
	cl.txnActive.Store(tr.epoch)
	cl.logger.Info("transaction coordinator", zap.Int32("leader_epoch", tr.epoch))
	// Ends decided before the move are finished (their markers sent),
	// off this goroutine: a marker may wait for a slow leader.
	cl.wg.Add(1)
	go func() { defer cl.wg.Done(); c.Recover() }()
	return false
}

// txnConfig is the coordinator's config as the transaction log's leader
// at role's epoch.
func (cl *cluster) txnConfig(role *replicaRole) txn.Config {
	s := cl.s
	cfg := txnHooks(s.txnPartition, s.grp(), func() int64 { return s.cfg.Now().UnixMilli() }, role.epoch)
	cfg.Logger = s.logger.Named("txn")
	cfg.Now = s.cfg.Now
	cfg.MaxTimeout = s.cfg.TransactionMaxTimeout
	cfg.IDExpiration = s.cfg.TransactionalIDExpiration
	cfg.NextProducerID = func() (int64, error) { return cl.nextProducerID(cl.ctx) }
	cfg.PartitionExists = cl.partitionExists
	// The partitions are on other brokers: no local bound nor evidence
	// (the decision is replicated before any marker, DecideFirst).
	cfg.LogEnd = func(txn.TP) int64 { return -1 }
	cfg.MarkerSince = func(int64, txn.TP, int64) (bool, bool) { return false, false }
	cfg.DecideFirst = true
	cfg.WaitAdds = true // the partitions' leaders do not wait for this log
	p, epoch := cl.txnPart, role.epoch
	truncs := p.log.Truncations()
	// A coordinator closed and opened again at the same epoch (the group
	// coordinator moved and came back): the closed one writes nothing.
	gen := cl.txnGen.Add(1)
	cfg.Append = func(b []byte) (int64, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if r := roleOf(p); !r.isLeader || r.epoch != epoch || p.log.Truncations() != truncs || cl.txnGen.Load() != gen {
			return 0, errNotLeader
		}
		log.PatchLeaderEpoch(b, epoch)
		res, err := p.log.Append(b)
		if err != nil {
			return 0, err
		}
		return res.LastOffset + 1, nil
	}
	cfg.Wait = func(next int64) error {
		if cl.txnGen.Load() != gen {
			return errNotLeader
		}
		if err := cl.waitCommitted(p, next, role, truncs, 30*time.Second); err != nil {
			return err
		}
		if cl.txnGen.Load() != gen {
			return errNotLeader // closed while waiting: the open one answers
		}
		return nil
	}
	cfg.WriteMarkers = func(pid int64, pe int16, commit bool, parts []txn.TP, _ []int64) error {
		if cl.txnGen.Load() != gen {
			return errNotLeader
		}
		return cl.sendMarkers(epoch, pid, pe, commit, parts)
	}
	return cfg
}

// txnElsewhere reports whether transaction requests go to another broker:
// in cluster mode, this one does not coordinate transactions now.
func (s *Server) txnElsewhere() bool { return s.cl != nil && !s.cl.activeTxns() }

// activeTxns reports whether this broker coordinates transactions now.
func (cl *cluster) activeTxns() bool {
	e := cl.txnActive.Load()
	if e < 0 || !cl.activeGroups() {
		return false
	}
	r := roleOf(cl.txnPart)
	return r.isLeader && r.epoch == e
}

// txnCoordinator is the broker that coordinates every transactional id:
// the group coordinator, once it leads the transaction log too. The first
// ask creates __transaction_state (with the group log's replicas, so both
// can have one leader); until the two have one leader, ok is false
// (COORDINATOR_NOT_AVAILABLE).
func (cl *cluster) txnCoordinator() (coord.BrokerInfo, bool) {
	b, ok := cl.groupCoordinator()
	if !ok {
		return b, false
	}
	v := cl.currentView()
	if _, exists := v.Topics[txnTopic]; !exists {
		cl.createTxnTopic()
		return coord.BrokerInfo{}, false
	}
	part, ok := v.Parts[coord.PartKey{Topic: txnTopic, Partition: 0}]
	if !ok || part.State.Leader != b.ID {
		return coord.BrokerInfo{}, false
	}
	return b, true
}

// createTxnTopic creates __transaction_state in etcd (once).
func (cl *cluster) createTxnTopic() {
	if !cl.restoreSettled() || !cl.txnCreating.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer cl.txnCreating.Store(false)
		ctx, cancel := context.WithTimeout(cl.ctx, 10*time.Second)
		defer cancel()
		id := cl.s.internalTopicID(txnTopic)
		err := cl.client().CreateTopic(ctx, coord.TopicInfo{Name: txnTopic, ID: hex.EncodeToString(id[:]), Partitions: 1, RF: cl.defaultRF()})
		if err != nil && !errors.Is(err, coord.ErrExists) {
			cl.logger.Warn("create __transaction_state", zap.Error(err))
		}
	}()
}

// txnAssignment is the first state of the transaction log's partition:
// the group log's replicas and leader (ok false while the group log has
// none).
func txnAssignment(v *coord.View) (coord.PartState, bool) {
	g, ok := v.Parts[coord.PartKey{Topic: offsetsTopic, Partition: 0}]
	if !ok || g.State.Leader < 0 || len(g.State.Replicas) == 0 {
		return coord.PartState{}, false
	}
	reps := slices.Clone(g.State.Replicas)
	isr := slices.Clone(reps)
	slices.Sort(isr)
	return coord.PartState{Leader: g.State.Leader, Replicas: reps, ISR: isr}, true
}

// alignTxnLeader is the controller's step that keeps the transaction log
// led by the group log's leader: given the updates of this pass (ups), it
// returns them with the transaction log's leadership moved (epoch + 1) to
// the group log's leader when that broker is alive and in the
// transaction log's ISR.
func alignTxnLeader(v *coord.View, ups []coord.PartUpdate, alive func(int32) bool) []coord.PartUpdate {
	gk, tk := coord.PartKey{Topic: offsetsTopic, Partition: 0}, coord.PartKey{Topic: txnTopic, Partition: 0}
	g, gok := v.Parts[gk]
	t, tok := v.Parts[tk]
	if !gok || !tok {
		return ups
	}
	gs, ts, ti := g.State, t.State, -1
	for i, u := range ups {
		switch u.Key {
		case gk:
			gs = u.State
		case tk:
			ts, ti = u.State, i
		}
	}
	if gs.Leader < 0 || ts.Leader == gs.Leader || !alive(gs.Leader) || !slices.Contains(ts.ISR, gs.Leader) || len(ts.Adding)+len(ts.Removing) > 0 {
		return ups
	}
	st := with(ts, gs.Leader, t.State.Epoch+1, ts.ISR)
	if ti >= 0 {
		ups[ti].State = st
		return ups
	}
	return append(ups, coord.PartUpdate{Key: tk, State: st, ModRev: t.ModRev})
}

// sendMarkers writes producer pid's markers (at producer epoch pe) to
// parts, each on its leader, as the coordinator at coordEpoch, and returns
// once every one is replicated. A partition deleted meanwhile is skipped.
// Any failure fails the whole (the coordinator retries the end; a marker
// is written only where the transaction is still open).
func (cl *cluster) sendMarkers(coordEpoch int32, pid int64, pe int16, commit bool, parts []txn.TP) error {
	v := cl.currentView()
	byLeader := map[int32][]txn.TP{}
	for _, tp := range parts {
		part, ok := v.Parts[coord.PartKey{Topic: tp.Topic, Partition: tp.Partition}]
		if !ok {
			continue
		}
		if part.State.Leader < 0 {
			return fmt.Errorf("%s-%d has no leader", tp.Topic, tp.Partition)
		}
		byLeader[part.State.Leader] = append(byLeader[part.State.Leader], tp)
	}
	leaders := make([]int32, 0, len(byLeader))
	for id := range byLeader {
		leaders = append(leaders, id)
	}
	errs := make([]error, len(leaders))
	parallel.Each(min(len(leaders), 8), len(leaders), func(i int) {
		id, tps := leaders[i], byLeader[leaders[i]]
		if id == cl.id {
			for _, tp := range tps {
				if code := cl.leaderMarker(coordEpoch, pid, pe, commit, tp); code != 0 && errs[i] == nil {
					errs[i] = fmt.Errorf("%s-%d: %w", tp.Topic, tp.Partition, kerr.ErrorForCode(code))
				}
			}
			return
		}
		errs[i] = cl.remoteMarkers(id, coordEpoch, pid, pe, commit, tps)
	})
	return errors.Join(errs...)
}

// remoteMarkers sends one WriteTxnMarkers to broker id.
func (cl *cluster) remoteMarkers(id, coordEpoch int32, pid int64, pe int16, commit bool, tps []txn.TP) error {
	req := kmsg.NewPtrWriteTxnMarkersRequest()
	req.Version = 1
	m := kmsg.NewWriteTxnMarkersRequestMarker()
	m.ProducerID, m.ProducerEpoch, m.Committed, m.CoordinatorEpoch = pid, pe, commit, coordEpoch
	byTopic := map[string]int{}
	for _, tp := range tps {
		i, ok := byTopic[tp.Topic]
		if !ok {
			i = len(m.Topics)
			byTopic[tp.Topic] = i
			mt := kmsg.NewWriteTxnMarkersRequestMarkerTopic()
			mt.Topic = tp.Topic
			m.Topics = append(m.Topics, mt)
		}
		m.Topics[i].Partitions = append(m.Topics[i].Partitions, tp.Partition)
	}
	req.Markers = append(req.Markers, m)
	ctx, cancel := context.WithTimeout(cl.ctx, 40*time.Second)
	defer cancel()
	raw, err := cl.peerRequest(ctx, id, req)
	if err != nil {
		return fmt.Errorf("markers to broker %d: %w", id, err)
	}
	resp := raw.(*kmsg.WriteTxnMarkersResponse)
	for _, rm := range resp.Markers {
		for _, rt := range rm.Topics {
			for _, rp := range rt.Partitions {
				if rp.ErrorCode != 0 && rp.ErrorCode != kerr.UnknownTopicOrPartition.Code {
					return fmt.Errorf("markers to broker %d: %s-%d: %w", id, rt.Topic, rp.Partition, kerr.ErrorForCode(rp.ErrorCode))
				}
			}
		}
	}
	return nil
}

// peerRequest sends req to broker id on a pooled connection (one request
// at a time on each; a failed one is closed).
func (cl *cluster) peerRequest(ctx context.Context, id int32, req kmsg.Request) (kmsg.Response, error) {
	cl.peersMu.Lock()
	rc := cl.peers[id]
	delete(cl.peers, id)
	cl.peersMu.Unlock()
	if rc == nil {
		addr, ok := cl.brokerAddr(id)
		if !ok {
			return nil, fmt.Errorf("broker %d is not registered", id)
		}
		var err error
		if rc, err = dialPeer(ctx, addr, fmt.Sprintf("synapse-txn-%d", cl.id)); err != nil {
			return nil, err
		}
	}
	resp, err := rc.request(ctx, req)
	if err != nil {
		rc.close()
		return nil, err
	}
	cl.peersMu.Lock()
	if cl.peers[id] == nil && cl.ctx.Err() == nil {
		cl.peers[id], rc = rc, nil
	}
	cl.peersMu.Unlock()
	if rc != nil {
		rc.close()
	}
	return resp, nil
}

// closePeers closes the pooled peer connections.
func (cl *cluster) closePeers() {
	cl.peersMu.Lock()
	defer cl.peersMu.Unlock()
	for id, rc := range cl.peers {
		rc.close()
		delete(cl.peers, id)
	}
}

// leaderMarker writes one marker as tp's leader for the coordinator at
// coordEpoch and waits until the ISR holds it: 0 or a Kafka error code.
// Where nothing of the producer is open (a retry of an end whose marker
// is here already), it waits for what is in the log to be replicated.
func (cl *cluster) leaderMarker(coordEpoch int32, pid int64, pe int16, commit bool, tp txn.TP) int16 {
	v := cl.currentView()
	if t, ok := v.Parts[coord.PartKey{Topic: txnTopic, Partition: 0}]; ok && coordEpoch < t.State.Epoch {
		return kerr.TransactionCoordinatorFenced.Code
	}
	p := cl.partitionFor(tp.Topic, tp.Partition)
	if p == nil || p == cl.groupsPart || p == cl.txnPart {
		return kerr.UnknownTopicOrPartition.Code
	}
	p.mu.Lock()
	r := roleOf(p)
	if !r.isLeader {
		p.mu.Unlock()
		return kerr.NotLeaderForPartition.Code
	}
	truncs := p.log.Truncations()
	next, err := p.writeMarkerLocked(pid, pe, commit, cl.s.cfg.Now().UnixMilli(), r.epoch, -1)
	if err == nil && next == 0 {
		next = p.log.LogEndOffset()
	}
	p.mu.Unlock()
	if err == nil {
		err = cl.waitCommitted(p, next, r, truncs, 30*time.Second)
	}
	if err != nil {
		cl.logger.Info("transaction marker not written (the coordinator retries)", zap.String("topic", tp.Topic), zap.Int32("partition", tp.Partition), zap.Error(err))
		return cl.s.errorCode(err)
	}
	return 0
}

// peerPool holds idle connections to other brokers, for the requests a
// broker sends them besides replica fetches (markers).
type peerPool struct {
	peersMu sync.Mutex
	peers   map[int32]*peerConn
}
