package broker

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/protocol"
)

// dispatch routes a parsed request to its handler. protocol.Parse has
// already refused keys and versions outside the version table, so every key
// here is one the table advertises.
//
// A returned error closes the connection (Kafka's answer to requests it
// cannot process); Kafka error codes go in the response body.
func (s *Server) dispatch(c *conn, req *protocol.Request) (kmsg.Response, error) {
	if h := s.beforeHandle.Load(); h != nil {
		(*h)(req)
	}
	switch b := req.Body.(type) {
	case *kmsg.ProduceRequest:
		return s.handleProduce(c, b)
	case *kmsg.FetchRequest:
		return s.handleFetch(c, b)
	case *kmsg.ListOffsetsRequest:
		return s.handleListOffsets(c, b)
	case *kmsg.MetadataRequest:
		return s.handleMetadata(c, b)
	case *kmsg.ApiVersionsRequest:
		return s.handleApiVersions(b)
	case *kmsg.SASLHandshakeRequest:
		return s.handleSaslHandshake(c, b)
	case *kmsg.SASLAuthenticateRequest:
		return s.handleSaslAuthenticate(c, b)
	case *kmsg.CreateTopicsRequest:
		return s.handleCreateTopics(c, b)
	case *kmsg.DeleteTopicsRequest:
		return s.handleDeleteTopics(c, b)
	case *kmsg.InitProducerIDRequest:
		return s.handleInitProducerID(c, b)
	case *kmsg.OffsetForLeaderEpochRequest:
		return s.handleOffsetForLeaderEpoch(c, b)
	case *kmsg.DeleteRecordsRequest:
		return s.handleDeleteRecords(c, b)
	case *kmsg.DescribeConfigsRequest:
		return s.handleDescribeConfigs(c, b)
	case *kmsg.AlterConfigsRequest:
		return s.handleAlterConfigs(c, b)
	case *kmsg.IncrementalAlterConfigsRequest:
		return s.handleIncrementalAlterConfigs(c, b)
	case *kmsg.CreatePartitionsRequest:
		return s.handleCreatePartitions(c, b)
	case *kmsg.DescribeClusterRequest:
		return s.handleDescribeCluster(c, b)
	case *kmsg.DescribeACLsRequest:
		return s.handleDescribeACLs(c, b)
	case *kmsg.CreateACLsRequest:
		return s.handleCreateACLs(c, b)
	case *kmsg.DeleteACLsRequest:
		return s.handleDeleteACLs(c, b)
	case *kmsg.DescribeUserSCRAMCredentialsRequest:
		return s.handleDescribeUserSCRAMCredentials(c, b)
	case *kmsg.AlterUserSCRAMCredentialsRequest:
		return s.handleAlterUserSCRAMCredentials(c, b)
	case *kmsg.FindCoordinatorRequest:
		return s.handleFindCoordinator(c, b)
	case *kmsg.AddPartitionsToTxnRequest:
		return s.handleAddPartitionsToTxn(c, b)
	case *kmsg.AddOffsetsToTxnRequest:
		return s.handleAddOffsetsToTxn(c, b)
	case *kmsg.EndTxnRequest:
		return s.handleEndTxn(c, b)
	case *kmsg.WriteTxnMarkersRequest:
		return s.handleWriteTxnMarkers(c, b)
	case *kmsg.TxnOffsetCommitRequest:
		return s.handleTxnOffsetCommit(c, b)
	case *kmsg.DescribeProducersRequest:
		return s.handleDescribeProducers(c, b)
	case *kmsg.DescribeTransactionsRequest:
		return s.handleDescribeTransactions(c, b)
	case *kmsg.ListTransactionsRequest:
		return s.handleListTransactions(c, b)
	case *kmsg.DescribeLogDirsRequest:
		return s.handleDescribeLogDirs(c, b)
	case *kmsg.ElectLeadersRequest:
		return s.handleElectLeaders(c, b)
	case *kmsg.AlterPartitionAssignmentsRequest:
		return s.handleAlterPartitionReassignments(c, b)
	case *kmsg.ListPartitionReassignmentsRequest:
		return s.handleListPartitionReassignments(c, b)
	case *kmsg.DescribeClientQuotasRequest:
		return s.handleDescribeClientQuotas(c, b)
	case *kmsg.AlterClientQuotasRequest:
		return s.handleAlterClientQuotas(c, b)
	case *kmsg.DescribeTopicPartitionsRequest:
		return s.handleDescribeTopicPartitions(c, b)
	default:
		return s.dispatchGroup(c, req)
	}
}

// handled lists the keys dispatch serves, for the test that the version
// table and the handlers agree.
var handled = []int16{0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 35, 36, 37, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 60, 61, 65, 66, 75}

// errorResponse builds the response to req with code in every error field
// a client checks, for a request whose handler failed (panicked). nil means
// the key has no such builder and the connection is closed instead.
func errorResponse(req kmsg.Request, code int16) kmsg.Response {
	switch r := req.(type) {
	case *kmsg.ProduceRequest:
		if r.Acks == 0 {
			return nil // no answer is expected: close the connection instead
		}
		resp := r.ResponseKind().(*kmsg.ProduceResponse)
		for _, t := range r.Topics {
			rt := kmsg.NewProduceResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	case *kmsg.FetchRequest:
		resp := r.ResponseKind().(*kmsg.FetchResponse)
		resp.ErrorCode = code
		for _, t := range r.Topics {
			rt := kmsg.NewFetchResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewFetchResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	case *kmsg.ListOffsetsRequest:
		resp := r.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, t := range r.Topics {
			rt := kmsg.NewListOffsetsResponseTopic()
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewListOffsetsResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	case *kmsg.MetadataRequest:
		resp := r.ResponseKind().(*kmsg.MetadataResponse)
		for _, t := range r.Topics {
			rt := kmsg.NewMetadataResponseTopic()
			rt.Topic, rt.TopicID, rt.ErrorCode = t.Topic, t.TopicID, code
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	case *kmsg.ApiVersionsRequest:
		resp := r.ResponseKind().(*kmsg.ApiVersionsResponse)
		resp.ErrorCode = code
		return resp
	case *kmsg.CreateTopicsRequest:
		resp := r.ResponseKind().(*kmsg.CreateTopicsResponse)
		for _, t := range r.Topics {
			rt := kmsg.NewCreateTopicsResponseTopic()
			rt.Topic, rt.ErrorCode = t.Topic, code
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	case *kmsg.DeleteTopicsRequest:
		resp := r.ResponseKind().(*kmsg.DeleteTopicsResponse)
		for _, t := range r.TopicNames {
			rt := kmsg.NewDeleteTopicsResponseTopic()
			rt.Topic, rt.ErrorCode = kmsg.StringPtr(t), code
			resp.Topics = append(resp.Topics, rt)
		}
		for _, t := range r.Topics {
			rt := kmsg.NewDeleteTopicsResponseTopic()
			rt.Topic, rt.TopicID, rt.ErrorCode = t.Topic, t.TopicID, code
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	case *kmsg.InitProducerIDRequest:
		resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode, resp.ProducerID, resp.ProducerEpoch = code, -1, -1
		return resp
	case *kmsg.EndTxnRequest:
		resp := r.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode, resp.ProducerID, resp.ProducerEpoch = code, -1, -1
		return resp
	case *kmsg.AddOffsetsToTxnRequest:
		resp := r.ResponseKind().(*kmsg.AddOffsetsToTxnResponse)
		resp.ErrorCode = code
		return resp
	}
	return nil
}
