package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Request is a parsed request: header fields and the kmsg body. Byte fields
// of the body (a produce request's records) alias the frame; strings do not.
type Request struct {
	Key           int16
	Version       int16
	CorrelationID int32
	ClientID      string
	Body          kmsg.Request
}

var (
	// ErrUnknownKey means the API key is not one Kafka defines (or not one
	// Synapse implements). Kafka closes the connection for it.
	ErrUnknownKey = errors.New("protocol: unknown or unimplemented api key")
	// ErrUnsupportedVersion means the key is implemented but not at this
	// version. Only ApiVersions answers it (a v0 body with
	// UNSUPPORTED_VERSION); for other keys Kafka closes the connection.
	ErrUnsupportedVersion = errors.New("protocol: unsupported api version")
	// ErrMalformed means the frame does not decode as the request it claims.
	ErrMalformed = errors.New("protocol: malformed request")
)

// maxNonProduceFrame caps every request but Produce (which gets the
// connection's full cap, Kafka's socket.request.max.bytes).
const maxNonProduceFrame = 8 << 20

// Parse decodes a request frame (without its size prefix). On
// ErrUnsupportedVersion the returned Request still carries the header
// fields, so the caller can answer ApiVersions.
func Parse(frame []byte) (*Request, error) {
	if len(frame) < minFrameSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrMalformed, len(frame))
	}
	be := binary.BigEndian
	req := &Request{
		Key:           int16(be.Uint16(frame[0:])),
		Version:       int16(be.Uint16(frame[2:])),
		CorrelationID: int32(be.Uint32(frame[4:])),
	}
	r := kbin.Reader{Src: frame[8:]}
	if cid := r.NullableString(); cid != nil {
		req.ClientID = *cid
	}
	if !r.Ok() {
		return req, fmt.Errorf("%w: client id", ErrMalformed)
	}
	if !Implemented(req.Key) {
		return req, fmt.Errorf("%w: key %d", ErrUnknownKey, req.Key)
	}
	if !Supported(req.Key, req.Version) {
		return req, fmt.Errorf("%w: key %d version %d", ErrUnsupportedVersion, req.Key, req.Version)
	}
	// kmsg decodes an array of n elements into n structs after checking
	// that n times the element's minimum encoded size remains, so decoding
	// allocates at most a few tens of times the frame. Only Produce needs big
	// frames; every other request is capped lower to keep that bounded.
	if req.Key != 0 && len(frame) > maxNonProduceFrame {
		return req, fmt.Errorf("%w: %s request of %d bytes (cap %d for all but Produce)", ErrMalformed, kmsg.NameForKey(req.Key), len(frame), maxNonProduceFrame)
	}
	body := kmsg.RequestForKey(req.Key)
	body.SetVersion(req.Version)
	if body.IsFlexible() {
		kmsg.SkipTags(&r)
		if !r.Ok() {
			return req, fmt.Errorf("%w: header tags", ErrMalformed)
		}
	}
	if req.Key == 0 {
		// A Produce may be 100 MiB: its entries are counted before kmsg
		// makes a struct for each (as few as 3 bytes each on the wire).
		if n, ok := produceEntries(r.Src, req.Version, body.IsFlexible()); ok && n > maxProduceEntries {
			return req, fmt.Errorf("%w: Produce with over %d topic and partition entries", ErrMalformed, maxProduceEntries)
		}
	}
	// ReadFrom, not UnsafeReadFrom: strings are copied (handlers keep topic
	// names and configs), while byte fields such as a produce request's
	// records still alias the frame, so appends copy nothing.
	if err := body.ReadFrom(r.Src); err != nil {
		return req, fmt.Errorf("%w: %s v%d: %v", ErrMalformed, kmsg.NameForKey(req.Key), req.Version, err)
	}
	req.Body = body
	return req, nil
}

// maxProduceEntries bounds the topic and partition entries of one Produce
// request: decoding makes a struct of dozens of bytes for each (and the
// broker another for its answer), so a 100 MiB frame of empty entries
// would cost gigabytes. Real producers send a few per broker.
const maxProduceEntries = 100_000

// produceEntries counts the topic and partition entries a Produce body
// (v3+) declares, without decoding it: kmsg makes the structs for a
// declared array before it finds whether the bytes are there. It stops as
// soon as the count passes maxProduceEntries (ok: true). ok is false if
// the body does not parse that far (decoding then says what is wrong,
// having allocated for at most that many entries).
func produceEntries(src []byte, version int16, flexible bool) (n int, ok bool) {
	r := kbin.Reader{Src: src}
	arrayLen := r.ArrayLen
	if flexible {
		arrayLen = r.CompactArrayLen
		r.UnsafeCompactNullableString() // transactional id
	} else {
		r.UnsafeNullableString()
	}
	r.Int16() // acks
	r.Int32() // timeout
	topics := arrayLen()
	if n += max(int(topics), 0); n > maxProduceEntries {
		return n, true
	}
	for i := int32(0); i < topics && r.Ok(); i++ {
		switch {
		case version >= 13:
			r.Uuid()
		case flexible:
			r.UnsafeCompactString()
		default:
			r.UnsafeString()
		}
		parts := arrayLen()
		if n += max(int(parts), 0); n > maxProduceEntries {
			return n, true
		}
		for j := int32(0); j < parts && r.Ok(); j++ {
			r.Int32() // partition
			if flexible {
				r.CompactNullableBytes()
				kmsg.SkipTags(&r)
			} else {
				r.NullableBytes()
			}
		}
		if flexible {
			kmsg.SkipTags(&r)
		}
	}
	return n, r.Ok()
}
