package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxFrameSize is Kafka's socket.request.max.bytes default.
const DefaultMaxFrameSize = 100 << 20

// minFrameSize is the smallest request: api key, version, correlation id.
const minFrameSize = 8

// frameChunk is how much buffer a frame may claim before its bytes arrive:
// the buffer grows with the data, so a client announcing a huge frame and
// sending nothing costs nothing.
const frameChunk = 64 << 10

var (
	// ErrFrameTooLarge means a frame's size prefix exceeds the cap.
	ErrFrameTooLarge = errors.New("protocol: frame larger than the request size cap")
	// ErrFrameSize means a frame's size prefix is too small to be a request.
	ErrFrameSize = errors.New("protocol: invalid frame size")
)

// ReadFrame reads one size-prefixed frame from r and returns its payload
// (without the size), reusing buf's storage when it is big enough. The size
// is checked against maxSize before anything is allocated, and the buffer grows
// only as bytes actually arrive.
func ReadFrame(r io.Reader, buf []byte, maxSize int) ([]byte, error) {
	var sz [4]byte
	if _, err := io.ReadFull(r, sz[:]); err != nil {
		return nil, err
	}
	n := int(int32(binary.BigEndian.Uint32(sz[:])))
	if n < minFrameSize {
		return nil, fmt.Errorf("%w: %d", ErrFrameSize, n)
	}
	if n > maxSize {
		return nil, fmt.Errorf("%w: %d bytes, cap %d", ErrFrameTooLarge, n, maxSize)
	}
	if cap(buf) >= n {
		buf = buf[:n]
		_, err := io.ReadFull(r, buf)
		return buf, unexpected(err)
	}
	buf = buf[:0]
	for len(buf) < n {
		step := min(n-len(buf), max(len(buf), frameChunk))
		if cap(buf)-len(buf) < step {
			nb := make([]byte, len(buf), len(buf)+step)
			copy(nb, buf)
			buf = nb
		}
		if _, err := io.ReadFull(r, buf[len(buf):len(buf)+step]); err != nil {
			return nil, unexpected(err)
		}
		buf = buf[:len(buf)+step]
	}
	return buf, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
