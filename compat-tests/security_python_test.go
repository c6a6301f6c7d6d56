package compattests

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// kafka-python 2.0.2 (Debian's python3-kafka under /usr/bin/python3)
// against the secure broker, driven by testdata/secure_kafka_python.py:
// SASL PLAIN over SASL_PLAINTEXT (a v0 SaslHandshake, then bare tokens)
// and SASL_SSL, SCRAM-SHA-256/512 (bare tokens too), and SSL with the CA
// and a client certificate (mTLS principal). Each case: the right
// credentials produce and read the records back as a group member that
// commits; a wrong password ends in a closed connection during the SASL
// exchange (v0 has no error field: the broker closes, as Kafka does) and
// NoBrokersAvailable; without WRITE TopicAuthorizationFailedError; READ on
// the topic but not the group GroupAuthorizationFailedError.

type pyResult struct {
	OK       bool     `json:"ok"`
	Error    string   `json:"error"`
	Message  string   `json:"message"`
	Consumed []string `json:"consumed"`
	AuthLog  []string `json:"auth_log"`
	out      string   // the script's whole output
}

// runSecurePython runs testdata/secure_kafka_python.py with cfg and returns
// its RESULT line.
func runSecurePython(t testing.TB, ctx context.Context, cfg map[string]any) pyResult {
	t.Helper()
	arg, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path, err := filepath.Abs(filepath.Join("testdata", "secure_kafka_python.py"))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, systemPython, path, string(arg))
	cmd.Env = pythonEnv()
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("secure_kafka_python.py %s: %v\n%s", cfg["action"], err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	js, ok := strings.CutPrefix(last, "RESULT ")
	if !ok {
		t.Fatalf("secure_kafka_python.py %s printed no RESULT line:\n%s", cfg["action"], out)
	}
	var res pyResult
	if err := json.Unmarshal([]byte(js), &res); err != nil {
		t.Fatalf("secure_kafka_python.py RESULT %q: %v", js, err)
	}
	res.out = string(out)
	return res
}

func TestSecurityKafkaPython(t *testing.T) {
	pythonModule(t, "kafka", "python3-kafka")
	sb := startSecureSynapse(t)
	t.Log("kafka-python (Debian python3-kafka) under " + systemPython)
	sb.createUser(t, "kpy", "kpy-secret")
	sasl := func(protocol, mech, password string) map[string]any {
		c := map[string]any{"security_protocol": protocol, "sasl_mechanism": mech,
			"sasl_plain_username": "kpy", "sasl_plain_password": password}
		if protocol == "SASL_SSL" {
			c["ssl_cafile"] = sb.certs.caFile
		}
		return c
	}
	ssl := func(mtls bool) map[string]any {
		c := map[string]any{"security_protocol": "SSL", "ssl_cafile": sb.certs.caFile}
		if mtls {
			c["ssl_certfile"], c["ssl_keyfile"] = sb.certs.clientCert, sb.certs.clientKy
		}
		return c
	}
	cases := []struct {
		name, addr, principal string
		good, bad             map[string]any // bad nil: no credentials to get wrong
	}{
		{"PLAIN/SASL_PLAINTEXT", sb.saslPlain, "User:kpy", sasl("SASL_PLAINTEXT", "PLAIN", "kpy-secret"), sasl("SASL_PLAINTEXT", "PLAIN", "wrong")},
		{"PLAIN/SASL_SSL", sb.saslSSL, "User:kpy", sasl("SASL_SSL", "PLAIN", "kpy-secret"), sasl("SASL_SSL", "PLAIN", "wrong")},
		{"SCRAM-SHA-256/SASL_PLAINTEXT", sb.saslPlain, "User:kpy", sasl("SASL_PLAINTEXT", "SCRAM-SHA-256", "kpy-secret"), sasl("SASL_PLAINTEXT", "SCRAM-SHA-256", "wrong")},
		{"SCRAM-SHA-512/SASL_SSL", sb.saslSSL, "User:kpy", sasl("SASL_SSL", "SCRAM-SHA-512", "kpy-secret"), sasl("SASL_SSL", "SCRAM-SHA-512", "wrong")},
		{"mTLS/SSL", sb.ssl, mtlsPrincipal, ssl(true), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t, 120*time.Second)
			topic := uniqueTopic(t)
			group, roTopic, roGroup := topic+"-g", topic+"-ro", topic+"-ro-g"
			setupSecureTopics(t, ctx, sb, c.principal, topic, group, roTopic, roGroup)
			run := func(client map[string]any, action, topic, group string, values ...string) pyResult {
				return runSecurePython(t, ctx, map[string]any{"bootstrap": c.addr, "client": client,
					"action": action, "topic": topic, "group": group, "values": values})
			}

			t.Run("produce_consume_group", func(t *testing.T) {
				want := []string{"one", "two", "three"}
				res := run(c.good, "roundtrip", topic, group, want...)
				if !res.OK {
					t.Fatalf("roundtrip: %s: %s\n%s", res.Error, res.Message, res.out)
				}
				if !slices.Equal(res.Consumed, want) {
					t.Fatalf("consumed %q, want %q", res.Consumed, want)
				}
				checkCommitted(t, ctx, sb, group, topic, int64(len(want)))
			})
			if c.bad != nil {
				t.Run("wrong_password", func(t *testing.T) {
					res := run(c.bad, "connect", topic, "")
					if res.OK || res.Error != "NoBrokersAvailable" {
						t.Fatalf("wrong password: %s %q, want NoBrokersAvailable\n%s", res.Error, res.Message, res.out)
					}
					// The broker closed the connection in answer to the
					// SASL token(s): kafka-python's v0 authentication failure.
					failed := slices.ContainsFunc(res.AuthLog, func(l string) bool { return strings.Contains(l, "Error receiving reply from server") })
					authed := slices.ContainsFunc(res.AuthLog, func(l string) bool { return strings.Contains(l, "Authenticated as") })
					if !failed || authed {
						t.Fatalf("wrong password: authentication log %q, want the SASL exchange closed by the broker\n%s", res.AuthLog, res.out)
					}
				})
			} else {
				// The TLS listener without the client certificate is
				// User:ANONYMOUS. Given DESCRIBE on topic (kafka-python
				// 2.0.2's producer turns a Metadata answer of
				// TOPIC_AUTHORIZATION_FAILED for its one topic into a
				// KafkaTimeoutError), its produce is refused where the
				// certificate's principal's succeeded.
				t.Run("no_client_cert", func(t *testing.T) {
					sb.allow(t, kadm.NewACLs().Allow("User:ANONYMOUS").Topics(topic).
						Operations(kadm.OpDescribe).ResourcePatternType(kadm.ACLPatternLiteral))
					res := run(ssl(false), "produce", topic, "", "anonymous")
					if res.OK || res.Error != "TopicAuthorizationFailedError" {
						t.Fatalf("produce without a client certificate: %s %q, want TopicAuthorizationFailedError\n%s", res.Error, res.Message, res.out)
					}
				})
			}
			t.Run("no_write", func(t *testing.T) {
				res := run(c.good, "produce", roTopic, "", "denied")
				if res.OK || res.Error != "TopicAuthorizationFailedError" {
					t.Fatalf("produce without WRITE: %s %q, want TopicAuthorizationFailedError\n%s", res.Error, res.Message, res.out)
				}
			})
			t.Run("no_group_read", func(t *testing.T) {
				res := run(c.good, "group", roTopic, roGroup)
				if res.OK || res.Error != "GroupAuthorizationFailedError" {
					t.Fatalf("consumer group without READ on the group: %s %q, want GroupAuthorizationFailedError\n%s", res.Error, res.Message, res.out)
				}
			})
		})
	}
}
