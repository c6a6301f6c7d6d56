package tiering

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/synapsebroker/synapse/internal/logrepeat"
	"github.com/synapsebroker/synapse/log"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// PartitionKey names a partition in the bucket.
type PartitionKey struct {
	Topic     string
	TopicID   [16]byte
	Partition int32
}

func (k PartitionKey) dir() string {
	return fmt.Sprintf("%s-%x/%d", k.Topic, k.TopicID, k.Partition)
}

func (k PartitionKey) segmentKey(base int64, ext string) string {
	return fmt.Sprintf("%s/%020d%s", k.dir(), base, ext)
}

// objectKey is the key of a segment's object with extension ext.
func (k PartitionKey) objectKey(s *SegmentMeta, ext string) string {
	if s.Fenced {
		return fmt.Sprintf("%s/%020d-%d-e%d%s", k.dir(), s.Base, s.Gen, s.Epoch, ext)
	}
	if s.Gen == 0 {
		return k.segmentKey(s.Base, ext)
	}
	return fmt.Sprintf("%s/%020d-%d%s", k.dir(), s.Base, s.Gen, ext)
}

func (k PartitionKey) manifestKey() string { return k.dir() + "/manifest.json" }

// Stats are the operator's figures (JSON in /status: snake_case, as every
// JSON the broker serves).
type Stats struct {
	UploadedBytes    int64 `json:"uploaded_bytes"`
	UploadedSegments int64 `json:"uploaded_segments"`
	DownloadedBytes  int64 `json:"downloaded_bytes"`
	CacheHits        int64 `json:"cache_hits"`
	CacheMisses      int64 `json:"cache_misses"`
	Errors           int64 `json:"errors"`
	// ObjectGets counts the GET requests the tier sent to the store:
	// segment chunks, index objects, manifests (after a retry, once).
	ObjectGets int64 `json:"object_gets"`
	// The tail guard (guard.go): the cold-read rate in force (bytes/s, 0:
	// unlimited), tail samples seen and how many were late, windows
	// crowded by CPU pressure, and how many times it lowered the rate.
	ColdRate    int64 `json:"cold_rate_bytes_per_second"`
	TailSamples int64 `json:"tail_samples"`
	TailLate    int64 `json:"tail_late"`
	Crowded     int64 `json:"crowded_windows"`
	Backoffs    int64 `json:"backoffs"`
}

// Tier is a broker's tiered store: uploads, manifests, cold reads.
type Tier struct {
	store  ObjectStore
	logger *zap.Logger
	repeat *logrepeat.Logger // warnings every partition can give on every pass
	cache  *chunkCache

	// committer, if set, holds each partition's commit point (cluster
	// mode: a pointer in etcd, fenced.go); nil: manifest.json in the bucket.
	committer Committer

	mu        sync.Mutex
	manifests map[PartitionKey]*Manifest
	ptrs      map[PartitionKey]committed // with a committer: what each cached manifest was loaded or committed as
	indexes   *indexCache                // remote .index objects by key (LRU, bounded)
	fetchRate *rate.Limiter              // cold-read downloads, bytes/s; nil: unlimited and unguarded
	guard     tailGuard                  // adapts fetchRate's limit to tail traffic
	inflight  map[chunkID]*flight        // chunk downloads under way
	failed    map[chunkID]error          // last background download error, reported once
	demanded  atomic.Int32               // demanded downloads waiting for fetchRate
	readEnds  map[PartitionKey]*readEnds
	// Download slots: at most downloadSlots chunk downloads hold a buffer
	// and a GET at once, read-aheads at most readAheadSlots of them.
	slots, raSlots chan struct{}

	uploadedBytes, uploadedSegments, downloadedBytes, errs, gets atomic.Int64
}

// New returns a Tier over store. cacheBytes bounds the cold-read chunk
// cache (default 256 MiB).
func New(store ObjectStore, logger *zap.Logger, cacheBytes int64) *Tier {
	if logger == nil {
		logger = zap.NewNop()
	}
	if cacheBytes <= 0 {
		cacheBytes = 256 << 20
	}
	t := &Tier{store: store, logger: logger, repeat: logrepeat.New(logger, logrepeat.Options{}), cache: newChunkCache(cacheBytes),
		manifests: map[PartitionKey]*Manifest{}, ptrs: map[PartitionKey]committed{}, indexes: newIndexCache(indexCacheBytes), inflight: map[chunkID]*flight{}, failed: map[chunkID]error{},
		readEnds: map[PartitionKey]*readEnds{}, slots: make(chan struct{}, downloadSlots), raSlots: make(chan struct{}, readAheadSlots)}
	t.SetTailGuard(true)
	return t
}

// SetDiskCache adds a local-disk level of diskBytes under dir (emptied now)
// to the cold-read cache: chunks evicted from memory spill there.
func (t *Tier) SetDiskCache(dir string, diskBytes int64) error {
	return t.cache.setDisk(dir, diskBytes)
}

// SetFetchRate bounds the bytes cold reads download per second (as Kafka's
// remote.log.manager.fetch.max.bytes.per.second, KIP-956): downloads wait
// their turn, so catch-up readers cannot take the machine from the tail's
// producers and consumers. 0 means unlimited. It is the ceiling of the tail
// guard (guard.go). Call before serving.
func (t *Tier) SetFetchRate(bytesPerSec int64) {
	t.guard.mu.Lock()
	defer t.guard.mu.Unlock()
	t.guard.ceiling, t.guard.limit = rate.Inf, 0
	if bytesPerSec > 0 {
		t.guard.ceiling = rate.Limit(bytesPerSec)
	}
	t.fetchRate = nil // a new limiter, starting empty
	t.applyRateLocked()
}

// Store returns the underlying object store.
func (t *Tier) Store() ObjectStore { return t.store }

// Stats returns a snapshot of the counters.
func (t *Tier) Stats() Stats {
	h, m := t.cache.stats()
	st := Stats{UploadedBytes: t.uploadedBytes.Load(), UploadedSegments: t.uploadedSegments.Load(),
		DownloadedBytes: t.downloadedBytes.Load(), CacheHits: h, CacheMisses: m, Errors: t.errs.Load(), ObjectGets: t.gets.Load(),
		ColdRate: t.coldRateInForce()}
	t.guard.mu.Lock()
	st.TailSamples, st.TailLate, st.Crowded, st.Backoffs = t.guard.samplesTotal, t.guard.lateTotal, t.guard.crowded, t.guard.backoffs
	t.guard.mu.Unlock()
	return st
}

// PutMeta writes a small metadata object (the broker's mirrors of topics,
// groups and producer state) to the store, counting a failure among the
// store errors the metrics show.
func (t *Tier) PutMeta(ctx context.Context, key string, b []byte) error {
	if int64(len(b)) > maxWholeObject {
		// It could never be read back: say so now, not at a restore.
		t.errs.Add(1)
		return fmt.Errorf("tiering: %s would be %d bytes, over the %d a whole-object read takes: %w", key, len(b), maxWholeObject, ErrTooLarge)
	}
	err := t.store.Put(ctx, key, bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.errs.Add(1)
	}
	return err
}

// LinksLocalFiles reports whether the store takes uploaded segments by
// hard-linking the local files (the local-directory store): deleting a
// local copy then frees no disk space.
func (t *Tier) LinksLocalFiles() bool {
	s := t.store
	if r, ok := s.(*retryStore); ok {
		s = r.s
	}
	_, ok := s.(FileLinker)
	return ok
}

// ManifestCached reports whether the partition's manifest is in memory
// (Manifest answers without the bucket).
func (t *Tier) ManifestCached(pk PartitionKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.manifests[pk] != nil
}

// Manifest returns the partition's manifest (empty if none was written).
func (t *Tier) Manifest(ctx context.Context, pk PartitionKey) (*Manifest, error) {
	t.mu.Lock()
	m := t.manifests[pk]
	t.mu.Unlock()
	if m != nil {
		return m.clone(), nil
	}
	if t.committer != nil {
		return t.loadFenced(ctx, pk)
	}
	t.gets.Add(1)
	b, err := t.store.GetRange(ctx, pk.manifestKey(), 0, -1)
	switch {
	case errors.Is(err, ErrNotFound):
		m = &Manifest{Version: 1}
	case err != nil:
		t.errs.Add(1)
		return nil, err
	default:
		if m, err = decodeManifest(b); err != nil {
			return nil, err
		}
	}
	return t.cacheManifest(pk, m, nil), nil
}

// cacheManifest caches m as pk's manifest (with ptr, what it was loaded
// as, for fenced tiering) unless one was cached meanwhile, and returns a
// copy of the cached one.
func (t *Tier) cacheManifest(pk PartitionKey, m *Manifest, ptr *committed) *Manifest {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur := t.manifests[pk]; cur != nil {
		return cur.clone()
	}
	t.manifests[pk] = m
	if ptr != nil {
		t.ptrs[pk] = *ptr
	}
	return m.clone()
}

func (t *Tier) commit(ctx context.Context, pk PartitionKey, m *Manifest) error {
	if t.committer != nil {
		// The epoch before the encoding: the key and the manifest carry it.
		e, err := t.committer.Epoch(pk)
		if err != nil {
			return err
		}
		m.Epoch = e
		m.Seq++
	}
	b, err := m.encode()
	if err != nil {
		return err
	}
	if int64(len(b)) > maxWholeObject {
		return fmt.Errorf("tiering: %s: manifest of %d segments is %d bytes, over the %d a whole-object read takes: %w", pk.dir(), len(m.Segments), len(b), maxWholeObject, ErrTooLarge)
	}
	if t.committer != nil {
		return t.commitFenced(ctx, pk, m, b)
	}
	if err := t.store.Put(ctx, pk.manifestKey(), bytes.NewReader(b), int64(len(b))); err != nil {
		// The store may have taken it all the same (an answer lost, a
		// timeout after the write): what the bucket holds is unknown, so
		// the next reader loads it rather than trust the cached one (an
		// orphan sweep against a stale manifest would delete objects the
		// bucket's manifest names).
		t.mu.Lock()
		delete(t.manifests, pk)
		t.mu.Unlock()
		t.errs.Add(1)
		return err
	}
	t.mu.Lock()
	t.manifests[pk] = m.clone()
	t.mu.Unlock()
	return nil
}

// Upload sends the partition's sealed segments that the manifest does not
// name yet, each with its indexes, then commits the manifest. Keys are
// deterministic, so a crash anywhere is repaired by running it again: a
// re-upload overwrites the same objects and only the manifest makes them
// part of the log. It returns the number of segments committed.
func (t *Tier) Upload(ctx context.Context, pk PartitionKey, lp *log.Partition) (int, error) {
	return t.UploadBelow(ctx, pk, lp, math.MaxInt64)
}

// UploadBelow is Upload of the sealed segments that end at or below limit
// (a cluster leader passes its high watermark: nothing a failover could
// truncate goes to the bucket).
func (t *Tier) UploadBelow(ctx context.Context, pk PartitionKey, lp *log.Partition, limit int64) (int, error) {
	m, err := t.Manifest(ctx, pk)
	if err != nil {
		return 0, err
	}
	if m.Next() > lp.LogEndOffset() {
		// Not this log's manifest (another broker's, or from before the
		// local log was lost): nothing is uploaded or released against it.
		return 0, fmt.Errorf("tiering: %s: the bucket's log ends at %d, past the local log's end %d: not this log's manifest", pk.dir(), m.Next(), lp.LogEndOffset())
	}
	if m.LogStartOffset < lp.LogStartOffset() {
		m.LogStartOffset = lp.LogStartOffset()
	}
	if m, err = t.refreshTxnIndexes(ctx, pk, lp, m); err != nil {
		return 0, err
	}
	n := 0
	for _, seg := range lp.SealedSegments() {
		if seg.Size == 0 && !seg.Cleaned {
			continue // an empty segment (a cleaned one may be empty and still covers offsets)
		}
		if seg.Cleaned && seg.Base < m.Next() && !m.Releasable(seg, lp.LogStartOffset()) {
			// The local cleaner rewrote segments the bucket holds: the
			// cleaned one replaces them there too (compact.go).
			nm, err := t.replaceWithLocal(ctx, pk, lp, m, seg)
			if err != nil {
				return n, err
			}
			if nm != m {
				m = nm
				n++
				continue
			}
		}
		if seg.Next <= m.Next() {
			continue
		}
		if seg.Next > limit {
			break // not committed yet
		}
		if t.committer != nil && len(m.Segments) > 0 && seg.Base < m.Next() {
			// A replica's segments end where its own rolls fell: the
			// previous leader's last upload may end inside this one. Its
			// batches from there on go up as a segment of their own.
			meta, err := t.uploadSuffix(ctx, pk, lp, seg, m.Next())
			if err != nil {
				t.errs.Add(1)
				return n, err
			}
			m.Segments = append(m.Segments, meta)
			if err := t.commit(ctx, pk, m); err != nil {
				return n, err
			}
			t.uploadedSegments.Add(1)
			n++
			continue
		}
		if len(m.Segments) > 0 && seg.Base != m.Next() {
			if seg.Base < m.Next() || lp.LogStartOffset() < seg.Base {
				return n, fmt.Errorf("tiering: %s: local segment %d does not continue the bucket's log at %d", pk.dir(), seg.Base, m.Next())
			}
			// DeleteRecords (or retention) removed local segments before
			// they were uploaded: the gap, and everything the bucket holds,
			// is below the log start. Retention drops those segments from
			// the manifest (then deletes their objects), and the bucket's
			// log starts again with this segment.
			if err := t.ApplyRetention(ctx, pk, lp, -1, -1, time.Time{}); err != nil {
				return n, err
			}
			if m, err = t.Manifest(ctx, pk); err != nil {
				return n, err
			}
			if len(m.Segments) > 0 {
				return n, fmt.Errorf("tiering: %s: bucket's log ends at %d, below the log start %d, but was not emptied", pk.dir(), m.Next(), lp.LogStartOffset())
			}
		}
		meta, err := t.uploadSegment(ctx, pk, lp, seg, 0)
		if err != nil {
			t.errs.Add(1)
			return n, err
		}
		if len(m.Segments) == 0 {
			// The bucket's log starts with this segment (records before it
			// are gone everywhere), or later if DeleteRecords moved past it.
			m.LogStartOffset = max(lp.LogStartOffset(), seg.Base)
		}
		m.Segments = append(m.Segments, meta)
		if err := t.commit(ctx, pk, m); err != nil {
			return n, err
		}
		t.uploadedSegments.Add(1)
		n++
	}
	return n, nil
}

// uploadSegment uploads a local sealed segment as generation gen.
func (t *Tier) uploadSegment(ctx context.Context, pk PartitionKey, lp *log.Partition, seg log.SegmentInfo, gen int64) (SegmentMeta, error) {
	meta := SegmentMeta{Base: seg.Base, Next: seg.Next, Size: seg.Size, MaxTimestamp: seg.MaxTimestamp, Gen: gen, Cleaned: seg.Cleaned}
	if err := t.fence(pk, &meta); err != nil {
		return meta, err
	}
	for _, f := range []struct {
		path, ext string
		main      bool
	}{{seg.IndexPath, ".index", false}, {seg.TimeIndexPath, ".timeindex", false}, {seg.LogPath, ".log", true}} {
		file, err := lp.OpenSegmentFile(f.path)
		if err != nil {
			if !f.main {
				continue // indexes are derived; a cold read falls back to a scan
			}
			return meta, err
		}
		size, err := file.Size()
		if err == nil && f.main {
			size = seg.Size // only whole batches: the sealed size
		}
		if err != nil {
			file.Close()
			return meta, err
		}
		key := pk.objectKey(&meta, f.ext)
		if f.main {
			err = t.putLog(ctx, key, file, f.path, size, &meta, true)
		} else {
			if err = t.store.Put(ctx, key, io.NewSectionReader(file, 0, size), size); err == nil {
				t.uploadedBytes.Add(size)
			} else {
				err = fmt.Errorf("tiering: upload %s: %w", key, err)
			}
		}
		file.Close()
		if err != nil {
			return meta, err
		}
	}
	if err := t.uploadTxnIndex(ctx, pk, lp, seg, &meta); err != nil {
		return meta, err
	}
	return meta, nil
}

// putLog uploads a segment's .log (size bytes of r, the file at path) as
// key, setting meta's whole-object and per-chunk CRC-32Cs.
func (t *Tier) putLog(ctx context.Context, key string, r io.ReaderAt, path string, size int64, meta *SegmentMeta, link bool) error {
	// The checksum in a pass of its own (a sealed segment never changes),
	// so the upload body stays seekable and a transient failure is
	// retried in this pass. The same pass sums each chunk, for cold reads
	// to verify every download.
	h := crc32.New(castagnoli)
	meta.ChunkBytes = chunkSize
	meta.ChunkCRC32C = meta.ChunkCRC32C[:0]
	for off := int64(0); off < size; off += chunkSize {
		ch := crc32.New(castagnoli)
		if _, err := io.Copy(io.MultiWriter(h, ch), io.NewSectionReader(r, off, min(chunkSize, size-off))); err != nil {
			return fmt.Errorf("tiering: checksum %s: %w", path, err)
		}
		meta.ChunkCRC32C = append(meta.ChunkCRC32C, ch.Sum32())
	}
	meta.CRC32C = h.Sum32()
	// A local-directory store on the same file system takes the sealed
	// file by a hard link instead of a copy.
	if l, ok := t.store.(FileLinker); ok && link && l.LinkFile(ctx, key, path, size) == nil {
		t.uploadedBytes.Add(size)
		return nil
	}
	if err := t.store.Put(ctx, key, &crc32cBody{io.NewSectionReader(r, 0, size), meta.CRC32C}, size); err != nil {
		return fmt.Errorf("tiering: upload %s: %w", key, err)
	}
	t.uploadedBytes.Add(size)
	return nil
}

// crc32cBody is an upload body whose CRC-32C is already known (the
// segment's checksum pass): a store that sends checksums with objects (S3)
// uses it instead of computing it again. It stays seekable for retries.
type crc32cBody struct {
	*io.SectionReader
	sum uint32
}

// ReleaseLocal deletes local copies of uploaded segments that fall outside
// the local hot budget: keepBytes of newest local data (< 0: no byte bound)
// and keepMs of age by max timestamp (< 0: no age bound). With both bounds
// off nothing is released. It returns the number of local segments deleted.
func (t *Tier) ReleaseLocal(ctx context.Context, pk PartitionKey, lp *log.Partition, keepBytes, keepMs int64, now time.Time) (int, error) {
	return t.ReleaseLocalBelow(ctx, pk, lp, keepBytes, keepMs, now, math.MaxInt64, nil)
}

// ReleaseLocalBelow is ReleaseLocal releasing only segments that end at or
// below stable: the broker passes the partition's last stable offset, so
// records of an open transaction stay local, where a read_committed fetch
// is bounded at the LSO (a cold read returns whole cached batches, past
// any bound). before, if not nil, runs just before segments are deleted; its
// error stops the release.
func (t *Tier) ReleaseLocalBelow(ctx context.Context, pk PartitionKey, lp *log.Partition, keepBytes, keepMs int64, now time.Time, stable int64, before func() error) (int, error) {
	if keepBytes < 0 && keepMs < 0 {
		return 0, nil
	}
	m, err := t.Manifest(ctx, pk)
	if err != nil {
		return 0, err
	}
	sealed := lp.SealedSegments()
	var local int64
	for _, s := range sealed {
		local += s.Size
	}
	cut := int64(-1)
	for _, s := range sealed {
		if !t.releasable(m, s, lp) || !t.txnIndexUploaded(m, s, lp) {
			break // not in the bucket yet (or its aborted transactions are not): never released
		}
		if s.Next > stable {
			break // holds records of an open transaction
		}
		overBytes := keepBytes >= 0 && local > keepBytes
		tooOld := keepMs >= 0 && s.MaxTimestamp >= 0 && now.UnixMilli()-s.MaxTimestamp > keepMs
		if !overBytes && !tooOld {
			break
		}
		local -= s.Size
		cut = s.Next
	}
	if cut < 0 {
		return 0, nil
	}
	if before != nil {
		if err := before(); err != nil {
			return 0, err
		}
	}
	return lp.DeleteLocalBefore(cut)
}

// ApplyRetention enforces the whole-log retention (local + remote): the
// oldest remote segments past retentionBytes (over the whole log) or
// retentionMs go; the manifest drops them first, then the log start moves,
// then the objects are deleted. DeleteRecords' log start is applied too.
func (t *Tier) ApplyRetention(ctx context.Context, pk PartitionKey, lp *log.Partition, retentionBytes, retentionMs int64, now time.Time) error {
	m, err := t.Manifest(ctx, pk)
	if err != nil || len(m.Segments) == 0 {
		return err
	}
	var total int64
	for _, s := range m.Segments {
		total += s.Size
	}
	for _, s := range lp.SealedSegments() {
		if s.Base >= m.Next() {
			total += s.Size
		}
	}
	start := max(m.LogStartOffset, lp.LogStartOffset())
	drop := 0
	for drop < len(m.Segments) {
		s := m.Segments[drop]
		expired := retentionMs >= 0 && s.MaxTimestamp >= 0 && now.UnixMilli()-s.MaxTimestamp > retentionMs
		oversize := retentionBytes >= 0 && total-s.Size >= retentionBytes
		below := s.Next <= start
		if !expired && !oversize && !below {
			break
		}
		total -= s.Size
		start = max(start, s.Next)
		drop++
	}
	if drop == 0 && start == m.LogStartOffset {
		// Nothing new to drop; but a pass cut short after its manifest
		// commit may have left the local log start behind: finish it.
		if ls := lp.LogStartOffset(); ls < m.LogStartOffset && m.LogStartOffset <= lp.HighWatermark() {
			_, err := lp.DeleteRecordsBefore(m.LogStartOffset)
			return err
		}
		return nil
	}
	gone := m.Segments[:drop]
	nm := m.clone()
	nm.Segments = nm.Segments[drop:]
	nm.LogStartOffset = start
	if err := t.commit(ctx, pk, nm); err != nil {
		return err
	}
	if start > lp.LogStartOffset() && start <= lp.HighWatermark() {
		if _, err := lp.DeleteRecordsBefore(start); err != nil {
			return err
		}
	}
	t.deleteSegments(ctx, pk, gone)
	return nil
}

// deleteSegments deletes the objects of segments a manifest commit no
// longer names (best effort: CleanOrphans takes what a failure leaves).
func (t *Tier) deleteSegments(ctx context.Context, pk PartitionKey, gone []SegmentMeta) {
	for i := range gone {
		s := &gone[i]
		exts := []string{".log", ".index", ".timeindex", txnIndexExt}
		if s.TxnIndexBytes == 0 {
			exts = exts[:3] // none uploaded: no request for it (CleanOrphans takes a stray one)
		}
		for _, ext := range exts {
			key := pk.objectKey(s, ext)
			if err := t.store.Delete(ctx, key); err != nil {
				t.errs.Add(1)
				// Every object of every partition while the bucket
				// refuses deletes: counted per minute.
				t.repeat.Warn("delete object no manifest names", zap.String("key", key), zap.Error(err))
			}
		}
		t.cache.dropKey(pk.objectKey(s, ".log"))
		t.mu.Lock()
		for _, ext := range []string{".index", ".timeindex", txnIndexExt} {
			t.indexes.drop(pk.objectKey(s, ext))
		}
		t.mu.Unlock()
	}
}

// Forget drops cached state of a deleted partition and deletes its objects.
func (t *Tier) Forget(ctx context.Context, pk PartitionKey) error {
	t.mu.Lock()
	delete(t.manifests, pk)
	delete(t.readEnds, pk)
	t.indexes.dropPrefix(pk.dir() + "/")
	t.mu.Unlock()
	keys, err := t.store.List(ctx, pk.dir()+"/")
	if err != nil {
		return err
	}
	// The manifest first, so a crash part way leaves no manifest naming
	// missing objects.
	if err := t.store.Delete(ctx, pk.manifestKey()); err != nil {
		return err
	}
	for _, k := range keys {
		if k != pk.manifestKey() {
			if err := t.store.Delete(ctx, k); err != nil {
				return err
			}
		}
	}
	return nil
}

// AbortUploads ends the incomplete uploads an interrupted Put left in the
// store (S3 multipart uploads), if the store has such things. Call it only
// while no Upload runs (the broker's orphan sweep does). It returns how
// many were aborted.
func (t *Tier) AbortUploads(ctx context.Context) (int, error) {
	a, ok := t.store.(UploadAborter)
	if !ok {
		return 0, nil
	}
	n, err := a.AbortUploads(ctx)
	if err != nil {
		t.errs.Add(1)
	}
	return n, err
}

// CleanOrphans deletes segment objects of pk that its manifest does not
// name and that no upload can still be writing: leftovers of an upload cut
// short before its manifest commit, or of a retention pass cut short after
// it. Call it when no Upload of pk runs (the broker does at start-up). It
// returns the number of objects deleted.
func (t *Tier) CleanOrphans(ctx context.Context, pk PartitionKey) (int, error) {
	if t.committer != nil {
		return t.cleanOrphansFenced(ctx, pk)
	}
	m, err := t.Manifest(ctx, pk)
	if err != nil {
		return 0, err
	}
	return t.sweep(ctx, pk, m, "", 0)
}

// sweep deletes pk's objects m does not name (nor the committed manifest
// key ckey); with fenced tiering, only objects of epoch own or before,
// and no manifest newer than m.
func (t *Tier) sweep(ctx context.Context, pk PartitionKey, m *Manifest, ckey string, own int32) (int, error) {
	keys, err := t.store.List(ctx, pk.dir()+"/")
	if err != nil {
		t.errs.Add(1)
		return 0, err
	}
	named := map[string]bool{pk.manifestKey(): true, ckey: true}
	for _, s := range m.Segments {
		for _, ext := range []string{".log", ".index", ".timeindex", txnIndexExt} {
			named[pk.objectKey(&s, ext)] = true
		}
	}
	n := 0
	for _, k := range keys {
		if named[k] {
			continue
		}
		if t.committer != nil && !sweepable(k, own, m) {
			continue
		}
		if err := t.store.Delete(ctx, k); err != nil {
			t.errs.Add(1)
			return n, err
		}
		n++
	}
	return n, nil
}
