// Package protocol is the Kafka wire layer: size-capped frame reads,
// request/response headers, the API-version table, kmsg parsing and response
// encoding (a Fetch encoder that leaves record bytes as file ranges). It
// imports no other Synapse package.
//
// Status: not implemented yet; it arrives with the protocol-server issue.
package protocol
