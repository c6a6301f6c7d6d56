package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// clientSecurity are the TLS and SASL flags of the bench clients. Unset,
// clients connect in plaintext without SASL.
type clientSecurity struct {
	caFile     string
	serverName string
	mechanism  string
	user       string
	password   string

	once   sync.Once
	tlsCfg *tls.Config
	err    error
}

func (s *clientSecurity) addFlags(fs *pflag.FlagSet, mechanism string) {
	fs.StringVar(&s.caFile, "tls-ca-file", "", "PEM CA to verify the broker's certificate with (enables TLS)")
	fs.StringVar(&s.serverName, "tls-server-name", "", "name to verify the broker's certificate for (default: the host dialed)")
	fs.StringVar(&s.mechanism, "sasl-mechanism", mechanism, "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: no SASL)")
	fs.StringVar(&s.user, "sasl-user", "admin", "SASL user")
	fs.StringVar(&s.password, "sasl-password", "", "SASL password (default: $SYNAPSE_ADMIN_PASSWORD)")
}

// tlsConfig is nil without --tls-ca-file.
func (s *clientSecurity) tlsConfig() (*tls.Config, error) {
	s.once.Do(func() {
		if s.caFile == "" {
			return
		}
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			s.err = err
			return
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			s.err = fmt.Errorf("--tls-ca-file %s: no PEM certificate", s.caFile)
			return
		}
		s.tlsCfg = &tls.Config{RootCAs: pool, ServerName: s.serverName, MinVersion: tls.VersionTLS12}
	})
	return s.tlsCfg, s.err
}

func (s *clientSecurity) pass() string {
	if s.password != "" {
		return s.password
	}
	return os.Getenv("SYNAPSE_ADMIN_PASSWORD")
}

// saslMechanism is nil without --sasl-mechanism. cached: SCRAM keeps the
// keys it derives from the password per salt and iteration count, as a
// long-lived client would, instead of running PBKDF2 on every connection
// as franz-go's does.
func (s *clientSecurity) saslMechanism(cached bool) (sasl.Mechanism, error) {
	if s.mechanism == "" {
		return nil, nil
	}
	pass := s.pass()
	if s.user == "" || pass == "" {
		return nil, errors.New("--sasl-mechanism needs --sasl-user and --sasl-password (or SYNAPSE_ADMIN_PASSWORD)")
	}
	switch strings.ToUpper(s.mechanism) {
	case "PLAIN":
		return plain.Auth{User: s.user, Pass: pass}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		if cached {
			return newCachedScram("SCRAM-SHA-256", sha256.New, s.user, pass), nil
		}
		return scram.Auth{User: s.user, Pass: pass}.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		if cached {
			return newCachedScram("SCRAM-SHA-512", sha512.New, s.user, pass), nil
		}
		return scram.Auth{User: s.user, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("--sasl-mechanism %q: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.mechanism)
}

// kgoOpts dial TLS and authenticate as the flags say (franz-go's own SASL
// mechanisms: a client authenticates once per connection).
func (s *clientSecurity) kgoOpts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	cfg, err := s.tlsConfig()
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	m, err := s.saslMechanism(false)
	if err != nil {
		return nil, err
	}
	if m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// `synapse bench auth`: new connections, each authenticated with SASL
// (ApiVersions, SaslHandshake v1, SaslAuthenticate v1 steps, on a raw
// connection with kmsg), then closed, from --concurrency dialers, as fast
// as possible or at --rate, for --duration. Reports the completed
// authentications per second and their latency from dial to the last
// SaslAuthenticate response.

type authBenchOptions struct {
	brokers     string
	sec         clientSecurity
	duration    time.Duration
	concurrency int
	rate        float64
	apiVersions bool
	keyCache    bool
	timeout     time.Duration
	jsonOut     bool
	progress    time.Duration
}

type authResult struct {
	Workload    string             `json:"workload"`
	Mechanism   string             `json:"mechanism"`
	TLS         bool               `json:"tls"`
	Concurrency int                `json:"concurrency"`
	TargetRate  float64            `json:"target_rate"`
	Auths       int64              `json:"auths"`
	Failures    int64              `json:"failures"`
	Seconds     float64            `json:"seconds"`
	AuthsPerSec float64            `json:"auths_per_sec"`
	LatencyMs   map[string]float64 `json:"latency_ms,omitempty"`
	Errors      int64              `json:"errors"` // = Failures
}

func (r *authResult) print(w io.Writer, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(r)
	}
	fmt.Fprintf(w, "auth %s: %d connections authenticated in %.2f s: %.0f auths/s, %d failures (%d dialers", r.Mechanism, r.Auths, r.Seconds, r.AuthsPerSec, r.Failures, r.Concurrency)
	if r.TargetRate > 0 {
		fmt.Fprintf(w, ", target %.0f/s", r.TargetRate)
	}
	fmt.Fprintln(w, ")")
	if r.LatencyMs != nil {
		fmt.Fprintf(w, "latency ms (dial to authenticated): p50 %.3f  p90 %.3f  p99 %.3f  p999 %.3f  max %.3f\n",
			r.LatencyMs["p50"], r.LatencyMs["p90"], r.LatencyMs["p99"], r.LatencyMs["p999"], r.LatencyMs["max"])
	}
	if r.Auths == 0 {
		return errors.New("no connection authenticated")
	}
	return nil
}

func runAuth(ctx context.Context, o *authBenchOptions, stderr io.Writer) (*authResult, error) {
	if o.sec.mechanism == "" {
		return nil, errors.New("--sasl-mechanism is required")
	}
	mech, err := o.sec.saslMechanism(o.keyCache)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := o.sec.tlsConfig()
	if err != nil {
		return nil, err
	}
	seeds := strings.Split(o.brokers, ",")
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var h latencyHist
	var ok, failed, ticket atomic.Int64
	var firstErr atomic.Pointer[error]
	stop := make(chan struct{})
	go progressLine(stderr, o.progress, "auth", &ok, stop)
	var interval time.Duration
	if o.rate > 0 {
		interval = time.Duration(float64(time.Second) / o.rate)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < max(o.concurrency, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, 512)
			for ctx.Err() == nil {
				n := ticket.Add(1)
				if interval > 0 {
					// A shared schedule: the n-th connection starts at
					// start + n*interval (late ones at once).
					if d := time.Until(start.Add(time.Duration(n) * interval)); d > 0 {
						select {
						case <-time.After(d):
						case <-ctx.Done():
							return
						}
					}
				}
				t0 := time.Now()
				var err error
				buf, err = authOnce(ctx, seeds[int(n)%len(seeds)], tlsCfg, mech, o.apiVersions, o.timeout, buf)
				if err != nil {
					if failed.Add(1) == 1 {
						firstErr.Store(&err)
					}
					continue
				}
				h.add(time.Since(t0))
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	r := &authResult{Workload: "auth", Mechanism: mech.Name(), TLS: tlsCfg != nil, Concurrency: max(o.concurrency, 1), TargetRate: o.rate,
		Auths: ok.Load(), Failures: failed.Load(), Errors: failed.Load(), Seconds: elapsed.Seconds()}
	if r.Seconds > 0 {
		r.AuthsPerSec = float64(r.Auths) / r.Seconds
	}
	r.LatencyMs = h.quantilesMs()
	if e := firstErr.Load(); e != nil {
		fmt.Fprintf(stderr, "first auth failure: %v\n", *e)
	}
	return r, nil
}

// authOnce dials addr, authenticates and closes the connection.
func authOnce(ctx context.Context, addr string, tlsCfg *tls.Config, mech sasl.Mechanism, apiVersions bool, timeout time.Duration, buf []byte) ([]byte, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return buf, err
	}
	// Bounded by timeout alone: one in flight when the run ends finishes.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	var nc net.Conn
	if tlsCfg != nil {
		cfg := tlsCfg
		if cfg.ServerName == "" {
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		nc, err = (&tls.Dialer{Config: cfg}).DialContext(dctx, "tcp", addr)
	} else {
		nc, err = (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	}
	if err != nil {
		return buf, fmt.Errorf("dial: %w", err)
	}
	defer nc.Close()
	deadline, _ := dctx.Deadline()
	nc.SetDeadline(deadline)
	c := &authConn{nc: nc, br: bufio.NewReaderSize(nc, 4096), buf: buf}
	if apiVersions {
		req := kmsg.NewPtrApiVersionsRequest()
		req.Version = 3
		req.ClientSoftwareName, req.ClientSoftwareVersion = "synapse-bench", "1"
		resp := req.ResponseKind().(*kmsg.ApiVersionsResponse)
		if err := c.roundTrip(req, resp); err != nil {
			return c.buf, fmt.Errorf("ApiVersions: %w", err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return c.buf, fmt.Errorf("ApiVersions: %w", err)
		}
	}
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.Version, hs.Mechanism = 1, mech.Name()
	hsResp := hs.ResponseKind().(*kmsg.SASLHandshakeResponse)
	if err := c.roundTrip(hs, hsResp); err != nil {
		return c.buf, fmt.Errorf("SaslHandshake: %w", err)
	}
	if err := kerr.ErrorForCode(hsResp.ErrorCode); err != nil {
		return c.buf, fmt.Errorf("SaslHandshake %s: %w (broker offers %v)", mech.Name(), err, hsResp.SupportedMechanisms)
	}
	session, msg, err := mech.Authenticate(dctx, addr)
	if err != nil {
		return c.buf, err
	}
	for step := 0; ; step++ {
		if step > 10 {
			return c.buf, errors.New("SASL exchange did not end within 10 steps")
		}
		req := kmsg.NewPtrSASLAuthenticateRequest()
		req.Version, req.SASLAuthBytes = 1, msg
		resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
		if err := c.roundTrip(req, resp); err != nil {
			return c.buf, fmt.Errorf("SaslAuthenticate: %w", err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			if resp.ErrorMessage != nil {
				err = fmt.Errorf("%w: %s", err, *resp.ErrorMessage)
			}
			return c.buf, fmt.Errorf("SaslAuthenticate: %w", err)
		}
		done, next, err := session.Challenge(resp.SASLAuthBytes)
		if err != nil {
			return c.buf, err
		}
		if done {
			if len(next) > 0 { // a last message, not answered (none of PLAIN and SCRAM has one)
				req.SASLAuthBytes = next
				c.corr++
				c.buf = (&kmsg.RequestFormatter{}).AppendRequest(c.buf[:0], req, c.corr)
				_, err = nc.Write(c.buf)
			}
			return c.buf, err
		}
		msg = next
	}
}

// authConn sends requests and reads responses on one connection.
type authConn struct {
	nc   net.Conn
	br   *bufio.Reader
	buf  []byte
	corr int32
}

// roundTrip writes req and reads its response into resp (request header
// v1 and response header v0: ApiVersions and SaslHandshake and
// SaslAuthenticate v1 are not flexible, or ApiVersions' response header is
// not even when it is).
func (c *authConn) roundTrip(req kmsg.Request, resp kmsg.Response) error {
	c.corr++
	var f kmsg.RequestFormatter
	c.buf = f.AppendRequest(c.buf[:0], req, c.corr)
	if _, err := c.nc.Write(c.buf); err != nil {
		return err
	}
	var hdr [8]byte
	if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
		return err
	}
	size := int(binary.BigEndian.Uint32(hdr[:4]))
	if size < 4 || size > 1<<20 {
		return fmt.Errorf("response of %d bytes", size)
	}
	if corr := int32(binary.BigEndian.Uint32(hdr[4:])); corr != c.corr {
		return fmt.Errorf("response to correlation id %d, want %d", corr, c.corr)
	}
	body := make([]byte, size-4)
	if _, err := io.ReadFull(c.br, body); err != nil {
		return err
	}
	resp.SetVersion(req.GetVersion())
	return resp.ReadFrom(body)
}

// cachedScram is SCRAM (RFC 5802) as franz-go's pkg/sasl/scram does it,
// but it derives the salted password once per salt and iteration count:
// a benchmark client that ran PBKDF2 (4096 iterations) on every connection
// would measure its own CPU, not the broker's.
type cachedScram struct {
	name       string
	newHash    func() hash.Hash
	user, pass string
	mu         sync.Mutex
	keys       map[string][]byte // salt + "," + iterations → SaltedPassword
}

func newCachedScram(name string, h func() hash.Hash, user, pass string) *cachedScram {
	return &cachedScram{name: name, newHash: h, user: user, pass: pass, keys: map[string][]byte{}}
}

func (s *cachedScram) Name() string { return s.name }

func (s *cachedScram) Authenticate(context.Context, string) (sasl.Session, []byte, error) {
	nonce := make([]byte, 20)
	rand.Read(nonce)
	bare := "n=" + strings.NewReplacer("=", "=3D", ",", "=2C").Replace(s.user) + ",r=" + base64.RawStdEncoding.EncodeToString(nonce)
	return &cachedScramSession{m: s, bare: bare, nonce: bare[strings.LastIndex(bare, "r=")+2:]}, []byte("n,," + bare), nil
}

func (s *cachedScram) salted(salt []byte, iters int) ([]byte, error) {
	key := string(salt) + "," + strconv.Itoa(iters)
	s.mu.Lock()
	sp, ok := s.keys[key]
	s.mu.Unlock()
	if ok {
		return sp, nil
	}
	sp, err := pbkdf2.Key(s.newHash, s.pass, salt, iters, s.newHash().Size())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.keys[key] = sp
	s.mu.Unlock()
	return sp, nil
}

type cachedScramSession struct {
	m           *cachedScram
	bare, nonce string
	step        int
	serverSig   []byte
}

func (s *cachedScramSession) mac(key []byte, parts ...string) []byte {
	mac := hmac.New(s.m.newHash, key)
	for _, p := range parts {
		mac.Write([]byte(p))
	}
	return mac.Sum(nil)
}

func (s *cachedScramSession) Challenge(in []byte) (bool, []byte, error) {
	s.step++
	switch s.step {
	case 1: // server-first: r=nonce,s=salt,i=iterations
		kvs := strings.Split(string(in), ",")
		if len(kvs) < 3 || !strings.HasPrefix(kvs[0], "r="+s.nonce) || !strings.HasPrefix(kvs[1], "s=") || !strings.HasPrefix(kvs[2], "i=") {
			return false, nil, fmt.Errorf("malformed server-first message %q", in)
		}
		salt, err := base64.StdEncoding.DecodeString(kvs[1][2:])
		if err != nil {
			return false, nil, fmt.Errorf("server salt: %w", err)
		}
		iters, err := strconv.Atoi(kvs[2][2:])
		if err != nil || iters < 4096 || iters > 1<<20 {
			return false, nil, fmt.Errorf("server iterations %q", kvs[2][2:])
		}
		sp, err := s.m.salted(salt, iters)
		if err != nil {
			return false, nil, err
		}
		clientKey := s.mac(sp, "Client Key")
		h := s.m.newHash()
		h.Write(clientKey)
		storedKey := h.Sum(nil)
		withoutProof := "c=biws,r=" + kvs[0][2:] // biws: base64 of the gs2 header "n,,"
		authMsg := s.bare + "," + string(in) + "," + withoutProof
		proof := s.mac(storedKey, authMsg)
		for i := range proof {
			proof[i] ^= clientKey[i]
		}
		s.serverSig = []byte(base64.StdEncoding.EncodeToString(s.mac(s.mac(sp, "Server Key"), authMsg)))
		return false, []byte(withoutProof + ",p=" + base64.StdEncoding.EncodeToString(proof)), nil
	case 2: // server-final: v=signature or e=error
		v, _, _ := bytes.Cut(in, []byte(","))
		if e, ok := bytes.CutPrefix(v, []byte("e=")); ok {
			return false, nil, fmt.Errorf("server sent authentication error %q", e)
		}
		if sig, ok := bytes.CutPrefix(v, []byte("v=")); !ok || !hmac.Equal(sig, s.serverSig) {
			return false, nil, errors.New("server signature mismatch")
		}
		return true, nil, nil
	}
	return false, nil, errors.New("SCRAM exchange already over")
}

func newBenchAuthCommand() *cobra.Command {
	o := &authBenchOptions{}
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Open new connections that each authenticate with SASL; report authentications per second and their latency",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.duration <= 0 || o.timeout <= 0 {
				return errors.New("--duration and --timeout must be positive: every run is bounded in time")
			}
			ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			r, err := runAuth(ctx, o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return r.print(cmd.OutOrStdout(), o.jsonOut)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.brokers, "brokers", "127.0.0.1:9092", "SASL listeners to dial, comma separated (in turn)")
	o.sec.addFlags(fs, "SCRAM-SHA-256")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "stop after this long (or at SIGINT, reporting what was done)")
	fs.IntVar(&o.concurrency, "concurrency", 16, "connections in flight at once")
	fs.Float64Var(&o.rate, "rate", 0, "new connections per second across all dialers (0: as fast as possible)")
	fs.BoolVar(&o.apiVersions, "api-versions", true, "send ApiVersions first, as clients do")
	fs.BoolVar(&o.keyCache, "scram-key-cache", true, "derive SCRAM's salted password once, not per connection (false: franz-go's SCRAM, PBKDF2 on every connection, as most clients)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "bound on one connection's dial and authentication")
	fs.BoolVar(&o.jsonOut, "json", false, "print the result as one JSON object")
	fs.DurationVar(&o.progress, "progress", time.Second, "progress line interval on stderr (0: none)")
	return cmd
}
