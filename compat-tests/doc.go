// Package compattests holds the client compatibility tests of Synapse: real
// Kafka clients (franz-go, sarama, segmentio/kafka-go, confluent-kafka-go,
// kcat, kafka-python) talk to a real `synapse serve` process over TCP.
//
// The package has no code of its own; everything lives in _test.go files.
// It is a separate module so that client libraries never enter the broker's
// dependency graph, and it imports none of the broker's packages: the only
// contract is the wire protocol and the `synapse serve` command line.
//
// See README.md for how to run it and for the compatibility matrix.
package compattests
