package tiering

import (
	"fmt"
	"testing"
)

func TestIndexCacheBounded(t *testing.T) {
	c := newIndexCache(10 * (1000 + 64))
	for i := 0; i < 100; i++ {
		c.put(fmt.Sprintf("p/%d.index", i), make([]byte, 1000))
		if i == 5 {
			c.get("p/0.index") // recently used: survives longer
		}
	}
	if c.used > c.budget || c.lru.Len() != 10 || len(c.byKey) != 10 {
		t.Fatalf("used %d of %d, %d entries", c.used, c.budget, c.lru.Len())
	}
	if _, ok := c.get("p/99.index"); !ok {
		t.Fatal("the newest entry was evicted")
	}
	if _, ok := c.get("p/50.index"); ok {
		t.Fatal("an old entry survived past the budget")
	}
	c.put("q/1.index", nil) // a missing index is remembered too
	if b, ok := c.get("q/1.index"); !ok || b != nil {
		t.Fatal("nil entry lost")
	}
	c.dropPrefix("p/")
	if len(c.byKey) != 1 || c.lru.Len() != 1 {
		t.Fatalf("dropPrefix left %d entries", len(c.byKey))
	}
}
