package tiering

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sort"

	"github.com/synapsebroker/synapse/log"
)

// Aborted transactions in the bucket: a sealed segment's .txnindex (the
// log's encoding, Kafka's 34-byte entries) is uploaded beside its .index
// object before the manifest commit, and the manifest's segment entry
// records its size and CRC-32C (TxnIndexBytes 0: none, never fetched).
// Cold read_committed fetches collect them with the log's semantics
// (CollectAbortedTxns), through the index cache.

const (
	txnIndexExt   = ".txnindex"
	txnEntryBytes = 34
)

// uploadTxnIndex uploads the aborted-transaction entries of seg's part
// meta covers (if it has any) and records them in meta.
func (t *Tier) uploadTxnIndex(ctx context.Context, pk PartitionKey, lp *log.Partition, seg log.SegmentInfo, meta *SegmentMeta) error {
	meta.TxnIndexBytes, meta.TxnIndexCRC32C = 0, 0
	es, err := segmentAborted(lp, seg, meta.Base)
	if err != nil || len(es) == 0 {
		return err
	}
	b := log.EncodeAbortedTxns(nil, es)
	key := pk.objectKey(meta, txnIndexExt)
	if int64(len(b)) > maxWholeObject {
		return fmt.Errorf("tiering: %s would be %d bytes, over the %d a whole-object read takes: %w", key, len(b), maxWholeObject, ErrTooLarge)
	}
	if err := t.store.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
		return fmt.Errorf("tiering: upload %s: %w", key, err)
	}
	t.uploadedBytes.Add(int64(len(b)))
	meta.TxnIndexBytes, meta.TxnIndexCRC32C = int64(len(b)), crc32.Checksum(b, castagnoli)
	return nil
}

// segmentAborted returns local segment s's aborted-transaction entries
// whose ABORT marker is at or after from: all of them for the segment
// itself (from is its base), those of the part past from for a segment
// uploaded from there (uploadSuffix: the earlier markers are in the
// previous leader's upload).
func segmentAborted(lp *log.Partition, s log.SegmentInfo, from int64) ([]log.AbortedTxn, error) {
	if s.TxnIndexPath == "" {
		return nil, nil
	}
	es, err := lp.SegmentAbortedTxns(s.Base)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(es, func(a log.AbortedTxn) bool { return a.LastOffset < from }), nil
}

// localTxnIndex is the size and CRC-32C of the encoding of a local
// segment's entries from offset from (0, 0 if none), computed without
// building it.
func localTxnIndex(lp *log.Partition, s log.SegmentInfo, from int64) (int64, uint32, error) {
	es, err := segmentAborted(lp, s, from)
	if err != nil || len(es) == 0 {
		return 0, 0, err
	}
	var crc uint32
	var buf [txnEntryBytes]byte
	for i := range es {
		crc = crc32.Update(crc, castagnoli, log.EncodeAbortedTxns(buf[:0], es[i:i+1]))
	}
	return int64(len(es)) * txnEntryBytes, crc, nil
}

// committedSegment returns the manifest's entry for local segment s, if it
// names it (same offsets and size), or names its tail (a segment a new
// leader uploaded from the bucket's end on: uploadSuffix).
func committedSegment(m *Manifest, s log.SegmentInfo) (int, bool) {
	i, ok := slices.BinarySearchFunc(m.Segments, s.Base, func(sm SegmentMeta, base int64) int { return cmp.Compare(sm.Base, base) })
	if ok {
		return i, m.Segments[i].Next == s.Next && m.Segments[i].Size == s.Size
	}
	// i: the first entry above s.Base.
	return i, i < len(m.Segments) && m.Segments[i].Base < s.Next && m.Segments[i].Next == s.Next && m.Segments[i].Size < s.Size
}

// refreshTxnIndexes re-uploads the aborted-transaction entries of segments
// the manifest names that gained (or changed) entries after their upload:
// an ABORT marker appended just before a roll whose entry was added after
// the segment was sealed and uploaded, or a rebuild after a crash. The
// manifest is committed again if any did; it returns the manifest in force.
func (t *Tier) refreshTxnIndexes(ctx context.Context, pk PartitionKey, lp *log.Partition, m *Manifest) (*Manifest, error) {
	var nm *Manifest
	for _, s := range lp.SealedSegments() {
		if s.TxnIndexPath == "" {
			continue
		}
		i, ok := committedSegment(m, s)
		if !ok {
			continue
		}
		size, crc, err := localTxnIndex(lp, s, m.Segments[i].Base)
		if err != nil {
			return m, err
		}
		if size == m.Segments[i].TxnIndexBytes && (size == 0 || crc == m.Segments[i].TxnIndexCRC32C) {
			continue
		}
		if nm == nil {
			nm = m.clone()
		}
		if err := t.uploadTxnIndex(ctx, pk, lp, s, &nm.Segments[i]); err != nil {
			t.errs.Add(1)
			return m, err
		}
	}
	if nm == nil {
		return m, nil
	}
	if err := t.commit(ctx, pk, nm); err != nil {
		return m, err
	}
	return nm, nil
}

// txnIndexUploaded reports whether the bucket holds local segment s's
// aborted transactions as they are now (ReleaseLocal keeps a segment until
// it does).
func (t *Tier) txnIndexUploaded(m *Manifest, s log.SegmentInfo, lp *log.Partition) bool {
	if s.TxnIndexPath == "" {
		return true
	}
	i, ok := committedSegment(m, s)
	if !ok {
		return s.Next <= lp.LogStartOffset() // released for retention, not for the bucket
	}
	size, crc, err := localTxnIndex(lp, s, m.Segments[i].Base)
	return err == nil && size == m.Segments[i].TxnIndexBytes && (size == 0 || crc == m.Segments[i].TxnIndexCRC32C)
}

// AbortedTxns appends to dst the aborted transactions overlapping [from,
// upper) (LastOffset >= from && FirstOffset < upper) that the bucket's
// indexes hold, with the semantics of log.Partition.AbortedTxns over the
// manifest's segments: from the one holding from (the first if from is
// below them) on, in order, stopping at an entry with LastStableOffset >=
// upper. Segments whose manifest entry has no aborted-transaction index
// cost no GET; the others' are fetched once and cached with the remote
// indexes. The caller adds the local log's (an entry may then come from
// both copies of a segment still local).
func (t *Tier) AbortedTxns(ctx context.Context, pk PartitionKey, dst []log.AbortedTxn, from, upper int64) ([]log.AbortedTxn, error) {
	n0 := len(dst)
	out, _, err := t.abortedTxns(ctx, pk, dst, from, upper)
	if err != nil {
		return dst[:n0], err
	}
	return out, nil
}

// AbortedTxnsNoWait is AbortedTxns for a fetch, which must not stall on
// the bucket (as ReadNoWait): if the manifest or a segment's remote
// aborted-transaction index is not cached yet, its download starts in the
// background and wait is closed when it ends (call again then); dst comes
// back as it was. The read after a background download failed gets its
// error once.
func (t *Tier) AbortedTxnsNoWait(ctx context.Context, pk PartitionKey, dst []log.AbortedTxn, from, upper int64) (out []log.AbortedTxn, wait <-chan struct{}, err error) {
	n0 := len(dst)
	out, _, err = t.abortedTxns(context.WithValue(ctx, noWaitKey{}, true), pk, dst, from, upper)
	var nr *NotReadyError
	if errors.As(err, &nr) {
		return dst[:n0], nr.Wait, nil
	}
	if err != nil {
		return dst[:n0], nil, err
	}
	return out, nil, nil
}

// abortedTxns is AbortedTxns; complete reports that an entry stopped the
// search (no later segment, local ones included, can add to it).
func (t *Tier) abortedTxns(ctx context.Context, pk PartitionKey, dst []log.AbortedTxn, from, upper int64) (_ []log.AbortedTxn, complete bool, _ error) {
	err := t.noWaitLoad(ctx, chunkID{pk.manifestKey(), -1}, func() bool { return t.ManifestCached(pk) }, func(ctx context.Context) error {
		_, err := t.Manifest(ctx, pk)
		return err
	})
	var m *Manifest
	if err == nil {
		m, err = t.Manifest(ctx, pk)
	}
	if err != nil {
		return dst, false, err
	}
	i := sort.Search(len(m.Segments), func(i int) bool { return m.Segments[i].Next > from })
	for ; i < len(m.Segments); i++ {
		s := &m.Segments[i]
		if s.TxnIndexBytes == 0 {
			continue
		}
		b, err := t.txnIndex(ctx, pk, s)
		if err != nil {
			return dst, false, err
		}
		if dst, complete = log.CollectAbortedTxns(dst, b, from, upper); complete {
			return dst, true, nil
		}
	}
	return dst, false, nil
}

// txnIndex returns a segment's remote aborted-transaction index, from the
// index cache or the bucket (under a no-wait context: a *NotReadyError and
// a background download instead).
func (t *Tier) txnIndex(ctx context.Context, pk PartitionKey, s *SegmentMeta) ([]byte, error) {
	key := pk.objectKey(s, txnIndexExt)
	if b, ok := t.cachedTxnIndex(key, s); ok {
		return b, nil
	}
	if ctx.Value(noWaitKey{}) != nil {
		sm := *s // the background load outlives the caller's manifest copy
		err := t.noWaitLoad(ctx, chunkID{key, -1}, func() bool {
			_, ok := t.cachedTxnIndex(key, &sm)
			return ok
		}, func(ctx context.Context) error {
			_, err := t.fetchTxnIndex(ctx, key, &sm)
			return err
		})
		if err != nil {
			return nil, err
		}
		if b, ok := t.cachedTxnIndex(key, s); ok {
			return b, nil
		}
		// Evicted right after it arrived: fetched here (small).
	}
	return t.fetchTxnIndex(ctx, key, s)
}

// cachedTxnIndex returns the cached index object of s if it is the one the
// manifest names (a re-upload changes size or checksum).
func (t *Tier) cachedTxnIndex(key string, s *SegmentMeta) ([]byte, bool) {
	t.mu.Lock()
	b, ok := t.indexes.get(key)
	t.mu.Unlock()
	if !ok || int64(len(b)) != s.TxnIndexBytes || crc32.Checksum(b, castagnoli) != s.TxnIndexCRC32C {
		return nil, false
	}
	return b, true
}

// fetchTxnIndex downloads a segment's aborted-transaction index, checks it
// against the manifest and caches it. Unlike the offset index it is not
// optional: a missing or damaged one is an error (a read_committed
// consumer must not be shown an aborted transaction as committed).
func (t *Tier) fetchTxnIndex(ctx context.Context, key string, s *SegmentMeta) ([]byte, error) {
	t.gets.Add(1)
	b, err := t.store.GetRange(ctx, key, 0, -1)
	if err != nil {
		t.errs.Add(1)
		return nil, fmt.Errorf("tiering: aborted-transaction index %s: %w", key, err)
	}
	t.downloadedBytes.Add(int64(len(b)))
	if int64(len(b)) != s.TxnIndexBytes || crc32.Checksum(b, castagnoli) != s.TxnIndexCRC32C {
		t.errs.Add(1)
		return nil, fmt.Errorf("tiering: aborted-transaction index %s: %d bytes, CRC-32C %08x; the manifest says %d bytes, %08x",
			key, len(b), crc32.Checksum(b, castagnoli), s.TxnIndexBytes, s.TxnIndexCRC32C)
	}
	t.mu.Lock()
	t.indexes.put(key, b)
	t.mu.Unlock()
	return b, nil
}

// SafeToRelease reports whether local segment s of lp may be deleted
// because the bucket holds all of it: the segment (manifest m) and its
// aborted-transaction index as it is locally.
func (t *Tier) SafeToRelease(m *Manifest, s log.SegmentInfo, lp *log.Partition) bool {
	return t.releasable(m, s, lp) && t.txnIndexUploaded(m, s, lp)
}
