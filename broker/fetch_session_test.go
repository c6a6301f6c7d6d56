package broker

import (
	"math"
	"net"
	"os"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/auth"
)

// fetcher sends Fetch requests on a bare connection.
type fetcher struct {
	t    *testing.T
	nc   net.Conn
	corr int32
}

func dialFetcher(t *testing.T, addr string) *fetcher {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &fetcher{t: t, nc: nc}
}

func (f *fetcher) fetch(req *kmsg.FetchRequest) *kmsg.FetchResponse {
	f.t.Helper()
	f.corr++
	f.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := f.nc.Write(reqFrame(req, f.corr)); err != nil {
		f.t.Fatal(err)
	}
	corr, body, err := readAnswer(f.nc, 15*time.Second)
	if err != nil {
		f.t.Fatal(err)
	}
	if corr != f.corr {
		f.t.Fatalf("answer to correlation %d, want %d", corr, f.corr)
	}
	resp := req.ResponseKind().(*kmsg.FetchResponse)
	if resp.IsFlexible() {
		body = body[1:] // the header's empty tag buffer
	}
	if err := resp.ReadFrom(body); err != nil {
		f.t.Fatal(err)
	}
	return resp
}

// sessionFetch is a Fetch request of version v for session id at epoch,
// answered at once (MinBytes 0).
func sessionFetch(v int16, id, epoch int32) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	req.Version, req.ReplicaID, req.SessionID, req.SessionEpoch = v, -1, id, epoch
	req.MaxBytes, req.MinBytes, req.MaxWaitMillis = 1<<20, 0, 0
	return req
}

// add names partition part of topic at offset (by id from v13, by name
// below).
func (ts *testServer) add(req *kmsg.FetchRequest, topic string, part int32, offset int64) {
	var id [16]byte
	if t := ts.reg.get(topic); t != nil {
		id = t.id
	}
	addPart(req, topic, id, part, offset)
}

func addPart(req *kmsg.FetchRequest, topic string, id [16]byte, part int32, offset int64) {
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = part, offset, 1<<20
	for i := range req.Topics {
		if rt := &req.Topics[i]; rt.Topic == topic && rt.TopicID == id {
			rt.Partitions = append(rt.Partitions, rp)
			return
		}
	}
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, id
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
}

func forget(req *kmsg.FetchRequest, topic string, id [16]byte, part int32) {
	ft := kmsg.NewFetchRequestForgottenTopic()
	ft.Topic, ft.TopicID, ft.Partitions = topic, id, []int32{part}
	req.ForgottenTopics = append(req.ForgottenTopics, ft)
}

// answered lists the partitions a response carries as "topic/p" (the
// topic by name below v13, "id" from v13), with records "+" and an error
// its code, sorted.
type answeredPart struct {
	part    int32
	code    int16
	records int
	hw      int64
}

func answered(ts *testServer, resp *kmsg.FetchResponse) map[string]answeredPart {
	out := map[string]answeredPart{}
	for _, t := range resp.Topics {
		name := t.Topic
		if resp.Version >= 13 {
			name = "?"
			if tp := ts.reg.getByID(t.TopicID); tp != nil {
				name = tp.name
			}
		}
		for _, p := range t.Partitions {
			out[name+"/"+itoa(p.Partition)] = answeredPart{p.Partition, p.ErrorCode, len(p.RecordBatches), p.HighWatermark}
		}
	}
	return out
}

func keys(m map[string]answeredPart) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func produceTo(t *testing.T, ts *testServer, topic string, part int32, n int) {
	t.Helper()
	cl, _ := client(t, ts.addr, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for range n {
		if err := cl.ProduceSync(ctxT(t), &kgo.Record{Partition: part, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

func createTopic(t *testing.T, ts *testServer, topic string, parts int32) {
	t.Helper()
	if _, err := ts.reg.create(topic, parts, nil, false); err != nil {
		t.Fatal(err)
	}
}

// The session life cycle at v12 (by name) and v17 (by id): a full fetch
// opens it, incremental fetches answer only partitions with news, forgotten
// partitions are no longer read, epochs are checked, a final epoch closes it.
func TestFetchSessionIncremental(t *testing.T) {
	for _, v := range []int16{12, 17} {
		t.Run(itoa(int32(v)), func(t *testing.T) {
			ts := startServer(t, "")
			createTopic(t, ts, "s", 3)
			produceTo(t, ts, "s", 0, 1)
			f := dialFetcher(t, ts.addr)
			id := ts.reg.get("s").id

			req := sessionFetch(v, 0, 0)
			for p := range int32(3) {
				ts.add(req, "s", p, 0)
			}
			resp := f.fetch(req)
			got := answered(ts, resp)
			if resp.ErrorCode != 0 || resp.SessionID <= 0 || len(got) != 3 || got["s/0"].records == 0 || got["s/0"].hw != 1 {
				t.Fatalf("full fetch: code %d, session %d, %v", resp.ErrorCode, resp.SessionID, got)
			}
			sid := resp.SessionID
			epoch := int32(1)
			incr := func(build func(*kmsg.FetchRequest)) map[string]answeredPart {
				t.Helper()
				req := sessionFetch(v, sid, epoch)
				if build != nil {
					build(req)
				}
				resp := f.fetch(req)
				if resp.ErrorCode != 0 || resp.SessionID != sid {
					t.Fatalf("incremental fetch at epoch %d: code %d, session %d", epoch, resp.ErrorCode, resp.SessionID)
				}
				epoch++
				return answered(ts, resp)
			}
			// Moving p0's offset past its record: nothing new anywhere.
			if got := incr(func(r *kmsg.FetchRequest) { ts.add(r, "s", 0, 1) }); len(got) != 0 {
				t.Fatalf("incremental fetch without news answered %v", keys(got))
			}
			if got := incr(nil); len(got) != 0 {
				t.Fatalf("second incremental fetch without news answered %v", keys(got))
			}
			// An append to p2, named in no request since the full fetch.
			produceTo(t, ts, "s", 2, 1)
			if got := incr(nil); len(got) != 1 || got["s/2"].records == 0 || got["s/2"].hw != 1 {
				t.Fatalf("after an append to s/2: %v", got)
			}
			if got := incr(func(r *kmsg.FetchRequest) { ts.add(r, "s", 2, 1) }); len(got) != 0 {
				t.Fatalf("after consuming s/2: %v", keys(got))
			}
			// Forgotten: p1 is read no more.
			if got := incr(func(r *kmsg.FetchRequest) { forget(r, "s", id, 1) }); len(got) != 0 {
				t.Fatalf("forgetting s/1: %v", keys(got))
			}
			produceTo(t, ts, "s", 1, 1)
			if got := incr(nil); len(got) != 0 {
				t.Fatalf("an append to the forgotten s/1 answered %v", keys(got))
			}
			if _, parts, _ := ts.fetchSessions.stats(); parts != 2 {
				t.Fatalf("%d partitions cached, want 2", parts)
			}
			// Adding it back: answered with its record.
			if got := incr(func(r *kmsg.FetchRequest) { ts.add(r, "s", 1, 0) }); len(got) != 1 || got["s/1"].records == 0 {
				t.Fatalf("adding s/1 back: %v", got)
			}

			// A wrong epoch, an unknown id, the other addressing: errors at
			// the top, and the session goes on.
			for _, c := range []struct {
				req  *kmsg.FetchRequest
				code int16
			}{
				{sessionFetch(v, sid, epoch+5), kerr.InvalidFetchSessionEpoch.Code},
				{sessionFetch(v, sid, epoch-1), kerr.InvalidFetchSessionEpoch.Code},
				{sessionFetch(v, sid^0x55aa, epoch), kerr.FetchSessionIDNotFound.Code},
				{sessionFetch(v, 0, 1), kerr.FetchSessionIDNotFound.Code},
				{sessionFetch(29-v, sid, epoch), kerr.FetchSessionTopicIDError.Code},
			} {
				resp := f.fetch(c.req)
				if resp.ErrorCode != c.code || resp.SessionID != 0 || len(resp.Topics) != 0 {
					t.Fatalf("session %d epoch %d v%d: code %d, session %d, %d topics; want code %d", c.req.SessionID, c.req.SessionEpoch,
						c.req.Version, resp.ErrorCode, resp.SessionID, len(resp.Topics), c.code)
				}
			}
			if got := incr(func(r *kmsg.FetchRequest) { ts.add(r, "s", 1, 1) }); len(got) != 0 {
				t.Fatalf("after the errors: %v", keys(got))
			}

			// The final epoch closes the session: a full fetch without one.
			req = sessionFetch(v, sid, -1)
			ts.add(req, "s", 0, 0)
			if resp := f.fetch(req); resp.ErrorCode != 0 || resp.SessionID != 0 || len(answered(ts, resp)) != 1 {
				t.Fatalf("final epoch: code %d, session %d, %v", resp.ErrorCode, resp.SessionID, answered(ts, resp))
			}
			if resp := f.fetch(sessionFetch(v, sid, epoch)); resp.ErrorCode != kerr.FetchSessionIDNotFound.Code {
				t.Fatalf("closed session: code %d", resp.ErrorCode)
			}
			if n, parts, _ := ts.fetchSessions.stats(); n != 0 || parts != 0 {
				t.Fatalf("%d sessions of %d partitions left", n, parts)
			}
			// Id 0 at the final epoch: no session either.
			req = sessionFetch(v, 0, -1)
			ts.add(req, "s", 0, 0)
			if resp := f.fetch(req); resp.SessionID != 0 || len(resp.Topics) != 1 {
				t.Fatalf("sessionless fetch: session %d, %d topics", resp.SessionID, len(resp.Topics))
			}
		})
	}
}

// A session emptied by ForgottenTopics is closed; epoch 0 with a session id
// replaces that session; the epoch wraps from MaxInt32 to 1.
func TestFetchSessionCloseReplaceWrap(t *testing.T) {
	ts := startServer(t, "")
	createTopic(t, ts, "w", 1)
	id := ts.reg.get("w").id
	f := dialFetcher(t, ts.addr)
	open := func() int32 {
		req := sessionFetch(17, 0, 0)
		ts.add(req, "w", 0, 0)
		resp := f.fetch(req)
		if resp.SessionID <= 0 {
			t.Fatalf("no session: code %d", resp.ErrorCode)
		}
		return resp.SessionID
	}
	sid := open()
	req := sessionFetch(17, sid, 1)
	forget(req, "w", id, 0)
	if resp := f.fetch(req); resp.ErrorCode != 0 || resp.SessionID != 0 {
		t.Fatalf("emptied session: code %d, session %d", resp.ErrorCode, resp.SessionID)
	}
	if resp := f.fetch(sessionFetch(17, sid, 2)); resp.ErrorCode != kerr.FetchSessionIDNotFound.Code {
		t.Fatalf("emptied session used again: code %d", resp.ErrorCode)
	}

	sid = open()
	req = sessionFetch(17, sid, 0)
	ts.add(req, "w", 0, 0)
	resp := f.fetch(req)
	if resp.SessionID <= 0 || resp.SessionID == sid {
		t.Fatalf("epoch 0 on session %d: session %d", sid, resp.SessionID)
	}
	if r := f.fetch(sessionFetch(17, sid, 1)); r.ErrorCode != kerr.FetchSessionIDNotFound.Code {
		t.Fatalf("replaced session: code %d", r.ErrorCode)
	}
	sid = resp.SessionID
	ts.fetchSessions.mu.Lock()
	sess := ts.fetchSessions.sessions[sid]
	ts.fetchSessions.mu.Unlock()
	sess.mu.Lock()
	sess.epoch = math.MaxInt32
	sess.mu.Unlock()
	if r := f.fetch(sessionFetch(17, sid, math.MaxInt32)); r.ErrorCode != 0 || r.SessionID != sid {
		t.Fatalf("epoch MaxInt32: code %d", r.ErrorCode)
	}
	if r := f.fetch(sessionFetch(17, sid, 1)); r.ErrorCode != 0 || r.SessionID != sid {
		t.Fatalf("epoch 1 after MaxInt32: code %d", r.ErrorCode)
	}
}

// A long poll of an incremental fetch naming no partition waits on all of
// the session's partitions.
func TestFetchSessionLongPoll(t *testing.T) {
	ts := startServer(t, "")
	createTopic(t, ts, "lp", 4)
	f := dialFetcher(t, ts.addr)
	req := sessionFetch(17, 0, 0)
	for p := range int32(4) {
		ts.add(req, "lp", p, 0)
	}
	sid := f.fetch(req).SessionID
	if sid <= 0 {
		t.Fatal("no session")
	}
	prod, _ := client(t, ts.addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produced := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		produced <- prod.ProduceSync(ctxT(t), &kgo.Record{Topic: "lp", Partition: 3, Value: []byte("v")}).FirstErr()
	}()
	defer func() {
		if err := <-produced; err != nil {
			t.Fatal(err)
		}
	}()
	req = sessionFetch(17, sid, 1)
	req.MinBytes, req.MaxWaitMillis = 1, 10_000
	start := time.Now()
	resp := f.fetch(req)
	got := answered(ts, resp)
	if el := time.Since(start); el < 250*time.Millisecond || el > 5*time.Second {
		t.Fatalf("long poll answered after %v", el)
	}
	if len(got) != 1 || got["lp/3"].records == 0 {
		t.Fatalf("long poll answered %v", got)
	}
}

// Partitions that returned records go to the back of the session's read
// order: with room for one batch per response, each partition gets its turn.
func TestFetchSessionRotatesPartitions(t *testing.T) {
	ts := startServer(t, "")
	createTopic(t, ts, "rot", 3)
	for p := range int32(3) {
		produceTo(t, ts, "rot", p, 1)
	}
	f := dialFetcher(t, ts.addr)
	req := sessionFetch(17, 0, 0)
	req.MaxBytes = 1
	for p := range int32(3) {
		ts.add(req, "rot", p, 0)
	}
	resp := f.fetch(req)
	sid := resp.SessionID
	if got := answered(ts, resp); got["rot/0"].records == 0 || got["rot/1"].records != 0 {
		t.Fatalf("full fetch: %v", got)
	}
	var served []string
	for epoch := int32(1); epoch <= 3; epoch++ {
		req := sessionFetch(17, sid, epoch)
		req.MaxBytes = 1
		// The client keeps asking from offset 0 (never consumes).
		for name, p := range answered(ts, f.fetch(req)) {
			if p.records > 0 {
				served = append(served, name)
			}
		}
	}
	if len(served) != 3 || served[0] != "rot/0" || served[1] != "rot/1" || served[2] != "rot/2" {
		t.Fatalf("records served in turn: %v, want rot/0, rot/1, rot/2", served)
	}
}

// A full cache evicts as Kafka does: a session idle longer than the
// eviction age goes for any new one; otherwise only a smaller session older
// than that age, for a larger new one; otherwise the new fetch gets no
// session.
func TestFetchSessionEviction(t *testing.T) {
	var skew atomic.Int64
	ts := startServerConfig(t, Config{AutoCreateTopics: true, FetchSessionCacheSlots: 2,
		Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }})
	createTopic(t, ts, "ev", 3)
	f := dialFetcher(t, ts.addr)
	open := func(parts int32) int32 {
		req := sessionFetch(17, 0, 0)
		for p := range parts {
			ts.add(req, "ev", p, 0)
		}
		return f.fetch(req).SessionID
	}
	epochs := map[int32]int32{}
	use := func(sid int32) int16 {
		if epochs[sid] == 0 {
			epochs[sid] = 1
		}
		resp := f.fetch(sessionFetch(17, sid, epochs[sid]))
		if resp.ErrorCode == 0 {
			epochs[sid]++
		}
		return resp.ErrorCode
	}
	a, b := open(1), open(1)
	if a <= 0 || b <= 0 {
		t.Fatalf("sessions %d, %d", a, b)
	}
	if c := open(3); c != 0 {
		t.Fatalf("a third session in a full cache of fresh sessions: %d", c)
	}
	// Both 3 minutes old and just used: the larger new session evicts the
	// smaller one with the lower id, an equal one evicts nothing.
	skew.Store(int64(3 * time.Minute))
	if use(a) != 0 || use(b) != 0 {
		t.Fatal("sessions lost")
	}
	if c := open(1); c != 0 {
		t.Fatalf("a session of 1 partition evicted one of 1: %d", c)
	}
	c := open(2)
	if c <= 0 {
		t.Fatal("a session of 2 partitions evicted none of 1")
	}
	victim, kept := a, b
	if b < a {
		victim, kept = b, a
	}
	if use(victim) != kerr.FetchSessionIDNotFound.Code || use(kept) != 0 || use(c) != 0 {
		t.Fatal("not the smaller session with the lower id evicted")
	}
	// kept idle for 3 more minutes while c is used: kept goes for a new
	// session of any size.
	skew.Store(int64(6 * time.Minute))
	if use(c) != 0 {
		t.Fatal("session c lost")
	}
	if d := open(1); d <= 0 {
		t.Fatal("an idle session was not evicted")
	}
	if use(kept) != kerr.FetchSessionIDNotFound.Code || use(c) != 0 {
		t.Fatal("not the idle session evicted")
	}
	if n, _, evictions := ts.fetchSessions.stats(); n != 2 || evictions != 2 {
		t.Fatalf("%d sessions, %d evictions; want 2, 2", n, evictions)
	}
}

// Sessions hold at most maxSessionPartitions: a larger full fetch gets no
// session, and growing past it closes the session.
func TestFetchSessionPartitionBound(t *testing.T) {
	defer func(n int) { maxSessionPartitions = n }(maxSessionPartitions)
	maxSessionPartitions = 3
	ts := startServer(t, "")
	createTopic(t, ts, "b", 5)
	f := dialFetcher(t, ts.addr)
	req := sessionFetch(17, 0, 0)
	for p := range int32(4) {
		ts.add(req, "b", p, 0)
	}
	if resp := f.fetch(req); resp.ErrorCode != 0 || resp.SessionID != 0 || len(resp.Topics[0].Partitions) != 4 {
		t.Fatalf("a full fetch past the bound: code %d, session %d", resp.ErrorCode, resp.SessionID)
	}
	req = sessionFetch(17, 0, 0)
	ts.add(req, "b", 0, 0)
	ts.add(req, "b", 1, 0)
	sid := f.fetch(req).SessionID
	req = sessionFetch(17, sid, 1)
	ts.add(req, "b", 2, 0)
	if resp := f.fetch(req); resp.ErrorCode != 0 {
		t.Fatalf("growing to the bound: code %d", resp.ErrorCode)
	}
	req = sessionFetch(17, sid, 2)
	ts.add(req, "b", 3, 0)
	if resp := f.fetch(req); resp.ErrorCode != kerr.FetchSessionIDNotFound.Code {
		t.Fatalf("growing past the bound: code %d", resp.ErrorCode)
	}
	if n, parts, _ := ts.fetchSessions.stats(); n != 0 || parts != 0 {
		t.Fatalf("%d sessions of %d partitions left", n, parts)
	}
}

// With sessions off every full fetch is answered without one, and an
// incremental fetch finds no session.
func TestFetchSessionsOff(t *testing.T) {
	ts := startServerConfig(t, Config{AutoCreateTopics: true, FetchSessionCacheSlots: -1})
	createTopic(t, ts, "off", 1)
	f := dialFetcher(t, ts.addr)
	req := sessionFetch(17, 0, 0)
	ts.add(req, "off", 0, 0)
	if resp := f.fetch(req); resp.ErrorCode != 0 || resp.SessionID != 0 || len(resp.Topics) != 1 {
		t.Fatalf("full fetch: code %d, session %d", resp.ErrorCode, resp.SessionID)
	}
	if resp := f.fetch(sessionFetch(17, 12345, 1)); resp.ErrorCode != kerr.FetchSessionIDNotFound.Code {
		t.Fatalf("incremental fetch: code %d", resp.ErrorCode)
	}
}

// A deleted topic in a session answers UNKNOWN_TOPIC_OR_PARTITION; once a
// topic of that name exists again, a v13+ session (by the old id) answers
// INCONSISTENT_TOPIC_ID and a v12 one (by name) reads the new topic. An id
// never known answers UNKNOWN_TOPIC_ID.
func TestFetchSessionDeletedTopic(t *testing.T) {
	for _, v := range []int16{12, 17} {
		t.Run(itoa(int32(v)), func(t *testing.T) {
			ts := startServer(t, "")
			createTopic(t, ts, "gone", 1)
			createTopic(t, ts, "stay", 1)
			_, adm := client(t, ts.addr)
			f := dialFetcher(t, ts.addr)
			req := sessionFetch(v, 0, 0)
			ts.add(req, "gone", 0, 0)
			ts.add(req, "stay", 0, 0)
			unknown := [16]byte{0xde, 0xad}
			if v >= 13 {
				addPart(req, "", unknown, 0, 0)
			}
			resp := f.fetch(req)
			sid := resp.SessionID
			if got := answered(ts, resp); sid <= 0 || (v >= 13 && got["?/0"].code != kerr.UnknownTopicID.Code) {
				t.Fatalf("full fetch: session %d, %v", sid, got)
			}
			if _, err := adm.DeleteTopic(ctxT(t), "gone"); err != nil {
				t.Fatal(err)
			}
			want := map[string]int16{"gone/0": kerr.UnknownTopicOrPartition.Code}
			if v >= 13 {
				want = map[string]int16{"?/0": kerr.UnknownTopicOrPartition.Code}
			}
			check := func(epoch int32, want map[string]int16) {
				t.Helper()
				resp := f.fetch(sessionFetch(v, sid, epoch))
				got := answered(ts, resp)
				if v >= 13 {
					// The deleted and the unknown id both show as "?".
					n := 0
					for _, tp := range resp.Topics {
						for _, p := range tp.Partitions {
							n++
							if tp.TopicID == unknown && p.ErrorCode != kerr.UnknownTopicID.Code {
								t.Fatalf("epoch %d: the unknown id answered %d", epoch, p.ErrorCode)
							}
							if tp.TopicID != unknown && p.ErrorCode != want["?/0"] {
								t.Fatalf("epoch %d: the deleted topic answered %d, want %d", epoch, p.ErrorCode, want["?/0"])
							}
						}
					}
					if n != 2 {
						t.Fatalf("epoch %d: %d partitions answered, want 2", epoch, n)
					}
					return
				}
				if len(got) != len(want) {
					t.Fatalf("epoch %d: %v, want %v", epoch, got, want)
				}
				for k, code := range want {
					if got[k].code != code {
						t.Fatalf("epoch %d: %s answered %d, want %d", epoch, k, got[k].code, code)
					}
				}
			}
			check(1, want)
			check(2, want) // errors are answered every time
			createTopic(t, ts, "gone", 1)
			if v >= 13 {
				check(3, map[string]int16{"?/0": kerr.InconsistentTopicID.Code})
			} else {
				// By name: the new topic, read from offset 0 (high
				// watermark 0: news after the error).
				check(3, map[string]int16{"gone/0": 0})
				check(4, map[string]int16{})
			}
		})
	}
}

// ACLs apply to every partition of a session on every request: a session
// opened by a principal who may read a topic gives another nothing, and a
// session of one's own stops reading a topic once READ is denied.
func TestFetchSessionACLs(t *testing.T) {
	w := newACLWorld(t)
	ss := w.ss
	produceTo := func(topic string) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(ss.addrs[SASLPlaintext]), kgo.SASL(scram.Auth{User: "admin", Pass: testAdminPassword}.AsSha512Mechanism()))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if err := cl.ProduceSync(ctxT(t), &kgo.Record{Topic: topic, Value: []byte("secret")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produceTo("visible")
	produceTo("hidden")
	w.grant(t, kadm.NewACLs().Allow("User:u").Topics("visible").Operations(kadm.OpRead))
	login := func(user, pass string) *fetcher {
		r := dialSASL(t, ss.addrs[SASLPlaintext])
		if ar := plainLogin(t, r, user, pass); ar.ErrorCode != 0 {
			t.Fatalf("login %s: code %d", user, ar.ErrorCode)
		}
		return &fetcher{t: t, nc: r.c, corr: r.corr}
	}
	admin, u := login("admin", testAdminPassword), login("u", "u-pw")
	ids := map[string][16]byte{"visible": ss.reg.get("visible").id, "hidden": ss.reg.get("hidden").id}
	names := map[[16]byte]string{ids["visible"]: "visible", ids["hidden"]: "hidden"}
	byName := func(resp *kmsg.FetchResponse) map[string]answeredPart {
		out := map[string]answeredPart{}
		for _, tp := range resp.Topics {
			for _, p := range tp.Partitions {
				out[names[tp.TopicID]] = answeredPart{p.Partition, p.ErrorCode, len(p.RecordBatches), p.HighWatermark}
			}
		}
		return out
	}

	// The admin's session, used by u on another connection.
	req := sessionFetch(17, 0, 0)
	addPart(req, "", ids["visible"], 0, 0)
	addPart(req, "", ids["hidden"], 0, 0)
	resp := admin.fetch(req)
	if got := byName(resp); resp.SessionID <= 0 || got["hidden"].records == 0 || got["visible"].records == 0 {
		t.Fatalf("the admin's full fetch: session %d, %v", resp.SessionID, got)
	}
	sid := resp.SessionID
	for epoch := int32(1); epoch <= 2; epoch++ {
		got := byName(u.fetch(sessionFetch(17, sid, epoch)))
		if h := got["hidden"]; h.code != kerr.TopicAuthorizationFailed.Code || h.records != 0 {
			t.Fatalf("u through the admin's session, epoch %d: hidden answered %+v", epoch, h)
		}
		if vis, ok := got["visible"]; epoch == 1 && (!ok || vis.code != 0 || vis.records == 0) {
			// The admin's last answer carried visible's records at HW 1;
			// u asks from offset 0 again and may read it: news only as
			// records.
			t.Fatalf("u through the admin's session, epoch %d: visible answered %+v (%v)", epoch, vis, got)
		}
	}

	// u's own session: visible until READ on it is denied.
	req = sessionFetch(17, 0, 0)
	addPart(req, "", ids["visible"], 0, 1)
	resp = u.fetch(req)
	if got := byName(resp); resp.SessionID <= 0 || got["visible"].code != 0 {
		t.Fatalf("u's full fetch: session %d, %v", resp.SessionID, got)
	}
	sid = resp.SessionID
	if got := byName(u.fetch(sessionFetch(17, sid, 1))); len(got) != 0 {
		t.Fatalf("u's incremental fetch: %v", got)
	}
	if _, err := ss.sec.acls.Create([]auth.ACL{{ResourceType: resTopic, ResourceName: "visible", PatternType: kmsg.ACLResourcePatternTypeLiteral,
		Principal: "User:u", Host: "*", Operation: opRead, Permission: kmsg.ACLPermissionTypeDeny}}); err != nil {
		t.Fatal(err)
	}
	for epoch := int32(2); epoch <= 3; epoch++ {
		if got := byName(u.fetch(sessionFetch(17, sid, epoch))); got["visible"].code != kerr.TopicAuthorizationFailed.Code {
			t.Fatalf("u's session after READ was denied, epoch %d: %v", epoch, got)
		}
	}
}

// A franz-go consumer uses a session: it consumes everything produced
// while the session holds its partitions, and the cache shows it.
func TestFetchSessionFranzGoConsumer(t *testing.T) {
	ts := startServer(t, "")
	for _, topic := range []string{"fa", "fb"} {
		createTopic(t, ts, topic, 4)
	}
	cl, _ := client(t, ts.addr, kgo.ConsumeTopics("fa", "fb"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	prod, _ := client(t, ts.addr)
	ctx := ctxT(t)
	const n = 200
	go func() {
		for i := range n {
			topic := []string{"fa", "fb"}[i%2]
			prod.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte(itoa(int32(i)))}, nil)
			if i%20 == 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	seen := map[string]bool{}
	for len(seen) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d", len(seen), n)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		for _, r := range fs.Records() {
			if seen[string(r.Value)] {
				t.Fatalf("record %s twice", r.Value)
			}
			seen[string(r.Value)] = true
		}
	}
	if sessions, parts, _ := ts.fetchSessions.stats(); sessions != 1 || parts != 8 {
		t.Fatalf("%d sessions of %d partitions, want 1 of 8", sessions, parts)
	}
}

// fetchBytes counts a client's Fetch requests and their bytes each way.
type fetchBytes struct{ reqs, wrote, read atomic.Int64 }

func (b *fetchBytes) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, n int, _, _ time.Duration, err error) {
	if key == 1 && err == nil {
		b.reqs.Add(1)
		b.wrote.Add(int64(n))
	}
}

func (b *fetchBytes) OnBrokerRead(_ kgo.BrokerMetadata, key int16, n int, _, _ time.Duration, err error) {
	if key == 1 && err == nil {
		b.read.Add(int64(n))
	}
}

// TestFetchSessionBytesPerPoll measures what one franz-go consumer of 10 000
// partitions (100 topics of 100) sends and receives per Fetch, with
// sessions off and on: at steady state without new data, and with records
// arriving on one partition. It takes a minute or more (creating, closing
// and removing 10 000 partitions), so it runs only when asked:
// SYNAPSE_MEASURE_FETCH_SESSIONS=1 go test -run TestFetchSessionBytesPerPoll -v ./broker/
func TestFetchSessionBytesPerPoll(t *testing.T) {
	if testing.Short() || os.Getenv("SYNAPSE_MEASURE_FETCH_SESSIONS") == "" {
		t.Skip("slow (10 000 partitions): set SYNAPSE_MEASURE_FETCH_SESSIONS=1")
	}
	const topics, parts = 100, 100
	type figures struct{ idleReq, idleResp, dataReq, dataResp float64 }
	dir := t.TempDir() // created by the first run, reopened by the second
	var names []string
	for i := range topics {
		names = append(names, "poll"+itoa(int32(i)))
	}
	measure := func(t *testing.T, slots int) figures {
		ts := startServerConfig(t, Config{DataDir: dir, AutoCreateTopics: true, FetchSessionCacheSlots: slots, Logger: zap.NewNop()})
		if ts.reg.get(names[0]) == nil {
			for _, name := range names {
				createTopic(t, ts, name, parts)
			}
		}
		prod, _ := client(t, ts.addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
		ctx := ctxT(t)
		for i := range 10 { // a few records spread around
			if err := prod.ProduceSync(ctx, &kgo.Record{Topic: names[i*7%topics], Partition: int32(i * 13 % parts), Value: []byte("x")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		var b fetchBytes
		cl, _ := client(t, ts.addr, kgo.ConsumeTopics(names...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxWait(100*time.Millisecond), kgo.WithHooks(&b))
		got := 0
		for got < 10 {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("consumed %d of 10", got)
			}
			got += fs.NumRecords()
		}
		window := func(polls int64, during func()) (float64, float64) {
			r0, w0, d0 := b.reqs.Load(), b.wrote.Load(), b.read.Load()
			for b.reqs.Load()-r0 < polls {
				if during != nil {
					during()
				} else {
					time.Sleep(20 * time.Millisecond)
				}
				if ctx.Err() != nil {
					t.Fatal(ctx.Err())
				}
			}
			n := float64(b.reqs.Load() - r0)
			return float64(b.wrote.Load()-w0) / n, float64(b.read.Load()-d0) / n
		}
		window(3, nil) // settle: the first polls after the records
		var f figures
		f.idleReq, f.idleResp = window(20, nil)
		// Records on one partition, one produce per poll or so (the
		// consumer takes them as they come).
		polled := func() {
			if err := prod.ProduceSync(ctx, &kgo.Record{Topic: names[0], Partition: 0, Value: []byte("y")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			cl.PollFetches(ctx)
		}
		polled()
		f.dataReq, f.dataResp = window(20, polled)
		return f
	}
	var off, on figures
	t.Run("off", func(t *testing.T) { off = measure(t, -1) })
	t.Run("on", func(t *testing.T) { on = measure(t, 0) })
	t.Logf("bytes per Fetch, 1 consumer of %d partitions (request / response):", topics*parts)
	t.Logf("  no new data:         sessions off %.0f / %.0f, on %.0f / %.0f", off.idleReq, off.idleResp, on.idleReq, on.idleResp)
	t.Logf("  data on 1 partition: sessions off %.0f / %.0f, on %.0f / %.0f", off.dataReq, off.dataResp, on.dataReq, on.dataResp)
	if on.idleReq*100 > off.idleReq || on.idleResp*100 > off.idleResp || on.dataReq*50 > off.dataReq || on.dataResp*50 > off.dataResp {
		t.Fatal("sessions do not cut the bytes per poll by 50x or more")
	}
}
