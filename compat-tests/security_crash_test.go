package compattests

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Users and ACLs acknowledged before a kill -9 are there after it: the user
// logs in, its ACL still grants, the one deleted is still gone.
func TestSecurityStateSurvivesKill9(t *testing.T) {
	sb := startSecureSynapse(t)
	sb.createUser(t, "frank", "frank-secret")
	topic := uniqueTopic(t)
	ctx := testCtx(t, 60*time.Second)
	adm := sb.adm(t)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	sb.allow(t, kadm.NewACLs().Allow("User:frank").Topics(topic).Operations(kadm.OpWrite, kadm.OpRead).ResourcePatternType(kadm.ACLPatternLiteral))
	sb.allow(t, kadm.NewACLs().Allow("User:frank").Topics(topic).Operations(kadm.OpDelete).ResourcePatternType(kadm.ACLPatternLiteral))
	del := kadm.NewACLs().Allow("User:frank").AllowHosts().Topics(topic).Operations(kadm.OpDelete).ResourcePatternType(kadm.ACLPatternLiteral)
	if res, err := adm.DeleteACLs(ctx, del); err != nil || len(res) != 1 || len(res[0].Deleted) != 1 {
		t.Fatalf("DeleteACLs: %v %+v", err, res)
	}
	if _, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: "grace", Mechanism: kadm.ScramSha256, Iterations: 4096, Password: "grace-secret"}}); err != nil {
		t.Fatal(err)
	}
	sb.Kill9(t)
	sb.Start(t)

	cl, err := kgo.NewClient(kgo.SeedBrokers(sb.saslPlain), kgo.SASL(scram.Auth{User: "frank", Pass: "frank-secret"}.AsSha512Mechanism()),
		kgo.RequestRetries(1), kgo.RetryTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("after kill -9")}).FirstErr(); err != nil {
		t.Fatalf("frank after kill -9: %v", err)
	}
	if _, err := kadm.NewClient(cl).DeleteTopic(ctx, topic); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("DELETE after its ACL was deleted and the broker killed: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	g, err := kgo.NewClient(kgo.SeedBrokers(sb.saslPlain), kgo.SASL(scram.Auth{User: "grace", Pass: "grace-secret"}.AsSha256Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Ping(ctx); err != nil {
		t.Fatalf("grace after kill -9: %v", err)
	}
}
