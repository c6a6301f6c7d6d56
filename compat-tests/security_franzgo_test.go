package compattests

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// franz-go over every secure listener and mechanism: the right credentials
// produce and consume end to end; wrong ones fail to authenticate; ACLs
// created and deleted with kadm take effect on live connections.

func TestSecurityFranzGo(t *testing.T) {
	sb := startSecureSynapse(t)
	sb.createUser(t, "alice", "alice-secret")
	cases := []struct {
		name      string
		principal string
		opts      []kgo.Opt
		bad       []kgo.Opt // wrong credentials
	}{
		{"SCRAM-SHA-256/SASL_SSL", "User:alice", []kgo.Opt{kgo.SeedBrokers(sb.saslSSL), kgo.DialTLSConfig(sb.certs.tlsConfig(false)),
			kgo.SASL(scram.Auth{User: "alice", Pass: "alice-secret"}.AsSha256Mechanism())},
			[]kgo.Opt{kgo.SeedBrokers(sb.saslSSL), kgo.DialTLSConfig(sb.certs.tlsConfig(false)),
				kgo.SASL(scram.Auth{User: "alice", Pass: "wrong"}.AsSha256Mechanism())}},
		{"SCRAM-SHA-512/SASL_PLAINTEXT", "User:alice", []kgo.Opt{kgo.SeedBrokers(sb.saslPlain),
			kgo.SASL(scram.Auth{User: "alice", Pass: "alice-secret"}.AsSha512Mechanism())},
			[]kgo.Opt{kgo.SeedBrokers(sb.saslPlain), kgo.SASL(scram.Auth{User: "mallory", Pass: "x"}.AsSha512Mechanism())}},
		{"PLAIN/SASL_SSL", "User:alice", []kgo.Opt{kgo.SeedBrokers(sb.saslSSL), kgo.DialTLSConfig(sb.certs.tlsConfig(false)),
			kgo.SASL(plain.Auth{User: "alice", Pass: "alice-secret"}.AsMechanism())},
			[]kgo.Opt{kgo.SeedBrokers(sb.saslSSL), kgo.DialTLSConfig(sb.certs.tlsConfig(false)),
				kgo.SASL(plain.Auth{User: "alice", Pass: "nope"}.AsMechanism())}},
		{"OAUTHBEARER/SASL_PLAINTEXT", "User:bob", []kgo.Opt{kgo.SeedBrokers(sb.saslPlain),
			kgo.SASL(oauth.Auth{Token: unsecuredToken("bob", time.Hour)}.AsMechanism())},
			[]kgo.Opt{kgo.SeedBrokers(sb.saslPlain), kgo.SASL(oauth.Auth{Token: unsecuredToken("bob", -time.Hour)}.AsMechanism())}},
		{"mTLS/SSL", mtlsPrincipal, []kgo.Opt{kgo.SeedBrokers(sb.ssl), kgo.DialTLSConfig(sb.certs.tlsConfig(true))}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic := uniqueTopic(t)
			group := topic + "-g"
			ctx := testCtx(t, 60*time.Second)
			cl, err := kgo.NewClient(append(tc.opts, kgo.RequestRetries(2), kgo.RetryTimeout(5*time.Second))...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			// No ACL yet: WRITE is refused with TOPIC_AUTHORIZATION_FAILED.
			err = cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("v")}).FirstErr()
			if !errors.Is(err, kerr.TopicAuthorizationFailed) && !errors.Is(err, kerr.ClusterAuthorizationFailed) {
				t.Fatalf("produce without ACLs: %v, want TOPIC_AUTHORIZATION_FAILED", err)
			}
			cl.Close()
			sb.grantClient(t, tc.principal, topic, group)
			if _, err := sb.adm(t).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
				t.Fatal(err)
			}
			cl, err = kgo.NewClient(append(tc.opts, kgo.ConsumeTopics(topic), kgo.ConsumerGroup(group),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("hello")}).FirstErr(); err != nil {
				t.Fatalf("produce with WRITE: %v", err)
			}
			fs := cl.PollFetches(ctx)
			if err := fs.Err0(); err != nil {
				t.Fatalf("consume: %v", err)
			}
			if recs := fs.Records(); len(recs) != 1 || string(recs[0].Value) != "hello" {
				t.Fatalf("consumed %d records, want the one produced", len(recs))
			}
			if err := cl.CommitUncommittedOffsets(ctx); err != nil {
				t.Fatalf("commit: %v", err)
			}
			if tc.bad != nil {
				bad, err := kgo.NewClient(append(tc.bad, kgo.RequestRetries(0))...)
				if err != nil {
					t.Fatal(err)
				}
				defer bad.Close()
				_, err = kadm.NewClient(bad).ListTopics(ctx)
				if !errors.Is(err, kerr.SaslAuthenticationFailed) {
					t.Fatalf("wrong credentials: %v, want SASL_AUTHENTICATION_FAILED", err)
				}
			}
		})
	}
}

var _ sasl.Mechanism = plain.Auth{}.AsMechanism()

func TestSecurityACLsOnLiveConnections(t *testing.T) {
	sb := startSecureSynapse(t)
	sb.createUser(t, "carol", "carol-secret")
	_, adm := sb.adminClient(t)
	ctx := testCtx(t, 60*time.Second)
	topic := uniqueTopic(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(sb.saslPlain), kgo.SASL(scram.Auth{User: "carol", Pass: "carol-secret"}.AsSha256Mechanism()),
		kgo.RequestRetries(1), kgo.RetryTimeout(3*time.Second), kgo.DisableIdempotentWrite())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	acl := kadm.NewACLs().Allow("User:carol").Topics(topic).Operations(kadm.OpWrite, kadm.OpDescribe).ResourcePatternType(kadm.ACLPatternLiteral)
	sb.allow(t, acl)
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("1")}).FirstErr(); err != nil {
		t.Fatalf("produce with WRITE: %v", err)
	}
	del := kadm.NewACLs().Allow("User:carol").AllowHosts().Topics(topic).Operations(kadm.OpWrite).ResourcePatternType(kadm.ACLPatternLiteral)
	if res, err := adm.DeleteACLs(ctx, del); err != nil || len(res) == 0 || len(res[0].Deleted) != 1 {
		t.Fatalf("DeleteACLs: %v %+v", err, res)
	}
	// The same connection is refused now.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("2")}).FirstErr(); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("produce after WRITE was deleted: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	// READ on the topic but not on the group: GROUP_AUTHORIZATION_FAILED.
	sb.allow(t, kadm.NewACLs().Allow("User:carol").Topics(topic).Operations(kadm.OpRead).ResourcePatternType(kadm.ACLPatternLiteral))
	ccl, err := kgo.NewClient(kgo.SeedBrokers(sb.saslPlain), kgo.SASL(scram.Auth{User: "carol", Pass: "carol-secret"}.AsSha256Mechanism()),
		kgo.ConsumeTopics(topic), kgo.ConsumerGroup("carol-group"), kgo.RequestRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	defer ccl.Close()
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var got error
	for got == nil && pctx.Err() == nil {
		fs := ccl.PollFetches(pctx)
		fs.EachError(func(_ string, _ int32, err error) {
			if got == nil && errors.Is(err, kerr.GroupAuthorizationFailed) {
				got = err
			}
		})
	}
	if !errors.Is(got, kerr.GroupAuthorizationFailed) {
		t.Fatalf("consumer group without READ on the group: %v, want GROUP_AUTHORIZATION_FAILED", got)
	}
}
