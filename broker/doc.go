// Package broker holds Kafka semantics and wiring: listener and connection
// lifecycle, one handler file per API key, the topic registry, consumer
// groups, producer (idempotence) state, and errcode.go, the only place Go
// errors become Kafka error codes. It is the only importer of protocol, log
// and tiering.
//
// Status: not implemented yet; it arrives with the protocol-server issue.
package broker
