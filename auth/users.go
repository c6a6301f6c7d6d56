package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/xdg-go/scram"
)

// SCRAM credentials, in Kafka's DescribeUserScramCredentials /
// AlterUserScramCredentials model: per user and mechanism a salt, an
// iteration count, and the StoredKey and ServerKey of RFC 5802. Neither the
// password nor the salted password is kept.
//
// Passwords are not SASLprepped: Kafka (ScramFormatter) and its clients
// (franz-go, librdkafka, the Java client) derive from the password's UTF-8
// bytes as they are, so SetPassword and CheckPlain do the same.

const (
	ScramSHA256 = "SCRAM-SHA-256"
	ScramSHA512 = "SCRAM-SHA-512"

	// MinIterations is the fewest PBKDF2 iterations a credential may have
	// (Kafka refuses fewer).
	MinIterations = 4096
	// MaxIterations is the most (Kafka's upper bound).
	MaxIterations = 16384
)

// maxSaltLen bounds a salt (it goes into every server-first message).
const maxSaltLen = 1024

// usersVersion is the version of Marshal's JSON.
const usersVersion = 1

// ScramMechanismCode maps a mechanism name to Kafka's wire code (1 =
// SCRAM-SHA-256, 2 = SCRAM-SHA-512); 0 if unknown.
func ScramMechanismCode(name string) int8 {
	switch name {
	case ScramSHA256:
		return 1
	case ScramSHA512:
		return 2
	}
	return 0
}

// ScramMechanismName maps Kafka's wire code to the mechanism name; "" if
// unknown.
func ScramMechanismName(code int8) string {
	switch code {
	case 1:
		return ScramSHA256
	case 2:
		return ScramSHA512
	}
	return ""
}

// scramHash is the hash of a mechanism and its size.
func scramHash(mechanism string) (scram.HashGeneratorFcn, int, bool) {
	switch mechanism {
	case ScramSHA256:
		return scram.SHA256, 32, true
	case ScramSHA512:
		return scram.SHA512, 64, true
	}
	return nil, 0, false
}

// CredentialInfo is what DescribeUserScramCredentials shows (never keys).
type CredentialInfo struct {
	Mechanism  string
	Iterations int32
}

var (
	// ErrNoCredential: the user has no credential for the mechanism
	// (Kafka's RESOURCE_NOT_FOUND).
	ErrNoCredential = errors.New("no such SCRAM credential")
	// ErrUnsupportedMechanism: not SCRAM-SHA-256 nor SCRAM-SHA-512
	// (Kafka's UNSUPPORTED_SASL_MECHANISM).
	ErrUnsupportedMechanism = errors.New("unsupported SCRAM mechanism")
	// ErrUnacceptableCredential: an empty user, iterations out of range, a
	// bad salt or salted password (Kafka's UNACCEPTABLE_CREDENTIAL).
	ErrUnacceptableCredential = errors.New("unacceptable SCRAM credential")
	// ErrDuplicateCredential: one batch alters a user's credential for a
	// mechanism twice (Kafka's DUPLICATE_RESOURCE).
	ErrDuplicateCredential = errors.New("a user credential cannot be altered twice in the same request")
)

// credential is one user's credential for one mechanism. Its slices are
// never modified once stored (states share them).
type credential struct {
	Salt       []byte `json:"salt"`
	Iterations int    `json:"iterations"`
	StoredKey  []byte `json:"stored_key"`
	ServerKey  []byte `json:"server_key"`
}

// userCreds is user → mechanism → credential. A state is never modified
// once published: a change builds the next state (sharing what it keeps).
type userCreds map[string]map[string]credential

// usersFile is Marshal's JSON.
type usersFile struct {
	Version int                              `json:"version"`
	Users   map[string]map[string]credential `json:"users"`
}

// Users holds SCRAM credentials. Safe for concurrent use; the zero value
// is an empty set.
type Users struct {
	mu      sync.RWMutex
	creds   userCreds
	persist func(b []byte) error

	dummyOnce sync.Once
	dummy     credential // CheckPlain's stand-in for an unknown user
	secret    []byte     // keys the SCRAM stand-in credentials of unknown users and plainOK's tags

	plainMu sync.Mutex
	plainOK map[string]plainLogin // user → the last PLAIN password verified, as a keyed tag
}

// LoadUsers reads what Marshal wrote; nil or empty is no users. Input that
// is not valid (unknown version, mechanism or field, a credential Upsert
// would refuse) is an error.
func LoadUsers(b []byte) (*Users, error) {
	u := &Users{creds: userCreds{}}
	if len(bytes.TrimSpace(b)) == 0 {
		return u, nil
	}
	var f usersFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("SCRAM users: %w", err)
	}
	if dec.More() {
		return nil, errors.New("SCRAM users: data after the JSON object")
	}
	if f.Version != usersVersion {
		return nil, fmt.Errorf("SCRAM users: unsupported version %d (want %d)", f.Version, usersVersion)
	}
	for user, mechs := range f.Users {
		if len(mechs) == 0 {
			continue
		}
		m := make(map[string]credential, len(mechs))
		for mech, c := range mechs {
			if err := validateCredential(user, mech, c.Iterations, c.Salt); err != nil {
				return nil, fmt.Errorf("SCRAM users: user %q: %w", user, err)
			}
			_, size, _ := scramHash(mech)
			if len(c.StoredKey) != size || len(c.ServerKey) != size {
				return nil, fmt.Errorf("SCRAM users: user %q: %s keys must be %d bytes", user, mech, size)
			}
			m[mech] = c
		}
		u.creds[user] = m
	}
	return u, nil
}

// SetPersist sets the function that saves the credentials: every change
// calls it, under the write lock, with what Marshal would return after the
// change, before the change is visible; if it fails the change is not
// applied. fn must not call back into u.
func (u *Users) SetPersist(fn func(b []byte) error) {
	u.mu.Lock()
	u.persist = fn
	u.mu.Unlock()
}

// Marshal is the credentials as versioned JSON (salts, iterations and the
// derived keys; no password nor salted password).
func (u *Users) Marshal() []byte {
	if u == nil {
		return marshalUsers(nil)
	}
	u.mu.RLock()
	defer u.mu.RUnlock()
	return marshalUsers(u.creds)
}

func marshalUsers(c userCreds) []byte {
	f := usersFile{Version: usersVersion, Users: c}
	if f.Users == nil {
		f.Users = userCreds{}
	}
	b, err := json.Marshal(f)
	if err != nil {
		panic("auth: marshal SCRAM users: " + err.Error()) // only strings, ints and bytes
	}
	return b
}

// validateCredential checks what every credential must satisfy; the error
// is user-facing.
func validateCredential(user, mechanism string, iterations int, salt []byte) error {
	if user == "" {
		return fmt.Errorf("%w: username must not be empty", ErrUnacceptableCredential)
	}
	if !utf8.ValidString(user) {
		return fmt.Errorf("%w: username must be valid UTF-8", ErrUnacceptableCredential)
	}
	if _, _, ok := scramHash(mechanism); !ok {
		return fmt.Errorf("%w: %q", ErrUnsupportedMechanism, mechanism)
	}
	if iterations < MinIterations {
		return fmt.Errorf("%w: too few iterations (%d; the minimum is %d)", ErrUnacceptableCredential, iterations, MinIterations)
	}
	if iterations > MaxIterations {
		return fmt.Errorf("%w: too many iterations (%d; the maximum is %d)", ErrUnacceptableCredential, iterations, MaxIterations)
	}
	if len(salt) == 0 {
		return fmt.Errorf("%w: salt must not be empty", ErrUnacceptableCredential)
	}
	if len(salt) > maxSaltLen {
		return fmt.Errorf("%w: salt longer than %d bytes", ErrUnacceptableCredential, maxSaltLen)
	}
	return nil
}

// fromSalted validates an upsertion and derives its credential from the
// salted password (RFC 5802: ClientKey = HMAC(SaltedPassword, "Client
// Key"), StoredKey = H(ClientKey), ServerKey = HMAC(SaltedPassword,
// "Server Key")).
func fromSalted(user, mechanism string, iterations int, salt, saltedPassword []byte) (credential, error) {
	if err := validateCredential(user, mechanism, iterations, salt); err != nil {
		return credential{}, err
	}
	hg, size, _ := scramHash(mechanism)
	if len(saltedPassword) != size {
		return credential{}, fmt.Errorf("%w: the salted password must be %d bytes for %s", ErrUnacceptableCredential, size, mechanism)
	}
	mac := hmac.New(hg, saltedPassword)
	mac.Write([]byte("Client Key"))
	clientKey := mac.Sum(nil)
	h := hg()
	h.Write(clientKey)
	storedKey := h.Sum(nil)
	mac = hmac.New(hg, saltedPassword)
	mac.Write([]byte("Server Key"))
	return credential{
		Salt:       bytes.Clone(salt),
		Iterations: iterations,
		StoredKey:  storedKey,
		ServerKey:  mac.Sum(nil),
	}, nil
}

// commitLocked persists next and makes it the state. u.mu is held.
func (u *Users) commitLocked(next userCreds) error {
	if u.persist != nil {
		if err := u.persist(marshalUsers(next)); err != nil {
			return fmt.Errorf("persisting SCRAM credentials: %w", err)
		}
	}
	u.creds = next
	return nil
}

// with is the state with user's credentials replaced by m (removed if m is
// empty).
func (c userCreds) with(user string, m map[string]credential) userCreds {
	next := maps.Clone(c)
	if next == nil {
		next = userCreds{}
	}
	if len(m) == 0 {
		delete(next, user)
	} else {
		next[user] = m
	}
	return next
}

// Upsert stores a credential from a salted password (what
// AlterUserScramCredentials carries). It validates: user not empty,
// mechanism known, iterations in [MinIterations, MaxIterations], salt not
// empty (nor over 1 KiB), the salted password as long as the hash. The error
// is user-facing.
func (u *Users) Upsert(user, mechanism string, iterations int, salt, saltedPassword []byte) error {
	c, err := fromSalted(user, mechanism, iterations, salt, saltedPassword)
	if err != nil {
		return err
	}
	return u.put(user, mechanism, c)
}

func (u *Users) put(user, mechanism string, c credential) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	m := maps.Clone(u.creds[user])
	if m == nil {
		m = map[string]credential{}
	}
	m[mechanism] = c
	return u.commitLocked(u.creds.with(user, m))
}

// SaltSize is the salt length SetPassword and the stand-in credentials
// use: kadm's (and so `synapse user`'s) choice, so a stand-in looks like a
// credential made with the defaults.
const SaltSize = 24

// SetPassword stores a credential for password: a random SaltSize-byte
// salt, the keys derived by xdg-go/scram (PBKDF2, no SASLprep, as Kafka).
func (u *Users) SetPassword(user, mechanism, password string, iterations int) error {
	salt := make([]byte, SaltSize)
	rand.Read(salt)
	if err := validateCredential(user, mechanism, iterations, salt); err != nil {
		return err
	}
	if password == "" {
		return fmt.Errorf("%w: password must not be empty", ErrUnacceptableCredential)
	}
	hg, _, _ := scramHash(mechanism)
	cl, err := hg.NewClientUnprepped(user, password, "")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnacceptableCredential, err)
	}
	sc, err := cl.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: iterations})
	if err != nil {
		return fmt.Errorf("%w: deriving keys: %v", ErrUnacceptableCredential, err)
	}
	return u.put(user, mechanism, credential{Salt: salt, Iterations: iterations, StoredKey: sc.StoredKey, ServerKey: sc.ServerKey})
}

// Delete removes user's credential for mechanism; ErrNoCredential if there
// is none.
func (u *Users) Delete(user, mechanism string) error {
	if err := validateDeletion(user, mechanism); err != nil {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.creds[user][mechanism]; !ok {
		return fmt.Errorf("%w: user %q has no %s credential", ErrNoCredential, user, mechanism)
	}
	m := maps.Clone(u.creds[user])
	delete(m, mechanism)
	return u.commitLocked(u.creds.with(user, m))
}

func validateDeletion(user, mechanism string) error {
	if user == "" {
		return fmt.Errorf("%w: username must not be empty", ErrUnacceptableCredential)
	}
	if _, _, ok := scramHash(mechanism); !ok {
		return fmt.Errorf("%w: %q", ErrUnsupportedMechanism, mechanism)
	}
	return nil
}

// ScramDeletion is one deletion of an AlterUserScramCredentials batch.
type ScramDeletion struct{ User, Mechanism string }

// ScramUpsertion is one upsertion of an AlterUserScramCredentials batch.
type ScramUpsertion struct {
	User, Mechanism string
	Iterations      int
	Salt            []byte
	SaltedPassword  []byte
}

// Apply performs a batch of deletions then upsertions with one persist.
// delErrs and upErrs hold each entry's error, in the order of dels and ups.
//
// As Kafka answers AlterUserScramCredentials per user, a user's changes
// apply together or not at all: if one of a user's entries fails (validation
// as Upsert / Delete, ErrNoCredential, ErrDuplicateCredential when the batch
// names the same user and mechanism twice), every entry of that user gets
// that user's first error (deletions first, then upsertions) and none of
// them applies. Other users' changes apply.
//
// err is a persist failure: then nothing applied, and every entry that had
// no error of its own holds err too.
func (u *Users) Apply(dels []ScramDeletion, ups []ScramUpsertion) (delErrs, upErrs []error, err error) {
	delErrs = make([]error, len(dels))
	upErrs = make([]error, len(ups))
	type key struct{ user, mech string }
	seen := make(map[key]int, len(dels)+len(ups))
	for _, d := range dels {
		seen[key{d.User, d.Mechanism}]++
	}
	for _, up := range ups {
		seen[key{up.User, up.Mechanism}]++
	}
	// Upsertions are validated (and their keys derived) before the lock.
	creds := make([]credential, len(ups))
	for i, d := range dels {
		if e := validateDeletion(d.User, d.Mechanism); e != nil {
			delErrs[i] = e
		} else if seen[key{d.User, d.Mechanism}] > 1 {
			delErrs[i] = ErrDuplicateCredential
		}
	}
	for i, up := range ups {
		c, e := fromSalted(up.User, up.Mechanism, up.Iterations, up.Salt, up.SaltedPassword)
		if e == nil && seen[key{up.User, up.Mechanism}] > 1 {
			e = ErrDuplicateCredential
		}
		creds[i], upErrs[i] = c, e
	}

	u.mu.Lock()
	defer u.mu.Unlock()
	for i, d := range dels {
		if delErrs[i] == nil {
			if _, ok := u.creds[d.User][d.Mechanism]; !ok {
				delErrs[i] = fmt.Errorf("%w: user %q has no %s credential", ErrNoCredential, d.User, d.Mechanism)
			}
		}
	}
	// A user's first error fails all of the user's entries.
	userErr := map[string]error{}
	for i, d := range dels {
		if delErrs[i] != nil && userErr[d.User] == nil {
			userErr[d.User] = delErrs[i]
		}
	}
	for i, up := range ups {
		if upErrs[i] != nil && userErr[up.User] == nil {
			userErr[up.User] = upErrs[i]
		}
	}
	for i, d := range dels {
		if e := userErr[d.User]; e != nil && delErrs[i] == nil {
			delErrs[i] = e
		}
	}
	for i, up := range ups {
		if e := userErr[up.User]; e != nil && upErrs[i] == nil {
			upErrs[i] = e
		}
	}

	changed := map[string]map[string]credential{} // user → its next credentials
	mechsOf := func(user string) map[string]credential {
		m, ok := changed[user]
		if !ok {
			m = maps.Clone(u.creds[user])
			if m == nil {
				m = map[string]credential{}
			}
			changed[user] = m
		}
		return m
	}
	for i, d := range dels {
		if delErrs[i] == nil {
			delete(mechsOf(d.User), d.Mechanism)
		}
	}
	for i, up := range ups {
		if upErrs[i] == nil {
			mechsOf(up.User)[up.Mechanism] = creds[i]
		}
	}
	if len(changed) == 0 {
		return delErrs, upErrs, nil
	}
	next := maps.Clone(u.creds)
	if next == nil {
		next = userCreds{}
	}
	for user, m := range changed {
		if len(m) == 0 {
			delete(next, user)
		} else {
			next[user] = m
		}
	}
	if err := u.commitLocked(next); err != nil {
		for i := range delErrs {
			if delErrs[i] == nil {
				delErrs[i] = err
			}
		}
		for i := range upErrs {
			if upErrs[i] == nil {
				upErrs[i] = err
			}
		}
		return delErrs, upErrs, err
	}
	return delErrs, upErrs, nil
}

// Describe is what DescribeUserScramCredentials shows: for users nil (or
// empty, as Kafka) every user with a credential, otherwise those named; a
// user without one is absent from the map. Each user's credentials are in
// mechanism order (SCRAM-SHA-256 first).
func (u *Users) Describe(users []string) map[string][]CredentialInfo {
	out := map[string][]CredentialInfo{}
	if u == nil {
		return out
	}
	u.mu.RLock()
	defer u.mu.RUnlock()
	add := func(user string) {
		m := u.creds[user]
		if len(m) == 0 {
			return
		}
		infos := make([]CredentialInfo, 0, len(m))
		for _, mech := range slices.Sorted(maps.Keys(m)) {
			infos = append(infos, CredentialInfo{Mechanism: mech, Iterations: int32(m[mech].Iterations)})
		}
		out[user] = infos
	}
	if len(users) == 0 {
		for user := range u.creds {
			add(user)
		}
		return out
	}
	for _, user := range users {
		add(user)
	}
	return out
}

// Lookup is user's stored credential for mechanism (Salt in KeyFactors is
// the raw salt).
func (u *Users) Lookup(user, mechanism string) (scram.StoredCredentials, bool) {
	if u == nil {
		return scram.StoredCredentials{}, false
	}
	u.mu.RLock()
	c, ok := u.creds[user][mechanism]
	u.mu.RUnlock()
	if !ok {
		return scram.StoredCredentials{}, false
	}
	return scram.StoredCredentials{
		KeyFactors: scram.KeyFactors{Salt: string(c.Salt), Iters: c.Iterations},
		StoredKey:  bytes.Clone(c.StoredKey),
		ServerKey:  bytes.Clone(c.ServerKey),
	}, true
}

// initSecrets makes the stand-in credentials of unknown users.
func (u *Users) initSecrets() {
	u.dummyOnce.Do(func() {
		salt := make([]byte, SaltSize)
		rand.Read(salt)
		key := make([]byte, 64)
		rand.Read(key)
		u.dummy = credential{Salt: salt, Iterations: MinIterations, StoredKey: key}
		u.secret = make([]byte, 32)
		rand.Read(u.secret)
	})
}

// plainLogin is a PLAIN password CheckPlain verified: an HMAC of it under
// the process's random secret (never the password), valid while the
// credential it was checked against is the user's.
type plainLogin struct {
	storedKey []byte
	tag       [sha256.Size]byte
}

// plainCacheMax bounds plainOK (emptied when full).
const plainCacheMax = 4096

func (u *Users) plainTag(password string) (t [sha256.Size]byte) {
	mac := hmac.New(sha256.New, u.secret)
	mac.Write([]byte(password))
	copy(t[:], mac.Sum(nil))
	return t
}

// CheckPlain reports whether password is user's: it derives the keys from
// password with the salt and iterations of user's SCRAM-SHA-512 credential
// (else SCRAM-SHA-256) and compares StoredKey in constant time. For an
// unknown user it does the same work against a stand-in credential (4096
// iterations, SHA-512) and returns false. A password verified before
// against the same credential is recognised by its keyed tag instead: a
// client reconnecting with PLAIN costs one HMAC, not 4096 (PBKDF2); a
// wrong password always pays the full derivation.
func (u *Users) CheckPlain(user, password string) bool {
	if u == nil {
		return false
	}
	u.initSecrets()
	u.mu.RLock()
	mech := ScramSHA512
	c, ok := u.creds[user][ScramSHA512]
	if !ok {
		mech = ScramSHA256
		c, ok = u.creds[user][ScramSHA256]
	}
	u.mu.RUnlock()
	if !ok {
		mech, c = ScramSHA512, u.dummy
	}
	if password == "" {
		return false
	}
	tag := u.plainTag(password)
	if ok {
		u.plainMu.Lock()
		seen, hit := u.plainOK[user]
		u.plainMu.Unlock()
		if hit && bytes.Equal(seen.storedKey, c.StoredKey) && hmac.Equal(seen.tag[:], tag[:]) {
			return true
		}
	}
	hg, _, _ := scramHash(mech)
	cl, err := hg.NewClientUnprepped(user, password, "")
	if err != nil {
		return false
	}
	sc, err := cl.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(c.Salt), Iters: c.Iterations})
	if err != nil {
		return false
	}
	if !ok || subtle.ConstantTimeCompare(sc.StoredKey, c.StoredKey) != 1 {
		return false
	}
	u.plainMu.Lock()
	if u.plainOK == nil || len(u.plainOK) >= plainCacheMax {
		u.plainOK = map[string]plainLogin{}
	}
	u.plainOK[user] = plainLogin{storedKey: c.StoredKey, tag: tag}
	u.plainMu.Unlock()
	return true
}

// standIn is the credential a SCRAM exchange uses for a user without one:
// fixed per user and mechanism (a salt that changed between attempts would
// tell the user does not exist), keys nobody knows, shaped as a credential
// made with the defaults (SaltSize, MinIterations: what `synapse user`,
// kadm and kafka-configs.sh make unless told otherwise; a credential made
// with other settings shows in its salt and iterations, as in Kafka). The
// exchange then fails as a wrong password does, at the client's final
// message.
func (u *Users) standIn(user, mechanism string) scram.StoredCredentials {
	u.initSecrets()
	_, size, _ := scramHash(mechanism)
	mac := hmac.New(sha256.New, u.secret)
	mac.Write([]byte(mechanism))
	mac.Write([]byte{0})
	mac.Write([]byte(user))
	salt := mac.Sum(nil)[:SaltSize]
	key := make([]byte, size)
	rand.Read(key)
	return scram.StoredCredentials{
		KeyFactors: scram.KeyFactors{Salt: string(salt), Iters: MinIterations},
		StoredKey:  key,
		ServerKey:  key,
	}
}

// Len is the number of users with at least one credential.
func (u *Users) Len() int {
	if u == nil {
		return 0
	}
	u.mu.RLock()
	defer u.mu.RUnlock()
	return len(u.creds)
}
