package auth

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	kscram "github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/xdg-go/scram"
)

// exchange drives sess with a franz-go client mechanism, as a broker relays
// SaslAuthenticate; it returns the server's error (or the client's).
func exchange(t *testing.T, sess Session, m sasl.Mechanism) error {
	t.Helper()
	cs, msg, err := m.Authenticate(context.Background(), "broker:9092")
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		reply, done, err := sess.Step(msg)
		if err != nil {
			if done {
				t.Fatal("Step returned done with an error")
			}
			return err
		}
		cdone, next, cerr := cs.Challenge(reply)
		if cerr != nil {
			t.Fatalf("client refused the server's reply %q: %v", reply, cerr)
		}
		if done {
			if !cdone {
				t.Fatalf("server done, client not")
			}
			return nil
		}
		if cdone {
			t.Fatalf("client done, server not")
		}
		msg = next
	}
	t.Fatal("exchange does not end")
	return nil
}

func usersWith(t testing.TB, user, password string) *Users {
	t.Helper()
	u := mustUsers(t)
	for _, m := range []string{ScramSHA256, ScramSHA512} {
		if err := u.SetPassword(user, m, password, 4096); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// failed checks err is a generic authentication failure, with nothing of
// the password in it.
func failed(t *testing.T, what string, err error, secrets ...string) {
	t.Helper()
	if !errors.Is(err, ErrAuthFailed) {
		t.Errorf("%s: err = %v, want ErrAuthFailed", what, err)
		return
	}
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			t.Errorf("%s: err %q shows %q", what, err, s)
		}
	}
}

func TestPlain(t *testing.T) {
	u := usersWith(t, "alice", "alice-secret")
	plainAuth := func(zid, user, pass string) sasl.Mechanism {
		return plain.Auth{Zid: zid, User: user, Pass: pass}.AsMechanism()
	}

	s := NewPlain(u)
	if err := exchange(t, s, plainAuth("", "alice", "alice-secret")); err != nil {
		t.Fatalf("good password: %v", err)
	}
	if s.Principal() != "User:alice" || !s.Expiry().IsZero() {
		t.Errorf("Principal = %q, Expiry = %v", s.Principal(), s.Expiry())
	}
	if _, _, err := s.Step([]byte("\x00alice\x00alice-secret")); err == nil {
		t.Error("a second message after success was accepted")
	}

	s = NewPlain(u)
	if err := exchange(t, s, plainAuth("alice", "alice", "alice-secret")); err != nil || s.Principal() != "User:alice" {
		t.Errorf("authzid == authcid: %v", err)
	}
	s = NewPlain(u)
	failed(t, "wrong password", exchange(t, s, plainAuth("", "alice", "alice-secreT")), "alice-secre")
	if s.Principal() != "" {
		t.Errorf("failed PLAIN has principal %q", s.Principal())
	}
	failed(t, "unknown user", exchange(t, NewPlain(u), plainAuth("", "bob", "alice-secret")), "alice-secret")
	failed(t, "authzid mismatch", exchange(t, NewPlain(u), plainAuth("admin", "alice", "alice-secret")))

	for _, msg := range []string{
		"",
		"alice",
		"alice\x00alice-secret",
		"\x00alice\x00alice-secret\x00",
		"\x00\x00alice-secret",
		"\x00alice\x00",
		"\x00al\xffice\x00alice-secret",
		"\x00alice\x00alice-secret" + strings.Repeat("x", MaxSASLMessage),
	} {
		s := NewPlain(u)
		reply, done, err := s.Step([]byte(msg))
		if reply != nil || done {
			t.Errorf("malformed %q: reply %q, done %v", msg, reply, done)
		}
		failed(t, "malformed", err, "alice-secret")
		if _, _, err := s.Step([]byte("\x00alice\x00alice-secret")); err == nil {
			t.Errorf("a good message after a failure (%q) was accepted", msg)
		}
	}
	var nilUsers *Users
	failed(t, "nil users", exchange(t, NewPlain(nilUsers), plainAuth("", "alice", "alice-secret")))
}

func TestScramFranzGo(t *testing.T) {
	u := usersWith(t, "alice", "alice-secret")
	if err := u.SetPassword("b,o=b", ScramSHA512, "b-secret", 16384); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mech string
		m    func(kscram.Auth) sasl.Mechanism
	}{
		{ScramSHA256, kscram.Auth.AsSha256Mechanism},
		{ScramSHA512, kscram.Auth.AsSha512Mechanism},
	} {
		t.Run(c.mech, func(t *testing.T) {
			newSess := func() Session {
				s, err := NewScram(u, c.mech)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			s := newSess()
			if err := exchange(t, s, c.m(kscram.Auth{User: "alice", Pass: "alice-secret"})); err != nil {
				t.Fatalf("good password: %v", err)
			}
			if s.Principal() != "User:alice" || !s.Expiry().IsZero() {
				t.Errorf("Principal = %q", s.Principal())
			}
			if _, _, err := s.Step([]byte("c=biws,r=x,p=eA==")); err == nil {
				t.Error("a third message was accepted")
			}

			s = newSess()
			if err := exchange(t, s, c.m(kscram.Auth{Zid: "alice", User: "alice", Pass: "alice-secret"})); err != nil {
				t.Errorf("authzid == user: %v", err)
			}
			failed(t, "authzid mismatch", exchange(t, newSess(), c.m(kscram.Auth{Zid: "admin", User: "alice", Pass: "alice-secret"})))

			s = newSess()
			errWrong := exchange(t, s, c.m(kscram.Auth{User: "alice", Pass: "wrong"}))
			failed(t, "wrong password", errWrong, "wrong", "alice-secret")
			if s.Principal() != "" {
				t.Errorf("failed SCRAM has principal %q", s.Principal())
			}
			errUnknown := exchange(t, newSess(), c.m(kscram.Auth{User: "nobody", Pass: "wrong"}))
			failed(t, "unknown user", errUnknown)
			if errWrong.Error() != errUnknown.Error() {
				t.Errorf("an unknown user fails differently from a wrong password: %q vs %q", errUnknown, errWrong)
			}
			failed(t, "delegation token", exchange(t, newSess(), c.m(kscram.Auth{User: "alice", Pass: "alice-secret", IsToken: true})))

			if c.mech == ScramSHA512 {
				if err := exchange(t, newSess(), c.m(kscram.Auth{User: "b,o=b", Pass: "b-secret"})); err != nil {
					t.Errorf("escaped user name: %v", err)
				}
			} else {
				failed(t, "no credential for the mechanism", exchange(t, newSess(), c.m(kscram.Auth{User: "b,o=b", Pass: "b-secret"})))
			}
		})
	}
}

// An unknown user gets the same salt and iterations every time (no oracle
// in the server-first message) and a different one from other users.
func TestScramUnknownUserStable(t *testing.T) {
	u := usersWith(t, "alice", "pw")
	first := func(user string) string {
		s, _ := NewScram(u, ScramSHA256)
		reply, _, err := s.Step([]byte("n,,n=" + user + ",r=abc"))
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(string(reply), ",") // drop the nonce
		return rest
	}
	if a, b := first("nobody"), first("nobody"); a != b {
		t.Errorf("unknown user's salt changes: %q, %q", a, b)
	}
	if a, b := first("nobody"), first("somebody"); a == b {
		t.Errorf("two unknown users share a salt: %q", a)
	}
}

func TestScramXdgClient(t *testing.T) {
	u := usersWith(t, "alice", "pässword")
	for _, c := range []struct {
		mech string
		hg   scram.HashGeneratorFcn
	}{{ScramSHA256, scram.SHA256}, {ScramSHA512, scram.SHA512}} {
		for _, pw := range []string{"pässword", "password"} {
			cl, err := c.hg.NewClientUnprepped("alice", pw, "")
			if err != nil {
				t.Fatal(err)
			}
			conv := cl.NewConversation()
			s, err := NewScram(u, c.mech)
			if err != nil {
				t.Fatal(err)
			}
			msg, err := conv.Step("")
			if err != nil {
				t.Fatal(err)
			}
			reply, done, err := s.Step([]byte(msg))
			if err != nil || done {
				t.Fatalf("client-first: %v, %v", done, err)
			}
			if msg, err = conv.Step(string(reply)); err != nil {
				t.Fatal(err)
			}
			reply, done, err = s.Step([]byte(msg))
			if pw != "pässword" {
				failed(t, "wrong password", err)
				continue
			}
			if err != nil || !done {
				t.Fatalf("%s: client-final: %v, %v", c.mech, done, err)
			}
			if _, err := conv.Step(string(reply)); err != nil || !conv.Valid() {
				t.Errorf("%s: the client refused the server-final %q: %v", c.mech, reply, err)
			}
		}
	}
}

// A credential stored from a salted password (AlterUserScramCredentials)
// authenticates a franz-go client.
func TestScramUpsertedCredential(t *testing.T) {
	u := mustUsers(t)
	salt := []byte("kafka-salt")
	if err := u.Upsert("kafka", ScramSHA512, 4096, salt, saltedPassword(t, ScramSHA512, "kpw", salt, 4096)); err != nil {
		t.Fatal(err)
	}
	s, err := NewScram(u, ScramSHA512)
	if err != nil {
		t.Fatal(err)
	}
	if err := exchange(t, s, kscram.Auth{User: "kafka", Pass: "kpw"}.AsSha512Mechanism()); err != nil {
		t.Fatal(err)
	}
	if s.Principal() != "User:kafka" {
		t.Errorf("Principal = %q", s.Principal())
	}
}

func TestScramBadMessages(t *testing.T) {
	u := usersWith(t, "alice", "pw")
	if _, err := NewScram(u, "SCRAM-SHA-1"); !errors.Is(err, ErrUnsupportedMechanism) {
		t.Errorf("NewScram(SCRAM-SHA-1) = %v", err)
	}
	if s, err := NewScram(nil, ScramSHA256); err != nil {
		t.Errorf("NewScram(nil) = %v", err)
	} else if _, _, err := s.Step([]byte("n,,n=alice,r=abc")); err != nil {
		t.Errorf("NewScram(nil): client-first fails: %v", err)
	}
	bigNonce := strings.Repeat("N", 1025)
	for name, first := range map[string]string{
		"empty":              "",
		"garbage":            "\x00\xff\xfe garbage",
		"final before first": "c=biws,r=abcdef,p=dGhpcyBpcyBub3QgYSBwcm9vZg==",
		"no gs2 header":      "n=alice,r=abc",
		"bad gs2 flag":       "x,,n=alice,r=abc",
		"channel binding":    "p=tls-unique,,n=alice,r=abc",
		"bad authzid":        "n,b=alice,n=alice,r=abc",
		"authzid mismatch":   "n,a=bob,n=alice,r=abc",
		"bad authzid escape": "n,a=al=ice,n=alice,r=abc",
		"empty user":         "n,,n=,r=abc",
		"bad user escape":    "n,,n=al=2Xice,r=abc",
		"no nonce":           "n,,n=alice,r=",
		"nonce not r":        "n,,n=alice,x=abc",
		"nonce control":      "n,,n=alice,r=a\x01bc",
		"huge nonce":         "n,,n=alice,r=" + bigNonce,
		"mandatory ext":      "n,,m=foo,n=alice,r=abc",
		"extension":          "n,,n=alice,r=abc,foo=bar",
		"tokenauth":          "n,,n=alice,r=abc,tokenauth=true",
		"bad extension":      "n,,n=alice,r=abc,=x",
		"no extension value": "n,,n=alice,r=abc,foo",
		"bad utf8 user":      "n,,n=\xffalice,r=abc",
		"too large":          "n,,n=alice,r=abc,tokenauth=false" + strings.Repeat(",tokenauth=false", MaxSASLMessage/16),
	} {
		s, err := NewScram(u, ScramSHA256)
		if err != nil {
			t.Fatal(err)
		}
		reply, done, err := s.Step([]byte(first))
		if done || reply != nil {
			t.Errorf("%s: reply %q, done %v", name, reply, done)
		}
		failed(t, name, err)
		if _, _, err := s.Step([]byte("n,,n=alice,r=abc")); err == nil {
			t.Errorf("%s: a message after a failure was accepted", name)
		}
	}

	// Ignored extension, 'y' flag: fine.
	for _, first := range []string{"n,,n=alice,r=abc,tokenauth=false", "y,,n=alice,r=abc", "n,a=alice,n=alice,r=" + strings.Repeat("N", 1024)} {
		s, _ := NewScram(u, ScramSHA256)
		if _, _, err := s.Step([]byte(first)); err != nil {
			t.Errorf("%q: %v", first, err)
		}
	}

	// Bad client-final messages after a good client-first.
	for name, final := range map[string]string{
		"repeat first":   "n,,n=alice,r=abc",
		"garbage":        "\xff\x00garbage,,,",
		"empty":          "",
		"wrong nonce":    "c=biws,r=abcWRONG,p=dGhpcyBpcyBub3QgYSBwcm9vZg==",
		"bad binding":    "c=eHl6,r=%s,p=dGhpcyBpcyBub3QgYSBwcm9vZg==",
		"short proof":    "c=biws,r=%s,p=dGhpcw==",
		"bad proof b64":  "c=biws,r=%s,p=!!!",
		"no proof":       "c=biws,r=%s",
		"wrong proof":    "c=biws,r=%s,p=" + strings.Repeat("A", 43) + "=",
		"too large":      "c=biws,r=%s,p=" + strings.Repeat("A", MaxSASLMessage),
		"proof not last": "c=biws,r=%s,p=dGhpcw==,x=y",
	} {
		s, _ := NewScram(u, ScramSHA256)
		reply, _, err := s.Step([]byte("n,,n=alice,r=abc"))
		if err != nil {
			t.Fatal(err)
		}
		nonce := strings.TrimPrefix(strings.Split(string(reply), ",")[0], "r=")
		msg := strings.Replace(final, "%s", nonce, 1)
		reply, done, err := s.Step([]byte(msg))
		if done || reply != nil {
			t.Errorf("final %s: reply %q, done %v", name, reply, done)
		}
		failed(t, "final "+name, err)
		if s.Principal() != "" {
			t.Errorf("final %s: principal %q", name, s.Principal())
		}
		if _, _, err := s.Step([]byte(msg)); err == nil {
			t.Errorf("final %s: a third message was accepted", name)
		}
	}
}

func TestScramNoPanicOnReuse(t *testing.T) {
	u := usersWith(t, "alice", "pw")
	s, _ := NewScram(u, ScramSHA512)
	for range 5 {
		if _, done, err := s.Step(nil); err == nil || done {
			t.Fatal("a nil message was accepted")
		}
	}
	if !bytes.Equal([]byte(s.Principal()), nil) {
		t.Error("principal set")
	}
}
