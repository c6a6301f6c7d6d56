package log

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// SegmentBatch is one batch as seen by DumpSegment.
type SegmentBatch struct {
	Pos    int64
	Header BatchHeader
}

// DumpSegment walks the batches of one .log file, calling fn for each good
// one, and returns where and why it stopped early ("" if it reached the end).
func DumpSegment(fsys FS, path string, fn func(SegmentBatch)) (stoppedAt int64, reason string, err error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return 0, "", err
	}
	// Gaps are tolerated: a cleaned segment's are legitimate (VerifyDir is
	// the check that knows which segments may have them).
	res, err := walkSegment(f, 0, size, -1, true, func(pos int64, h *BatchHeader) {
		if fn != nil {
			fn(SegmentBatch{Pos: pos, Header: *h})
		}
	})
	return res.end, res.reason, err
}

// VerifyReport is the result of VerifyDir.
type VerifyReport struct {
	Segments int
	Batches  int
	Bytes    int64
	// FirstOffset and NextOffset bound the offsets stored in the directory.
	FirstOffset, NextOffset int64
	// Damage lists corruption: bad CRCs or framing inside the log (other than
	// a torn tail of the last segment), gaps between segments, index files
	// that claim to match the log but point at the wrong places.
	Damage []string
	// Notes lists what recovery repairs on the next open without loss of
	// acknowledged data: a torn tail of the last segment, stale or missing
	// index files.
	Notes []string
}

// OK reports whether no damage was found.
func (r *VerifyReport) OK() bool { return len(r.Damage) == 0 }

// VerifyDir checks a partition directory without changing it: every batch's
// framing, magic, CRC-32C and offset continuity (gaps allowed only in
// segments the cleaner wrote), segment contiguity, and that
// each index file either is stale (built for another log size, so it will be
// rebuilt) or agrees with the log entry by entry.
func VerifyDir(fsys FS, dir string) (*VerifyReport, error) {
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var bases []int64
	txn := map[string]bool{}
	for _, n := range names {
		if b, ok := parseSegmentName(n, ".log"); ok {
			bases = append(bases, b)
		} else if strings.HasSuffix(n, txnIndexExt) {
			txn[n] = true
		}
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
	rep := &VerifyReport{Segments: len(bases)}
	if len(bases) == 0 {
		return rep, nil
	}
	rep.FirstOffset = bases[0]
	ck, err := readCleanerCheckpoint(fsys, dir)
	if err != nil {
		rep.Damage = append(rep.Damage, err.Error())
	}
	next := int64(-1)
	prevCleaned := false
	for i, base := range bases {
		last := i == len(bases)-1
		seg := newSegment(dir, base, time.Time{})
		name := filepath.Base(seg.logPath)
		// Offset gaps are allowed only in segments the cleaner wrote: flagged
		// so in their index header, or below the cleaner checkpoint's
		// cleaned_below. Never in the last (active) segment.
		cleaned := !last && (base < ck.CleanedBelow || indexFlagged(fsys, seg))
		if next >= 0 && base != next && !(prevCleaned && next < base) {
			rep.Damage = append(rep.Damage, fmt.Sprintf("%s: starts at offset %d, previous segment ends at %d", name, base, next))
		}
		f, err := fsys.OpenFile(seg.logPath, os.O_RDONLY, 0)
		if err != nil {
			return nil, err
		}
		size, err := f.Size()
		if err != nil {
			f.Close()
			return nil, err
		}
		starts := map[int64]int64{} // pos -> base offset
		res, err := walkSegment(f, 0, size, base, cleaned, func(pos int64, h *BatchHeader) {
			starts[pos] = h.BaseOffset
			rep.Batches++
		})
		prevCleaned = cleaned
		f.Close()
		if err != nil {
			return nil, err
		}
		rep.Bytes += res.end
		next = res.next
		if res.end != size {
			next = -1 // unknown past the damage: do not report the gap too
			msg := fmt.Sprintf("%s: bad data at byte %d of %d (%s)", name, res.end, size, res.reason)
			if last {
				rep.Notes = append(rep.Notes, msg+": torn tail, truncated on next open")
			} else {
				rep.Damage = append(rep.Damage, msg)
			}
		}
		verifyIndexFiles(fsys, seg, size, res, starts, cleaned, rep)
		if txn[filepath.Base(seg.txnIndexPath())] {
			verifyTxnIndex(fsys, seg, res, size, last, rep)
		}
	}
	rep.NextOffset = next
	return rep, nil
}

// indexFlagged reports whether seg's offset index header marks it as
// written by the cleaner.
func indexFlagged(fsys FS, seg *segment) bool {
	b, err := readIndexFile(fsys, seg.indexPath())
	if err != nil {
		return false
	}
	m, _, err := decodeIndex(b, indexKindOffset, seg.base)
	return err == nil && m.flags&indexFlagCleaned != 0
}

func verifyIndexFiles(fsys FS, seg *segment, size int64, res walkResult, starts map[int64]int64, cleaned bool, rep *VerifyReport) {
	name := filepath.Base(seg.indexPath())
	b, err := readIndexFile(fsys, seg.indexPath())
	if err != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s: missing or unreadable, rebuilt on open", name))
		return
	}
	m, ix, err := decodeIndex(b, indexKindOffset, seg.base)
	if err != nil || m.logSize != size {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s: stale, rebuilt on open", name))
		return
	}
	if (m.next != res.next && !cleaned || m.next < res.next) && res.end == size {
		rep.Damage = append(rep.Damage, fmt.Sprintf("%s: says next offset %d, log says %d", name, m.next, res.next))
	}
	for _, e := range ix.offsets {
		if int64(e.pos) >= res.end {
			break // past damage already reported
		}
		if off, ok := starts[int64(e.pos)]; !ok || off != seg.base+int64(e.rel) {
			rep.Damage = append(rep.Damage, fmt.Sprintf("%s: entry offset %d -> byte %d is not that batch", name, seg.base+int64(e.rel), e.pos))
			return
		}
	}
	tname := filepath.Base(seg.timeIndexPath())
	tb, err := readIndexFile(fsys, seg.timeIndexPath())
	if err != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s: missing or unreadable, rebuilt on open", tname))
		return
	}
	tm, tix, err := decodeIndex(tb, indexKindTime, seg.base)
	if err != nil || tm.logSize != size {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s: stale, rebuilt on open", tname))
		return
	}
	indexed := map[int64]bool{}
	for _, e := range ix.offsets {
		indexed[int64(e.rel)] = true
	}
	for _, e := range tix.times {
		if !indexed[int64(e.rel)] || e.ts > tm.maxTs {
			rep.Damage = append(rep.Damage, fmt.Sprintf("%s: entry ts %d -> offset %d does not match the offset index", tname, e.ts, seg.base+int64(e.rel)))
			return
		}
	}
}
