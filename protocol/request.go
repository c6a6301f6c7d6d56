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
	// ReadFrom, not UnsafeReadFrom: strings are copied (handlers keep topic
	// names and configs), while byte fields such as a produce request's
	// records still alias the frame, so appends copy nothing.
	if err := body.ReadFrom(r.Src); err != nil {
		return req, fmt.Errorf("%w: %s v%d: %v", ErrMalformed, kmsg.NameForKey(req.Key), req.Version, err)
	}
	req.Body = body
	return req, nil
}
