package broker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/auth"
	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/tiering"
)

// Security state: SCRAM users and ACLs, each an atomic file in the data
// directory written before a change is visible, mirrored to the bucket as
// topics.json is and restored from it into an empty data directory.

const (
	usersFile = "users.json"
	aclsFile  = "acls.json"
	usersKey  = "_synapse/users.json"
	aclsKey   = "_synapse/acls.json"

	// AdminUser is the super user SYNAPSE_ADMIN_PASSWORD creates.
	AdminUser = "admin"
)

// security is the server's authentication and authorization state.
type security struct {
	users *auth.Users
	acls  *auth.ACLs
	authz *auth.Authorizer // nil: every request is allowed
	mechs []string
	audit *zap.Logger

	// Authentication outcomes by mechanism, for /metrics.
	authOK, authFailed map[string]*atomic.Int64
	denied             atomic.Int64 // requests (resources) refused by ACLs

	mirrors [2]metaMirror // users, ACLs

	quotas *quotaStore // client quotas, quotas.json (quotas.go)
}

// SASL mechanisms a listener can offer.
var saslMechanisms = []string{auth.Plain, auth.ScramSHA256, auth.ScramSHA512, auth.OAuthBearer}

func (s *Server) openSecurity() (*security, error) {
	cfg := &s.cfg
	for _, m := range cfg.SASLMechanisms {
		if !slices.Contains(saslMechanisms, m) {
			return nil, fmt.Errorf("broker: SASL mechanism %q: want one of %v", m, saslMechanisms)
		}
		if m == auth.OAuthBearer && cfg.OAuth == nil {
			return nil, errors.New("broker: OAUTHBEARER needs a token validator (a JWKS, or the unsecured development validator)")
		}
	}
	sec := &security{
		mechs:      cfg.SASLMechanisms,
		audit:      cfg.AuditLogger,
		authOK:     map[string]*atomic.Int64{},
		authFailed: map[string]*atomic.Int64{},
	}
	if sec.audit == nil {
		sec.audit = cfg.Logger.Named("audit")
	}
	for _, m := range saslMechanisms {
		sec.authOK[m], sec.authFailed[m] = new(atomic.Int64), new(atomic.Int64)
	}
	sec.mirrors[0].key, sec.mirrors[1].key = usersKey, aclsKey
	ub, err := s.readSecurityFile(usersFile)
	if err != nil {
		return nil, err
	}
	if sec.users, err = auth.LoadUsers(ub); err != nil {
		return nil, fmt.Errorf("broker: %s: %w", usersFile, err)
	}
	ab, err := s.readSecurityFile(aclsFile)
	if err != nil {
		return nil, err
	}
	if sec.acls, err = auth.LoadACLs(ab); err != nil {
		return nil, fmt.Errorf("broker: %s: %w", aclsFile, err)
	}
	if sec.quotas, err = s.openQuotas(); err != nil {
		return nil, err
	}
	sec.users.SetPersist(s.persistSecurity(usersFile, &sec.mirrors[0]))
	sec.acls.SetPersist(s.persistSecurity(aclsFile, &sec.mirrors[1]))
	if ub != nil {
		sec.mirrors[0].queue(ub) // mirrored again at each start
	}
	if ab != nil {
		sec.mirrors[1].queue(ab)
	}
	supers := slices.Clone(cfg.SuperUsers)
	if cfg.AdminPassword != "" {
		supers = append(supers, "User:"+AdminUser)
		if err := sec.ensureAdmin(cfg.AdminPassword); err != nil {
			return nil, err
		}
	}
	if cfg.Authorize {
		sec.authz = auth.NewAuthorizer(sec.acls, supers, cfg.AllowEveryoneIfNoACL)
	}
	return sec, nil
}

// ensureAdmin creates the admin user's credentials if it has none (a first
// start); an existing admin keeps its password, changed through the admin
// APIs.
func (sec *security) ensureAdmin(password string) error {
	if len(sec.users.Describe([]string{AdminUser})[AdminUser]) > 0 {
		return nil
	}
	for _, m := range []string{auth.ScramSHA256, auth.ScramSHA512} {
		if err := sec.users.SetPassword(AdminUser, m, password, auth.MinIterations); err != nil {
			return fmt.Errorf("broker: create the admin user: %w", err)
		}
	}
	sec.audit.Info("user created", zap.String("event", "user_created"), zap.String("user", AdminUser), zap.String("by", "admin password at start-up"))
	return nil
}

// readSecurityFile reads a security file of the data directory (nil if
// there is none).
func (s *Server) readSecurityFile(name string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(s.cfg.DataDir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// restoreSecurityFiles brings the bucket's copies of users.json,
// acls.json and quotas.json into a data directory being restored (restoreFromTier).
func restoreSecurityFiles(ctx context.Context, dataDir string, t *tiering.Tier, logger *zap.Logger) error {
	for _, f := range []struct{ name, key string }{{usersFile, usersKey}, {aclsFile, aclsKey}, {quotasFile, quotasKey}} {
		path := filepath.Join(dataDir, f.name)
		if _, err := os.Stat(path); err == nil {
			continue
		}
		b, err := t.Store().GetRange(ctx, f.key, 0, -1)
		if errors.Is(err, tiering.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("broker: restore: read %s from the tiered store: %w", f.key, err)
		}
		if err := log.WriteFileAtomicPerm(log.OSFS, path, b, 0o600); err != nil {
			return err
		}
		logger.Info("restored from the tiered store", zap.String("file", f.name), zap.Int("bytes", len(b)))
	}
	return nil
}

// persistSecurity returns the persist hook of a store: the atomic file
// first, then the bytes queued for the bucket.
func (s *Server) persistSecurity(name string, m *metaMirror) func([]byte) error {
	path := filepath.Join(s.cfg.DataDir, name)
	return func(b []byte) error {
		if err := log.WriteFileAtomicPerm(log.OSFS, path, b, 0o600); err != nil {
			return err
		}
		if s.cfg.Tier != nil {
			m.queue(b)
			s.kickTiering()
		}
		return nil
	}
}

// mirrorSecurity copies changed security files to the bucket (best effort,
// retried by the next maintenance pass).
func (s *Server) mirrorSecurity(ctx context.Context) {
	for i := range s.sec.mirrors {
		s.sec.mirrors[i].copy(ctx, s.cfg.Tier, s.repeat)
	}
	s.sec.quotas.mirror.copy(ctx, s.cfg.Tier, s.repeat)
}

// Secured reports whether clients authenticate (a SASL mechanism is
// enabled) or are authorized (ACLs): the HTTP side port then asks for a
// login on whatever it serves beyond health and metrics.
func (s *Server) Secured() bool { return len(s.cfg.SASLMechanisms) > 0 || s.cfg.Authorize }

// CheckLogin reports whether user and password are a valid login (checked
// as PLAIN is, against the SCRAM credentials) of a principal that may
// DESCRIBE the cluster from client (an IP). For the HTTP side port's Basic
// authentication.
func (s *Server) CheckLogin(user, password, client string) bool {
	ok := s.sec.users.CheckPlain(user, password)
	principal := "User:" + user
	if ok && s.sec.authz != nil {
		ok = s.sec.authz.Authorize(principal, client, opDescribe, resCluster, clusterName)
	}
	if !ok {
		s.sec.audit.Warn("authentication failed", zap.String("event", "authentication_failed"), zap.String("mechanism", "HTTP Basic"),
			zap.String("client", client))
		return false
	}
	s.sec.audit.Info("authenticated", zap.String("event", "authentication"), zap.String("mechanism", "HTTP Basic"),
		zap.String("principal", principal), zap.String("client", client))
	return true
}
