package log

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// The cleaner's codecs: a batch it rewrites is re-encoded with the codec
// it was written with (snappy in the framing it came in: raw block or the
// Java client's xerial frames).

// maxCleanRecords bounds the decompressed records of one batch the cleaner
// reads (a batch is at most max.message.bytes compressed).
const maxCleanRecords = 256 << 20

var xerialMagic = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

func decompressRecords(codec Codec, src []byte) ([]byte, error) {
	var r io.Reader
	switch codec {
	case CodecNone:
		return src, nil
	case CodecGzip:
		zr, err := gzip.NewReader(bytes.NewReader(src))
		if err != nil {
			return nil, err
		}
		r = zr
	case CodecSnappy:
		return unsnappyRecords(src)
	case CodecLZ4:
		r = lz4.NewReader(bytes.NewReader(src))
	case CodecZstd:
		zr, err := zstd.NewReader(bytes.NewReader(src), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxCleanRecords))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		r = zr
	default:
		return nil, fmt.Errorf("codec %v", codec)
	}
	out, err := io.ReadAll(io.LimitReader(r, maxCleanRecords+1))
	if err != nil {
		return nil, err
	}
	if len(out) > maxCleanRecords {
		return nil, fmt.Errorf("more than %d bytes of records", maxCleanRecords)
	}
	return out, nil
}

func unsnappyRecords(src []byte) ([]byte, error) {
	if !bytes.HasPrefix(src, xerialMagic) {
		return s2.Decode(nil, src)
	}
	if len(src) < 16 {
		return nil, fmt.Errorf("short xerial header")
	}
	src = src[16:]
	var out []byte
	for len(src) > 0 {
		if len(src) < 4 {
			return nil, fmt.Errorf("xerial block length")
		}
		n := int(binary.BigEndian.Uint32(src))
		src = src[4:]
		if n < 0 || n > len(src) {
			return nil, fmt.Errorf("xerial block of %d bytes", n)
		}
		b, err := s2.Decode(nil, src[:n])
		if err != nil {
			return nil, err
		}
		if len(out)+len(b) > maxCleanRecords {
			return nil, fmt.Errorf("more than %d bytes of records", maxCleanRecords)
		}
		out = append(out, b...)
		src = src[n:]
	}
	return out, nil
}

// compressRecords encodes records with codec; like is the original
// compressed data (for snappy's framing).
func compressRecords(codec Codec, records, like []byte) ([]byte, error) {
	var buf bytes.Buffer
	switch codec {
	case CodecNone:
		return records, nil
	case CodecGzip:
		w := gzip.NewWriter(&buf)
		if _, err := w.Write(records); err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
	case CodecSnappy:
		if !bytes.HasPrefix(like, xerialMagic) {
			return s2.EncodeSnappy(nil, records), nil
		}
		hdr := like[:16] // magic, version, compatible version
		buf.Write(hdr)
		const block = 32 << 10
		for len(records) > 0 {
			n := min(len(records), block)
			enc := s2.EncodeSnappy(nil, records[:n])
			buf.Write(binary.BigEndian.AppendUint32(nil, uint32(len(enc))))
			buf.Write(enc)
			records = records[n:]
		}
	case CodecLZ4:
		w := lz4.NewWriter(&buf)
		if _, err := w.Write(records); err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
	case CodecZstd:
		w, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(records); err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("codec %v", codec)
	}
	return buf.Bytes(), nil
}
