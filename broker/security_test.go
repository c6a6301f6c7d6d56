package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap/zaptest"

	"github.com/synapsebroker/synapse/auth"
	"github.com/synapsebroker/synapse/internal/testcert"
	"github.com/synapsebroker/synapse/tiering"
)

// secureServer is a broker with the listeners asked for, each on its own
// loopback port, and a TLS certificate for 127.0.0.1 when one needs it.
type secureServer struct {
	*Server
	addrs map[string]string // protocol -> address
	ca    *x509.CertPool
}

const testAdminPassword = "admin-pw"

func startSecure(t *testing.T, cfg Config, protocols ...string) *secureServer {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	if cfg.SASLMechanisms == nil {
		cfg.SASLMechanisms = []string{auth.Plain, auth.ScramSHA256, auth.ScramSHA512}
	}
	if cfg.AdminPassword == "" {
		cfg.AdminPassword = testAdminPassword
	}
	cfg.AutoCreateTopics = true
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ss := &secureServer{Server: s, addrs: map[string]string{}}
	var tlsCfg *tls.Config
	for _, p := range protocols {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l := Listener{Name: p, Protocol: p}
		if p == SSL || p == SASLSSL {
			if tlsCfg == nil {
				cert := testcert.NewServer(t)
				tlsCfg, ss.ca = cert.TLS, cert.Pool
			}
			l.TLS = tlsCfg
		}
		ss.addrs[p] = ln.Addr().String()
		go s.ServeListener(ln, l)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return ss
}

// saslConn speaks non-flexible request versions on a bare connection.
type saslConn struct {
	t    *testing.T
	c    net.Conn
	corr int32
}

func dialSASL(t *testing.T, addr string) *saslConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &saslConn{t: t, c: c}
}

func (r *saslConn) send(req kmsg.Request) {
	r.t.Helper()
	r.corr++
	b := kmsg.NewRequestFormatter(kmsg.FormatterClientID("raw")).AppendRequest(nil, req, r.corr)
	r.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

// recv reads one response frame into resp; it returns an error if the
// connection closed instead.
func (r *saslConn) recv(resp kmsg.Response) error {
	r.t.Helper()
	body, err := r.frame()
	if err != nil {
		return err
	}
	if len(body) < 4 || int32(binary.BigEndian.Uint32(body)) != r.corr {
		r.t.Fatalf("response to correlation %d: %x", r.corr, body)
	}
	return resp.ReadFrom(body[4:])
}

func (r *saslConn) frame() ([]byte, error) {
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var size [4]byte
	if _, err := io.ReadFull(r.c, size[:]); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err := io.ReadFull(r.c, body)
	return body, err
}

// closed reports whether the broker closed the connection (EOF or reset
// within 5 s).
func (r *saslConn) closed() bool {
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := r.c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func handshake(mech string, v int16) *kmsg.SASLHandshakeRequest {
	h := kmsg.NewPtrSASLHandshakeRequest()
	h.Version, h.Mechanism = v, mech
	return h
}

func authenticate(b []byte) *kmsg.SASLAuthenticateRequest {
	a := kmsg.NewPtrSASLAuthenticateRequest()
	a.Version, a.SASLAuthBytes = 1, b
	return a
}

func metadataV1() *kmsg.MetadataRequest {
	m := kmsg.NewPtrMetadataRequest()
	m.Version = 1
	return m
}

// Before authentication a SASL listener answers ApiVersions and the SASL
// keys only; anything else closes the connection.
func TestSASLRequestBeforeAuthenticationCloses(t *testing.T) {
	ss := startSecure(t, Config{}, SASLPlaintext)
	r := dialSASL(t, ss.addrs[SASLPlaintext])
	av := kmsg.NewPtrApiVersionsRequest()
	r.send(av)
	if err := r.recv(kmsg.NewPtrApiVersionsResponse()); err != nil {
		t.Fatalf("ApiVersions before authentication: %v", err)
	}
	r.send(metadataV1())
	if !r.closed() {
		t.Fatal("Metadata before authentication was not refused by closing the connection")
	}
}

// Frames before authentication are capped at 512 KiB (the connection
// closes without reading, let alone allocating, the rest).
func TestSASLPreAuthFrameCap(t *testing.T) {
	ss := startSecure(t, Config{}, SASLPlaintext)
	r := dialSASL(t, ss.addrs[SASLPlaintext])
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], preAuthMaxFrame+1)
	r.c.Write(hdr[:])
	if !r.closed() {
		t.Fatal("a frame above 512 KiB before authentication was not refused")
	}
	// Once authenticated, the usual bound applies.
	r = dialSASL(t, ss.addrs[SASLPlaintext])
	plainLogin(t, r, "admin", testAdminPassword)
	binary.BigEndian.PutUint32(hdr[:], preAuthMaxFrame+1)
	r.c.Write(hdr[:])
	if r.closed() {
		t.Fatal("an authenticated connection was closed for a 512 KiB frame header")
	}
}

func plainLogin(t *testing.T, r *saslConn, user, pass string) *kmsg.SASLAuthenticateResponse {
	t.Helper()
	r.send(handshake(auth.Plain, 1))
	hr := kmsg.NewPtrSASLHandshakeResponse()
	if err := r.recv(hr); err != nil || hr.ErrorCode != 0 {
		t.Fatalf("SaslHandshake PLAIN: %v, code %d", err, hr.ErrorCode)
	}
	r.send(authenticate([]byte("\x00" + user + "\x00" + pass)))
	ar := kmsg.NewPtrSASLAuthenticateResponse()
	ar.Version = 1
	if err := r.recv(ar); err != nil {
		t.Fatalf("SaslAuthenticate: %v", err)
	}
	return ar
}

// Out-of-order and unknown-mechanism SASL requests get Kafka's codes.
func TestSASLStateErrors(t *testing.T) {
	ss := startSecure(t, Config{}, SASLPlaintext, Plaintext)
	r := dialSASL(t, ss.addrs[SASLPlaintext])
	r.send(authenticate([]byte("x")))
	ar := kmsg.NewPtrSASLAuthenticateResponse()
	ar.Version = 1
	if err := r.recv(ar); err != nil || ar.ErrorCode != kerr.IllegalSaslState.Code {
		t.Fatalf("SaslAuthenticate before SaslHandshake: %v, code %d, want ILLEGAL_SASL_STATE", err, ar.ErrorCode)
	}
	if !r.closed() {
		t.Fatal("connection left open after ILLEGAL_SASL_STATE")
	}
	r = dialSASL(t, ss.addrs[SASLPlaintext])
	r.send(handshake("GSSAPI", 1))
	hr := kmsg.NewPtrSASLHandshakeResponse()
	if err := r.recv(hr); err != nil || hr.ErrorCode != kerr.UnsupportedSaslMechanism.Code || len(hr.SupportedMechanisms) != 3 {
		t.Fatalf("unknown mechanism: %v, %+v", err, hr)
	}
	// SaslHandshake on a listener without SASL.
	r = dialSASL(t, ss.addrs[Plaintext])
	r.send(handshake(auth.Plain, 1))
	hr = kmsg.NewPtrSASLHandshakeResponse()
	if err := r.recv(hr); err != nil || hr.ErrorCode != kerr.IllegalSaslState.Code {
		t.Fatalf("SaslHandshake on PLAINTEXT: %v, code %d", err, hr.ErrorCode)
	}
}

// A failed authentication is answered SASL_AUTHENTICATION_FAILED with a
// generic message after the delay, counted, and the connection closed.
func TestSASLFailedAuthentication(t *testing.T) {
	ss := startSecure(t, Config{FailedAuthDelay: 200 * time.Millisecond}, SASLPlaintext)
	r := dialSASL(t, ss.addrs[SASLPlaintext])
	start := time.Now()
	ar := plainLogin(t, r, "admin", "wrong")
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("failed authentication answered after %s, want the 200 ms delay", took)
	}
	if ar.ErrorCode != kerr.SaslAuthenticationFailed.Code || ar.ErrorMessage == nil || strings.Contains(*ar.ErrorMessage, "admin") {
		t.Fatalf("wrong password: code %d, message %v", ar.ErrorCode, ar.ErrorMessage)
	}
	if !r.closed() {
		t.Fatal("connection left open after a failed authentication")
	}
	if n := ss.sec.authFailed[auth.Plain].Load(); n != 1 {
		t.Fatalf("failures counted: %d, want 1", n)
	}
	// A real client sees the error too.
	cl, err := kgo.NewClient(kgo.SeedBrokers(ss.addrs[SASLPlaintext]), kgo.SASL(scram.Auth{User: "admin", Pass: "nope"}.AsSha256Mechanism()), kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).ListTopics(ctxT(t)); !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Fatalf("kgo with a wrong SCRAM password: %v", err)
	}
}

// SaslHandshake v0 (kafka-python 2.0): the exchange follows as bare
// tokens, each answered with a bare token; a wrong password closes.
func TestSASLHandshakeV0BareTokens(t *testing.T) {
	ss := startSecure(t, Config{}, SASLPlaintext)
	for _, tc := range []struct {
		pass string
		ok   bool
	}{{testAdminPassword, true}, {"wrong", false}} {
		r := dialSASL(t, ss.addrs[SASLPlaintext])
		r.send(handshake(auth.Plain, 0))
		hr := kmsg.NewPtrSASLHandshakeResponse()
		if err := r.recv(hr); err != nil || hr.ErrorCode != 0 {
			t.Fatalf("SaslHandshake v0: %v %d", err, hr.ErrorCode)
		}
		tok := []byte("\x00admin\x00" + tc.pass)
		r.c.Write(binary.BigEndian.AppendUint32(nil, uint32(len(tok))))
		r.c.Write(tok)
		if !tc.ok {
			if !r.closed() {
				t.Fatal("a bad bare PLAIN token did not close the connection")
			}
			continue
		}
		reply, err := r.frame()
		if err != nil || len(reply) != 0 {
			t.Fatalf("bare token reply: %x %v, want an empty token", reply, err)
		}
		r.send(metadataV1())
		if err := r.recv(kmsg.NewPtrMetadataResponse()); err != nil {
			t.Fatalf("Metadata after a v0 login: %v", err)
		}
	}
}

// KIP-368: the session lifetime is reported; a connection that outlives
// it without re-authenticating is closed; franz-go re-authenticates and
// keeps working.
func TestSASLSessionLifetime(t *testing.T) {
	ss := startSecure(t, Config{SASLSessionLifetime: 500 * time.Millisecond}, SASLPlaintext)
	r := dialSASL(t, ss.addrs[SASLPlaintext])
	ar := plainLogin(t, r, "admin", testAdminPassword)
	if ar.ErrorCode != 0 || ar.SessionLifetimeMillis <= 0 || ar.SessionLifetimeMillis > 500 {
		t.Fatalf("SaslAuthenticate v1: code %d, session lifetime %d ms, want (0, 500]", ar.ErrorCode, ar.SessionLifetimeMillis)
	}
	time.Sleep(700 * time.Millisecond)
	if !r.closed() {
		t.Fatal("connection open past its session lifetime")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(ss.addrs[SASLPlaintext]), kgo.SASL(plain.Auth{User: "admin", Pass: testAdminPassword}.AsMechanism()),
		kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 4 {
		if err := cl.ProduceSync(ctxT(t), &kgo.Record{Topic: "reauth", Value: []byte{byte(i)}}).FirstErr(); err != nil {
			t.Fatalf("produce %d across re-authentications: %v", i, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if n := ss.sec.authOK[auth.Plain].Load(); n < 3 {
		t.Fatalf("authentications: %d, want re-authentications beyond the first", n)
	}
}

// A TLS listener closes a connection whose handshake does not finish in
// time, and one that speaks plaintext Kafka.
func TestTLSHandshakeTimeoutAndPlaintext(t *testing.T) {
	old := tlsHandshakeTimeout
	tlsHandshakeTimeout = 300 * time.Millisecond
	defer func() { tlsHandshakeTimeout = old }()
	ss := startSecure(t, Config{}, SSL)
	r := dialSASL(t, ss.addrs[SSL])
	if !r.closed() {
		t.Fatal("a connection that never starts TLS stayed open")
	}
	r = dialSASL(t, ss.addrs[SSL])
	r.send(kmsg.NewPtrApiVersionsRequest())
	if !r.closed() {
		t.Fatal("plaintext Kafka on a TLS port was not refused")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(ss.addrs[SSL]), kgo.DialTLSConfig(&tls.Config{RootCAs: ss.ca, ServerName: "127.0.0.1"}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).ListTopics(ctxT(t)); err != nil {
		t.Fatalf("TLS client: %v", err)
	}
}

// Metadata names each listener's own advertised endpoint.
func TestMetadataPerListener(t *testing.T) {
	s, err := New(Config{DataDir: t.TempDir(), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, adv := range []string{"public.example:9093", "internal.example:9092"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go s.ServeListener(ln, Listener{Name: Plaintext, Protocol: Plaintext, Advertised: adv})
		r := dialSASL(t, ln.Addr().String())
		r.send(metadataV1())
		mr := kmsg.NewPtrMetadataResponse()
		mr.Version = 1
		if err := r.recv(mr); err != nil || len(mr.Brokers) != 1 {
			t.Fatalf("Metadata: %v %+v", err, mr.Brokers)
		}
		if got := mr.Brokers[0].Host + ":" + itoa(mr.Brokers[0].Port); got != adv {
			t.Errorf("listener advertising %s: Metadata says %s", adv, got)
		}
	}
}

func itoa(p int32) string { return big.NewInt(int64(p)).String() }

// Users and ACLs are durable, in files only the broker's user reads, and
// come back from the bucket into an empty data directory.
func TestUsersAndACLsDurableAndRestored(t *testing.T) {
	store := tiering.NewMemStore()
	dir := t.TempDir()
	cfg := Config{DataDir: dir, Authorize: true, Tier: tiering.New(store, nil, 8<<20), MaintenanceInterval: 50 * time.Millisecond}
	ss := startSecure(t, cfg, SASLPlaintext)
	adm := adminClient(t, ss.addrs[SASLPlaintext])
	ctx := ctxT(t)
	if _, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: "dora", Mechanism: kadm.ScramSha256, Iterations: 4096, Password: "dora-pw"}}); err != nil {
		t.Fatal(err)
	}
	acl := kadm.NewACLs().Allow("User:dora").Topics("t").Operations(kadm.OpRead).ResourcePatternType(kadm.ACLPatternLiteral)
	if _, err := adm.CreateACLs(ctx, acl); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{usersFile, aclsFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v, want 0600", f, err, fi.Mode())
		}
	}
	waitUntil(t, 10*time.Second, func() bool {
		_, e1 := store.GetRange(ctx, usersKey, 0, -1)
		_, e2 := store.GetRange(ctx, aclsKey, 0, -1)
		return e1 == nil && e2 == nil
	})
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ss.Shutdown(sctx)
	cancel()
	// A new, empty data directory on the same bucket.
	cfg.DataDir, cfg.Tier = t.TempDir(), tiering.New(store, nil, 8<<20)
	cfg.AdminPassword = "another"
	ss = startSecure(t, cfg, SASLPlaintext)
	if got := ss.sec.users.Describe([]string{"dora"})["dora"]; len(got) != 1 {
		t.Fatalf("restored user dora: %+v", got)
	}
	if n := ss.sec.acls.Len(); n != 1 {
		t.Fatalf("restored ACLs: %d, want 1", n)
	}
	if !ss.sec.users.CheckPlain("admin", testAdminPassword) {
		t.Fatal("the restored admin lost its password (or the new admin password replaced it)")
	}
}

func adminClient(t *testing.T, addr string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.SASL(scram.Auth{User: "admin", Pass: testAdminPassword}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// Authorizing a fetch costs no allocation per partition: a fetch of 64
// partitions allocates as much with ACLs on (allowed by a prefixed ACL) as
// without an authorizer (within the race detector's pool noise).
func TestAuthorizationAllocatesNothingPerPartition(t *testing.T) {
	ss := startSecure(t, Config{Authorize: true}, SASLPlaintext)
	if _, err := ss.reg.create("alloc-topic", 64, nil, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ss.sec.acls.Create([]auth.ACL{{ResourceType: resTopic, ResourceName: "alloc-", PatternType: kmsg.ACLResourcePatternTypePrefixed,
		Principal: "User:eve", Host: "*", Operation: opRead, Permission: kmsg.ACLPermissionTypeAllow}}); err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrFetchRequest()
	req.Version = 12
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = "alloc-topic"
	for i := range int32(64) {
		p := kmsg.NewFetchRequestTopicPartition()
		p.Partition, p.PartitionMaxBytes = i, 1<<20
		rt.Partitions = append(rt.Partitions, p)
	}
	req.Topics = append(req.Topics, rt)
	lis := &listener{Listener: Listener{Name: SASLPlaintext, Protocol: SASLPlaintext}, host: "127.0.0.1", port: 1}
	c := &conn{s: ss.Server, lis: lis, principal: "User:eve", ip: "127.0.0.1", authed: true}
	measure := func() float64 {
		return testing.AllocsPerRun(50, func() {
			resp, _, _, _ := ss.fetchOnce(c, req)
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if p.ErrorCode != 0 {
						panic(kerr.ErrorForCode(p.ErrorCode))
					}
				}
			}
			resp.release()
		})
	}
	with := measure()
	authz := ss.sec.authz
	ss.sec.authz = nil
	without := measure()
	ss.sec.authz = authz
	// sync.Pool drops items at random under the race detector, so counts
	// wobble by one or two; an allocation per partition would be 64 more.
	if with > without+2 {
		t.Fatalf("a 64-partition fetch allocates %.0f times with ACLs, %.0f without", with, without)
	}
}

// The pre-authentication deadline runs from accept: requests do not extend
// it, and a refused handshake closes the connection.
func TestSASLPreAuthDeadlineFromAccept(t *testing.T) {
	old := preAuthTimeout
	preAuthTimeout = 400 * time.Millisecond
	defer func() { preAuthTimeout = old }()
	ss := startSecure(t, Config{}, SASLPlaintext)
	r := dialSASL(t, ss.addrs[SASLPlaintext])
	start := time.Now()
	for time.Since(start) < 2*time.Second {
		r.send(kmsg.NewPtrApiVersionsRequest())
		if err := r.recv(kmsg.NewPtrApiVersionsResponse()); err != nil {
			break // closed: as wanted
		}
		time.Sleep(100 * time.Millisecond)
	}
	if took := time.Since(start); took >= 2*time.Second {
		t.Fatalf("an unauthenticated connection sending ApiVersions stayed open %s", took)
	}
	r = dialSASL(t, ss.addrs[SASLPlaintext])
	r.send(handshake("GSSAPI", 1))
	if err := r.recv(kmsg.NewPtrSASLHandshakeResponse()); err != nil {
		t.Fatal(err)
	}
	if !r.closed() {
		t.Fatal("a refused SaslHandshake left the connection open")
	}
}

// A bare v0 token may be shorter than a request (PLAIN "\x00u\x00pw").
func TestSASLShortBareToken(t *testing.T) {
	ss := startSecure(t, Config{}, SASLPlaintext)
	if err := ss.sec.users.SetPassword("u", auth.ScramSHA256, "pw", 4096); err != nil {
		t.Fatal(err)
	}
	r := dialSASL(t, ss.addrs[SASLPlaintext])
	r.send(handshake(auth.Plain, 0))
	if err := r.recv(kmsg.NewPtrSASLHandshakeResponse()); err != nil {
		t.Fatal(err)
	}
	tok := []byte("\x00u\x00pw")
	r.c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(tok))), tok...))
	if reply, err := r.frame(); err != nil || len(reply) != 0 {
		t.Fatalf("5-byte bare token: %x %v", reply, err)
	}
}
