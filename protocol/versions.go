package protocol

import "github.com/twmb/franz-go/pkg/kmsg"

// VersionRange is the range of versions of one API key Synapse implements.
type VersionRange struct {
	Key      int16
	Min, Max int16
}

// versions is the one table of what Synapse implements. ApiVersions
// advertises exactly this, and Parse refuses anything outside it. Add a key
// here only with its handler (broker tests check every key has one).
var versions = []VersionRange{
	{Key: 0, Min: 3, Max: 13}, // Produce
	{Key: 1, Min: 4, Max: 17}, // Fetch
	{Key: 2, Min: 0, Max: 9},  // ListOffsets
	{Key: 3, Min: 0, Max: 13}, // Metadata
	{Key: 8, Min: 0, Max: 9},  // OffsetCommit
	{Key: 9, Min: 0, Max: 9},  // OffsetFetch
	{Key: 10, Min: 0, Max: 6}, // FindCoordinator
	{Key: 11, Min: 0, Max: 9}, // JoinGroup
	{Key: 12, Min: 0, Max: 4}, // Heartbeat
	{Key: 13, Min: 0, Max: 5}, // LeaveGroup
	{Key: 14, Min: 0, Max: 5}, // SyncGroup
	{Key: 15, Min: 0, Max: 5}, // DescribeGroups
	{Key: 16, Min: 0, Max: 5}, // ListGroups
	{Key: 17, Min: 0, Max: 1}, // SaslHandshake
	{Key: 18, Min: 0, Max: 4}, // ApiVersions
	{Key: 19, Min: 0, Max: 7}, // CreateTopics
	{Key: 20, Min: 0, Max: 6}, // DeleteTopics
	{Key: 21, Min: 0, Max: 2}, // DeleteRecords
	{Key: 22, Min: 0, Max: 5}, // InitProducerID
	{Key: 23, Min: 0, Max: 4}, // OffsetForLeaderEpoch
	{Key: 24, Min: 0, Max: 5}, // AddPartitionsToTxn
	{Key: 25, Min: 0, Max: 4}, // AddOffsetsToTxn
	{Key: 26, Min: 0, Max: 5}, // EndTxn
	{Key: 27, Min: 0, Max: 1}, // WriteTxnMarkers (inter-broker)
	{Key: 28, Min: 0, Max: 5}, // TxnOffsetCommit
	{Key: 29, Min: 0, Max: 3}, // DescribeAcls
	{Key: 30, Min: 0, Max: 3}, // CreateAcls
	{Key: 31, Min: 0, Max: 3}, // DeleteAcls
	{Key: 32, Min: 0, Max: 4}, // DescribeConfigs
	{Key: 33, Min: 0, Max: 2}, // AlterConfigs
	{Key: 35, Min: 0, Max: 4}, // DescribeLogDirs
	{Key: 36, Min: 0, Max: 2}, // SaslAuthenticate
	{Key: 37, Min: 0, Max: 3}, // CreatePartitions
	{Key: 42, Min: 0, Max: 2}, // DeleteGroups
	{Key: 43, Min: 0, Max: 2}, // ElectLeaders
	{Key: 44, Min: 0, Max: 1}, // IncrementalAlterConfigs
	{Key: 45, Min: 0, Max: 1}, // AlterPartitionReassignments
	{Key: 46, Min: 0, Max: 0}, // ListPartitionReassignments
	{Key: 47, Min: 0, Max: 0}, // OffsetDelete
	{Key: 48, Min: 0, Max: 1}, // DescribeClientQuotas
	{Key: 49, Min: 0, Max: 1}, // AlterClientQuotas
	{Key: 50, Min: 0, Max: 0}, // DescribeUserScramCredentials
	{Key: 51, Min: 0, Max: 0}, // AlterUserScramCredentials
	{Key: 60, Min: 0, Max: 1}, // DescribeCluster
	{Key: 61, Min: 0, Max: 0}, // DescribeProducers
	{Key: 65, Min: 0, Max: 0}, // DescribeTransactions
	{Key: 66, Min: 0, Max: 2}, // ListTransactions
	{Key: 75, Min: 0, Max: 0}, // DescribeTopicPartitions
}

var byKey = func() map[int16]VersionRange {
	m := make(map[int16]VersionRange, len(versions))
	for _, v := range versions {
		if r := kmsg.RequestForKey(v.Key); r == nil || r.MaxVersion() < v.Max {
			panic("protocol: version table names a key or version kmsg does not know")
		}
		m[v.Key] = v
	}
	return m
}()

// Versions returns the implemented API keys and version ranges.
func Versions() []VersionRange { return append([]VersionRange(nil), versions...) }

// Supported reports whether key at version is implemented.
func Supported(key, version int16) bool {
	v, ok := byKey[key]
	return ok && version >= v.Min && version <= v.Max
}

// Implemented reports whether key is implemented at any version.
func Implemented(key int16) bool {
	_, ok := byKey[key]
	return ok
}
