package broker

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/synapsebroker/synapse/log"
)

// Record-level views of a stored batch, for the few requests that need them
// (ListOffsets by timestamp and max timestamp). The produce and fetch paths
// never decompress.

// maxDecompressed bounds how much one batch may decompress to here, so a
// crafted batch cannot make the broker allocate without limit.
const maxDecompressed = 64 << 20

var errDecompress = errors.New("batch records do not decompress")

// findRecord returns the first record of a stored batch at or after
// minOffset whose timestamp matches, walking the records in place (no list
// of them: a compressed batch may claim some 150 million records per MiB).
func findRecord(batch []byte, minOffset int64, match func(ts int64) bool) (recordTime, bool, error) {
	h, err := log.ParseBatchHeader(batch)
	if err != nil {
		return recordTime{}, false, err
	}
	if h.LogAppendTime() {
		// Every record carries the batch's append time.
		first := max(h.BaseOffset, minOffset)
		if first > h.LastOffset() || !match(h.MaxTimestamp) {
			return recordTime{}, false, nil
		}
		return recordTime{first, h.MaxTimestamp}, true, nil
	}
	recs := batch[log.BatchHeaderSize:h.Length]
	if h.Codec() != log.CodecNone {
		if recs, err = decompress(h.Codec(), recs); err != nil {
			return recordTime{}, false, err
		}
	}
	for i := int32(0); i < h.NumRecords && len(recs) > 0; i++ {
		length, n := binary.Varint(recs)
		if n <= 0 || length < 0 || int64(len(recs)-n) < length {
			return recordTime{}, false, fmt.Errorf("record %d: bad length", i)
		}
		rec := recs[n : n+int(length)]
		recs = recs[n+int(length):]
		if len(rec) < 1 {
			return recordTime{}, false, fmt.Errorf("record %d: empty", i)
		}
		tsDelta, n1 := binary.Varint(rec[1:])
		if n1 <= 0 {
			return recordTime{}, false, fmt.Errorf("record %d: bad timestamp delta", i)
		}
		offDelta, n2 := binary.Varint(rec[1+n1:])
		if n2 <= 0 {
			return recordTime{}, false, fmt.Errorf("record %d: bad offset delta", i)
		}
		if r := (recordTime{h.BaseOffset + offDelta, h.BaseTimestamp + tsDelta}); r.offset >= minOffset && match(r.ts) {
			return r, true, nil
		}
	}
	return recordTime{}, false, nil
}

type recordTime struct {
	offset, ts int64
}

func decompress(codec log.Codec, src []byte) ([]byte, error) {
	if codec == log.CodecSnappy {
		return unsnappy(src)
	}
	r, done, err := openCompressed(codec, src)
	if err != nil {
		return nil, err
	}
	defer done()
	out, err := io.ReadAll(io.LimitReader(r, maxDecompressed+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errDecompress, err)
	}
	if len(out) > maxDecompressed {
		return nil, fmt.Errorf("%w: more than %d bytes", errDecompress, maxDecompressed)
	}
	return out, nil
}

// Decompressors are pooled (a zstd decoder costs some hundred KiB to set
// up): each is reset onto the next batch.
var (
	gzipReaders sync.Pool // *gzip.Reader
	lz4Readers  = sync.Pool{New: func() any { return lz4.NewReader(nil) }}
	zstdReaders = sync.Pool{New: func() any {
		// Options that cannot fail: a decoder using at most
		// maxDecompressed for its window, in the calling goroutine.
		d, err := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(maxDecompressed), zstd.WithDecoderConcurrency(1))
		if err != nil {
			panic(err)
		}
		return d
	}}
)

// openCompressed returns a reader of src decompressed by codec (not
// bounded: the caller limits what it reads) and done, to call once
// the reader is no longer used. Snappy (a whole block at once) is the
// caller's (unsnappy).
func openCompressed(codec log.Codec, src []byte) (r io.Reader, done func(), err error) {
	switch codec {
	case log.CodecGzip:
		zr, _ := gzipReaders.Get().(*gzip.Reader)
		if zr == nil {
			zr, err = gzip.NewReader(bytes.NewReader(src))
		} else {
			err = zr.Reset(bytes.NewReader(src))
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %v", errDecompress, err)
		}
		return zr, func() { gzipReaders.Put(zr) }, nil
	case log.CodecLZ4:
		zr := lz4Readers.Get().(*lz4.Reader)
		zr.Reset(bytes.NewReader(src))
		return zr, func() { zr.Reset(nil); lz4Readers.Put(zr) }, nil
	case log.CodecZstd:
		zr := zstdReaders.Get().(*zstd.Decoder)
		if err := zr.Reset(bytes.NewReader(src)); err != nil {
			zstdReaders.Put(zr)
			return nil, nil, fmt.Errorf("%w: %v", errDecompress, err)
		}
		return zr, func() { _ = zr.Reset(nil); zstdReaders.Put(zr) }, nil
	}
	return nil, nil, fmt.Errorf("%w: codec %v", errDecompress, codec)
}

// xerialHeader starts snappy data framed the way the Java client writes it.
var xerialHeader = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

// unsnappy decodes raw snappy blocks (librdkafka, franz-go) and the xerial
// framing (Java client: 16-byte header, then length-prefixed blocks).
func unsnappy(src []byte) ([]byte, error) {
	block := func(b []byte) ([]byte, error) {
		n, err := s2.DecodedLen(b)
		if err != nil || n > maxDecompressed {
			return nil, fmt.Errorf("%w: snappy block", errDecompress)
		}
		return s2.Decode(nil, b)
	}
	if !bytes.HasPrefix(src, xerialHeader) {
		return block(src)
	}
	if len(src) < 16 {
		return nil, fmt.Errorf("%w: short xerial header", errDecompress)
	}
	src = src[16:]
	var out []byte
	for len(src) > 0 {
		if len(src) < 4 {
			return nil, fmt.Errorf("%w: xerial block length", errDecompress)
		}
		n := int(binary.BigEndian.Uint32(src))
		src = src[4:]
		if n < 0 || n > len(src) {
			return nil, fmt.Errorf("%w: xerial block of %d bytes", errDecompress, n)
		}
		b, err := block(src[:n])
		if err != nil {
			return nil, err
		}
		if len(out)+len(b) > maxDecompressed {
			return nil, fmt.Errorf("%w: more than %d bytes", errDecompress, maxDecompressed)
		}
		out = append(out, b...)
		src = src[n:]
	}
	return out, nil
}
