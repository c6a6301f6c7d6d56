package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// View is an immutable snapshot of the cluster as of Rev. Views share maps
// with their predecessors (copy-on-write), so never mutate one after it has
// been published: other goroutines may hold it or one derived from it.
type View struct {
	Rev        int64
	ClusterID  string
	Brokers    map[int32]BrokerInfo
	Topics     map[string]Topic
	Parts      map[PartKey]Part
	Controller int32 // broker id of the current controller, -1 if none
	// Dirs: the data directory (BrokerInfo.DirID) the cluster knows each
	// broker by, from dirs/<id> (SetDirs).
	Dirs map[int32]string
	// Tier: each partition's committed manifest in the bucket, from
	// tier/<topic>/<partition> (CommitManifest).
	Tier map[PartKey]TierPtr
	// RestoreChecked: a controller has decided whether to restore this
	// keyspace from the bucket (restore_checked, MarkRestoreChecked).
	RestoreChecked bool
}

// Watch keeps fn informed of the cluster: it loads the whole prefix with one
// Get, calls fn with that View, then follows the prefix's watch stream and
// calls fn with a new View after each batch of events. If the stream breaks
// (compaction, lost leader, closed channel) it reloads and carries on, so fn
// may see a View whose Rev jumps. fn runs serially on the calling goroutine
// and should not block for long. Watch returns ctx's error when ctx ends.
func (c *Client) Watch(ctx context.Context, fn func(*View)) error {
	const (
		minBackoff = 100 * time.Millisecond
		maxBackoff = 5 * time.Second
	)
	backoff := minBackoff
	for {
		st, err := c.load(ctx)
		if err == nil {
			fn(st.view)
			err = c.follow(ctx, st, fn)
			// A successful load resets the backoff.
			backoff = minBackoff
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.log.Warn("metadata watch interrupted, reloading", zap.Error(err), zap.Duration("backoff", backoff))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// Snapshot loads the current View with one Get, without watching.
func (c *Client) Snapshot(ctx context.Context) (*View, error) {
	st, err := c.load(ctx)
	if err != nil {
		return nil, err
	}
	return st.view, nil
}

// watchState is the watch goroutine's private bookkeeping behind the
// published View.
type watchState struct {
	c    *Client
	view *View
	// candidates holds the election keys, which the View reduces to one id.
	candidates map[string]candidate

	// own* record which of view's maps were cloned for the batch being
	// applied and may therefore be written in place.
	ownBrokers, ownTopics, ownParts, ownDirs, ownTier bool
	ctrlDirty                                         bool
}

type candidate struct {
	createRev int64
	value     string
}

func (c *Client) load(ctx context.Context) (*watchState, error) {
	resp, err := c.cli.Get(ctx, c.prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("coord: load %s: %w", c.prefix, err)
	}
	st := &watchState{
		c: c,
		view: &View{
			Rev:        resp.Header.Revision,
			ClusterID:  c.clusterID,
			Brokers:    make(map[int32]BrokerInfo),
			Topics:     make(map[string]Topic),
			Parts:      make(map[PartKey]Part),
			Dirs:       make(map[int32]string),
			Tier:       make(map[PartKey]TierPtr),
			Controller: -1,
		},
		candidates: make(map[string]candidate),
		ownBrokers: true, ownTopics: true, ownParts: true, ownDirs: true, ownTier: true,
	}
	for _, kv := range resp.Kvs {
		st.put(kv)
	}
	st.finish()
	return st, nil
}

// follow applies the watch stream from st.view.Rev+1 until it breaks.
func (c *Client) follow(ctx context.Context, st *watchState, fn func(*View)) error {
	// RequireLeader makes a partitioned member end the stream instead of
	// serving it silently stale.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := c.cli.Watch(wctx, c.prefix,
		clientv3.WithPrefix(), clientv3.WithRev(st.view.Rev+1), clientv3.WithProgressNotify())
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("coord: watch %s from %d: %w", c.prefix, st.view.Rev+1, err)
		}
		if len(resp.Events) == 0 {
			continue // created or progress notification
		}
		st.begin()
		for _, ev := range resp.Events {
			switch ev.Type {
			case mvccpb.Event_PUT:
				st.put(ev.Kv)
			case mvccpb.Event_DELETE:
				st.del(ev.Kv)
			}
		}
		// The header revision can run ahead of the events when etcd delivers a
		// long catch-up in several batches; the last event is exact.
		st.view.Rev = max(st.view.Rev, resp.Events[len(resp.Events)-1].Kv.ModRevision)
		st.finish()
		fn(st.view)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("coord: watch channel closed")
}

// begin starts a new View sharing every map with the previous one.
func (st *watchState) begin() {
	v := *st.view
	st.view = &v
	st.ownBrokers, st.ownTopics, st.ownParts, st.ctrlDirty = false, false, false, false
	st.ownDirs, st.ownTier = false, false
}

func (st *watchState) tier() map[PartKey]TierPtr {
	if !st.ownTier {
		st.view.Tier = maps.Clone(st.view.Tier)
		if st.view.Tier == nil {
			st.view.Tier = map[PartKey]TierPtr{}
		}
		st.ownTier = true
	}
	return st.view.Tier
}

func (st *watchState) dirs() map[int32]string {
	if !st.ownDirs {
		st.view.Dirs = maps.Clone(st.view.Dirs)
		if st.view.Dirs == nil {
			st.view.Dirs = map[int32]string{}
		}
		st.ownDirs = true
	}
	return st.view.Dirs
}

func (st *watchState) brokers() map[int32]BrokerInfo {
	if !st.ownBrokers {
		st.view.Brokers = maps.Clone(st.view.Brokers)
		st.ownBrokers = true
	}
	return st.view.Brokers
}

func (st *watchState) topics() map[string]Topic {
	if !st.ownTopics {
		st.view.Topics = maps.Clone(st.view.Topics)
		st.ownTopics = true
	}
	return st.view.Topics
}

func (st *watchState) parts() map[PartKey]Part {
	if !st.ownParts {
		st.view.Parts = maps.Clone(st.view.Parts)
		st.ownParts = true
	}
	return st.view.Parts
}

// keyKind classifies a key relative to the prefix.
type keyKind int

const (
	kindOther keyKind = iota
	kindClusterID
	kindBroker
	kindController
	kindTopic
	kindPart
	kindDir
	kindTier
	kindRestoreChecked
)

type parsedKey struct {
	kind   keyKind
	broker int32
	topic  string
	part   PartKey
}

func (st *watchState) parse(key []byte) parsedKey {
	rel, ok := strings.CutPrefix(string(key), st.c.prefix)
	if !ok {
		return parsedKey{}
	}
	switch {
	case rel == "cluster_id":
		return parsedKey{kind: kindClusterID}
	case rel == "restore_checked":
		return parsedKey{kind: kindRestoreChecked}
	case strings.HasPrefix(rel, "controller/"):
		return parsedKey{kind: kindController}
	}
	if s, ok := strings.CutPrefix(rel, "brokers/"); ok {
		id, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			st.c.log.Warn("ignoring malformed broker key", zap.String("key", string(key)))
			return parsedKey{}
		}
		return parsedKey{kind: kindBroker, broker: int32(id)}
	}
	if s, ok := strings.CutPrefix(rel, "dirs/"); ok {
		id, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			return parsedKey{}
		}
		return parsedKey{kind: kindDir, broker: int32(id)}
	}
	if s, ok := strings.CutPrefix(rel, "topics/"); ok && s != "" {
		return parsedKey{kind: kindTopic, topic: s}
	}
	for _, pre := range []struct {
		prefix string
		kind   keyKind
	}{{"parts/", kindPart}, {"tier/", kindTier}} {
		s, ok := strings.CutPrefix(rel, pre.prefix)
		if !ok {
			continue
		}
		i := strings.LastIndexByte(s, '/')
		if i <= 0 {
			st.c.log.Warn("ignoring malformed partition key", zap.String("key", string(key)))
			return parsedKey{}
		}
		p, err := strconv.ParseInt(s[i+1:], 10, 32)
		if err != nil || p < 0 {
			st.c.log.Warn("ignoring malformed partition key", zap.String("key", string(key)))
			return parsedKey{}
		}
		return parsedKey{kind: pre.kind, part: PartKey{Topic: s[:i], Partition: int32(p)}}
	}
	return parsedKey{}
}

// put applies a key's new value. A value that does not decode removes the
// entry: showing a stale one would be worse than showing none.
func (st *watchState) put(kv *mvccpb.KeyValue) {
	pk := st.parse(kv.Key)
	switch pk.kind {
	case kindClusterID:
		st.view.ClusterID = string(kv.Value)
	case kindRestoreChecked:
		st.view.RestoreChecked = true
	case kindController:
		st.candidates[string(kv.Key)] = candidate{createRev: kv.CreateRevision, value: string(kv.Value)}
		st.ctrlDirty = true
	case kindBroker:
		var b BrokerInfo
		if err := json.Unmarshal(kv.Value, &b); err != nil {
			st.c.log.Warn("dropping undecodable broker", zap.String("key", string(kv.Key)), zap.Error(err))
			st.delBroker(pk.broker)
			return
		}
		b.RegRev = kv.CreateRevision
		st.brokers()[pk.broker] = b
	case kindTopic:
		var t TopicInfo
		if err := json.Unmarshal(kv.Value, &t); err != nil {
			st.c.log.Warn("dropping undecodable topic", zap.String("key", string(kv.Key)), zap.Error(err))
			st.delTopic(pk.topic)
			return
		}
		st.topics()[pk.topic] = Topic{Info: t, ModRev: kv.ModRevision}
	case kindDir:
		st.dirs()[pk.broker] = string(kv.Value)
	case kindPart:
		var p PartState
		if err := json.Unmarshal(kv.Value, &p); err != nil {
			st.c.log.Warn("dropping undecodable partition", zap.String("key", string(kv.Key)), zap.Error(err))
			st.delPart(pk.part)
			return
		}
		st.parts()[pk.part] = Part{State: p, ModRev: kv.ModRevision}
	case kindTier:
		var t TierPtr
		if err := json.Unmarshal(kv.Value, &t); err != nil || t.Manifest == "" {
			st.c.log.Warn("dropping undecodable manifest pointer", zap.String("key", string(kv.Key)), zap.Error(err))
			if _, ok := st.view.Tier[pk.part]; ok {
				delete(st.tier(), pk.part)
			}
			return
		}
		t.ModRev = kv.ModRevision
		st.tier()[pk.part] = t
	}
}

func (st *watchState) del(kv *mvccpb.KeyValue) {
	pk := st.parse(kv.Key)
	switch pk.kind {
	case kindController:
		delete(st.candidates, string(kv.Key))
		st.ctrlDirty = true
	case kindBroker:
		st.delBroker(pk.broker)
	case kindTopic:
		st.delTopic(pk.topic)
	case kindPart:
		st.delPart(pk.part)
	case kindDir:
		if _, ok := st.view.Dirs[pk.broker]; ok {
			delete(st.dirs(), pk.broker)
		}
	case kindTier:
		if _, ok := st.view.Tier[pk.part]; ok {
			delete(st.tier(), pk.part)
		}
	case kindRestoreChecked:
		st.view.RestoreChecked = false
	}
}

// The del* helpers clone only when there is something to delete.

func (st *watchState) delBroker(id int32) {
	if _, ok := st.view.Brokers[id]; ok {
		delete(st.brokers(), id)
	}
}

func (st *watchState) delTopic(name string) {
	if _, ok := st.view.Topics[name]; ok {
		delete(st.topics(), name)
	}
}

func (st *watchState) delPart(k PartKey) {
	if _, ok := st.view.Parts[k]; ok {
		delete(st.parts(), k)
	}
}

// finish recomputes the controller if the candidates changed. The election
// leader is the candidate with the lowest CreateRevision, as in
// concurrency.Election.
func (st *watchState) finish() {
	if !st.ctrlDirty {
		return
	}
	st.ctrlDirty = false
	var (
		leader candidate
		found  bool
	)
	for _, cand := range st.candidates {
		if !found || cand.createRev < leader.createRev {
			leader, found = cand, true
		}
	}
	st.view.Controller = -1
	if !found {
		return
	}
	id, err := strconv.ParseInt(leader.value, 10, 32)
	if err != nil {
		st.c.log.Warn("controller key holds no broker id", zap.String("value", leader.value))
		return
	}
	st.view.Controller = int32(id)
}
