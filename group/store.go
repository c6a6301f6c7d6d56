package group

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/synapsebroker/synapse/internal/recordlog"
	"github.com/synapsebroker/synapse/log"
)

// The group log: committed offsets and group metadata are records in one
// internal partition, written through the same log engine (and the same
// group commit) as user data. Each record's key names what it describes and
// its value is the latest state; a nil value is a tombstone. Loading replays
// the log in order, so the last record of each key wins. The log is
// compacted by appending a snapshot of the live state and moving the log
// start past everything before it (see compact).
//
// Keys and values are JSON: small, stable and readable with
// `synapse inspect dump`. Offset commits are not a hot path (clients commit
// every few seconds), and the batch of one request is one append.

// recKey is a record's key. Kind "o" is a committed offset of
// (Group, Topic, Partition); kind "g" is a group's metadata.
type recKey struct {
	Kind      string `json:"k"`
	Group     string `json:"g"`
	Topic     string `json:"t,omitempty"`
	Partition int32  `json:"p,omitempty"`
}

// offsetValue is a committed offset.
type offsetValue struct {
	Offset      int64  `json:"o"`
	LeaderEpoch int32  `json:"e"`
	Metadata    string `json:"m,omitempty"`
	CommitMs    int64  `json:"c"`
	ExpireMs    int64  `json:"x,omitempty"` // 0: by offsets retention
}

// groupValue is a group's metadata as of its last completed rebalance.
type groupValue struct {
	ProtocolType string        `json:"pt"`
	Protocol     string        `json:"p,omitempty"`
	Generation   int32         `json:"gen"`
	Leader       string        `json:"l,omitempty"`
	StateMs      int64         `json:"s"` // when the group entered its state (Empty: offsets retention counts from here)
	Members      []memberValue `json:"m,omitempty"`
}

type memberValue struct {
	ID               string  `json:"id"`
	InstanceID       *string `json:"iid,omitempty"`
	ClientID         string  `json:"cid"`
	ClientHost       string  `json:"h"`
	SessionTimeout   int32   `json:"st"`
	RebalanceTimeout int32   `json:"rt"`
	Metadata         []byte  `json:"md"` // subscription for the group's protocol
	Assignment       []byte  `json:"a"`
}

// record is one key and value (nil value: tombstone).
type record struct {
	key   recKey
	value []byte
}

func offsetRecord(g, topic string, p int32, v *offsetValue) record {
	r := record{key: recKey{Kind: "o", Group: g, Topic: topic, Partition: p}}
	if v != nil {
		r.value, _ = json.Marshal(v)
	}
	return r
}

func groupRecord(g string, v *groupValue) record {
	r := record{key: recKey{Kind: "g", Group: g}}
	if v != nil {
		r.value, _ = json.Marshal(v)
	}
	return r
}

// encodeBatch builds one uncompressed v2 record batch of recs.
func encodeBatch(recs []record, now time.Time) []byte {
	rs := make([]recordlog.Record, len(recs))
	for i, r := range recs {
		k, _ := json.Marshal(r.key)
		rs[i] = recordlog.Record{Key: k, Value: r.value}
	}
	return recordlog.Encode(rs, now)
}

// errLoad is returned for a group log that cannot be parsed.
var errLoad = fmt.Errorf("group: %w", recordlog.ErrUnreadable)

// replay reads the log from its start to its high watermark and calls fn
// with every record in order.
func replay(p *log.Partition, fn func(k recKey, v []byte) error) error {
	return recordlog.Replay(p, func(key, v []byte) error {
		var k recKey
		if err := json.Unmarshal(key, &k); err != nil {
			return fmt.Errorf("%w: key: %v", errLoad, err)
		}
		return fn(k, v)
	})
}
