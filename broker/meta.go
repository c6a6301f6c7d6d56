package broker

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/synapsebroker/synapse/log"
)

// brokerMeta is the broker's identity and counters, kept in meta.json.
// The leader epoch grows on every start (Kafka clients use it to fence
// stale metadata); producer ids are handed out in blocks so that InitProducerId
// writes the file once per block, not once per producer.
type brokerMeta struct {
	Version       int    `json:"version"`
	ClusterID     string `json:"cluster_id"`
	NodeID        int32  `json:"node_id"`
	LeaderEpoch   int32  `json:"leader_epoch"`
	ProducerIDEnd int64  `json:"producer_id_end"` // ids below this may have been handed out
}

const (
	metaFile        = "meta.json"
	producerIDBlock = 1000
)

type metaStore struct {
	path string
	mu   sync.Mutex
	m    brokerMeta
	next int64 // next producer id to hand out
}

func openMeta(dataDir string) (*metaStore, error) {
	ms := &metaStore{path: filepath.Join(dataDir, metaFile)}
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
	ms.m.LeaderEpoch++
	ms.next = ms.m.ProducerIDEnd
	return ms, ms.saveLocked()
}

func (ms *metaStore) saveLocked() error {
	b, err := json.MarshalIndent(ms.m, "", "  ")
	if err != nil {
		return err
	}
	return log.WriteFileAtomic(log.OSFS, ms.path, b)
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
