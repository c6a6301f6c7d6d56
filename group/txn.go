package group

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Transactional offsets (KIP-98, KIP-447). TxnOffsetCommit is answered by
// the transaction coordinator, which keeps a transaction's offsets with its
// state; this package is told when they are pending (SetPending) and gets
// them when the transaction commits (CommitTxnOffsets). While a partition
// has pending offsets, OffsetFetch with require_stable answers
// UNSTABLE_OFFSET_COMMIT for it, so a consumer taking over the partition
// waits for the transaction to end instead of starting at the offset
// before it.

// TxnOffset is one partition's offset committed by a transaction.
type TxnOffset struct {
	Topic       string
	Partition   int32
	Offset      int64
	LeaderEpoch int32
	Metadata    *string
}

// TxnPartition names a partition of a group's pending offsets.
type TxnPartition struct {
	Topic     string
	Partition int32
}

// SetPending marks (pending) or clears the offsets of transactional
// producer pid waiting in groupID for parts.
func (c *Coordinator) SetPending(groupID string, pid int64, parts []TxnPartition, pending bool) {
	clean(&groupID)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = map[string]map[tp]map[int64]struct{}{}
	}
	g := c.pending[groupID]
	for _, p := range parts {
		k := tp{p.Topic, p.Partition}
		if pending {
			if g == nil {
				g = map[tp]map[int64]struct{}{}
				c.pending[groupID] = g
			}
			if g[k] == nil {
				g[k] = map[int64]struct{}{}
			}
			g[k][pid] = struct{}{}
			continue
		}
		if g != nil && g[k] != nil {
			delete(g[k], pid)
			if len(g[k]) == 0 {
				delete(g, k)
			}
		}
	}
	if g != nil && len(g) == 0 {
		delete(c.pending, groupID)
	}
}

// pendingLocked reports whether groupID has transactional offsets pending
// for k. c.mu held.
func (c *Coordinator) pendingLocked(groupID string, k tp) bool {
	return len(c.pending[groupID][k]) > 0
}

// CommitTxnOffsets writes a committed transaction's offsets for groupID,
// durably (the group is created if it does not exist: a transaction may
// commit for a group that has no members, as Kafka allows). since > 0 (an
// end resumed after a crash, decided at since, Unix ms): a partition whose
// offset was committed after since keeps it (a later commit); one committed
// in the same millisecond is written again (most likely this end's own,
// done before the crash: the same offsets).
func (c *Coordinator) CommitTxnOffsets(groupID string, offs []TxnOffset, since int64) error {
	clean(&groupID)
	g := c.lockGroup(groupID, true)
	if g == nil {
		return errors.New("group: coordinator closed")
	}
	defer g.mu.Unlock()
	now := c.cfg.Now().UnixMilli()
	recs := make([]record, 0, len(offs))
	vals := make([]offsetValue, 0, len(offs))
	kept := offs[:0:0]
	for _, o := range offs {
		if cur, ok := g.offsets[tp{o.Topic, o.Partition}]; since > 0 && ok && cur.CommitMs > since {
			continue
		}
		kept = append(kept, o)
	}
	offs = kept
	for _, o := range offs {
		v := offsetValue{Offset: o.Offset, LeaderEpoch: o.LeaderEpoch, CommitMs: now}
		if o.Metadata != nil {
			v.Metadata = *o.Metadata
		}
		recs = append(recs, offsetRecord(g.id, o.Topic, o.Partition, &v))
		vals = append(vals, v)
	}
	if err := c.appendAll(recs); err != nil {
		g.logger().Warn("write transactional offset commit", zap.Error(err))
		return err
	}
	for i, o := range offs {
		g.offsets[tp{o.Topic, o.Partition}] = vals[i]
	}
	return nil
}

// ValidateTxnMember is TxnOffsetCommit's group check (v3+, KIP-447): a
// commit naming a member and generation must come from a current member
// of that generation, so a zombie consumer's producer cannot commit
// offsets for partitions reassigned since. Generation -1 without a member
// (an older client, or a producer outside group management) is not
// checked.
func (c *Coordinator) ValidateTxnMember(req *kmsg.TxnOffsetCommitRequest) *kerr.Error {
	if req.Version < 3 || req.Generation < 0 && req.MemberID == "" && req.InstanceID == nil {
		return nil
	}
	groupID, memberID := req.Group, req.MemberID
	clean(&groupID)
	clean(&memberID)
	g := c.lockGroup(groupID, false)
	if g == nil {
		if c.ctx.Err() != nil {
			return kerr.NotCoordinator
		}
		return kerr.IllegalGeneration
	}
	defer g.mu.Unlock()
	if e := g.validateMemberLocked(memberID, instanceID(req.InstanceID)); e != nil {
		return e
	}
	if req.Generation != g.generation {
		return kerr.IllegalGeneration
	}
	return nil
}
