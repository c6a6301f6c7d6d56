package tiering

import (
	"container/list"
	"strings"
)

// indexCache keeps remote .index objects for cold reads, least recently
// used first out, within a byte budget: a catch-up reader crossing
// thousands of segments must not pin every segment's index in memory.
// Guarded by Tier.mu.
type indexCache struct {
	budget, used int64
	lru          list.List // of *indexEntry, front = most recent
	byKey        map[string]*list.Element
}

type indexEntry struct {
	key string
	b   []byte // nil: the segment has no index (a scan works)
}

// indexCacheBytes is the default budget: 8 bytes of index per 4 KiB of
// segment, so 64 MiB covers about 32 GiB of recently read tiered data.
const indexCacheBytes = 64 << 20

func newIndexCache(budget int64) *indexCache {
	return &indexCache{budget: budget, byKey: map[string]*list.Element{}}
}

func entryCost(b []byte) int64 { return int64(len(b)) + 64 }

func (c *indexCache) get(key string) ([]byte, bool) {
	e, ok := c.byKey[key]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(e)
	return e.Value.(*indexEntry).b, true
}

func (c *indexCache) put(key string, b []byte) {
	if e, ok := c.byKey[key]; ok {
		c.used -= entryCost(e.Value.(*indexEntry).b)
		c.lru.Remove(e)
	}
	c.byKey[key] = c.lru.PushFront(&indexEntry{key, b})
	c.used += entryCost(b)
	for c.used > c.budget && c.lru.Len() > 1 {
		c.remove(c.lru.Back())
	}
}

func (c *indexCache) remove(e *list.Element) {
	ie := e.Value.(*indexEntry)
	c.lru.Remove(e)
	delete(c.byKey, ie.key)
	c.used -= entryCost(ie.b)
}

func (c *indexCache) drop(key string) {
	if e, ok := c.byKey[key]; ok {
		c.remove(e)
	}
}

func (c *indexCache) dropPrefix(prefix string) {
	for k, e := range c.byKey {
		if strings.HasPrefix(k, prefix) {
			c.remove(e)
		}
	}
}
