package tiering

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"time"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
)

// directAlign is the block size chunk files are written in (O_DIRECT needs
// buffer addresses and lengths aligned to the device's logical block).
const directAlign = 4096

// alignUp rounds n up to whole directAlign blocks: what a chunk of n bytes
// takes on the disk level, whose files are written in whole blocks.
func alignUp[T int | int64](n T) T { return (n + directAlign - 1) &^ (directAlign - 1) }

// chunkSize is the alignment of cold-read ranged GETs: a read fetches the
// aligned chunks covering what it needs, never a whole segment for a small
// read, and sequential catch-up reads hit the cache for the rest of a chunk.
const chunkSize = 8 << 20

// object is a segment's .log object as cold reads see it: its key, its size
// and, when the manifest has them, the CRC-32C of each chunk (a download is
// verified against its sum as it arrives, and batches in verified chunks
// need no check of their own).
type object struct {
	key  string
	size int64
	sums []uint32
}

func segmentObject(pk PartitionKey, seg *SegmentMeta) object {
	o := object{key: pk.objectKey(seg, ".log"), size: seg.Size}
	if seg.ChunkBytes == chunkSize && int64(len(seg.ChunkCRC32C)) == (seg.Size+chunkSize-1)/chunkSize {
		o.sums = seg.ChunkCRC32C
	}
	return o
}

// ErrOffsetNotTiered means the offset is not in any uploaded segment.
var ErrOffsetNotTiered = errors.New("tiering: offset not in the bucket")

// ColdRead is whole batches read from the bucket, as slices of cached
// chunks (no copy): Parts in order, Len bytes in all, Next the offset after
// the last batch. The chunks stay pinned in memory until Release.
type ColdRead struct {
	Parts [][]byte
	Len   int64
	Next  int64

	cache  *chunkCache
	owners []*chunkEntry // the chunk each part is a slice of
	held   []*chunkEntry // references to release
}

// Release unpins the chunks; Parts must not be used afterwards.
func (r *ColdRead) Release() {
	if r == nil {
		return
	}
	for _, e := range r.held {
		r.cache.release(e)
	}
	r.held, r.owners, r.Parts, r.Len = nil, nil, nil, 0
}

// Bytes returns the batches as one copied slice.
func (r *ColdRead) Bytes() []byte {
	out := make([]byte, 0, r.Len)
	for _, p := range r.Parts {
		out = append(out, p...)
	}
	return out
}

// add appends bytes [off, off+n) of chunk e, whose reference it takes
// over, joining the previous part when that ends where this starts in the
// same chunk.
func (r *ColdRead) add(e *chunkEntry, off, n int64) {
	if k := len(r.held); k > 0 && r.held[k-1] == e {
		r.cache.release(e) // held once already
	} else {
		r.held = append(r.held, e)
	}
	r.Len += n
	if k := len(r.Parts); k > 0 && r.owners[k-1] == e {
		last := &r.Parts[k-1]
		if start := cap(e.data) - cap(*last); int64(start+len(*last)) == off {
			*last = (*last)[:len(*last)+int(n)]
			return
		}
	}
	r.Parts = append(r.Parts, e.data[off:off+n])
	r.owners = append(r.owners, e)
}

// truncate drops what was added after a mark (len(Parts), Len, and the
// length then of the last part); the chunks stay held until Release.
func (r *ColdRead) truncate(parts int, n int64, last int) {
	r.Parts, r.owners, r.Len = r.Parts[:parts], r.owners[:parts], n
	if parts > 0 {
		r.Parts[parts-1] = r.Parts[parts-1][:last]
	}
}

// Read returns whole batches from the bucket starting with the batch that
// contains offset (always that batch, then more while they fit maxBytes),
// each CRC-checked: a corrupt object is an error (and its chunks are dropped
// from the cache so the next read fetches them again), never garbage. It
// also returns the offset after the last batch returned.
func (t *Tier) Read(ctx context.Context, pk PartitionKey, offset, maxBytes int64) ([]byte, int64, error) {
	r, err := t.read(ctx, pk, offset, maxBytes)
	if err != nil {
		return nil, 0, err
	}
	defer r.Release()
	return r.Bytes(), r.Next, nil
}

func (t *Tier) read(ctx context.Context, pk PartitionKey, offset, maxBytes int64) (*ColdRead, error) {
	var m *Manifest
	err := t.noWaitLoad(ctx, chunkID{pk.manifestKey(), -1}, func() bool { return t.ManifestCached(pk) }, func(ctx context.Context) error {
		_, err := t.Manifest(ctx, pk)
		return err
	})
	if err == nil {
		m, err = t.Manifest(ctx, pk)
	}
	if err != nil {
		return nil, err
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
		return nil, ErrOffsetNotTiered
	}
	seq := offset == m.LogStartOffset || t.continues(pk, offset)
	if seq {
		ctx = context.WithValue(ctx, sequentialKey{}, true)
	}
	r := &ColdRead{Next: offset, cache: t.cache}
	// Whole batches from the segment holding offset, then from the
	// following segments while the budget lasts.
	stop, bounded := ctx.Value(stableKey{}).(int64)
	stopped := false
	first := i
	for ; i < len(m.Segments); i++ {
		if bounded && m.Segments[i].Next > stop {
			stopped = true
			// A read_committed read stops before a segment holding
			// records at or past the last stable offset (cached batches
			// come whole): the local log serves those.
			break
		}
		full, err := t.readSegment(ctx, pk, &m.Segments[i], r.Next, maxBytes, r)
		var nr *NotReadyError
		if errors.As(err, &nr) && r.Len > 0 {
			break // what was ready; the rest is on its way
		}
		if err != nil {
			r.Release()
			return nil, err
		}
		if full {
			break
		}
	}
	if r.Len == 0 && stopped {
		r.Release()
		return nil, nil // nothing below the bound here
	}
	if r.Len == 0 && allCleaned(m.Segments[first:]) {
		// Compaction left nothing from offset to the bucket's end: the
		// log goes on at m.Next() (Len 0 says so).
		r.Next = m.Next()
		return r, nil
	}
	if r.Len == 0 {
		// The manifest says the bucket holds offset, yet no segment from
		// there on has a batch at or after it: an answer of nothing would
		// have the reader ask again for ever.
		r.Release()
		t.errs.Add(1)
		return nil, fmt.Errorf("tiering: %s: no batch at or after offset %d in the segments the manifest names up to %d (corrupt object or manifest)", pk.dir(), offset, m.Next())
	}
	t.readEnded(pk, offset, r.Next)
	if seq {
		t.readAheadAcross(pk, m, min(i, len(m.Segments)-1), r)
	}
	return r, nil
}

func allCleaned(segs []SegmentMeta) bool {
	for i := range segs {
		if !segs[i].Cleaned {
			return false
		}
	}
	return true
}

// sequentialKey marks the context of a read that continues an earlier one
// (or starts at the log start): only such reads start read-aheads, so a
// reader that seeks somewhere and reads a little downloads only the chunks
// it reads.
type sequentialKey struct{}

// readEnds remembers where a partition's last few cold reads ended: a read
// starting at one of them is a reader going on (several readers, such as
// consumer groups catching up, each keep theirs).
type readEnds struct {
	next [8]int64
	n    int // slots used; then the oldest is replaced
	at   int // next slot to replace
}

// continues reports whether a cold read of pk at offset starts where an
// earlier one ended.
func (t *Tier) continues(pk PartitionKey, offset int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.readEnds[pk]; e != nil {
		for _, n := range e.next[:e.n] {
			if n == offset {
				return true
			}
		}
	}
	return false
}

// readEnded records that a cold read of pk from offset ended at next.
func (t *Tier) readEnded(pk PartitionKey, offset, next int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.readEnds[pk]
	if e == nil {
		if len(t.readEnds) >= 1<<16 { // bounded: forget them all, readers re-establish theirs
			clear(t.readEnds)
		}
		e = &readEnds{}
		t.readEnds[pk] = e
	}
	for i, n := range e.next[:e.n] {
		if n == offset || n == next {
			e.next[i] = next // this reader going on
			return
		}
	}
	if e.n < len(e.next) {
		e.next[e.n] = next
		e.n++
		return
	}
	e.next[e.at] = next
	e.at = (e.at + 1) % len(e.next)
}

// readAheadAcross carries the read-ahead of a read that ended near the end
// of a segment (i, or the one before it) into the segments after it, so a
// catch-up reader of small segments finds as many chunks ready as one of
// large segments (each chunk read starts the next ones of its own object).
func (t *Tier) readAheadAcross(pk PartitionKey, m *Manifest, i int, r *ColdRead) {
	if len(r.held) == 0 {
		return
	}
	last := r.held[len(r.held)-1].id
	o := segmentObject(pk, &m.Segments[i])
	if last.key != o.key && i > 0 {
		i--
		o = segmentObject(pk, &m.Segments[i])
	}
	if last.key != o.key {
		return
	}
	left := t.readAheadChunks() - ((o.size+chunkSize-1)/chunkSize - 1 - last.ci)
	for j := i + 1; j < len(m.Segments) && left > 0; j++ {
		next := segmentObject(pk, &m.Segments[j])
		for ci := int64(0); ci*chunkSize < next.size && left > 0; ci++ {
			t.prefetch(next, ci)
			left--
		}
	}
}

// readSegment adds whole batches of seg from the one holding offset on to
// r, while they fit maxBytes (the first batch of the read always goes). It
// reports whether the budget is spent.
func (t *Tier) readSegment(ctx context.Context, pk PartitionKey, seg *SegmentMeta, offset, maxBytes int64, r *ColdRead) (bool, error) {
	o := segmentObject(pk, seg)
	key := o.key
	pos := int64(0)
	if offset > seg.Base {
		ikey := pk.objectKey(seg, ".index")
		cached := func() bool { // a missing index is cached too (as nil)
			t.mu.Lock()
			defer t.mu.Unlock()
			_, ok := t.indexes.get(ikey)
			return ok
		}
		err := t.noWaitLoad(ctx, chunkID{ikey, -1}, cached, func(ctx context.Context) error {
			if t.index(ctx, pk, seg); !cached() {
				return errNoIndex // the bucket failed: the next read goes without it, once
			}
			return nil
		})
		var nr *NotReadyError
		switch {
		case errors.As(err, &nr):
			return false, err
		case err == nil:
			pos = log.IndexLookup(t.index(ctx, pk, seg), seg.Base, offset)
		}
		// else its background load failed: scan from the segment's start.
	}
	// A position from the remote index (derived data: its checksum proves
	// the file, not the positions its writer put in it) is suspect until
	// the first batch served from it passes its own CRC and holds offset:
	// verified chunks prove the bytes, not that a batch starts there, nor
	// that none was skipped. If not, the index is dropped and the segment
	// walked from its start.
	suspect := pos > 0
	walked := false // a batch below offset was passed: in a cleaned segment, offset may be in a gap
	var hbuf [log.BatchHeaderSize]byte
	for {
		if pos >= seg.Size {
			if !suspect || seg.Cleaned && walked {
				break // (in a cleaned segment offset may be in a trailing gap)
			}
			// Walked off the end from the index's position without
			// reaching offset: the index is wrong.
			t.badIndex(pk, seg)
			pos, suspect = 0, false
			continue
		}
		h, bad, err := t.batchHeaderAt(ctx, o, seg.Size, pos, hbuf[:0])
		if err != nil {
			return false, err
		}
		if bad != nil {
			if suspect {
				t.badIndex(pk, seg)
				pos, suspect = 0, false
				continue
			}
			t.cache.dropKey(key)
			return false, fmt.Errorf("tiering: %s at byte %d: bad batch header: %v", key, pos, bad)
		}
		if h.LastOffset() < offset {
			pos += int64(h.Length)
			walked = true
			continue
		}
		if r.Len > 0 && r.Len+int64(h.Length) > maxBytes {
			return true, nil
		}
		parts, n, last := len(r.Parts), r.Len, 0
		if parts > 0 {
			last = len(r.Parts[parts-1])
		}
		crc, verified, err := t.addRange(ctx, r, o, pos, int64(h.Length), suspect)
		if err != nil {
			r.truncate(parts, n, last) // keep the whole batches read so far
			return false, err
		}
		if (suspect || !verified) && (crc != h.CRC || suspect && h.BaseOffset > offset && !(seg.Cleaned && walked)) {
			r.truncate(parts, n, last)
			// From a suspect position: a torn batch, or a later one (which
			// would skip records). The index or the data: walking from the
			// start tells.
			if suspect {
				t.badIndex(pk, seg)
				pos, suspect = 0, false
				continue
			}
			t.cache.dropKey(key)
			t.errs.Add(1)
			return false, fmt.Errorf("tiering: %s at byte %d: crc mismatch in batch %d", key, pos, h.BaseOffset)
		}
		suspect = false
		r.Next = h.NextOffset()
		pos += int64(h.Length)
		if r.Len >= maxBytes {
			return true, nil
		}
	}
	return false, nil
}

// addRange adds n bytes of an object at pos to r as slices of its cached
// chunks. It reports whether every chunk involved was verified whole on
// arrival; if not (or if sumAnyway), it returns the CRC-32C of the bytes
// past a batch's CRC field (what a batch's CRC covers, for a range that is
// one batch).
func (t *Tier) addRange(ctx context.Context, r *ColdRead, o object, pos, n int64, sumAnyway bool) (uint32, bool, error) {
	var pieces [][]byte // usually one or two: a batch spans at most a few chunks
	verified := true
	err := t.eachPiece(ctx, o, pos, n, func(e *chunkEntry, off, take int64) {
		verified = verified && e.verified
		pieces = append(pieces, e.data[off:off+take])
		r.add(e, off, take) // r holds e from here
	})
	if err != nil {
		return 0, false, err
	}
	if verified && !sumAnyway {
		return 0, true, nil
	}
	var crc uint32
	skip := log.BatchCRCStart
	for _, p := range pieces {
		if skip >= len(p) {
			skip -= len(p)
			continue
		}
		crc = crc32cYielding(crc, p[skip:])
		skip = 0
	}
	return crc, verified, nil
}

// crc32cYielding is crc32.Update with the Castagnoli table in 1 MiB steps,
// yielding the processor between them: the checksum of a large read (a few
// ms of CPU in one assembly call, which the scheduler cannot preempt) must
// not hold up the goroutines of other requests, such as a tail consumer's.
func crc32cYielding(crc uint32, b []byte) uint32 {
	const step = 1 << 20
	for len(b) > step {
		crc = crc32.Update(crc, castagnoli, b[:step])
		b = b[step:]
		runtime.Gosched()
	}
	return crc32.Update(crc, castagnoli, b)
}

// errNoIndex is a background index load the bucket failed (a missing
// index is cached as such, not an error): the next read goes on without it.
var errNoIndex = errors.New("tiering: no remote index")

// noWaitLoad makes sure what ready reports is there before a no-wait read
// uses it: if it is not, load runs in the background (once per id, with
// the in-flight chunk downloads) and a *NotReadyError says what to wait
// on. The read after a background load failed gets its error once (then
// the next one starts another load). Reads that may wait return at once:
// they load synchronously where they use it.
func (t *Tier) noWaitLoad(ctx context.Context, id chunkID, ready func() bool, load func(context.Context) error) error {
	if ctx.Value(noWaitKey{}) == nil || ready() {
		return nil
	}
	if err := t.takeFailure(id); err != nil {
		return err
	}
	t.mu.Lock()
	f, busy := t.inflight[id]
	if !busy {
		f = newFlight(true)
		t.inflight[id] = f
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			err := load(ctx)
			cancel()
			t.endFlight(id, f, err)
		}()
	}
	t.mu.Unlock()
	return &NotReadyError{Wait: f.done}
}

// endFlight ends the background work registered in inflight as id: err
// (if not nil) is kept for the next no-wait read of id (takeFailure), then
// f.done closes.
func (t *Tier) endFlight(id chunkID, f *flight, err error) {
	t.mu.Lock()
	delete(t.inflight, id)
	if err != nil && len(t.failed) < 1024 { // bounded: only the next read needs it
		t.failed[id] = err
	}
	t.mu.Unlock()
	close(f.done)
}

// takeFailure returns, once, the error the last background work on id
// ended with (nil if none).
func (t *Tier) takeFailure(id chunkID) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	err := t.failed[id]
	delete(t.failed, id)
	return err
}

// batchHeaderAt reads the batch header at pos of an object of size bytes
// (into buf). err is a read's failure; bad says the bytes there are no
// batch header of this object: short of a header before its end,
// unparsable, or a batch running past its end.
func (t *Tier) batchHeaderAt(ctx context.Context, o object, size, pos int64, buf []byte) (h log.BatchHeader, bad, err error) {
	if pos+log.BatchHeaderSize > size {
		return h, errShortHeader, nil
	}
	hdr, err := t.appendAt(ctx, buf, o, pos, log.BatchHeaderSize)
	if err != nil {
		return h, nil, err
	}
	if h, bad = log.ParseBatchHeader(hdr); bad == nil && pos+int64(h.Length) > size {
		bad = fmt.Errorf("a batch of %d bytes runs past the end at %d", h.Length, size)
	}
	return h, bad, nil
}

// errShortHeader: fewer bytes than a batch header are left in the segment.
var errShortHeader = errors.New("the segment ends short of a batch header")

// maxRemoteIndex is the largest remote index used (the log's own bound on
// an index file): a larger one is not ours, and is not cached.
const maxRemoteIndex = 64 << 20

// index returns the remote .index object of a segment (nil if missing).
func (t *Tier) index(ctx context.Context, pk PartitionKey, seg *SegmentMeta) []byte {
	return t.indexObject(ctx, pk, seg, ".index")
}

// indexObject returns a segment's remote index object with extension ext
// (.index or .timeindex) through the index cache; nil if missing or not
// readable this time.
func (t *Tier) indexObject(ctx context.Context, pk PartitionKey, seg *SegmentMeta, ext string) []byte {
	key := pk.objectKey(seg, ext)
	t.mu.Lock()
	b, ok := t.indexes.get(key)
	t.mu.Unlock()
	if ok {
		return b
	}
	t.gets.Add(1)
	b, err := t.store.GetRange(ctx, key, 0, -1)
	switch {
	case errors.Is(err, ErrTooLarge) || len(b) > maxRemoteIndex:
		b = nil // not an index of ours: cached as missing, a scan works
	case err != nil && !errors.Is(err, ErrNotFound):
		return nil // transient: scan from the segment start this time, ask again next time
	}
	t.downloadedBytes.Add(int64(len(b)))
	t.mu.Lock()
	t.indexes.put(key, b) // nil for a missing index: derived data, a scan works
	t.mu.Unlock()
	return b
}

// badIndex forgets a segment's remote index for good (until it leaves the
// index cache): reads walk the segment from its start instead.
func (t *Tier) badIndex(pk PartitionKey, seg *SegmentMeta) {
	t.logger.Warn("remote index position is not where its offset is; scanning the segment instead", zap.String("key", pk.objectKey(seg, ".index")))
	t.mu.Lock()
	t.indexes.put(pk.objectKey(seg, ".index"), nil)
	t.mu.Unlock()
}

// readAt returns n bytes of an object at pos through the chunk cache.
func (t *Tier) readAt(ctx context.Context, o object, pos, n int64) ([]byte, error) {
	return t.appendAt(ctx, make([]byte, 0, n), o, pos, n)
}

// appendAt appends n bytes of an object at pos to out, through the chunk
// cache, copying each byte once.
func (t *Tier) appendAt(ctx context.Context, out []byte, o object, pos, n int64) ([]byte, error) {
	err := t.eachPiece(ctx, o, pos, n, func(e *chunkEntry, off, take int64) {
		out = append(out, e.data[off:off+take]...)
		t.cache.release(e)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachPiece walks n bytes of an object from pos through its chunks, calling
// use with each chunk (whose reference use takes over) and the range of it
// that is next.
func (t *Tier) eachPiece(ctx context.Context, o object, pos, n int64, use func(e *chunkEntry, off, take int64)) error {
	if pos < 0 || n < 0 || pos+n > o.size {
		return fmt.Errorf("tiering: %s: read of [%d,+%d) past the object's %d bytes", o.key, pos, n, o.size)
	}
	for n > 0 {
		ci := pos / chunkSize
		e, err := t.chunk(ctx, o, ci)
		if err != nil {
			return err
		}
		off := pos - ci*chunkSize
		take := min(n, int64(len(e.data))-off)
		if take <= 0 {
			t.cache.release(e)
			return fmt.Errorf("tiering: %s: read past the object at %d", o.key, pos)
		}
		use(e, off, take)
		pos += take
		n -= take
	}
	return nil
}

// chunk returns chunk ci of an object, from the cache, from a download
// already in flight, or by downloading it. For a read going on from an
// earlier one (sequentialKey) it also starts the next readAhead chunks in
// the background, so a catch-up reader finds them ready. Under a no-wait
// context a missing chunk is not waited for: its download starts and a
// *NotReadyError says what to wait on.
// The caller releases the chunk (t.cache.release) when done with its data.
func (t *Tier) chunk(ctx context.Context, o object, ci int64) (*chunkEntry, error) {
	if ctx.Value(noWaitKey{}) != nil {
		seq := ctx.Value(sequentialKey{}) != nil
		e, wait := t.cached(o, ci)
		if e != nil {
			if seq {
				t.readAheadFrom(o, ci)
			}
			return e, nil
		}
		if wait != nil {
			return nil, &NotReadyError{Wait: wait}
		}
		// The last background download of this chunk failed: say so once
		// (the fetch answers an error instead of staying empty), then the
		// next read starts a new download.
		if err := t.takeFailure(chunkID{o.key, ci}); err != nil {
			return nil, err
		}
		wait = t.startFetch(o, ci, true)
		if seq && (ci+1)*chunkSize < o.size && t.cache.max >= 4*chunkSize {
			// A cold start of a catch-up read: the next chunk downloads
			// alongside (the read-ahead proper starts once this one is read).
			t.prefetch(o, ci+1)
		}
		return nil, &NotReadyError{Wait: wait}
	}
	c, err := t.fetchChunk(ctx, o, ci)
	if err == nil && ctx.Value(sequentialKey{}) != nil {
		t.readAheadFrom(o, ci)
	}
	return c, err
}

func (t *Tier) readAheadFrom(o object, ci int64) {
	n := t.readAheadChunks()
	for ahead := ci + 1; ahead <= ci+n && ahead*chunkSize < o.size; ahead++ {
		t.prefetch(o, ahead)
	}
}

// readAheadChunks is how many chunks past the one read are fetched in
// advance: readAhead, but never so many that the prefetched chunks evict
// the one being read and the next (a batch may span both): a small cache
// would thrash.
func (t *Tier) readAheadChunks() int64 {
	return min(int64(readAhead), t.cache.max/chunkSize-2)
}

// readAhead is how many chunks past the one read are fetched in advance:
// 32 MiB, so a catch-up reader's next fetch of up to 32 MiB finds its
// chunks downloaded or on their way (3 made such a reader ~10% slower).
const readAhead = 4

// NotReadyError means a cold read needs a chunk that is still downloading;
// Wait is closed when the download ends (successfully or not).
type NotReadyError struct{ Wait <-chan struct{} }

func (e *NotReadyError) Error() string { return "tiering: chunk still downloading" }

type noWaitKey struct{}

// stableKey carries a read_committed read's bound (ReadNoWaitStable).
type stableKey struct{}

// ReadNoWaitStable is ReadNoWait for a read_committed fetch: it reads no
// segment that ends past stop (the partition's last stable offset). It
// returns a nil read when the segment holding offset does.
func (t *Tier) ReadNoWaitStable(ctx context.Context, pk PartitionKey, offset, maxBytes, stop int64) (r *ColdRead, wait <-chan struct{}, err error) {
	return t.ReadNoWait(context.WithValue(ctx, stableKey{}, stop), pk, offset, maxBytes)
}

// ReadNoWait is a Read for a request that must not stall on the bucket,
// without copying: what is cached is returned at once (nil if nothing);
// if the first batch needs a chunk that is not cached yet, its download
// starts and wait is closed when it ends (read again then). The broker adds
// wait to a fetch's long-poll wake-ups, so a slow bucket never holds up
// other partitions of the same fetch. The caller releases r.
func (t *Tier) ReadNoWait(ctx context.Context, pk PartitionKey, offset, maxBytes int64) (r *ColdRead, wait <-chan struct{}, err error) {
	r, err = t.read(context.WithValue(ctx, noWaitKey{}, true), pk, offset, maxBytes)
	var nr *NotReadyError
	if errors.As(err, &nr) {
		return nil, nr.Wait, nil
	}
	return r, nil, err
}

// cached returns chunk ci of an object from the memory level or else from
// the disk level, unless a download or read-back of it is under way: then
// it returns that one's channel, for the caller to wait on rather than do
// the same work twice. Neither: nil, nil.
//
// The caller is a read: a read-ahead it finds under way is demanded from
// here on.
func (t *Tier) cached(o object, ci int64) (*chunkEntry, <-chan struct{}) {
	if e := t.cache.lookupMemory(o.key, ci); e != nil {
		return e, nil
	}
	t.mu.Lock()
	f, busy := t.inflight[chunkID{o.key, ci}]
	t.mu.Unlock()
	if busy {
		f.demand()
		return nil, f.done
	}
	return t.cache.get(o.key, ci), nil
}

// BatchForTimestamp returns the first batch in the bucket (at or after the
// log start) whose max timestamp is >= ts, as stored bytes; nil if no
// uploaded segment has one. The manifest's per-segment max timestamps pick
// the segment, its remote time index the position to start from (a
// position that is not a batch start falls back to the segment's start),
// and its batch headers are walked from there through the chunk cache.
func (t *Tier) BatchForTimestamp(ctx context.Context, pk PartitionKey, ts int64) ([]byte, error) {
	m, err := t.Manifest(ctx, pk)
	if err != nil {
		return nil, err
	}
	for _, seg := range m.Segments {
		if seg.MaxTimestamp < ts || seg.Next <= m.LogStartOffset {
			continue
		}
		o := segmentObject(pk, &seg)
		key := o.key
		pos := log.TimeIndexLookup(t.indexObject(ctx, pk, &seg, ".timeindex"), t.index(ctx, pk, &seg), seg.Base, ts)
		// Derived data: a position from it is suspect until the batch
		// served from there passes its CRC. A suspect position that leads
		// nowhere (past the end, a bad header, a bad batch) sends the walk
		// back to the segment's start.
		suspect := pos > 0
		var hbuf [log.BatchHeaderSize]byte
		for {
			if pos >= seg.Size {
				if !suspect {
					break
				}
				pos, suspect = 0, false
				continue
			}
			h, bad, err := t.batchHeaderAt(ctx, o, seg.Size, pos, hbuf[:0])
			if err != nil {
				return nil, err
			}
			if bad != nil {
				if suspect {
					pos, suspect = 0, false
					continue
				}
				return nil, fmt.Errorf("tiering: %s at byte %d: bad batch header: %v", key, pos, bad)
			}
			if h.MaxTimestamp >= ts && h.LastOffset() >= m.LogStartOffset {
				b, err := t.readAt(ctx, o, pos, int64(h.Length))
				if err != nil {
					return nil, err
				}
				if !log.VerifyBatch(b, &h) {
					if suspect {
						pos, suspect = 0, false
						continue
					}
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
