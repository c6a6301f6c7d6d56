package tiering

import (
	"container/list"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// chunkCache is an LRU of object chunks bounded in bytes, in memory, with
// an optional second level on local disk: chunks evicted from memory spill
// to files under dir (bounded by diskMax, LRU too) and come back from there
// instead of the bucket.
//
// Chunk memory is recycled (chunkFree): an entry is reference-counted by
// the readers copying from it, and its buffer goes back to the pool only
// when it has left the cache and the last reader released it. Spilling to
// disk happens outside the lock.
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
	drops             int64 // dropKey calls: a spill that began before one is discarded
}

type chunkID struct {
	key string
	ci  int64
}

// chunkEntry is a cached chunk. refs, gone and unread are guarded by
// chunkCache.mu.
type chunkEntry struct {
	id       chunkID
	data     []byte  // (*buf)[:n]
	buf      *[]byte // from getChunkBuf
	verified bool    // data matched the manifest's chunk checksum
	sum      uint32  // CRC-32C of data
	refs     int     // holders: readers, and a spill in progress
	gone     bool    // out of the cache: the buffer is recycled at refs 0
	unread   bool    // put by a read-ahead, not read since
}

type diskEntry struct {
	id       chunkID
	path     string
	size     int64
	verified bool   // as the chunkEntry spilled
	sum      uint32 // checked again when the file is read back
}

// chunkFree recycles chunk buffers (chunkSize each), so a download costs no
// fresh memory to fault in and clear. It is a bounded free list rather than
// a sync.Pool, which every GC cycle empties; at most 4 idle buffers (32 MiB)
// stay beyond the cache's budget.
var chunkFree = make(chan *[]byte, 4)

func getChunkBuf() *[]byte {
	select {
	case b := <-chunkFree:
		return b
	default:
		b := make([]byte, chunkSize)
		return &b
	}
}

func putChunkBuf(b *[]byte) {
	select {
	case chunkFree <- b:
	default:
	}
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

// get returns a cached chunk with a reference the caller releases, or nil.
// A chunk on the disk level is read back into memory.
func (c *chunkCache) get(key string, ci int64) *chunkEntry { return c.lookup(key, ci, true) }

// lookupMemory is get of the memory level only; a miss is not counted (the
// caller goes on to get, which counts it).
func (c *chunkCache) lookupMemory(key string, ci int64) *chunkEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.memoryLocked(chunkID{key, ci}, true)
}

// memoryLocked returns chunk id from the memory level with a reference, as
// the most recently used, counting a hit if count; nil if it is not there.
func (c *chunkCache) memoryLocked(id chunkID, count bool) *chunkEntry {
	el, ok := c.byKey[id]
	if !ok {
		return nil
	}
	c.lru.MoveToFront(el)
	if count {
		c.hits++
	}
	e := el.Value.(*chunkEntry)
	e.refs++
	e.unread = e.unread && !count
	return e
}

// lookup is get, counting the hit or miss if count (a read-ahead does not).
func (c *chunkCache) lookup(key string, ci int64, count bool) *chunkEntry {
	n := int64(0) // added to the hit or the miss count
	if count {
		n = 1
	}
	c.mu.Lock()
	id := chunkID{key, ci}
	if e := c.memoryLocked(id, count); e != nil {
		c.mu.Unlock()
		return e
	}
	de, ok := c.onDisk[id]
	if !ok {
		c.misses += n
		c.mu.Unlock()
		return nil
	}
	d := *de.Value.(*diskEntry)
	drops := c.drops
	c.mu.Unlock()
	buf := getChunkBuf()
	err := readChunkFile(d.path, (*buf)[:d.size]) // outside the lock
	if err == nil && crc32cYielding(0, (*buf)[:d.size]) != d.sum {
		err = errors.New("tiering: cached chunk file changed on disk")
	}
	if err != nil {
		putChunkBuf(buf)
		c.mu.Lock()
		c.misses += n
		if el, ok := c.onDisk[id]; ok && el.Value.(*diskEntry).path == d.path {
			c.forgetDiskLocked(el)
		}
		c.mu.Unlock()
		return nil
	}
	c.mu.Lock()
	if c.drops != drops { // the object was found corrupt meanwhile
		c.misses += n
		c.mu.Unlock()
		putChunkBuf(buf)
		return nil
	}
	c.hits += n
	c.mu.Unlock()
	e := c.put(key, ci, buf, d.size, d.verified, d.sum, true)
	if !count {
		c.mu.Lock()
		e.unread = true // brought back by a read-ahead
		c.mu.Unlock()
	}
	return e
}

func readFileInto(path string, dst []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.ReadFull(f, dst)
	return err
}

// inMemory reports whether a chunk is in the memory level.
func (c *chunkCache) inMemory(key string, ci int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.byKey[chunkID{key, ci}]
	return ok
}

// peek is get without counting a hit or a miss, memory only.
func (c *chunkCache) peek(key string, ci int64) *chunkEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[chunkID{key, ci}]; ok {
		e := el.Value.(*chunkEntry)
		e.refs++
		e.unread = false
		return e
	}
	return nil
}

// put caches the first n bytes of buf (which the cache now owns) as chunk
// ci of key, with its checksum sum (verified: against the manifest's), and
// returns the entry, with a reference for the caller if ref (else nil). A
// chunk already cached keeps its entry and buf is recycled.
func (c *chunkCache) put(key string, ci int64, buf *[]byte, n int64, verified bool, sum uint32, ref bool) *chunkEntry {
	c.mu.Lock()
	id := chunkID{key, ci}
	var e *chunkEntry
	if el, ok := c.byKey[id]; ok {
		e = el.Value.(*chunkEntry)
		e.unread = e.unread && !ref
		putChunkBuf(buf)
	} else {
		e = &chunkEntry{id: id, data: (*buf)[:n], buf: buf, verified: verified, sum: sum, unread: !ref}
		c.byKey[id] = c.lru.PushFront(e)
		c.size += n
	}
	if ref {
		e.refs++
	}
	var spill []*chunkEntry
	drops := c.drops
	for c.size > c.max {
		old := c.evictLocked(c.victimLocked())
		if c.dir != "" && alignUp(int64(len(old.data))) <= c.diskMax && c.onDisk[old.id] == nil {
			old.refs++ // held by the spill below
			spill = append(spill, old)
		} else {
			c.recycleLocked(old)
		}
	}
	c.mu.Unlock()
	for _, old := range spill {
		c.spill(old, drops)
		c.release(old)
	}
	if !ref {
		return nil
	}
	return e
}

// victimLocked picks the entry to evict: among the few least recent, the
// least recent one that is on the disk level already and not being read
// (dropping it costs no write) nor waiting to be (a read-ahead just brought
// it back: in a small cache it would be evicted before it is read), else
// the least recent. A sequential pass
// over more than the memory level (a second catch-up) then cycles through
// chunks that are on disk instead of spilling, one by one, every chunk the
// last pass left in memory just before reading it back.
func (c *chunkCache) victimLocked() *list.Element {
	const window = 8
	el := c.lru.Back()
	for i, cand := 0, el; i < window && cand != nil; i, cand = i+1, cand.Prev() {
		if e := cand.Value.(*chunkEntry); e.refs == 0 && !e.unread && c.onDisk[e.id] != nil {
			return cand
		}
	}
	return el
}

// release drops a reference taken by get, peek or put.
func (c *chunkCache) release(e *chunkEntry) {
	c.mu.Lock()
	e.refs--
	c.recycleLocked(e)
	c.mu.Unlock()
}

func (c *chunkCache) recycleLocked(e *chunkEntry) {
	if e.gone && e.refs == 0 && e.buf != nil {
		putChunkBuf(e.buf)
		e.buf, e.data = nil, nil
	}
}

// spill writes an evicted chunk to the disk level (not under the lock: the
// entry is held by a reference meanwhile). drops is c.drops at eviction: a
// corrupt object's chunks dropped since must not come back from disk.
func (c *chunkCache) spill(e *chunkEntry, drops int64) {
	c.mu.Lock()
	c.seq++
	path := filepath.Join(c.dir, strconv.FormatInt(c.seq, 10))
	c.mu.Unlock()
	if err := writeChunkFile(path, e.data); err != nil {
		os.Remove(path)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.onDisk[e.id] != nil || c.drops != drops {
		os.Remove(path) // spilled twice meanwhile (evicted again after a reload), or dropped
		return
	}
	c.onDisk[e.id] = c.diskLRU.PushFront(&diskEntry{e.id, path, int64(len(e.data)), e.verified, e.sum})
	c.diskSize += alignUp(int64(len(e.data)))
	for c.diskSize > c.diskMax {
		c.forgetDiskLocked(c.diskLRU.Back())
	}
}

// evictLocked takes a chunk out of the memory level; its buffer is
// recycled once nothing holds it.
func (c *chunkCache) evictLocked(el *list.Element) *chunkEntry {
	e := el.Value.(*chunkEntry)
	c.lru.Remove(el)
	delete(c.byKey, e.id)
	c.size -= int64(len(e.data))
	e.gone = true
	return e
}

// forgetDiskLocked takes a chunk off the disk level and deletes its file.
func (c *chunkCache) forgetDiskLocked(el *list.Element) {
	de := el.Value.(*diskEntry)
	c.diskLRU.Remove(el)
	delete(c.onDisk, de.id)
	c.diskSize -= alignUp(de.size)
	os.Remove(de.path)
}

func (c *chunkCache) dropKey(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drops++
	for id, el := range c.byKey {
		if id.key == key {
			c.recycleLocked(c.evictLocked(el))
		}
	}
	for id, el := range c.onDisk {
		if id.key == key {
			c.forgetDiskLocked(el)
		}
	}
}

func (c *chunkCache) stats() (int64, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}
