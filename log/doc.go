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
// Reads CRC-check bytes the first time this process serves them (appended
// and scanned bytes are already checked), so bit rot on disk is an error,
// never garbage sent to a client.
package log
