package txn

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"

	"github.com/synapsebroker/synapse/internal/recordlog"
)

// State is a transaction's state, Kafka's TransactionState.
type State int8

// Kafka's states. Dead is an expired transactional id (a tombstone).
const (
	Empty State = iota
	Ongoing
	PrepareCommit
	PrepareAbort
	CompleteCommit
	CompleteAbort
	Dead
)

var stateNames = [...]string{"Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int8(s))
}

// ParseState is String's inverse (ListTransactions' state filters).
func ParseState(s string) (State, bool) {
	for i, n := range stateNames {
		if n == s {
			return State(i), true
		}
	}
	return 0, false
}

// TP is a topic partition.
type TP struct {
	Topic     string `json:"t"`
	Partition int32  `json:"p"`
}

// Offset is a transactional offset commit of one partition for one group.
type Offset struct {
	Topic       string  `json:"t"`
	Partition   int32   `json:"p"`
	Offset      int64   `json:"o"`
	LeaderEpoch int32   `json:"e"`
	Metadata    *string `json:"m,omitempty"`
}

// value is a transactional id's record in the transaction log: its whole
// state after a change (the last record of an id wins at replay; a nil
// value is a tombstone).
type value struct {
	ProducerID     int64               `json:"pid"`
	Epoch          int16               `json:"epoch"`
	LastProducerID int64               `json:"last_pid"`
	LastEpoch      int16               `json:"last_epoch"`
	TimeoutMs      int32               `json:"timeout_ms"`
	State          State               `json:"state"`
	Partitions     []TP                `json:"partitions,omitempty"`
	AddedAt        []int64             `json:"added_at,omitempty"` // per partition: its log end when added
	Groups         map[string][]Offset `json:"groups,omitempty"`   // groups added (AddOffsetsToTxn) with their pending offsets
	StartMs        int64               `json:"start_ms,omitempty"`
	UpdateMs       int64               `json:"update_ms"`
}

// txn is one transactional id's state in memory. mu serializes every
// operation on the id, and is held across its durable writes and marker
// writes (so the log order of an id's records is the order of its changes,
// and a produce checked against the transaction cannot slip between the
// check and the end of the transaction).
type txn struct {
	id string
	// mu guards the fields below. Lock order: txn.mu before any
	// partition's lock (markers and transactional appends run under it).
	mu sync.Mutex
	meta
}

// meta is a transactional id's state (a copy is the state to go back to
// when a change cannot be made durable).
type meta struct {
	producerID     int64
	epoch          int16
	lastProducerID int64
	lastEpoch      int16
	timeoutMs      int32
	state          State
	partitions     map[TP]int64 // the partitions of the open transaction, each with its log end when added
	groups         map[string]map[TP]Offset
	startMs        int64
	updateMs       int64
	logEnd         int64 // the transaction log's end after this id's last record (not kept in the record)
}

func (t *txn) toValue() *value {
	v := &value{ProducerID: t.producerID, Epoch: t.epoch, LastProducerID: t.lastProducerID, LastEpoch: t.lastEpoch,
		TimeoutMs: t.timeoutMs, State: t.state, StartMs: t.startMs, UpdateMs: t.updateMs}
	v.Partitions = t.partitionList()
	v.AddedAt = make([]int64, len(v.Partitions))
	for i, p := range v.Partitions {
		v.AddedAt[i] = t.partitions[p]
	}
	if len(t.groups) > 0 {
		v.Groups = make(map[string][]Offset, len(t.groups))
		for g, offs := range t.groups {
			v.Groups[g] = offsetList(offs)
		}
	}
	return v
}

func (t *txn) partitionList() []TP {
	l := make([]TP, 0, len(t.partitions))
	for p := range t.partitions {
		l = append(l, p)
	}
	sort.Slice(l, func(i, j int) bool { return tpLess(l[i], l[j]) })
	return l
}

// offsetList is a group's pending offsets in partition order.
func offsetList(offs map[TP]Offset) []Offset {
	l := make([]Offset, 0, len(offs))
	for _, o := range offs {
		l = append(l, o)
	}
	sort.Slice(l, func(i, j int) bool {
		return tpLess(TP{l[i].Topic, l[i].Partition}, TP{l[j].Topic, l[j].Partition})
	})
	return l
}

func tpLess(a, b TP) bool {
	return a.Topic < b.Topic || a.Topic == b.Topic && a.Partition < b.Partition
}

func (t *txn) fromValue(v *value) {
	t.producerID, t.epoch, t.lastProducerID, t.lastEpoch = v.ProducerID, v.Epoch, v.LastProducerID, v.LastEpoch
	t.timeoutMs, t.state, t.startMs, t.updateMs = v.TimeoutMs, v.State, v.StartMs, v.UpdateMs
	t.partitions = make(map[TP]int64, len(v.Partitions))
	for i, p := range v.Partitions {
		at := int64(-1) // no bound recorded: no marker is taken as this transaction's
		if i < len(v.AddedAt) {
			at = v.AddedAt[i]
		}
		t.partitions[p] = at
	}
	t.groups = nil
	for g, offs := range v.Groups {
		if t.groups == nil {
			t.groups = map[string]map[TP]Offset{}
		}
		m := make(map[TP]Offset, len(offs))
		for _, o := range offs {
			m[TP{o.Topic, o.Partition}] = o
		}
		t.groups[g] = m
	}
}

// key is a record's key: the transactional id, as JSON (any bytes an id
// may hold survive).
type key struct {
	ID string `json:"id"`
}

func encodeRecord(id string, v *value) recordlog.Record {
	k, _ := json.Marshal(key{ID: id})
	r := recordlog.Record{Key: k}
	if v != nil {
		r.Value, _ = json.Marshal(v)
	}
	return r
}
