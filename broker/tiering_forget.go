package broker

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

// Objects no manifest names: the orphan sweep, and the deletion of a
// deleted topic's objects (tier-forget.json).

// cleanOrphans removes objects no manifest names (interrupted uploads or
// retention passes, failed deletes) and the objects of deleted topics
// still pending (forgetPending): at start-up before the first upload, then
// every OrphanSweepInterval between two maintenance passes (no upload is
// under way then).
func (s *Server) cleanOrphans() {
	s.forgetPending() // deleted topics' objects a delete left behind
	// Incomplete multipart uploads an interrupted upload left (stored and
	// billed, but in no listing of objects): none of ours runs now.
	// A bucket clean uploads outside the tiering passes: not while one runs
	// (the next sweep aborts what is left).
	// In a cluster other brokers upload to the same bucket: never.
	if s.cl == nil && s.cleanerUploads.TryLock() {
		ctx, cancel := context.WithTimeout(s.ctx, tierOpTimeout)
		if n, err := s.cfg.Tier.AbortUploads(ctx); err != nil {
			s.logger.Warn("abort incomplete uploads (retried at the next sweep)", zap.Error(err))
		} else if n > 0 {
			s.logger.Info("aborted incomplete uploads", zap.Int("uploads", n))
		}
		cancel()
		s.cleanerUploads.Unlock()
	}
	// A few partitions at once, as uploads; the first store error ends the
	// sweep (the bucket is away or refusing: the next sweep tries again).
	sem := make(chan struct{}, tierParallelism)
	var wg sync.WaitGroup
	var failed atomic.Bool
	for _, t := range s.reg.all() {
		for _, p := range s.reg.partitionsOf(t) {
			if s.ctx.Err() != nil || failed.Load() {
				break
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if !p.tierMu.TryLock() {
					return // the cleaner is writing objects its manifest will name: the next sweep
				}
				defer p.tierMu.Unlock()
				ctx, cancel := context.WithTimeout(s.ctx, tierOpTimeout)
				n, err := s.cfg.Tier.CleanOrphans(ctx, p.tierKey())
				cancel()
				if err != nil {
					if !failed.Swap(true) {
						s.logger.Warn("clean orphan objects (the sweep stops here, retried later)", zap.String("topic", t.name), zap.Int32("partition", p.index), zap.Error(err))
					}
				} else if n > 0 {
					s.logger.Info("cleaned orphan objects", zap.String("topic", t.name), zap.Int32("partition", p.index), zap.Int("objects", n))
				}
			}()
		}
	}
	wg.Wait()
}

// forgetTiered has a deleted topic's objects deleted from the bucket by
// the next maintenance pass (the topic id in the keys keeps them from ever
// mixing with a new topic of the same name). The partitions are first
// recorded in <data-dir>/tier-forget.json (recordForgets), and each orphan
// sweep retries what is still there, so a delete during an outage or cut
// short by a crash is finished later rather than leaked. The deletion runs
// on the maintenance goroutine, after the pass's uploads: an upload of the
// same partition still under way would otherwise put back objects and a
// manifest after they were deleted.
func (s *Server) forgetTiered() {
	s.forgetDue.Store(true)
	s.kickTiering()
}

// recordForgets adds parts to forgetFile (DeleteTopics does it before the
// topic goes), or with undo takes them out again (the delete failed).
func (s *Server) recordForgets(parts []*partition, undo bool) {
	if err := s.editForgets(func(m map[tiering.PartitionKey]bool) {
		for _, p := range parts {
			if undo {
				delete(m, p.tierKey())
			} else {
				m[p.tierKey()] = true
			}
		}
	}); err != nil {
		s.logger.Warn("record a deleted topic's objects for deletion", zap.Error(err))
	}
}

// pruneForgets drops forgetFile entries of topics that exist: a delete
// that crashed between recording and removing the topic. Only at start,
// before any request: a DeleteTopics records its entries before the topic
// goes, so while requests are served such an entry is not stale.
func (s *Server) pruneForgets() {
	if err := s.editForgets(func(m map[tiering.PartitionKey]bool) {
		for k := range m {
			if s.reg.getByID(k.TopicID) != nil {
				delete(m, k)
			}
		}
	}); err != nil {
		s.logger.Warn("prune the deleted topics' objects to delete", zap.Error(err))
	}
}

// forgetFile lists partitions of deleted topics whose objects may still be
// in the bucket.
const forgetFile = "tier-forget.json"

// forgetRecord is one forgetFile entry.
type forgetRecord struct {
	Topic     string `json:"topic"`
	TopicID   string `json:"topic_id"`
	Partition int32  `json:"partition"`
}

// editForgets applies edit to the set of partitions whose objects are to be
// deleted and saves it (forgetMu).
func (s *Server) editForgets(edit func(map[tiering.PartitionKey]bool)) error {
	s.forgetMu.Lock()
	defer s.forgetMu.Unlock()
	m := s.readForgetsLocked()
	edit(m)
	recs := make([]forgetRecord, 0, len(m))
	for k := range m {
		recs = append(recs, forgetRecord{k.Topic, hex.EncodeToString(k.TopicID[:]), k.Partition})
	}
	sort.Slice(recs, func(i, j int) bool {
		return recs[i].Topic < recs[j].Topic || recs[i].Topic == recs[j].Topic && recs[i].Partition < recs[j].Partition
	})
	b, err := json.Marshal(recs)
	if err != nil {
		return err
	}
	return log.WriteFileAtomic(log.OSFS, filepath.Join(s.cfg.DataDir, forgetFile), b)
}

// readForgetsLocked reads forgetFile (empty if missing or unreadable).
func (s *Server) readForgetsLocked() map[tiering.PartitionKey]bool {
	m := map[tiering.PartitionKey]bool{}
	b, err := os.ReadFile(filepath.Join(s.cfg.DataDir, forgetFile))
	if err != nil {
		return m
	}
	var recs []forgetRecord
	if err := json.Unmarshal(b, &recs); err != nil {
		// Kept aside for the operator (the objects it listed are not
		// swept by anything else) rather than overwritten by the next edit.
		aside := fmt.Sprintf("%s.unreadable-%d", forgetFile, time.Now().UnixNano())
		rerr := os.Rename(filepath.Join(s.cfg.DataDir, forgetFile), filepath.Join(s.cfg.DataDir, aside))
		s.logger.Error("deleted topics' objects to delete: file unreadable, moved aside; the objects it lists stay in the bucket",
			zap.String("file", forgetFile), zap.String("moved_to", aside), zap.Error(err), zap.NamedError("move_error", rerr))
		return m
	}
	for _, r := range recs {
		var k tiering.PartitionKey
		id, err := hex.DecodeString(r.TopicID)
		if err != nil || len(id) != len(k.TopicID) {
			continue
		}
		k.Topic, k.Partition = r.Topic, r.Partition
		copy(k.TopicID[:], id)
		m[k] = true
	}
	return m
}

// forgetPending deletes the objects of the partitions in forgetFile, once
// topics.json without their topics is in the bucket (else a restore would
// bring back a topic whose objects are gone), and drops each from
// forgetFile when its objects are gone. What fails stays for the next
// sweep. It runs on the maintenance goroutine only, between passes (no
// upload under way).
func (s *Server) forgetPending() {
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Minute)
	defer cancel()
	var keys []tiering.PartitionKey
	s.forgetMu.Lock()
	for k := range s.readForgetsLocked() {
		keys = append(keys, k)
	}
	s.forgetMu.Unlock()
	if len(keys) == 0 || !s.mirrorTopics(ctx) {
		return
	}
	var done []tiering.PartitionKey
	failed := 0
	for _, pk := range keys {
		if s.reg.getByID(pk.TopicID) != nil {
			// Recorded by a DeleteTopics that has not removed the topic
			// yet (or failed to, and takes the entry out itself).
			continue
		}
		err := s.cfg.Tier.Forget(ctx, pk)
		if err == nil {
			err = s.cfg.Tier.Store().Delete(ctx, producersKey(pk))
			if errors.Is(err, tiering.ErrNotFound) {
				err = nil
			}
		}
		if err != nil {
			s.repeat.Warn("delete a deleted topic's objects (retried at the next sweep)", zap.String("topic", pk.Topic), zap.Int32("partition", pk.Partition), zap.Error(err))
			if failed++; failed >= 3 {
				break // the bucket is away or refusing: the rest can wait too
			}
			continue // one partition's trouble does not hold up the others
		}
		done = append(done, pk)
	}
	if len(done) > 0 {
		if err := s.editForgets(func(m map[tiering.PartitionKey]bool) {
			for _, k := range done {
				delete(m, k)
			}
		}); err != nil {
			s.logger.Warn("record deleted objects", zap.Error(err))
		}
	}
}
