package auth

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// OAuthConfig configures OAUTHBEARER token validation.
type OAuthConfig struct {
	Issuer   string // required "iss" if set
	Audience string // required in "aud" if set
	// JWKSFile is a JWKS JSON file, re-read when its modification time or
	// size changes.
	JWKSFile string
	// JWKSURL is a JWKS URL (http or https; https outside tests), fetched
	// with a 10 s timeout, refreshed every 5 min and on an unknown kid, at
	// most once per 10 s. Set JWKSFile or JWKSURL, not both.
	JWKSURL        string
	PrincipalClaim string        // default "sub"
	ClockSkew      time.Duration // default 30 s
	// Unsecured accepts unsigned tokens ({"alg":"none"}) as Kafka's
	// OAuthBearerUnsecuredValidatorCallbackHandler: the signature is not
	// checked, but exp (required) and, if present, iat/nbf are; the
	// principal claim is required. Development only; when Unsecured is set
	// signed tokens are validated only if a JWKS is configured.
	Unsecured bool
	Now       func() time.Time // tests; nil = time.Now
}

const (
	jwksFetchTimeout = 10 * time.Second
	jwksRefreshEvery = 5 * time.Minute
	jwksMinInterval  = 10 * time.Second
	maxJWKSSize      = 1 << 20
	maxJWKSKeys      = 256
	maxTokenLen      = MaxSASLMessage
)

// allowedAlgs are the signature algorithms a token may use.
var allowedAlgs = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512,
	jose.EdDSA,
}

// OAuthValidator validates OAUTHBEARER tokens (JWTs). Safe for concurrent
// use.
type OAuthValidator struct {
	cfg    OAuthConfig
	now    func() time.Time
	claim  string
	skew   time.Duration
	client *http.Client

	mu        sync.Mutex
	keys      []jose.JSONWebKey // public signature keys
	fileStamp fileStamp         // of the JWKS file keys came from
	attempted time.Time         // the last JWKS fetch started (URL)
	fetched   time.Time         // the last JWKS fetch that succeeded (URL)
	fetching  chan struct{}     // closed when the fetch under way ends; nil if none
	lastErr   error             // of the last failed JWKS load
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// NewOAuthValidator makes a validator; the JWKS (if any) is loaded now, and
// an error if it cannot be. It is an error to configure neither a JWKS nor
// Unsecured.
func NewOAuthValidator(cfg OAuthConfig) (*OAuthValidator, error) {
	if cfg.JWKSFile == "" && cfg.JWKSURL == "" && !cfg.Unsecured {
		return nil, errors.New("oauth: configure a JWKS file or URL (or Unsecured, for development)")
	}
	if cfg.JWKSFile != "" && cfg.JWKSURL != "" {
		return nil, errors.New("oauth: configure a JWKS file or a JWKS URL, not both")
	}
	if cfg.ClockSkew < 0 {
		return nil, errors.New("oauth: negative clock skew")
	}
	v := &OAuthValidator{cfg: cfg, now: cfg.Now, claim: cfg.PrincipalClaim, skew: cfg.ClockSkew}
	if v.now == nil {
		v.now = time.Now
	}
	if v.claim == "" {
		v.claim = "sub"
	}
	if v.skew == 0 {
		v.skew = 30 * time.Second
	}
	switch {
	case cfg.JWKSFile != "":
		if err := v.reloadFile(); err != nil {
			return nil, err
		}
	case cfg.JWKSURL != "":
		u, err := url.Parse(cfg.JWKSURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("oauth: JWKS URL %q is not an http(s) URL", cfg.JWKSURL)
		}
		v.client = &http.Client{Timeout: jwksFetchTimeout}
		v.attempted = v.now()
		keys, err := v.fetch()
		if err != nil {
			return nil, err
		}
		v.keys, v.fetched = keys, v.now()
	}
	return v, nil
}

func (v *OAuthValidator) hasJWKS() bool { return v.cfg.JWKSFile != "" || v.cfg.JWKSURL != "" }

// tokenErr is a token's failure: "invalid_token: <reason>", the reason safe
// to show the client (about the token; no key, no expected iss or aud).
func tokenErr(format string, args ...any) error {
	return fmt.Errorf("invalid_token: "+format, args...)
}

// Validate checks a compact JWS token: its signature against the JWKS by
// kid (RS256/384/512, PS256/384/512, ES256/384/512, EdDSA; "none" only when
// Unsecured), iss, aud, exp (required), nbf, iat, the principal claim. It
// returns "User:<claim>" and the expiry. Errors say "invalid_token: " and
// a reason safe to show the client.
func (v *OAuthValidator) Validate(token string) (principal string, expiry time.Time, err error) {
	name, exp, err := v.validate(token)
	if err != nil {
		return "", time.Time{}, err
	}
	return "User:" + name, exp, nil
}

// jwsHeader is what routing a token needs from its header.
type jwsHeader struct {
	Alg  string          `json:"alg"`
	Crit json.RawMessage `json:"crit"`
}

func (v *OAuthValidator) validate(token string) (string, time.Time, error) {
	if token == "" || len(token) > maxTokenLen {
		return "", time.Time{}, tokenErr("bad token size")
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", time.Time{}, tokenErr("not a compact JWS")
	}
	hb, err := decodeB64URL(parts[0])
	if err != nil {
		return "", time.Time{}, tokenErr("malformed header")
	}
	var hdr jwsHeader
	if err := json.Unmarshal(hb, &hdr); err != nil {
		return "", time.Time{}, tokenErr("malformed header")
	}
	var payload []byte
	if hdr.Alg == "none" {
		if !v.cfg.Unsecured {
			return "", time.Time{}, tokenErr("unsigned tokens are not accepted")
		}
		if parts[2] != "" {
			return "", time.Time{}, tokenErr("an unsigned token must have an empty signature")
		}
		if len(hdr.Crit) > 0 {
			return "", time.Time{}, tokenErr("unsupported critical header")
		}
		if payload, err = decodeB64URL(parts[1]); err != nil {
			return "", time.Time{}, tokenErr("malformed payload")
		}
	} else {
		if !v.hasJWKS() {
			return "", time.Time{}, tokenErr("signed tokens are not accepted (no JWKS configured)")
		}
		if payload, err = v.verify(token); err != nil {
			return "", time.Time{}, err
		}
	}
	return v.checkClaims(payload)
}

// verify checks token's signature and returns its payload.
func (v *OAuthValidator) verify(token string) ([]byte, error) {
	tok, err := jwt.ParseSigned(token, allowedAlgs)
	if err != nil || len(tok.Headers) != 1 {
		return nil, tokenErr("malformed or unsupported signed token")
	}
	h := tok.Headers[0]
	keys := v.keysFor(h.KeyID, h.Algorithm)
	if len(keys) == 0 {
		if h.KeyID == "" {
			return nil, tokenErr("the token has no kid")
		}
		return nil, tokenErr("no JWKS key for the token's kid and alg")
	}
	for _, k := range keys {
		var payload json.RawMessage
		if err := tok.Claims(k.Key, &payload); err == nil {
			return payload, nil
		}
	}
	return nil, tokenErr("bad signature")
}

// claims are the registered claims checked.
type claims struct {
	Issuer    string           `json:"iss"`
	Audience  jwt.Audience     `json:"aud"`
	Expiry    *jwt.NumericDate `json:"exp"`
	NotBefore *jwt.NumericDate `json:"nbf"`
	IssuedAt  *jwt.NumericDate `json:"iat"`
}

func (v *OAuthValidator) checkClaims(payload []byte) (string, time.Time, error) {
	var c claims
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(payload, &raw); err != nil || raw == nil {
		return "", time.Time{}, tokenErr("malformed claims")
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return "", time.Time{}, tokenErr("malformed registered claims")
	}
	now := v.now()
	if c.Expiry == nil {
		return "", time.Time{}, tokenErr("no exp claim")
	}
	exp := c.Expiry.Time()
	if !now.Before(exp.Add(v.skew)) {
		return "", time.Time{}, tokenErr("token expired")
	}
	if c.NotBefore != nil && now.Add(v.skew).Before(c.NotBefore.Time()) {
		return "", time.Time{}, tokenErr("token not yet valid (nbf)")
	}
	if c.IssuedAt != nil {
		iat := c.IssuedAt.Time()
		if now.Add(v.skew).Before(iat) {
			return "", time.Time{}, tokenErr("token issued in the future (iat)")
		}
		if exp.Before(iat) {
			return "", time.Time{}, tokenErr("token expires before it was issued")
		}
	}
	if v.cfg.Issuer != "" && c.Issuer != v.cfg.Issuer {
		return "", time.Time{}, tokenErr("wrong issuer")
	}
	if v.cfg.Audience != "" && !c.Audience.Contains(v.cfg.Audience) {
		return "", time.Time{}, tokenErr("wrong audience")
	}
	var name string
	rc, ok := raw[v.claim]
	if !ok {
		return "", time.Time{}, tokenErr("no principal claim %q", v.claim)
	}
	if err := json.Unmarshal(rc, &name); err != nil || name == "" {
		return "", time.Time{}, tokenErr("principal claim %q is not a non-empty string", v.claim)
	}
	return name, exp, nil
}

// decodeB64URL decodes base64url, padded or not.
func decodeB64URL(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

// keysFor is the JWKS's keys that may verify a token with kid and alg, the
// JWKS reloaded or refreshed as configured first. Without a kid only a JWKS
// with a single usable key serves.
func (v *OAuthValidator) keysFor(kid, alg string) []jose.JSONWebKey {
	if v.cfg.JWKSFile != "" {
		v.mu.Lock()
		_ = v.maybeReloadFileLocked()
		keys := matchKeys(v.keys, kid, alg)
		v.mu.Unlock()
		return keys
	}
	v.mu.Lock()
	now := v.now()
	if now.Sub(v.fetched) >= jwksRefreshEvery && now.Sub(v.attempted) >= jwksMinInterval && v.fetching == nil {
		v.startFetchLocked(now) // in the background: the current keys serve meanwhile
	}
	keys := matchKeys(v.keys, kid, alg)
	if len(keys) > 0 || kid == "" {
		v.mu.Unlock()
		return keys
	}
	// An unknown kid: perhaps the keys rotated.
	wait := v.fetching
	if wait == nil && now.Sub(v.attempted) >= jwksMinInterval {
		wait = v.startFetchLocked(now)
	}
	v.mu.Unlock()
	if wait == nil {
		return nil
	}
	<-wait
	v.mu.Lock()
	defer v.mu.Unlock()
	return matchKeys(v.keys, kid, alg)
}

// startFetchLocked fetches the JWKS in a goroutine; the channel returned is
// closed when it is done. v.mu is held.
func (v *OAuthValidator) startFetchLocked(now time.Time) chan struct{} {
	done := make(chan struct{})
	v.fetching, v.attempted = done, now
	go func() {
		keys, err := v.fetch()
		v.mu.Lock()
		if err == nil {
			v.keys, v.fetched, v.lastErr = keys, v.now(), nil
		} else {
			v.lastErr = err
		}
		v.fetching = nil
		v.mu.Unlock()
		close(done)
	}()
	return done
}

// LastJWKSError is the error of the last JWKS reload or fetch that failed
// (the keys before it still serve), nil if the last one succeeded.
func (v *OAuthValidator) LastJWKSError() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.lastErr
}

func matchKeys(keys []jose.JSONWebKey, kid, alg string) []jose.JSONWebKey {
	var out []jose.JSONWebKey
	for _, k := range keys {
		if kid != "" && k.KeyID != kid {
			continue
		}
		if k.Algorithm != "" && k.Algorithm != alg {
			continue
		}
		out = append(out, k)
	}
	if kid == "" && len(keys) != 1 {
		return nil
	}
	return out
}

// fetch gets and parses the JWKS at the URL.
func (v *OAuthValidator) fetch() ([]jose.JSONWebKey, error) {
	ctx, cancel := context.WithTimeout(context.Background(), jwksFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKSURL, nil)
	if err != nil {
		return nil, fmt.Errorf("oauth: JWKS URL: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := v.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("oauth: fetching the JWKS: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("oauth: fetching the JWKS: HTTP status %s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSSize+1))
	if err != nil {
		return nil, fmt.Errorf("oauth: reading the JWKS: %w", err)
	}
	if len(b) > maxJWKSSize {
		return nil, fmt.Errorf("oauth: the JWKS is larger than %d bytes", maxJWKSSize)
	}
	return parseJWKS(b)
}

// reloadFile reads the JWKS file (at construction).
func (v *OAuthValidator) reloadFile() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.maybeReloadFileLocked()
}

// maybeReloadFileLocked re-reads the JWKS file if it changed; on an error
// the keys stay and the next call tries again. v.mu is held.
func (v *OAuthValidator) maybeReloadFileLocked() error {
	st, err := os.Stat(v.cfg.JWKSFile)
	if err != nil {
		v.lastErr = fmt.Errorf("oauth: JWKS file: %w", err)
		return v.lastErr
	}
	stamp := fileStamp{st.ModTime(), st.Size()}
	if v.keys != nil && stamp.mod.Equal(v.fileStamp.mod) && stamp.size == v.fileStamp.size {
		return nil
	}
	if st.Size() > maxJWKSSize {
		v.lastErr = fmt.Errorf("oauth: JWKS file %s is larger than %d bytes", v.cfg.JWKSFile, maxJWKSSize)
		return v.lastErr
	}
	b, err := os.ReadFile(v.cfg.JWKSFile)
	if err != nil {
		v.lastErr = fmt.Errorf("oauth: JWKS file: %w", err)
		return v.lastErr
	}
	keys, err := parseJWKS(b)
	if err != nil {
		v.lastErr = fmt.Errorf("%w (file %s)", err, v.cfg.JWKSFile)
		return v.lastErr
	}
	v.keys, v.fileStamp, v.lastErr = keys, stamp, nil
	return nil
}

// parseJWKS is a JWK set's public signature keys. Keys that do not parse,
// are symmetric or are not for signatures are skipped; a set without any
// usable key is an error.
func parseJWKS(b []byte) ([]jose.JSONWebKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("oauth: parsing the JWKS: %w", err)
	}
	var keys []jose.JSONWebKey
	for _, raw := range set.Keys {
		if len(keys) == maxJWKSKeys {
			break
		}
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(bytes.TrimSpace(raw)); err != nil || !k.Valid() {
			continue
		}
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		pub := k.Public()
		if !pub.Valid() || !pub.IsPublic() {
			continue
		}
		keys = append(keys, pub)
	}
	if len(keys) == 0 {
		return nil, errors.New("oauth: the JWKS has no usable signature key")
	}
	return keys, nil
}
