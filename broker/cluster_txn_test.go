package broker

import (
	"maps"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
)

// TestFollowerKeepsTransactions: a follower appending its leader's batches
// (appendFollowedLocked) ends with the leader's transaction state: the same
// open transactions and LSO, and the same aborted index, so that it serves
// read_committed as the leader did once it is elected.
func TestFollowerKeepsTransactions(t *testing.T) {
	ls := log.OpenStore(log.Options{})
	defer ls.Close()
	open := func(name string) *partition {
		lp, err := ls.OpenPartition(filepath.Join(t.TempDir(), name), log.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return &partition{topic: &topic{name: "t"}, log: lp, producers: map[int64]*producerState{}}
	}
	leader, follower := open("leader"), open("follower")
	if err := follower.log.SetReplicated(0); err != nil { // the high watermark is the leader's
		t.Fatal(err)
	}
	produce := func(pid int64, seq int32, vals ...string) {
		b := txnBatch(pid, 0, seq, 1000, vals)
		h, err := log.ParseBatchHeader(b)
		if err != nil {
			t.Fatal(err)
		}
		var sp kmsg.ProduceResponseTopicPartition
		if _, err := leader.appendIdempotent(b, &h, &sp, 1000, nil); err != nil {
			t.Fatal(err)
		}
	}
	marker := func(pid int64, commit bool) {
		if _, err := leader.writeMarker(pid, 0, commit, 1000, 0, -1); err != nil {
			t.Fatal(err)
		}
	}
	produce(1, 0, "a", "b") // 0-1
	produce(2, 0, "c")      // 2
	produce(1, 2, "d")      // 3
	marker(1, false)        // 4: abort [0, 4]
	produce(3, 0, "e")      // 5
	marker(2, true)         // 6
	produce(1, 3, "f")      // 7: a new transaction of 1, open
	// Copied as a replica fetch does, a few batches at a time.
	for off := int64(0); off < leader.log.LogEndOffset(); {
		res, err := leader.log.Read(off, 200)
		if err != nil {
			t.Fatal(err)
		}
		b, err := res.AppendTo(nil)
		if err != nil {
			t.Fatal(err)
		}
		for len(b) >= log.BatchHeaderSize {
			h, err := log.ParseBatchHeader(b)
			if err != nil {
				t.Fatal(err)
			}
			follower.mu.Lock()
			err = follower.appendFollowedLocked(b[:h.Length], &h, 1000)
			follower.mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			b, off = b[h.Length:], h.NextOffset()
		}
	}
	if err := follower.log.WaitDurable(follower.log.LogEndOffset()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*partition{leader, follower} {
		if p.txnOpen[1] != 7 || p.txnOpen[3] != 5 || len(p.txnOpen) != 2 {
			t.Errorf("open transactions: %v, want 1 from 7 and 3 from 5", p.txnOpen)
		}
		if lso := p.lastStable(p.log.LogEndOffset()); lso != 5 {
			t.Errorf("LSO %d, want 5", lso)
		}
		got, err := p.log.AbortedTxns(nil, 0, math.MaxInt64)
		if err != nil {
			t.Fatal(err)
		}
		want := []log.AbortedTxn{{ProducerID: 1, FirstOffset: 0, LastOffset: 4, LastStableOffset: 2}}
		if !slices.Equal(got, want) {
			t.Errorf("aborted index %+v, want %+v", got, want)
		}
		if st := p.producers[2]; st == nil || st.Marker == nil || st.Marker.Offset != 6 || !st.Marker.Commit {
			t.Errorf("producer 2's last marker: %+v", st)
		}
	}

	// A tiering pass's snapshot before a release (transactions are open:
	// the follower must still know to read them again), then truncations
	// as a new leader's log makes: the markers cut reopen what they
	// closed, the aborted index loses what was cut.
	if err := follower.beforeRelease(); err != nil {
		t.Fatal(err)
	}
	cut := func(off int64, open map[int64]int64, lso int64, aborted []log.AbortedTxn) {
		t.Helper()
		follower.mu.Lock()
		_, err := follower.truncateLocked(off)
		follower.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(follower.txnOpen, open) {
			t.Errorf("cut at %d: open transactions %v, want %v", off, follower.txnOpen, open)
		}
		if got := follower.lastStable(follower.log.LogEndOffset()); got != lso {
			t.Errorf("cut at %d: LSO %d, want %d", off, got, lso)
		}
		got, err := follower.log.AbortedTxns(nil, 0, math.MaxInt64)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, aborted) {
			t.Errorf("cut at %d: aborted index %+v, want %+v", off, got, aborted)
		}
	}
	cut(6, map[int64]int64{2: 2, 3: 5}, 2, []log.AbortedTxn{{ProducerID: 1, FirstOffset: 0, LastOffset: 4, LastStableOffset: 2}})
	cut(4, map[int64]int64{1: 0, 2: 2}, 0, nil)
}
