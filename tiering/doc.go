// Package tiering offloads sealed segments to object storage (S3 via
// aws-sdk-go-v2, a local directory, in-memory for tests), keeps the
// per-partition manifest, serves cold reads through a chunk cache and
// restores a broker from its bucket. It imports log, never broker.
//
// Status: not implemented yet; it arrives with the tiered-storage issue.
package tiering
