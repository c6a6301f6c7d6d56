package tiering

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/synapsebroker/synapse/log"
)

// chunkSize is the alignment of cold-read ranged GETs: a read fetches the
// aligned chunks covering what it needs, never a whole segment for a small
// read, and sequential catch-up reads hit the cache for the rest of a chunk.
const chunkSize = 8 << 20

// ErrOffsetNotTiered means the offset is not in any uploaded segment.
var ErrOffsetNotTiered = errors.New("tiering: offset not in the bucket")

// Read returns whole batches from the bucket starting with the batch that
// contains offset (always that batch, then more while they fit maxBytes),
// each CRC-checked: a corrupt object is an error (and its chunks are dropped
// from the cache so the next read fetches them again), never garbage. It
// also returns the offset after the last batch returned.
func (t *Tier) Read(ctx context.Context, pk PartitionKey, offset, maxBytes int64) ([]byte, int64, error) {
	return t.AppendRead(ctx, nil, pk, offset, maxBytes)
}

// AppendRead is Read appending to dst (which a caller may pool).
func (t *Tier) AppendRead(ctx context.Context, dst []byte, pk PartitionKey, offset, maxBytes int64) ([]byte, int64, error) {
	m, err := t.Manifest(ctx, pk)
	if err != nil {
		return nil, 0, err
	}
	offset = max(offset, m.LogStartOffset)
	i := -1
	for j := range m.Segments {
		if s := &m.Segments[j]; s.Base <= offset && offset < s.Next {
			i = j
			break
		}
	}
	if i < 0 {
		return nil, 0, ErrOffsetNotTiered
	}
	var total int64
	for _, s := range m.Segments[i:] {
		total += s.Size
	}
	out := dst[:0]
	if int64(cap(out)) < min(maxBytes, total) {
		out = make([]byte, 0, min(maxBytes, total))
	}
	next := offset
	// Whole batches from the segment holding offset, then from the
	// following segments while the budget lasts.
	for ; i < len(m.Segments); i++ {
		seg := &m.Segments[i]
		if i+1 < len(m.Segments) {
			// A catch-up reader reaches the next segment soon: start it.
			t.prefetch(pk.segmentKey(m.Segments[i+1].Base, ".log"), m.Segments[i+1].Size, 0)
		}
		full, err := t.readSegment(ctx, pk, seg, next, maxBytes, &out, &next)
		var nr *NotReadyError
		if errors.As(err, &nr) && len(out) > 0 {
			return out, next, nil // what was ready; the rest is on its way
		}
		if err != nil {
			return nil, 0, err
		}
		if full {
			break
		}
	}
	return out, next, nil
}

// readSegment appends whole batches of seg from the one holding *next on,
// while they fit maxBytes (the first batch of the read always goes). It
// reports whether the budget is spent.
func (t *Tier) readSegment(ctx context.Context, pk PartitionKey, seg *SegmentMeta, offset, maxBytes int64, out *[]byte, next *int64) (bool, error) {
	key := pk.segmentKey(seg.Base, ".log")
	pos := int64(0)
	if offset > seg.Base {
		pos = log.IndexLookup(t.index(ctx, pk, seg.Base), seg.Base, offset)
	}
	var hbuf [log.BatchHeaderSize]byte
	for pos < seg.Size {
		hdr, err := t.appendAt(ctx, hbuf[:0], key, seg.Size, pos, log.BatchHeaderSize)
		if err != nil {
			return false, err
		}
		h, err := log.ParseBatchHeader(hdr)
		if err != nil || pos+int64(h.Length) > seg.Size {
			t.cache.dropKey(key)
			return false, fmt.Errorf("tiering: %s at byte %d: bad batch header: %v", key, pos, err)
		}
		if h.LastOffset() < offset {
			pos += int64(h.Length)
			continue
		}
		if len(*out) > 0 && int64(len(*out))+int64(h.Length) > maxBytes {
			return true, nil
		}
		start := len(*out)
		b, err := t.appendAt(ctx, *out, key, seg.Size, pos, int64(h.Length))
		if err != nil {
			*out = (*out)[:start] // keep the whole batches read so far
			return false, err
		}
		*out = b
		if !log.VerifyBatch((*out)[start:], &h) {
			t.cache.dropKey(key)
			t.errs.Add(1)
			return false, fmt.Errorf("tiering: %s at byte %d: crc mismatch in batch %d", key, pos, h.BaseOffset)
		}
		*next = h.NextOffset()
		pos += int64(h.Length)
		if int64(len(*out)) >= maxBytes {
			return true, nil
		}
	}
	return false, nil
}

// index returns the remote .index object of a segment (nil if missing).
func (t *Tier) index(ctx context.Context, pk PartitionKey, base int64) []byte {
	key := pk.segmentKey(base, ".index")
	t.mu.Lock()
	b, ok := t.indexes.get(key)
	t.mu.Unlock()
	if ok {
		return b
	}
	b, err := t.store.GetRange(ctx, key, 0, -1)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil // transient: scan from the segment start this time, ask again next time
	}
	t.downloadedBytes.Add(int64(len(b)))
	t.mu.Lock()
	t.indexes.put(key, b) // nil for a missing index: derived data, a scan works
	t.mu.Unlock()
	return b
}

// readAt returns n bytes of an object at pos through the chunk cache.
func (t *Tier) readAt(ctx context.Context, key string, size, pos, n int64) ([]byte, error) {
	return t.appendAt(ctx, make([]byte, 0, n), key, size, pos, n)
}

// appendAt appends n bytes of an object at pos to out, through the chunk
// cache, copying each byte once.
func (t *Tier) appendAt(ctx context.Context, out []byte, key string, size, pos, n int64) ([]byte, error) {
	for n > 0 {
		ci := pos / chunkSize
		c, err := t.chunk(ctx, key, size, ci)
		if err != nil {
			return nil, err
		}
		off := pos - ci*chunkSize
		take := min(n, int64(len(c))-off)
		if take <= 0 {
			return nil, fmt.Errorf("tiering: %s: read past the object at %d", key, pos)
		}
		out = append(out, c[off:off+take]...)
		pos += take
		n -= take
	}
	return out, nil
}

// chunk returns chunk ci of an object, from the cache, from a download
// already in flight, or by downloading it. Each download also starts the
// next readAhead chunks in the background, so a sequential catch-up reader
// finds them ready. Under a no-wait context a missing chunk is not waited
// for: its download starts and a *NotReadyError says what to wait on.
func (t *Tier) chunk(ctx context.Context, key string, size, ci int64) ([]byte, error) {
	if ctx.Value(noWaitKey{}) != nil {
		if c := t.cache.get(key, ci); c != nil {
			t.readAheadFrom(key, size, ci)
			return c, nil
		}
		// The last background download of this chunk failed: say so once
		// (the fetch answers an error instead of staying empty), then the
		// next read starts a new download.
		t.mu.Lock()
		err, failed := t.failed[chunkID{key, ci}]
		delete(t.failed, chunkID{key, ci})
		t.mu.Unlock()
		if failed {
			return nil, err
		}
		return nil, &NotReadyError{Wait: t.startFetch(key, size, ci)}
	}
	c, err := t.fetchChunk(ctx, key, size, ci)
	if err == nil {
		t.readAheadFrom(key, size, ci)
	}
	return c, err
}

func (t *Tier) readAheadFrom(key string, size, ci int64) {
	// Never read so far ahead that the prefetched chunks evict the one being
	// read and the next (a batch may span both): a small cache would thrash.
	n := min(int64(readAhead), t.cache.max/chunkSize-2)
	for ahead := ci + 1; ahead <= ci+n && ahead*chunkSize < size; ahead++ {
		t.prefetch(key, size, ahead)
	}
}

// readAhead is how many chunks past the one read are fetched in advance.
const readAhead = 3

// NotReadyError means a cold read needs a chunk that is still downloading;
// Wait is closed when the download ends (successfully or not).
type NotReadyError struct{ Wait <-chan struct{} }

func (e *NotReadyError) Error() string { return "tiering: chunk still downloading" }

type noWaitKey struct{}

// ReadNoWait is Read for a request that must not stall on the bucket: what
// is cached is returned at once; if the first batch needs a chunk that is not
// cached yet, its download starts and wait is closed when it ends (read
// again then). The broker adds wait to a fetch's long-poll wake-ups, so a
// slow bucket never holds up other partitions of the same fetch.
func (t *Tier) ReadNoWait(ctx context.Context, dst []byte, pk PartitionKey, offset, maxBytes int64) (b []byte, next int64, wait <-chan struct{}, err error) {
	b, next, err = t.AppendRead(context.WithValue(ctx, noWaitKey{}, true), dst, pk, offset, maxBytes)
	var nr *NotReadyError
	if errors.As(err, &nr) {
		return nil, offset, nr.Wait, nil
	}
	return b, next, nil, err
}

func (t *Tier) fetchChunk(ctx context.Context, key string, size, ci int64) ([]byte, error) {
	for {
		if c := t.cache.get(key, ci); c != nil {
			return c, nil
		}
		id := chunkID{key, ci}
		t.mu.Lock()
		wait, busy := t.inflight[id]
		if !busy {
			done := make(chan struct{})
			t.inflight[id] = done
			t.mu.Unlock()
			return t.download(ctx, key, size, ci, done, false)
		}
		t.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if c := t.cache.peek(key, ci); c != nil {
			return c, nil
		}
		// That download failed: try ourselves.
	}
}

// download fetches a chunk registered in inflight under done, caches it and
// closes done. A background download (record) that fails leaves its error
// for the next no-wait read, recorded before done closes.
func (t *Tier) download(ctx context.Context, key string, size, ci int64, done chan struct{}, record bool) (c []byte, err error) {
	defer func() {
		t.mu.Lock()
		delete(t.inflight, chunkID{key, ci})
		if err != nil && record && len(t.failed) < 1024 { // bounded: only the next read needs it
			t.failed[chunkID{key, ci}] = err
		}
		t.mu.Unlock()
		close(done)
	}()
	start := ci * chunkSize
	n := min(chunkSize, size-start)
	c, err = t.store.GetRange(ctx, key, start, n)
	if err != nil {
		t.errs.Add(1)
		return nil, err
	}
	t.downloadedBytes.Add(int64(len(c)))
	t.cache.put(key, ci, c)
	return c, nil
}

// startFetch makes sure a chunk is on its way and returns a channel closed
// when it is cached (or its download failed).
func (t *Tier) startFetch(key string, size, ci int64) <-chan struct{} {
	id := chunkID{key, ci}
	t.mu.Lock()
	if wait, ok := t.inflight[id]; ok {
		t.mu.Unlock()
		return wait
	}
	if t.cache.has(key, ci) {
		t.mu.Unlock()
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	done := make(chan struct{})
	t.inflight[id] = done
	t.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		t.download(ctx, key, size, ci, done, true) // no read-ahead from here: reads drive it
	}()
	return done
}

// prefetch downloads a chunk in the background unless it is cached or on
// its way.
func (t *Tier) prefetch(key string, size, ci int64) {
	if !t.cache.has(key, ci) {
		t.startFetch(key, size, ci)
	}
}

// chunkCache is an LRU of object chunks bounded in bytes, in memory, with
// an optional second level on local disk: chunks evicted from memory spill
// to files under dir (bounded by diskMax, LRU too) and come back from there
// instead of the bucket.
type chunkCache struct {
	mu           sync.Mutex
	max, size    int64
	lru          list.List // of *chunkEntry, front = most recent
	byKey        map[chunkID]*list.Element
	hits, misses int64

	dir               string // "" = no disk level
	diskMax, diskSize int64
	diskLRU           list.List // of *diskEntry
	onDisk            map[chunkID]*list.Element
	seq               int64
}

type chunkID struct {
	key string
	ci  int64
}

type chunkEntry struct {
	id   chunkID
	data []byte
}

type diskEntry struct {
	id   chunkID
	path string
	size int64
}

func newChunkCache(max int64) *chunkCache {
	return &chunkCache{max: max, byKey: map[chunkID]*list.Element{}, onDisk: map[chunkID]*list.Element{}}
}

// setDisk enables the disk level in dir (emptied: cached chunks are
// disposable, and a restart may not trust what a crash left).
func (c *chunkCache) setDisk(dir string, max int64) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dir, c.diskMax = dir, max
	return nil
}

func (c *chunkCache) get(key string, ci int64) []byte {
	c.mu.Lock()
	id := chunkID{key, ci}
	if e, ok := c.byKey[id]; ok {
		c.lru.MoveToFront(e)
		c.hits++
		c.mu.Unlock()
		return e.Value.(*chunkEntry).data
	}
	de, ok := c.onDisk[id]
	if !ok {
		c.misses++
		c.mu.Unlock()
		return nil
	}
	path := de.Value.(*diskEntry).path
	c.mu.Unlock()
	data, err := os.ReadFile(path) // outside the lock
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.misses++
		return nil
	}
	c.hits++
	c.putLocked(id, data)
	return data
}

// has reports whether a chunk is cached at either level.
func (c *chunkCache) has(key string, ci int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := chunkID{key, ci}
	_, mem := c.byKey[id]
	_, disk := c.onDisk[id]
	return mem || disk
}

// peek is get without counting a hit or a miss, memory only.
func (c *chunkCache) peek(key string, ci int64) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[chunkID{key, ci}]; ok {
		return e.Value.(*chunkEntry).data
	}
	return nil
}

func (c *chunkCache) put(key string, ci int64, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(chunkID{key, ci}, data)
}

func (c *chunkCache) putLocked(id chunkID, data []byte) {
	if _, ok := c.byKey[id]; ok {
		return
	}
	c.byKey[id] = c.lru.PushFront(&chunkEntry{id, data})
	c.size += int64(len(data))
	for c.size > c.max {
		e := c.lru.Back()
		ce := e.Value.(*chunkEntry)
		c.lru.Remove(e)
		delete(c.byKey, ce.id)
		c.size -= int64(len(ce.data))
		c.spillLocked(ce)
	}
}

// spillLocked writes an evicted chunk to the disk level. The write happens
// under the lock, but only on eviction, which a cold read has just paid a
// download for.
func (c *chunkCache) spillLocked(ce *chunkEntry) {
	if c.dir == "" || int64(len(ce.data)) > c.diskMax {
		return
	}
	if _, ok := c.onDisk[ce.id]; ok {
		return
	}
	c.seq++
	path := filepath.Join(c.dir, strconv.FormatInt(c.seq, 10))
	if err := os.WriteFile(path, ce.data, 0o644); err != nil {
		return
	}
	c.onDisk[ce.id] = c.diskLRU.PushFront(&diskEntry{ce.id, path, int64(len(ce.data))})
	c.diskSize += int64(len(ce.data))
	for c.diskSize > c.diskMax {
		e := c.diskLRU.Back()
		de := e.Value.(*diskEntry)
		c.diskLRU.Remove(e)
		delete(c.onDisk, de.id)
		c.diskSize -= de.size
		os.Remove(de.path)
	}
}

func (c *chunkCache) dropKey(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, e := range c.byKey {
		if id.key == key {
			c.lru.Remove(e)
			delete(c.byKey, id)
			c.size -= int64(len(e.Value.(*chunkEntry).data))
		}
	}
	for id, e := range c.onDisk {
		if id.key == key {
			de := e.Value.(*diskEntry)
			c.diskLRU.Remove(e)
			delete(c.onDisk, id)
			c.diskSize -= de.size
			os.Remove(de.path)
		}
	}
}

func (c *chunkCache) stats() (int64, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}

// BatchForTimestamp returns the first batch in the bucket (at or after the
// log start) whose max timestamp is >= ts, as stored bytes; nil if no
// uploaded segment has one. The manifest's per-segment max timestamps pick
// the segment; its batch headers are walked through the chunk cache.
func (t *Tier) BatchForTimestamp(ctx context.Context, pk PartitionKey, ts int64) ([]byte, error) {
	m, err := t.Manifest(ctx, pk)
	if err != nil {
		return nil, err
	}
	for _, seg := range m.Segments {
		if seg.MaxTimestamp < ts || seg.Next <= m.LogStartOffset {
			continue
		}
		key := pk.segmentKey(seg.Base, ".log")
		for pos := int64(0); pos < seg.Size; {
			hdr, err := t.readAt(ctx, key, seg.Size, pos, log.BatchHeaderSize)
			if err != nil {
				return nil, err
			}
			h, err := log.ParseBatchHeader(hdr)
			if err != nil || pos+int64(h.Length) > seg.Size {
				return nil, fmt.Errorf("tiering: %s at byte %d: bad batch header: %v", key, pos, err)
			}
			if h.MaxTimestamp >= ts && h.LastOffset() >= m.LogStartOffset {
				b, err := t.readAt(ctx, key, seg.Size, pos, int64(h.Length))
				if err != nil {
					return nil, err
				}
				if !log.VerifyBatch(b, &h) {
					t.cache.dropKey(key)
					return nil, fmt.Errorf("tiering: %s at byte %d: crc mismatch", key, pos)
				}
				return b, nil
			}
			pos += int64(h.Length)
		}
	}
	return nil, nil
}
