package auth

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// TLSFiles names the PEM files of a TLS listener.
type TLSFiles struct {
	CertFile string // server certificate chain
	KeyFile  string // its private key
	// ClientCAFile holds the CAs that sign client certificates (mTLS).
	ClientCAFile string
	// ClientAuth is "none" (default), "requested" or "required"
	// (Kafka's ssl.client.auth).
	ClientAuth string
}

// tlsCheckEvery is how often a handshake looks at the files' modification
// times; a change is picked up by the next handshake after it.
var tlsCheckEvery = time.Second // a variable for tests

// TLSConfig serves the certificate and client CAs of files, reloading them
// when a file changes (no restart). A reload that fails (a half-written
// file) keeps the previous pair and is retried at the next check.
type TLSConfig struct {
	files  TLSFiles
	logger *zap.Logger
	auth   tls.ClientAuthType

	mu      sync.Mutex
	checked time.Time
	stamp   string // modification times and sizes of the loaded files
	cfg     *tls.Config
}

// NewTLSConfig loads files and returns the reloading configuration.
func NewTLSConfig(files TLSFiles, logger *zap.Logger) (*TLSConfig, error) {
	if files.CertFile == "" || files.KeyFile == "" {
		return nil, errors.New("TLS needs a certificate and a key file")
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	t := &TLSConfig{files: files, logger: logger}
	switch files.ClientAuth {
	case "", "none":
		t.auth = tls.NoClientCert
	case "requested":
		t.auth = tls.VerifyClientCertIfGiven
	case "required":
		t.auth = tls.RequireAndVerifyClientCert
	default:
		return nil, fmt.Errorf("TLS client auth %q: want none, requested or required", files.ClientAuth)
	}
	if t.auth != tls.NoClientCert && files.ClientCAFile == "" {
		return nil, fmt.Errorf("TLS client auth %q needs a client CA file", files.ClientAuth)
	}
	cfg, stamp, err := t.load()
	if err != nil {
		return nil, err
	}
	t.cfg, t.stamp, t.checked = cfg, stamp, time.Now()
	return t, nil
}

// Config returns the tls.Config to serve with: each handshake gets the
// current files' configuration.
func (t *TLSConfig) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.current(), nil
		},
	}
}

func (t *TLSConfig) current() *tls.Config {
	t.mu.Lock()
	defer t.mu.Unlock()
	if time.Since(t.checked) < tlsCheckEvery {
		return t.cfg
	}
	t.checked = time.Now()
	if t.filesStamp() == t.stamp {
		return t.cfg
	}
	cfg, stamp, err := t.load()
	if err != nil {
		t.logger.Warn("TLS files changed but do not load; serving the previous certificate", zap.Error(err))
		return t.cfg
	}
	t.logger.Info("TLS certificate reloaded", zap.String("cert_file", t.files.CertFile))
	t.cfg, t.stamp = cfg, stamp
	return cfg
}

func (t *TLSConfig) filesStamp() string {
	var s string
	for _, f := range []string{t.files.CertFile, t.files.KeyFile, t.files.ClientCAFile} {
		if f == "" {
			continue
		}
		if fi, err := os.Stat(f); err == nil {
			s += fmt.Sprintf("%d.%d;", fi.ModTime().UnixNano(), fi.Size())
		} else {
			s += "?;"
		}
	}
	return s
}

func (t *TLSConfig) load() (*tls.Config, string, error) {
	stamp := t.filesStamp()
	cert, err := tls.LoadX509KeyPair(t.files.CertFile, t.files.KeyFile)
	if err != nil {
		return nil, "", fmt.Errorf("TLS certificate: %w", err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   t.auth,
	}
	if t.files.ClientCAFile != "" {
		pem, err := os.ReadFile(t.files.ClientCAFile)
		if err != nil {
			return nil, "", fmt.Errorf("TLS client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("TLS client CA %s: no PEM certificate in it", t.files.ClientCAFile)
		}
		cfg.ClientCAs = pool
	}
	return cfg, stamp, nil
}

// CertPrincipal is the principal of a client certificate: Kafka's default
// mapping, "User:" and the subject's distinguished name in RFC 2253 form,
// in the certificate's own attribute order (as Java's X500Principal gives
// it: "User:CN=alice,OU=b,OU=a,O=example"), not Go's reordered pkix.Name.
func CertPrincipal(cert *x509.Certificate) string {
	var rdns pkix.RDNSequence
	if rest, err := asn1.Unmarshal(cert.RawSubject, &rdns); err == nil && len(rest) == 0 {
		return "User:" + rdns.String()
	}
	return "User:" + cert.Subject.String()
}

// Anonymous is the principal of an unauthenticated connection.
const Anonymous = "User:ANONYMOUS"
