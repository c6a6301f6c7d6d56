package auth

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	aclTopic    = kmsg.ACLResourceTypeTopic
	aclGroup    = kmsg.ACLResourceTypeGroup
	aclCluster  = kmsg.ACLResourceTypeCluster
	aclLit      = kmsg.ACLResourcePatternTypeLiteral
	aclPre      = kmsg.ACLResourcePatternTypePrefixed
	aclAllow    = kmsg.ACLPermissionTypeAllow
	aclDeny     = kmsg.ACLPermissionTypeDeny
	aclRead     = kmsg.ACLOperationRead
	aclWrite    = kmsg.ACLOperationWrite
	aclDescribe = kmsg.ACLOperationDescribe
)

// aclT is a topic ACL for principal on any host.
func aclT(name string, pt kmsg.ACLResourcePatternType, principal string, op kmsg.ACLOperation, perm kmsg.ACLPermissionType) ACL {
	return ACL{aclTopic, name, pt, principal, "*", op, perm}
}

func aclStore(t testing.TB, acls ...ACL) *ACLs {
	t.Helper()
	s := new(ACLs)
	errs, err := s.Create(acls)
	if err != nil || errors.Join(errs...) != nil {
		t.Fatalf("Create: %v %v", errs, err)
	}
	return s
}

func TestAuthorizeACL(t *testing.T) {
	const alice, bob = "User:alice", "User:bob"
	type check struct {
		principal, host string
		op              kmsg.ACLOperation
		rt              kmsg.ACLResourceType
		name            string
		want            bool
	}
	for _, tc := range []struct {
		name         string
		acls         []ACL
		super        []string
		allowIfNoACL bool
		checks       []check
	}{
		{
			name: "literal allow",
			acls: []ACL{aclT("t", aclLit, alice, aclRead, aclAllow)},
			checks: []check{
				{alice, "10.0.0.1", aclRead, aclTopic, "t", true},
				{bob, "10.0.0.1", aclRead, aclTopic, "t", false},
				{alice, "10.0.0.1", aclWrite, aclTopic, "t", false},
				{alice, "10.0.0.1", aclRead, aclTopic, "u", false},
				{alice, "10.0.0.1", aclRead, aclGroup, "t", false},
			},
		},
		{
			name: "deny wins",
			acls: []ACL{
				aclT("*", aclLit, "User:*", kmsg.ACLOperationAll, aclAllow),
				aclT("t", aclLit, alice, aclWrite, aclDeny),
				aclT("secret", aclPre, "User:*", kmsg.ACLOperationAll, aclDeny),
			},
			checks: []check{
				{alice, "h", aclWrite, aclTopic, "t", false},
				{alice, "h", aclRead, aclTopic, "t", true},
				{bob, "h", aclWrite, aclTopic, "t", true},
				{bob, "h", aclRead, aclTopic, "secrets", false},
				{bob, "h", aclDescribe, aclTopic, "secret", false},
			},
		},
		{
			name: "deny does not imply",
			acls: []ACL{
				aclT("t", aclLit, alice, aclRead, aclDeny),
				aclT("t", aclLit, alice, kmsg.ACLOperationDescribe, aclAllow),
			},
			checks: []check{
				{alice, "h", aclRead, aclTopic, "t", false},
				{alice, "h", aclDescribe, aclTopic, "t", true},
			},
		},
		{
			name: "wildcard principal host and resource",
			acls: []ACL{
				{aclTopic, "*", aclLit, "User:*", "10.0.0.1", aclRead, aclAllow},
				{aclGroup, "g", aclLit, alice, "10.0.0.2", aclRead, aclAllow},
			},
			checks: []check{
				{bob, "10.0.0.1", aclRead, aclTopic, "any", true},
				{bob, "10.0.0.2", aclRead, aclTopic, "any", false},
				{alice, "10.0.0.2", aclRead, aclGroup, "g", true},
				{alice, "10.0.0.1", aclRead, aclGroup, "g", false},
			},
		},
		{
			name: "prefixed",
			acls: []ACL{
				aclT("app.", aclPre, alice, aclWrite, aclAllow),
				aclT("app.logs", aclPre, bob, aclRead, aclAllow),
			},
			checks: []check{
				{alice, "h", aclWrite, aclTopic, "app.orders", true},
				{alice, "h", aclWrite, aclTopic, "app.", true},
				{alice, "h", aclWrite, aclTopic, "app", false},
				{alice, "h", aclWrite, aclTopic, "other", false},
				{bob, "h", aclRead, aclTopic, "app.logs.x", true},
				{bob, "h", aclRead, aclTopic, "app.orders", false},
			},
		},
		{
			name: "implied operations",
			acls: []ACL{
				aclT("r", aclLit, alice, aclRead, aclAllow),
				aclT("w", aclLit, alice, aclWrite, aclAllow),
				aclT("d", aclLit, alice, kmsg.ACLOperationDelete, aclAllow),
				aclT("a", aclLit, alice, kmsg.ACLOperationAlter, aclAllow),
				aclT("c", aclLit, alice, kmsg.ACLOperationAlterConfigs, aclAllow),
				aclT("x", aclLit, alice, kmsg.ACLOperationCreate, aclAllow),
				aclT("all", aclLit, alice, kmsg.ACLOperationAll, aclAllow),
			},
			checks: []check{
				{alice, "h", aclDescribe, aclTopic, "r", true},
				{alice, "h", aclDescribe, aclTopic, "w", true},
				{alice, "h", aclDescribe, aclTopic, "d", true},
				{alice, "h", aclDescribe, aclTopic, "a", true},
				{alice, "h", aclDescribe, aclTopic, "x", false},
				{alice, "h", aclDescribe, aclTopic, "c", false},
				{alice, "h", kmsg.ACLOperationDescribeConfigs, aclTopic, "c", true},
				{alice, "h", kmsg.ACLOperationDescribeConfigs, aclTopic, "a", false},
				{alice, "h", aclWrite, aclTopic, "r", false},
				{alice, "h", kmsg.ACLOperationAlterConfigs, aclTopic, "all", true},
			},
		},
		{
			name:         "allow if no ACL",
			acls:         []ACL{aclT("t", aclLit, alice, aclRead, aclAllow)},
			allowIfNoACL: true,
			checks: []check{
				{bob, "h", aclRead, aclTopic, "other", true},
				{bob, "h", aclRead, aclTopic, "t", false},
				{bob, "h", aclRead, aclCluster, aclClusterName, true},
			},
		},
		{
			name: "deny if no ACL",
			checks: []check{
				{bob, "h", aclRead, aclTopic, "other", false},
				{bob, "h", aclRead, aclCluster, aclClusterName, false},
			},
		},
		{
			name:  "super user",
			acls:  []ACL{aclT("t", aclLit, "User:*", kmsg.ACLOperationAll, aclDeny)},
			super: []string{"User:admin"},
			checks: []check{
				{"User:admin", "h", aclWrite, aclTopic, "t", true},
				{"User:admin", "h", kmsg.ACLOperationAlter, aclCluster, aclClusterName, true},
				{alice, "h", aclWrite, aclTopic, "t", false},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			z := NewAuthorizer(aclStore(t, tc.acls...), tc.super, tc.allowIfNoACL)
			for _, c := range tc.checks {
				if got := z.Authorize(c.principal, c.host, c.op, c.rt, c.name); got != c.want {
					t.Errorf("Authorize(%s, %s, %v, %v, %q) = %v, want %v", c.principal, c.host, c.op, c.rt, c.name, got, c.want)
				}
			}
		})
	}
}

func TestAuthorizerNilACL(t *testing.T) {
	var z *Authorizer
	if !z.Authorize("User:x", "h", aclWrite, aclTopic, "t") || z.ACLs() != nil {
		t.Fatal("nil authorizer must allow everything")
	}
	if NewAuthorizer(nil, nil, false).Authorize("User:x", "h", aclRead, aclTopic, "t") {
		t.Fatal("no store, allowIfNoACL false: want denied")
	}
	if !NewAuthorizer(nil, nil, true).Authorize("User:x", "h", aclRead, aclTopic, "t") {
		t.Fatal("no store, allowIfNoACL true: want allowed")
	}
}

func TestACLFilter(t *testing.T) {
	str := func(s string) *string { return &s }
	all := []ACL{
		aclT("*", aclLit, "User:a", aclRead, aclAllow),
		aclT("foo", aclLit, "User:a", aclRead, aclAllow),
		aclT("foo", aclPre, "User:b", aclWrite, aclDeny),
		aclT("fo", aclPre, "User:a", aclRead, aclAllow),
		aclT("foobar", aclLit, "User:a", aclRead, aclAllow),
		aclT("bar", aclPre, "User:a", aclRead, aclAllow),
		{aclGroup, "foo", aclLit, "User:a", "10.0.0.1", aclRead, aclAllow},
	}
	anyF := ACLFilter{ResourceType: kmsg.ACLResourceTypeAny, PatternType: kmsg.ACLResourcePatternTypeAny,
		Operation: kmsg.ACLOperationAny, Permission: kmsg.ACLPermissionTypeAny}
	with := func(fn func(*ACLFilter)) ACLFilter { f := anyF; fn(&f); return f }
	for _, tc := range []struct {
		name string
		f    ACLFilter
		want []int // indexes into all
	}{
		{"any", anyF, []int{0, 1, 2, 3, 4, 5, 6}},
		{"name any pattern", with(func(f *ACLFilter) { f.ResourceName = str("foo") }), []int{1, 2, 6}},
		{"literal", with(func(f *ACLFilter) { f.ResourceName = str("foo"); f.PatternType = aclLit }), []int{1, 6}},
		{"prefixed", with(func(f *ACLFilter) { f.PatternType = aclPre }), []int{2, 3, 5}},
		{"prefixed name", with(func(f *ACLFilter) { f.ResourceName = str("foo"); f.PatternType = aclPre }), []int{2}},
		{"match", with(func(f *ACLFilter) {
			f.ResourceType = aclTopic
			f.ResourceName = str("foobar")
			f.PatternType = kmsg.ACLResourcePatternTypeMatch
		}), []int{0, 2, 3, 4}},
		{"match nil name", with(func(f *ACLFilter) { f.PatternType = kmsg.ACLResourcePatternTypeMatch }), []int{0, 1, 2, 3, 4, 5, 6}},
		{"type", with(func(f *ACLFilter) { f.ResourceType = aclGroup }), []int{6}},
		{"principal", with(func(f *ACLFilter) { f.Principal = str("User:b") }), []int{2}},
		{"host", with(func(f *ACLFilter) { f.Host = str("10.0.0.1") }), []int{6}},
		{"operation", with(func(f *ACLFilter) { f.Operation = aclWrite }), []int{2}},
		{"permission", with(func(f *ACLFilter) { f.Permission = aclDeny }), []int{2}},
		{"unknown enum matches nothing", ACLFilter{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want []ACL
			for _, i := range tc.want {
				want = append(want, all[i])
			}
			slices.SortFunc(want, aclCompare)
			s := aclStore(t, all...)
			if got := s.Describe(tc.f); !slices.Equal(got, want) {
				t.Errorf("Describe = %v\nwant %v", got, want)
			}
			m, err := s.Delete([]ACLFilter{tc.f})
			if err != nil || !slices.Equal(m[0], want) {
				t.Errorf("Delete = %v, %v\nwant %v", m, err, want)
			}
			if s.Len() != len(all)-len(want) || len(s.Describe(tc.f)) != 0 {
				t.Errorf("after Delete: Len %d, still matching %v", s.Len(), s.Describe(tc.f))
			}
		})
	}
}

func TestACLDeleteFirstFilter(t *testing.T) {
	s := aclStore(t, aclT("a", aclLit, "User:x", aclRead, aclAllow), aclT("b", aclLit, "User:x", aclRead, aclAllow))
	name := "a"
	f := ACLFilter{ResourceType: kmsg.ACLResourceTypeAny, PatternType: kmsg.ACLResourcePatternTypeAny,
		Operation: kmsg.ACLOperationAny, Permission: kmsg.ACLPermissionTypeAny}
	fa := f
	fa.ResourceName = &name
	m, err := s.Delete([]ACLFilter{fa, f, fa})
	if err != nil || len(m[0]) != 1 || len(m[1]) != 1 || len(m[2]) != 0 || m[1][0].ResourceName != "b" || s.Len() != 0 {
		t.Fatalf("Delete = %v, %v; Len %d", m, err, s.Len())
	}
}

func TestACLCreate(t *testing.T) {
	s := new(ACLs)
	var persisted int
	s.SetPersist(func([]byte) error { persisted++; return nil })
	a := aclT("t", aclLit, "User:a", aclRead, aclAllow)
	bad := aclT("", aclLit, "User:a", aclRead, aclAllow)
	errs, err := s.Create([]ACL{a, bad, a})
	if err != nil || errs[0] != nil || errs[1] == nil || errs[2] != nil || s.Len() != 1 || persisted != 1 {
		t.Fatalf("Create = %v, %v; Len %d, persisted %d", errs, err, s.Len(), persisted)
	}
	errs, err = s.Create([]ACL{a})
	if err != nil || errs[0] != nil || s.Len() != 1 || persisted != 1 {
		t.Fatalf("duplicate Create = %v, %v; Len %d, persisted %d", errs, err, s.Len(), persisted)
	}
}

func TestValidateACL(t *testing.T) {
	ok := aclT("t", aclLit, "User:a", aclRead, aclAllow)
	if err := ValidateACL(ok); err != nil {
		t.Fatal(err)
	}
	if err := ValidateACL(ACL{aclCluster, aclClusterName, aclLit, "User:a", "*", aclRead, aclAllow}); err != nil {
		t.Fatalf("READ on CLUSTER: %v", err)
	}
	for _, tc := range []struct {
		want string
		fn   func(*ACL)
	}{
		{"resource type", func(a *ACL) { a.ResourceType = kmsg.ACLResourceTypeAny }},
		{"resource type", func(a *ACL) { a.ResourceType = kmsg.ACLResourceTypeUnknown }},
		{"resource type", func(a *ACL) { a.ResourceType = 42 }},
		{"pattern type", func(a *ACL) { a.PatternType = kmsg.ACLResourcePatternTypeMatch }},
		{"pattern type", func(a *ACL) { a.PatternType = kmsg.ACLResourcePatternTypeAny }},
		{"operation", func(a *ACL) { a.Operation = kmsg.ACLOperationAny }},
		{"operation", func(a *ACL) { a.Operation = kmsg.ACLOperationCreateTokens }},
		{"permission", func(a *ACL) { a.Permission = kmsg.ACLPermissionTypeAny }},
		{"resource name", func(a *ACL) { a.ResourceName = "" }},
		{"CLUSTER", func(a *ACL) { a.ResourceType = aclCluster }},
		{"principal", func(a *ACL) { a.Principal = "alice" }},
		{"principal", func(a *ACL) { a.Principal = "User:" }},
		{"principal", func(a *ACL) { a.Principal = ":alice" }},
		{"host", func(a *ACL) { a.Host = "" }},
	} {
		a := ok
		tc.fn(&a)
		if err := ValidateACL(a); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateACL(%+v) = %v, want an error about %s", a, err, tc.want)
		}
	}
}

func TestACLMarshalLoad(t *testing.T) {
	s := aclStore(t,
		aclT("t", aclPre, "User:a", kmsg.ACLOperationAll, aclDeny),
		ACL{aclCluster, aclClusterName, aclLit, "User:b", "10.0.0.1", kmsg.ACLOperationIdempotentWrite, aclAllow},
		ACL{kmsg.ACLResourceTypeTransactionalId, "tx<&>", aclLit, "User:c", "*", aclWrite, aclAllow},
	)
	b := s.Marshal()
	if !strings.Contains(string(b), `"version":1`) || !strings.Contains(string(b), `"PREFIXED"`) || !strings.Contains(string(b), `"IDEMPOTENT_WRITE"`) {
		t.Fatalf("Marshal = %s", b)
	}
	l, err := LoadACLs(b)
	if err != nil || !slices.Equal(l.Describe(ACLFilter{ResourceType: kmsg.ACLResourceTypeAny,
		PatternType: kmsg.ACLResourcePatternTypeAny, Operation: kmsg.ACLOperationAny, Permission: kmsg.ACLPermissionTypeAny}), s.load().list) {
		t.Fatalf("LoadACLs = %v, %v", l, err)
	}
	if got := l.Marshal(); string(got) != string(b) {
		t.Fatalf("round trip changed bytes:\n%s\n%s", b, got)
	}
	for _, empty := range [][]byte{nil, {}, []byte(" \n")} {
		if l, err := LoadACLs(empty); err != nil || l.Len() != 0 {
			t.Fatalf("LoadACLs(%q) = %v, %v", empty, l, err)
		}
	}
	entry := `{"resource_type":"TOPIC","resource_name":"t","pattern_type":"LITERAL","principal":"User:a","host":"*","operation":"READ","permission":"ALLOW"}`
	if _, err := LoadACLs([]byte(`{"version":1,"acls":[` + entry + `]}`)); err != nil {
		t.Fatalf("good entry: %v", err)
	}
	for _, bad := range []string{
		`{"version":2,"acls":[]}`,
		`{"acls":[]}`,
		`{"version":1,"acls":[` + strings.Replace(entry, `"READ"`, `"READS"`, 1) + `]}`,
		`{"version":1,"acls":[` + strings.Replace(entry, `"LITERAL"`, `"MATCH"`, 1) + `]}`,
		`{"version":1,"acls":[` + strings.Replace(entry, `"User:a"`, `"a"`, 1) + `]}`,
		`{"version":1,"acls":[` + strings.Replace(entry, `"host"`, `"hots"`, 1) + `]}`,
		`{"version":1,"acls":[]} x`,
		`[`,
	} {
		if _, err := LoadACLs([]byte(bad)); err == nil {
			t.Errorf("LoadACLs(%s): want an error", bad)
		}
	}
}

func TestACLPersistFailure(t *testing.T) {
	a := aclT("t", aclLit, "User:a", aclRead, aclAllow)
	s := aclStore(t, a)
	before := s.Marshal()
	var got []byte
	fail := errors.New("disk full")
	s.SetPersist(func(b []byte) error { got = b; return fail })
	z := NewAuthorizer(s, nil, false)

	errs, err := s.Create([]ACL{aclT("u", aclLit, "User:a", aclRead, aclAllow)})
	if !errors.Is(err, fail) || errs[0] != nil || s.Len() != 1 || z.Authorize("User:a", "h", aclRead, aclTopic, "u") {
		t.Fatalf("Create = %v, %v; Len %d", errs, err, s.Len())
	}
	if l, err := LoadACLs(got); err != nil || l.Len() != 2 {
		t.Fatalf("persisted %s: %v", got, err)
	}
	all := ACLFilter{ResourceType: kmsg.ACLResourceTypeAny, PatternType: kmsg.ACLResourcePatternTypeAny,
		Operation: kmsg.ACLOperationAny, Permission: kmsg.ACLPermissionTypeAny}
	if m, err := s.Delete([]ACLFilter{all}); !errors.Is(err, fail) || m != nil || s.Len() != 1 || !z.Authorize("User:a", "h", aclRead, aclTopic, "t") {
		t.Fatalf("Delete = %v, %v; Len %d", m, err, s.Len())
	}
	if string(s.Marshal()) != string(before) {
		t.Fatalf("store changed: %s", s.Marshal())
	}
	s.SetPersist(nil)
	if m, err := s.Delete([]ACLFilter{all}); err != nil || len(m[0]) != 1 || s.Len() != 0 {
		t.Fatalf("Delete = %v, %v", m, err)
	}
}

func TestAuthorizeConcurrentACL(t *testing.T) {
	s := aclStore(t, aclT("t", aclLit, "User:a", aclRead, aclAllow))
	z := NewAuthorizer(s, nil, false)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if !z.Authorize("User:a", "h", aclRead, aclTopic, "t") {
					t.Error("lost the standing ACL")
					return
				}
				z.Authorize("User:a", "h", aclRead, aclTopic, "p.x")
				s.Describe(ACLFilter{})
			}
		})
	}
	for i := range 200 {
		if _, err := s.Create([]ACL{aclT(fmt.Sprint("p", i), aclPre, "User:a", aclRead, aclAllow)}); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
	if s.Len() != 201 || !z.Authorize("User:a", "h", aclRead, aclTopic, "p199x") {
		t.Fatalf("Len %d", s.Len())
	}
}

// aclBenchAuthorizer has a literal, a wildcard and 200 prefixed ACLs.
func aclBenchAuthorizer(t testing.TB) *Authorizer {
	acls := []ACL{
		aclT("orders", aclLit, "User:a", aclWrite, aclAllow),
		aclT("*", aclLit, "User:ops", kmsg.ACLOperationDescribe, aclAllow),
	}
	for i := range 200 {
		acls = append(acls, aclT(fmt.Sprintf("app%03d.", i), aclPre, "User:a", aclRead, aclAllow))
	}
	return NewAuthorizer(aclStore(t, acls...), []string{"User:admin"}, false)
}

var aclSink bool

func TestAuthorizeACLAllocs(t *testing.T) {
	z := aclBenchAuthorizer(t)
	for _, c := range []struct {
		name, principal, topic string
		op                     kmsg.ACLOperation
		want                   bool
	}{
		{"literal", "User:a", "orders", aclWrite, true},
		{"prefixed", "User:a", "app199.x", aclRead, true},
		{"miss", "User:b", "other", aclRead, false},
		{"super", "User:admin", "other", aclWrite, true},
	} {
		if got := z.Authorize(c.principal, "10.0.0.1", c.op, aclTopic, c.topic); got != c.want {
			t.Fatalf("%s: Authorize = %v", c.name, got)
		}
		if n := testing.AllocsPerRun(100, func() {
			aclSink = z.Authorize(c.principal, "10.0.0.1", c.op, aclTopic, c.topic)
		}); n != 0 {
			t.Errorf("%s: %v allocations", c.name, n)
		}
	}
}

func BenchmarkAuthorize(b *testing.B) {
	z := aclBenchAuthorizer(b)
	for _, c := range []struct {
		name, principal, topic string
		op                     kmsg.ACLOperation
	}{
		{"literal", "User:a", "orders", aclWrite},
		{"prefixed", "User:a", "app199.x", aclRead},
		{"miss", "User:b", "other", aclRead},
		{"super", "User:admin", "other", aclWrite},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				aclSink = z.Authorize(c.principal, "10.0.0.1", c.op, aclTopic, c.topic)
			}
		})
	}
}
