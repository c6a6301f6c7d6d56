package tiering

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
)

// Fenced tiering (cluster mode): several brokers share the bucket, and the
// leader of a partition is the only one that uploads it. A deposed leader
// that has not noticed yet (paused, cut off) may still be uploading, so:
//
//   - every object it writes carries its leader epoch in its key (segments
//     <base>-<gen>-e<epoch>.log, manifests manifest-e<epoch>-<seq>-<random>.json):
//     it never overwrites a successor's objects;
//   - the commit point is not an object in the bucket (S3 has no
//     compare-and-swap) but a pointer the Committer keeps (etcd): a commit
//     names the new manifest's key and succeeds only while the writer
//     still leads at its epoch and has seen the last commit;
//   - the orphan sweep runs on the leader only and never deletes an object
//     of a later epoch than its own.
//
// Replicas roll their segments where they like, so a new leader's local
// segment may straddle the end of its predecessor's last upload: the
// batches from that end on are uploaded as a segment of their own (no
// remote indexes: cold reads scan it). Followers release local segments
// the committed manifest covers, whatever their boundaries.

// ErrFenced is a commit refused because the writer no longer leads the
// partition at its epoch, or has not seen the last commit.
var ErrFenced = errors.New("tiering: not the partition's leader at this epoch (fenced)")

// Committer keeps each partition's commit point outside the bucket.
type Committer interface {
	// Committed returns the key of the partition's committed manifest ("":
	// none yet) and a token for the next commit, as this broker last saw
	// them (its view may be behind: a commit on it fails, and loads again).
	Committed(pk PartitionKey) (key string, token int64, err error)
	// Latest is Committed read from the commit point itself
	// (linearizable): the orphan sweep deletes only against it.
	Latest(ctx context.Context, pk PartitionKey) (key string, token int64, err error)
	// Epoch is the leader epoch this broker leads the partition at; an
	// error wrapping ErrFenced if it does not lead it.
	Epoch(pk PartitionKey) (int32, error)
	// Commit makes key the committed manifest if this broker still leads
	// at epoch and the commit point is still at token; it returns the new
	// token. A refusal wraps ErrFenced.
	Commit(ctx context.Context, pk PartitionKey, key string, epoch int32, token int64) (int64, error)
}

// committed is what a cached manifest was loaded or committed as.
type committed struct {
	key   string
	token int64
}

// SetCommitter makes c the commit point of every partition (call it
// before any other use of the Tier).
func (t *Tier) SetCommitter(c Committer) { t.committer = c }

// Fenced reports whether the Tier commits through a Committer.
func (t *Tier) Fenced() bool { return t.committer != nil }

// fencedManifestKey is a new manifest's key: its epoch and sequence, and
// a random part, so that no two writes ever share a key (a commit whose
// answer was lost may have landed; the retry, built on the manifest before
// it, must not overwrite it).
func (k PartitionKey) fencedManifestKey(epoch int32, seq int64) string {
	return fmt.Sprintf("%s/manifest-e%d-%d-%08x.json", k.dir(), epoch, seq, rand.Uint32())
}

// manifestKeySeq parses a fenced manifest key's epoch and sequence.
func manifestKeySeq(key string) (epoch int32, seq int64, ok bool) {
	name := key[strings.LastIndexByte(key, '/')+1:]
	rest, isManifest := strings.CutPrefix(name, "manifest-e")
	if !isManifest {
		return 0, 0, false
	}
	parts := strings.Split(strings.TrimSuffix(rest, ".json"), "-")
	if len(parts) < 2 {
		return 0, 0, false
	}
	e, err1 := strconv.ParseInt(parts[0], 10, 32)
	s, err2 := strconv.ParseInt(parts[1], 10, 64)
	return int32(e), s, err1 == nil && err2 == nil && e >= 0 && s >= 0
}

// sweepable reports whether the leader at epoch own, whose committed
// manifest is m, may delete unnamed object k: never one of a later epoch
// (a successor's upload not committed yet, if this broker no longer leads
// without knowing it), nor a manifest newer than m, nor an unfenced key.
func sweepable(k string, own int32, m *Manifest) bool {
	e, ok := keyEpoch(k)
	if !ok || e > own {
		return false
	}
	if me, seq, isManifest := manifestKeySeq(k); isManifest && (me > m.Epoch || me == m.Epoch && seq > m.Seq) {
		return false
	}
	return true
}

// cleanOrphansFenced is CleanOrphans with a Committer: only the leader
// sweeps, and only against the manifest the commit point names now (a
// linearizable read): a cached manifest may be older than a commit this
// broker did not see, or whose answer it lost.
func (t *Tier) cleanOrphansFenced(ctx context.Context, pk PartitionKey) (int, error) {
	own, err := t.committer.Epoch(pk)
	if err != nil {
		return 0, nil // not the leader: not its sweep
	}
	key, token, err := t.committer.Latest(ctx, pk)
	if err != nil {
		return 0, err
	}
	m, err := t.Manifest(ctx, pk)
	if err != nil {
		return 0, err
	}
	if ckey, ctoken, ok := t.Committed(pk); !ok || ckey != key || ctoken != token {
		t.Invalidate(pk) // behind the commit point: the next pass loads it, the next sweep sweeps
		return 0, nil
	}
	return t.sweep(ctx, pk, m, key, own)
}

// keyEpoch parses the leader epoch out of a fenced object's key (the
// last path element: <base>-<gen>-e<epoch>.<ext> or
// manifest-e<epoch>-<seq>-<random>.json).
func keyEpoch(key string) (int32, bool) {
	name := key[strings.LastIndexByte(key, '/')+1:]
	var s string
	if rest, ok := strings.CutPrefix(name, "manifest-e"); ok {
		s, _, _ = strings.Cut(rest, "-")
	} else {
		i := strings.LastIndex(name, "-e")
		if i < 0 {
			return 0, false
		}
		s, _, _ = strings.Cut(name[i+2:], ".")
	}
	e, err := strconv.ParseInt(s, 10, 32)
	return int32(e), err == nil && e >= 0
}

// Committed is what pk's cached manifest was loaded or committed as: its
// key ("" for none committed) and token; ok is false if none is cached.
func (t *Tier) Committed(pk PartitionKey) (key string, token int64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.ptrs[pk]
	return c.key, c.token, ok
}

// Invalidate drops pk's cached manifest: the next use loads the committed
// one (a follower does when the commit point moved).
func (t *Tier) Invalidate(pk PartitionKey) {
	t.mu.Lock()
	delete(t.manifests, pk)
	delete(t.ptrs, pk)
	t.mu.Unlock()
}

// loadFenced loads the manifest the Committer names.
func (t *Tier) loadFenced(ctx context.Context, pk PartitionKey) (*Manifest, error) {
	key, token, err := t.committer.Committed(pk)
	if err != nil {
		return nil, err
	}
	m := &Manifest{Version: 1}
	if key != "" {
		t.gets.Add(1)
		b, err := t.store.GetRange(ctx, key, 0, -1)
		if err != nil {
			// Not found too: the pointer moved on and the object it named
			// went; the next load follows the new pointer.
			t.errs.Add(1)
			return nil, fmt.Errorf("tiering: %s: committed manifest %s: %w", pk.dir(), key, err)
		}
		if m, err = decodeManifest(b); err != nil {
			return nil, err
		}
	}
	return t.cacheManifest(pk, m, &committed{key, token}), nil
}

// commitFenced writes m (encoded as b) under a key of its own and makes it
// the committed manifest; the one it replaces is deleted.
func (t *Tier) commitFenced(ctx context.Context, pk PartitionKey, m *Manifest, b []byte) error {
	t.mu.Lock()
	prev, ok := t.ptrs[pk]
	t.mu.Unlock()
	fail := func(err error) error {
		// What the commit point holds is unknown (or not what this broker
		// thought): the next use loads it again.
		t.Invalidate(pk)
		t.errs.Add(1)
		return err
	}
	if !ok {
		return fail(fmt.Errorf("tiering: %s: commit of a manifest not loaded: %w", pk.dir(), ErrFenced))
	}
	key := pk.fencedManifestKey(m.Epoch, m.Seq)
	if key == prev.key {
		return fail(fmt.Errorf("tiering: %s: manifest %s is already committed: %w", pk.dir(), key, ErrFenced))
	}
	if err := t.store.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
		return fail(err)
	}
	token, err := t.committer.Commit(ctx, pk, key, m.Epoch, prev.token)
	if err != nil {
		return fail(err)
	}
	t.mu.Lock()
	t.manifests[pk] = m.clone()
	t.ptrs[pk] = committed{key, token}
	t.mu.Unlock()
	if prev.key != "" {
		// Best effort: a follower that loads it after this gets not-found
		// and follows the new pointer; the sweep takes a failed delete.
		if err := t.store.Delete(ctx, prev.key); err != nil {
			t.repeat.Warn("delete a replaced manifest", zap.String("key", prev.key), zap.Error(err))
		}
	}
	return nil
}

// fence stamps an upload with the leader epoch (fenced tiering only).
func (t *Tier) fence(pk PartitionKey, meta *SegmentMeta) error {
	if t.committer == nil {
		return nil
	}
	e, err := t.committer.Epoch(pk)
	if err != nil {
		return err
	}
	meta.Fenced, meta.Epoch = true, e
	return nil
}

// releasable is Manifest.Releasable, or with fenced tiering: the
// committed manifest covers the segment's offsets. The manifest is the
// leader's of this same replicated log, so offsets are the proof; the
// boundaries are the leader's rolls, not this replica's. A segment this
// replica's cleaner rewrote is released too: the bucket holds the same
// offsets, as the leader's cleaner left them or not yet cleaned (a log
// compaction only ever shortens, and the bucket's own clean follows).
func (t *Tier) releasable(m *Manifest, s log.SegmentInfo, lp *log.Partition) bool {
	if t.committer == nil || s.Next <= lp.LogStartOffset() {
		return m.Releasable(s, lp.LogStartOffset())
	}
	return len(m.Segments) > 0 && max(s.Base, lp.LogStartOffset()) >= m.Segments[0].Base && s.Next <= m.Next()
}

// uploadSuffix uploads the batches of local segment seg from offset from
// (a batch boundary: where the previous leader's last upload ended) as a
// segment of its own. It carries no remote indexes: cold reads of it scan
// from its start.
func (t *Tier) uploadSuffix(ctx context.Context, pk PartitionKey, lp *log.Partition, seg log.SegmentInfo, from int64) (SegmentMeta, error) {
	meta := SegmentMeta{Base: from, Next: seg.Next, MaxTimestamp: seg.MaxTimestamp, Cleaned: seg.Cleaned}
	if err := t.fence(pk, &meta); err != nil {
		return meta, err
	}
	file, err := lp.OpenSegmentFile(seg.LogPath)
	if err != nil {
		return meta, err
	}
	defer file.Close()
	pos, err := batchPosition(file, seg, from)
	if err != nil {
		return meta, fmt.Errorf("tiering: %s: segment %d: %w", pk.dir(), seg.Base, err)
	}
	meta.Size = seg.Size - pos
	key := pk.objectKey(&meta, ".log")
	if err := t.putLog(ctx, key, io.NewSectionReader(file, pos, meta.Size), seg.LogPath, meta.Size, &meta, false); err != nil {
		return meta, err
	}
	// The aborted transactions whose markers are in this part (the rest
	// are in the previous leader's upload of the segment's head).
	if err := t.uploadTxnIndex(ctx, pk, lp, seg, &meta); err != nil {
		return meta, err
	}
	t.logger.Info("uploaded the part of a local segment past the bucket's end", zap.String("key", key),
		zap.Int64("segment", seg.Base), zap.Int64("from", from), zap.Int64("bytes", meta.Size))
	return meta, nil
}

// batchPosition finds the position of the batch starting at offset in a
// sealed segment, walking batch headers from the segment's start. In a
// cleaned segment the batch may be gone: the first batch past offset (or
// the segment's end) is where its offsets continue.
func batchPosition(r io.ReaderAt, seg log.SegmentInfo, offset int64) (int64, error) {
	var hb [log.BatchHeaderSize]byte
	for pos := int64(0); pos < seg.Size; {
		if _, err := r.ReadAt(hb[:], pos); err != nil {
			return 0, fmt.Errorf("batch header at %d: %w", pos, err)
		}
		h, err := log.ParseBatchHeader(hb[:])
		if err != nil {
			return 0, fmt.Errorf("batch header at %d: %w", pos, err)
		}
		switch {
		case h.BaseOffset == offset, h.BaseOffset > offset && seg.Cleaned:
			return pos, nil
		case h.BaseOffset > offset || h.LastOffset() >= offset:
			return 0, fmt.Errorf("offset %d is not a batch boundary here (batch [%d, %d] at %d)", offset, h.BaseOffset, h.LastOffset(), pos)
		}
		pos += int64(h.Length)
	}
	if seg.Cleaned {
		return seg.Size, nil // cleaned away to the segment's end
	}
	return 0, fmt.Errorf("offset %d not found", offset)
}

// LatestManifest finds, with the commit point lost (a disaster: etcd
// empty), the newest fenced manifest of pk in the bucket whose last
// segment is there: manifests are never overwritten and their keys carry
// (epoch, seq), and every manifest a leader wrote lists only records below
// its high watermark, so the newest readable one is the longest committed
// log the bucket holds. It also returns the highest leader epoch in any
// of pk's keys (a restored partition goes on above it). ok is false if pk
// has no manifest.
func (t *Tier) LatestManifest(ctx context.Context, pk PartitionKey) (key string, m *Manifest, maxEpoch int32, ok bool, err error) {
	keys, err := t.store.List(ctx, pk.dir()+"/")
	if err != nil {
		return "", nil, 0, false, err
	}
	type cand struct {
		key   string
		epoch int32
		seq   int64
	}
	var cands []cand
	for _, k := range keys {
		e, fenced := keyEpoch(k)
		if !fenced {
			continue
		}
		maxEpoch = max(maxEpoch, e)
		if me, seq, isManifest := manifestKeySeq(k); isManifest {
			cands = append(cands, cand{k, me, seq})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if c := cmp.Compare(b.epoch, a.epoch); c != 0 {
			return c
		}
		return cmp.Compare(b.seq, a.seq)
	})
	for _, c := range cands {
		b, err := t.store.GetRange(ctx, c.key, 0, -1)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return "", nil, 0, false, err
		}
		m, err := decodeManifest(b)
		if err != nil {
			t.logger.Warn("skipping an unreadable manifest", zap.String("key", c.key), zap.Error(err))
			continue
		}
		if n := len(m.Segments); n > 0 {
			// Its newest objects may have been swept (a commit refused,
			// then retried under the same key by a pass that failed).
			if _, err := t.store.GetRange(ctx, pk.objectKey(&m.Segments[n-1], ".log"), 0, 1); errors.Is(err, ErrNotFound) {
				continue
			} else if err != nil {
				return "", nil, 0, false, err
			}
		}
		return c.key, m, maxEpoch, true, nil
	}
	return "", nil, maxEpoch, false, nil
}
