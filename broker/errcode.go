package broker

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/internal/fdbudget"
	"github.com/synapsebroker/synapse/log"
)

// errorCode is the one place a Go error becomes a Kafka error code. Handlers
// may also set kerr codes directly for request validation.
func (s *Server) errorCode(err error) int16 {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errNotLeader):
		return kerr.NotLeaderForPartition.Code
	case errors.Is(err, errNotEnoughISR):
		return kerr.NotEnoughReplicas.Code
	case errors.Is(err, errNotEnoughISRLate):
		return kerr.NotEnoughReplicasAfterAppend.Code
	case errors.Is(err, errReplicaTimeout):
		return kerr.RequestTimedOut.Code
	case errors.Is(err, errBadReplicationFactor):
		return kerr.InvalidReplicationFactor.Code
	case errors.Is(err, log.ErrOffsetOutOfRange), errors.Is(err, log.ErrNotLocal):
		return kerr.OffsetOutOfRange.Code
	case errors.Is(err, log.ErrBatchTooLarge):
		return kerr.MessageTooLarge.Code
	case errors.Is(err, log.ErrBatchCorrupt):
		return kerr.CorruptMessage.Code
	case errors.Is(err, log.ErrInvalidBatch):
		return kerr.InvalidRecord.Code
	case isResource(err):
		// Short of descriptors, memory or disk: retriable, the partition
		// stays online (Kafka's clients retry KAFKA_STORAGE_ERROR).
		s.repeat.Warn("short of a resource: request refused, retriable", zap.Error(err))
		return kerr.KafkaStorageError.Code
	case errors.Is(err, log.ErrStorage), errors.Is(err, log.ErrCorrupt):
		return kerr.KafkaStorageError.Code
	case errors.Is(err, log.ErrClosed):
		return kerr.NotLeaderForPartition.Code // deleted or shutting down: clients refresh metadata
	case errors.Is(err, errOutOfOrderSequence):
		return kerr.OutOfOrderSequenceNumber.Code
	case errors.Is(err, errInvalidEpoch):
		return kerr.InvalidProducerEpoch.Code
	}
	s.repeat.Warn("unexpected error answered as UNKNOWN_SERVER_ERROR", zap.Error(err))
	return kerr.UnknownServerError.Code
}

// isResource reports whether err is the broker short of a resource
// (descriptors, memory, disk space): from the log engine, or from the
// kernel anywhere else (a cold read's cache file). Retriable, never a
// reason to take a partition offline.
func isResource(err error) bool {
	return errors.Is(err, log.ErrResource) || fdbudget.IsResource(err)
}
