package log

import (
	"fmt"
	"sort"
)

// Reads bounded below the high watermark: a read_committed fetch stops at
// the partition's last stable offset (the first offset of its oldest open
// transaction), which the layer above keeps. The bound is always the base
// offset of a batch.

// ReadStable is Read that also stops before the batch starting at stop.
func (p *Partition) ReadStable(offset, maxBytes, stop int64) (*ReadResult, error) {
	return p.read(offset, maxBytes, true, stop)
}

// ReadAtMostStable is ReadAtMost that also stops before the batch starting
// at stop.
func (p *Partition) ReadAtMostStable(offset, maxBytes, stop int64) (*ReadResult, error) {
	return p.read(offset, maxBytes, false, stop)
}

// markAt returns the position of the batch starting at off (below the high
// watermark), cached for the last bound asked: the bound moves only when a
// transaction begins or ends, so one lookup serves every fetch until then.
func (p *Partition) markAt(off int64) (mark, error) {
	if m := p.stableMark.Load(); m != nil && m.off == off {
		return *m, nil
	}
	m, err := p.findMark(off)
	if err != nil {
		return mark{}, err
	}
	p.stableMark.Store(&m)
	return m, nil
}

// findMark returns the position of the batch starting at off, with no cache.
func (p *Partition) findMark(off int64) (mark, error) {
	segs := p.segments()
	i := sort.Search(len(segs), func(i int) bool { return segs[i].base > off }) - 1
	if i < 0 {
		if len(segs) > 0 && off < segs[0].base {
			// Below the local log: nothing local to read before it.
			return mark{off: off, seg: segs[0], pos: 0}, nil
		}
		return mark{}, fmt.Errorf("%w: no segment holds offset %d", ErrOffsetOutOfRange, off)
	}
	seg := segs[i]
	m := mark{off: off, seg: seg}
	if off > seg.base {
		h, err := p.store.cache.acquire(seg, refusable)
		if err != nil {
			return mark{}, err
		}
		defer p.store.cache.release(h)
		pos := int64(0)
		if ix, err := p.segmentIndex(seg, h); err == nil {
			seg.mu.RLock()
			pos = ix.lookup(seg.base, off)
			seg.mu.RUnlock()
		}
		sc := newHeaderScanner(h.f, seg.logPath, seg.size.Load())
		defer sc.close()
		limit := seg.size.Load()
		for pos < limit {
			hdr, err := sc.header(pos)
			if err != nil {
				return mark{}, err
			}
			if hdr.BaseOffset >= off {
				break
			}
			pos += int64(hdr.Length)
		}
		m.pos = pos
	}
	return m, nil
}
