package broker

import (
	"errors"
	"net/netip"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/auth"
)

// DescribeAcls (29), CreateAcls (30), DeleteAcls (31): v0-3
//
// Behavior:
//   - Without an authorizer (--authorizer none): SECURITY_DISABLED, as Kafka
//     answers without authorizer.class.name.
//   - DescribeAcls needs DESCRIBE on the cluster; CreateAcls and DeleteAcls
//     ALTER on it (else CLUSTER_AUTHORIZATION_FAILED).
//   - A change is in acls.json (fsync'd) before it is answered and before
//     it applies; it applies to live connections at their next request.
//   - Invalid entries and filters (unknown enums, a CLUSTER resource not
//     named kafka-cluster, a principal without "Type:") are
//     INVALID_REQUEST with the reason.

// normHost writes an IP host of an ACL as the broker writes clients'
// addresses (Go's form, IPv4-mapped IPv6 as IPv4), so Java's
// "0:0:0:0:0:0:0:1" matches a client at ::1; "*" and names stay as given.
func normHost(h string) string {
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String()
	}
	return h
}

func normHostPtr(h *string) *string {
	if h == nil {
		return nil
	}
	n := normHost(*h)
	return &n
}

func aclFilterAny() auth.ACLFilter {
	return auth.ACLFilter{
		ResourceType: kmsg.ACLResourceTypeAny, PatternType: kmsg.ACLResourcePatternTypeAny,
		Operation: kmsg.ACLOperationAny, Permission: kmsg.ACLPermissionTypeAny,
	}
}

// validFilter reports whether a filter's enums are ones Kafka accepts in a
// filter (UNKNOWN is not).
func validFilter(f auth.ACLFilter) bool {
	return f.ResourceType != kmsg.ACLResourceTypeUnknown && f.PatternType != kmsg.ACLResourcePatternTypeUnknown &&
		f.Operation != kmsg.ACLOperationUnknown && f.Permission != kmsg.ACLPermissionTypeUnknown
}

func (s *Server) handleDescribeACLs(c *conn, req *kmsg.DescribeACLsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DescribeACLsResponse)
	f := auth.ACLFilter{
		ResourceType: req.ResourceType, ResourceName: req.ResourceName, PatternType: req.ResourcePatternType,
		Principal: req.Principal, Host: normHostPtr(req.Host), Operation: req.Operation, Permission: req.PermissionType,
	}
	switch {
	case s.sec.authz == nil:
		resp.ErrorCode, resp.ErrorMessage = kerr.SecurityDisabled.Code, kmsg.StringPtr("no authorizer is configured (--authorizer acl)")
		return resp, nil
	case !c.allowedCluster(opDescribe):
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		return resp, nil
	case !validFilter(f):
		resp.ErrorCode, resp.ErrorMessage = kerr.InvalidRequest.Code, kmsg.StringPtr("the filter has an UNKNOWN field")
		return resp, nil
	}
	type key struct {
		rt   kmsg.ACLResourceType
		name string
		pt   kmsg.ACLResourcePatternType
	}
	at := map[key]int{}
	for _, a := range s.sec.acls.Describe(f) {
		k := key{a.ResourceType, a.ResourceName, a.PatternType}
		i, ok := at[k]
		if !ok {
			r := kmsg.NewDescribeACLsResponseResource()
			r.ResourceType, r.ResourceName, r.ResourcePatternType = k.rt, k.name, k.pt
			resp.Resources = append(resp.Resources, r)
			i = len(resp.Resources) - 1
			at[k] = i
		}
		ra := kmsg.NewDescribeACLsResponseResourceACL()
		ra.Principal, ra.Host, ra.Operation, ra.PermissionType = a.Principal, a.Host, a.Operation, a.Permission
		resp.Resources[i].ACLs = append(resp.Resources[i].ACLs, ra)
	}
	return resp, nil
}

func (s *Server) handleCreateACLs(c *conn, req *kmsg.CreateACLsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.CreateACLsResponse)
	fail := func(code int16, msg string) (kmsg.Response, error) {
		for range req.Creations {
			r := kmsg.NewCreateACLsResponseResult()
			r.ErrorCode, r.ErrorMessage = code, kmsg.StringPtr(msg)
			resp.Results = append(resp.Results, r)
		}
		return resp, nil
	}
	switch {
	case s.sec.authz == nil:
		return fail(kerr.SecurityDisabled.Code, "no authorizer is configured (--authorizer acl)")
	case !c.allowedCluster(opAlter):
		return fail(kerr.ClusterAuthorizationFailed.Code, "not authorized to ALTER the cluster")
	}
	acls := make([]auth.ACL, len(req.Creations))
	for i, cr := range req.Creations {
		acls[i] = auth.ACL{
			ResourceType: cr.ResourceType, ResourceName: cr.ResourceName, PatternType: cr.ResourcePatternType,
			Principal: cr.Principal, Host: normHost(cr.Host), Operation: cr.Operation, Permission: cr.PermissionType,
		}
	}
	errs, err := s.sec.acls.Create(acls)
	if err != nil {
		s.logger.Error("persist ACLs", zap.Error(err))
		return fail(kerr.UnknownServerError.Code, "the ACLs could not be stored")
	}
	for i, a := range acls {
		r := kmsg.NewCreateACLsResponseResult()
		if i < len(errs) && errs[i] != nil {
			r.ErrorCode, r.ErrorMessage = kerr.InvalidRequest.Code, kmsg.StringPtr(errs[i].Error())
		} else {
			s.sec.audit.Info("ACL created", aclFields("acl_created", c, a)...)
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

func (s *Server) handleDeleteACLs(c *conn, req *kmsg.DeleteACLsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DeleteACLsResponse)
	fail := func(code int16, msg string) (kmsg.Response, error) {
		for range req.Filters {
			r := kmsg.NewDeleteACLsResponseResult()
			r.ErrorCode, r.ErrorMessage = code, kmsg.StringPtr(msg)
			resp.Results = append(resp.Results, r)
		}
		return resp, nil
	}
	switch {
	case s.sec.authz == nil:
		return fail(kerr.SecurityDisabled.Code, "no authorizer is configured (--authorizer acl)")
	case !c.allowedCluster(opAlter):
		return fail(kerr.ClusterAuthorizationFailed.Code, "not authorized to ALTER the cluster")
	}
	var filters []auth.ACLFilter
	var at []int // filters[i] is request filter at[i]; -1 marks an invalid one
	for i, rf := range req.Filters {
		f := auth.ACLFilter{
			ResourceType: rf.ResourceType, ResourceName: rf.ResourceName, PatternType: rf.ResourcePatternType,
			Principal: rf.Principal, Host: normHostPtr(rf.Host), Operation: rf.Operation, Permission: rf.PermissionType,
		}
		if validFilter(f) {
			filters = append(filters, f)
			at = append(at, i)
		}
	}
	matched, err := s.sec.acls.Delete(filters)
	if err != nil {
		s.logger.Error("persist ACLs", zap.Error(err))
		return fail(kerr.UnknownServerError.Code, "the ACLs could not be stored")
	}
	resp.Results = make([]kmsg.DeleteACLsResponseResult, len(req.Filters))
	for i := range resp.Results {
		resp.Results[i] = kmsg.NewDeleteACLsResponseResult()
		resp.Results[i].ErrorCode = kerr.InvalidRequest.Code
		resp.Results[i].ErrorMessage = kmsg.StringPtr("the filter has an UNKNOWN field")
	}
	for j, ms := range matched {
		r := &resp.Results[at[j]]
		r.ErrorCode, r.ErrorMessage = 0, nil
		for _, a := range ms {
			m := kmsg.NewDeleteACLsResponseResultMatchingACL()
			m.ResourceType, m.ResourceName, m.ResourcePatternType = a.ResourceType, a.ResourceName, a.PatternType
			m.Principal, m.Host, m.Operation, m.PermissionType = a.Principal, a.Host, a.Operation, a.Permission
			r.MatchingACLs = append(r.MatchingACLs, m)
			s.sec.audit.Info("ACL deleted", aclFields("acl_deleted", c, a)...)
		}
	}
	return resp, nil
}

func aclFields(event string, c *conn, a auth.ACL) []zap.Field {
	return []zap.Field{zap.String("event", event), zap.String("by", c.principal), zap.String("client", c.ip),
		zap.Stringer("resource_type", a.ResourceType), zap.String("resource", a.ResourceName), zap.Stringer("pattern", a.PatternType),
		zap.String("principal", a.Principal), zap.String("host", a.Host), zap.Stringer("operation", a.Operation),
		zap.Stringer("permission", a.Permission)}
}

// DescribeUserScramCredentials (50), AlterUserScramCredentials (51): v0
//
// Behavior:
//   - Describe needs DESCRIBE on the cluster, Alter ALTER on it (else
//     CLUSTER_AUTHORIZATION_FAILED); they work whether or not a listener
//     uses SASL, so users can be set up before SASL is turned on.
//   - Describe: no users named means every user; a named user without
//     credentials is RESOURCE_NOT_FOUND, one named twice
//     DUPLICATE_RESOURCE. Mechanisms and iterations only, never keys.
//   - Alter: one result per user. An unknown mechanism is
//     UNSUPPORTED_SASL_MECHANISM; iterations outside [4096, 16384], an
//     empty salt or a salted password of the wrong size
//     UNACCEPTABLE_CREDENTIAL; deleting a credential that is not there
//     RESOURCE_NOT_FOUND; a user and mechanism twice in one request
//     DUPLICATE_RESOURCE. The accepted changes are stored (users.json,
//     fsync'd) together before the answer; PLAIN and new SCRAM
//     authentications use them at once.
func (s *Server) handleDescribeUserSCRAMCredentials(c *conn, req *kmsg.DescribeUserSCRAMCredentialsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DescribeUserSCRAMCredentialsResponse)
	if !c.allowedCluster(opDescribe) {
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		return resp, nil
	}
	var names []string
	count := map[string]int{}
	for _, u := range req.Users {
		if count[u.Name]++; count[u.Name] == 1 {
			names = append(names, u.Name)
		}
	}
	var found map[string][]auth.CredentialInfo
	if len(req.Users) == 0 {
		found = s.sec.users.Describe(nil)
		for u := range found {
			names = append(names, u)
		}
		slices.Sort(names)
	} else {
		found = s.sec.users.Describe(names)
	}
	for _, u := range names {
		r := kmsg.NewDescribeUserSCRAMCredentialsResponseResult()
		r.User = u
		switch infos := found[u]; {
		case count[u] > 1:
			r.ErrorCode, r.ErrorMessage = kerr.DuplicateResource.Code, kmsg.StringPtr("user named more than once")
		case len(infos) == 0:
			r.ErrorCode, r.ErrorMessage = kerr.ResourceNotFound.Code, kmsg.StringPtr("no SCRAM credential for the user")
		default:
			for _, in := range infos {
				ci := kmsg.NewDescribeUserSCRAMCredentialsResponseResultCredentialInfo()
				ci.Mechanism, ci.Iterations = auth.ScramMechanismCode(in.Mechanism), in.Iterations
				r.CredentialInfos = append(r.CredentialInfos, ci)
			}
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

func (s *Server) handleAlterUserSCRAMCredentials(c *conn, req *kmsg.AlterUserSCRAMCredentialsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.AlterUserSCRAMCredentialsResponse)
	var users []string
	code := map[string]int16{}
	msg := map[string]string{}
	setErr := func(u string, c int16, m string) {
		if code[u] == 0 {
			code[u], msg[u] = c, m
		}
	}
	seen := map[[2]string]int{}
	note := func(u string, mech int8) {
		if _, ok := code[u]; !ok {
			code[u] = 0
			users = append(users, u)
		}
		k := [2]string{u, string(rune(mech))}
		if seen[k]++; seen[k] > 1 {
			setErr(u, kerr.DuplicateResource.Code, "a user and mechanism appear more than once")
		}
		if auth.ScramMechanismName(mech) == "" {
			setErr(u, kerr.UnsupportedSaslMechanism.Code, "unknown SCRAM mechanism")
		}
		if u == "" {
			setErr(u, kerr.UnacceptableCredential.Code, "the user name is empty")
		}
	}
	for _, d := range req.Deletions {
		note(d.Name, d.Mechanism)
	}
	for _, u := range req.Upsertions {
		note(u.Name, u.Mechanism)
	}
	allowed := c.allowedCluster(opAlter)
	if allowed {
		var dels []auth.ScramDeletion
		var ups []auth.ScramUpsertion
		var delUser, upUser []string
		for _, d := range req.Deletions {
			if code[d.Name] == 0 {
				dels = append(dels, auth.ScramDeletion{User: d.Name, Mechanism: auth.ScramMechanismName(d.Mechanism)})
				delUser = append(delUser, d.Name)
			}
		}
		for _, u := range req.Upsertions {
			if code[u.Name] == 0 {
				ups = append(ups, auth.ScramUpsertion{User: u.Name, Mechanism: auth.ScramMechanismName(u.Mechanism),
					Iterations: int(u.Iterations), Salt: u.Salt, SaltedPassword: u.SaltedPassword})
				upUser = append(upUser, u.Name)
			}
		}
		delErrs, upErrs, err := s.sec.users.Apply(dels, ups)
		if err != nil {
			s.logger.Error("persist users", zap.Error(err))
			for _, u := range users {
				setErr(u, kerr.UnknownServerError.Code, "the credentials could not be stored")
			}
		} else {
			for i, e := range delErrs {
				if e == nil {
					s.sec.audit.Info("SCRAM credential deleted", zap.String("event", "user_deleted"), zap.String("user", dels[i].User),
						zap.String("mechanism", dels[i].Mechanism), zap.String("by", c.principal), zap.String("client", c.ip))
				} else if errors.Is(e, auth.ErrNoCredential) {
					setErr(delUser[i], kerr.ResourceNotFound.Code, e.Error())
				} else {
					setErr(delUser[i], kerr.UnacceptableCredential.Code, e.Error())
				}
			}
			for i, e := range upErrs {
				if e == nil {
					s.sec.audit.Info("SCRAM credential set", zap.String("event", "user_changed"), zap.String("user", ups[i].User),
						zap.String("mechanism", ups[i].Mechanism), zap.String("by", c.principal), zap.String("client", c.ip))
				} else {
					setErr(upUser[i], kerr.UnacceptableCredential.Code, e.Error())
				}
			}
		}
	}
	for _, u := range users {
		r := kmsg.NewAlterUserSCRAMCredentialsResponseResult()
		r.User = u
		if !allowed {
			r.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		} else if code[u] != 0 {
			r.ErrorCode, r.ErrorMessage = code[u], kmsg.StringPtr(msg[u])
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}
