package compattests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// Consumer groups, the classic protocol (FindCoordinator, JoinGroup,
// SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, OffsetDelete,
// DescribeGroups, ListGroups, DeleteGroups), with real clients.
//
// The resume scenario (runGroupResume) is written once; each client adapts
// its group consumer to groupRun: a first member reads part of a 3-partition
// topic and commits a different position on every partition, closes (and so
// leaves), and a second member of the same group must read exactly the
// records after those positions. The committed offsets are checked through
// kadm after each member. This file also holds the franz-go tests: the
// resume scenario with an eager and a cooperative balancer, the kadm admin
// calls, and a broker restart under an active group. The rebalance under
// load is in groups_rebalance_test.go, the other clients in
// groups_clients_test.go and groups_confluent_test.go.

const (
	// groupPartitions and groupRecords (per partition): the topic of the
	// resume scenario.
	groupPartitions = 3
	groupRecords    = 30
	// groupTimeout bounds one group test (each takes a few seconds).
	groupTimeout = 50 * time.Second
	// emptyTimeout bounds how long a group may take to become Empty once
	// its last member closed (which sends LeaveGroup).
	emptyTimeout = 10 * time.Second
)

// groupCommitAt is what the first member of the resume scenario commits: a
// different offset on every partition, so mixed-up partitions show.
var groupCommitAt = map[int32]int64{0: 5, 1: 12, 2: 19}

// groupRec is one record as a group member read it. Values are
// groupValue(partition, offset), so every record checks itself.
type groupRec struct {
	Partition int32
	Offset    int64
	Value     string
}

func groupValue(p int32, offset int64) string { return fmt.Sprintf("p%d-o%d", p, offset) }

// groupRun is one client's group consumer for the resume scenario: it joins
// f.group as a new member subscribed to f.topic (reading from the start of a
// partition without a committed offset), reads until it has read the record
// just before until[p] on every partition p, commits exactly commit through
// the client's own commit API, closes (which leaves the group) and returns
// every record it read.
type groupRun func(t *testing.T, ctx context.Context, f *groupFixture, until, commit map[int32]int64) []groupRec

// groupFixture is a broker, a topic with records groupValue(p, offset) and
// the name of a consumer group, with a kadm client to look at the group.
type groupFixture struct {
	b          broker
	topic      string
	group      string
	partitions int32
	admin      *kgo.Client
	adm        *kadm.Client
	prod       *kgo.Client
	end        map[int32]int64 // records produced per partition
}

func newGroupFixture(t testing.TB, partitions int32) *groupFixture {
	t.Helper()
	b := newBroker(t)
	topic := uniqueTopic(t)
	f := &groupFixture{b: b, topic: topic, group: "group-" + topic, partitions: partitions, end: make(map[int32]int64)}
	admin, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	t.Cleanup(admin.Close)
	f.admin, f.adm = admin, kadm.NewClient(admin)
	prod, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	t.Cleanup(prod.Close)
	f.prod = prod
	createTopicKadm(t, b.Addr(), topic, partitions)
	for p := range partitions {
		f.end[p] = 0
	}
	return f
}

// produce appends n records to every partition of f.topic (acks=all) and
// checks the offsets they were given.
func (f *groupFixture) produce(t testing.TB, ctx context.Context, n int) {
	t.Helper()
	var recs []*kgo.Record
	for p := range f.partitions {
		for i := range int64(n) {
			recs = append(recs, &kgo.Record{Topic: f.topic, Partition: p, Value: []byte(groupValue(p, f.end[p]+i))})
		}
	}
	if err := f.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce %d records per partition to %s: %v", n, f.topic, err)
	}
	for _, r := range recs {
		if want := groupValue(r.Partition, r.Offset); string(r.Value) != want {
			t.Fatalf("record %q was given offset %d of partition %d (want the value there to be %q)", r.Value, r.Offset, r.Partition, want)
		}
	}
	for p := range f.partitions {
		f.end[p] += int64(n)
	}
}

// commits returns every committed offset of f.group (kadm FetchOffsets:
// OffsetFetch for all topics), failing on any error.
func (f *groupFixture) commits(t testing.TB, ctx context.Context) map[string]map[int32]int64 {
	t.Helper()
	got, err := f.fetchCommits(ctx)
	if err != nil {
		t.Fatalf("kadm FetchOffsets %s: %v", f.group, err)
	}
	return got
}

func (f *groupFixture) fetchCommits(ctx context.Context) (map[string]map[int32]int64, error) {
	got := make(map[string]map[int32]int64)
	resp, err := f.adm.FetchOffsets(ctx, f.group)
	if errors.Is(err, kerr.GroupIDNotFound) && f.b.Target() == targetKfake {
		// kfake answers OffsetFetch of a group it does not know with
		// GROUP_ID_NOT_FOUND; Kafka answers no offsets and no error.
		return got, nil
	}
	if err != nil {
		return nil, err
	}
	var errs []error
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Err != nil {
			errs = append(errs, fmt.Errorf("%s p%d: %w", o.Topic, o.Partition, o.Err))
			return
		}
		if got[o.Topic] == nil {
			got[o.Topic] = make(map[int32]int64)
		}
		got[o.Topic][o.Partition] = o.At
	})
	return got, errors.Join(errs...)
}

// checkCommitted compares every committed offset of f.group with want
// (offsets of f.topic; nothing else may be committed).
func (f *groupFixture) checkCommitted(t testing.TB, ctx context.Context, when string, want map[int32]int64) {
	t.Helper()
	w := map[string]map[int32]int64{}
	if len(want) > 0 {
		w[f.topic] = want
	}
	f.checkCommits(t, ctx, when, w)
}

func (f *groupFixture) checkCommits(t testing.TB, ctx context.Context, when string, want map[string]map[int32]int64) {
	t.Helper()
	if got := f.commits(t, ctx); fmtCommits(got) != fmtCommits(want) {
		t.Errorf("%s: group %s has committed %s, want %s", when, f.group, fmtCommits(got), fmtCommits(want))
	}
}

// fmtCommits prints committed offsets sorted, as "topic[p0=5 p1=12]".
func fmtCommits(c map[string]map[int32]int64) string {
	if len(c) == 0 {
		return "nothing"
	}
	var b strings.Builder
	for i, topic := range slices.Sorted(maps.Keys(c)) {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s[%s]", topic, fmtOffsets(c[topic]))
	}
	return b.String()
}

func fmtOffsets(m map[int32]int64) string {
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("p%d=%d", p, m[p]))
	}
	return strings.Join(parts, " ")
}

// describe answers kadm DescribeGroups for f.group.
func (f *groupFixture) describe(t testing.TB, ctx context.Context) kadm.DescribedGroup {
	t.Helper()
	ds, err := f.adm.DescribeGroups(ctx, f.group)
	if err != nil {
		t.Fatalf("kadm DescribeGroups %s: %v", f.group, err)
	}
	d, ok := ds[f.group]
	if !ok {
		t.Fatalf("kadm DescribeGroups %s: the group is not in the answer", f.group)
	}
	return d
}

func memberIDs(d kadm.DescribedGroup) []string {
	var ids []string
	for _, m := range d.Members {
		ids = append(ids, m.MemberID)
	}
	slices.Sort(ids)
	return ids
}

// waitGroupState polls DescribeGroups (every 100 ms, at most within) until
// f.group is in state with exactly the members ids, and returns it.
func (f *groupFixture) waitGroupState(t testing.TB, ctx context.Context, within time.Duration, state string, ids ...string) kadm.DescribedGroup {
	t.Helper()
	slices.Sort(ids)
	deadline := time.Now().Add(within)
	for {
		d := f.describe(t, ctx)
		if d.Err == nil && d.State == state && slices.Equal(memberIDs(d), ids) {
			return d
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("group %s: state %q with members %q (error %v), want %q with members %q within %s",
				f.group, d.State, memberIDs(d), d.Err, state, ids, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitEmpty waits until f.group is Empty: its last member left.
func (f *groupFixture) waitEmpty(t testing.TB, ctx context.Context) {
	t.Helper()
	f.waitGroupState(t, ctx, emptyTimeout, "Empty")
}

// checkGroupRead checks what a member read: values match their partition
// and offset, and every offset in [from[p], until[p]) was read exactly once.
// Nothing below from[p] may have been read (it was committed); with exact,
// nothing at or after until[p] either.
func checkGroupRead(t testing.TB, who string, got []groupRec, from, until map[int32]int64, exact bool) {
	t.Helper()
	seen := make(map[int32]map[int64]int)
	for _, r := range got {
		if want := groupValue(r.Partition, r.Offset); r.Value != want {
			t.Errorf("%s: p%d offset %d has value %q, want %q", who, r.Partition, r.Offset, r.Value, want)
		}
		if seen[r.Partition] == nil {
			seen[r.Partition] = make(map[int64]int)
		}
		seen[r.Partition][r.Offset]++
	}
	for _, p := range slices.Sorted(maps.Keys(seen)) {
		if _, ok := until[p]; !ok {
			t.Errorf("%s: read %d records of partition %d, which it should not read", who, len(seen[p]), p)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(until)) {
		lo, hi := from[p], until[p]
		var below, beyond, missing, dup []int64
		for _, off := range slices.Sorted(maps.Keys(seen[p])) {
			switch n := seen[p][off]; {
			case off < lo:
				below = append(below, off)
			case off >= hi && exact:
				beyond = append(beyond, off)
			case n > 1:
				dup = append(dup, off)
			}
		}
		for off := lo; off < hi; off++ {
			if seen[p][off] == 0 {
				missing = append(missing, off)
			}
		}
		if len(below) > 0 {
			t.Errorf("%s: p%d: read %d records below offset %d, where it should have started: offsets %s", who, p, len(below), lo, fmtRuns(below))
		}
		if len(beyond) > 0 {
			t.Errorf("%s: p%d: read %d records at or after offset %d, the end: offsets %s", who, p, len(beyond), hi, fmtRuns(beyond))
		}
		if len(missing) > 0 {
			t.Errorf("%s: p%d: never read offsets %s of [%d, %d)", who, p, fmtRuns(missing), lo, hi)
		}
		if len(dup) > 0 {
			t.Errorf("%s: p%d: read offsets %s more than once", who, p, fmtRuns(dup))
		}
	}
}

// fmtRuns prints sorted offsets as runs: "0-4 7 9-12".
func fmtRuns(offs []int64) string {
	var parts []string
	for i := 0; i < len(offs); {
		j := i
		for j+1 < len(offs) && offs[j+1] == offs[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprint(offs[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", offs[i], offs[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, " ")
}

func zeroOffsets(partitions int32) map[int32]int64 {
	m := make(map[int32]int64)
	for p := range partitions {
		m[p] = 0
	}
	return m
}

// runGroupResume is the resume scenario for one client:
//
//  1. OffsetFetch of the (not yet used) group answers -1 without an error,
//     at OffsetFetch v1, v7 and the newest version;
//  2. a first member reads from the start until past groupCommitAt on every
//     partition, commits exactly groupCommitAt and closes; kadm
//     FetchOffsets shows exactly those offsets and the group becomes Empty;
//  3. a second member of the group reads exactly the records from
//     groupCommitAt to the end (none before, none twice), commits the end
//     offsets and closes; kadm shows them.
func runGroupResume(t *testing.T, run groupRun) {
	f := newGroupFixture(t, groupPartitions)
	ctx := testCtx(t, groupTimeout)
	f.produce(t, ctx, groupRecords)
	checkUnknownGroupOffsets(t, ctx, f.b, f.group, f.topic, f.partitions)

	start := time.Now()
	first := run(t, ctx, f, groupCommitAt, groupCommitAt)
	checkGroupRead(t, "first member", first, zeroOffsets(f.partitions), groupCommitAt, false)
	f.checkCommitted(t, ctx, "after the first member committed and closed", groupCommitAt)
	f.waitEmpty(t, ctx)
	t.Logf("first member: read %d records, committed %s, left (%s)", len(first), fmtOffsets(groupCommitAt), time.Since(start).Round(time.Millisecond))

	start = time.Now()
	end := maps.Clone(f.end)
	second := run(t, ctx, f, end, end)
	checkGroupRead(t, "second member", second, groupCommitAt, end, true)
	f.checkCommitted(t, ctx, "after the second member committed and closed", end)
	f.waitEmpty(t, ctx)
	t.Logf("second member: read %d records from the committed offsets, committed %s, left (%s)", len(second), fmtOffsets(end), time.Since(start).Round(time.Millisecond))
}

// checkUnknownGroupOffsets sends OffsetFetch for group (which must never
// have committed anything) and every partition of topic, at v1, v7 (the
// last without the Groups array) and the newest version both sides support
// (versions the broker does not support are left out): every partition
// answers offset -1 without an error, and so does the request.
//
// kfake answers GROUP_ID_NOT_FOUND (v2+) and no partitions instead; on
// kfake only, that answer is accepted.
func checkUnknownGroupOffsets(t testing.TB, ctx context.Context, b broker, group, topic string, partitions int32) {
	t.Helper()
	addr := b.Addr()
	key := kmsg.OffsetFetch.Int16()
	minV, maxV := brokerVersions(t, ctx, addr, key)
	for _, v := range []int16{1, 7, -1} {
		name := "newest"
		opts := []kgo.Opt{kgo.SeedBrokers(addr)}
		if v >= 0 {
			if v < minV || v > maxV {
				t.Logf("OffsetFetch v%d: the broker supports v%d-v%d; not checked", v, minV, maxV)
				continue
			}
			name = fmt.Sprintf("v%d", v)
			vs := kversion.Stable()
			vs.SetMaxKeyVersion(key, v)
			opts = append(opts, kgo.MaxVersions(vs))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatalf("kgo.NewClient: %v", err)
		}
		req := kmsg.NewPtrOffsetFetchRequest()
		req.Group = group
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic = topic
		for p := range partitions {
			rt.Partitions = append(rt.Partitions, p)
		}
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		cl.Close()
		if err != nil {
			t.Fatalf("OffsetFetch %s of unknown group %s: %v", name, group, err)
		}
		name = fmt.Sprintf("OffsetFetch v%d (%s) of unknown group %s", resp.Version, name, group)
		if b.Target() == targetKfake && len(resp.Topics) == 0 && (resp.Version < 2 || resp.ErrorCode == kerr.GroupIDNotFound.Code) {
			t.Logf("%s: kfake answers error %v and no partitions (Kafka: offset -1 and no error)", name, kerr.ErrorForCode(resp.ErrorCode))
			continue
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			t.Errorf("%s: error %v, want none", name, err)
		}
		got := make(map[int32]string)
		note := func(topicName string, p int32, offset int64, code int16) {
			if topicName != topic {
				t.Errorf("%s: answer for topic %q, asked for %q", name, topicName, topic)
			}
			got[p] = fmt.Sprintf("%d/%v", offset, kerr.ErrorForCode(code))
		}
		for _, g := range resp.Groups {
			if g.Group != group {
				t.Errorf("%s: answer for group %q", name, g.Group)
			}
			if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
				t.Errorf("%s: group error %v, want none", name, err)
			}
			for _, rt := range g.Topics {
				for _, rp := range rt.Partitions {
					note(rt.Topic, rp.Partition, rp.Offset, rp.ErrorCode)
				}
			}
		}
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				note(rt.Topic, rp.Partition, rp.Offset, rp.ErrorCode)
			}
		}
		for p := range partitions {
			if got[p] != "-1/<nil>" {
				t.Errorf("%s: p%d answers offset/error %q, want -1 and no error (all: %v)", name, p, got[p], got)
			}
		}
	}
}

// brokerVersions returns the versions of key the broker at addr supports.
func brokerVersions(t testing.TB, ctx context.Context, addr string, key int16) (minV, maxV int16) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	defer cl.Close()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("ApiVersions: %v", err)
	}
	for _, k := range resp.ApiKeys {
		if k.ApiKey == key {
			return k.MinVersion, k.MaxVersion
		}
	}
	t.Fatalf("ApiVersions: the broker does not support request key %d", key)
	return 0, 0
}

// ---- franz-go ------------------------------------------------------------

// newKgoMember starts a franz-go group consumer of f.topic in f.group that
// reads partitions without a committed offset from the start.
func newKgoMember(t testing.TB, f *groupFixture, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(f.b.Addr()),
		kgo.ConsumerGroup(f.group),
		kgo.ConsumeTopics(f.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(250 * time.Millisecond),
	}, opts...)...)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	return cl
}

// reachedAll reports whether next[p] (the offset after the last record
// read) has reached until[p] for every partition p.
// distinctRead is how many distinct (partition, offset) pairs seen holds,
// read under mu (consumers in other goroutines fill it).
func distinctRead(mu *sync.Mutex, seen map[int32]map[int64]int) int {
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, offs := range seen {
		n += len(offs)
	}
	return n
}

// waitDistinct waits up to 30 s until seen holds n distinct records.
func waitDistinct(t testing.TB, mu *sync.Mutex, seen map[int32]map[int64]int, n int, what string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); distinctRead(mu, seen) < n; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: read %d distinct records, want %d", what, distinctRead(mu, seen), n)
		}
	}
}

func reachedAll(next, until map[int32]int64) bool {
	for p, u := range until {
		if next[p] < u {
			return false
		}
	}
	return true
}

// pollGroupKgo polls until cl has read the record just before until[p] of
// every partition p.
func pollGroupKgo(t testing.TB, ctx context.Context, cl *kgo.Client, until map[int32]int64) []groupRec {
	t.Helper()
	var got []groupRec
	next := make(map[int32]int64)
	for !reachedAll(next, until) {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("franz-go group member: read up to %s of %s: %v", fmtOffsets(next), fmtOffsets(until), err)
		}
		fs.EachError(func(topic string, p int32, err error) {
			var netErr net.Error
			switch {
			case errors.As(err, &netErr) || errors.Is(err, io.EOF):
				// The broker is restarting: the client retries.
				t.Logf("franz-go group member: fetch %s p%d: %v", topic, p, err)
			case !kerr.IsRetriable(err) && !errors.Is(err, context.Canceled):
				t.Errorf("franz-go group member: fetch %s p%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			got = append(got, groupRec{r.Partition, r.Offset, string(r.Value)})
			next[r.Partition] = max(next[r.Partition], r.Offset+1)
		})
		if t.Failed() {
			t.FailNow()
		}
	}
	return got
}

// commitKgo commits exactly offsets with CommitOffsetsSync (OffsetCommit
// with the member's generation) and fails on any error.
func commitKgo(t testing.TB, ctx context.Context, cl *kgo.Client, offsets map[string]map[int32]int64) {
	t.Helper()
	eo := make(map[string]map[int32]kgo.EpochOffset)
	for topic, ps := range offsets {
		eo[topic] = make(map[int32]kgo.EpochOffset)
		for p, o := range ps {
			eo[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: o}
		}
	}
	var errs []error
	cl.CommitOffsetsSync(ctx, eo, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					errs = append(errs, fmt.Errorf("%s p%d: %w", rt.Topic, rp.Partition, err))
				}
			}
		}
	})
	if len(errs) > 0 {
		t.Fatalf("franz-go commit %s: %v", fmtCommits(offsets), errors.Join(errs...))
	}
}

func kgoGroupRun(balancer kgo.GroupBalancer) groupRun {
	return func(t *testing.T, ctx context.Context, f *groupFixture, until, commit map[int32]int64) []groupRec {
		t.Helper()
		cl := newKgoMember(t, f, kgo.Balancers(balancer), kgo.DisableAutoCommit())
		defer cl.Close() // LeaveGroup
		got := pollGroupKgo(t, ctx, cl, until)
		commitKgo(t, ctx, cl, map[string]map[int32]int64{f.topic: commit})
		return got
	}
}

// TestGroupFranzGo runs the resume scenario with franz-go's eager range
// balancer and, separately, its cooperative-sticky balancer (autocommit off,
// CommitOffsetsSync).
func TestGroupFranzGo(t *testing.T) {
	t.Run("range", func(t *testing.T) { runGroupResume(t, kgoGroupRun(kgo.RangeBalancer())) })
	t.Run("cooperative-sticky", func(t *testing.T) { runGroupResume(t, kgoGroupRun(kgo.CooperativeStickyBalancer())) })
}

// TestGroupAdmin checks the group admin requests through kadm against a
// group with one franz-go member: ListGroups (with and without a state
// filter), DescribeGroups (state, protocol, the member, what it joined with
// and was assigned), DeleteGroups of a non-empty group (NON_EMPTY_GROUP),
// OffsetDelete of a subscribed topic (GROUP_SUBSCRIBED_TO_TOPIC) and of a
// topic it only committed to (deleted); then, once the member left, the
// group is Empty, OffsetDelete works, DeleteGroups succeeds, OffsetFetch
// answers -1, the group is no longer listed and a second DeleteGroups
// answers GROUP_ID_NOT_FOUND.
func TestGroupAdmin(t *testing.T) {
	f := newGroupFixture(t, groupPartitions)
	ctx := testCtx(t, groupTimeout)
	f.produce(t, ctx, 10)
	other := f.topic + "-other"
	createTopicKadm(t, f.b.Addr(), other, 1)
	if err := f.prod.ProduceSync(ctx, &kgo.Record{Topic: other, Value: []byte("a")}, &kgo.Record{Topic: other, Value: []byte("b")}).FirstErr(); err != nil {
		t.Fatalf("produce to %s: %v", other, err)
	}

	const clientID = "compat-tests-admin"
	cl := newKgoMember(t, f, kgo.Balancers(kgo.RangeBalancer()), kgo.DisableAutoCommit(), kgo.ClientID(clientID))
	closed := false
	defer func() {
		if !closed {
			cl.Close()
		}
	}()
	pollGroupKgo(t, ctx, cl, f.end)
	// A member may commit offsets of any topic, not only the ones it
	// consumes.
	commits := map[string]map[int32]int64{f.topic: maps.Clone(f.end), other: {0: 1}}
	commitKgo(t, ctx, cl, commits)
	f.checkCommits(t, ctx, "after the commit", commits)
	memberID, generation := cl.GroupMetadata()

	t.Run("active", func(t *testing.T) {
		listed, err := f.adm.ListGroups(ctx)
		if err != nil {
			t.Fatalf("kadm ListGroups: %v", err)
		}
		if g, ok := listed[f.group]; !ok {
			t.Errorf("ListGroups does not list %s (lists %v)", f.group, slices.Sorted(maps.Keys(listed)))
		} else if g.State != "Stable" || g.ProtocolType != "consumer" {
			t.Errorf("ListGroups: %s has state %q, protocol type %q; want Stable, consumer", f.group, g.State, g.ProtocolType)
		}
		for _, filter := range []struct {
			state string
			in    bool
		}{{"Stable", true}, {"Empty", false}} {
			listed, err := f.adm.ListGroups(ctx, filter.state)
			if err != nil {
				t.Fatalf("kadm ListGroups %s: %v", filter.state, err)
			}
			if _, in := listed[f.group]; in != filter.in {
				t.Errorf("ListGroups with states filter [%s]: %s listed %v, want %v", filter.state, f.group, in, filter.in)
			}
		}

		d := f.describe(t, ctx)
		if d.Err != nil || d.State != "Stable" || d.ProtocolType != "consumer" || d.Protocol != "range" {
			t.Errorf("DescribeGroups %s: error %v, state %q, protocol type %q, protocol %q; want none, Stable, consumer, range",
				f.group, d.Err, d.State, d.ProtocolType, d.Protocol)
		}
		if len(d.Members) != 1 {
			t.Fatalf("DescribeGroups %s: members %q, want just %q", f.group, memberIDs(d), memberID)
		}
		m := d.Members[0]
		if m.MemberID != memberID || m.ClientID != clientID || m.ClientHost == "" {
			t.Errorf("DescribeGroups %s: member %q, client id %q, client host %q; want %q, %q and a host",
				f.group, m.MemberID, m.ClientID, m.ClientHost, memberID, clientID)
		}
		if meta, ok := m.Join.AsConsumer(); !ok || !slices.Equal(meta.Topics, []string{f.topic}) {
			t.Errorf("DescribeGroups %s: member metadata %+v does not decode to a subscription of [%s]", f.group, meta, f.topic)
		}
		assigned := d.AssignedPartitions()
		if got, want := fmt.Sprint(assigned.Sorted()), fmt.Sprint(kadm.TopicsSet{f.topic: {0: {}, 1: {}, 2: {}}}.Sorted()); got != want {
			t.Errorf("DescribeGroups %s: member assignment %s, want %s", f.group, got, want)
		}
		t.Logf("DescribeGroups: %s %s/%s, member %s (generation %d, host %s)", d.State, d.ProtocolType, d.Protocol, m.MemberID, generation, m.ClientHost)

		if _, err := f.adm.DeleteGroup(ctx, f.group); !errors.Is(err, kerr.NonEmptyGroup) {
			t.Errorf("DeleteGroups of %s with a member: %v, want %v", f.group, err, kerr.NonEmptyGroup)
		}
		del, err := f.adm.DeleteOffsets(ctx, f.group, kadm.TopicsSet{f.topic: {0: {}, 1: {}, 2: {}}, other: {0: {}}})
		if err != nil {
			t.Fatalf("kadm DeleteOffsets: %v", err)
		}
		for p := range f.partitions {
			if err, ok := del[f.topic][p]; !ok || !errors.Is(err, kerr.GroupSubscribedToTopic) {
				t.Errorf("OffsetDelete %s p%d of the subscribed topic: %v (answered: %v), want %v", f.group, p, err, ok, kerr.GroupSubscribedToTopic)
			}
		}
		if err, ok := del[other][0]; !ok || err != nil {
			t.Errorf("OffsetDelete %s p0 of %s, a topic no member subscribes to: %v (answered: %v), want no error", f.group, other, err, ok)
		}
		f.checkCommits(t, ctx, "after OffsetDelete", map[string]map[int32]int64{f.topic: f.end})
		// Nothing of the above may have disturbed the member.
		f.waitGroupState(t, ctx, 5*time.Second, "Stable", memberID)
	})

	t.Run("empty", func(t *testing.T) {
		cl.Close() // LeaveGroup
		closed = true
		d := f.waitGroupState(t, ctx, emptyTimeout, "Empty")
		if d.ProtocolType != "consumer" {
			t.Errorf("DescribeGroups %s after its member left: protocol type %q, want consumer", f.group, d.ProtocolType)
		}
		listed, err := f.adm.ListGroups(ctx, "Empty")
		if err != nil {
			t.Fatalf("kadm ListGroups Empty: %v", err)
		}
		if g, ok := listed[f.group]; !ok || g.State != "Empty" {
			t.Errorf("ListGroups with states filter [Empty]: %s listed %v with state %q, want listed, Empty", f.group, ok, g.State)
		}
		f.checkCommits(t, ctx, "after the member left", map[string]map[int32]int64{f.topic: f.end})

		del, err := f.adm.DeleteOffsets(ctx, f.group, kadm.TopicsSet{f.topic: {0: {}}})
		if err != nil {
			t.Fatalf("kadm DeleteOffsets: %v", err)
		}
		if err, ok := del[f.topic][0]; !ok || err != nil {
			t.Errorf("OffsetDelete %s p0 of the Empty group: %v (answered: %v), want no error", f.group, err, ok)
		}
		f.checkCommits(t, ctx, "after OffsetDelete of p0", map[string]map[int32]int64{f.topic: {1: f.end[1], 2: f.end[2]}})

		if _, err := f.adm.DeleteGroup(ctx, f.group); err != nil {
			t.Fatalf("DeleteGroups of the Empty group %s: %v", f.group, err)
		}
		f.checkCommits(t, ctx, "after DeleteGroups", nil)
		checkUnknownGroupOffsets(t, ctx, f.b, f.group, f.topic, f.partitions)
		listed, err = f.adm.ListGroups(ctx)
		if err != nil {
			t.Fatalf("kadm ListGroups: %v", err)
		}
		if g, ok := listed[f.group]; ok {
			t.Errorf("ListGroups after DeleteGroups still lists %s (state %q)", f.group, g.State)
		}
		if _, err := f.adm.DeleteGroup(ctx, f.group); !errors.Is(err, kerr.GroupIDNotFound) {
			t.Errorf("DeleteGroups of the deleted group %s: %v, want %v", f.group, err, kerr.GroupIDNotFound)
		}
		// Kafka describes a group that does not exist as Dead without
		// members (DescribeGroups v0-v5) or answers GROUP_ID_NOT_FOUND (v6+).
		if d := f.describe(t, ctx); !errors.Is(d.Err, kerr.GroupIDNotFound) && (d.Err != nil || d.State != "Dead" || len(d.Members) != 0) {
			t.Errorf("DescribeGroups of the deleted group %s: error %v, state %q, members %q; want Dead without members or %v",
				f.group, d.Err, d.State, memberIDs(d), kerr.GroupIDNotFound)
		}
	})
}

// TestGroupRestart: a franz-go member (range, autocommit off, session
// timeout 10 s) reads everything and commits groupCommitAt; then the broker
// is restarted (sigterm: SIGTERM, start; kill9: SIGKILL, 1.5 s down, start;
// synapse only). The committed offsets are exactly there again, and so is
// the group: Stable, the member (same member id) with all partitions
// assigned. The member keeps going: it reads records produced after the
// restart (none below the committed offsets), commits the end and is still
// the group's only member under the same member id; if it joined again
// meanwhile, it is in a later generation than before.
func TestGroupRestart(t *testing.T) {
	t.Run("sigterm", func(t *testing.T) { runGroupRestart(t, false) })
	t.Run("kill9", func(t *testing.T) { runGroupRestart(t, true) })
}

func runGroupRestart(t *testing.T, kill9 bool) {
	if kill9 && compatTarget() == targetKfake {
		t.Skip("kfake runs inside the test process and cannot be killed with SIGKILL")
	}
	f := newGroupFixture(t, groupPartitions)
	ctx := testCtx(t, groupTimeout)
	f.produce(t, ctx, 20)
	var assignments atomic.Int32
	cl := newKgoMember(t, f, kgo.Balancers(kgo.RangeBalancer()), kgo.DisableAutoCommit(),
		kgo.SessionTimeout(10*time.Second), kgo.HeartbeatInterval(500*time.Millisecond),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { assignments.Add(1) }))
	defer cl.Close()
	read := pollGroupKgo(t, ctx, cl, f.end)
	checkGroupRead(t, "member before the restart", read, zeroOffsets(f.partitions), f.end, true)
	commitKgo(t, ctx, cl, map[string]map[int32]int64{f.topic: groupCommitAt})
	memberID, generation := cl.GroupMetadata()
	d := f.waitGroupState(t, ctx, 5*time.Second, "Stable", memberID)
	checkAssignedAll(t, f, d)
	f.checkCommitted(t, ctx, "before the restart", groupCommitAt)
	position := maps.Clone(f.end)

	start := time.Now()
	if kill9 {
		f.b.Kill9(t)
		// Down for three heartbeat intervals: the member's heartbeats
		// fail and are retried until the broker is back.
		time.Sleep(1500 * time.Millisecond)
		f.b.Start(t)
	} else {
		f.b.Restart(t)
	}
	t.Logf("broker back after %s", time.Since(start).Round(time.Millisecond))
	f.checkCommitted(t, ctx, "right after the restart", groupCommitAt)
	// The group as it was: Stable, the member, its assignment (read from
	// disk; the member has nothing to do with it).
	d = f.waitGroupState(t, ctx, 5*time.Second, "Stable", memberID)
	checkAssignedAll(t, f, d)

	f.produce(t, ctx, 10)
	more := pollGroupKgo(t, ctx, cl, f.end)
	// The member goes on from its position; had it lost its partitions and
	// joined again, it would go on from the committed offsets instead.
	// Either way nothing below a committed offset is read, and everything
	// after the position is read exactly once.
	var again int
	var after []groupRec
	for _, r := range more {
		if r.Offset < position[r.Partition] {
			again++
			if r.Offset < groupCommitAt[r.Partition] {
				t.Errorf("member after the restart: read p%d offset %d, below the committed %d", r.Partition, r.Offset, groupCommitAt[r.Partition])
			}
			continue
		}
		after = append(after, r)
	}
	checkGroupRead(t, "member after the restart", after, position, f.end, true)
	commitKgo(t, ctx, cl, map[string]map[int32]int64{f.topic: f.end})
	f.checkCommitted(t, ctx, "after the member committed again", f.end)
	id2, gen2 := cl.GroupMetadata()
	if id2 != memberID {
		t.Errorf("the member's id changed from %q to %q over the restart: the broker forgot the member, it had to join as a new one", memberID, id2)
	}
	d = f.waitGroupState(t, ctx, 5*time.Second, "Stable", id2)
	checkAssignedAll(t, f, d)
	// A member whose heartbeats failed while the broker was down may join
	// again (franz-go does) with its member id: a broker that recovered the
	// group knows it and starts the next generation; one that started the
	// group over would hand out its first generation again.
	n := assignments.Load()
	if n > 1 && gen2 <= generation {
		t.Errorf("the member joined again after the restart (assigned partitions %d times) and got generation %d, "+
			"not one after %d: the broker started the group over instead of recovering it", n, gen2, generation)
	}
	t.Logf("member %s: generation %d before the restart, %d after; assigned partitions %d times; read %d records again from the committed offsets",
		memberID, generation, gen2, n, again)
}

// checkAssignedAll checks that the partitions of f.topic are all assigned.
func checkAssignedAll(t testing.TB, f *groupFixture, d kadm.DescribedGroup) {
	t.Helper()
	want := kadm.TopicsSet{f.topic: {}}
	for p := range f.partitions {
		want[f.topic][p] = struct{}{}
	}
	if got := d.AssignedPartitions(); fmt.Sprint(got.Sorted()) != fmt.Sprint(want.Sorted()) {
		t.Errorf("DescribeGroups %s: assigned %v, want %v", f.group, got.Sorted(), want.Sorted())
	}
}
