package broker

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/synapsebroker/synapse/log"
)

// TestOffsetForLeaderEpoch: every start is a new leader epoch, stamped into
// the batches written in it; an old epoch ends where the next one's first
// batch starts, the current one at the log end (Kafka's answers), a newer
// one too (Kafka's is UNDEFINED), through kadm and raw requests for the
// fencing field.
func TestOffsetForLeaderEpoch(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	produce := func(n int) {
		t.Helper()
		cl, _ := client(t, ts.addr, kgo.DefaultProduceTopic("ofle"), kgo.AllowAutoTopicCreation())
		for range n {
			if err := cl.ProduceSync(ctxT(t), &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		cl.Close()
	}
	e0 := ts.meta.m.LeaderEpoch
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctxT(t), 1, 1, nil, "ofle"); err != nil {
		t.Fatal(err)
	}
	produce(3) // offsets 0-2 in e0
	ts.stop(t)
	ts = startServer(t, dir) // e0+1: nothing written
	ts.stop(t)
	ts = startServer(t, dir) // e0+2: offsets 3-4
	produce(2)
	cur := ts.meta.m.LeaderEpoch
	if cur != e0+2 {
		t.Fatalf("epoch %d after two restarts from %d", cur, e0)
	}
	_, adm = client(t, ts.addr)
	ctx := ctxT(t)

	check := func(epoch int32, wantEpoch int32, wantEnd int64) {
		t.Helper()
		var req kadm.OffsetForLeaderEpochRequest
		req.Add("ofle", 0, epoch)
		res, err := adm.OffsetForLeaderEpoch(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		r := res["ofle"][0]
		if r.Err != nil || r.LeaderEpoch != wantEpoch || r.EndOffset != wantEnd {
			t.Fatalf("epoch %d: %+v, want epoch %d end %d", epoch, r, wantEpoch, wantEnd)
		}
	}
	check(e0, e0, 3)     // ends where e0+2's batches start (e0+1 wrote none)
	check(e0+1, e0, 3)   // never written: the largest older epoch written, same end
	check(cur, cur, 5)   // the current epoch: the log end
	check(cur+1, cur, 5) // newer than this broker's: its log end (not Kafka's UNDEFINED: no false truncation)
	check(-1, -1, -1)    // undefined
	if e0 > 0 {
		check(e0-1, e0-1, 0) // before the first written epoch: its own, the log's start
	}

	// CurrentLeaderEpoch fences (v2+), and unknown topics and partitions.
	raw := kmsg.NewPtrOffsetForLeaderEpochRequest()
	raw.ReplicaID = -1
	rt := kmsg.NewOffsetForLeaderEpochRequestTopic()
	rt.Topic = "ofle"
	for _, c := range []int32{cur - 1, cur + 1, cur, -1} {
		rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
		rp.Partition, rp.CurrentLeaderEpoch, rp.LeaderEpoch = 0, c, cur
		rt.Partitions = append(rt.Partitions, rp)
	}
	rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
	rp.Partition, rp.LeaderEpoch = 9, cur
	rt.Partitions = append(rt.Partitions, rp)
	missing := kmsg.NewOffsetForLeaderEpochRequestTopic()
	missing.Topic = "missing"
	missing.Partitions = []kmsg.OffsetForLeaderEpochRequestTopicPartition{rp}
	raw.Topics = []kmsg.OffsetForLeaderEpochRequestTopic{rt, missing}
	for _, v := range []int16{0, 2, 3, 4} {
		vs := kversion.Stable()
		vs.SetMaxKeyVersion(23, v) // kgo sends the highest version it may
		cl, _ := client(t, ts.addr, kgo.MaxVersions(vs))
		kr, err := cl.Broker(int(ts.meta.m.NodeID)).Request(ctx, raw) // straight to the broker: no metadata of "missing"
		if err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		r := kr.(*kmsg.OffsetForLeaderEpochResponse)
		ps := r.Topics[0].Partitions
		want := []int16{kerr.FencedLeaderEpoch.Code, kerr.UnknownLeaderEpoch.Code, 0, 0, kerr.UnknownTopicOrPartition.Code}
		if v < 2 {
			want[0], want[1] = 0, 0 // no CurrentLeaderEpoch before v2
		}
		for i, p := range ps {
			if p.ErrorCode != want[i] {
				t.Fatalf("v%d partition entry %d: code %d, want %d", v, i, p.ErrorCode, want[i])
			}
		}
		if ps[2].EndOffset != 5 || (v >= 1 && ps[2].LeaderEpoch != cur) {
			t.Fatalf("v%d current epoch: %+v", v, ps[2])
		}
		if c := r.Topics[1].Partitions[0].ErrorCode; c != kerr.UnknownTopicOrPartition.Code {
			t.Fatalf("v%d missing topic: code %d", v, c)
		}
	}
}

// TestOffsetForLeaderEpochACLs: a consumer needs DESCRIBE on the topic;
// CLUSTER_ACTION (a broker's own right) allows every topic.
func TestOffsetForLeaderEpochACLs(t *testing.T) {
	w := newACLWorld(t)
	ctx := ctxT(t)
	w.grant(t, kadm.NewACLs().Allow("User:u").Topics("visible").Operations(kadm.OpDescribe))
	cur := w.ss.meta.m.LeaderEpoch
	req := kmsg.NewPtrOffsetForLeaderEpochRequest()
	for _, name := range []string{"visible", "hidden"} {
		rt := kmsg.NewOffsetForLeaderEpochRequestTopic()
		rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
		rp.LeaderEpoch = cur
		rt.Topic, rt.Partitions = name, append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
	}
	ask := func() (visible, hidden kmsg.OffsetForLeaderEpochResponseTopicPartition) {
		t.Helper()
		kr, err := w.user.Broker(int(w.ss.meta.m.NodeID)).Request(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		r := kr.(*kmsg.OffsetForLeaderEpochResponse)
		return r.Topics[0].Partitions[0], r.Topics[1].Partitions[0]
	}
	v, h := ask()
	if v.ErrorCode != 0 || v.EndOffset != 0 || v.LeaderEpoch != cur {
		t.Fatalf("visible: %+v", v)
	}
	if h.ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("hidden: %+v, want TOPIC_AUTHORIZATION_FAILED", h)
	}
	w.grant(t, kadm.NewACLs().Allow("User:u").Clusters().Operations(kadm.OpClusterAction))
	if _, h = ask(); h.ErrorCode != 0 || h.EndOffset != 0 {
		t.Fatalf("hidden with CLUSTER_ACTION: %+v", h)
	}
}

// TestLeaderEpochNeverGoesDown: a start with meta.json gone (its epoch
// with it) starts above the epoch stamped in the log's last batch, and
// above a committed offset's epoch; epochs past any plausible count of
// restarts (a client commits what it likes) are left out.
func TestLeaderEpochNeverGoesDown(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	ctx := ctxT(t)
	produce := func() {
		t.Helper()
		cl, _ := client(t, ts.addr, kgo.DefaultProduceTopic("nd"), kgo.AllowAutoTopicCreation())
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		cl.Close()
	}
	for range 3 {
		produce()
		ts.stop(t)
		ts = startServer(t, dir)
	}
	produce()
	stamped := ts.meta.m.LeaderEpoch
	ts.stop(t)
	if err := os.Remove(filepath.Join(dir, metaFile)); err != nil {
		t.Fatal(err)
	}
	ts = startServer(t, dir)
	if e := ts.meta.m.LeaderEpoch; e != stamped+1 {
		t.Fatalf("epoch %d with meta.json gone, want %d (above the last batch's %d)", e, stamped+1, stamped)
	}

	// A committed epoch above the broker's (a restore of the groups
	// without the log), and an absurd one.
	_, adm := client(t, ts.addr)
	var commit kadm.Offsets
	commit.Add(kadm.Offset{Topic: "nd", Partition: 0, At: 1, LeaderEpoch: stamped + 40})
	if err := adm.CommitAllOffsets(ctx, "g", commit); err != nil {
		t.Fatal(err)
	}
	var absurd kadm.Offsets
	absurd.Add(kadm.Offset{Topic: "nd", Partition: 0, At: 1, LeaderEpoch: math.MaxInt32})
	if err := adm.CommitAllOffsets(ctx, "absurd", absurd); err != nil {
		t.Fatal(err)
	}
	ts.stop(t)
	ts = startServer(t, dir)
	if e := ts.meta.m.LeaderEpoch; e != stamped+41 {
		t.Fatalf("epoch %d, want %d (above the committed %d)", e, stamped+41, stamped+40)
	}
}

// TestOffsetForLeaderEpochSurvivesARelease: a read failing because local
// segments went meanwhile (retention, the tiering) is searched again from
// the new local start, not answered KAFKA_STORAGE_ERROR.
func TestOffsetForLeaderEpochSurvivesARelease(t *testing.T) {
	dir := t.TempDir()
	startServer(t, dir).stop(t)
	ts := startServer(t, dir) // epoch 1: epoch 0 is older, and has no batch
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"segment.bytes": kstr("1024")}, "rel"); err != nil {
		t.Fatal(err)
	}
	cl, _ := client(t, ts.addr, kgo.DefaultProduceTopic("rel"), kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()))
	for range 20 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: bytes.Repeat([]byte("x"), 300)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	lp := ts.reg.partition(ts.reg.get("rel"), 0).log
	if len(lp.SealedSegments()) < 2 {
		t.Fatalf("%d sealed segments", len(lp.SealedSegments()))
	}
	old := scanHeaders
	t.Cleanup(func() { scanHeaders = old })
	failed := false
	scanHeaders = func(p *log.Partition, off int64, fn func(*log.BatchHeader) bool) error {
		if !failed {
			failed = true
			// The release under way: the first sealed segment goes, and
			// this read fails as a read of its deleted file would.
			if _, err := p.DeleteLocalBefore(p.SealedSegments()[0].Next); err != nil {
				t.Error(err)
			}
			return errors.New("injected: segment file gone")
		}
		return old(p, off, fn)
	}
	rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
	rp.CurrentLeaderEpoch, rp.LeaderEpoch = -1, ts.meta.m.LeaderEpoch-1
	code, epoch, end := epochEndOffset(lp, rp, ts.meta.m.LeaderEpoch)
	if !failed || code != 0 || end != lp.LocalStartOffset() || epoch != rp.LeaderEpoch {
		t.Fatalf("after a release: code %d epoch %d end %d (local start %d)", code, epoch, end, lp.LocalStartOffset())
	}
}
