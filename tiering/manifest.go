package tiering

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/synapsebroker/synapse/log"
)

// Manifest is a partition's record of what lives in object storage. It is
// written last, after every object it names: it is the commit point, so it
// never names a missing object. Versioned JSON:
//
//	{"version":1,"log_start_offset":N,"segments":[{"base":..,"next":..,"size":..,"max_timestamp":..,"crc32c":..,
//	  "chunk_bytes":8388608,"chunk_crc32c":[..],"txn_index_bytes":..,"txn_index_crc32c":..}]}
//
// Segments are contiguous: each one's base is the previous one's next.
type Manifest struct {
	Version        int           `json:"version"`
	LogStartOffset int64         `json:"log_start_offset"`
	Segments       []SegmentMeta `json:"segments"`
	// Gen is the last generation handed to a segment that replaced others
	// (compaction, compact.go): its objects' keys carry it, so they never
	// collide with the objects they replace.
	Gen int64 `json:"gen,omitempty"`
	// Epoch and Seq name a fenced manifest (cluster mode, fenced.go): the
	// leader epoch that committed it and its commit count, in its key
	// (manifest-e<epoch>-<seq>-<random>.json), so no commit overwrites another.
	Epoch int32 `json:"epoch,omitempty"`
	Seq   int64 `json:"seq,omitempty"`
}

// SegmentMeta describes one uploaded segment.
type SegmentMeta struct {
	Base         int64  `json:"base"`
	Next         int64  `json:"next"` // offset after its last batch
	Size         int64  `json:"size"`
	MaxTimestamp int64  `json:"max_timestamp"`
	CRC32C       uint32 `json:"crc32c"` // of the whole .log object
	// ChunkCRC32C is the CRC-32C of each ChunkBytes-aligned range of the
	// .log object: cold reads verify each chunk as it downloads. Manifests
	// from before it (or with another chunk size) have none, and their
	// batches are checked one by one on every read.
	ChunkBytes  int64    `json:"chunk_bytes,omitempty"`
	ChunkCRC32C []uint32 `json:"chunk_crc32c,omitempty"`
	// TxnIndexBytes is the size of the segment's .txnindex object (its
	// aborted transactions, uploaded beside it); 0: none, and no GET for
	// it (manifests from before transactions have none).
	TxnIndexBytes  int64  `json:"txn_index_bytes,omitempty"`
	TxnIndexCRC32C uint32 `json:"txn_index_crc32c,omitempty"` // of the .txnindex object
	// Gen is 0 for a segment uploaded as the log wrote it; a compacted
	// segment that replaced others has the manifest's generation then,
	// in its keys too (<base>-<gen>.log).
	Gen int64 `json:"gen,omitempty"`
	// Cleaned: written by compaction, so its offsets may have gaps.
	Cleaned bool `json:"cleaned,omitempty"`
	// Fenced: uploaded by a cluster leader at leader epoch Epoch, which its
	// keys carry (<base>-<gen>-e<epoch>.log), so a deposed leader's
	// uploads never overwrite its successor's objects.
	Fenced bool  `json:"fenced,omitempty"`
	Epoch  int32 `json:"epoch,omitempty"`
}

// Next is the offset after the last uploaded segment (the log start if none).
func (m *Manifest) Next() int64 {
	if n := len(m.Segments); n > 0 {
		return m.Segments[n-1].Next
	}
	return m.LogStartOffset
}

// Releasable reports whether local segment s may go: it lies wholly below
// the local log's start logStart, or the bucket holds it, the manifest
// naming a segment of the same offsets and size. A manifest's end offset
// alone is no proof: one that is not this log's could claim any end.
func (m *Manifest) Releasable(s log.SegmentInfo, logStart int64) bool {
	if s.Next <= logStart {
		return true
	}
	i, ok := slices.BinarySearchFunc(m.Segments, s.Base, func(sm SegmentMeta, base int64) int { return cmp.Compare(sm.Base, base) })
	return ok && m.Segments[i].Next == s.Next && m.Segments[i].Size == s.Size
}

// OnlyInBucket returns the segments whose offsets lie below the local log's
// start below (the bucket holds the only copy), past the log start.
func (m *Manifest) OnlyInBucket(below int64) []SegmentMeta {
	var out []SegmentMeta
	for _, s := range m.Segments {
		if s.Next > m.LogStartOffset && s.Next <= below {
			out = append(out, s)
		}
	}
	return out
}

// span finds the segments a compacted segment covering [base, next)
// replaces: [i, j), the first starting at base, the last ending at or
// before next, nothing straddling next. ok is false if the boundaries do
// not line up.
func (m *Manifest) span(base, next int64) (i, j int, ok bool) {
	i, found := slices.BinarySearchFunc(m.Segments, base, func(sm SegmentMeta, b int64) int { return cmp.Compare(sm.Base, b) })
	if !found {
		return 0, 0, false
	}
	j, _ = slices.BinarySearchFunc(m.Segments, next, func(sm SegmentMeta, b int64) int { return cmp.Compare(sm.Base, b) })
	return i, j, m.Segments[j-1].Next <= next
}

func (m *Manifest) clone() *Manifest {
	c := *m
	c.Segments = append([]SegmentMeta(nil), m.Segments...)
	return &c
}

func (m *Manifest) encode() ([]byte, error) {
	m.Version = 1
	return json.Marshal(m)
}

func decodeManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("tiering: manifest: %w", err)
	}
	if m.Version != 1 {
		return nil, fmt.Errorf("tiering: manifest version %d", m.Version)
	}
	for i, sg := range m.Segments {
		if sg.Base < 0 || sg.Next <= sg.Base || sg.Size < 0 || sg.Size == 0 && !sg.Cleaned {
			return nil, fmt.Errorf("tiering: manifest segment %d: offsets [%d,%d), %d bytes", i, sg.Base, sg.Next, sg.Size)
		}
		if sg.TxnIndexBytes < 0 || sg.TxnIndexBytes%txnEntryBytes != 0 {
			return nil, fmt.Errorf("tiering: manifest segment %d: txn index of %d bytes", i, sg.TxnIndexBytes)
		}
		if sg.Epoch < 0 || m.Epoch < 0 || m.Seq < 0 {
			return nil, fmt.Errorf("tiering: manifest segment %d: epoch %d (manifest at %d, seq %d)", i, sg.Epoch, m.Epoch, m.Seq)
		}
		if sg.Gen < 0 || sg.Gen > m.Gen {
			return nil, fmt.Errorf("tiering: manifest segment %d: generation %d (manifest at %d)", i, sg.Gen, m.Gen)
		}
		if i > 0 && sg.Base != m.Segments[i-1].Next {
			return nil, fmt.Errorf("tiering: manifest segments not contiguous at %d", sg.Base)
		}
	}
	// A log start past the segments is possible (DeleteRecords racing an
	// upload): the bucket's log is empty there, nothing to refuse.
	if m.LogStartOffset < 0 {
		return nil, fmt.Errorf("tiering: manifest log start %d", m.LogStartOffset)
	}
	return &m, nil
}
