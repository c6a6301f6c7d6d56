package auth

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"hash"
	"strconv"
	"strings"
	"testing"
)

// oldLibrdkafkaFinal builds the client-final message librdkafka < 2.6.1
// sends: the client nonce twice, the proof over the message as sent.
func oldLibrdkafkaFinal(t *testing.T, h func() hash.Hash, pass, clientFirst, serverFirst string, dupNonce bool) string {
	t.Helper()
	_, bare, _ := splitGS2(clientFirst)
	cn, _ := fieldValue(bare, "r")
	full, _ := fieldValue(serverFirst, "r")
	saltB64, _ := fieldValue(serverFirst, "s")
	itersS, _ := fieldValue(serverFirst, "i")
	salt, _ := base64.StdEncoding.DecodeString(saltB64)
	iters, _ := strconv.Atoi(itersS)
	salted, err := pbkdf2.Key(h, pass, salt, iters, h().Size())
	if err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(h, salted)
	mac.Write([]byte("Client Key"))
	clientKey := mac.Sum(nil)
	hh := h()
	hh.Write(clientKey)
	storedKey := hh.Sum(nil)
	nonce := full
	if dupNonce {
		nonce = cn + full
	}
	without := "c=biws,r=" + nonce
	mac = hmac.New(h, storedKey)
	mac.Write([]byte(bare + "," + serverFirst + "," + without))
	sig := mac.Sum(nil)
	for i := range clientKey {
		clientKey[i] ^= sig[i]
	}
	return without + ",p=" + base64.StdEncoding.EncodeToString(clientKey)
}

// The old librdkafka form logs in with the right password (as Kafka 3.8.1
// to 3.9 allowed), and only with it; other nonce mismatches still fail.
func TestScramOldLibrdkafkaNonce(t *testing.T) {
	u := &Users{}
	for _, m := range []string{ScramSHA256, ScramSHA512} {
		if err := u.SetPassword("kc", m, "kc-pw", 4096); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		mech string
		h    func() hash.Hash
	}{{ScramSHA256, sha256.New}, {ScramSHA512, sha512.New}} {
		for _, c := range []struct {
			pass     string
			dup      bool
			wantDone bool
		}{
			{"kc-pw", true, true},   // old librdkafka
			{"kc-pw", false, true},  // RFC 5802
			{"wrong", true, false},  // old form, wrong password
			{"wrong", false, false}, // RFC form, wrong password
		} {
			s, err := NewScram(u, tc.mech)
			if err != nil {
				t.Fatal(err)
			}
			first := "n,,n=kc,r=rOprNGfwEbeRWgbNEkqO"
			sf, _, err := s.Step([]byte(first))
			if err != nil {
				t.Fatal(err)
			}
			final := oldLibrdkafkaFinal(t, tc.h, c.pass, first, string(sf), c.dup)
			reply, done, err := s.Step([]byte(final))
			if done != c.wantDone || (err == nil) != c.wantDone {
				t.Errorf("%s pass %q dup %v: done %v err %v", tc.mech, c.pass, c.dup, done, err)
			}
			if c.wantDone && !strings.HasPrefix(string(reply), "v=") {
				t.Errorf("%s: server-final %q", tc.mech, reply)
			}
		}
		// Another nonce (a replay of an old exchange's) is refused.
		s, _ := NewScram(u, tc.mech)
		first := "n,,n=kc,r=abc"
		sf, _, _ := s.Step([]byte(first))
		final := oldLibrdkafkaFinal(t, tc.h, "kc-pw", first, string(sf), true)
		final = strings.Replace(final, "r=abcabc", "r=abcabd", 1)
		if _, done, err := s.Step([]byte(final)); done || err == nil {
			t.Errorf("%s: a changed nonce was accepted", tc.mech)
		}
	}
}
