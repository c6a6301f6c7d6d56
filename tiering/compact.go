package tiering

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"slices"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
)

// Compaction in the bucket. The log cleaner (log.Partition.Clean) maps the
// keys of the dirty range; segments are then cleaned where they are:
//
//   - a segment the bucket holds and the local disk still has is cleaned
//     locally, like any other; Upload then finds a cleaned local segment
//     whose offsets the manifest covers with other objects, uploads it as
//     a new generation and swaps it in (replaceWithLocal);
//   - a segment only the bucket holds is downloaded through the chunk
//     cache, cleaned into a temporary file, uploaded as a new generation
//     and swapped in (CleanBucket).
//
// Either way the manifest commit is the switch: before it the bucket's log
// is the old objects, after it the new ones; the old objects are deleted
// after it, and CleanOrphans takes what a crash leaves on either side.
// New objects never reuse a key (<base>-<gen>.log): a reader holding the
// old manifest keeps reading the old objects until they are deleted.

// ErrBucketCleanRaced means the manifest changed under a bucket clean (its
// segments went to retention, say): nothing was swapped; the next clean
// starts again.
var ErrBucketCleanRaced = errors.New("tiering: manifest changed during a bucket clean")

// replaceWithLocal swaps the manifest's segments that the cleaned local
// segment seg covers for an upload of it. It returns the new manifest,
// or m itself if seg's offsets do not line up with the manifest's
// segments (then nothing changes and its local copy stays).
func (t *Tier) replaceWithLocal(ctx context.Context, pk PartitionKey, lp *log.Partition, m *Manifest, seg log.SegmentInfo) (*Manifest, error) {
	i, j, ok := m.span(seg.Base, seg.Next)
	if !ok && len(m.Segments) > 0 && seg.Base < m.Segments[0].Base && seg.Next > m.Segments[0].Base {
		// Retention dropped the bucket's first segments since the clean
		// merged them: the cleaned one replaces from the first.
		_, j, ok = m.span(m.Segments[0].Base, seg.Next)
		i = 0
	}
	if !ok {
		if t.committer == nil {
			t.repeat.Warn("cleaned local segment does not line up with the bucket's segments: kept local only",
				zap.String("partition", pk.dir()), zap.Int64("base_offset", seg.Base), zap.Int64("next_offset", seg.Next))
		}
		// (Fenced: a replica's segments end where its own rolls fell, not
		// the uploader's. The bucket's copy stays, cleaned by CleanBucket
		// once the local one is released.)
		return m, nil
	}
	gen := m.Gen + 1
	meta, err := t.uploadSegment(ctx, pk, lp, seg, gen)
	if err != nil {
		t.errs.Add(1)
		return m, err
	}
	return t.swapIn(ctx, pk, m, i, j, meta)
}

// swapIn commits m with its segments [i, j) replaced by meta (uploaded as
// generation meta.Gen), then deletes the replaced segments' objects. On a
// failed commit it returns m.
func (t *Tier) swapIn(ctx context.Context, pk PartitionKey, m *Manifest, i, j int, meta SegmentMeta) (*Manifest, error) {
	nm := m.clone()
	nm.Gen = meta.Gen
	nm.Segments = slices.Concat(nm.Segments[:i], []SegmentMeta{meta}, nm.Segments[j:])
	if err := t.commit(ctx, pk, nm); err != nil {
		return m, err
	}
	t.uploadedSegments.Add(1)
	t.deleteSegments(ctx, pk, m.Segments[i:j])
	return nm, nil
}

// BucketCleanConfig says what CleanBucket keeps: the same as
// log.SegmentCleanConfig, for the bucket's segments.
type BucketCleanConfig struct {
	// Map holds the latest offset of every key of the dirty range; End is
	// where it stops (batches at or past it are not cleaned).
	Map *log.KeyMap
	End int64
	// NowMs and DeleteRetentionMs set and apply delete horizons.
	NowMs, DeleteRetentionMs int64
	// Retain holds the last offsets of batches to keep as headers.
	Retain map[int64]bool
	// SegmentBytes caps the inputs merged into one output.
	SegmentBytes       int64
	IndexIntervalBytes int64
	// Throttle, if set, is called with the bytes about to be read or
	// written (downloads are also paced as cold reads are).
	Throttle func(ctx context.Context, n int) error
	// TempDir holds the cleaned output until it is uploaded.
	TempDir string
}

// BucketCleanResult reports a bucket clean.
type BucketCleanResult struct {
	SegmentsIn, SegmentsOut int
	Swapped                 int // outputs swapped in
	Stats                   log.CleanStats
}

// CleanBucket cleans the segments only the bucket holds (those below the
// local log's start) that start below cfg.End, in groups of at most
// SegmentBytes of input, each swapped in by a manifest commit. A group
// whose single segment would not change is left as it is. Call it where
// no Upload or retention of pk runs (the broker holds the partition's
// tiering lock).
func (t *Tier) CleanBucket(ctx context.Context, pk PartitionKey, lp *log.Partition, cfg BucketCleanConfig) (BucketCleanResult, error) {
	var res BucketCleanResult
	m, err := t.Manifest(ctx, pk)
	if err != nil {
		return res, err
	}
	below := lp.LocalStartOffset()
	var cands []SegmentMeta
	for _, s := range m.OnlyInBucket(below) {
		if s.Base < cfg.End {
			cands = append(cands, s)
		}
	}
	if len(cands) == 0 {
		return res, nil
	}
	// Aborted transactions with data in these segments: indexed in the
	// bucket's segments, or in local ones where their markers landed.
	aborted, err := t.AbortedTxns(ctx, pk, nil, cands[0].Base, below)
	if err != nil {
		return res, err
	}
	if aborted, err = lp.AbortedTxns(aborted, cands[0].Base, below); err != nil {
		return res, err
	}
	spec := log.SegmentCleanConfig{Map: cfg.Map, End: cfg.End, NowMs: cfg.NowMs, DeleteRetentionMs: cfg.DeleteRetentionMs,
		Aborted: aborted, TxnFloor: -1, Retain: cfg.Retain, IndexIntervalBytes: cfg.IndexIntervalBytes, Throttle: cfg.Throttle}
	if cfg.SegmentBytes <= 0 {
		cfg.SegmentBytes = 1 << 30
	}
	for i := 0; i < len(cands); {
		g := []SegmentMeta{cands[i]}
		size := cands[i].Size
		for k := i + 1; k < len(cands) && size+cands[k].Size <= cfg.SegmentBytes && cands[k].Next-cands[i].Base <= math.MaxUint32-1; k++ {
			g = append(g, cands[k])
			size += cands[k].Size
		}
		i += len(g)
		swapped, st, err := t.cleanBucketGroup(ctx, pk, g, spec, cfg.TempDir)
		res.Stats.Add(st)
		res.SegmentsIn += len(g)
		if err != nil {
			return res, err
		}
		if swapped {
			res.SegmentsOut++
			res.Swapped++
		} else {
			res.SegmentsOut += len(g)
		}
	}
	return res, nil
}

// objectReader reads an object through the chunk cache (io.ReaderAt).
type objectReader struct {
	t   *Tier
	ctx context.Context
	o   object
}

func (r *objectReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= r.o.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), r.o.size-off)
	if _, err := r.t.appendAt(r.ctx, p[:0], r.o, off, n); err != nil {
		return 0, err
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// cleanBucketGroup cleans the consecutive bucket segments g into one and
// swaps it in; swapped is false if it would not change anything.
func (t *Tier) cleanBucketGroup(ctx context.Context, pk PartitionKey, g []SegmentMeta, spec log.SegmentCleanConfig, tempDir string) (bool, log.CleanStats, error) {
	inputs := make([]log.SegmentFiles, len(g))
	for k := range g {
		inputs[k] = log.SegmentFiles{Base: g[k].Base, Next: g[k].Next, Size: g[k].Size, Log: &objectReader{t, ctx, segmentObject(pk, &g[k])}}
	}
	f, err := os.CreateTemp(tempDir, "bucket-clean-*.log")
	if err != nil {
		return false, log.CleanStats{}, err
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	out, err := log.CleanSegments(ctx, inputs, f, spec)
	if err != nil {
		return false, log.CleanStats{}, fmt.Errorf("tiering: clean %s at %d: %w", pk.dir(), g[0].Base, err)
	}
	if !out.Changed {
		return false, out.Stats, nil
	}
	m, err := t.Manifest(ctx, pk)
	if err != nil {
		return false, out.Stats, err
	}
	i, j, ok := m.span(out.Base, out.Next)
	if !ok || j-i != len(g) {
		return false, out.Stats, ErrBucketCleanRaced
	}
	for k := range g {
		if s := m.Segments[i+k]; s.Base != g[k].Base || s.Next != g[k].Next || s.Size != g[k].Size || s.CRC32C != g[k].CRC32C || s.Gen != g[k].Gen {
			return false, out.Stats, ErrBucketCleanRaced
		}
	}
	meta := SegmentMeta{Base: out.Base, Next: out.Next, Size: out.Size, MaxTimestamp: out.MaxTimestamp, Gen: m.Gen + 1, Cleaned: true}
	if err := t.fence(pk, &meta); err != nil { // the epoch in its keys (fenced tiering)
		return false, out.Stats, err
	}
	if err := t.putCleaned(ctx, pk, f, out, &meta); err != nil {
		t.errs.Add(1)
		return false, out.Stats, err
	}
	if _, err := t.swapIn(ctx, pk, m, i, j, meta); err != nil {
		return false, out.Stats, err
	}
	t.logger.Info("cleaned bucket segments", zap.String("partition", pk.dir()), zap.Int64("base_offset", out.Base),
		zap.Int64("next_offset", out.Next), zap.Int("segments", len(g)), zap.Int64("bytes_in", out.Stats.BytesRead), zap.Int64("bytes_out", out.Size))
	return true, out.Stats, nil
}

// putCleaned uploads a cleaned output (its .log in f) and its indexes
// under meta's keys, filling in meta's checksums.
func (t *Tier) putCleaned(ctx context.Context, pk PartitionKey, f *os.File, out *log.CleanedSegment, meta *SegmentMeta) error {
	if err := t.putLog(ctx, pk.objectKey(meta, ".log"), f, f.Name(), out.Size, meta, true); err != nil {
		return err
	}
	ix, tix := out.IndexFiles()
	objs := []struct {
		ext  string
		data []byte
	}{{".index", ix}, {".timeindex", tix}}
	if len(out.Aborted) > 0 {
		b := log.EncodeAbortedTxns(nil, out.Aborted)
		objs = append(objs, struct {
			ext  string
			data []byte
		}{txnIndexExt, b})
		meta.TxnIndexBytes, meta.TxnIndexCRC32C = int64(len(b)), crc32.Checksum(b, castagnoli)
	}
	for _, o := range objs {
		key := pk.objectKey(meta, o.ext)
		if err := t.store.Put(ctx, key, bytes.NewReader(o.data), int64(len(o.data))); err != nil {
			return fmt.Errorf("tiering: upload %s: %w", key, err)
		}
		t.uploadedBytes.Add(int64(len(o.data)))
	}
	return nil
}
