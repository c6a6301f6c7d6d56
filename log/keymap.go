package log

import (
	"crypto/md5"
	"encoding/binary"
)

// KeyMap is the cleaner's bounded map from record key to the offset of its
// latest record (Kafka's SkimpyOffsetMap): keys are hashed (MD5, 16 bytes)
// into a fixed buffer of 24-byte slots (hash + offset) with linear probing,
// filled to at most 90%. Two keys with the same hash count as one: the older
// record of either would be dropped, as in Kafka (the chance is negligible
// at 128 bits).
type KeyMap struct {
	slots   []byte // len = n*keyMapSlot; an all-zero hash is an empty slot
	n       int    // number of slots
	max     int    // most entries allowed (load factor 0.9)
	entries int
	latest  int64 // greatest offset put, -1 if none
}

const (
	keyMapSlot       = md5.Size + 8
	keyMapLoadFactor = 0.9
	// DefaultKeyMapBytes is Kafka's log.cleaner.dedupe.buffer.size.
	DefaultKeyMapBytes = 128 << 20
)

// NewKeyMap returns a map in a buffer of about bytes bytes (at least one
// slot).
func NewKeyMap(bytes int) *KeyMap {
	n := max(bytes/keyMapSlot, 2)
	// max < n: a free slot always remains, so a probe always ends.
	return &KeyMap{slots: make([]byte, n*keyMapSlot), n: n, max: min(max(int(float64(n)*keyMapLoadFactor), 1), n-1), latest: -1}
}

// Capacity is the most keys the map holds.
func (m *KeyMap) Capacity() int { return m.max }

// Len is the number of keys in the map.
func (m *KeyMap) Len() int { return m.entries }

// Latest is the greatest offset put since the last Clear (-1 if none).
func (m *KeyMap) Latest() int64 { return m.latest }

// Clear empties the map.
func (m *KeyMap) Clear() {
	clear(m.slots)
	m.entries, m.latest = 0, -1
}

func keyHash(key []byte) [md5.Size]byte {
	h := md5.Sum(key)
	if h == [md5.Size]byte{} {
		h[0] = 1 // the all-zero hash marks an empty slot
	}
	return h
}

func (m *KeyMap) find(h *[md5.Size]byte) (slot []byte, found bool) {
	i := int(binary.BigEndian.Uint64(h[:8]) % uint64(m.n))
	for {
		s := m.slots[i*keyMapSlot : (i+1)*keyMapSlot]
		if [md5.Size]byte(s[:md5.Size]) == *h {
			return s, true
		}
		if [md5.Size]byte(s[:md5.Size]) == [md5.Size]byte{} {
			return s, false
		}
		if i++; i == m.n {
			i = 0
		}
	}
}

// Put records offset as key's latest. It returns false, changing nothing,
// if key is new and the map is full.
func (m *KeyMap) Put(key []byte, offset int64) bool {
	h := keyHash(key)
	s, found := m.find(&h)
	if !found {
		if m.entries >= m.max {
			return false
		}
		copy(s, h[:])
		m.entries++
	}
	binary.BigEndian.PutUint64(s[md5.Size:], uint64(offset))
	m.latest = max(m.latest, offset)
	return true
}

// Get returns key's latest offset, or -1 if the map does not hold it.
func (m *KeyMap) Get(key []byte) int64 {
	h := keyHash(key)
	s, found := m.find(&h)
	if !found {
		return -1
	}
	return int64(binary.BigEndian.Uint64(s[md5.Size:]))
}
