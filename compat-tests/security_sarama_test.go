package compattests

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/xdg-go/scram"
)

// IBM/sarama against the secure broker: SCRAM-SHA-256 and SCRAM-SHA-512
// (SaslHandshake v1 + SaslAuthenticate, sarama's default) over
// SASL_PLAINTEXT and SASL_SSL, and TLS with a client certificate (mTLS
// principal) on the SSL listener. Each case: the right credentials
// produce and consume the records back through a consumer group (which
// commits); wrong ones fail with SASL_AUTHENTICATION_FAILED; without
// WRITE a produce fails with TOPIC_AUTHORIZATION_FAILED; READ on a topic
// but not on the group fails with GROUP_AUTHORIZATION_FAILED.

// xdgSCRAMClient is sarama's SCRAMClient on github.com/xdg-go/scram, as
// sarama's examples/sasl_scram_client does it.
type xdgSCRAMClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (x *xdgSCRAMClient) Begin(user, password, authzID string) error {
	cl, err := x.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	x.conv = cl.NewConversation()
	return nil
}

func (x *xdgSCRAMClient) Step(challenge string) (string, error) { return x.conv.Step(challenge) }

func (x *xdgSCRAMClient) Done() bool { return x.conv.Done() }

var _ sarama.SCRAMClient = (*xdgSCRAMClient)(nil)

// saramaSecureConfig is a sarama config for a secure listener: SASL with
// mech (empty for none) as user/password, TLS (the test CA, with mtls the
// client certificate) when tlsOn.
func saramaSecureConfig(sb *secureBroker, mech sarama.SASLMechanism, user, password string, tlsOn, mtls bool) *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.ClientID = "compat-tests-sarama-secure"
	cfg.Version = sarama.V2_8_0_0
	cfg.Net.DialTimeout = 5 * time.Second
	cfg.Net.ReadTimeout = 10 * time.Second
	cfg.Net.WriteTimeout = 10 * time.Second
	cfg.Metadata.Retry.Max = 2
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Retry.Max = 2
	cfg.Producer.Retry.Backoff = 100 * time.Millisecond
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.MaxWaitTime = 250 * time.Millisecond
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Enable = false
	cfg.Consumer.Group.Rebalance.Retry.Max = 1
	cfg.Consumer.Group.Rebalance.Retry.Backoff = 200 * time.Millisecond
	if mech != "" {
		cfg.Net.SASL.Enable = true
		cfg.Net.SASL.Mechanism = mech
		cfg.Net.SASL.User, cfg.Net.SASL.Password = user, password
		cfg.Net.SASL.Handshake = true
		cfg.Net.SASL.Version = sarama.SASLHandshakeV1
		switch mech {
		case sarama.SASLTypeSCRAMSHA256:
			cfg.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &xdgSCRAMClient{hash: sha256.New} }
		case sarama.SASLTypeSCRAMSHA512:
			cfg.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &xdgSCRAMClient{hash: sha512.New} }
		}
	}
	if tlsOn {
		cfg.Net.TLS.Enable = true
		cfg.Net.TLS.Config = sb.certs.tlsConfig(mtls)
	}
	return cfg
}

func TestSecuritySarama(t *testing.T) {
	sb := startSecureSynapse(t)
	t.Logf("sarama %s (github.com/IBM/sarama), SCRAM client github.com/xdg-go/scram", "v1.61.1")
	sb.createUser(t, "sarama", "sarama-secret")
	type tc struct {
		name      string
		addr      string
		principal string
		good, bad *sarama.Config // bad nil: no credentials to get wrong
	}
	var cases []tc
	for _, l := range []struct {
		name string
		addr string
		tls  bool
	}{{"SASL_PLAINTEXT", sb.saslPlain, false}, {"SASL_SSL", sb.saslSSL, true}} {
		for _, mech := range []sarama.SASLMechanism{sarama.SASLTypeSCRAMSHA256, sarama.SASLTypeSCRAMSHA512} {
			cases = append(cases, tc{
				name: string(mech) + "/" + l.name, addr: l.addr, principal: "User:sarama",
				good: saramaSecureConfig(sb, mech, "sarama", "sarama-secret", l.tls, false),
				bad:  saramaSecureConfig(sb, mech, "sarama", "not-the-password", l.tls, false),
			})
		}
	}
	cases = append(cases, tc{name: "mTLS/SSL", addr: sb.ssl, principal: mtlsPrincipal,
		good: saramaSecureConfig(sb, "", "", "", true, true)})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			topic := uniqueTopic(t)
			group := topic + "-g"
			roTopic, roGroup := topic+"-ro", topic+"-ro-g"
			setupSecureTopics(t, ctx, sb, c.principal, topic, group, roTopic, roGroup)

			t.Run("produce_consume_group", func(t *testing.T) {
				want := []string{"one", "two", "three"}
				saramaSecureProduce(t, ctx, c.addr, c.good, topic, want)
				got := saramaSecureGroupConsume(t, ctx, c.addr, c.good, topic, group, len(want))
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("consumed %q, want %q", got, want)
				}
				checkCommitted(t, ctx, sb, group, topic, int64(len(want)))
			})
			if c.bad != nil {
				t.Run("wrong_password", func(t *testing.T) {
					cl, err := sarama.NewClient([]string{c.addr}, c.bad)
					if err == nil {
						cl.Close()
						t.Fatal("sarama.NewClient with a wrong password succeeded")
					}
					if !errors.Is(err, sarama.ErrSASLAuthenticationFailed) {
						t.Fatalf("wrong password: %v, want SASL_AUTHENTICATION_FAILED", err)
					}
				})
			}
			if c.bad == nil {
				// The same TLS listener without the client certificate
				// is User:ANONYMOUS, which has no ACL on topic.
				t.Run("no_client_cert", func(t *testing.T) {
					p, err := sarama.NewSyncProducer([]string{c.addr}, saramaSecureConfig(sb, "", "", "", true, false))
					if err != nil {
						t.Fatalf("sarama.NewSyncProducer: %v", err)
					}
					defer p.Close()
					_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("anonymous")})
					if !errors.Is(err, sarama.ErrTopicAuthorizationFailed) {
						t.Fatalf("produce without a client certificate: %v, want TOPIC_AUTHORIZATION_FAILED", err)
					}
				})
			}
			t.Run("no_write", func(t *testing.T) {
				p, err := sarama.NewSyncProducer([]string{c.addr}, c.good)
				if err != nil {
					t.Fatalf("sarama.NewSyncProducer: %v", err)
				}
				defer p.Close()
				_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: roTopic, Value: sarama.StringEncoder("denied")})
				if !errors.Is(err, sarama.ErrTopicAuthorizationFailed) {
					t.Fatalf("produce without WRITE: %v, want TOPIC_AUTHORIZATION_FAILED", err)
				}
			})
			t.Run("no_group_read", func(t *testing.T) {
				err := saramaSecureGroupErr(t, ctx, c.addr, c.good, roTopic, roGroup)
				if !errors.Is(err, sarama.ErrGroupAuthorizationFailed) {
					t.Fatalf("consumer group without READ on the group: %v, want GROUP_AUTHORIZATION_FAILED", err)
				}
			})
		})
	}
}

// denyWriteAndGroupRead sets up the refusals every client test checks:
// principal may READ and DESCRIBE topic but not WRITE it, and may
// DESCRIBE group (so FindCoordinator answers) but not READ it (so
// JoinGroup is refused).
func (sb *secureBroker) denyWriteAndGroupRead(t testing.TB, principal, topic, group string) {
	t.Helper()
	sb.allow(t, kadm.NewACLs().Allow(principal).Topics(topic).
		Operations(kadm.OpRead, kadm.OpDescribe).ResourcePatternType(kadm.ACLPatternLiteral))
	sb.allow(t, kadm.NewACLs().Allow(principal).Groups(group).
		Operations(kadm.OpDescribe).ResourcePatternType(kadm.ACLPatternLiteral))
}

// setupSecureTopics creates topic and roTopic as admin and grants
// principal a client's ACLs on topic and group, and only READ/DESCRIBE on
// roTopic and DESCRIBE on roGroup.
func setupSecureTopics(t testing.TB, ctx context.Context, sb *secureBroker, principal, topic, group, roTopic, roGroup string) {
	t.Helper()
	adm := sb.adm(t)
	for _, tp := range []string{topic, roTopic} {
		if _, err := adm.CreateTopic(ctx, 1, 1, nil, tp); err != nil {
			t.Fatalf("create %s: %v", tp, err)
		}
	}
	sb.grantClient(t, principal, topic, group)
	sb.denyWriteAndGroupRead(t, principal, roTopic, roGroup)
}

// checkCommitted checks that group committed offset want on topic p0.
func checkCommitted(t testing.TB, ctx context.Context, sb *secureBroker, group, topic string, want int64) {
	t.Helper()
	offs, err := sb.adm(t).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("FetchOffsets %s: %v", group, err)
	}
	if o, ok := offs.Lookup(topic, 0); !ok || o.At != want {
		t.Fatalf("committed offset of %s on %s: %+v (found %v), want %d", group, topic, o, ok, want)
	}
}

func saramaSecureProduce(t testing.TB, ctx context.Context, addr string, cfg *sarama.Config, topic string, values []string) {
	t.Helper()
	p, err := sarama.NewSyncProducer([]string{addr}, cfg)
	if err != nil {
		t.Fatalf("sarama.NewSyncProducer: %v", err)
	}
	defer p.Close()
	msgs := make([]*sarama.ProducerMessage, len(values))
	for i, v := range values {
		msgs[i] = &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("k%d", i)), Value: sarama.StringEncoder(v)}
	}
	done := make(chan error, 1)
	go func() { done <- p.SendMessages(msgs) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("produce %s: %v", topic, err)
		}
	case <-ctx.Done():
		t.Fatalf("produce %s: %v", topic, ctx.Err())
	}
}

// saramaSecureHandler collects the values of n records, marks them and
// commits, then ends the session.
type saramaSecureHandler struct {
	n      int
	got    []string
	cancel context.CancelFunc
}

func (h *saramaSecureHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *saramaSecureHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *saramaSecureHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			h.got = append(h.got, string(m.Value))
			sess.MarkMessage(m, "")
			if len(h.got) == h.n {
				sess.Commit()
				h.cancel()
				return nil
			}
		case <-sess.Context().Done():
			return nil
		}
	}
}

// saramaSecureGroupConsume reads n records of topic (one partition) as a member
// of group and commits them.
func saramaSecureGroupConsume(t testing.TB, ctx context.Context, addr string, cfg *sarama.Config, topic, group string, n int) []string {
	t.Helper()
	cg, err := sarama.NewConsumerGroup([]string{addr}, group, cfg)
	if err != nil {
		t.Fatalf("sarama.NewConsumerGroup: %v", err)
	}
	defer cg.Close()
	go func() {
		for err := range cg.Errors() {
			t.Logf("consumer group %s: %v", group, err)
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	h := &saramaSecureHandler{n: n, cancel: cancel}
	for len(h.got) < n && cctx.Err() == nil {
		if err := cg.Consume(cctx, []string{topic}, h); err != nil && cctx.Err() == nil {
			t.Fatalf("consumer group %s: %v", group, err)
		}
	}
	if len(h.got) < n {
		t.Fatalf("consumer group %s: %d of %d records: %v", group, len(h.got), n, cctx.Err())
	}
	return h.got
}

// saramaSecureGroupErr joins group for topic and returns the first error
// (from Consume or the group's error channel), bounded to 20 s.
func saramaSecureGroupErr(t testing.TB, ctx context.Context, addr string, cfg *sarama.Config, topic, group string) error {
	t.Helper()
	cg, err := sarama.NewConsumerGroup([]string{addr}, group, cfg)
	if err != nil {
		t.Fatalf("sarama.NewConsumerGroup: %v", err)
	}
	defer cg.Close()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	go func() {
		for err := range cg.Errors() {
			select {
			case errs <- err:
			default:
			}
		}
	}()
	go func() {
		h := &saramaSecureHandler{n: 1 << 30, cancel: cancel}
		errs <- cg.Consume(cctx, []string{topic}, h)
	}()
	select {
	case err := <-errs:
		return err
	case <-cctx.Done():
		return cctx.Err()
	}
}
