package auth

import (
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// The fuzz targets feed arbitrary client messages to fresh sessions: they
// must never panic, and must never succeed without the credentials.

// checkStep checks the contract of one Step.
func checkStep(t *testing.T, s Session, reply []byte, done bool, err error) {
	t.Helper()
	if err != nil {
		if done {
			t.Fatal("done with an error")
		}
		if !errors.Is(err, ErrAuthFailed) {
			t.Fatalf("error %v does not wrap ErrAuthFailed", err)
		}
		if s.Principal() != "" {
			t.Fatalf("failed session has principal %q", s.Principal())
		}
	}
	if done && !strings.HasPrefix(s.Principal(), "User:") {
		t.Fatalf("done with principal %q", s.Principal())
	}
}

func FuzzPlain(f *testing.F) {
	u := usersWith(f, "alice", "alice-secret")
	for _, seed := range []string{
		"\x00alice\x00alice-secret",
		"alice\x00alice\x00alice-secret",
		"bob\x00alice\x00alice-secret",
		"\x00alice\x00wrong",
		"\x00nobody\x00pw",
		"\x00\x00",
		"",
		"\x00alice\x00alice-secret\x00",
		"\xff\x00\xfe\x00\xfd",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		s := NewPlain(u)
		reply, done, err := s.Step(msg)
		checkStep(t, s, reply, done, err)
		if done {
			parts := bytes.Split(msg, []byte{0})
			if len(parts) != 3 || string(parts[1]) != "alice" || string(parts[2]) != "alice-secret" {
				t.Fatalf("accepted %q", msg)
			}
		}
		_, done, err = s.Step(msg)
		if done || err == nil {
			t.Fatal("a second message was accepted")
		}
	})
}

func FuzzScramClientFirst(f *testing.F) {
	u := usersWith(f, "alice", "alice-secret")
	for _, seed := range [][2]string{
		{"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL", "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="},
		{"n,a=alice,n=alice,r=abc", "c=bixhPWFsaWNlLA==,r=abc,p=AAAA"},
		{"y,,n=nobody,r=abc", "c=eSws,r=abc,p=" + strings.Repeat("A", 44)},
		{"n,,n=alice,r=abc,tokenauth=false", "c=biws,r=abc"},
		{"n,,n=alice,r=abc,tokenauth=true", ""},
		{"p=tls-unique,,n=alice,r=abc", "c=cD10bHMtdW5pcXVlLCw=,r=abc,p=AAAA"},
		{"n,,m=ext,n=alice,r=abc", "x"},
		{"c=biws,r=abc,p=AAAA", "n,,n=alice,r=abc"},
		{"n,,n=al=2Cice=3D,r=abc", "c=biws,r=,p="},
		{"", ""},
		{",,,", ",,,"},
		{"n,,n=alice,r=" + strings.Repeat("x", 1025), ""},
	} {
		f.Add([]byte(seed[0]), []byte(seed[1]))
	}
	f.Fuzz(func(t *testing.T, first, final []byte) {
		for _, mech := range []string{ScramSHA256, ScramSHA512} {
			newSess := func() (Session, []byte, error) {
				s, err := NewScram(u, mech)
				if err != nil {
					t.Fatal(err)
				}
				reply, done, err := s.Step(first)
				checkStep(t, s, reply, done, err)
				if done {
					t.Fatal("done after the client-first message")
				}
				return s, reply, err
			}
			finish := func(s Session, fin []byte) {
				reply, done, err := s.Step(fin)
				checkStep(t, s, reply, done, err)
				if done {
					t.Fatalf("SCRAM succeeded without the password: %q, %q", first, fin)
				}
				if _, done, err := s.Step(fin); done || err == nil {
					t.Fatal("a third message was accepted")
				}
			}
			s, _, err := newSess()
			finish(s, final) // an arbitrary final message
			if err != nil {
				continue
			}
			// A final message with the nonce the server chose (past the
			// nonce check, to the proof).
			s, reply, err := newSess()
			if err != nil {
				t.Fatalf("client-first accepted once, refused again: %v", err)
			}
			nonce, _, _ := strings.Cut(string(reply), ",")
			finish(s, []byte("c=biws,"+nonce+",p="+base64.StdEncoding.EncodeToString(final)))
		}
	})
}

func FuzzOAuthBearer(f *testing.F) {
	dir := f.TempDir()
	path := filepath.Join(dir, "jwks.json")
	b := jwksJSON(f, pubJWK(testECKey(), "ec1", ""), pubJWK(testEdKey(), "ed1", ""))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		f.Fatal(err)
	}
	now := testNow
	v, err := NewOAuthValidator(OAuthConfig{JWKSFile: path, Unsecured: true, Audience: "synapse", Now: func() time.Time { return now }})
	if err != nil {
		f.Fatal(err)
	}
	good := claimsAt(now, nil)
	signed := sign(f, testECKey(), jose.ES256, "ec1", good)
	unsigned := unsecuredToken(f, good)
	for _, seed := range []struct{ msg, token string }{
		{"n,,\x01auth=Bearer " + signed + "\x01\x01", signed},
		{"n,a=alice,\x01auth=Bearer " + unsigned + "\x01x=y\x01\x01", unsigned},
		{"\x01", sign(f, testEdKey(), jose.EdDSA, "ed1", good)},
		{"", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4IiwiZXhwIjoxZTMwMH0."},
		{"y,,\x01\x01", "a.b.c"},
		{"n,,\x01auth=Bearer\x01\x01", "...."},
		{"n,a=a=2C,\x01auth=bearer  x\x01\x01", "eyJhbGciOiJSUzI1NiIsImtpZCI6ImVjMSJ9.e30.AAAA"},
		{"p=x,,\x01auth=Bearer x\x01\x01", "="},
	} {
		f.Add([]byte(seed.msg), seed.token)
	}
	f.Fuzz(func(t *testing.T, msg []byte, token string) {
		s := NewOAuthBearer(v)
		reply, done, err := s.Step(msg)
		checkStep(t, s, reply, done, err)
		if _, done2, err2 := s.Step([]byte{1}); done2 || err2 == nil {
			t.Fatal("a second message was accepted")
		}

		// The token text in a well-formed message, and to Validate.
		s = NewOAuthBearer(v)
		reply, done, err = s.Step([]byte("n,,\x01auth=Bearer " + token + "\x01\x01"))
		checkStep(t, s, reply, done, err)
		if err != nil && reply != nil && !bytes.Equal(reply, invalidTokenJSON) {
			t.Fatalf("error reply %q", reply)
		}
		p, exp, err := v.Validate(token)
		if err != nil {
			if p != "" || !exp.IsZero() {
				t.Fatalf("failed Validate returned %q, %v", p, exp)
			}
			if !strings.HasPrefix(err.Error(), "invalid_token: ") {
				t.Fatalf("Validate error %q", err)
			}
		} else if !strings.HasPrefix(p, "User:") || len(p) == len("User:") || exp.IsZero() {
			t.Fatalf("Validate = %q, %v", p, exp)
		}
	})
}
