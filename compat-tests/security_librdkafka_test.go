//go:build cgo

package compattests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// librdkafka against the secure broker, twice: confluent-kafka-go (its
// bundled librdkafka) and kcat (Debian's, on the system librdkafka). Over
// SASL_SSL (ssl.ca.location = the test CA) with SCRAM-SHA-256,
// SCRAM-SHA-512 and PLAIN, plus SCRAM-SHA-512 over SASL_PLAINTEXT and TLS
// with a client certificate (mTLS) on the SSL listener. Each case: the
// right credentials produce and consume the records back through a
// consumer group (which commits); a wrong password fails with
// _AUTHENTICATION (-169); without WRITE a delivery fails with
// TOPIC_AUTHORIZATION_FAILED (29); READ on a topic but not on the group
// fails with GROUP_AUTHORIZATION_FAILED (30).
//
// Built with cgo only, like confluent_test.go (kcat is here too: one file
// for librdkafka).

type rdkCase struct {
	name      string
	principal string
	good, bad map[string]string // librdkafka properties; bad nil: no credentials to get wrong
}

// rdkSecureProps are the librdkafka properties of a client of sb's
// listener for protocol (SASL_SSL, SASL_PLAINTEXT or SSL), with mech
// (empty for none) as user/password; mtls adds the client certificate.
func rdkSecureProps(sb *secureBroker, protocol, mech, user, password string, mtls bool) map[string]string {
	addr := map[string]string{"SASL_SSL": sb.saslSSL, "SASL_PLAINTEXT": sb.saslPlain, "SSL": sb.ssl}[protocol]
	p := map[string]string{
		"bootstrap.servers": addr,
		"security.protocol": protocol,
		"log_level":         "3",
	}
	if mech != "" {
		p["sasl.mechanisms"], p["sasl.username"], p["sasl.password"] = mech, user, password
	}
	if strings.Contains(protocol, "SSL") {
		p["ssl.ca.location"] = sb.certs.caFile
		// The server certificate names IP 127.0.0.1, which librdkafka 2.x
		// checks by default (ssl.endpoint.identification.algorithm=https).
	}
	if mtls {
		p["ssl.certificate.location"], p["ssl.key.location"] = sb.certs.clientCert, sb.certs.clientKy
	}
	return p
}

func rdkCases(sb *secureBroker, user, password string) []rdkCase {
	var cases []rdkCase
	for _, c := range []struct{ protocol, mech string }{
		{"SASL_SSL", "SCRAM-SHA-256"}, {"SASL_SSL", "SCRAM-SHA-512"}, {"SASL_SSL", "PLAIN"},
		{"SASL_PLAINTEXT", "SCRAM-SHA-512"},
	} {
		cases = append(cases, rdkCase{
			name: c.mech + "/" + c.protocol, principal: "User:" + user,
			good: rdkSecureProps(sb, c.protocol, c.mech, user, password, false),
			bad:  rdkSecureProps(sb, c.protocol, c.mech, user, password+"-wrong", false),
		})
	}
	return append(cases, rdkCase{name: "mTLS/SSL", principal: mtlsPrincipal,
		good: rdkSecureProps(sb, "SSL", "", "", "", true)})
}

// ---- confluent-kafka-go -----------------------------------------------------

func TestSecurityConfluent(t *testing.T) {
	sb := startSecureSynapse(t)
	t.Logf("confluent-kafka-go v2 with librdkafka %s (bundled)", kafkaLibVersion())
	sb.createUser(t, "rdk", "rdk-secret")
	for _, c := range rdkCases(sb, "rdk", "rdk-secret") {
		if c.bad != nil {
			// The failures it is told to expect are logged by librdkafka
			// at error level (3) on stderr: keep them out of the output.
			c.bad["log_level"] = "2"
		}
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t, 90*time.Second)
			topic := uniqueTopic(t)
			group, roTopic, roGroup := topic+"-g", topic+"-ro", topic+"-ro-g"
			setupSecureTopics(t, ctx, sb, c.principal, topic, group, roTopic, roGroup)

			t.Run("produce_consume_group", func(t *testing.T) {
				want := []string{"one", "two", "three"}
				for _, err := range confluentSecureProduce(t, ctx, c.good, topic, want) {
					if err != nil {
						t.Fatalf("produce %s: %v", topic, err)
					}
				}
				got := confluentSecureGroupConsume(t, ctx, c.good, topic, group, len(want))
				if !slices.Equal(got, want) {
					t.Fatalf("consumed %q, want %q", got, want)
				}
				checkCommitted(t, ctx, sb, group, topic, int64(len(want)))
			})
			if c.bad != nil {
				t.Run("wrong_password", func(t *testing.T) {
					err := confluentFirstError(t, ctx, c.bad)
					if err.Code() != kafka.ErrAuthentication {
						t.Fatalf("wrong password: %v (code %d), want _AUTHENTICATION (%d)", err, err.Code(), kafka.ErrAuthentication)
					}
					if !strings.Contains(err.String(), "SASL") {
						t.Errorf("wrong password: %q does not mention SASL", err)
					}
				})
			}
			t.Run("no_write", func(t *testing.T) {
				errs := confluentSecureProduce(t, ctx, c.good, roTopic, []string{"denied"})
				if len(errs) != 1 || errs[0] == nil {
					t.Fatalf("produce without WRITE: %v, want TOPIC_AUTHORIZATION_FAILED", errs)
				}
				if ke, ok := errs[0].(kafka.Error); !ok || ke.Code() != kafka.ErrTopicAuthorizationFailed {
					t.Fatalf("produce without WRITE: %v, want TOPIC_AUTHORIZATION_FAILED", errs[0])
				}
			})
			t.Run("no_group_read", func(t *testing.T) {
				err := confluentGroupError(t, ctx, c.good, roTopic, roGroup)
				if err.Code() != kafka.ErrGroupAuthorizationFailed {
					t.Fatalf("consumer group without READ on the group: %v (code %d), want GROUP_AUTHORIZATION_FAILED", err, err.Code())
				}
			})
		})
	}
}

func confluentConfig(props map[string]string, more kafka.ConfigMap) *kafka.ConfigMap {
	cm := kafka.ConfigMap{}
	for k, v := range props {
		cm[k] = v
	}
	for k, v := range more {
		cm[k] = v
	}
	return &cm
}

// confluentSecureProduce produces values to topic p0 (acks=all) and returns
// each delivery's error.
func confluentSecureProduce(t testing.TB, ctx context.Context, props map[string]string, topic string, values []string) []error {
	t.Helper()
	p, err := kafka.NewProducer(confluentConfig(props, kafka.ConfigMap{
		"acks": "all", "linger.ms": 5, "message.timeout.ms": 15000, "go.logs.channel.enable": false,
	}))
	if err != nil {
		t.Fatalf("kafka.NewProducer: %v", err)
	}
	defer p.Close()
	go func() {
		for range p.Events() {
		}
	}()
	reports := make(chan kafka.Event, len(values))
	for i, v := range values {
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: 0},
			Key: fmt.Appendf(nil, "k%d", i), Value: []byte(v), Opaque: i}
		if err := p.Produce(m, reports); err != nil {
			t.Fatalf("Produce: %v", err)
		}
	}
	errs := make([]error, len(values))
	for range values {
		select {
		case ev := <-reports:
			m, ok := ev.(*kafka.Message)
			if !ok {
				t.Fatalf("produce %s: unexpected delivery event %v", topic, ev)
			}
			errs[m.Opaque.(int)] = m.TopicPartition.Error
		case <-ctx.Done():
			t.Fatalf("produce %s: waiting for delivery reports: %v", topic, ctx.Err())
		}
	}
	return errs
}

func confluentGroupConsumer(t testing.TB, props map[string]string, topic, group string) *kafka.Consumer {
	t.Helper()
	c, err := kafka.NewConsumer(confluentConfig(props, kafka.ConfigMap{
		"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": false,
		"session.timeout.ms": 6000, "fetch.wait.max.ms": 250,
	}))
	if err != nil {
		t.Fatalf("kafka.NewConsumer: %v", err)
	}
	if err := c.SubscribeTopics([]string{topic}, nil); err != nil {
		c.Close()
		t.Fatalf("SubscribeTopics %s: %v", topic, err)
	}
	return c
}

// confluentSecureGroupConsume reads n records of topic as a member of
// group and commits them.
func confluentSecureGroupConsume(t testing.TB, ctx context.Context, props map[string]string, topic, group string, n int) []string {
	t.Helper()
	c := confluentGroupConsumer(t, props, topic, group)
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	var got []string
	for len(got) < n {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("consumer group %s: %d of %d records after 30 s", group, len(got), n)
		}
		switch ev := c.Poll(200).(type) {
		case *kafka.Message:
			if ev.TopicPartition.Error != nil {
				t.Fatalf("consume %s: %v", topic, ev.TopicPartition.Error)
			}
			got = append(got, string(ev.Value))
		case kafka.Error:
			t.Fatalf("consumer group %s: %v", group, ev)
		}
	}
	if _, err := c.Commit(); err != nil {
		t.Fatalf("Commit %s: %v", group, err)
	}
	return got
}

// confluentGroupError joins group for topic and returns the first error
// the consumer reports (within 20 s).
func confluentGroupError(t testing.TB, ctx context.Context, props map[string]string, topic, group string) kafka.Error {
	t.Helper()
	c := confluentGroupConsumer(t, props, topic, group)
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		switch ev := c.Poll(200).(type) {
		case *kafka.Message:
			t.Fatalf("consumer group %s without READ on the group consumed %s", group, ev.TopicPartition)
		case kafka.Error:
			return ev
		}
	}
	t.Fatalf("consumer group %s: no error within 20 s", group)
	return kafka.Error{}
}

// confluentFirstError starts a producer with props and returns the first
// error event librdkafka reports (within 20 s); connecting to the
// bootstrap broker is all that is needed to authenticate.
func confluentFirstError(t testing.TB, ctx context.Context, props map[string]string) kafka.Error {
	t.Helper()
	p, err := kafka.NewProducer(confluentConfig(props, kafka.ConfigMap{"go.logs.channel.enable": false}))
	if err != nil {
		t.Fatalf("kafka.NewProducer: %v", err)
	}
	defer p.Close()
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	for {
		select {
		case ev := <-p.Events():
			if ke, ok := ev.(kafka.Error); ok {
				return ke
			}
		case <-timer.C:
			t.Fatal("no error event within 20 s")
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
}

// ---- kcat -------------------------------------------------------------------

func TestSecurityKcat(t *testing.T) {
	bin := kcatPath(t)
	sb := startSecureSynapse(t)
	sb.createUser(t, "kcat", "kcat-secret")
	version := kcatLibrdkafka(t, bin)
	for _, c := range rdkCases(sb, "kcat", "kcat-secret") {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t, 90*time.Second)
			// librdkafka before 2.6.1 (kcat's 2.0.2 here) repeats its
			// own nonce in the SCRAM client-final message
			// (confluentinc/librdkafka#4895); the broker accepts that form
			// as Kafka 3.8.1-3.9 did (auth/scram_compat.go), so SCRAM must
			// work here too.
			t.Logf("kcat on librdkafka %s, %s", version, c.good["sasl.mechanisms"])
			topic := uniqueTopic(t)
			group, roTopic, roGroup := topic+"-g", topic+"-ro", topic+"-ro-g"
			setupSecureTopics(t, ctx, sb, c.principal, topic, group, roTopic, roGroup)

			t.Run("produce_consume_group", func(t *testing.T) {
				want := []string{"one", "two", "three"}
				out, err := kcatSecure(ctx, bin, c.good, strings.Join(want, "\n")+"\n",
					"-P", "-t", topic, "-p", "0", "-X", "acks=all")
				if err != nil {
					t.Fatalf("kcat -P: %v\n%s", err, out)
				}
				// A balanced consumer (-G) in group: it commits on exit
				// (enable.auto.commit, committed by consumer close).
				out, err = kcatSecure(ctx, bin, c.good, "", "-C", "-G", group, "-c", fmt.Sprint(len(want)), "-J",
					"-X", "auto.offset.reset=earliest", "-X", "fetch.wait.max.ms=250", topic)
				if err != nil {
					t.Fatalf("kcat -G: %v\n%s", err, out)
				}
				var got []string
				for _, line := range strings.Split(out, "\n") {
					if !strings.HasPrefix(line, "{") {
						continue
					}
					var m struct {
						Payload string `json:"payload"`
						Offset  int64  `json:"offset"`
					}
					if err := json.Unmarshal([]byte(line), &m); err != nil {
						t.Fatalf("kcat -J line %q: %v", line, err)
					}
					got = append(got, m.Payload)
				}
				sort.Strings(got)
				sorted := slices.Sorted(slices.Values(want))
				if !slices.Equal(got, sorted) {
					t.Fatalf("consumed %q, want %q\n%s", got, want, out)
				}
				checkCommitted(t, ctx, sb, group, topic, int64(len(want)))
			})
			if c.bad != nil {
				t.Run("wrong_password", func(t *testing.T) {
					out, err := kcatSecure(ctx, bin, c.bad, "", "-L", "-m", "2")
					if err == nil {
						t.Fatalf("kcat -L with a wrong password succeeded:\n%s", out)
					}
					// librdkafka's _AUTHENTICATION (-169) error string.
					if !strings.Contains(out, "SASL authentication error") || !strings.Contains(out, "Authentication failed") {
						t.Fatalf("kcat -L with a wrong password: %v, want a SASL authentication error:\n%s", err, out)
					}
				})
			}
			t.Run("no_write", func(t *testing.T) {
				out, err := kcatSecure(ctx, bin, c.good, "denied\n", "-P", "-t", roTopic, "-p", "0",
					"-X", "acks=all", "-X", "message.timeout.ms=10000")
				if err == nil {
					t.Fatalf("kcat -P without WRITE succeeded:\n%s", out)
				}
				// TOPIC_AUTHORIZATION_FAILED (29) as librdkafka names it.
				if !strings.Contains(out, "Broker: Topic authorization failed") {
					t.Fatalf("kcat -P without WRITE: %v, want TOPIC_AUTHORIZATION_FAILED:\n%s", err, out)
				}
			})
			t.Run("no_group_read", func(t *testing.T) {
				gctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				out, err := kcatSecure(gctx, bin, c.good, "", "-C", "-G", roGroup, "-c", "1",
					"-X", "auto.offset.reset=earliest", roTopic)
				// GROUP_AUTHORIZATION_FAILED (30) as librdkafka names it.
				if !strings.Contains(out, "Broker: Group authorization failed") {
					t.Fatalf("kcat -G without READ on the group: %v, want GROUP_AUTHORIZATION_FAILED:\n%s", err, out)
				}
			})
		})
	}
}

// kcatLibrdkafka is the librdkafka version kcat -V reports ("2.0.2").
func kcatLibrdkafka(t testing.TB, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "-V").CombinedOutput()
	if err != nil {
		t.Fatalf("kcat -V: %v\n%s", err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
	m := regexp.MustCompile(`librdkafka (\d+\.\d+\.\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("kcat -V names no librdkafka version:\n%s", out)
	}
	return string(m[1])
}

// kcatSecure runs kcat with props (as -X) and args, stdin as its input,
// and returns its combined output. It stops at the first line of kcat's
// output naming an error for consumers (-C), which otherwise retry; ctx
// bounds the run.
func kcatSecure(ctx context.Context, bin string, props map[string]string, stdin string, args ...string) (string, error) {
	var full []string
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "bootstrap.servers" {
			full = append(full, "-b", props[k])
			continue
		}
		full = append(full, "-X", k+"="+props[k])
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if d := os.Getenv("KCAT_DEBUG"); d != "" { // e.g. security,protocol: librdkafka's -d
		full = append(full, "-d", d)
	}
	cmd := exec.CommandContext(cctx, bin, append(full, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}
