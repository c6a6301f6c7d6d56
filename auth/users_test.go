package auth

import (
	"bytes"
	"crypto/pbkdf2"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"
	"testing"

	"github.com/xdg-go/scram"
)

// saltedPassword is what a Kafka client's AlterUserScramCredentials
// carries: PBKDF2(password, salt, iterations).
func saltedPassword(t testing.TB, mechanism, password string, salt []byte, iterations int) []byte {
	t.Helper()
	h, size := sha256.New, sha256.Size
	if mechanism == ScramSHA512 {
		h, size = func() hash.Hash { return sha512.New() }, sha512.Size
	}
	sp, err := pbkdf2.Key(h, password, salt, iterations, size)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

func mustUsers(t testing.TB) *Users {
	t.Helper()
	u, err := LoadUsers(nil)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestScramMechanismCodes(t *testing.T) {
	for _, c := range []struct {
		name string
		code int8
	}{{ScramSHA256, 1}, {ScramSHA512, 2}} {
		if got := ScramMechanismCode(c.name); got != c.code {
			t.Errorf("ScramMechanismCode(%q) = %d, want %d", c.name, got, c.code)
		}
		if got := ScramMechanismName(c.code); got != c.name {
			t.Errorf("ScramMechanismName(%d) = %q, want %q", c.code, got, c.name)
		}
	}
	if ScramMechanismCode("SCRAM-SHA-1") != 0 || ScramMechanismCode("") != 0 || ScramMechanismName(0) != "" || ScramMechanismName(3) != "" || ScramMechanismName(-1) != "" {
		t.Error("unknown mechanisms must map to 0 / \"\"")
	}
}

func TestUpsertValidation(t *testing.T) {
	u := mustUsers(t)
	salt := []byte("0123456789abcdef")
	sp256 := saltedPassword(t, ScramSHA256, "pw", salt, MinIterations)
	for _, c := range []struct {
		name       string
		user, mech string
		iters      int
		salt, sp   []byte
		want       error
	}{
		{"empty user", "", ScramSHA256, 4096, salt, sp256, ErrUnacceptableCredential},
		{"bad utf8 user", "\xff", ScramSHA256, 4096, salt, sp256, ErrUnacceptableCredential},
		{"unknown mechanism", "alice", "SCRAM-SHA-1", 4096, salt, sp256, ErrUnsupportedMechanism},
		{"too few iterations", "alice", ScramSHA256, 4095, salt, sp256, ErrUnacceptableCredential},
		{"zero iterations", "alice", ScramSHA256, 0, salt, sp256, ErrUnacceptableCredential},
		{"too many iterations", "alice", ScramSHA256, 16385, salt, sp256, ErrUnacceptableCredential},
		{"empty salt", "alice", ScramSHA256, 4096, nil, sp256, ErrUnacceptableCredential},
		{"huge salt", "alice", ScramSHA256, 4096, make([]byte, 1025), sp256, ErrUnacceptableCredential},
		{"short salted password", "alice", ScramSHA256, 4096, salt, sp256[:31], ErrUnacceptableCredential},
		{"512 with a 256 salted password", "alice", ScramSHA512, 4096, salt, sp256, ErrUnacceptableCredential},
	} {
		err := u.Upsert(c.user, c.mech, c.iters, c.salt, c.sp)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: Upsert = %v, want %v", c.name, err, c.want)
		}
	}
	if u.Len() != 0 {
		t.Fatalf("refused upserts stored %d users", u.Len())
	}
	for _, iters := range []int{MinIterations, MaxIterations} {
		if err := u.Upsert("alice", ScramSHA256, iters, salt, sp256); err != nil {
			t.Errorf("Upsert with %d iterations: %v", iters, err)
		}
	}
	if err := u.SetPassword("bob", ScramSHA256, "pw", 4095); !errors.Is(err, ErrUnacceptableCredential) {
		t.Errorf("SetPassword with 4095 iterations = %v", err)
	}
	if err := u.SetPassword("bob", ScramSHA256, "", 4096); !errors.Is(err, ErrUnacceptableCredential) {
		t.Errorf("SetPassword with an empty password = %v", err)
	}
	if err := u.SetPassword("bob", "PLAIN", "pw", 4096); !errors.Is(err, ErrUnsupportedMechanism) {
		t.Errorf("SetPassword with PLAIN = %v", err)
	}
}

// An upsert from a salted password (what Kafka clients send) is the same
// credential as xdg-go/scram derives from the password.
func TestUpsertDerivesKeys(t *testing.T) {
	for _, mech := range []string{ScramSHA256, ScramSHA512} {
		u := mustUsers(t)
		salt := []byte("some salt")
		if err := u.Upsert("alice", mech, 8192, salt, saltedPassword(t, mech, "secret", salt, 8192)); err != nil {
			t.Fatal(err)
		}
		got, ok := u.Lookup("alice", mech)
		if !ok {
			t.Fatal("Lookup: no credential")
		}
		hg, _, _ := scramHash(mech)
		cl, _ := hg.NewClientUnprepped("alice", "secret", "")
		want, err := cl.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: 8192})
		if err != nil {
			t.Fatal(err)
		}
		if got.Salt != want.Salt || got.Iters != want.Iters || !bytes.Equal(got.StoredKey, want.StoredKey) || !bytes.Equal(got.ServerKey, want.ServerKey) {
			t.Errorf("%s: Lookup = %+v, want %+v", mech, got, want)
		}
		if !u.CheckPlain("alice", "secret") || u.CheckPlain("alice", "Secret") {
			t.Errorf("%s: CheckPlain wrong", mech)
		}
		if _, ok := u.Lookup("alice", otherMech(mech)); ok {
			t.Errorf("Lookup of the other mechanism found a credential")
		}
	}
}

func otherMech(m string) string {
	if m == ScramSHA256 {
		return ScramSHA512
	}
	return ScramSHA256
}

func TestCheckPlain(t *testing.T) {
	u := mustUsers(t)
	if err := u.SetPassword("alice", ScramSHA512, "alice-512", 4096); err != nil {
		t.Fatal(err)
	}
	if err := u.SetPassword("alice", ScramSHA256, "alice-256", 4096); err != nil {
		t.Fatal(err)
	}
	if err := u.SetPassword("bob", ScramSHA256, "bob-pw", 4096); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		user, pw string
		want     bool
	}{
		{"alice", "alice-512", true}, // SHA-512 preferred
		{"alice", "alice-256", false},
		{"bob", "bob-pw", true}, // only SHA-256
		{"bob", "bob-pw ", false},
		{"bob", "", false},
		{"carol", "bob-pw", false},
		{"", "", false},
	} {
		if got := u.CheckPlain(c.user, c.pw); got != c.want {
			t.Errorf("CheckPlain(%q, %q) = %v, want %v", c.user, c.pw, got, c.want)
		}
	}
	var nilUsers *Users
	if nilUsers.CheckPlain("alice", "x") {
		t.Error("nil Users accepted a password")
	}
	var zero Users
	if zero.CheckPlain("alice", "x") || zero.Len() != 0 {
		t.Error("zero Users accepted a password")
	}
	if err := zero.SetPassword("alice", ScramSHA256, "x", 4096); err != nil || !zero.CheckPlain("alice", "x") {
		t.Errorf("zero Users: SetPassword = %v, CheckPlain false", err)
	}
}

func TestMarshalLoadRoundTrip(t *testing.T) {
	u := mustUsers(t)
	salt := []byte("a salt of sixteen")
	const pw = "correct horse battery staple"
	sp := saltedPassword(t, ScramSHA512, pw, salt, 5000)
	if err := u.Upsert("alice", ScramSHA512, 5000, salt, sp); err != nil {
		t.Fatal(err)
	}
	if err := u.SetPassword("alice", ScramSHA256, pw, 4096); err != nil {
		t.Fatal(err)
	}
	if err := u.SetPassword("b,o=b", ScramSHA256, "other", 16384); err != nil {
		t.Fatal(err)
	}
	b := u.Marshal()
	for _, secret := range [][]byte{
		[]byte(pw),
		sp,
		[]byte(base64.StdEncoding.EncodeToString(sp)),
		[]byte(base64.RawStdEncoding.EncodeToString(sp)),
		[]byte(base64.URLEncoding.EncodeToString(sp)),
		[]byte(hex.EncodeToString(sp)),
	} {
		if bytes.Contains(b, secret) {
			t.Fatalf("Marshal output contains a secret: %s", b)
		}
	}
	if !bytes.Contains(b, []byte(`"version":1`)) {
		t.Errorf("Marshal output is not versioned: %s", b)
	}
	v, err := LoadUsers(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(v.Marshal(), b) {
		t.Errorf("round trip changed the JSON:\n%s\n%s", b, v.Marshal())
	}
	if !v.CheckPlain("alice", pw) || !v.CheckPlain("b,o=b", "other") || v.CheckPlain("alice", "other") {
		t.Error("loaded credentials do not check")
	}
	want := map[string][]CredentialInfo{
		"alice": {{ScramSHA256, 4096}, {ScramSHA512, 5000}},
		"b,o=b": {{ScramSHA256, 16384}},
	}
	if got := v.Describe(nil); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Describe = %v, want %v", got, want)
	}

	for _, in := range [][]byte{nil, {}, []byte("  \n")} {
		e, err := LoadUsers(in)
		if err != nil || e.Len() != 0 {
			t.Errorf("LoadUsers(%q) = %v, %v", in, e, err)
		}
	}
	empty := mustUsers(t).Marshal()
	if e, err := LoadUsers(empty); err != nil || e.Len() != 0 {
		t.Errorf("LoadUsers(%s) = %v", empty, err)
	}
}

func TestLoadUsersBad(t *testing.T) {
	key32 := base64.StdEncoding.EncodeToString(make([]byte, 32))
	cred := func(mech, salt string, iters int, key string) string {
		return fmt.Sprintf(`{"version":1,"users":{"alice":{%q:{"salt":%q,"iterations":%d,"stored_key":%q,"server_key":%q}}}}`, mech, salt, iters, key, key)
	}
	good := cred(ScramSHA256, "c2FsdA==", 4096, key32)
	if u, err := LoadUsers([]byte(good)); err != nil || u.Len() != 1 {
		t.Fatalf("LoadUsers(good) = %v", err)
	}
	for name, in := range map[string]string{
		"garbage":         "not json",
		"array":           "[]",
		"no version":      `{"users":{}}`,
		"version 2":       `{"version":2,"users":{}}`,
		"unknown field":   `{"version":1,"users":{},"passwords":{}}`,
		"trailing data":   good + `{}`,
		"unknown mech":    cred("SCRAM-SHA-1", "c2FsdA==", 4096, key32),
		"few iterations":  cred(ScramSHA256, "c2FsdA==", 1000, key32),
		"empty salt":      cred(ScramSHA256, "", 4096, key32),
		"bad base64":      cred(ScramSHA256, "!!", 4096, key32),
		"short key":       cred(ScramSHA256, "c2FsdA==", 4096, base64.StdEncoding.EncodeToString(make([]byte, 31))),
		"256 key for 512": cred(ScramSHA512, "c2FsdA==", 4096, key32),
		"empty user":      `{"version":1,"users":{"":{"SCRAM-SHA-256":{"salt":"c2FsdA==","iterations":4096,"stored_key":"` + key32 + `","server_key":"` + key32 + `"}}}}`,
		"credential field": `{"version":1,"users":{"alice":{"SCRAM-SHA-256":{"salt":"c2FsdA==","iterations":4096,"stored_key":"` + key32 +
			`","server_key":"` + key32 + `","password":"x"}}}}`,
	} {
		if _, err := LoadUsers([]byte(in)); err == nil {
			t.Errorf("%s: LoadUsers accepted %s", name, in)
		}
	}
}

func TestDeleteAndDescribe(t *testing.T) {
	u := mustUsers(t)
	for _, user := range []string{"alice", "bob"} {
		if err := u.SetPassword(user, ScramSHA256, "pw", 4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.SetPassword("alice", ScramSHA512, "pw", 8192); err != nil {
		t.Fatal(err)
	}
	if got := u.Describe([]string{"alice", "nobody"}); len(got) != 1 || len(got["alice"]) != 2 || got["alice"][1] != (CredentialInfo{ScramSHA512, 8192}) {
		t.Errorf("Describe(alice, nobody) = %v", got)
	}
	if got := u.Describe([]string{}); len(got) != 2 {
		t.Errorf("Describe(empty) = %v, want every user", got)
	}
	if err := u.Delete("alice", ScramSHA512); err != nil {
		t.Fatal(err)
	}
	if err := u.Delete("alice", ScramSHA512); !errors.Is(err, ErrNoCredential) {
		t.Errorf("second Delete = %v, want ErrNoCredential", err)
	}
	if err := u.Delete("nobody", ScramSHA256); !errors.Is(err, ErrNoCredential) {
		t.Errorf("Delete(nobody) = %v, want ErrNoCredential", err)
	}
	if err := u.Delete("alice", "PLAIN"); !errors.Is(err, ErrUnsupportedMechanism) {
		t.Errorf("Delete(PLAIN) = %v", err)
	}
	if err := u.Delete("", ScramSHA256); !errors.Is(err, ErrUnacceptableCredential) {
		t.Errorf("Delete(\"\") = %v", err)
	}
	if err := u.Delete("bob", ScramSHA256); err != nil {
		t.Fatal(err)
	}
	if got := u.Describe(nil); len(got) != 1 || len(got["alice"]) != 1 {
		t.Errorf("Describe after deletes = %v", got)
	}
	if u.Len() != 1 {
		t.Errorf("Len = %d, want 1 (a user without credentials is gone)", u.Len())
	}
	if strings.Contains(string(u.Marshal()), "bob") {
		t.Errorf("a user without credentials is still marshalled: %s", u.Marshal())
	}
}

func TestApply(t *testing.T) {
	u := mustUsers(t)
	var persists int
	var last []byte
	u.SetPersist(func(b []byte) error { persists++; last = b; return nil })
	for _, user := range []string{"alice", "bob"} {
		if err := u.SetPassword(user, ScramSHA256, user+"-old", 4096); err != nil {
			t.Fatal(err)
		}
	}
	persists = 0
	salt := []byte("salty")
	up := func(user, mech, pw string, iters int) ScramUpsertion {
		return ScramUpsertion{User: user, Mechanism: mech, Iterations: iters, Salt: salt, SaltedPassword: saltedPassword(t, mech, pw, salt, 4096)}
	}
	dels := []ScramDeletion{
		{"alice", ScramSHA256},  // 0: ok
		{"carol", ScramSHA256},  // 1: no credential
		{"dave", "SCRAM-SHA-1"}, // 2: unknown mechanism
		{"bob", ScramSHA256},    // 3: duplicate of ups[2]
	}
	ups := []ScramUpsertion{
		up("alice", ScramSHA512, "alice-new", 4096), // 0: ok
		up("erin", ScramSHA256, "erin-pw", 4096),    // 1: ok
		up("bob", ScramSHA256, "bob-new", 4096),     // 2: duplicate
		up("frank", ScramSHA256, "frank-pw", 100),   // 3: too few iterations
		up("erin", ScramSHA512, "erin-pw", 4096),    // 4: ok
		up("carol", ScramSHA512, "carol-pw", 4096),  // 5: carol's deletion failed: not applied
	}
	delErrs, upErrs, err := u.Apply(dels, ups)
	if err != nil {
		t.Fatal(err)
	}
	wantDel := []error{nil, ErrNoCredential, ErrUnsupportedMechanism, ErrDuplicateCredential}
	wantUp := []error{nil, nil, ErrDuplicateCredential, ErrUnacceptableCredential, nil, ErrNoCredential}
	for i, w := range wantDel {
		if (w == nil) != (delErrs[i] == nil) || (w != nil && !errors.Is(delErrs[i], w)) {
			t.Errorf("delErrs[%d] = %v, want %v", i, delErrs[i], w)
		}
	}
	for i, w := range wantUp {
		if (w == nil) != (upErrs[i] == nil) || (w != nil && !errors.Is(upErrs[i], w)) {
			t.Errorf("upErrs[%d] = %v, want %v", i, upErrs[i], w)
		}
	}
	if persists != 1 {
		t.Errorf("Apply persisted %d times, want 1", persists)
	}
	if !bytes.Equal(last, u.Marshal()) {
		t.Error("the persisted bytes are not the new state")
	}
	want := map[string][]CredentialInfo{
		"alice": {{ScramSHA512, 4096}},
		"bob":   {{ScramSHA256, 4096}},
		"erin":  {{ScramSHA256, 4096}, {ScramSHA512, 4096}},
	}
	if got := u.Describe(nil); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Describe = %v, want %v", got, want)
	}
	if !u.CheckPlain("alice", "alice-new") || !u.CheckPlain("bob", "bob-old") || !u.CheckPlain("erin", "erin-pw") {
		t.Error("credentials after Apply do not check")
	}

	// Nothing valid: no persist.
	persists = 0
	delErrs, _, err = u.Apply([]ScramDeletion{{"nobody", ScramSHA256}}, nil)
	if err != nil || !errors.Is(delErrs[0], ErrNoCredential) || persists != 0 {
		t.Errorf("Apply(nothing valid) = %v, %v, %d persists", delErrs, err, persists)
	}
	if d, up, err := u.Apply(nil, nil); err != nil || len(d) != 0 || len(up) != 0 || persists != 0 {
		t.Errorf("Apply(nil, nil) = %v, %v, %v", d, up, err)
	}
}

func TestPersistFailureRollsBack(t *testing.T) {
	u := mustUsers(t)
	if err := u.SetPassword("alice", ScramSHA256, "pw", 4096); err != nil {
		t.Fatal(err)
	}
	before := u.Marshal()
	boom := errors.New("disk full")
	calls := 0
	u.SetPersist(func(b []byte) error { calls++; return boom })

	salt := []byte("salt")
	sp := saltedPassword(t, ScramSHA256, "new", salt, 4096)
	delErrs, upErrs, err := u.Apply(
		[]ScramDeletion{{"alice", ScramSHA256}, {"nobody", ScramSHA256}},
		[]ScramUpsertion{{User: "bob", Mechanism: ScramSHA256, Iterations: 4096, Salt: salt, SaltedPassword: sp}})
	if !errors.Is(err, boom) {
		t.Fatalf("Apply err = %v, want the persist error", err)
	}
	if !errors.Is(delErrs[0], boom) || !errors.Is(delErrs[1], ErrNoCredential) || !errors.Is(upErrs[0], boom) {
		t.Errorf("Apply per-entry errors = %v, %v", delErrs, upErrs)
	}
	if err := u.Upsert("bob", ScramSHA256, 4096, salt, sp); !errors.Is(err, boom) {
		t.Errorf("Upsert = %v", err)
	}
	if err := u.SetPassword("bob", ScramSHA256, "x", 4096); !errors.Is(err, boom) {
		t.Errorf("SetPassword = %v", err)
	}
	if err := u.Delete("alice", ScramSHA256); !errors.Is(err, boom) {
		t.Errorf("Delete = %v", err)
	}
	if calls != 4 {
		t.Errorf("persist called %d times, want 4", calls)
	}
	if after := u.Marshal(); !bytes.Equal(before, after) {
		t.Errorf("failed persists changed the state:\n%s\n%s", before, after)
	}
	if !u.CheckPlain("alice", "pw") || u.CheckPlain("bob", "new") {
		t.Error("failed persists changed the credentials")
	}

	u.SetPersist(nil)
	if err := u.Upsert("bob", ScramSHA256, 4096, salt, sp); err != nil || !u.CheckPlain("bob", "new") {
		t.Errorf("Upsert without persist = %v", err)
	}
}

func TestUsersConcurrent(t *testing.T) {
	u := mustUsers(t)
	var mu sync.Mutex
	var saved []byte
	u.SetPersist(func(b []byte) error { mu.Lock(); saved = b; mu.Unlock(); return nil })
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprintf("user%d", i)
			for j := range 3 {
				pw := fmt.Sprintf("pw%d", j)
				if err := u.SetPassword(user, ScramSHA256, pw, 4096); err != nil {
					t.Error(err)
					return
				}
				if !u.CheckPlain(user, pw) {
					t.Errorf("CheckPlain(%s, %s) = false", user, pw)
				}
				u.Describe(nil)
				u.Marshal()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if !bytes.Equal(saved, u.Marshal()) || u.Len() != 4 {
		t.Errorf("last persist is not the state (%d users)", u.Len())
	}
}

// A PLAIN password verified once is recognised again without PBKDF2, and
// only while the credential it was checked against stands.
func TestCheckPlainRemembersOnlyTheCurrentCredential(t *testing.T) {
	u := &Users{}
	if err := u.SetPassword("p", ScramSHA512, "old", MinIterations); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // derived, then remembered
		if !u.CheckPlain("p", "old") {
			t.Fatalf("the right password refused (try %d)", i)
		}
	}
	if u.CheckPlain("p", "olD") || u.CheckPlain("p", "") {
		t.Fatal("a wrong password accepted after the right one was remembered")
	}
	if err := u.SetPassword("p", ScramSHA512, "new", MinIterations); err != nil {
		t.Fatal(err)
	}
	if u.CheckPlain("p", "old") {
		t.Fatal("the old password still logs in after a change")
	}
	if !u.CheckPlain("p", "new") {
		t.Fatal("the new password refused")
	}
	if err := u.Delete("p", ScramSHA512); err != nil {
		t.Fatal(err)
	}
	if u.CheckPlain("p", "new") {
		t.Fatal("a deleted user logs in")
	}
}
