package broker

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
)

// brokerMeta is the broker's identity and counters, kept in meta.json.
// The leader epoch grows on every start (Kafka clients use it to fence
// stale metadata) and never goes down (raiseLeaderEpoch); producer ids are
// handed out in blocks so that InitProducerId writes the file once per
// block, not once per producer. With tiering the file is mirrored to the
// bucket (metaMirrorKey), and a restore starts above the mirrored epoch
// and producer ids.
type brokerMeta struct {
	Version       int    `json:"version"`
	ClusterID     string `json:"cluster_id"`
	NodeID        int32  `json:"node_id"`
	LeaderEpoch   int32  `json:"leader_epoch"`
	ProducerIDEnd int64  `json:"producer_id_end"` // ids below this may have been handed out
}

const (
	metaFile        = "meta.json"
	metaMirrorKey   = "_synapse/meta.json"
	producerIDBlock = 1000

	// maxFoundEpoch bounds the epochs a start takes from what it finds
	// (batches, committed offsets, the bucket's copy): one start adds one,
	// so anything above is not an epoch of this broker's (a client may
	// commit any epoch) and would only bring the int32 closer to overflow.
	maxFoundEpoch = 1 << 24
)

type metaStore struct {
	path   string
	mu     sync.Mutex
	m      brokerMeta
	next   int64      // next producer id to hand out
	mirror metaMirror // meta.json for the bucket (copied with topics.json)
}

func openMeta(dataDir string) (*metaStore, error) {
	ms := &metaStore{path: filepath.Join(dataDir, metaFile)}
	ms.mirror.key = metaMirrorKey
	b, err := os.ReadFile(ms.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		var id [16]byte
		if _, err := rand.Read(id[:]); err != nil {
			return nil, err
		}
		ms.m = brokerMeta{Version: 1, ClusterID: base64.RawURLEncoding.EncodeToString(id[:]), NodeID: 0, LeaderEpoch: -1}
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(b, &ms.m); err != nil || ms.m.Version != 1 {
			return nil, fmt.Errorf("broker: %s is unreadable: %v", ms.path, err)
		}
	}
	if ms.m.LeaderEpoch == math.MaxInt32 {
		return nil, fmt.Errorf("broker: %s: leader epoch %d cannot grow", ms.path, ms.m.LeaderEpoch)
	}
	ms.m.LeaderEpoch++
	ms.next = ms.m.ProducerIDEnd
	return ms, ms.saveLocked()
}

func (ms *metaStore) saveLocked() error {
	b, err := json.MarshalIndent(ms.m, "", "  ")
	if err != nil {
		return err
	}
	if err := log.WriteFileAtomic(log.OSFS, ms.path, b); err != nil {
		return err
	}
	ms.mirror.queue(b) // copied only with tiering
	return nil
}

// raiseLeaderEpoch makes the leader epoch at least floor (saved before it
// applies). The server calls it while it opens, before anything is served
// or stamped, so the epoch read without the lock does not change under a
// request.
func (ms *metaStore) raiseLeaderEpoch(floor int32) error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if floor <= ms.m.LeaderEpoch {
		return nil
	}
	ms.m.LeaderEpoch = floor
	return ms.saveLocked()
}

// decodeMirroredMeta reads the bucket's copy of meta.json.
func decodeMirroredMeta(b []byte) (brokerMeta, error) {
	var m brokerMeta
	if err := json.Unmarshal(b, &m); err != nil || m.Version != 1 {
		return m, fmt.Errorf("broker: the tiered store's %s is unreadable: %v", metaMirrorKey, err)
	}
	return m, nil
}

// producerIDEnd is the bound below which ids may have been handed out.
func (ms *metaStore) producerIDEnd() int64 {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.m.ProducerIDEnd
}

// reserveProducerIDsBelow makes sure no id below floor is handed out (a
// restore brought back producers that may still use them).
func (ms *metaStore) reserveProducerIDsBelow(floor int64) error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.next >= floor {
		return nil
	}
	ms.next = floor
	ms.m.ProducerIDEnd = max(ms.m.ProducerIDEnd, floor)
	return ms.saveLocked()
}

// nextProducerID hands out a producer id never used before, across restarts.
func (ms *metaStore) nextProducerID() (int64, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.next >= ms.m.ProducerIDEnd {
		ms.m.ProducerIDEnd = ms.next + producerIDBlock
		if err := ms.saveLocked(); err != nil {
			return -1, err
		}
	}
	id := ms.next
	ms.next++
	return id, nil
}

// raiseLeaderEpoch starts the broker above every leader epoch it can find
// (a meta.json lost, or a data directory restored from the bucket, would
// otherwise start it at an epoch its clients have seen pass: Kafka clients
// would take their positions for truncated): the epoch of each partition's
// last local batch (epochs grow along a log) and the largest one of a
// committed offset. Called once the partitions and the groups are open,
// before anything is served.
func (s *Server) raiseLeaderEpoch() error {
	found := int32(-1)
	if s.grp() != nil {
		found = s.grp().MaxLeaderEpoch(maxFoundEpoch - 1)
	}
	for _, t := range s.reg.all() {
		for _, p := range s.reg.partitionsOf(t) {
			if e := lastBatchEpoch(p.log); e < maxFoundEpoch {
				found = max(found, e)
			}
		}
	}
	if found < 0 || found < s.meta.m.LeaderEpoch {
		return nil
	}
	s.logger.Info("leader epoch raised above the epochs found", zap.Int32("found", found), zap.Int32("leader_epoch", found+1))
	return s.meta.raiseLeaderEpoch(found + 1)
}

// lastBatchEpoch is the leader epoch of lp's last local batch (-1: none,
// or it cannot be read).
func lastBatchEpoch(lp *log.Partition) int32 {
	end := lp.LogEndOffset()
	if lp.Err() != nil || end <= lp.LocalStartOffset() {
		return -1
	}
	e := int32(-1)
	scanHeaders(lp, end-1, func(h *log.BatchHeader) bool {
		e = h.LeaderEpoch
		return true // on to the last
	})
	return e
}
