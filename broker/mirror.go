package broker

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/tiering"
)

// metaMirror is one metadata file the maintenance loop copies to the
// bucket when it changed (topics.json, users.json, acls.json). queue keeps
// the last saved bytes, under whatever lock the saver holds, and never
// waits on the bucket, so a slow bucket cannot stall the requests that
// save; copy writes them, one copy at a time, each of the latest bytes,
// so an older one never lands last.
type metaMirror struct {
	key      string
	copyMu   sync.Mutex // one copy to the bucket at a time
	mu       sync.Mutex // b, changes, mirrored: a leaf
	b        []byte
	changes  uint64 // saves so far
	mirrored uint64 // changes last copied to the bucket
}

func (m *metaMirror) queue(b []byte) {
	m.mu.Lock()
	m.b = b
	m.changes++
	m.mu.Unlock()
}

// warner is where copy reports a failure: the server's repeat logger (a
// bucket away fails every pass), or any *zap.Logger.
type warner interface {
	Warn(msg string, fields ...zap.Field)
}

// copy copies the last queued bytes to the bucket if they changed since the
// last copy (best effort: a failure is logged and the next maintenance pass
// tries again); it reports whether the bucket has the latest copy.
func (m *metaMirror) copy(ctx context.Context, t *tiering.Tier, logger warner) bool {
	m.copyMu.Lock()
	defer m.copyMu.Unlock()
	m.mu.Lock()
	b, n := m.b, m.changes
	done := n == m.mirrored
	m.mu.Unlock()
	if done || b == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := t.PutMeta(ctx, m.key, b); err != nil {
		logger.Warn("mirror to the tiered store", zap.String("key", m.key), zap.Error(err))
		return false
	}
	m.mu.Lock()
	m.mirrored = n
	m.mu.Unlock()
	return true
}
