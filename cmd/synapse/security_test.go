package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// serve with --listeners: a PLAINTEXT and a SASL_PLAINTEXT listener, each
// advertising its own address; the admin from SYNAPSE_ADMIN_PASSWORD logs
// in with SCRAM; `synapse user` manages users through the broker; the side
// port asks for a login beyond health and metrics.
func TestServeListenersAndUsers(t *testing.T) {
	data := t.TempDir()
	plainAddr, saslAddr, httpAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	t.Setenv("SYNAPSE_ADMIN_PASSWORD", "pw-admin")
	cancel, done := serveInBackground(t, "--log-format", "json", "serve", "--data-dir", data,
		"--listeners", "PLAINTEXT://"+plainAddr+",SASL_PLAINTEXT://"+saslAddr,
		"--advertised-listeners", "SASL_PLAINTEXT://"+saslAddr,
		"--sasl-mechanisms", "SCRAM-SHA-512,PLAIN", "--authorizer", "acl", "--pprof", "--http-listen", httpAddr)
	defer func() {
		cancel()
		if r := <-done; r.err != nil {
			t.Errorf("serve: %v\n%s", r.err, r.stderr)
		}
	}()
	cl, err := kgo.NewClient(kgo.SeedBrokers(saslAddr), kgo.SASL(scram.Auth{User: "admin", Pass: "pw-admin"}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cctx := context.WithTimeout(context.Background(), 20*time.Second)
	defer cctx()
	var md kadm.Metadata
	for {
		if md, err = adm.BrokerMetadata(ctx); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || len(md.Brokers) != 1 || net.JoinHostPort(md.Brokers[0].Host, itoa32(md.Brokers[0].Port)) != saslAddr {
		t.Fatalf("metadata on the SASL listener: %v %+v", err, md.Brokers)
	}
	pwFile := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pwFile, []byte("bob-pw\n"), 0o600)
	args := []string{"--bootstrap-server", saslAddr, "--sasl-mechanism", "SCRAM-SHA-512"}
	if out, stderr, err := run(t, ctx, append([]string{"user", "create", "bob", "--password-file", pwFile}, args...)...); err != nil || !strings.Contains(out, "user bob updated") {
		t.Fatalf("user create: %v %q %s", err, out, stderr)
	}
	out, _, err := run(t, ctx, append([]string{"user", "list"}, args...)...)
	if err != nil || !strings.Contains(out, "bob    SCRAM-SHA-512  4096") || !strings.Contains(out, "admin") {
		t.Fatalf("user list: %v\n%s", err, out)
	}
	if _, _, err := run(t, ctx, "user", "list", "--bootstrap-server", plainAddr, "--timeout", "2s"); err == nil || !strings.Contains(err.Error(), "CLUSTER_AUTHORIZATION_FAILED") {
		t.Fatalf("user list as ANONYMOUS: %v, want CLUSTER_AUTHORIZATION_FAILED", err)
	}
	bob, err := kgo.NewClient(kgo.SeedBrokers(saslAddr), kgo.SASL(scram.Auth{User: "bob", Pass: "bob-pw"}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	if err := bob.Ping(ctx); err != nil {
		t.Fatalf("bob logs in: %v", err)
	}
	for path, want := range map[string]int{"/healthz": 200, "/metrics": 200, "/status": 401, "/debug/pprof/": 401} {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil || resp.StatusCode != want {
			t.Errorf("GET %s: %v %v, want %d", path, err, resp, want)
		}
		if err == nil {
			resp.Body.Close()
		}
	}
	req, _ := http.NewRequest("GET", "http://"+httpAddr+"/status", nil)
	req.SetBasicAuth("admin", "pw-admin")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("GET /status as admin: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}
}

func itoa32(p int32) string { return strconv.Itoa(int(p)) }

func TestServeRejectsBadSecurityFlags(t *testing.T) {
	data := t.TempDir()
	for _, args := range [][]string{
		{"serve", "--data-dir", data, "--listeners", "HTTP://127.0.0.1:0"},
		{"serve", "--data-dir", data, "--listeners", "PLAINTEXT://127.0.0.1:0", "--listen", "127.0.0.1:0"},
		{"serve", "--data-dir", data, "--listeners", "SSL://127.0.0.1:0"}, // no certificate
		{"serve", "--data-dir", data, "--listeners", "SASL_PLAINTEXT://127.0.0.1:0", "--sasl-mechanisms", "GSSAPI"},
		{"serve", "--data-dir", data, "--listeners", "SASL_PLAINTEXT://127.0.0.1:0", "--sasl-mechanisms", "OAUTHBEARER"}, // no validator
		{"serve", "--data-dir", data, "--authorizer", "opa"},
		{"serve", "--data-dir", data, "--advertised-listeners", "SSL://x:1"},
	} {
		if _, _, err := run(t, cancelled(), args...); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
