package compattests

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestGroupRebalanceUnderLoad: franz-go members of one group (the
// cooperative-sticky balancer, and separately the eager range balancer;
// autocommit every 500 ms, which also commits before partitions are given
// up; session timeout 3 s) consume a 6-partition topic while a producer
// writes 100,000 records in 100 paced batches. Member a starts, b and c
// join; c is killed (its connections are
// severed and every later dial fails, so it can neither heartbeat nor send
// LeaveGroup); b leaves cleanly; d joins. Checked:
//   - 1 s after the kill c is still a member (a broker evicts on the session
//     timeout, not when connections drop), and it is evicted by the session
//     timeout (within 3 s + 15 s);
//   - every record is consumed at least once, at the offset its producer was
//     told;
//   - the group's committed offsets, polled through kadm every 100 ms during
//     the whole run, never go backwards, and end at the end of every
//     partition;
//   - after that a fresh member of the group reads nothing: only the one
//     record per partition produced after it was assigned everything.
func TestGroupRebalanceUnderLoad(t *testing.T) {
	t.Run("cooperative-sticky", func(t *testing.T) { runRebalanceUnderLoad(t, kgo.CooperativeStickyBalancer) })
	t.Run("range", func(t *testing.T) { runRebalanceUnderLoad(t, kgo.RangeBalancer) })
}

func runRebalanceUnderLoad(t *testing.T, balancer func() kgo.GroupBalancer) {
	const (
		partitions     = 6
		total          = 100_000
		batch          = 1000
		pace           = 50 * time.Millisecond // between batches
		sessionTimeout = 3 * time.Second
	)
	f := newGroupFixture(t, partitions)
	ctx := testCtx(t, groupTimeout)
	start := time.Now()
	since := func() time.Duration { return time.Since(start).Round(time.Millisecond) }

	// seen[seq] counts deliveries of record seq; at[seq] is 1 + the offset it
	// was first consumed at; producedAt[seq] is the offset the producer was
	// told.
	seen := make([]atomic.Int32, total)
	at := make([]atomic.Int64, total)
	producedAt := make([]int64, total)
	var consumed atomic.Int64 // distinct records consumed
	var errMu sync.Mutex
	var memberErrs []string
	memberErr := func(format string, args ...any) {
		errMu.Lock()
		defer errMu.Unlock()
		if len(memberErrs) < 20 {
			memberErrs = append(memberErrs, fmt.Sprintf(format, args...))
		}
	}

	// The committed offsets, watched during the whole run.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var (
		watchDone       = make(chan struct{})
		watchPolls      int
		watchChanges    int
		watchErrs       int
		watchFirstErr   error
		watchBackwards  []string
		lastCommitted   = make(map[int32]int64)
		committedRising = func(got map[string]map[int32]int64) {
			for p, o := range got[f.topic] {
				if last, ok := lastCommitted[p]; ok && o < last {
					watchBackwards = append(watchBackwards, fmt.Sprintf("p%d %d → %d at %s", p, last, o, since()))
				}
				if o != lastCommitted[p] {
					watchChanges++
				}
				lastCommitted[p] = o
			}
		}
	)
	go func() {
		defer close(watchDone)
		for watchCtx.Err() == nil {
			got, err := f.fetchCommits(watchCtx)
			if watchCtx.Err() != nil {
				return
			}
			watchPolls++
			if err != nil {
				watchErrs++
				watchFirstErr = cmpErr(watchFirstErr, err)
			} else {
				committedRising(got)
			}
			select {
			case <-watchCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	// The producer: 100 batches of 1000 records, record seq to partition
	// seq%6 with value seq.
	prodDone := make(chan error, 1)
	go func() {
		for b := range total / batch {
			recs := make([]*kgo.Record, batch)
			for i := range recs {
				seq := b*batch + i
				recs[i] = &kgo.Record{Topic: f.topic, Partition: int32(seq % partitions), Value: strconv.AppendInt(nil, int64(seq), 10)}
			}
			if err := f.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				prodDone <- fmt.Errorf("batch %d: %w", b, err)
				return
			}
			for i, r := range recs {
				producedAt[b*batch+i] = r.Offset
			}
			select {
			case <-ctx.Done():
				prodDone <- ctx.Err()
				return
			case <-time.After(pace):
			}
		}
		prodDone <- nil
	}()

	var members []*loadMember
	defer func() {
		for _, m := range members {
			m.close(t)
		}
	}()
	startMember := func(name string) *loadMember {
		m := &loadMember{name: name, dialer: &severableDialer{}, done: make(chan struct{})}
		m.cl = newKgoMember(t, f,
			kgo.ClientID(name),
			kgo.Balancers(balancer()),
			kgo.SessionTimeout(sessionTimeout),
			kgo.HeartbeatInterval(300*time.Millisecond),
			kgo.RebalanceTimeout(10*time.Second),
			kgo.AutoCommitInterval(500*time.Millisecond),
			kgo.Dialer(m.dialer.DialContext),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
				m.assigned.Add(int32(len(assigned[f.topic])))
				m.rebalances.Add(1)
			}),
		)
		var mctx context.Context
		mctx, m.stop = context.WithCancel(ctx)
		go func() {
			defer close(m.done)
			for {
				fs := m.cl.PollFetches(mctx)
				// Whatever a poll returned counts as consumed, even when
				// the member is stopping: autocommit may commit it.
				fs.EachRecord(func(r *kgo.Record) {
					m.polled.Add(1)
					seq, err := strconv.Atoi(string(r.Value))
					if err != nil || seq < 0 || seq >= total || int32(seq%partitions) != r.Partition {
						memberErr("%s: p%d offset %d has value %q, not a seq of that partition", name, r.Partition, r.Offset, r.Value)
						return
					}
					if seen[seq].Add(1) == 1 {
						consumed.Add(1)
					}
					if !at[seq].CompareAndSwap(0, r.Offset+1) && at[seq].Load() != r.Offset+1 {
						memberErr("%s: seq %d consumed at p%d offset %d and at offset %d", name, seq, r.Partition, r.Offset, at[seq].Load()-1)
					}
				})
				if mctx.Err() != nil || fs.IsClientClosed() {
					return
				}
				if m.dialer.isSevered() {
					continue
				}
				fs.EachError(func(topic string, p int32, err error) {
					if !kerr.IsRetriable(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
						memberErr("%s: fetch %s p%d: %v", name, topic, p, err)
					}
				})
			}
		}()
		members = append(members, m)
		t.Logf("%s: member %s started", since(), name)
		return m
	}
	sleep := func(d time.Duration) {
		t.Helper()
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", since(), ctx.Err())
		case <-time.After(d):
		}
	}
	waitFor := func(what string, within time.Duration, cond func() bool) time.Duration {
		t.Helper()
		begin := time.Now()
		for !cond() {
			if time.Since(begin) > within {
				t.Fatalf("%s: not %s within %s", since(), what, within)
			}
			sleep(50 * time.Millisecond)
		}
		return time.Since(begin)
	}

	startMember("a")
	sleep(time.Second)
	b := startMember("b")
	sleep(time.Second)
	c := startMember("c")
	waitFor("c assigned partitions and consuming", 15*time.Second, func() bool { return c.assigned.Load() > 0 && c.polled.Load() > 0 })
	cID, _ := c.cl.GroupMetadata()
	c.kill()
	killedAt := time.Now()
	t.Logf("%s: member c (%s) killed: connections severed, dials fail; it had polled %d records", since(), cID, c.polled.Load())
	sleep(time.Second)
	if d := f.describe(t, ctx); !slices.Contains(memberIDs(d), cID) {
		t.Errorf("%s: the killed member c (%s) was no longer in the group 1 s after its connections dropped (state %s, members %q); "+
			"its session timeout is %s", since(), cID, d.State, memberIDs(d), sessionTimeout)
	}
	b.close(t) // LeaveGroup, after committing what it polled
	t.Logf("%s: member b left", since())
	sleep(500 * time.Millisecond)
	startMember("d")

	select {
	case err := <-prodDone:
		if err != nil {
			t.Fatalf("%s: producer: %v", since(), err)
		}
	case <-ctx.Done():
		t.Fatalf("%s: producer not done: %v", since(), ctx.Err())
	}
	end := make(map[int32]int64)
	for seq, off := range producedAt {
		p := int32(seq % partitions)
		end[p] = max(end[p], off+1)
	}
	t.Logf("%s: produced %d records, ends %s", since(), total, fmtOffsets(end))

	waitFor("c evicted", sessionTimeout+15*time.Second, func() bool { return !slices.Contains(memberIDs(f.describe(t, ctx)), cID) })
	t.Logf("%s: member c evicted %s after it was killed", since(), time.Since(killedAt).Round(time.Millisecond))
	waitFor("every record consumed", 30*time.Second, func() bool { return consumed.Load() == total })
	t.Logf("%s: every record consumed", since())
	var committed map[string]map[int32]int64
	waitFor("the end of every partition committed", 20*time.Second, func() bool {
		committed = f.commits(t, ctx)
		return fmtCommits(committed) == fmtCommits(map[string]map[int32]int64{f.topic: end})
	})
	t.Logf("%s: committed %s", since(), fmtCommits(committed))

	// Stop the members that are left; closing commits what they polled
	// (nothing new) and leaves the group.
	for _, m := range members {
		m.close(t)
	}
	stopWatch()
	<-watchDone
	t.Logf("committed offsets polled %d times (%d errors), %d changes seen", watchPolls, watchErrs, watchChanges)
	if len(watchBackwards) > 0 {
		t.Errorf("committed offsets went backwards %d times: %q", len(watchBackwards), watchBackwards)
	}
	if watchChanges < partitions {
		t.Errorf("the watcher saw only %d changes of committed offsets in %d polls (errors: %d, first: %v): it did not watch",
			watchChanges, watchPolls, watchErrs, watchFirstErr)
	}
	if watchErrs > 0 {
		t.Errorf("FetchOffsets failed %d of %d times while watching, first: %v", watchErrs, watchPolls, watchFirstErr)
	}
	f.checkCommitted(t, ctx, "after the members closed", end)

	var dups, redelivered int
	var missing, misplaced []string
	for seq := range total {
		switch n := seen[seq].Load(); {
		case n == 0:
			missing = append(missing, fmt.Sprintf("seq %d (p%d@%d)", seq, seq%partitions, producedAt[seq]))
		case n > 1:
			dups += int(n) - 1
			redelivered++
		}
		if o := at[seq].Load() - 1; o >= 0 && o != producedAt[seq] {
			misplaced = append(misplaced, fmt.Sprintf("seq %d produced at p%d@%d, consumed at offset %d", seq, seq%partitions, producedAt[seq], o))
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d records never consumed, first: %.10q", len(missing), missing)
	}
	if len(misplaced) > 0 {
		t.Errorf("%d records consumed at another offset than the producer was told, first: %.10q", len(misplaced), misplaced)
	}
	errMu.Lock()
	for _, e := range memberErrs {
		t.Error(e)
	}
	errMu.Unlock()
	var polled []string
	for _, m := range members {
		polled = append(polled, fmt.Sprintf("%s %d (%d assignments)", m.name, m.polled.Load(), m.rebalances.Load()))
	}
	t.Logf("records polled per member: %s; %d records consumed more than once (%d extra deliveries, at least once is the contract)",
		polled, redelivered, dups)

	// A fresh member resumes at the committed end: it reads nothing until
	// one more record per partition is produced, then exactly those.
	var assigned atomic.Int32
	e := newKgoMember(t, f, kgo.ClientID("e"), kgo.DisableAutoCommit(), kgo.Balancers(balancer()),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) { assigned.Add(int32(len(m[f.topic]))) }))
	defer e.Close()
	var stale []string
	quietFrom := time.Time{}
	for begin := time.Now(); quietFrom.IsZero() || time.Since(quietFrom) < 2*time.Second; {
		if quietFrom.IsZero() && time.Since(begin) > 15*time.Second {
			t.Fatalf("fresh member: assigned %d of %d partitions after 15 s", assigned.Load(), partitions)
		}
		pctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		fs := e.PollFetches(pctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			stale = append(stale, fmt.Sprintf("p%d@%d", r.Partition, r.Offset))
		})
		if quietFrom.IsZero() && assigned.Load() == partitions {
			quietFrom = time.Now()
		}
	}
	if len(stale) > 0 {
		t.Errorf("fresh member of the group read %d records that were consumed and committed before: %.20q", len(stale), stale)
	}
	var recs []*kgo.Record
	next := make(map[int32]int64)
	for p := range int32(partitions) {
		recs = append(recs, &kgo.Record{Topic: f.topic, Partition: p, Value: []byte("after")})
		next[p] = end[p] + 1
	}
	if err := f.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce one more record per partition: %v", err)
	}
	var got []string
	for _, r := range pollGroupKgo(t, ctx, e, next) {
		got = append(got, fmt.Sprintf("p%d@%d", r.Partition, r.Offset))
	}
	slices.Sort(got)
	var want []string
	for p := range int32(partitions) {
		want = append(want, fmt.Sprintf("p%d@%d", p, end[p]))
	}
	if !slices.Equal(got, want) {
		t.Errorf("fresh member, after one more record per partition: read %q, want just %q", got, want)
	}
	t.Logf("%s: done", since())
}

// loadMember is one group member of TestGroupRebalanceUnderLoad and its poll
// loop.
type loadMember struct {
	name       string
	cl         *kgo.Client
	dialer     *severableDialer
	stop       context.CancelFunc
	done       chan struct{} // closed when the poll loop returned
	polled     atomic.Int64
	assigned   atomic.Int32 // partitions assigned, summed over assignments
	rebalances atomic.Int32
	closed     bool
}

// kill severs the member's connections (it can no longer heartbeat, commit
// or leave) and stops its poll loop.
func (m *loadMember) kill() {
	m.dialer.sever()
	m.stop()
	<-m.done
}

// close stops the poll loop and closes the client: a live member commits
// what it polled and leaves the group; a killed one cannot, so it is closed
// without waiting for the leave (bounded).
func (m *loadMember) close(t testing.TB) {
	t.Helper()
	if m.closed {
		return
	}
	m.closed = true
	m.stop()
	<-m.done
	if !m.dialer.isSevered() {
		m.cl.Close()
		return
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	_ = m.cl.LeaveGroupContext(canceled)
	closed := make(chan struct{})
	go func() {
		m.cl.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Logf("the killed member %s did not close within 10 s; left behind", m.name)
	}
}

var errSevered = errors.New("compat-tests: this member was killed; no more connections")

// severableDialer dials for one client until sever: then it closes every
// connection it made and fails every later dial, so the client can neither
// heartbeat nor leave its group; to the broker it is a member that died.
type severableDialer struct {
	mu      sync.Mutex
	severed bool
	conns   []net.Conn
}

func (d *severableDialer) DialContext(ctx context.Context, network, host string) (net.Conn, error) {
	if d.isSevered() {
		return nil, errSevered
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.severed {
		c.Close()
		return nil, errSevered
	}
	d.conns = append(d.conns, c)
	return c, nil
}

func (d *severableDialer) isSevered() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.severed
}

func (d *severableDialer) sever() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.severed = true
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
