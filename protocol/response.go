package protocol

import (
	"encoding/binary"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// FlexibleHeader reports whether a response to key at version has a
// flexible (v1) header. ApiVersions never does: a client must be able to
// read it before it knows which versions the broker speaks.
func FlexibleHeader(resp kmsg.Response) bool {
	return resp.IsFlexible() && resp.Key() != 18
}

// AppendResponse appends a whole response frame (size, correlation id,
// header tags when flexible, body) to dst.
func AppendResponse(dst []byte, correlationID int32, resp kmsg.Response) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(correlationID))
	if FlexibleHeader(resp) {
		dst = append(dst, 0)
	}
	dst = resp.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}
