package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/synapsebroker/synapse/auth"
	"github.com/synapsebroker/synapse/broker"
)

// securityOptions are the listener, TLS, SASL and ACL flags of `serve`.
type securityOptions struct {
	listeners           string
	advertisedListeners string
	tlsCert, tlsKey     string
	tlsClientCA         string
	tlsClientAuth       string
	saslMechanisms      string
	sessionLifetime     time.Duration
	failedAuthDelay     time.Duration
	oauthJWKS           string
	oauthIssuer         string
	oauthAudience       string
	oauthClaim          string
	oauthUnsecured      bool
	authorizer          string
	superUsers          string
	allowIfNoACL        bool
	adminPasswordFile   string
	auditLog            string
}

func (o *securityOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.listeners, "listeners", "", "Kafka listeners, NAME://host:port separated by commas; the name is the security protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL "+
		"(e.g. PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093); replaces --listen")
	fs.StringVar(&o.advertisedListeners, "advertised-listeners", "", "what Metadata tells the clients of each listener, NAME://host:port by listener name (default: the listener's address); replaces --advertised-addr")
	fs.StringVar(&o.tlsCert, "tls-cert-file", "", "PEM certificate chain of SSL and SASL_SSL listeners (reloaded when the file changes)")
	fs.StringVar(&o.tlsKey, "tls-key-file", "", "PEM private key of --tls-cert-file")
	fs.StringVar(&o.tlsClientCA, "tls-client-ca-file", "", "PEM CAs that sign client certificates (mTLS)")
	fs.StringVar(&o.tlsClientAuth, "tls-client-auth", "none", "client certificates on TLS listeners: none, requested or required (Kafka's ssl.client.auth); on SSL listeners a certificate's subject is the principal (User:CN=...)")
	fs.StringVar(&o.saslMechanisms, "sasl-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512", "SASL mechanisms of SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (Kafka's sasl.enabled.mechanisms)")
	fs.DurationVar(&o.sessionLifetime, "sasl-session-lifetime", 0, "close SASL connections that do not re-authenticate within this (KIP-368, Kafka's connections.max.reauth.ms); 0 = never")
	fs.DurationVar(&o.failedAuthDelay, "sasl-failed-auth-delay", 100*time.Millisecond, "delay before answering a failed authentication (Kafka's connection.failed.authentication.delay.ms)")
	fs.StringVar(&o.oauthJWKS, "sasl-oauthbearer-jwks", "", "OAUTHBEARER: JWKS (public keys of the token issuer) as a file path or an https:// URL")
	fs.StringVar(&o.oauthIssuer, "sasl-oauthbearer-issuer", "", "OAUTHBEARER: required iss claim")
	fs.StringVar(&o.oauthAudience, "sasl-oauthbearer-audience", "", "OAUTHBEARER: required aud claim")
	fs.StringVar(&o.oauthClaim, "sasl-oauthbearer-principal-claim", "sub", "OAUTHBEARER: the claim that names the principal")
	fs.BoolVar(&o.oauthUnsecured, "sasl-oauthbearer-unsecured", false, "DEVELOPMENT ONLY: accept unsigned OAUTHBEARER tokens (alg none; expiry still checked), as Kafka's unsecured validator")
	fs.StringVar(&o.authorizer, "authorizer", "none", "none (every authenticated client may do anything) or acl (Kafka ACLs, managed with CreateAcls/DeleteAcls)")
	fs.StringVar(&o.superUsers, "super-users", "", "principals that bypass ACLs, separated by ';' as in Kafka's super.users (e.g. User:alice;User:CN=ops,O=example)")
	fs.BoolVar(&o.allowIfNoACL, "allow-everyone-if-no-acl-found", false, "with --authorizer acl: allow access to resources no ACL matches (Kafka's allow.everyone.if.no.acl.found)")
	fs.StringVar(&o.adminPasswordFile, "admin-password-file", "", "file holding the password of the super user admin, created (SCRAM-SHA-256/512, PLAIN) at first start; or set SYNAPSE_ADMIN_PASSWORD")
	fs.StringVar(&o.auditLog, "audit-log", "", "where the audit log goes, as JSON lines: a file path, or empty for the main log (logger \"audit\")")
}

func (o *securityOptions) validate() []error {
	var errs []error
	if o.listeners != "" {
		if _, err := broker.ParseListeners(o.listeners); err != nil {
			errs = append(errs, fmt.Errorf("--listeners: %w", err))
		}
	}
	if o.advertisedListeners != "" {
		if _, err := broker.ParseListeners(o.advertisedListeners); err != nil {
			errs = append(errs, fmt.Errorf("--advertised-listeners: %w", err))
		}
	}
	switch o.authorizer {
	case "none", "acl":
	default:
		errs = append(errs, fmt.Errorf("--authorizer %q: want none or acl", o.authorizer))
	}
	switch o.tlsClientAuth {
	case "none", "requested", "required":
	default:
		errs = append(errs, fmt.Errorf("--tls-client-auth %q: want none, requested or required", o.tlsClientAuth))
	}
	if o.sessionLifetime < 0 || o.failedAuthDelay < 0 {
		errs = append(errs, errors.New("--sasl-session-lifetime and --sasl-failed-auth-delay must not be negative"))
	}
	return errs
}

func splitList(s string, seps string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune(seps, r) }) {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// listenerSpec is one listener to open: its address and what to serve there.
type listenerSpec struct {
	addr string
	l    broker.Listener
}

// listenerSpecs works out the listeners from --listeners (or --listen and
// --advertised-addr, the one-listener shorthand) and the TLS files.
func (o *serveOptions) listenerSpecs(cmdListen, cmdAdvertised bool, logger *zap.Logger) ([]listenerSpec, error) {
	sec := &o.sec
	var addrs []broker.ListenerAddr
	if sec.listeners != "" {
		if cmdListen || cmdAdvertised {
			return nil, errors.New("--listen and --advertised-addr are the one-listener shorthand: use --listeners and --advertised-listeners instead, not both")
		}
		addrs, _ = broker.ParseListeners(sec.listeners)
	} else {
		addrs = []broker.ListenerAddr{{Name: broker.Plaintext, Protocol: broker.Plaintext, Addr: o.listen}}
	}
	advertised := map[string]string{}
	if sec.advertisedListeners != "" {
		as, _ := broker.ParseListeners(sec.advertisedListeners)
		for _, a := range as {
			if !slices.ContainsFunc(addrs, func(l broker.ListenerAddr) bool { return l.Name == a.Name }) {
				return nil, fmt.Errorf("--advertised-listeners names %s, which --listeners does not", a.Name)
			}
			advertised[a.Name] = a.Addr
		}
	} else if o.advertisedAddr != "" {
		advertised[addrs[0].Name] = o.advertisedAddr
	}
	var tlsCfg *auth.TLSConfig
	var specs []listenerSpec
	for _, a := range addrs {
		l := broker.Listener{Name: a.Name, Protocol: a.Protocol, Advertised: advertised[a.Name]}
		if a.Protocol == broker.SSL || a.Protocol == broker.SASLSSL {
			if tlsCfg == nil {
				var err error
				tlsCfg, err = auth.NewTLSConfig(auth.TLSFiles{CertFile: sec.tlsCert, KeyFile: sec.tlsKey,
					ClientCAFile: sec.tlsClientCA, ClientAuth: sec.tlsClientAuth}, logger.Named("tls"))
				if err != nil {
					return nil, fmt.Errorf("listener %s: %w (--tls-cert-file, --tls-key-file)", a.Name, err)
				}
			}
			l.TLS = tlsCfg.Config()
		}
		specs = append(specs, listenerSpec{addr: a.Addr, l: l})
	}
	return specs, nil
}

// securityConfig fills the SASL and ACL fields of cfg.
func (o *serveOptions) securityConfig(cfg *broker.Config, specs []listenerSpec, logger *zap.Logger) (func(), error) {
	sec := &o.sec
	sasl := slices.ContainsFunc(specs, func(s listenerSpec) bool {
		return s.l.Protocol == broker.SASLPlaintext || s.l.Protocol == broker.SASLSSL
	})
	if sasl {
		for _, m := range splitList(sec.saslMechanisms, ",") {
			cfg.SASLMechanisms = append(cfg.SASLMechanisms, strings.ToUpper(m))
		}
	}
	if slices.Contains(cfg.SASLMechanisms, auth.OAuthBearer) {
		oc := auth.OAuthConfig{Issuer: sec.oauthIssuer, Audience: sec.oauthAudience, PrincipalClaim: sec.oauthClaim, Unsecured: sec.oauthUnsecured}
		if strings.HasPrefix(sec.oauthJWKS, "https://") || strings.HasPrefix(sec.oauthJWKS, "http://") {
			oc.JWKSURL = sec.oauthJWKS
		} else {
			oc.JWKSFile = sec.oauthJWKS
		}
		v, err := auth.NewOAuthValidator(oc)
		if err != nil {
			return nil, fmt.Errorf("OAUTHBEARER: %w (--sasl-oauthbearer-jwks or --sasl-oauthbearer-unsecured)", err)
		}
		cfg.OAuth = v
	}
	if cfg.OAuth != nil && (os.Getenv("SYNAPSE_ADMIN_PASSWORD") != "" || sec.adminPasswordFile != "") {
		logger.Warn("OAUTHBEARER is enabled with an admin password: a token whose principal is User:admin is the super user too")
	}
	if sec.oauthUnsecured {
		logger.Warn("--sasl-oauthbearer-unsecured: UNSIGNED OAUTHBEARER TOKENS ARE ACCEPTED; anyone can claim any principal. Development only.")
	}
	cfg.SASLSessionLifetime = sec.sessionLifetime
	cfg.FailedAuthDelay = sec.failedAuthDelay
	if cfg.FailedAuthDelay == 0 {
		cfg.FailedAuthDelay = -1 // 0 on the command line: none
	}
	cfg.Authorize = sec.authorizer == "acl"
	cfg.SuperUsers = splitList(sec.superUsers, ";") // not ",": certificate principals have commas
	cfg.AllowEveryoneIfNoACL = sec.allowIfNoACL
	if pw := os.Getenv("SYNAPSE_ADMIN_PASSWORD"); pw != "" {
		cfg.AdminPassword = pw
	}
	if sec.adminPasswordFile != "" {
		b, err := os.ReadFile(sec.adminPasswordFile)
		if err != nil {
			return nil, fmt.Errorf("--admin-password-file: %w", err)
		}
		cfg.AdminPassword = strings.TrimRight(string(b), "\r\n")
		if cfg.AdminPassword == "" {
			return nil, fmt.Errorf("--admin-password-file %s is empty", sec.adminPasswordFile)
		}
	}
	closeAudit := func() {}
	if sec.auditLog != "" {
		f, err := os.OpenFile(sec.auditLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("--audit-log: %w", err)
		}
		ec := zap.NewProductionEncoderConfig()
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		ws := zapcore.Lock(zapcore.AddSync(f))
		cfg.AuditLogger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(ec), ws, zapcore.InfoLevel)).Named("audit")
		closeAudit = func() { cfg.AuditLogger.Sync(); f.Close() }
	}
	return closeAudit, nil
}

// advertisedFor is what a listener advertises when nothing is configured:
// its address, or the host's name for a wildcard (no address to connect to).
func advertisedFor(ln net.Listener, logger *zap.Logger) string {
	advertised := ln.Addr().String()
	if host, port, err := net.SplitHostPort(advertised); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			name, err := os.Hostname()
			if err != nil || name == "" {
				name = "localhost"
			}
			advertised = net.JoinHostPort(name, port)
			logger.Warn("listening on all addresses without an advertised address: advertising the host name, which clients must be able to resolve", zap.String("advertised", advertised))
		}
	}
	return advertised
}
