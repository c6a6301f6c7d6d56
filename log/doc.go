// Package log is Synapse's partition log engine: a local, crash-safe,
// fsync'd commit log of Kafka v2 RecordBatches stored exactly as clients sent
// them. It knows nothing of Kafka error codes, sockets or object storage.
//
// # Directory layout
//
//	<data>/<topic>-<partition>/
//	    00000000000000000000.log        batches, offsets 0..
//	    00000000000000000000.index      sparse offset index (derived)
//	    00000000000000000000.timeindex  sparse time index (derived)
//	    00000000000000000000.txnindex   aborted transactions (only if any)
//	    00000000000000004711.log        next segment: name = base offset, %020d
//	    ...
//	    partition.state                 log start offset + clean-close record
//	    cleaner.checkpoint              log cleaner: first dirty offset, cleaned_below
//
// # Segment (.log)
//
// A segment is a plain sequence of v2 RecordBatches. The batch header is the
// frame: nothing is added around it.
//
//	+------------+-------------+--------------+-------+--------+------ ... --+
//	| baseOffset | batchLength | leaderEpoch  | magic | crc32c | attributes..|
//	|  int64     |  int32      |  int32       | int8=2| uint32 | (CRC covers |
//	| (patched)  | (bytes after|              |       |        |  21..end)   |
//	+------------+-------------+--------------+-------+--------+------ ... --+
//	0            8             12             16      17       21
//
// On append the log checks length, magic 2, CRC-32C, codec and record count
// (= lastOffsetDelta+1), then assigns offsets by writing baseOffset (bytes
// 0..7, outside the CRC) in place. Records are never decompressed or
// re-encoded, so a fetch is a byte-range copy and the cold tier can hold the
// very same bytes.
//
// # Index files
//
// Both index files start with a 48-byte header (magic "SYNX", version, kind,
// base offset, the .log size they were built for, next offset, max timestamp,
// entry count, CRC-32C of header and entries). Offset index entries are
// (relOffset uint32, position uint32), one at the first batch after every
// index.interval.bytes (default 4096); time index entries are (max timestamp
// so far int64, relOffset uint32) at offset-index points where the maximum
// grew. Indexes are derived data: an index whose header does not match its
// .log (size, CRC, base) is rebuilt from the log.
//
// # Aborted-transaction index (.txnindex)
//
// Kafka's format, one 34-byte big-endian entry per ABORT marker in the
// segment, in marker order, no header:
//
//	+---------+------------+-------------+------------+------------------+
//	| version | producerId | firstOffset | lastOffset | lastStableOffset |
//	| int16=0 | int64      | int64       | int64      | int64            |
//	+---------+------------+-------------+------------+------------------+
//	0         2            10            18           26                 34
//
// lastOffset is the marker's offset (inside the segment), firstOffset the
// transaction's first offset in the partition (possibly in an earlier
// segment), lastStableOffset the partition's LSO once the marker was
// written: a read_committed fetch collects entries from the segment holding
// its offset on and stops at one whose lastStableOffset reaches its upper
// bound. The file exists only for segments with an abort, so which segments
// have one is known from the directory listing; sealed segments' files load
// on first use. It is fsync'd when its segment rolls and at close, not per
// entry: it is not derived from the .log alone (firstOffset needs producer
// state), so after a crash the broker replays the log from its
// producer-state snapshot and rebuilds the entries above it
// (RebuildAborted). A torn tail, or entries at or past the recovered log
// end, are cut at open. It goes with its segment (retention, release after
// upload) and is uploaded beside it.
//
// # Durability
//
// Under the durable policy (the default) Append writes with one pwrite and
// WaitDurable returns once the bytes are fdatasync'd. A single syncer
// goroutine per Store runs group commit: partitions with unsynced bytes
// register; a round takes all of them, fsyncs each (a few in parallel), then
// advances their high watermarks; whoever arrives during a round joins the
// next. The high watermark is the durable end: readers never see bytes a crash
// could take back. The interval policy fsyncs every interval instead and
// shows appends at once (Kafka's page-cache behaviour). A failed write or
// fsync takes the partition offline (ErrStorage) for good: no retry.
//
// # Recovery
//
// A segment roll fsyncs the old segment and its indexes before the new one
// takes writes, so every segment but the last is wholly durable and only the
// last can have a torn tail. On open:
//
//   - temp files and index files without a .log are removed;
//   - sealed segments are trusted from their index headers (size must match),
//     else their index is rebuilt by a scan; damage found then is corruption,
//     remembered, and reported by reads that reach it;
//   - the last segment is trusted if partition.state records a clean close at
//     exactly its current size (bytes below a clean close's size are never
//     rewritten); otherwise it is scanned batch by batch (length, magic, CRC,
//     contiguous offsets), the file is truncated after the last good batch
//     (logged with segment, bytes and first offset dropped) and fsync'd.
//
// # Log cleaner (compaction)
//
// Partition.Clean (cleaner.go, cleaner_engine.go) follows Kafka's Cleaner.
// The dirty range runs from the checkpoint (cleaner.checkpoint first_dirty)
// to the cleanable end: the active segment's base, the high watermark,
// the caller's last stable offset, and the base of the first dirty
// segment holding a batch younger than min.compaction.lag.ms. A KeyMap
// (Kafka's SkimpyOffsetMap: MD5 of the key + offset, 24-byte slots, 90%
// load) maps the latest offset of each key there, skipping control
// batches and aborted transactions; if it fills, the end moves down to
// the first batch that did not fit and the next clean goes on from there.
// Then every local segment below the end is rewritten (Kafka re-cleans
// the clean part too), in order, merging consecutive segments while the
// output and the next input fit in segment.bytes. Invariants:
//
//   - offsets never change: a batch keeps its base offset and
//     lastOffsetDelta (MemoryRecords.filterTo), so gaps appear inside and
//     between batches and at a segment's end; segments stay contiguous by
//     their [base, next) ranges;
//   - below the end a keyed record stays if it is its key's latest, a
//     record without a key goes, aborted transactions' records go;
//     batches at or past the end are copied untouched;
//   - a batch whose records all stay is copied byte for byte; a changed
//     one is re-encoded with its codec (snappy in its framing), with the
//     same producer fields and leader epoch, a new record count, max
//     timestamp (CreateTime) and CRC; a batch left empty goes, except each
//     producer's last data batch and trailing marker (found by a header
//     scan of the whole log), kept as a bare header for producer state;
//   - tombstones and markers use KIP-534's per-batch delete horizon
//     (attribute bit 6, baseTimestamp = horizon, record timestamp deltas
//     rebased): a batch with a tombstone, or a marker whose transaction has
//     nothing left, gets horizon = now + delete.retention.ms the first time
//     it is cleaned, and a later clean at or past the horizon drops them.
//     A marker stays while any batch of its transaction was seen earlier
//     in the same pass (so committed data keeps its marker while it has
//     batches; aborted data is always dropped first), and an ABORT marker
//     of a transaction starting below the local log (tiered) stays; the
//     output's .txnindex keeps the entry of every ABORT marker it keeps;
//   - the active segment is never cleaned; a horizon only passes at a
//     clean with a dirty range (no clean runs on expiry alone).
//
// Swap protocol, one group at a time (<B> = the group's first base, N its
// end): write <B>.log.cleaned, .index.cleaned (header flag "cleaned",
// next = N), .timeindex.cleaned, .txnindex.cleaned (if any entry), fsync
// each; raise cleaner.checkpoint cleaned_below to N (atomic write); under
// the partition lock check the group is unchanged (segments, aborted
// entries: else ErrCleanRaced), rename the index files .cleaned -> .swap,
// fsync the directory, rename <B>.log.cleaned -> <B>.log.swap and fsync
// the directory: the commit point. Then the new segment is published
// (served from the open .swap file), the old segments are marked replaced
// (readers that have not opened them retry on the new list; open handles
// keep reading the old files, as with retention), the old segments' files
// are removed (<B>.log excepted), the index .swap files renamed to their
// names, <B>.log.swap renamed over <B>.log last, and the directory
// fsync'd. A failure before the commit removes the new files and leaves
// the partition online on the old segments; after it, the partition goes
// offline and the next open finishes. On open: *.cleaned are removed; a
// <B>.log.swap is a committed swap: if <B>.index.swap is still there the
// old segments with base in (B, N) (N from its header) and <B>.txnindex
// (unless a .txnindex.swap replaces it) are removed; the .swap files are
// then renamed, .log last; index .swap files without a .log.swap are
// removed. A crash thus leaves the old segments or the new, never both,
// never neither. The checkpoint's first_dirty moves after a pass.
//
// Gaps are legitimate only in cleaned segments: those whose index header
// has the cleaned flag or that start below cleaned_below (known even when
// indexes are lost and rebuilt). There, scans (recovery, index rebuild,
// read verification, VerifyDir) accept a batch starting past the previous
// one's end and record counts from 0 to lastOffsetDelta+1, and a segment
// may end before its successor starts; anywhere else a gap is damage.
//
// Reads CRC-check bytes the first time this process serves them (appended
// and scanned bytes are already checked), so bit rot on disk is an error,
// never garbage sent to a client.
package log
