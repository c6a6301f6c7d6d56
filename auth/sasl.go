package auth

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/xdg-go/scram"
)

// Session is one authentication exchange on a connection.
type Session interface {
	// Step consumes the client's next message and returns the server's
	// reply. done reports success (Principal is set). A non-nil err is a
	// failed authentication: the message of err is safe to send to the
	// client (generic, nothing secret). reply may be non-nil with err
	// (OAUTHBEARER's error JSON). After a failure, or once done, every Step
	// fails.
	Step(in []byte) (reply []byte, done bool, err error)
	// Principal is "User:<name>" once done.
	Principal() string
	// Expiry is when the credential stops being valid (an OAUTHBEARER
	// token's exp); zero if none.
	Expiry() time.Time
}

// ErrAuthFailed is the generic authentication failure; the errors of Step
// wrap it, with safe detail only.
var ErrAuthFailed = errors.New("authentication failed")

// MaxSASLMessage is the largest client message Step accepts.
const MaxSASLMessage = 64 << 10

// maxScramNonce is the longest client nonce a SCRAM client-first may carry.
const maxScramNonce = 1 << 10

// Mechanisms this package serves (with ScramSHA256 and ScramSHA512).
const (
	Plain       = "PLAIN"
	OAuthBearer = "OAUTHBEARER"
)

func authFailed(detail string) error { return fmt.Errorf("%w: %s", ErrAuthFailed, detail) }

var (
	errTooLarge      = authFailed("SASL message too large")
	errExchangeOver  = authFailed("the SASL exchange is over")
	errInvalidCreds  = authFailed("invalid credentials")
	errZidMismatch   = authFailed("the authorization id must be empty or equal the user name")
	errPlainMalform  = authFailed("malformed PLAIN message")
	errScramMalform  = authFailed("malformed SCRAM message")
	errOAuthMalform  = authFailed("malformed OAUTHBEARER message")
	errNoOAuth       = authFailed("OAUTHBEARER is not configured")
	invalidTokenJSON = []byte(`{"status":"invalid_token"}`)
)

// sessionState is where an exchange is.
type sessionState uint8

const (
	stateStart sessionState = iota
	stateMid                // SCRAM: after client-first
	stateDone
	stateFailed
)

///////////
// PLAIN //
///////////

type plainSession struct {
	u         *Users
	state     sessionState
	principal string
}

// NewPlain serves PLAIN (RFC 4616): one message "authzid\x00authcid\x00passwd",
// authzid empty or equal to authcid, the password checked by
// Users.CheckPlain.
func NewPlain(u *Users) Session { return &plainSession{u: u} }

func (s *plainSession) Step(in []byte) ([]byte, bool, error) {
	if s.state != stateStart {
		s.state = stateFailed
		return nil, false, errExchangeOver
	}
	s.state = stateFailed
	if len(in) > MaxSASLMessage {
		return nil, false, errTooLarge
	}
	parts := bytes.Split(in, []byte{0})
	if len(parts) != 3 {
		return nil, false, errPlainMalform
	}
	zid, user, pass := string(parts[0]), string(parts[1]), string(parts[2])
	if user == "" || pass == "" || !utf8.ValidString(zid) || !utf8.ValidString(user) || !utf8.ValidString(pass) {
		return nil, false, errPlainMalform
	}
	if zid != "" && zid != user {
		return nil, false, errZidMismatch
	}
	if !s.u.CheckPlain(user, pass) {
		return nil, false, errInvalidCreds
	}
	s.state, s.principal = stateDone, "User:"+user
	return nil, true, nil
}

func (s *plainSession) Principal() string { return s.principal }
func (s *plainSession) Expiry() time.Time { return time.Time{} }

///////////
// SCRAM //
///////////

type scramSession struct {
	conv      *scram.ServerConversation
	state     sessionState
	principal string
	compat    scramTranscript // for old librdkafka's client-final (scram_compat.go)
}

// NewScram serves SCRAM-SHA-256 or SCRAM-SHA-512 (RFC 5802, 7677) with
// xdg-go/scram's server over u's credentials: two client messages
// (client-first, client-final), done after the second, whose reply is the
// server-final message. No channel binding (gs2 flag "n" or "y"), no
// authzid other than the user name, no extensions but an ignored
// "tokenauth=false" (Kafka's delegation tokens are not served). A user
// without a credential for the mechanism gets a stand-in one and fails at
// the client-final message, as a wrong password does.
func NewScram(u *Users, mechanism string) (Session, error) {
	hg, _, ok := scramHash(mechanism)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedMechanism, mechanism)
	}
	if u == nil {
		u = &Users{}
	}
	lookup := func(user string) scram.StoredCredentials {
		if c, ok := u.Lookup(user, mechanism); ok {
			return c
		}
		return u.standIn(user, mechanism)
	}
	srv, err := hg.NewServer(func(user string) (scram.StoredCredentials, error) { return lookup(user), nil })
	if err != nil {
		return nil, err
	}
	return &scramSession{conv: srv.NewConversation(), compat: scramTranscript{hash: hg, cred: lookup}}, nil
}

func (s *scramSession) Step(in []byte) ([]byte, bool, error) {
	state := s.state
	s.state = stateFailed
	if len(in) > MaxSASLMessage {
		return nil, false, errTooLarge
	}
	switch state {
	case stateStart:
		if err := checkScramClientFirst(in); err != nil {
			return nil, false, err
		}
		reply, err := s.conv.Step(string(in))
		if err != nil {
			return nil, false, errScramMalform
		}
		if z := s.conv.AuthzID(); z != "" && z != s.conv.Username() {
			return nil, false, errZidMismatch
		}
		s.state = stateMid
		s.compat.clientFirst, s.compat.serverFirst = string(in), reply
		return []byte(reply), false, nil
	case stateMid:
		reply, err := s.conv.Step(string(in))
		if err != nil || !s.conv.Valid() {
			if reply == scram.ErrInvalidProof {
				return nil, false, errInvalidCreds
			}
			if compat, ok := s.compat.compatFinal(s.conv.Username(), string(in)); ok {
				s.state, s.principal = stateDone, "User:"+s.conv.Username()
				return []byte(compat), true, nil
			}
			return nil, false, errScramMalform
		}
		s.state, s.principal = stateDone, "User:"+s.conv.Username()
		return []byte(reply), true, nil
	}
	return nil, false, errExchangeOver
}

func (s *scramSession) Principal() string { return s.principal }
func (s *scramSession) Expiry() time.Time { return time.Time{} }

// checkScramClientFirst checks what xdg-go/scram leaves to its caller in a
// client-first message (RFC 5802 §7):
//
//	gs2-cbind-flag "," [ "a=" saslname ] "," "n=" saslname "," "r=" nonce *("," ext)
func checkScramClientFirst(in []byte) error {
	if !utf8.Valid(in) {
		return errScramMalform
	}
	fields := strings.Split(string(in), ",")
	if len(fields) < 4 {
		return errScramMalform
	}
	switch {
	case fields[0] == "n", fields[0] == "y":
	case strings.HasPrefix(fields[0], "p="):
		return authFailed("SCRAM channel binding is not supported")
	default:
		return errScramMalform
	}
	if fields[1] != "" && (!strings.HasPrefix(fields[1], "a=") || len(fields[1]) == 2) {
		return errScramMalform
	}
	if strings.HasPrefix(fields[2], "m=") {
		return authFailed("SCRAM mandatory extensions are not supported")
	}
	if !strings.HasPrefix(fields[2], "n=") || len(fields[2]) == 2 {
		return errScramMalform
	}
	nonce, ok := strings.CutPrefix(fields[3], "r=")
	if !ok || nonce == "" {
		return errScramMalform
	}
	if len(nonce) > maxScramNonce {
		return authFailed("SCRAM nonce too long")
	}
	for i := 0; i < len(nonce); i++ {
		if c := nonce[i]; c < 0x21 || c > 0x7e {
			return errScramMalform
		}
	}
	for _, ext := range fields[4:] {
		k, v, ok := strings.Cut(ext, "=")
		if !ok || k == "" || strings.IndexFunc(k, func(r rune) bool { return !isAlpha(r) }) >= 0 {
			return errScramMalform
		}
		if k == "tokenauth" {
			if strings.EqualFold(v, "false") {
				continue // Kafka: not a token; as if absent
			}
			return authFailed("SCRAM delegation token authentication is not supported")
		}
		return authFailed("SCRAM extensions are not supported")
	}
	return nil
}

func isAlpha(r rune) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }

/////////////////
// OAUTHBEARER //
/////////////////

type oauthSession struct {
	v         *OAuthValidator
	state     sessionState
	principal string
	expiry    time.Time
}

// NewOAuthBearer serves OAUTHBEARER (RFC 7628): one client message
// "n,[a=authzid],\x01auth=Bearer <token>\x01[key=value\x01]*\x01" (other
// keys are ignored), the token validated by v; an authzid must equal the
// principal's name. A token that does not validate fails with reply
// {"status":"invalid_token"} and an error whose message has
// "invalid_token". Every later message (the client's "\x01" too) fails.
func NewOAuthBearer(v *OAuthValidator) Session { return &oauthSession{v: v} }

func (s *oauthSession) Step(in []byte) ([]byte, bool, error) {
	if s.state != stateStart {
		s.state = stateFailed
		return nil, false, errExchangeOver
	}
	s.state = stateFailed
	if len(in) > MaxSASLMessage {
		return nil, false, errTooLarge
	}
	if s.v == nil {
		return nil, false, errNoOAuth
	}
	zid, token, err := parseOAuthBearer(in)
	if err != nil {
		return nil, false, err
	}
	name, exp, err := s.v.validate(token)
	if err != nil {
		return bytes.Clone(invalidTokenJSON), false, fmt.Errorf("%w: %w", ErrAuthFailed, err)
	}
	if zid != "" && zid != name {
		return nil, false, errZidMismatch
	}
	s.state, s.principal, s.expiry = stateDone, "User:"+name, exp
	return nil, true, nil
}

func (s *oauthSession) Principal() string { return s.principal }
func (s *oauthSession) Expiry() time.Time { return s.expiry }

// parseOAuthBearer parses RFC 7628's client-resp (§3.1):
//
//	gs2-header kvsep *kvpair kvsep   where kvsep = %x01, kvpair = key "=" value kvsep
//
// with an "auth" pair "Bearer <b64token>"; it returns the (decoded) authzid
// and the token.
func parseOAuthBearer(in []byte) (zid, token string, err error) {
	msg := string(in)
	flag, rest, ok := strings.Cut(msg, ",")
	if !ok {
		return "", "", errOAuthMalform
	}
	switch {
	case flag == "n", flag == "y":
	case strings.HasPrefix(flag, "p="):
		return "", "", authFailed("OAUTHBEARER channel binding is not supported")
	default:
		return "", "", errOAuthMalform
	}
	rawZid, rest, ok := strings.Cut(rest, ",")
	if !ok {
		return "", "", errOAuthMalform
	}
	if rawZid != "" {
		a, ok := strings.CutPrefix(rawZid, "a=")
		if !ok || a == "" {
			return "", "", errOAuthMalform
		}
		if zid, ok = decodeSASLName(a); !ok {
			return "", "", errOAuthMalform
		}
	}
	// rest = kvsep *kvpair kvsep: at least "\x01" pairs... "\x01".
	body, ok := strings.CutPrefix(rest, "\x01")
	if !ok {
		return "", "", errOAuthMalform
	}
	body, ok = strings.CutSuffix(body, "\x01")
	if !ok || body == "" {
		return "", "", errOAuthMalform // no auth pair
	}
	body, ok = strings.CutSuffix(body, "\x01")
	if !ok {
		return "", "", errOAuthMalform
	}
	seen := map[string]bool{}
	var auth string
	for _, kv := range strings.Split(body, "\x01") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.IndexFunc(k, func(r rune) bool { return !isAlpha(r) }) >= 0 || seen[k] {
			return "", "", errOAuthMalform
		}
		for i := 0; i < len(v); i++ {
			if c := v[i]; (c < 0x20 || c > 0x7e) && c != '\t' && c != '\r' && c != '\n' {
				return "", "", errOAuthMalform
			}
		}
		seen[k] = true
		if k == "auth" {
			auth = v
		}
	}
	scheme, tok, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", "", errOAuthMalform
	}
	tok = strings.TrimLeft(tok, " ")
	if !isB64Token(tok) {
		return "", "", errOAuthMalform
	}
	return zid, tok, nil
}

// isB64Token: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=" (RFC 6750).
func isB64Token(s string) bool {
	t := strings.TrimRight(s, "=")
	if t == "" {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/') {
			return false
		}
	}
	return true
}

// decodeSASLName undoes RFC 5802's "=2C" / "=3D" escaping; false on any
// other "=".
func decodeSASLName(s string) (string, bool) {
	if !strings.Contains(s, "=") {
		return s, true
	}
	var b strings.Builder
	for s != "" {
		i := strings.IndexByte(s, '=')
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		switch {
		case strings.HasPrefix(s[i:], "=2C"):
			b.WriteByte(',')
		case strings.HasPrefix(s[i:], "=3D"):
			b.WriteByte('=')
		default:
			return "", false
		}
		s = s[i+3:]
	}
	return b.String(), true
}
