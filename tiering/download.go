package tiering

import (
	"context"
	"fmt"
	"hash/crc32"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// flight is a chunk download under way: done is closed when it ends;
// demanded says a read waits for it (else it is a read-ahead), which puts it
// first in line for the cold-read rate.
type flight struct {
	done       chan struct{}
	demanded   atomic.Bool
	demandedCh chan struct{} // closed when demanded becomes true
}

func newFlight(demanded bool) *flight {
	f := &flight{done: make(chan struct{}), demandedCh: make(chan struct{})}
	if demanded {
		f.demand()
	}
	return f
}

// demand marks the flight as one a read waits for.
func (f *flight) demand() {
	if !f.demanded.Swap(true) {
		close(f.demandedCh)
	}
}

func (t *Tier) fetchChunk(ctx context.Context, o object, ci int64) (*chunkEntry, error) {
	for {
		e, wait := t.cached(o, ci)
		if e != nil {
			return e, nil
		}
		if wait == nil {
			id := chunkID{o.key, ci}
			t.mu.Lock()
			f, busy := t.inflight[id]
			if !busy {
				f = newFlight(true)
				t.inflight[id] = f
				t.mu.Unlock()
				return t.download(ctx, o, ci, f, false)
			}
			t.mu.Unlock()
			f.demand()
			wait = f.done
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e := t.cache.peek(o.key, ci); e != nil {
			return e, nil
		}
		// That download failed (or its chunk is gone already): try ourselves.
	}
}

// download fetches a chunk registered in inflight as f, caches it and
// closes f.done. A background download (record) that fails leaves its error
// for the next no-wait read, recorded before f.done closes.
func (t *Tier) download(ctx context.Context, o object, ci int64, f *flight, record bool) (e *chunkEntry, err error) {
	defer func() {
		var keep error // a read waiting on a download gets its error itself
		if record {
			keep = err
		}
		t.endFlight(chunkID{o.key, ci}, f, keep)
	}()
	release, err := t.takeSlot(ctx, f)
	if err != nil {
		return nil, err
	}
	defer release()
	if record {
		// A read-ahead of a chunk on the disk level brings it back into
		// memory (off the fetch path) instead of downloading it.
		if e := t.cache.lookup(o.key, ci, false); e != nil {
			t.cache.release(e)
			return nil, nil
		}
	}
	start := ci * chunkSize
	n := min(chunkSize, o.size-start)
	if n <= 0 || o.sums != nil && ci >= int64(len(o.sums)) {
		return nil, fmt.Errorf("tiering: %s: chunk %d is past the object's %d bytes", o.key, ci, o.size)
	}
	pause, resume := func() {}, func() {}
	if record {
		// A background download gives up after a minute without progress
		// (a rate-paced one may take longer than that in all, and waiting
		// its turn is not a stall).
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		stall := time.AfterFunc(time.Minute, cancel)
		defer func() { stall.Stop(); cancel() }()
		pause, resume = func() { stall.Stop() }, func() { stall.Reset(time.Minute) }
	}
	buf := getChunkBuf()
	// The chunk's checksum is computed as the bytes arrive (while they are
	// in the processor's cache), between socket reads, and the download
	// yields after each piece: a socket that always has data would let it
	// run for a whole scheduler slice (10 ms) ahead of other requests.
	// Under --tier-fetch-max-bytes-per-second each piece also waits its
	// turn, which paces the GET itself (TCP flow control slows the server)
	// rather than letting whole chunks through in bursts.
	var crc uint32
	t.gets.Add(1)
	err = getRangeInto(ctx, t.store, o.key, start, (*buf)[:n], func(at int, p []byte) {
		if at == 0 {
			crc = 0 // a retry starts over
		}
		crc = crc32.Update(crc, castagnoli, p)
		pause()
		t.pace(ctx, len(p), f) // a cancelled ctx fails the next body read
		resume()
		runtime.Gosched()
	})
	if err == nil && o.sums != nil && crc != o.sums[ci] {
		err = fmt.Errorf("tiering: %s: chunk %d: crc mismatch (corrupt object)", o.key, ci)
	}
	if err != nil {
		putChunkBuf(buf)
		t.errs.Add(1)
		return nil, err
	}
	t.downloadedBytes.Add(n)
	return t.cache.put(o.key, ci, buf, n, o.sums != nil, crc, !record), nil
}

// downloadSlots bounds the chunk downloads (each with a chunk buffer and
// a GET) under way at once, whatever the number of readers: 128 MiB of
// buffers beyond the cache's budget at most. Read-aheads get at most
// readAheadSlots of them, so reads waiting for their chunks always have
// the other 4 to themselves.
const downloadSlots, readAheadSlots = 16, 12

// takeSlot waits for a download slot for f (for a read-ahead, first for a
// read-ahead slot, unless a read demands it meanwhile) and returns its
// release.
func (t *Tier) takeSlot(ctx context.Context, f *flight) (func(), error) {
	ra := false
	if !f.demanded.Load() {
		select {
		case t.raSlots <- struct{}{}:
			ra = true
		case <-f.demandedCh: // a read waits for it now: no read-ahead slot needed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	select {
	case t.slots <- struct{}{}:
	case <-ctx.Done():
		if ra {
			<-t.raSlots
		}
		return nil, ctx.Err()
	}
	return func() {
		<-t.slots
		if ra {
			<-t.raSlots
		}
	}, nil
}

// pace waits until n more bytes of download f fit the cold-read rate, or
// ctx ends (a read waits for the rate, it never fails because of it).
// Demanded downloads go first: a read-ahead does not join the line while
// one is waiting, so a read at a low rate waits for at most one step of
// each read-ahead under way, not for their whole chunks.
func (t *Tier) pace(ctx context.Context, n int, f *flight) error {
	if t.fetchRate == nil {
		return nil
	}
	t.guardTick()
	for n > 0 {
		if t.fetchRate.Limit() == rate.Inf {
			// The guard's limit is lifted: nothing to wait for, and no
			// line for demanded downloads to go first in.
			t.guard.tookRate(int64(n))
			return nil
		}
		k := min(n, t.fetchRate.Burst())
		demanded := f.demanded.Load()
		if demanded {
			t.demanded.Add(1)
		} else {
			for t.demanded.Load() > 0 && !f.demanded.Load() {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Millisecond):
				}
			}
		}
		err := t.fetchRate.WaitN(ctx, k)
		t.guard.tookRate(int64(k))
		if demanded {
			t.demanded.Add(-1)
		}
		if err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// startFetch makes sure a chunk is on its way (demanded: a read waits for
// it) and returns a channel closed when it is cached (or its download
// failed).
func (t *Tier) startFetch(o object, ci int64, demanded bool) <-chan struct{} {
	id := chunkID{o.key, ci}
	t.mu.Lock()
	if f, ok := t.inflight[id]; ok {
		t.mu.Unlock()
		if demanded {
			f.demand()
		}
		return f.done
	}
	if t.cache.inMemory(o.key, ci) {
		t.mu.Unlock()
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	f := newFlight(demanded)
	t.inflight[id] = f
	t.mu.Unlock()
	go t.download(context.Background(), o, ci, f, true) // no read-ahead from here: reads drive it
	return f.done
}

// prefetch brings a chunk into the memory level in the background (from
// the disk level, else the bucket) unless it is there or on its way.
func (t *Tier) prefetch(o object, ci int64) {
	if !t.cache.inMemory(o.key, ci) {
		t.startFetch(o, ci, false)
	}
}
