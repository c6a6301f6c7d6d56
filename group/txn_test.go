package group

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestTxnOffsets: pending offsets answer UNSTABLE_OFFSET_COMMIT to
// require_stable fetches only; a transaction's commit lands durably; a
// resumed commit (since > 0) leaves partitions committed at or after its
// decision as they are.
func TestTxnOffsets(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	e := newEnv(t, Config{Now: func() time.Time { return now }})
	fetch := func(stable bool) (int64, int16) {
		req := kmsg.NewPtrOffsetFetchRequest()
		req.Version, req.Group, req.RequireStable = 7, "g", stable
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic, rt.Partitions = "t", []int32{0}
		req.Topics = append(req.Topics, rt)
		p := e.c.OffsetFetch(req).Topics[0].Partitions[0]
		return p.Offset, p.ErrorCode
	}
	e.c.SetPending("g", 9, []TxnPartition{{"t", 0}}, true)
	if _, code := fetch(true); code != kerr.UnstableOffsetCommit.Code {
		t.Fatalf("require_stable with a pending offset: code %d", code)
	}
	if off, code := fetch(false); off != -1 || code != 0 {
		t.Fatalf("without require_stable: %d %d", off, code)
	}
	if err := e.c.CommitTxnOffsets("g", []TxnOffset{{Topic: "t", Offset: 5, LeaderEpoch: -1}}, 0); err != nil {
		t.Fatal(err)
	}
	e.c.SetPending("g", 9, []TxnPartition{{"t", 0}}, false)
	e.reopen()
	if off, code := fetch(true); off != 5 || code != 0 {
		t.Fatalf("after the commit and a reopen: %d %d", off, code)
	}
	// A resumed end decided before the last commit does not overwrite it.
	decided := now.UnixMilli() - 1
	now = now.Add(time.Second)
	if err := e.c.CommitTxnOffsets("g", []TxnOffset{{Topic: "t", Offset: 3, LeaderEpoch: -1}}, decided); err != nil {
		t.Fatal(err)
	}
	if off, _ := fetch(false); off != 5 {
		t.Fatalf("resumed commit overwrote a later one: %d", off)
	}
	if err := e.c.CommitTxnOffsets("g", []TxnOffset{{Topic: "t", Offset: 8, LeaderEpoch: -1}}, now.UnixMilli()); err != nil {
		t.Fatal(err)
	}
	if off, _ := fetch(false); off != 8 {
		t.Fatalf("resumed commit decided after the last commit: %d, want 8", off)
	}
}
