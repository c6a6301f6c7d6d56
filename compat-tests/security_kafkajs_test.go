package compattests

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// KafkaJS 2.2.4 (install-kafkajs.sh) against the secure broker, driven by
// testdata/kafkajs_secure.js: SCRAM-SHA-256 and SCRAM-SHA-512 over
// SASL_PLAINTEXT and SASL_SSL (the test CA), and TLS with a client
// certificate (mTLS principal) on the SSL listener. Each case: the right
// credentials produce and read the records back as a group member that
// commits; a wrong password fails with KafkaJSSASLAuthenticationError;
// without WRITE a KafkaJSProtocolError of type TOPIC_AUTHORIZATION_FAILED;
// READ on the topic but not the group GROUP_AUTHORIZATION_FAILED.

type jsError struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type jsResult struct {
	OK       bool      `json:"ok"`
	Error    *jsError  `json:"error"`
	Causes   []jsError `json:"causes"`
	Consumed []string  `json:"consumed"`
	out      string
}

// has reports whether the error or one of its causes is named name (if
// not empty) with protocol error type typ (if not empty).
func (r jsResult) has(name, typ string) bool {
	if r.Error == nil {
		return false
	}
	return slices.ContainsFunc(append([]jsError{*r.Error}, r.Causes...), func(e jsError) bool {
		return (name == "" || e.Name == name) && (typ == "" || e.Type == typ)
	})
}

func TestSecurityKafkaJS(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		skipUnlessRequired(t, "node not found: run compat-tests/install-kafkajs.sh")
	}
	modules := filepath.Join(kafkajsDir(), "node_modules")
	if _, err := os.Stat(filepath.Join(modules, "kafkajs", "package.json")); err != nil {
		skipUnlessRequired(t, "kafkajs not installed in "+modules+": run compat-tests/install-kafkajs.sh")
	}
	if pkg, err := os.ReadFile(filepath.Join(modules, "kafkajs", "package.json")); err == nil {
		var v struct{ Version string }
		_ = json.Unmarshal(pkg, &v)
		t.Logf("kafkajs %s", v.Version)
	}
	sb := startSecureSynapse(t)
	sb.createUser(t, "kjs", "kjs-secret")

	type tc struct {
		name, addr, principal string
		ca                    bool
		mech                  string // "" for none (mTLS)
	}
	var cases []tc
	for _, l := range []struct {
		name, addr string
		tls        bool
	}{{"SASL_PLAINTEXT", sb.saslPlain, false}, {"SASL_SSL", sb.saslSSL, true}} {
		for _, mech := range []string{"scram-sha-256", "scram-sha-512"} {
			cases = append(cases, tc{strings.ToUpper(mech) + "/" + l.name, l.addr, "User:kjs", l.tls, mech})
		}
	}
	cases = append(cases, tc{"mTLS/SSL", sb.ssl, mtlsPrincipal, true, ""})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t, 120*time.Second)
			topic := uniqueTopic(t)
			group, roTopic, roGroup := topic+"-g", topic+"-ro", topic+"-ro-g"
			setupSecureTopics(t, ctx, sb, c.principal, topic, group, roTopic, roGroup)
			run := func(password, action, topic, group string, values ...string) jsResult {
				cfg := map[string]any{"brokers": []string{c.addr}, "action": action, "topic": topic, "group": group, "values": values}
				if c.ca {
					cfg["ca"] = sb.certs.caFile
				}
				if c.mech != "" {
					cfg["sasl"] = map[string]string{"mechanism": c.mech, "username": "kjs", "password": password}
				} else {
					cfg["cert"], cfg["key"] = sb.certs.clientCert, sb.certs.clientKy
				}
				return runKafkaJSSecure(t, ctx, node, modules, cfg)
			}

			t.Run("produce_consume_group", func(t *testing.T) {
				want := []string{"one", "two", "three"}
				res := run("kjs-secret", "roundtrip", topic, group, want...)
				if !res.OK {
					t.Fatalf("roundtrip: %+v %+v\n%s", res.Error, res.Causes, res.out)
				}
				if !slices.Equal(res.Consumed, want) {
					t.Fatalf("consumed %q, want %q", res.Consumed, want)
				}
				checkCommitted(t, ctx, sb, group, topic, int64(len(want)))
			})
			if c.mech != "" {
				t.Run("wrong_password", func(t *testing.T) {
					res := run("not-the-password", "connect", topic, "")
					if res.OK || !res.has("KafkaJSSASLAuthenticationError", "") {
						t.Fatalf("wrong password: %+v %+v, want KafkaJSSASLAuthenticationError\n%s", res.Error, res.Causes, res.out)
					}
				})
			}
			t.Run("no_write", func(t *testing.T) {
				res := run("kjs-secret", "produce", roTopic, "", "denied")
				if res.OK || !res.has("KafkaJSProtocolError", "TOPIC_AUTHORIZATION_FAILED") {
					t.Fatalf("produce without WRITE: %+v %+v, want KafkaJSProtocolError TOPIC_AUTHORIZATION_FAILED\n%s", res.Error, res.Causes, res.out)
				}
			})
			t.Run("no_group_read", func(t *testing.T) {
				res := run("kjs-secret", "group", roTopic, roGroup)
				if res.OK || !res.has("KafkaJSProtocolError", "GROUP_AUTHORIZATION_FAILED") {
					t.Fatalf("consumer group without READ on the group: %+v %+v, want KafkaJSProtocolError GROUP_AUTHORIZATION_FAILED\n%s", res.Error, res.Causes, res.out)
				}
			})
		})
	}
}

// runKafkaJSSecure runs testdata/kafkajs_secure.js with cfg and returns its
// RESULT line.
func runKafkaJSSecure(t testing.TB, ctx context.Context, node, modules string, cfg map[string]any) jsResult {
	t.Helper()
	arg, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, node, "testdata/kafkajs_secure.js", string(arg))
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "KAFKAJS_NO_PARTITIONER_WARNING=1")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kafkajs_secure.js %s: %v\n%s", cfg["action"], err, out)
	}
	var res jsResult
	for _, line := range strings.Split(string(out), "\n") {
		if js, ok := strings.CutPrefix(line, "RESULT "); ok {
			if err := json.Unmarshal([]byte(js), &res); err != nil {
				t.Fatalf("kafkajs_secure.js RESULT %q: %v", js, err)
			}
			res.out = string(out)
			return res
		}
	}
	t.Fatalf("kafkajs_secure.js %s printed no RESULT line:\n%s", cfg["action"], out)
	return res
}
