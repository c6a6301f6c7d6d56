package auth

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// aclClusterName is the name of the one CLUSTER resource.
const aclClusterName = "kafka-cluster"

// aclVersion is the version of the Marshal format.
const aclVersion = 1

// ACL is one access control entry bound to a resource pattern.
type ACL struct {
	ResourceType kmsg.ACLResourceType        // TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID
	ResourceName string                      // "*" literal = every resource of the type; CLUSTER's name is "kafka-cluster"
	PatternType  kmsg.ACLResourcePatternType // LITERAL or PREFIXED only (stored ACLs)
	Principal    string                      // "User:alice", "User:*" = everyone
	Host         string                      // "*" or an IP literal
	Operation    kmsg.ACLOperation           // READ..IDEMPOTENT_WRITE or ALL
	Permission   kmsg.ACLPermissionType      // ALLOW or DENY
}

// ACLFilter selects ACLs (DescribeAcls, DeleteAcls). Nil pointer / ANY enum
// = match anything. PatternType MATCH selects the ACLs that would apply to a
// resource named ResourceName: literal with that name, literal "*", and
// prefixed patterns the name starts with.
type ACLFilter struct {
	ResourceType kmsg.ACLResourceType        // ANY matches all types
	ResourceName *string                     // nil = any
	PatternType  kmsg.ACLResourcePatternType // ANY, MATCH, LITERAL, PREFIXED
	Principal    *string
	Host         *string
	Operation    kmsg.ACLOperation      // ANY matches all
	Permission   kmsg.ACLPermissionType // ANY matches all
}

func (f *ACLFilter) matches(a *ACL) bool {
	switch {
	case f.ResourceType != kmsg.ACLResourceTypeAny && f.ResourceType != a.ResourceType,
		f.Principal != nil && *f.Principal != a.Principal,
		f.Host != nil && *f.Host != a.Host,
		f.Operation != kmsg.ACLOperationAny && f.Operation != a.Operation,
		f.Permission != kmsg.ACLPermissionTypeAny && f.Permission != a.Permission:
		return false
	}
	switch f.PatternType {
	case kmsg.ACLResourcePatternTypeAny:
	case kmsg.ACLResourcePatternTypeMatch:
		if f.ResourceName == nil {
			return true
		}
		name := *f.ResourceName
		if a.PatternType == kmsg.ACLResourcePatternTypePrefixed {
			return strings.HasPrefix(name, a.ResourceName)
		}
		return a.ResourceName == name || a.ResourceName == "*"
	default:
		if f.PatternType != a.PatternType {
			return false
		}
	}
	return f.ResourceName == nil || *f.ResourceName == a.ResourceName
}

// ValidateACL reports why a cannot be created, or nil if it can: its enums
// must be concrete (no UNKNOWN, ANY or MATCH), its names and host non-empty,
// its principal "Type:name", and CLUSTER's name "kafka-cluster". As in Kafka,
// the operation is not checked against the resource type.
func ValidateACL(a ACL) error {
	switch {
	case a.ResourceType < kmsg.ACLResourceTypeTopic || a.ResourceType > kmsg.ACLResourceTypeTransactionalId:
		return fmt.Errorf("invalid resource type %v", a.ResourceType)
	case a.PatternType != kmsg.ACLResourcePatternTypeLiteral && a.PatternType != kmsg.ACLResourcePatternTypePrefixed:
		return fmt.Errorf("invalid pattern type %v", a.PatternType)
	case a.Operation < kmsg.ACLOperationAll || a.Operation > kmsg.ACLOperationIdempotentWrite:
		return fmt.Errorf("invalid operation %v", a.Operation)
	case a.Permission != kmsg.ACLPermissionTypeAllow && a.Permission != kmsg.ACLPermissionTypeDeny:
		return fmt.Errorf("invalid permission type %v", a.Permission)
	case a.ResourceName == "":
		return errors.New("resource name must not be empty")
	case a.ResourceType == kmsg.ACLResourceTypeCluster && a.ResourceName != aclClusterName:
		return errors.New("the only valid name for the CLUSTER resource is " + aclClusterName)
	case a.Host == "":
		return errors.New("host must not be empty")
	}
	if typ, name, ok := strings.Cut(a.Principal, ":"); !ok || typ == "" || name == "" {
		return fmt.Errorf("principal %q is not of the form Type:name", a.Principal)
	}
	return nil
}

func aclCompare(a, b ACL) int {
	return cmp.Or(
		cmp.Compare(a.ResourceType, b.ResourceType),
		cmp.Compare(a.ResourceName, b.ResourceName),
		cmp.Compare(a.PatternType, b.PatternType),
		cmp.Compare(a.Principal, b.Principal),
		cmp.Compare(a.Host, b.Host),
		cmp.Compare(a.Operation, b.Operation),
		cmp.Compare(a.Permission, b.Permission),
	)
}

// aclEntry is an ACL as Authorize sees it, its resource pattern implied by
// where it is indexed.
type aclEntry struct {
	principal, host string
	op              kmsg.ACLOperation
	perm            kmsg.ACLPermissionType
}

type aclPrefix struct {
	name    string
	entries []aclEntry
}

// aclTypeIndex holds the ACLs of one resource type.
type aclTypeIndex struct {
	literal  map[string][]aclEntry // by exact name, "*" excluded
	wildcard []aclEntry            // literal "*"
	prefixed []aclPrefix           // by name, sorted
}

// aclSnapshot is an immutable ACL set: the sorted list and its index.
type aclSnapshot struct {
	list  []ACL
	types [kmsg.ACLResourceTypeUser + 1]aclTypeIndex // by resource type
}

var aclEmpty aclSnapshot

// aclBuild indexes list, which is sorted and has no duplicates.
func aclBuild(list []ACL) *aclSnapshot {
	s := &aclSnapshot{list: list}
	for _, a := range list {
		t := &s.types[a.ResourceType]
		e := aclEntry{a.Principal, a.Host, a.Operation, a.Permission}
		switch {
		case a.PatternType == kmsg.ACLResourcePatternTypePrefixed:
			if n := len(t.prefixed); n > 0 && t.prefixed[n-1].name == a.ResourceName {
				t.prefixed[n-1].entries = append(t.prefixed[n-1].entries, e)
			} else {
				t.prefixed = append(t.prefixed, aclPrefix{a.ResourceName, []aclEntry{e}})
			}
		case a.ResourceName == "*":
			t.wildcard = append(t.wildcard, e)
		default:
			if t.literal == nil {
				t.literal = make(map[string][]aclEntry)
			}
			t.literal[a.ResourceName] = append(t.literal[a.ResourceName], e)
		}
	}
	return s
}

// ACLs is the set of ACLs. Safe for concurrent use; the zero value is empty.
// Authorization reads an immutable snapshot, taking no lock.
type ACLs struct {
	mu      sync.Mutex // serializes changes
	persist func(b []byte) error
	snap    atomic.Pointer[aclSnapshot]
}

func (a *ACLs) load() *aclSnapshot {
	if a != nil {
		if s := a.snap.Load(); s != nil {
			return s
		}
	}
	return &aclEmpty
}

type aclJSON struct {
	ResourceType string `json:"resource_type"`
	ResourceName string `json:"resource_name"`
	PatternType  string `json:"pattern_type"`
	Principal    string `json:"principal"`
	Host         string `json:"host"`
	Operation    string `json:"operation"`
	Permission   string `json:"permission"`
}

type aclFile struct {
	Version int       `json:"version"`
	ACLs    []aclJSON `json:"acls"`
}

// LoadACLs parses bytes returned by Marshal; nil or empty is no ACLs.
func LoadACLs(b []byte) (*ACLs, error) {
	a := new(ACLs)
	if len(bytes.TrimSpace(b)) == 0 {
		return a, nil
	}
	var f aclFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("acls: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("acls: trailing data")
	}
	if f.Version != aclVersion {
		return nil, fmt.Errorf("acls: unsupported version %d", f.Version)
	}
	list := make([]ACL, 0, len(f.ACLs))
	for i, j := range f.ACLs {
		x := ACL{ResourceName: j.ResourceName, Principal: j.Principal, Host: j.Host}
		var errs [4]error
		x.ResourceType, errs[0] = kmsg.ParseACLResourceType(j.ResourceType)
		x.PatternType, errs[1] = kmsg.ParseACLResourcePatternType(j.PatternType)
		x.Operation, errs[2] = kmsg.ParseACLOperation(j.Operation)
		x.Permission, errs[3] = kmsg.ParseACLPermissionType(j.Permission)
		err := errors.Join(errs[:]...)
		if err == nil {
			err = ValidateACL(x)
		}
		if err != nil {
			return nil, fmt.Errorf("acls: entry %d: %w", i, err)
		}
		list = append(list, x)
	}
	slices.SortFunc(list, aclCompare)
	a.snap.Store(aclBuild(slices.Compact(list)))
	return a, nil
}

// SetPersist installs fn to make changes durable: Create and Delete call it
// with the new Marshal bytes under the write lock before the change becomes
// visible; if it fails the change is not applied.
func (a *ACLs) SetPersist(fn func(b []byte) error) {
	a.mu.Lock()
	a.persist = fn
	a.mu.Unlock()
}

// Marshal returns the current set as LoadACLs reads it (stable order).
func (a *ACLs) Marshal() []byte { return aclMarshal(a.load().list) }

func aclMarshal(list []ACL) []byte {
	f := aclFile{Version: aclVersion, ACLs: make([]aclJSON, len(list))}
	for i, x := range list {
		f.ACLs[i] = aclJSON{
			x.ResourceType.String(), x.ResourceName, x.PatternType.String(),
			x.Principal, x.Host, x.Operation.String(), x.Permission.String(),
		}
	}
	b, err := json.Marshal(f)
	if err != nil {
		panic(err) // strings only: cannot fail
	}
	return b
}

// commit persists list (sorted, no duplicates) and then publishes it.
// a.mu must be held.
func (a *ACLs) commit(list []ACL) error {
	if a.persist != nil {
		if err := a.persist(aclMarshal(list)); err != nil {
			return err
		}
	}
	a.snap.Store(aclBuild(list))
	return nil
}

// Create adds acls; duplicates of existing entries are no-ops. errs[i] is
// acls[i]'s validation error or nil; err is a persist failure (then nothing
// was added).
func (a *ACLs) Create(acls []ACL) (errs []error, err error) {
	errs = make([]error, len(acls))
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.load().list
	next := slices.Clone(cur)
	for i, x := range acls {
		if errs[i] = ValidateACL(x); errs[i] == nil {
			next = append(next, x)
		}
	}
	slices.SortFunc(next, aclCompare)
	if next = slices.Compact(next); len(next) == len(cur) {
		return errs, nil // nothing new
	}
	return errs, a.commit(next)
}

// Delete removes every ACL matching each filter; matched[i] lists what
// filters[i] removed (an ACL matching several filters is listed under the
// first). One persist covers all filters; on its failure nothing is removed.
func (a *ACLs) Delete(filters []ACLFilter) (matched [][]ACL, err error) {
	matched = make([][]ACL, len(filters))
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.load().list
	next := make([]ACL, 0, len(cur))
outer:
	for i := range cur {
		for j := range filters {
			if filters[j].matches(&cur[i]) {
				matched[j] = append(matched[j], cur[i])
				continue outer
			}
		}
		next = append(next, cur[i])
	}
	if len(next) == len(cur) {
		return matched, nil
	}
	if err := a.commit(next); err != nil {
		return nil, err
	}
	return matched, nil
}

// Describe returns the ACLs matching f (stable order).
func (a *ACLs) Describe(f ACLFilter) []ACL {
	var out []ACL
	for _, x := range a.load().list {
		if f.matches(&x) {
			out = append(out, x)
		}
	}
	return out
}

// Len is the number of ACLs.
func (a *ACLs) Len() int { return len(a.load().list) }

// Authorizer decides requests. A nil *Authorizer allows everything.
type Authorizer struct {
	acls         *ACLs
	superUsers   map[string]struct{}
	allowIfNoACL bool
}

// NewAuthorizer returns an authorizer over acls (nil = none). superUsers are
// principals ("User:admin") that bypass ACLs; allowIfNoACL is Kafka's
// allow.everyone.if.no.acl.found.
func NewAuthorizer(acls *ACLs, superUsers []string, allowIfNoACL bool) *Authorizer {
	z := &Authorizer{acls: acls, superUsers: make(map[string]struct{}, len(superUsers)), allowIfNoACL: allowIfNoACL}
	for _, u := range superUsers {
		z.superUsers[u] = struct{}{}
	}
	return z
}

// ACLs returns the store (may be nil).
func (z *Authorizer) ACLs() *ACLs {
	if z == nil {
		return nil
	}
	return z.acls
}

// Authorize reports whether principal connecting from host may do op on the
// resource rt/name. It takes no lock and does not allocate.
func (z *Authorizer) Authorize(principal, host string, op kmsg.ACLOperation, rt kmsg.ACLResourceType, name string) bool {
	if z == nil {
		return true
	}
	if _, ok := z.superUsers[principal]; ok {
		return true
	}
	s := z.acls.load()
	if rt < 0 || int(rt) >= len(s.types) {
		return false
	}
	t := &s.types[rt]
	found, allowed := false, false
	check := func(es []aclEntry) bool { // false: denied
		found = found || len(es) > 0
		for i := range es {
			e := &es[i]
			if e.principal != principal && e.principal != "User:*" || e.host != host && e.host != "*" {
				continue
			}
			if e.perm == kmsg.ACLPermissionTypeDeny {
				if e.op == op || e.op == kmsg.ACLOperationAll {
					return false
				}
			} else if !allowed && aclImplies(e.op, op) {
				allowed = true
			}
		}
		return true
	}
	if !check(t.literal[name]) || !check(t.wildcard) {
		return false
	}
	for i := range t.prefixed {
		if p := &t.prefixed[i]; strings.HasPrefix(name, p.name) && !check(p.entries) {
			return false
		}
	}
	if !found {
		return z.allowIfNoACL
	}
	return allowed
}

// aclImplies reports whether an ALLOW of granted permits op.
func aclImplies(granted, op kmsg.ACLOperation) bool {
	switch {
	case granted == op, granted == kmsg.ACLOperationAll:
		return true
	case op == kmsg.ACLOperationDescribe:
		switch granted {
		case kmsg.ACLOperationRead, kmsg.ACLOperationWrite, kmsg.ACLOperationDelete, kmsg.ACLOperationAlter:
			return true
		}
	case op == kmsg.ACLOperationDescribeConfigs:
		return granted == kmsg.ACLOperationAlterConfigs
	}
	return false
}
