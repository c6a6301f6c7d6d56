package broker

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/auth"
)

// Authentication sits in the connection, before dispatch: TLS is
// negotiated as the connection starts (startTLS); on a SASL listener
// admit lets only ApiVersions, SaslHandshake and SaslAuthenticate through
// until the exchange succeeds, with frames capped at preAuthMaxFrame.

// preAuthMaxFrame caps requests before authentication (Kafka's
// sasl.server.max.receive.size).
const preAuthMaxFrame = 512 << 10

var (
	// tlsHandshakeTimeout bounds a TLS handshake (a client that never
	// finishes one holds nothing past it). A variable for tests.
	tlsHandshakeTimeout = 10 * time.Second
	// preAuthTimeout bounds how long a SASL connection may stay
	// unauthenticated (from accept, however many requests it sends) and how
	// long a re-authentication may take. A variable for tests.
	preAuthTimeout = 30 * time.Second
)

// errAuthClose closes a connection whose authentication failed or that
// sent a request before authenticating.
var errAuthClose = errors.New("authentication required")

func (c *conn) startTLS() error {
	tc := tls.Server(c.raw, c.lis.TLS)
	ctx, cancel := context.WithTimeout(c.s.ctx, tlsHandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		return err
	}
	c.nc = tc
	c.br.Reset(tc)
	if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 && !c.lis.usesSASL() {
		c.principal = auth.CertPrincipal(certs[0])
		c.s.sec.audit.Info("authenticated", zap.String("event", "authentication"), zap.String("mechanism", "TLS"),
			zap.String("principal", c.principal), zap.String("client", c.ip), zap.String("listener", c.lis.Name))
	}
	return nil
}

func (c *conn) readDeadline() time.Time {
	t := time.Now().Add(c.s.cfg.IdleTimeout)
	switch {
	case !c.authed:
		// One deadline from accept: ApiVersions every few seconds does not
		// keep an unauthenticated connection (and its slot) for ever.
		t = c.accepted.Add(preAuthTimeout)
	case c.session != nil:
		// A re-authentication under way may finish past the old
		// session's end, within its own bound.
		if r := time.Now().Add(preAuthTimeout); r.Before(t) {
			t = r
		}
	case !c.expires.IsZero() && c.expires.Before(t):
		// A session past its lifetime is closed, not left idle (KIP-368).
		t = c.expires
	}
	return t
}

func (c *conn) maxFrame() int {
	if !c.authed {
		return preAuthMaxFrame
	}
	return c.s.cfg.MaxFrameSize
}

// admit decides whether a request with key may be served now: before
// authentication only ApiVersions (18), SaslHandshake (17) and
// SaslAuthenticate (36); after a SASL session expired, only those too (a
// re-authentication). Anything else closes the connection, as Kafka does.
func (c *conn) admit(key int16) error {
	if key == 18 || key == 17 || key == 36 {
		return nil
	}
	if !c.authed {
		return fmt.Errorf("%w: %s before SASL authentication", errAuthClose, kmsg.NameForKey(key))
	}
	if c.session != nil {
		return fmt.Errorf("%w: %s during SASL re-authentication", errAuthClose, kmsg.NameForKey(key))
	}
	if !c.expires.IsZero() && time.Now().After(c.expires) {
		return fmt.Errorf("%w: SASL session expired (connections.max.reauth.ms)", errAuthClose)
	}
	return nil
}

// admitFrame is admit on a frame's api key, before the body is decoded:
// an unauthenticated client gets no decoding of anything but the keys it
// may send.
func (c *conn) admitFrame(frame []byte) error {
	if c.authed || len(frame) < 2 {
		return nil
	}
	return c.admit(int16(binary.BigEndian.Uint16(frame)))
}

// readToken reads a bare SASL token (a v0 exchange): a size, then that
// many bytes, at most preAuthMaxFrame; unlike a request it may be short
// or empty.
func (c *conn) readToken() ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(c.br, size[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(size[:]))
	if n > preAuthMaxFrame {
		return nil, fmt.Errorf("%w: SASL token of %d bytes", errAuthClose, n)
	}
	tok := make([]byte, n)
	_, err := io.ReadFull(c.br, tok)
	return tok, err
}

// SaslHandshake: v0-1
//
// Behavior:
//   - Only on SASL listeners (else ILLEGAL_SASL_STATE), for an enabled
//     mechanism (else UNSUPPORTED_SASL_MECHANISM); the enabled list is
//     always returned.
//   - v0: the exchange follows as bare SASL tokens; v1: in SaslAuthenticate.
//   - On an authenticated connection: a re-authentication (KIP-368), v1
//     only, with the same mechanism.
func (s *Server) handleSaslHandshake(c *conn, req *kmsg.SASLHandshakeRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.SASLHandshakeResponse)
	resp.SupportedMechanisms = s.sec.mechs
	// A refused handshake closes the connection after its answer, as in
	// Kafka: a client cannot keep an unauthenticated connection open by
	// asking again.
	switch {
	case !c.lis.usesSASL() || c.session != nil || (c.authed && (req.Version == 0 || req.Mechanism != c.mech)):
		resp.ErrorCode, c.closeAfter = kerr.IllegalSaslState.Code, !c.authed || c.session != nil
		return resp, nil
	case !slices.Contains(s.sec.mechs, req.Mechanism):
		resp.ErrorCode, c.closeAfter = kerr.UnsupportedSaslMechanism.Code, !c.authed
		return resp, nil
	}
	sess, err := s.newSASLSession(req.Mechanism)
	if err != nil {
		resp.ErrorCode, c.closeAfter = kerr.UnsupportedSaslMechanism.Code, !c.authed
		return resp, nil
	}
	c.session, c.mech, c.rawSASL = sess, req.Mechanism, req.Version == 0
	return resp, nil
}

func (s *Server) newSASLSession(mech string) (auth.Session, error) {
	switch mech {
	case auth.Plain:
		return auth.NewPlain(s.sec.users), nil
	case auth.ScramSHA256, auth.ScramSHA512:
		return auth.NewScram(s.sec.users, mech)
	case auth.OAuthBearer:
		return auth.NewOAuthBearer(s.cfg.OAuth), nil
	}
	return nil, fmt.Errorf("mechanism %q not served", mech)
}

// SaslAuthenticate: v0-2
//
// Behavior:
//   - Steps the exchange a v1 SaslHandshake started (else
//     ILLEGAL_SASL_STATE). A failure answers SASL_AUTHENTICATION_FAILED
//     with a generic message after FailedAuthDelay, then closes the
//     connection.
//   - v1+: the session lifetime (connections.max.reauth.ms, bounded by an
//     OAUTHBEARER token's expiry) is returned; 0 without one.
func (s *Server) handleSaslAuthenticate(c *conn, req *kmsg.SASLAuthenticateRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
	if c.session == nil || c.rawSASL {
		resp.ErrorCode = kerr.IllegalSaslState.Code
		resp.ErrorMessage = kmsg.StringPtr("SaslAuthenticate without a SaslHandshake v1 before it")
		c.closeAfter = true
		return resp, nil
	}
	reply, done, err := c.session.Step(req.SASLAuthBytes)
	resp.SASLAuthBytes = reply
	if err == nil && done {
		err = c.completeAuth()
	}
	if err != nil {
		c.failAuth(err)
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		resp.ErrorMessage = kmsg.StringPtr(authFailedMessage(err))
		return resp, nil
	}
	if done && !c.expires.IsZero() {
		resp.SessionLifetimeMillis = max(time.Until(c.expires).Milliseconds(), 1)
	}
	return resp, nil
}

// authFailedMessage is what a client is told: the generic message, with
// OAUTHBEARER's invalid_token kept (clients and tools look for it).
func authFailedMessage(err error) string {
	if strings.Contains(err.Error(), "invalid_token") {
		return "Authentication failed: invalid_token"
	}
	return "Authentication failed: invalid credentials"
}

// rawSASLToken steps a v0 exchange with one bare token and writes the bare
// reply. A failure closes the connection (v0 has no error field).
func (c *conn) rawSASLToken(tok []byte) error {
	reply, done, err := c.session.Step(tok)
	if err == nil && done {
		err = c.completeAuth()
	}
	if err != nil {
		c.failAuth(err)
		return err
	}
	c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.IdleTimeout))
	out := binary.BigEndian.AppendUint32(c.out[:0], uint32(len(reply)))
	out = append(out, reply...)
	c.out = out
	_, err = c.nc.Write(out)
	return err
}

// completeAuth makes a successful exchange the connection's identity. A
// re-authentication must keep the principal (as in Kafka).
func (c *conn) completeAuth() error {
	sess, mech := c.session, c.mech
	p := sess.Principal()
	if c.authed && p != c.principal {
		return fmt.Errorf("%w: re-authentication as another principal", auth.ErrAuthFailed)
	}
	c.session, c.rawSASL = nil, false
	c.principal, c.authed = p, true
	c.expires = time.Time{}
	if life := c.s.cfg.SASLSessionLifetime; life > 0 {
		c.expires = time.Now().Add(life)
		if exp := sess.Expiry(); !exp.IsZero() && exp.Before(c.expires) {
			c.expires = exp
		}
	}
	c.s.sec.authOK[mech].Add(1)
	c.s.sec.audit.Info("authenticated", zap.String("event", "authentication"), zap.String("mechanism", mech),
		zap.String("principal", p), zap.String("client", c.ip), zap.String("listener", c.lis.Name))
	return nil
}

// failAuth records a failed exchange and waits FailedAuthDelay before the
// answer (a password guesser gets few tries a second per connection); the
// connection closes after the answer.
func (c *conn) failAuth(err error) {
	c.s.sec.authFailed[c.mech].Add(1)
	c.s.sec.audit.Warn("authentication failed", zap.String("event", "authentication_failed"), zap.String("mechanism", c.mech),
		zap.String("client", c.ip), zap.String("listener", c.lis.Name), zap.String("reason", err.Error()))
	c.session, c.rawSASL, c.closeAfter = nil, false, true
	if d := c.s.cfg.FailedAuthDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.s.ctx.Done():
			t.Stop()
		}
	}
}
