package compattests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// A secure broker: four listeners (PLAINTEXT, SSL with client certificates
// requested, SASL_PLAINTEXT, SASL_SSL) on loopback, every SASL mechanism
// (OAUTHBEARER with Kafka's unsecured validator), ACL authorization and
// the super user admin from SYNAPSE_ADMIN_PASSWORD. Certificates are made
// by the test (crypto/x509): nothing private is committed.

const secureAdminPassword = "admin-secret"

type secureBroker struct {
	*synapseBroker
	plain, ssl, saslPlain, saslSSL string // listener addresses

	certs testCerts
}

type testCerts struct {
	dir                  string
	caFile               string
	serverCert, serverKy string
	clientCert, clientKy string // CN=mtls-client, signed by the CA
	ca                   *x509.CertPool
	client               tls.Certificate
}

// startSecureSynapse starts a secure broker for t (synapse only: the kfake
// target skips). extra flags are appended to the command line.
func startSecureSynapse(t testing.TB, extra ...string) *secureBroker {
	t.Helper()
	if compatTarget() != targetSynapse {
		t.Skip("the security tests run against synapse only")
	}
	bin := os.Getenv("SYNAPSE_BIN")
	if bin == "" {
		skipUnlessRequired(t, "SYNAPSE_BIN is not set")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	sb := &secureBroker{certs: makeTestCerts(t)}
	sb.synapseBroker = startSynapseWith(t, abs, func(b *synapseBroker) {
		ports := freePorts(t, 3)
		host := func(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }
		sb.plain, sb.ssl, sb.saslPlain, sb.saslSSL = b.Addr(), host(ports[0]), host(ports[1]), host(ports[2])
		b.listeners = fmt.Sprintf("PLAINTEXT://%s,SSL://%s,SASL_PLAINTEXT://%s,SASL_SSL://%s", sb.plain, sb.ssl, sb.saslPlain, sb.saslSSL)
		b.extraArgs = append([]string{
			"--tls-cert-file", sb.certs.serverCert,
			"--tls-key-file", sb.certs.serverKy,
			"--tls-client-ca-file", sb.certs.caFile,
			"--tls-client-auth", "requested",
			"--sasl-mechanisms", "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
			"--sasl-oauthbearer-unsecured",
			"--authorizer", "acl",
			"--sasl-failed-auth-delay", "10ms",
		}, extra...)
		b.extraEnv = []string{"SYNAPSE_ADMIN_PASSWORD=" + secureAdminPassword}
	})
	return sb
}

// tlsConfig is what a client of the SSL listeners uses: the test CA, and
// with mtls the client certificate.
func (c *testCerts) tlsConfig(mtls bool) *tls.Config {
	cfg := &tls.Config{RootCAs: c.ca, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if mtls {
		cfg.Certificates = []tls.Certificate{c.client}
	}
	return cfg
}

func makeTestCerts(t testing.TB) testCerts {
	t.Helper()
	dir := t.TempDir()
	c := testCerts{dir: dir}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "synapse-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	c.caFile = write("ca.pem", "CERTIFICATE", caDER)
	c.ca = x509.NewCertPool()
	c.ca.AddCert(caCert)
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, prefix string) (string, string, tls.Certificate) {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn, Organization: []string{"synapse-tests"}},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		cf, kf := write(prefix+".pem", "CERTIFICATE", der), write(prefix+"-key.pem", "PRIVATE KEY", kder)
		pair, err := tls.LoadX509KeyPair(cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		return cf, kf, pair
	}
	c.serverCert, c.serverKy, _ = leaf(2, "127.0.0.1", x509.ExtKeyUsageServerAuth, "server")
	c.clientCert, c.clientKy, c.client = leaf(3, "mtls-client", x509.ExtKeyUsageClientAuth, "client")
	return c
}

// mtlsPrincipal is the principal of the test client certificate (Kafka's
// default mapping of its subject).
const mtlsPrincipal = "User:CN=mtls-client,O=synapse-tests"

// adminClient is a kgo client of the super user admin over SASL_SSL with
// SCRAM-SHA-512.
func (sb *secureBroker) adminClient(t testing.TB) (*kgo.Client, *kadm.Client) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(sb.saslSSL), kgo.DialTLSConfig(sb.certs.tlsConfig(false)),
		kgo.SASL(scram.Auth{User: "admin", Pass: secureAdminPassword}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl, kadm.NewClient(cl)
}

func (sb *secureBroker) adm(t testing.TB) *kadm.Client {
	_, adm := sb.adminClient(t)
	return adm
}

// createUser gives name SCRAM-SHA-256 and -512 credentials (PLAIN checks
// them too) through AlterUserScramCredentials, as kafka-configs.sh does.
func (sb *secureBroker) createUser(t testing.TB, name, password string) {
	t.Helper()
	_, adm := sb.adminClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{
		{User: name, Mechanism: kadm.ScramSha256, Iterations: 4096, Password: password},
		{User: name, Mechanism: kadm.ScramSha512, Iterations: 4096, Password: password},
	})
	if err != nil {
		t.Fatalf("AlterUserSCRAMs %s: %v", name, err)
	}
	if err := res.Error(); err != nil {
		t.Fatalf("AlterUserSCRAMs %s: %v", name, err)
	}
}

// allow creates ALLOW ACLs for principal (any host) through kadm.
func (sb *secureBroker) allow(t testing.TB, b *kadm.ACLBuilder) {
	t.Helper()
	_, adm := sb.adminClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := adm.CreateACLs(ctx, b)
	if err != nil {
		t.Fatalf("CreateACLs: %v", err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("CreateACLs %s %s %s: %v", r.Principal, r.Operation, r.Name, r.Err)
		}
	}
}

// grantClient lets principal produce to and consume topic (READ, WRITE,
// DESCRIBE, CREATE on it) and use group.
func (sb *secureBroker) grantClient(t testing.TB, principal, topic, group string) {
	t.Helper()
	sb.allow(t, kadm.NewACLs().Allow(principal).Topics(topic).
		Operations(kadm.OpRead, kadm.OpWrite, kadm.OpDescribe, kadm.OpCreate).ResourcePatternType(kadm.ACLPatternLiteral))
	if group != "" {
		sb.allow(t, kadm.NewACLs().Allow(principal).Groups(group).
			Operations(kadm.OpRead, kadm.OpDescribe).ResourcePatternType(kadm.ACLPatternLiteral))
	}
}

// unsecuredToken is a JWT as Kafka's unsecured validator accepts: alg
// none, no signature, sub the principal's name, exp ttl from now.
func unsecuredToken(sub string, ttl time.Duration) string {
	enc := base64.RawURLEncoding
	h, _ := json.Marshal(map[string]any{"alg": "none"})
	c, _ := json.Marshal(map[string]any{"sub": sub, "iat": time.Now().Unix(), "exp": time.Now().Add(ttl).Unix()})
	return enc.EncodeToString(h) + "." + enc.EncodeToString(c) + "."
}
