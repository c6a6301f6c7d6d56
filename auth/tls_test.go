package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func writeCert(t *testing.T, dir, cn string) (certFile, keyFile string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(k)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	// Written beside and renamed, as cert-manager and certbot do.
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{certFile, "CERTIFICATE", der}, {keyFile, "PRIVATE KEY", kder}} {
		if err := os.WriteFile(f.path+".new", pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f.path+".new", f.path); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

// servedCN handshakes with cfg and returns the server certificate's CN.
func servedCN(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Server(a, cfg).Handshake()
	c := tls.Client(b, &tls.Config{InsecureSkipVerify: true})
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// A changed certificate is served from the next handshake on, without a
// restart; a half-written one keeps the previous certificate.
func TestTLSCertificateReload(t *testing.T) {
	old := tlsCheckEvery
	tlsCheckEvery = 0
	defer func() { tlsCheckEvery = old }()
	dir := t.TempDir()
	cert, key := writeCert(t, dir, "first")
	tc, err := NewTLSConfig(TLSFiles{CertFile: cert, KeyFile: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := tc.Config()
	if cfg.MinVersion != tls.VersionTLS12 {
		t.Fatalf("minimum TLS version %x, want 1.2", cfg.MinVersion)
	}
	if cn := servedCN(t, cfg); cn != "first" {
		t.Fatalf("served %q", cn)
	}
	time.Sleep(10 * time.Millisecond) // a new modification time
	writeCert(t, dir, "second")
	if cn := servedCN(t, cfg); cn != "second" {
		t.Fatalf("after the files changed: served %q, want second", cn)
	}
	if err := os.WriteFile(cert, []byte("-----BEGIN CERT"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cn := servedCN(t, cfg); cn != "second" {
		t.Fatalf("after a broken write: served %q, want the previous certificate", cn)
	}
}

func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeCert(t, dir, "x")
	for _, f := range []TLSFiles{
		{},
		{CertFile: cert, KeyFile: key, ClientAuth: "sometimes"},
		{CertFile: cert, KeyFile: key, ClientAuth: "required"}, // no CA
		{CertFile: cert, KeyFile: cert},
	} {
		if _, err := NewTLSConfig(f, nil); err == nil {
			t.Errorf("%+v: no error", f)
		}
	}
}

func TestCertPrincipal(t *testing.T) {
	c := &x509.Certificate{Subject: pkix.Name{CommonName: "alice", Organization: []string{"example"}}}
	if got := CertPrincipal(c); got != "User:CN=alice,O=example" {
		t.Fatalf("principal %q", got)
	}
	// The subject as encoded (openssl -subj /CN=alice/O=example/OU=a/OU=b):
	// RFC 2253 lists it last RDN first, each attribute its own RDN.
	oid := func(o ...int) asn1.ObjectIdentifier { return o }
	seq := pkix.RDNSequence{
		{{Type: oid(2, 5, 4, 3), Value: "alice"}},
		{{Type: oid(2, 5, 4, 10), Value: "example"}},
		{{Type: oid(2, 5, 4, 11), Value: "a"}},
		{{Type: oid(2, 5, 4, 11), Value: "b"}},
	}
	raw, err := asn1.Marshal(seq)
	if err != nil {
		t.Fatal(err)
	}
	if got := CertPrincipal(&x509.Certificate{RawSubject: raw}); got != "User:OU=b,OU=a,O=example,CN=alice" {
		t.Fatalf("principal %q, want Java's X500Principal form", got)
	}
}
