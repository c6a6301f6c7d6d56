package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
)

var (
	testRSAKey  = sync.OnceValue(func() *rsa.PrivateKey { return genRSA() })
	testRSAKey2 = sync.OnceValue(func() *rsa.PrivateKey { return genRSA() })
	testECKey   = sync.OnceValue(func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	})
	testEdKey = sync.OnceValue(func() ed25519.PrivateKey {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	})
)

func genRSA() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
}

var testNow = time.Unix(1_800_000_000, 0)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func pubJWK(priv any, kid, alg string) jose.JSONWebKey {
	k := jose.JSONWebKey{Key: priv, KeyID: kid, Algorithm: alg, Use: "sig"}
	return k.Public()
}

func jwksJSON(t testing.TB, keys ...jose.JSONWebKey) []byte {
	t.Helper()
	b, err := json.Marshal(jose.JSONWebKeySet{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeJWKS(t testing.TB, path string, mod time.Time, keys ...jose.JSONWebKey) {
	t.Helper()
	if err := os.WriteFile(path, jwksJSON(t, keys...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mod, mod); err != nil {
		t.Fatal(err)
	}
}

// sign makes a compact JWS of claims with priv; kid "" leaves it out.
func sign(t testing.TB, priv any, alg jose.SignatureAlgorithm, kid string, claims any) string {
	t.Helper()
	key := any(priv)
	if kid != "" {
		key = jose.JSONWebKey{Key: priv, KeyID: kid}
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// unsecuredToken is a Kafka-style unsecured JWS: {"alg":"none"}, no
// signature.
func unsecuredToken(t testing.TB, claims any) string {
	t.Helper()
	b, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc(b) + "."
}

func claimsAt(now time.Time, extra map[string]any) map[string]any {
	c := map[string]any{
		"sub": "alice",
		"iss": "https://idp.example",
		"aud": "synapse",
		"exp": now.Add(time.Hour).Unix(),
		"iat": now.Add(-time.Minute).Unix(),
	}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

func wantInvalid(t *testing.T, what string, v *OAuthValidator, token string) {
	t.Helper()
	p, exp, err := v.Validate(token)
	if err == nil {
		t.Errorf("%s: Validate accepted the token (principal %q)", what, p)
		return
	}
	if p != "" || !exp.IsZero() {
		t.Errorf("%s: Validate failed but returned %q, %v", what, p, exp)
	}
	if !strings.Contains(err.Error(), "invalid_token") {
		t.Errorf("%s: error %q does not say invalid_token", what, err)
	}
}

func wantValid(t *testing.T, what string, v *OAuthValidator, token, principal string, exp time.Time) {
	t.Helper()
	p, e, err := v.Validate(token)
	if err != nil {
		t.Errorf("%s: Validate: %v", what, err)
		return
	}
	if p != principal || !e.Equal(exp) {
		t.Errorf("%s: Validate = %q, %v; want %q, %v", what, p, e, principal, exp)
	}
}

func TestOAuthValidateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "jwks.json")
	rsaK, ecK, edK := testRSAKey(), testECKey(), testEdKey()
	writeJWKS(t, path, testNow,
		pubJWK(rsaK, "rsa1", ""),
		pubJWK(ecK, "ec1", "ES256"),
		pubJWK(edK, "ed1", ""),
		jose.JSONWebKey{Key: []byte("0123456789abcdef0123456789abcdef"), KeyID: "hmac"}, // skipped: symmetric
	)
	v, err := NewOAuthValidator(OAuthConfig{Issuer: "https://idp.example", Audience: "synapse", JWKSFile: path, Now: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	exp := testNow.Add(time.Hour)
	good := claimsAt(testNow, nil)

	wantValid(t, "RS256", v, sign(t, rsaK, jose.RS256, "rsa1", good), "User:alice", exp)
	wantValid(t, "RS512", v, sign(t, rsaK, jose.RS512, "rsa1", good), "User:alice", exp)
	wantValid(t, "PS256", v, sign(t, rsaK, jose.PS256, "rsa1", good), "User:alice", exp)
	wantValid(t, "ES256", v, sign(t, ecK, jose.ES256, "ec1", good), "User:alice", exp)
	wantValid(t, "EdDSA", v, sign(t, edK, jose.EdDSA, "ed1", good), "User:alice", exp)
	wantValid(t, "audience list", v, sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"aud": []string{"other", "synapse"}})), "User:alice", exp)
	wantValid(t, "expired within the skew", v, sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"exp": testNow.Add(-20 * time.Second).Unix()})), "User:alice", testNow.Add(-20*time.Second))
	wantValid(t, "nbf within the skew", v, sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"nbf": testNow.Add(20 * time.Second).Unix()})), "User:alice", exp)

	for name, tok := range map[string]string{
		"expired":            sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"exp": testNow.Add(-time.Hour).Unix()})),
		"expired by skew":    sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"exp": testNow.Add(-30 * time.Second).Unix()})),
		"no exp":             sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"exp": nil})),
		"string exp":         sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"exp": "tomorrow"})),
		"huge exp":           sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"exp": 1e300})),
		"not yet valid":      sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"nbf": testNow.Add(time.Hour).Unix()})),
		"issued in future":   sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"iat": testNow.Add(time.Hour).Unix()})),
		"wrong issuer":       sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"iss": "https://evil.example"})),
		"no issuer":          sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"iss": nil})),
		"wrong audience":     sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"aud": []string{"kafka", "other"}})),
		"no audience":        sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"aud": nil})),
		"no subject":         sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"sub": nil})),
		"empty subject":      sign(t, rsaK, jose.RS256, "rsa1", claimsAt(testNow, map[string]any{"sub": ""})),
		"wrong key":          sign(t, testRSAKey2(), jose.RS256, "rsa1", good),
		"unknown kid":        sign(t, rsaK, jose.RS256, "rsa9", good),
		"no kid, many keys":  sign(t, rsaK, jose.RS256, "", good),
		"alg of another key": sign(t, rsaK, jose.RS256, "ec1", good),
		"ES384 for ES256 key": func() string {
			k, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
			return sign(t, k, jose.ES384, "ec1", good)
		}(),
		"HS256":     sign(t, []byte("0123456789abcdef0123456789abcdef"), jose.HS256, "hmac", good),
		"alg none":  unsecuredToken(t, good),
		"garbage":   "not a token",
		"two parts": "eyJhbGciOiJub25lIn0.e30",
		"empty":     "",
		"tampered": func() string {
			tok := sign(t, rsaK, jose.RS256, "rsa1", good)
			parts := strings.Split(tok, ".")
			parts[1] = base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"admin","iss":"https://idp.example","aud":"synapse","exp":1900000000}`))
			return strings.Join(parts, ".")
		}(),
		"too long": strings.Repeat("a", MaxSASLMessage+1),
	} {
		wantInvalid(t, name, v, tok)
	}

	// Another principal claim; the single key of a JWKS serves a token without kid.
	path2 := filepath.Join(dir, "one.json")
	writeJWKS(t, path2, testNow, pubJWK(ecK, "ec1", ""))
	v2, err := NewOAuthValidator(OAuthConfig{JWKSFile: path2, PrincipalClaim: "client_id", ClockSkew: time.Second, Now: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	wantValid(t, "client_id", v2, sign(t, ecK, jose.ES256, "", claimsAt(testNow, map[string]any{"client_id": "svc-1"})), "User:svc-1", exp)
	wantInvalid(t, "no client_id", v2, sign(t, ecK, jose.ES256, "ec1", good))
	wantInvalid(t, "numeric client_id", v2, sign(t, ecK, jose.ES256, "ec1", claimsAt(testNow, map[string]any{"client_id": 7})))
	wantInvalid(t, "expired beyond a 1 s skew", v2, sign(t, ecK, jose.ES256, "ec1", claimsAt(testNow, map[string]any{"client_id": "svc-1", "exp": testNow.Add(-2 * time.Second).Unix()})))
}

func TestOAuthJWKSFileRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jwks.json")
	k1, k2 := testRSAKey(), testECKey()
	writeJWKS(t, path, testNow, pubJWK(k1, "k1", ""))
	v, err := NewOAuthValidator(OAuthConfig{JWKSFile: path, Now: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	good := claimsAt(testNow, nil)
	exp := testNow.Add(time.Hour)
	tok1, tok2 := sign(t, k1, jose.RS256, "k1", good), sign(t, k2, jose.ES256, "k2", good)
	wantValid(t, "k1", v, tok1, "User:alice", exp)
	wantInvalid(t, "k2 before the rotation", v, tok2)

	writeJWKS(t, path, testNow.Add(time.Minute), pubJWK(k2, "k2", ""))
	wantValid(t, "k2 after the rotation", v, tok2, "User:alice", exp)
	wantInvalid(t, "k1 after the rotation", v, tok1)

	// A broken file keeps the keys until it is fixed.
	if err := os.WriteFile(path, []byte(`{"keys":[`), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(path, testNow.Add(2*time.Minute), testNow.Add(2*time.Minute))
	wantValid(t, "k2 with a broken file", v, tok2, "User:alice", exp)
	if v.LastJWKSError() == nil {
		t.Error("LastJWKSError is nil after a broken file")
	}
	writeJWKS(t, path, testNow.Add(3*time.Minute), pubJWK(k1, "k1", ""), pubJWK(k2, "k2", ""))
	wantValid(t, "k1 after the fix", v, tok1, "User:alice", exp)
	wantValid(t, "k2 after the fix", v, tok2, "User:alice", exp)
	if err := v.LastJWKSError(); err != nil {
		t.Errorf("LastJWKSError = %v after the fix", err)
	}
}

func TestOAuthUnsecured(t *testing.T) {
	clk := &clock{t: testNow}
	v, err := NewOAuthValidator(OAuthConfig{Unsecured: true, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	good := map[string]any{"sub": "dev", "exp": testNow.Add(time.Minute).Unix(), "iat": testNow.Unix()}
	tok := unsecuredToken(t, good)
	wantValid(t, "unsecured", v, tok, "User:dev", testNow.Add(time.Minute))
	wantValid(t, "padded", v, strings.Replace(tok, ".", "==.", 1), "User:dev", testNow.Add(time.Minute))
	clk.Advance(2 * time.Minute)
	wantInvalid(t, "unsecured, expired", v, tok)
	clk.Advance(-2 * time.Minute)

	enc := base64.RawURLEncoding.EncodeToString
	for name, tok := range map[string]string{
		"no exp":            unsecuredToken(t, map[string]any{"sub": "dev"}),
		"no sub":            unsecuredToken(t, map[string]any{"exp": testNow.Add(time.Minute).Unix()}),
		"iat in the future": unsecuredToken(t, map[string]any{"sub": "dev", "exp": testNow.Add(time.Hour).Unix(), "iat": testNow.Add(10 * time.Minute).Unix()}),
		"iat after exp":     unsecuredToken(t, map[string]any{"sub": "dev", "exp": testNow.Add(time.Minute).Unix(), "iat": testNow.Add(2 * time.Minute).Unix()}),
		"nbf in the future": unsecuredToken(t, map[string]any{"sub": "dev", "exp": testNow.Add(time.Hour).Unix(), "nbf": testNow.Add(10 * time.Minute).Unix()}),
		"with a signature":  tok + "c2ln",
		"signed, no JWKS":   sign(t, testECKey(), jose.ES256, "ec1", claimsAt(testNow, nil)),
		"alg None":          enc([]byte(`{"alg":"None"}`)) + "." + enc([]byte(`{"sub":"dev","exp":1900000000}`)) + ".",
		"no alg":            enc([]byte(`{}`)) + "." + enc([]byte(`{"sub":"dev","exp":1900000000}`)) + ".",
		"crit":              enc([]byte(`{"alg":"none","crit":["exp"]}`)) + "." + enc([]byte(`{"sub":"dev","exp":1900000000}`)) + ".",
		"payload not JSON":  enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(`sub=dev`)) + ".",
		"payload array":     enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(`[1,2]`)) + ".",
		"payload null":      enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(`null`)) + ".",
		"bad base64":        "e30!." + enc([]byte(`{"sub":"dev","exp":1900000000}`)) + ".",
		"header not JSON":   enc([]byte(`alg=none`)) + "." + enc([]byte(`{"sub":"dev","exp":1900000000}`)) + ".",
		"four parts":        tok + ".",
	} {
		wantInvalid(t, name, v, tok)
	}

	// Not Unsecured: refused.
	path := filepath.Join(t.TempDir(), "jwks.json")
	writeJWKS(t, path, testNow, pubJWK(testECKey(), "ec1", ""))
	strict, err := NewOAuthValidator(OAuthConfig{JWKSFile: path, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	wantInvalid(t, "alg none, not Unsecured", strict, tok)

	// Unsecured with a JWKS: both.
	both, err := NewOAuthValidator(OAuthConfig{JWKSFile: path, Unsecured: true, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	wantValid(t, "unsigned with a JWKS", both, tok, "User:dev", testNow.Add(time.Minute))
	wantValid(t, "signed with a JWKS", both, sign(t, testECKey(), jose.ES256, "ec1", claimsAt(testNow, nil)), "User:alice", testNow.Add(time.Hour))
	wantInvalid(t, "badly signed with a JWKS", both, sign(t, testRSAKey(), jose.RS256, "ec1", claimsAt(testNow, nil)))
}

// jwksServer serves a JWKS that the test can change, counting fetches.
type jwksServer struct {
	*httptest.Server
	mu      sync.Mutex
	body    []byte
	status  int
	fetches atomic.Int32
}

func newJWKSServer(t *testing.T, body []byte) *jwksServer {
	s := &jwksServer{body: body, status: http.StatusOK}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		body, status := s.body, s.status
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(body []byte, status int) {
	s.mu.Lock()
	s.body, s.status = body, status
	s.mu.Unlock()
}

func TestOAuthJWKSURL(t *testing.T) {
	k1, k2, k3 := testRSAKey(), testECKey(), testEdKey()
	srv := newJWKSServer(t, jwksJSON(t, pubJWK(k1, "k1", "RS256")))
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") {
		t.Fatalf("test server is not on loopback: %s", srv.URL)
	}
	clk := &clock{t: testNow}
	v, err := NewOAuthValidator(OAuthConfig{JWKSURL: srv.URL + "/jwks", Audience: "synapse", Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches at construction, want 1", n)
	}
	good := claimsAt(testNow, nil)
	exp := testNow.Add(time.Hour)
	tok1, tok2, tok3 := sign(t, k1, jose.RS256, "k1", good), sign(t, k2, jose.ES256, "k2", good), sign(t, k3, jose.EdDSA, "k3", good)
	wantValid(t, "k1", v, tok1, "User:alice", exp)
	wantInvalid(t, "k1 as PS256 (the key says RS256)", v, sign(t, k1, jose.PS256, "k1", good))

	srv.set(jwksJSON(t, pubJWK(k1, "k1", ""), pubJWK(k2, "k2", "")), http.StatusOK)
	// Within 10 s of the last fetch an unknown kid does not fetch.
	wantInvalid(t, "k2 within 10 s", v, tok2)
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches, want 1 (rate limit)", n)
	}
	clk.Advance(11 * time.Second)
	wantValid(t, "k2 after a refresh", v, tok2, "User:alice", exp)
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("%d fetches, want 2", n)
	}
	wantInvalid(t, "k3 unknown, rate limited", v, tok3)
	clk.Advance(5 * time.Second)
	wantInvalid(t, "k3 unknown, still rate limited", v, tok3)
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("%d fetches, want 2 (rate limit)", n)
	}
	wantValid(t, "k1 known: no fetch", v, tok1, "User:alice", exp)

	// Every 5 min the keys are refreshed (in the background).
	srv.set(jwksJSON(t, pubJWK(k3, "k3", "")), http.StatusOK)
	clk.Advance(5 * time.Minute)
	v.Validate(tok1) // starts the refresh; k1 still serves meanwhile
	deadline := time.Now().Add(10 * time.Second)
	for srv.fetches.Load() < 3 || v.LastJWKSError() != nil || len(v.keysSnapshot()) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no periodic refresh: %d fetches", srv.fetches.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	wantValid(t, "k3 after the periodic refresh", v, tok3, "User:alice", exp)
	wantInvalid(t, "k1 after the periodic refresh", v, tok1)

	// A failed fetch keeps the keys.
	srv.set([]byte("oops"), http.StatusInternalServerError)
	clk.Advance(11 * time.Second)
	wantInvalid(t, "k2 with the server down", v, tok2)
	if v.LastJWKSError() == nil {
		t.Error("LastJWKSError is nil after a failed fetch")
	}
	wantValid(t, "k3 with the server down", v, tok3, "User:alice", exp)

	// Construction fails if the JWKS cannot be fetched, or has no key.
	if _, err := NewOAuthValidator(OAuthConfig{JWKSURL: srv.URL, Now: clk.Now}); err == nil {
		t.Error("NewOAuthValidator with a failing JWKS URL succeeded")
	}
	srv.set([]byte(`{"keys":[]}`), http.StatusOK)
	if _, err := NewOAuthValidator(OAuthConfig{JWKSURL: srv.URL, Now: clk.Now}); err == nil {
		t.Error("NewOAuthValidator with an empty JWKS succeeded")
	}
	srv.set([]byte(strings.Repeat(" ", maxJWKSSize+1)), http.StatusOK)
	if _, err := NewOAuthValidator(OAuthConfig{JWKSURL: srv.URL, Now: clk.Now}); err == nil {
		t.Error("NewOAuthValidator with a huge JWKS succeeded")
	}
}

// keysSnapshot is the current keys (tests).
func (v *OAuthValidator) keysSnapshot() []jose.JSONWebKey {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.keys
}

// Concurrent validations with an unknown kid share one fetch.
func TestOAuthJWKSURLConcurrent(t *testing.T) {
	k1, k2 := testRSAKey(), testECKey()
	srv := newJWKSServer(t, jwksJSON(t, pubJWK(k1, "k1", "")))
	clk := &clock{t: testNow}
	v, err := NewOAuthValidator(OAuthConfig{JWKSURL: srv.URL, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv.set(jwksJSON(t, pubJWK(k1, "k1", ""), pubJWK(k2, "k2", "")), http.StatusOK)
	clk.Advance(time.Minute)
	tok2 := sign(t, k2, jose.ES256, "k2", claimsAt(testNow, nil))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := v.Validate(tok2); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := srv.fetches.Load(); n != 2 {
		t.Errorf("%d fetches, want 2", n)
	}
}

func TestNewOAuthValidatorConfig(t *testing.T) {
	dir := t.TempDir()
	if _, err := NewOAuthValidator(OAuthConfig{}); err == nil {
		t.Error("no JWKS nor Unsecured: no error")
	}
	if _, err := NewOAuthValidator(OAuthConfig{JWKSFile: "a", JWKSURL: "http://127.0.0.1/"}); err == nil {
		t.Error("both a file and a URL: no error")
	}
	if _, err := NewOAuthValidator(OAuthConfig{JWKSFile: filepath.Join(dir, "missing.json")}); err == nil {
		t.Error("missing JWKS file: no error")
	}
	for name, body := range map[string]string{
		"garbage":   "garbage",
		"no keys":   `{"keys":[]}`,
		"bad keys":  `{"keys":[{"kty":"RSA"},{"kty":"nope"},17]}`,
		"enc only":  string(jwksJSON(t, jose.JSONWebKey{Key: testECKey().Public(), KeyID: "e", Use: "enc"})),
		"symmetric": string(jwksJSON(t, jose.JSONWebKey{Key: []byte("0123456789abcdef"), KeyID: "s"})),
	} {
		p := filepath.Join(dir, name+".json")
		os.WriteFile(p, []byte(body), 0o600)
		if _, err := NewOAuthValidator(OAuthConfig{JWKSFile: p}); err == nil {
			t.Errorf("JWKS %s: no error", name)
		}
	}
	for _, u := range []string{"ftp://127.0.0.1/jwks", "/jwks", "http://"} {
		if _, err := NewOAuthValidator(OAuthConfig{JWKSURL: u}); err == nil {
			t.Errorf("JWKS URL %q: no error", u)
		}
	}
	if _, err := NewOAuthValidator(OAuthConfig{Unsecured: true, ClockSkew: -time.Second}); err == nil {
		t.Error("negative skew: no error")
	}
	// A private key in the JWKS serves as its public key; unknown key types beside it are skipped.
	p := filepath.Join(dir, "private.json")
	priv := jwksJSON(t, jose.JSONWebKey{Key: testECKey(), KeyID: "p"})
	mixed := strings.Replace(string(priv), `{"keys":[`, `{"keys":[{"kty":"future","kid":"f"},`, 1)
	os.WriteFile(p, []byte(mixed), 0o600)
	v, err := NewOAuthValidator(OAuthConfig{JWKSFile: p, Now: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	wantValid(t, "private JWK", v, sign(t, testECKey(), jose.ES256, "p", claimsAt(testNow, nil)), "User:alice", testNow.Add(time.Hour))
	if k := v.keysSnapshot(); len(k) != 1 || !k[0].IsPublic() {
		t.Errorf("keys = %v, want one public key", k)
	}
}

func TestOAuthBearerSession(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jwks.json")
	writeJWKS(t, path, testNow, pubJWK(testECKey(), "ec1", ""))
	v, err := NewOAuthValidator(OAuthConfig{JWKSFile: path, Issuer: "https://idp.example", Now: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	good := sign(t, testECKey(), jose.ES256, "ec1", claimsAt(testNow, nil))
	expired := sign(t, testECKey(), jose.ES256, "ec1", claimsAt(testNow, map[string]any{"exp": testNow.Add(-time.Hour).Unix()}))

	run := func(a oauth.Auth) (Session, []byte, []byte, error) {
		cs, msg, err := a.AsMechanism().Authenticate(context.Background(), "broker")
		if err != nil {
			t.Fatal(err)
		}
		s := NewOAuthBearer(v)
		reply, done, err := s.Step(msg)
		if err == nil {
			if !done || reply != nil {
				t.Fatalf("success: done %v, reply %q", done, reply)
			}
			if cdone, _, cerr := cs.Challenge(reply); !cdone || cerr != nil {
				t.Fatalf("client: %v, %v", cdone, cerr)
			}
			return s, reply, nil, nil
		}
		// The client answers an error challenge with \x01.
		_, next, _ := cs.Challenge(reply)
		return s, reply, next, err
	}

	s, _, _, err := run(oauth.Auth{Token: good, Extensions: map[string]string{"traceId": "abc 123"}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Principal() != "User:alice" || !s.Expiry().Equal(testNow.Add(time.Hour)) {
		t.Errorf("Principal %q, Expiry %v", s.Principal(), s.Expiry())
	}
	if _, _, err := s.Step([]byte{1}); err == nil {
		t.Error("a message after success was accepted")
	}
	if _, _, _, err := run(oauth.Auth{Zid: "alice", Token: good}); err != nil {
		t.Errorf("authzid == principal: %v", err)
	}
	s, _, _, err = run(oauth.Auth{Zid: "admin", Token: good})
	failed(t, "authzid mismatch", err)
	if s.Principal() != "" {
		t.Errorf("failed session has principal %q", s.Principal())
	}

	s, reply, next, err := run(oauth.Auth{Token: expired})
	failed(t, "expired", err)
	if string(reply) != `{"status":"invalid_token"}` || !strings.Contains(err.Error(), "invalid_token") {
		t.Errorf("expired: reply %q, err %v", reply, err)
	}
	if string(next) != "\x01" {
		t.Fatalf("client's answer to the error: %q", next)
	}
	if _, done, err := s.Step(next); err == nil || done {
		t.Error("the client's \\x01 after a failure was accepted")
	}
	if s.Principal() != "" || !s.Expiry().IsZero() {
		t.Errorf("failed session: %q, %v", s.Principal(), s.Expiry())
	}

	for _, msg := range []string{
		"",
		"\x01",
		"n,,",
		"n,,\x01\x01",
		"n,,\x01auth=Bearer " + good + "\x01",
		"n,,auth=Bearer " + good + "\x01\x01",
		"n,,\x01auth=Bearer " + good + "\x01\x01\x01",
		"n,,\x01auth=Basic " + good + "\x01\x01",
		"n,,\x01auth=Bearer\x01\x01",
		"n,,\x01auth=Bearer \x01\x01",
		"n,,\x01auth=Bearer a b\x01\x01",
		"n,,\x01auth=Bearer " + good + "\x01auth=Bearer " + good + "\x01\x01",
		"n,,\x01host=h\x01\x01",
		"n,,\x01=x\x01auth=Bearer " + good + "\x01\x01",
		"n,,\x01h0st=x\x01auth=Bearer " + good + "\x01\x01",
		"n,,\x01x=\x00\x01auth=Bearer " + good + "\x01\x01",
		"n,,\x01auth\x01\x01",
		"p=tls-unique,,\x01auth=Bearer " + good + "\x01\x01",
		"x,,\x01auth=Bearer " + good + "\x01\x01",
		"n,alice,\x01auth=Bearer " + good + "\x01\x01",
		"n,a=,\x01auth=Bearer " + good + "\x01\x01",
		"n,a=al=ice,\x01auth=Bearer " + good + "\x01\x01",
		"n,\x01auth=Bearer " + good + "\x01\x01",
		"n,,\x01auth=Bearer " + good + strings.Repeat("a", MaxSASLMessage) + "\x01\x01",
	} {
		s := NewOAuthBearer(v)
		_, done, err := s.Step([]byte(msg))
		if done || err == nil {
			t.Errorf("malformed %q: accepted", msg)
			continue
		}
		failed(t, "malformed", err)
	}
	// Case-insensitive scheme, 'y' flag, escaped authzid.
	for _, msg := range []string{
		"n,,\x01auth=bearer " + good + "\x01\x01",
		"y,,\x01auth=Bearer  " + good + "\x01\x01",
		"n,a=alice,\x01auth=Bearer " + good + "\x01x=y\x01\x01",
	} {
		if _, done, err := NewOAuthBearer(v).Step([]byte(msg)); err != nil || !done {
			t.Errorf("%q: %v", msg, err)
		}
	}
	var nilV *OAuthValidator
	if _, _, err := NewOAuthBearer(nilV).Step([]byte("n,,\x01auth=Bearer " + good + "\x01\x01")); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("nil validator: %v", err)
	}
}
