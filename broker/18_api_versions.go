package broker

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/protocol"
)

// ApiVersions: v0-4
//
// Behavior:
//   - Advertises exactly protocol's version table: what is implemented.
//   - An ApiVersions at a version we do not speak is answered (in conn.go)
//     with a v0 body, UNSUPPORTED_VERSION and the key list.
//   - The response header is never flexible (protocol.AppendResponse).
//
// Version notes:
//   - v3+: client software name/version are accepted and ignored; no
//     features are advertised.
func (s *Server) handleApiVersions(req *kmsg.ApiVersionsRequest) (kmsg.Response, error) {
	return s.apiVersionsResponse(req.Version), nil
}

func (s *Server) apiVersionsResponse(version int16) *kmsg.ApiVersionsResponse {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = version
	for _, v := range protocol.Versions() {
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MinVersion, k.MaxVersion = v.Key, v.Min, v.Max
		resp.ApiKeys = append(resp.ApiKeys, k)
	}
	return resp
}
